"""A `Candidate`: a frozen, serialisable description of *how* to run a workload.

It is the values of the registered knobs (`tpu_tuner.knobs`): knob name -> value, baseline values
omitted (reading one gives the knob's default). It applies itself through the knobs' hooks, the
same ones for a trial and for `tpu_tuner.apply`, so what was measured is what gets applied.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from tpu_tuner.knobs import capabilities as kinds
from tpu_tuner.knobs import registry as knobs

if TYPE_CHECKING:
    from torch import nn

    from tpu_tuner.devices.base import Backend
    from tpu_tuner.knobs.base import BackendLike


class Candidate:
    """Knob values. ``Candidate()`` is the baseline; ``Candidate(execution="inductor",
    autocast="bfloat16")`` sets two knobs; ``candidate["autocast"]`` reads one (default filled)."""

    __slots__ = ("_values",)

    def __init__(self, values: Mapping[str, str] | None = None, /, **settings: str) -> None:
        merged = {**(values or {}), **settings}
        unknown = sorted(set(merged) - set(knobs.REGISTRY))
        if unknown:
            raise ValueError(f"unknown candidate settings: {unknown}; knobs: {', '.join(knobs.REGISTRY)}")
        canonical = {}
        for name, knob in knobs.REGISTRY.items():
            if name in merged and (value := knob.check(merged[name])) != knob.default:
                canonical[name] = value
        self._values: dict[str, str] = canonical

    def __getitem__(self, name: str) -> str:
        return self._values.get(name, knobs.get(name).default)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Candidate) and self._values == other._values

    def __hash__(self) -> int:
        return hash(tuple(self._values.items()))

    def __repr__(self) -> str:
        return "Candidate(" + ", ".join(f"{k}={v!r}" for k, v in self._values.items()) + ")"

    @property
    def changed(self) -> dict[str, str]:
        """The knobs set away from their baseline."""
        return dict(self._values)

    def to_dict(self) -> dict[str, str]:
        """Every knob's value (defaults filled), so a stored candidate reads on its own."""
        return {name: self[name] for name in knobs.REGISTRY}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Candidate:
        """A candidate from `to_dict` output, or from the field-style dicts of older runs."""
        fields = {
            flag.field
            for knob in knobs.REGISTRY.values()
            if isinstance(knob, kinds.PickedByFlags)
            for flag in knob.flags
        }
        if set(data) & (fields - set(knobs.REGISTRY)):
            return cls.from_fields(data)
        return cls(dict(data))

    @classmethod
    def from_fields(cls, fields: Mapping[str, Any], device_kind: str | None = None) -> Candidate:
        """A candidate from `tpu-tune profile`'s flags (`PickedByFlags`; field -> value, None or
        absent when unset), which are the fields of candidates written before the registry (older
        run folders); a knob none of whose flags is set runs `device_kind`'s baseline."""
        values = cls.baseline(device_kind).to_dict()
        for name, knob in knobs.REGISTRY.items():
            if isinstance(knob, kinds.PickedByFlags) and (value := knob.from_fields(fields)) is not None:
                values[name] = value
        return cls(values)

    @classmethod
    def baseline(cls, device_kind: str | None) -> Candidate:
        """The user's code as it runs on `device_kind` unchanged: each knob at the device's own
        default (TorchTPU's matmul precision is medium)."""
        return cls(
            {
                name: knob.device_default(device_kind)
                for name, knob in knobs.REGISTRY.items()
                if isinstance(knob, kinds.DeviceBaseline)
            }
        )

    def describe(self) -> str:
        """A short human label, e.g. "eager, matmul highest" or "inductor, matmul medium, autocast bfloat16"."""
        return ", ".join(part for name, knob in knobs.REGISTRY.items() if (part := knob.describe(self[name])))

    # --- applying it: the knobs' hooks, in registry order ------------------------------------

    def _active(self, device_kind: str) -> Iterator[tuple[knobs.Knob, str]]:
        """The knobs that mean something on `device_kind`, with their values (callers ask for
        an opt-in kind of knob, `knobs/capabilities.py`, with isinstance)."""
        for name, knob in knobs.REGISTRY.items():
            if knob.applies_to(device_kind):
                yield knob, self[name]

    def compute_dtype(self, backend: Backend) -> str:
        """The dtype the step's matmuls run in (reports name it beside the per-dtype utilisation):
        each knob refines what the ones before it decided, from the backend's primitives."""
        dtype = "float32"
        for knob, value in self._active(backend.kind):
            if isinstance(knob, kinds.SetsComputeDtype):
                dtype = knob.compute_dtype(value, dtype, backend)
        return dtype

    def compiles(self) -> bool:
        """Whether the candidate runs its forward through torch.compile."""
        return any(
            knob.compiles(self[name]) for name, knob in knobs.REGISTRY.items() if isinstance(knob, kinds.Compiles)
        )

    def environment(self, backend: BackendLike) -> dict[str, str]:
        """Start-up variables this candidate needs (a non-empty answer means a fresh process)."""
        env: dict[str, str] = {}
        for knob, value in self._active(backend.kind):
            if isinstance(knob, kinds.StartupEnvironment):
                env.update(knob.environment(value, backend))
        return env

    @contextlib.contextmanager
    def process(self, backend: Backend) -> Iterator[None]:
        """Process-wide settings for a block, restored after it."""
        with contextlib.ExitStack() as stack:
            for knob, value in self._active(backend.kind):
                stack.enter_context(knob.process(value, backend))
            yield

    def prepare_model(self, model: nn.Module, backend: BackendLike, training: bool = True) -> nn.Module:
        """The model with every model-level setting applied, for a step that trains (`training`)
        or only runs forwards."""
        for knob, value in self._active(backend.kind):
            if isinstance(knob, kinds.SpreadsOverRanks):
                model = knob.model_for_step(value, model, backend, training)
            else:
                model = knob.model(value, model, backend)
        return model

    def wrap_forward(
        self, fn: Callable[..., Any], backend: BackendLike, static_shapes: bool = False
    ) -> Callable[..., Any]:
        """The forward as the candidate runs it (compiled or not)."""
        for knob, value in self._active(backend.kind):
            fn = knob.forward(value, fn, backend, static_shapes)
        return fn

    def training_loss(
        self,
        model: nn.Module,
        loss_fn: Callable[[Any, Any], Any],
        forward: Callable[..., Any],
        backend: BackendLike,
        static_shapes: bool = False,
    ) -> Callable[[Any, Any], Any]:
        """``(inputs, target) -> loss`` as the candidate computes a training loss: `loss_fn` on the
        output of `forward` (the model as `wrap_forward` made it), or, where the forward compiles
        and a training-step knob asks (`compiles_loss`), model and loss compiled as one module."""
        from tpu_tuner.model.workloads.workload import ModelWithLoss, loss_of

        if self.compiles_loss(backend.kind):
            return self.wrap_forward(ModelWithLoss(model, loss_fn), backend, static_shapes)
        return loss_of(forward, loss_fn)

    def compiles_loss(self, device_kind: str) -> bool:
        """Whether a training step compiles its loss with the model, as one graph (the forward
        compiles and a training-step knob asks: `compiles_loss`)."""
        steps = (
            knob.compiles_loss(value)
            for knob, value in self._active(device_kind)
            if isinstance(knob, kinds.TrainingStep)
        )
        return self.compiles() and any(steps)

    def traces_step(self, device_kind: str) -> bool:
        """Whether the training step runs as one traced program (forward, backward and update:
        execution/traced_step.py): the forward compiles and a training-step knob asks."""
        steps = (
            knob.traces_step(value) for knob, value in self._active(device_kind) if isinstance(knob, kinds.TrainingStep)
        )
        return self.compiles() and any(steps)

    @contextlib.contextmanager
    def step(self, backend: BackendLike) -> Iterator[None]:
        """The context of one step (autocast). Entered on every timed step: only `StepContext`
        knobs are asked, so the others cost the loop nothing."""
        with contextlib.ExitStack() as stack:
            for knob, value in self._active(backend.kind):
                if isinstance(knob, kinds.StepContext):
                    stack.enter_context(knob.step(value, backend))
            yield

    def prepare_optimizer(self, optimizer: Any, backend: BackendLike) -> Any:
        """The training step's optimizer with every optimizer-level setting applied."""
        for knob, value in self._active(backend.kind):
            if isinstance(knob, kinds.TrainingStep):
                optimizer = knob.optimizer(value, optimizer, backend)
        return optimizer

    def local_batch(self, inputs: Any, target: Any, backend: BackendLike) -> tuple[Any, Any]:
        """The part of the global batch this process runs (a rank's slice under a sharding
        layout; the whole batch otherwise)."""
        for knob, value in self._active(backend.kind):
            if isinstance(knob, kinds.SpreadsOverRanks):
                inputs, target = knob.local_batch(value, inputs, target)
        return inputs, target

    def gather_output(self, output: Any, local_batch: int | None, backend: BackendLike) -> Any:
        """The global batch's output from this process's output of its slice (`local_batch`
        samples): every rank's slice gathered in order under a sharding layout; `output` otherwise."""
        for knob, value in self._active(backend.kind):
            if isinstance(knob, kinds.SpreadsOverRanks):
                output = knob.gather_output(value, output, local_batch)
        return output

    def micro_batches(self, backend: BackendLike) -> int:
        """Into how many micro-batches the training step splits its batch (1: none)."""
        counts = [
            knob.micro_batches(value)
            for knob, value in self._active(backend.kind)
            if isinstance(knob, kinds.TrainingStep)
        ]
        return max(counts, default=1)

    def training_code(self, device_kind: str) -> list[str]:
        """Python for the user's own training loop (optimizer line, accumulation loop)."""
        return [
            line
            for knob, value in self._active(device_kind)
            if isinstance(knob, kinds.TrainingCode)
            for line in knob.training_code(value, device_kind)
        ]

    def code(self, device_kind: str, training: bool = True) -> list[str]:
        """Runnable Python that applies the candidate to `model` and runs `inputs` through it (for
        a step that trains, `training`, or only runs forwards)."""
        lines = ["import torch"]
        contexts = []
        for knob, value in self._active(device_kind):
            lines += (
                knob.code_for_step(value, device_kind, training)
                if isinstance(knob, kinds.SpreadsOverRanks)
                else knob.code(value, device_kind)
            )
            if isinstance(knob, kinds.StepContext) and (context := knob.step_code(value, device_kind)) is not None:
                contexts.append(context)
        if contexts:
            lines.append(f"with {', '.join(contexts)}:")
            lines.append("    output = model(inputs)")
        else:
            lines.append("output = model(inputs)")
        return lines
