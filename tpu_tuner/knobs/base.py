"""The `Knob` contract: one tunable setting, from its search-space choices to how it is applied.

In the style of Optuna's samplers: a small base class, one subclass per knob, each in its own
module of `tpu_tuner.knobs`. A knob applies a value through hooks, each a no-op by default:

* ``environment``: variables read once at process start-up (a value that sets any needs a fresh
  process); the backend owns them (e.g. TorchTPU's eager-mode variables);
* ``process``: a context holding process-wide settings (matmul precision);
* ``model``: a change to the model (memory format);
* ``forward``: a wrapper of the model's forward (torch.compile);
* ``step``: a context around each step (autocast);
* ``optimizer`` / ``micro_batches``: how a training step is built (the optimizer's implementation,
  gradient accumulation over micro-batches); `execution/step.py` builds every training step, the
  accuracy guardrail's included, through them. A user's training loop is their own, so
  ``tpu_tuner.apply`` cannot change it: ``training_code`` prints what to write there.

The trial worker (`execution/step.py`, through `Candidate`) and `tpu_tuner.apply` call the same
hooks, so what was measured is what gets applied. A backend never sees a candidate: the hooks
combine a value with the backend's primitives (its eager modes, its matmul dtypes). ``code`` prints
the same thing as Python for ``tpu-tune apply``; ``observe`` reads the setting back, which the
contract test compares.

Knob modules import torch inside their hooks only: the CLI reads the registry (choices, names)
before it may import torch (a bad option is refused first, docs/run-safety.md).
"""

from __future__ import annotations

import contextlib
from abc import ABC
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from torch import nn

    from tpu_tuner.devices.base import Backend
    from tpu_tuner.knobs.traits import WorkloadTraits

    # A backend instance, or its class where only its tables are needed (the parent process and
    # `tpu-tune apply` ask the class: the device may not be present there).
    BackendLike = Backend | type[Backend]
else:
    BackendLike = Any


# The reason a choice is left out when its knob gives no more specific one.
CANNOT_RUN = "cannot run on this workload's step"


