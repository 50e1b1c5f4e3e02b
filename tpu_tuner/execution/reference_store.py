"""The fp32 reference's and the baseline's outputs of a run, computed once and read by every worker.

A trial worker needs both to judge a setting's accuracy (execution/accuracy.py). Each computed
them afresh: on a TPU v5e chip that was 43.9 s of a Llama-class trial's 94 s, again in every worker
a new start-up environment started (issue 68, item 5). The first worker to compute a candidate's
outputs at a batch and length writes them to the run folder (`references/`, float32 on the CPU, as
`Outputs` holds them); a later worker, whatever its environment, reads them. A file is written
whole (to a temporary name, then renamed), so a reader never sees half of one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tpu_tuner.execution.accuracy import SAMPLE, Outputs


def key_of(candidate: dict[str, Any], batch_size: int | None, seq_len: int | None) -> str:
    """The file name of a candidate's outputs at a batch size and length (and the sample size the
    outputs were drawn at, and how: a file of another version's sample is never compared)."""
    text = json.dumps([candidate, batch_size, seq_len, {"sample": SAMPLE, "drawn": "stratified"}], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:24] + ".pt"


def stored(directory: str | None, key: str, compute: Callable[[], Outputs]) -> Outputs:
    """The outputs stored under `key` in `directory`, else `compute()`'s, stored there (None: no
    folder, computed each time). A file that cannot be read is computed again and replaced."""
    if directory is None:
        return compute()
    path = Path(directory) / key
    if path.exists():
        with contextlib.suppress(Exception):  # a damaged file: computed again below
            parts = torch.load(path, weights_only=True)
            return Outputs({name: tensor for name, tensor in parts.items()})
    outputs = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    torch.save(dict(outputs.parts), temporary)
    os.replace(temporary, path)
    return outputs
