"""A tuning run's workload fingerprint: what must be the same for `--resume` to continue it.

Resuming an MLP run with another model file once rewrote the run's tuned config and report and
reported a speedup mixing both. A run records this fingerprint in run.json; `--resume` compares
it with the present one and refuses, naming what differs, before anything is written.
"""

from __future__ import annotations

import hashlib
import json
from importlib import metadata
from pathlib import Path
from typing import Any

from tpu_tuner.model.workloads.summary import WorkloadSummary

# Keys compared on resume, with the words a refusal uses for them.
LABELS = {
    "sha256": "model file differs",
    "convention": "model file convention differs",
    "step_kind": "step kind differs",
    "inputs": "input shapes/dtypes differ",
    "batch_size": "--batch-size differs",
    "seq_len": "--seq-len differs",
    "device_kind": "device kind differs",
    "device_name": "device differs",
    "nproc": "--nproc differs",
    "nnodes": "--nnodes differs",
    "lengths": "input length sample differs",
    "versions": "package versions differ",
}


def file_sha256(path: str | Path) -> str:
    """sha256 of the file's bytes (of the text, for an inline ``decoder:...`` shape; of the text
    and the config.json it reads, for a Hugging Face model)."""
    from tpu_tuner.model.decoders.decoder import INLINE_PREFIX
    from tpu_tuner.model.workloads.hf_source import config_bytes, is_hf_source

    if is_hf_source(path):
        return hashlib.sha256(str(path).encode() + config_bytes(str(path))).hexdigest()
    if str(path).startswith(INLINE_PREFIX):
        return hashlib.sha256(str(path).encode()).hexdigest()
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


# A key an older run.json lacks reads as this (runs before --nproc ran one process).
DEFAULTS = {"nproc": 1, "nnodes": 1, "lengths": None}


def fingerprint(
    model_file: str | Path,
    summary: WorkloadSummary,
    batch_size: int | None,
    seq_len: int | None,
    nproc: int = 1,
    lengths: Any = None,
    nnodes: int = 1,
) -> dict[str, Any]:
    """The fingerprint of a run of `model_file` (described by the worker's `summary`); with a
    length sample (`LengthHistogram`: the objective is then an expected step over it), its digest.
    `nproc` is the ranks a trial runs on; over `nnodes` hosts (recorded above one: the same ranks
    on one host are another machine) they are nnodes x --nproc."""
    found = {
        "model_file": str(model_file),
        "sha256": file_sha256(model_file),
        "convention": summary.convention,
        "step_kind": summary.step_kind,
        "inputs": summary.inputs,
        # The sizes that run: --batch-size 32 on a file whose BATCH_SIZE is 32 is the same run.
        "batch_size": batch_size if batch_size is not None else summary.batch_size,
        "seq_len": seq_len if seq_len is not None else summary.seq_len,
        "device_kind": summary.device_kind,
        "device_name": summary.device_name,
        "nproc": nproc,
        "lengths": _histogram_digest(lengths),
        "versions": {name: _version(name) for name in ("torch", "optuna", "tpu-tune")},
    }
    if nnodes > 1:
        found["nnodes"] = nnodes
    return found


def _histogram_digest(lengths: Any) -> str | None:
    if lengths is None:
        return None
    digest = hashlib.sha256()
    for values in (lengths.lengths, lengths.counts):
        digest.update(",".join(str(int(v)) for v in values).encode() + b";")
    return digest.hexdigest()[:16]


def differences(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """One phrase per differing key, e.g. "model file differs (examples/cnn.py sha256 1a2b3c4d..
    vs 9f8e7d6c.. recorded)"; empty when the fingerprints match."""
    found = []
    for key, label in LABELS.items():
        old, new = recorded.get(key, DEFAULTS.get(key)), current.get(key, DEFAULTS.get(key))
        if old == new:
            continue
        if key == "sha256":
            found.append(
                f"{label} ({current.get('model_file')} sha256 {str(new)[:8]}.. vs {str(old)[:8]}.. recorded"
                f" for {recorded.get('model_file')})"
            )
        elif key == "versions" and isinstance(old, dict) and isinstance(new, dict):
            changed = [
                f"{name} {new.get(name)} vs {old.get(name)}"
                for name in sorted(set(old) | set(new))
                if old.get(name) != new.get(name)
            ]
            found.append(f"{label} ({', '.join(changed)} recorded)")
        else:
            found.append(f"{label} ({_short(new)} vs {_short(old)} recorded)")
    return found


def digest(record: dict[str, Any], length: int = 10) -> str:
    """A short stable digest of a study's record (JSON with sorted keys): names a study after
    what it depends on, so that the same inputs find the same study again."""
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:length]


def differing_keys(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """The keys of `current` whose values `recorded` does not hold (a joiner's refusal names them)."""
    return [key for key in current if current[key] != recorded.get(key)]


def _short(value: Any, limit: int = 60) -> str:
    text = str(value)
    return text if len(text) <= limit else text[: limit - 2] + ".."


__all__ = ["differences", "differing_keys", "digest", "file_sha256", "fingerprint"]
