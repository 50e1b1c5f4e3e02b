"""What only some knobs do: opt-in kinds a knob class adds to the `Knob` core (knobs/base.py).

A knob lists the kinds it is (``class LayoutKnob(Knob, SpreadsOverRanks)``) and implements their
methods; callers ask ``isinstance(knob, Kind)``, never a knob's name or whether a default hook was
overridden. The kinds are what the registered knobs do beyond the core (docs/knobs.md).
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from torch import nn

    from tpu_tuner.devices.base import Backend
    from tpu_tuner.knobs.base import BackendLike
    from tpu_tuner.knobs.traits import WorkloadTraits

# The reason a choice is left out when its knob gives no more specific one.
CANNOT_RUN = "cannot run on this workload's step"


class NarrowedByWorkload:
    """A knob that cannot change every workload's step, or whose choices cannot all run on it
    (`knobs/traits.py`): the search space leaves out what cannot (`SearchSpace.for_workload`)."""

    # Why `applies_to_workload` can say no, for the run's report ("left out: ...").
    not_applicable: ClassVar[str] = "cannot change this workload's step"

    def applies_to_workload(self, traits: WorkloadTraits) -> bool:
        """Whether the knob can change this workload's step at all."""
        return True

    def choice_refusal(self, value: str, traits: WorkloadTraits) -> str | None:
        """Why one (non-baseline) choice cannot run on this workload (`CANNOT_RUN` where there is
        nothing more to say); None where it can."""
        return None


class Conditional(ABC):
    """A knob searched only under other knobs' values (inductor's options under ``execution =
    inductor``): a conditional Optuna parameter; a setting where it is inactive runs its default."""

    @abstractmethod
    def active(self, settings: Mapping[str, str]) -> bool:
        """Whether the knob means anything given `settings` (name -> value, decided so far)."""


class DeviceBaseline(ABC):
    """A knob whose value in unchanged code differs by device (TorchTPU's matmul precision)."""

    @abstractmethod
    def device_default(self, device_kind: str | None) -> str:
        """The value `device_kind` runs unchanged code at (a baseline sets it)."""


@dataclass(frozen=True)
class Flag:
    """A flag of ``tpu-tune profile`` that picks (part of) a knob's value; `field`, its argparse
    destination, is also the field of candidates written before the registry that held it."""

    option: str  # "--precision"
    field: str  # "matmul_precision"
    help: str
    choices: tuple[str, ...] | None = None
    metavar: str | None = None


class PickedByFlags(ABC):
    """A knob ``tpu-tune profile`` sets from its own `flags` (`cli/profile.py` adds them)."""

    flags: ClassVar[tuple[Flag, ...]]

    @abstractmethod
    def from_fields(self, fields: Mapping[str, Any]) -> str | None:
        """The value the flags' `fields` give (None when unset); None where none is given."""


class StartupEnvironment(ABC):
    """A knob with values that are variables read once at start-up (TorchTPU's eager modes, which
    the backend names): a trial of one runs in a worker started with them."""

    @abstractmethod
    def environment(self, value: str, backend: BackendLike) -> dict[str, str]:
        """Variables that must be set before the process imports torch."""


class SetsComputeDtype(ABC):
    """A knob that decides the dtype the step's matmuls run in (reports name it)."""

    @abstractmethod
    def compute_dtype(self, value: str, dtype: str, backend: Backend) -> str:
        """The dtype under `value`, given `dtype`, what the knobs before it decided (from float32)."""


class Compiles(ABC):
    """A knob whose values may run the forward through torch.compile (a step that then counted no
    compile ran eager and measured nothing of the setting; compile deadlines apply)."""

    @abstractmethod
    def compiles(self, value: str) -> bool:
        """Whether `value` compiles the forward."""