class Knob(ABC):
    """One tunable setting. Values are strings in the search space's vocabulary; `default` is
    the baseline (what a candidate that does not set the knob runs)."""

    name: ClassVar[str]
    agent: ClassVar[str]  # the agent that reasons about it (agents/<agent>.toml)
    default: ClassVar[str]
    values: ClassVar[tuple[str, ...] | None] = None  # the valid values, where they are a fixed set
    device_kinds: ClassVar[tuple[str, ...] | None] = None  # the backends it applies to; None: every one
    position: ClassVar[int] = 100  # order in labels, tables and configs (lower first)

    # --- values ------------------------------------------------------------------------------

    def check(self, value: str) -> str:
        """The canonical form of `value`; raises ValueError (naming the knob) when it is invalid."""
        if not isinstance(value, str):
            raise ValueError(f"{self.name} must be a string, not {type(value).__name__}")
        if self.values is not None and value not in self.values:
            raise ValueError(f"{self.name} must be one of {', '.join(self.values)}, not {value!r}")
        return value

    # Fields of candidates written before the registry that held this knob's setting.
    legacy_fields: ClassVar[tuple[str, ...]] = ()

    def from_legacy_fields(self, fields: Mapping[str, Any]) -> str | None:
        """This knob's value in a pre-registry candidate (`legacy_fields` style: ``eager_mode``,
        ``compile_backend``, ...); None where those fields never held it (its default then)."""
        return None

    def device_default(self, device_kind: str | None) -> str:
        """The value `device_kind` runs unchanged code at: a baseline ("the user's code as it runs
        there") sets it. `default` unless the device's own differs (TorchTPU's matmul precision)."""
        return self.default

    def applies_to(self, device_kind: str) -> bool:
        """Whether the knob means anything on this device kind (a config for another kind
        leaves it out)."""
        return self.device_kinds is None or device_kind in self.device_kinds

    def active(self, settings: Mapping[str, str]) -> bool:
        """Whether the knob means anything given the other knobs' `settings` (name -> value, the
        ones decided so far). An inactive knob is neither searched nor set: the search space asks
        for it only when this is true (a conditional parameter), and a setting without it runs
        its default. E.g. inductor's options only under ``execution = inductor``."""
        return True

    # Why `applies_to_workload` can say no, for the run's report ("left out: ...").
    not_applicable: ClassVar[str] = "cannot change this workload's step"

    def applies_to_workload(self, traits: WorkloadTraits) -> bool:
        """Whether the knob can change this workload's step at all (`knobs/traits.py`); a knob
        that cannot is not a parameter of the workload's search space. E.g. the optimizer's
        implementation only for a training step."""
        return True

    def choice_applies(self, value: str, traits: WorkloadTraits) -> bool:
        """Whether one choice can run on this workload (e.g. inductor freezing only without
        grad, a micro-batch count only where it divides the batch); the baseline choice always
        can."""
        return True

    def choice_refusal(self, value: str, traits: WorkloadTraits) -> str | None:
        """Why one choice cannot run on this workload, for the run's report; None where it can."""
        return None if self.choice_applies(value, traits) else CANNOT_RUN

    def choices(self, device_kind: str, entry: dict[str, Any], ranks: int = 1) -> tuple[str, ...]:
        """The choices of the search-space TOML `entry` on this device (the first is the
        baseline); empty where the knob is not searched there. `ranks`: the processes each
        trial runs on (``--nproc``), which only the sharding layout's choices depend on."""
        if not self.applies_to(device_kind):
            return ()
        choices = tuple(entry.get("choices", {}).get(device_kind, []))
        for choice in choices:
            self.check(choice)  # spelled as the space spells it ("eager:strict"), but valid
        return choices

    # --- how a value is applied ---------------------------------------------------------------

    def environment(self, value: str, backend: BackendLike) -> dict[str, str]:
        """Variables that must be set before the process imports torch."""
        return {}

    def fresh_process(self, value: str, backend: BackendLike) -> bool:
        """Whether measuring `value` needs a process started with its environment."""
        return bool(self.environment(value, backend))

    def process(self, value: str, backend: Backend) -> contextlib.AbstractContextManager[Any]:
        """A context that holds process-wide settings and restores them on exit."""
        return contextlib.nullcontext()

    def model(self, value: str, model: nn.Module, backend: BackendLike) -> nn.Module:
        """The model with the setting applied (in place where possible)."""
        return model

    def model_for_step(self, value: str, model: nn.Module, backend: BackendLike, training: bool) -> nn.Module:
        """`model` for a step that trains (`training`) or only runs forwards; the callers that know
        which (a trial's step, `tpu_tuner.apply`) call this. `model`'s answer unless the knob
        applies differently to the two (the layout's data axis: DDP to train, replicas to infer)."""
        return self.model(value, model, backend)

    def forward(
        self, value: str, fn: Callable[..., Any], backend: BackendLike, static_shapes: bool = False
    ) -> Callable[..., Any]:
        """`fn` (the model's forward) wrapped as the value asks. `static_shapes`: every new input
        shape compiles anew (``dynamic=False``), as TorchTPU always does."""
        return fn

    def step(self, value: str, backend: BackendLike) -> contextlib.AbstractContextManager[Any]:
        """A context entered around every step (forward and loss)."""
        return contextlib.nullcontext()

    def compute_dtype(self, value: str, dtype: str, backend: Backend) -> str:
        """The dtype the step's matmuls run in under `value`, given `dtype`, what the knobs before
        it (registry order) decided; the start is float32."""
        return dtype

    def compiles(self, value: str) -> bool:
        """Whether `value` runs the forward through torch.compile (a step that then counted no
        compile ran eager, and measured nothing of the setting)."""
        return False

    # True for a knob whose values spread one step over several processes (the sharding layout):
    # an ``--nproc N`` run searches one, and `apply_sharding` applies these knobs alone.
    spreads_over_ranks: ClassVar[bool] = False

    def local_batch(self, value: str, inputs: Any, target: Any) -> tuple[Any, Any]:
        """The part of the global batch this process runs (a rank of a sharded step runs its
        slice); the whole batch by default."""
        return inputs, target

    def gather_output(self, value: str, output: Any, local_batch: int | None) -> Any:
        """The global batch's model output from this process's output of its slice (`local_batch`
        samples): `local_batch`'s inverse, which the accuracy guardrail compares with one
        device's output of the whole batch; `output` as it is by default."""
        return output

    # --- how a training step is built (no-ops by default; inference steps never call them) -----

    # True for knobs that act only on the training step (optimizer, accumulation): they leave the
    # model and its forward alone, so `observe` reads nothing there; `observe_training` does.
    training_only: ClassVar[bool] = False

    def optimizer(self, value: str, optimizer: Any, backend: BackendLike) -> Any:
        """The training step's optimizer with the setting applied (the same one by default)."""
        return optimizer

    def micro_batches(self, value: str) -> int:
        """Into how many micro-batches a training step splits its batch (1: the whole batch)."""
        return 1

    def training_code(self, value: str, device_kind: str) -> list[str]:
        """Python for the user's own training loop (``optimizer``, ``loss_fn``, ``inputs``,
        ``target`` are their names); ``tpu_tuner.apply`` cannot change a loop it does not run."""
        return []

    def observe_training(self, optimizer: Any, micro_batches: int) -> str | None:
        """The value in force in a built training step (its optimizer, its micro-batch count);
        None where the knob does not act on the training step."""
        return None

    # --- reports and code ---------------------------------------------------------------------

    def describe(self, value: str) -> str:
        """A few words for labels and reports; empty for the default (it goes without saying)."""
        return "" if value == self.default else f"{self.name} {value}"

    def label(self, value: str) -> str:
        """The knob's part of the dashboard's terse settings cell ("compile=inductor, matmul=high");
        empty where it goes without saying (the default)."""
        return "" if value == self.default else f"{self.name}={value}"

    # --- the tuned config: tables beside [settings] -------------------------------------------

    def config_tables(self, value: str) -> dict[str, dict[str, Any]]:
        """Tables of ``tuned_config.toml`` that repeat `value` beside [settings] for other readers
        (table name -> entries merged into it; the layout's [sharding.mesh])."""
        return {}

    def from_config_tables(self, value: str, tables: Mapping[str, Any]) -> str:
        """The value of a config whose [settings] give `value` and whose other `tables` may give
        it too (configs written with the table alone); ValueError naming both where they
        disagree or a table is malformed."""
        return value

    def instructions(self, value: str, backend: BackendLike) -> list[str]:
        """Comment lines heading a tuned config's printed instructions (how to start the
        processes the value runs on); none by default."""
        return []

    def code(self, value: str, device_kind: str) -> list[str]:
        """Python statements that apply `value` to `model` and a batch `inputs` (the user's own
        names), runnable as printed after ``import torch``."""
        return []

    def code_for_step(self, value: str, device_kind: str, training: bool) -> list[str]:
        """`code` for a step that trains (`training`) or only runs forwards; `code`'s lines unless
        the knob applies differently to the two (`model_for_step`)."""
        return self.code(value, device_kind)

    def step_code(self, value: str, device_kind: str) -> str | None:
        """A context-manager expression to run the step in (``with <it>: output = model(inputs)``)."""
        return None

    def observe(self, model: nn.Module, forward: Callable[..., Any], backend: BackendLike) -> str | None:
        """The value in force now, read back from torch, the model and its forward (called inside
        the process and step contexts); None where it cannot be read. The contract test checks
        that applying a value makes this return it, on the trial path and on the apply path."""
        return None
