"""The tuned config: the chosen Candidate plus its provenance, as TOML, and how to apply it.

``tuned_config.toml`` round-trips: `TunedConfig.load(path).candidate` is the candidate that was
saved, and `apply(model, config)` sets it up in the user's own process.
"""

from __future__ import annotations

import contextlib
import os
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w
import torch
from torch import nn

from tpu_tuner.backends.torchtpu import EAGER_MODE_ENV
from tpu_tuner.candidate import Candidate
from tpu_tuner.errors import UserInputError

FORMAT_VERSION = 1
# Candidate fields that only TorchTPU reads.
TPU_ONLY_SETTINGS = ("eager_mode",)


@dataclass
class TunedConfig:
    """A candidate and where it came from (device, versions, measurements, verification)."""

    candidate: Candidate
    device_kind: str
    provenance: dict[str, Any] = field(default_factory=dict)
    # Optional sharding plan: {"mesh": {"data": 1, "fsdp": 64, "tensor": 4},
    # "placements": {parameter name: "tensor/fsdp" (mesh axis per dimension, "-" = replicated)}}
    sharding: dict[str, Any] | None = None
    # Optional shape bucketing: {"buckets": [80, 136, ...], "align": 8, "torchtpu": "..."}
    bucketing: dict[str, Any] | None = None

    def to_toml(self) -> str:
        settings = {k: v for k, v in self.candidate.to_dict().items() if v is not None}  # TOML has no null
        if self.device_kind != "tpu":
            # Settings that only mean something on TorchTPU stay out of a CPU/GPU config (loading
            # it back gives the default, which those backends ignore).
            for key in TPU_ONLY_SETTINGS:
                settings.pop(key, None)
        document = {
            "format_version": FORMAT_VERSION,
            "device_kind": self.device_kind,
            "settings": settings,
            "provenance": _drop_none(self.provenance),
        }
        if self.sharding:
            document["sharding"] = self.sharding
        if self.bucketing:
            document["bucketing"] = _drop_none(self.bucketing)
        return tomli_w.dumps(document)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(self.to_toml())
        return path

    @classmethod
    def load(cls, path: str | Path) -> "TunedConfig":
        path = Path(path)
        if not path.is_file():
            raise UserInputError("tuned config not found", path)
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise UserInputError(f"invalid TOML: {exc}", path) from exc
        if data.get("format_version") != FORMAT_VERSION:
            raise UserInputError(f"unsupported format_version {data.get('format_version')!r}", path)
        try:
            candidate = Candidate.from_dict(data.get("settings", {}))
        except (TypeError, ValueError) as exc:
            raise UserInputError(f"bad [settings]: {exc}", path) from exc
        return cls(candidate=candidate, device_kind=data.get("device_kind", "cpu"), provenance=data.get("provenance", {}),
                   sharding=data.get("sharding"), bucketing=data.get("bucketing"))

    def environment(self) -> dict[str, str]:
        """Variables that must be set before the process imports torch (TorchTPU eager modes)."""
        return dict(EAGER_MODE_ENV.get(self.candidate.eager_mode, {})) if self.device_kind == "tpu" else {}

    def instructions(self, path: str | Path) -> list[str]:
        """Python that applies this config, runnable as printed once `model` and a batch `inputs`
        exist (the user's own names); everything else it mentions is a comment. `path` is where
        this config is saved (printed as an absolute path, so the code runs from any folder)."""
        c = self.candidate
        env = self.environment()
        lines = [f"# with your `model` and a batch `inputs` (tuned on {self.device_kind}: {c.describe()})"]
        if env:
            # TorchTPU reads these once, when torch is imported: they must come first.
            lines.append("# before the process imports torch (read once, at start-up); or in the shell: "
                         + " ".join(f"export {key}={value}" for key, value in env.items()))
            lines.append("import os")
            lines.append(f"os.environ.update({env!r})")
        lines += [
            "import tpu_tuner",
            "",
            f"model, autocast = tpu_tuner.apply(model, {str(Path(path).resolve())!r})",
            "with autocast():  # around the forward pass and the loss",
            "    output = model(inputs)",
            "",
            "# what apply() does, if you would rather write it out:",
            f'#   torch.set_float32_matmul_precision("{c.matmul_precision}")',
        ]
        if c.compile_backend:
            mode = f', mode="{c.compile_mode}"' if c.compile_mode else ""
            lines.append(f'#   model = torch.compile(model, backend="{c.compile_backend}"{mode})')
        if c.autocast_dtype:
            lines.append(f'#   with torch.autocast("{self.device_kind}", dtype=torch.{c.autocast_dtype}): output = model(inputs)')
        if self.sharding:
            mesh = self.sharding["mesh"]
            names = tuple(axis for axis, size in mesh.items() if size > 1) or ("fsdp",)
            shape = tuple(mesh[axis] for axis in names)
            lines.append("# sharding (one process per device, process group 'tpu_dist' on TorchTPU):")
            lines.append(f"#   mesh = init_device_mesh('{self.device_kind}', {shape}, mesh_dim_names={names})")
            lines.append("#   placements per parameter are in [sharding.placements] (docs/planner.md)")
        if self.bucketing:
            lines.append("# shape buckets: pad each batch to its bucket in the data pipeline")
            lines.append(f"BUCKETS = {list(self.bucketing['buckets'])}")
            lines.append("#   tokens, attention_mask = tpu_tuner.bucketing.pad_to_bucket(sequences, BUCKETS)")
            if self.bucketing.get("torchtpu"):
                lines.append(f"# on TorchTPU: {self.bucketing['torchtpu']}")
        return lines


@dataclass
class AppliedConfig:
    """The result of `apply`: the model to call and the autocast context to call it in."""

    model: Callable[..., Any]
    autocast: Callable[[], contextlib.AbstractContextManager[Any]]

    def __iter__(self) -> Iterator[Any]:
        return iter((self.model, self.autocast))


def apply(model: nn.Module, config: TunedConfig | str | Path) -> AppliedConfig:
    """Apply a tuned config in this process: matmul precision (process-wide), compile, autocast.

    Returns the (possibly compiled) model and a zero-argument autocast context factory:
    ``model, autocast = tpu_tuner.apply(model, "tuned_config.toml")`` then
    ``with autocast(): out = model(x)``.
    """
    if not isinstance(config, TunedConfig):
        config = TunedConfig.load(config)
    candidate = config.candidate
    missing = {k: v for k, v in config.environment().items() if os.environ.get(k) != v}
    if missing:
        raise UserInputError(
            "this config needs environment variables set before torch is imported: "
            + " ".join(f"{k}={v}" for k, v in missing.items())
        )
    torch.set_float32_matmul_precision(candidate.matmul_precision)
    options = candidate.compile_options()
    compiled: Callable[..., Any] = model if options is None else torch.compile(model, **options)
    device_type = next((p.device.type for p in model.parameters()), "cpu")

    def autocast() -> contextlib.AbstractContextManager[Any]:
        if candidate.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type, dtype=getattr(torch, candidate.autocast_dtype))

    return AppliedConfig(model=compiled, autocast=autocast)


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_drop_none(v) for v in value if v is not None]
    return value