class LeavesMemory:
    """A knob whose values (all, or those `leaves_memory` says) leave the step's estimated memory
    as it is: trials that differ only in them share one estimate (execution/memory_estimate.py)."""

    def leaves_memory(self, value: str) -> bool:
        """Whether `value` leaves the estimated peak memory as the knob's default does."""
        return True


class StepContext(ABC):
    """A knob applied as a context around each step's forward and loss (autocast): only these are
    entered on every timed step."""

    @abstractmethod
    def step(self, value: str, backend: BackendLike) -> contextlib.AbstractContextManager[Any]:
        """The context to enter around each step."""

    @abstractmethod
    def step_code(self, value: str, device_kind: str) -> str | None:
        """The context as Python (``with <it>: output = model(inputs)``); None for none."""


class TrainingCode(ABC):
    """A knob that changes the user's own training loop, which ``tpu_tuner.apply`` does not run."""

    @abstractmethod
    def training_code(self, value: str, device_kind: str) -> list[str]:
        """Python for that loop (``optimizer``, ``loss_fn``, ``inputs``, ``target`` are its names)."""


class TrainingStep(TrainingCode):
    """A knob of the training step alone (optimizer, accumulation, what is compiled with the
    model), which `execution/step.py` builds through these hooks: it leaves the model alone, so
    `observe_training` reads it."""

    def optimizer(self, value: str, optimizer: Any, backend: BackendLike) -> Any:
        """The training step's optimizer with the setting applied (the same one by default)."""
        return optimizer

    def micro_batches(self, value: str) -> int:
        """Into how many micro-batches a training step splits its batch (1: the whole batch)."""
        return 1

    def compiles_loss(self, value: str) -> bool:
        """Whether the loss is compiled with the model, as one graph, where the forward compiles
        (False: the loss runs on the compiled forward's output, outside it)."""
        return False

    def traces_step(self, value: str) -> bool:
        """Whether the whole training step (forward, backward and the optimizer's update) runs as
        one traced program, where the forward compiles (execution/traced_step.py)."""
        return False

    @abstractmethod
    def observe_training(self, optimizer: Any, micro_batches: int, loss: Any) -> str | None:
        """The value in force in a built training step (its optimizer, its micro-batch count, the
        callable that computes its loss)."""


class SpreadsOverRanks(TrainingCode):
    """A knob whose values place one step across ranks and hosts (the sharding layout): an
    ``--nproc N`` run must search one; each rank runs a slice of the global batch; the tuned config
    repeats it in tables of its own and says how to start the ranks."""

    @abstractmethod
    def model_for_step(self, value: str, model: nn.Module, backend: BackendLike, training: bool) -> nn.Module:
        """`model` placed for a step that trains (`training`) or only runs forwards."""

    @abstractmethod
    def code_for_step(self, value: str, device_kind: str, training: bool) -> list[str]:
        """`code` for a step that trains or only runs forwards."""

    @abstractmethod
    def local_batch(self, value: str, inputs: Any, target: Any) -> tuple[Any, Any]:
        """The part of the global batch this process runs."""

    @abstractmethod
    def gather_output(self, value: str, output: Any, local_batch: int | None) -> Any:
        """The global batch's output from this rank's output of its `local_batch` samples."""

    @abstractmethod
    def within_hosts(self, value: str, ranks_per_host: int) -> bool:
        """Whether `value` keeps its tensor groups inside hosts of `ranks_per_host` ranks."""

    @abstractmethod
    def config_tables(self, value: str) -> dict[str, dict[str, Any]]:
        """Tables of ``tuned_config.toml`` that repeat `value` beside [settings] (name -> entries)."""

    @abstractmethod
    def from_config_tables(self, value: str, tables: Mapping[str, Any]) -> str:
        """The value of a config whose [settings] give `value` and whose `tables` may give it
        too; ValueError where the two disagree or a table is malformed."""

    @abstractmethod
    def instructions(self, value: str, backend: BackendLike) -> list[str]:
        """Comment lines heading a tuned config's instructions (how to start the processes)."""
