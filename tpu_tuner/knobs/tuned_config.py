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
from torch import nn

from tpu_tuner.core.errors import UserInputError
from tpu_tuner.core.run_folder import write_atomic
from tpu_tuner.devices import backend_class
from tpu_tuner.devices import names as backend_names
from tpu_tuner.knobs import registry as knobs
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.knobs.capabilities import SpreadsOverRanks

FORMAT_VERSION = 1


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

    def __post_init__(self) -> None:
        # One source for each setting: a table that gives one alone (a planner's [sharding.mesh])
        # becomes the candidate's setting.
        self.candidate = _settled(self.candidate, {"sharding": self.sharding}, "the tuned config")

    def to_toml(self) -> str:
        # Every knob that means something on this device, by the registry; the others stay out
        # (loading the config back gives their defaults).
        settings = {
            name: self.candidate[name] for name, knob in knobs.REGISTRY.items() if knob.applies_to(self.device_kind)
        }
        document = {
            "format_version": FORMAT_VERSION,
            "device_kind": self.device_kind,
            "settings": settings,
            "provenance": _drop_none(self.provenance),
        }
        document.update(self.knob_tables())
        if self.bucketing:
            document["bucketing"] = _drop_none(self.bucketing)
        return tomli_w.dumps(document)

    def save(self, path: str | Path) -> Path:
        return write_atomic(path, self.to_toml())  # the dashboard reads its presence as "finished"

    @classmethod
    def load(cls, path: str | Path) -> TunedConfig:
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
        candidate = _settled(candidate, data, path)  # refusals name the file
        return cls(
            candidate=candidate,
            device_kind=data.get("device_kind", "cpu"),
            provenance=data.get("provenance", {}),
            sharding=data.get("sharding"),
            bucketing=data.get("bucketing"),
        )

    @property
    def training(self) -> bool:
        """Whether the tuned step trains: its provenance's workload step, a training step where
        none is recorded (a planner's sharding config plans training)."""
        from tpu_tuner.model.workloads.profiled import INFERENCE_STEP

        workload = self.provenance.get("workload")
        return not (isinstance(workload, dict) and workload.get("step") == INFERENCE_STEP)

    def knob_tables(self) -> dict[str, dict[str, Any]]:
        """The tables beside [settings] that the knobs write (`SpreadsOverRanks`: [sharding] with
        the mesh of the candidate's layout, its one source being [settings]), each merged over
        what this config holds of it (the planner's placements); none for one process."""
        held = {"sharding": self.sharding or {}}
        tables: dict[str, dict[str, Any]] = {}
        for name, knob in _placing():
            for table, entries in knob.config_tables(self.candidate[name]).items():
                tables[table] = {**held.get(table, {}), **tables.get(table, {}), **entries}
        return tables

    def environment(self) -> dict[str, str]:
        """Variables that must be set before the process imports torch (TorchTPU eager modes):
        the device's backend names them."""
        return self.candidate.environment(_backend_class(self.device_kind))

    def instructions(self, path: str | Path) -> list[str]:
        """Python that applies this config, runnable as printed once `model` and a batch `inputs`
        exist (the user's own names); everything else it mentions is a comment. `path` is where
        this config is saved (printed as an absolute path, so the code runs from any folder)."""
        c = self.candidate
        env = self.environment()
        lines = [f"# with your `model` and a batch `inputs` (tuned on {self.device_kind}: {c.describe()})"]
        if env:
            # TorchTPU reads these once, when torch is imported: they must come first.
            lines.append(
                "# before the process imports torch (read once, at start-up); or in the shell: "
                + " ".join(f"export {key}={value}" for key, value in env.items())
            )
            lines += ["import os", f"os.environ.update({env!r})"]
        lines += [
            "import tpu_tuner",
            "",
            f"applied = tpu_tuner.apply(model, {str(Path(path).resolve())!r})",
            "model, autocast = applied",
            "with autocast():  # around the forward pass and the loss"
            if self.training
            else "with torch.no_grad(), autocast():  # the forward pass (tuned as inference)",
            "    output = model(inputs)  # model(**inputs) for a dict batch (a Hugging Face model's)",
            "",
            "# what apply() does, if you would rather write it out (the knobs' own code):",
        ]
        if not self.training:
            lines.insert(lines.index("import tpu_tuner"), "import torch")
        lines += [f"#   {line}" for line in c.code(self.device_kind, training=self.training)]
        training = c.training_code(self.device_kind) if self.training else []
        if training:
            # The training loop is the user's: apply() cannot rebuild their optimizer or split
            # their batch, so the measured training-step settings are printed for them to write.
            lines.append(
                "# in your training loop (apply() cannot change it; `optimizer`, `loss_fn`, `target` are yours):"
            )
            lines += [f"#   {line}" for line in training]
        backend = _backend_class(self.device_kind)
        lines[1:1] = [
            line
            for name, knob in _placing()
            if knobs.get(name).applies_to(self.device_kind)
            for line in knob.instructions(c[name], backend)
        ]
        if self.bucketing:
            lines.append("# shape buckets: pad each batch to its bucket in the data pipeline")
            lines.append(f"BUCKETS = {list(self.bucketing['buckets'])}")
            lines.append("#   tokens, attention_mask = tpu_tuner.bucketing.pad_to_bucket(sequences, BUCKETS)")
            if self.bucketing.get("torchtpu"):
                lines.append(f"# on TorchTPU: {self.bucketing['torchtpu']}")
        return lines


