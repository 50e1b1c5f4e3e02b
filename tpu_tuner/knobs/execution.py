"""The `execution` knob: eager, or torch.compile with a backend (and mode); on TPU also
TorchTPU's eager modes, which are start-up environment variables the backend names.

On TPU (torch-tpu 0.2.0, checked by `devices/torchtpu_api.py`): ``eager:strict`` is
``EagerMode.DEFER_NEVER`` (the default), ``eager:defer_and_fuse`` is ``DEFER_AND_FUSE``
(``TORCH_TPU_DEFER_AND_FUSE=1``), ``eager:debug`` is ``DEFER_NEVER_AND_LAUNCH_BLOCKING``
(``TORCH_TPU_LAUNCH_BLOCKING=1``), and ``tpu`` is ``torch.compile(backend="tpu")``. Left out of
the search: ``eager:debug`` (a debugging mode, synchronous launches: never the faster setting; it
stays a valid value) and any ``tpu:<mode>``: the backend takes no mode (torch passes ``mode`` on
and 0.2.0 raises ``TypeError: Unexpected keyword arguments: {'mode': ...}``), so it is refused
here. Its options (``async_compile``: compile latency, not step time; ``num_dynamic_buckets`` /
``bucket_size``: the bucketing study's, `model/buckets/torchtpu_buckets.py`) are no knob of this one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from tpu_tuner.knobs.base import BackendLike, Knob
from tpu_tuner.knobs.capabilities import Compiles, Flag, LeavesMemory, PickedByFlags, StartupEnvironment

if TYPE_CHECKING:
    from torch import nn

    from tpu_tuner.devices.base import Backend

EAGER = "eager"
TPU_COMPILE_BACKEND = "tpu"  # torch.compile(backend="tpu"): TorchTPU's
# Set on a compiled forward: the execution value it was compiled for (torch cannot say its mode).
EXECUTION_ATTR = "_tpu_tune_execution"
# Set on a compiled forward: the torch.compile keyword arguments it took (compile_scope's blocks take them).
COMPILE_KWARGS_ATTR = "_tpu_tune_compile_kwargs"


def split(value: str) -> tuple[str, str]:
    """("eager", eager mode) or (torch.compile backend, mode or "")."""
    head, _, tail = value.partition(":")
    return head, tail


class ExecutionKnob(Knob, Compiles, PickedByFlags, StartupEnvironment, LeavesMemory):  # estimated eager (its floor)
    """``eager``, ``eager:<TorchTPU eager mode>``, or ``<compile backend>[:<mode>]``."""

    name = "execution"
    agent = "compile"
    default = EAGER
    position = 10

    flags = (
        Flag(
            "--compile", "compile_backend", "torch.compile backend (inductor, aot_eager, tpu, ...)", metavar="BACKEND"
        ),
        Flag("--compile-mode", "compile_mode", "torch.compile mode (inductor only), e.g. max-autotune"),
        Flag(
            "--eager-mode",
            "eager_mode",
            "TorchTPU eager mode (TPU only; default strict)",
            choices=("strict", "debug", "defer_and_fuse"),
        ),
    )

    def from_fields(self, fields: Mapping[str, Any]) -> str | None:
        backend, mode, eager_mode = fields.get("compile_backend"), fields.get("compile_mode"), fields.get("eager_mode")
        if backend:
            return backend + (f":{mode}" if mode else "")
        return f"{EAGER}:{eager_mode}" if eager_mode else None

    def check(self, value: str) -> str:
        value = super().check(value)
        head, tail = split(value)
        if not head:
            raise ValueError(f"execution {value!r} names no compile backend")
        if head == EAGER and tail:
            modes = _eager_modes()
            if tail not in modes:
                raise ValueError(f"eager mode must be one of {', '.join(modes)}, not {tail!r}")
            # The default eager mode is plain eager: "eager:strict" and "eager" are one setting.
            return EAGER if tail == modes[0] else value
        if head == EAGER:
            return EAGER
        if head == TPU_COMPILE_BACKEND and tail:
            raise ValueError(
                f"execution {value!r}: TorchTPU's compile backend takes no mode "
                f"(torch-tpu 0.2.0 raises TypeError on one); use {TPU_COMPILE_BACKEND!r}"
            )
        return value

    def environment(self, value: str, backend: BackendLike) -> dict[str, str]:
        head, tail = split(value)
        return backend.eager_mode_environment(tail) if head == EAGER and tail else {}

    def process(self, value: str, backend: Backend) -> contextlib.AbstractContextManager[Any]:
        head, tail = split(value)
        # Every candidate sets the mode (the default one for compiled execution), so a previous
        # candidate's mode never leaks into the next one in the same worker.
        return backend.eager_mode(tail if head == EAGER and tail else None)

    def forward(
        self, value: str, fn: Callable[..., Any], backend: BackendLike, static_shapes: bool = False
    ) -> Callable[..., Any]:
        options = compile_options(value)
        if options is None:
            return fn
        if static_shapes:
            options["dynamic"] = False
        import torch

        compiled = torch.compile(fn, **options)
        setattr(compiled, EXECUTION_ATTR, value)  # what `observe` reports once it sees a compiled forward
        setattr(compiled, COMPILE_KWARGS_ATTR, options)
        return compiled

    def compiles(self, value: str) -> bool:
        return compile_options(value) is not None

    def label(self, value: str) -> str:
        # Always named: "eager", "eager:<mode>" or "compile=<backend>[:<mode>]".
        return value if split(value)[0] == EAGER else f"compile={value}"

    def describe(self, value: str) -> str:
        head, tail = split(value)
        if head == EAGER:
            return EAGER + (f", eager mode {tail}" if tail else "")
        return head + (f"({tail})" if tail else "")

    def code(self, value: str, device_kind: str) -> list[str]:
        options = compile_options(value)
        if options is None:
            return []
        mode = f', mode="{options["mode"]}"' if "mode" in options else ""
        return [f'model = torch.compile(model, backend="{options["backend"]}"{mode})']

    def observe(self, model: nn.Module, forward: Callable[..., Any], backend: BackendLike) -> str | None:
        import torch

        compiled = hasattr(forward, "_torchdynamo_orig_callable") or isinstance(
            forward, torch._dynamo.eval_frame.OptimizedModule
        )
        if not compiled:
            from tpu_tuner.model.workloads.blocks import COMPILED_BLOCK_ATTR, compiled_blocks

            blocks = compiled_blocks(forward)  # compile_scope = blocks: each block compiled on its own
            if not blocks:
                return EAGER
            given = getattr(blocks[0], COMPILED_BLOCK_ATTR)
            # torch.compile's default backend where the blocks were given none
            return getattr(forward, EXECUTION_ATTR, None) or given.get("backend", "inductor")
        backend_name = compiled_backend_name(forward)
        tagged = getattr(forward, EXECUTION_ATTR, None)
        if tagged is not None and (backend_name is None or split(tagged)[0] == backend_name):
            return tagged  # the mode is not recoverable from torch; the backend name agreed
        return backend_name


def compiled_backend_name(forward: Any) -> str | None:
    """The torch.compile backend of a compiled forward, read from dynamo's wrappers (private
    attributes: None where this torch version lays them out differently)."""
    try:
        wrapper = forward.dynamo_ctx.callback._torchdynamo_orig_backend._torchdynamo_orig_backend
        return str(wrapper._compiler_name)
    except AttributeError:
        return None


def compile_options(value: str) -> dict[str, Any] | None:
    """Keyword arguments of ``torch.compile`` for an execution value; None means eager."""
    head, tail = split(value)
    if head == EAGER:
        return None
    return {"backend": head, **({"mode": tail} if tail else {})}


def _eager_modes() -> tuple[str, ...]:
    """Every eager mode some backend knows (the first is the default), from the backends."""
    from tpu_tuner.devices import backend_classes  # lazy: the CLI checks values before it may import torch

    modes = ["strict"]
    for backend in backend_classes():
        modes += [m for m in backend.eager_modes() if m not in modes]
    return tuple(modes)


def compiled_with(backend_name: str) -> dict[str, str]:
    """The setting that runs a step under torch.compile with `backend_name` (no mode): what the
    bucketing study compiles its lengths with, named here rather than by this knob's name."""
    return {ExecutionKnob.name: backend_name}