@dataclass
class AppliedConfig:
    """The result of `apply`: the model to call and the autocast context to call it in.
    `restore()` undoes the process-wide settings (matmul precision, eager mode)."""

    model: Callable[..., Any]
    autocast: Callable[[], contextlib.AbstractContextManager[Any]]
    # Training: `training_loss(loss_fn)` is `(inputs, target) -> loss` as the trial computed it
    # (the loss compiled with the model where the config says so).
    training_loss: Callable[[Any], Callable[[Any, Any], Any]] = field(repr=False)
    _process: contextlib.ExitStack = field(default_factory=contextlib.ExitStack, repr=False)
    # Training: `optimizer(opt)` rebuilds the user's optimizer with the measured implementation
    # (the hook a trial used); `micro_batches` is the k their own loop should accumulate over.
    optimizer: Callable[[Any], Any] = field(default=lambda optimizer: optimizer, repr=False)
    micro_batches: int = 1

    def __iter__(self) -> Iterator[Any]:
        return iter((self.model, self.autocast))

    def restore(self) -> None:
        """Put back the process-wide settings that `apply` changed."""
        self._process.close()
        if self._process in _OPEN_PROCESS_SETTINGS:
            _OPEN_PROCESS_SETTINGS.remove(self._process)


# The process-wide settings `apply` entered, held for the rest of the process: a knob's process
# hook may be a generator context, whose `finally` (the restore) would run as soon as nothing
# referenced it (`model, autocast = apply(...)` drops the AppliedConfig at once).
_OPEN_PROCESS_SETTINGS: list[contextlib.ExitStack] = []


def apply(model: nn.Module, config: TunedConfig | str | Path) -> AppliedConfig:
    """Apply a tuned config in this process through the knobs' hooks, the ones a trial used:
    process-wide settings (matmul precision), the model (memory format), its forward (compile),
    and the step context (autocast).

    Returns the (possibly compiled) model and a zero-argument autocast context factory:
    ``model, autocast = tpu_tuner.apply(model, "tuned_config.toml")`` then
    ``with autocast(): out = model(x)``. The training loop stays the user's: `apply` cannot split
    their batch or step their optimizer; ``applied.optimizer(opt)`` rebuilds an optimizer with the
    measured implementation, ``applied.micro_batches`` says how many micro-batches to
    accumulate over and ``applied.training_loss(loss_fn)`` computes the loss as the trial did
    (`TunedConfig.instructions` prints the loop).
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
    backend = _backend_class(config.device_kind)()
    process = contextlib.ExitStack()
    process.enter_context(candidate.process(backend))
    _OPEN_PROCESS_SETTINGS.append(process)  # the settings are for the rest of the process
    # The layout too (one process per device, joined first), for the step the config was tuned on.
    model = candidate.prepare_model(model, backend, training=config.training)
    compiled = candidate.wrap_forward(model, backend)
    return AppliedConfig(
        model=compiled,
        autocast=lambda: candidate.step(backend),
        _process=process,
        optimizer=lambda optimizer: candidate.prepare_optimizer(optimizer, backend),
        micro_batches=candidate.micro_batches(backend),
        training_loss=lambda loss_fn: candidate.training_loss(model, loss_fn, compiled, backend),
    )


def apply_sharding(model: nn.Module, config: TunedConfig | str | Path, training: bool | None = None) -> nn.Module:
    """Apply only the config's layout (its [settings] layout, the mesh of its [sharding] table:
    a tuned config's or a planner's sharding_config.toml) on this process's process group,
    through the layout knob's own hook, the one a sharded trial used (`tpu_tuner.parallel.apply`),
    for a step that trains or only runs forwards (`training`; None: the step the config was
    tuned on). One process: the model as it is; a layout over N processes without a process
    group of N is refused with what to start."""
    if not isinstance(config, TunedConfig):
        config = TunedConfig.load(config)
    backend = _backend_class(config.device_kind)
    training = config.training if training is None else training
    for name, knob in _placing():
        model = knob.model_for_step(config.candidate[name], model, backend, training)
    return model


def _settled(candidate: Candidate, tables: dict[str, Any], where: str | Path) -> Candidate:
    """The candidate with what the config's other `tables` give of its settings
    (`SpreadsOverRanks.from_config_tables`: a planner's [sharding.mesh] alone); refused, naming
    `where`, when the two disagree."""
    settled = candidate.changed
    for name, knob in _placing():
        try:
            value = knob.from_config_tables(candidate[name], tables)
        except ValueError as exc:
            raise UserInputError(str(exc), where) from None
        if value != candidate[name]:
            settled[name] = value
    return Candidate(settled) if settled != candidate.changed else candidate


def _placing() -> list[tuple[str, SpreadsOverRanks]]:
    """The knobs placed over ranks (their own config tables, instructions and `apply_sharding`)."""
    return [(name, knob) for name, knob in knobs.REGISTRY.items() if isinstance(knob, SpreadsOverRanks)]


def _backend_class(device_kind: str) -> Any:
    if device_kind not in backend_names():
        raise UserInputError(f"unknown device_kind {device_kind!r}; known: {', '.join(backend_names())}")
    return backend_class(device_kind)


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_drop_none(v) for v in value if v is not None]
    return value
