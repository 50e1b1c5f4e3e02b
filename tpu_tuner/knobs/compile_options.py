"""The `compile_options` knob: inductor's options, searched only under ``execution = inductor``.

A value is ``default`` or flags joined by ``+`` (``freezing+max-autotune``):

* ``freezing``: ``torch._inductor.config.freezing``: weights become constants of the compiled
  inference graph (constant folding, prepacked oneDNN / cuBLAS weights). Inference only: inductor
  freezes only graphs compiled without grad, and frozen weights must not change afterwards;
* ``max-autotune``: ``torch._inductor.config.max_autotune``: benchmark GEMM / convolution
  templates at compile time (what ``mode="max-autotune-no-cudagraphs"`` sets);
* ``fullgraph``: a graph break fails the compile instead of falling back to eager around it
  (``torch._dynamo.error_on_graph_break(True)``, what ``fullgraph=True`` asks); a model that
  breaks then fails its trial with dynamo's reason;
* ``cudagraphs`` (CUDA only): ``torch._inductor.config.triton.cudagraphs``, the CUDA-graph part
  of ``mode="reduce-overhead"``; CUDA graphs mean nothing off CUDA.

Applied twice over, on purpose: process-wide by the ``process`` hook, and passed to
``torch.compile`` again by the ``forward`` hook, since dynamo guards on the backend, not on
inductor's global config (why, and why one knob of composite values: docs/knobs.md, "Compiler
options: `compile_options`, and the conditional space").
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from tpu_tuner.knobs.base import BackendLike, Knob
from tpu_tuner.knobs.capabilities import CANNOT_RUN, Conditional, LeavesMemory, NarrowedByWorkload

if TYPE_CHECKING:
    from torch import nn

    from tpu_tuner.devices.base import Backend
    from tpu_tuner.knobs.traits import WorkloadTraits

DEFAULT = "default"
FREEZING = "freezing"
MAX_AUTOTUNE = "max-autotune"
FULLGRAPH = "fullgraph"
CUDAGRAPHS = "cudagraphs"
FLAGS = (FREEZING, MAX_AUTOTUNE, FULLGRAPH, CUDAGRAPHS)  # canonical order of a composite value
# Flags -> the inductor config entries they set (fullgraph is dynamo's, handled apart).
_INDUCTOR_CONFIG = {FREEZING: "freezing", MAX_AUTOTUNE: "max_autotune", CUDAGRAPHS: "triton.cudagraphs"}
# The compile backend whose options these are.
INDUCTOR = "inductor"


def flags(value: str) -> tuple[str, ...]:
    """The flags of a (canonical) value; () for the default."""
    return () if value == DEFAULT else tuple(value.split("+"))


class CompileOptionsKnob(Knob, Conditional, NarrowedByWorkload, LeavesMemory):
    """``default`` or ``+``-joined flags from freezing, max-autotune, fullgraph, cudagraphs."""

    name = "compile_options"
    agent = "compile"
    default = DEFAULT
    position = 15  # right after execution: labels read "inductor, freezing"
    device_kinds = ("cpu", "cuda")  # TorchTPU compiles with its own backend, not inductor

    def leaves_memory(self, value: str) -> bool:
        # Frozen weights become graph constants and CUDA graphs keep static pools: their own estimate.
        return not {FREEZING, CUDAGRAPHS} & set(flags(value))

    def check(self, value: str) -> str:
        value = super().check(value)
        if value == DEFAULT:
            return value
        given = value.split("+")
        unknown = [f for f in given if f not in FLAGS]
        if unknown or len(set(given)) != len(given):
            raise ValueError(
                f"compile_options must be {DEFAULT!r} or flags joined by '+' from "
                f"{', '.join(FLAGS)} (each once), not {value!r}"
            )
        return "+".join(f for f in FLAGS if f in given)

    def choices(self, device_kind: str, entry: dict[str, Any], ranks: int = 1) -> tuple[str, ...]:
        choices = super().choices(device_kind, entry, ranks)
        if device_kind != "cuda":
            bad = [c for c in choices if CUDAGRAPHS in flags(self.check(c))]
            if bad:
                raise ValueError(f"compile_options {bad[0]!r}: CUDA graphs exist only on CUDA, not {device_kind}")
        return choices

    def choice_refusal(self, value: str, traits: WorkloadTraits) -> str | None:
        # Freezing bakes the weights into the graph: a training step updates them.
        return CANNOT_RUN if traits.training and FREEZING in flags(self.check(value)) else None

    def active(self, settings: Mapping[str, str]) -> bool:
        """Searched only under inductor: the options are inductor's (any mode of it)."""
        from tpu_tuner.knobs.execution import ExecutionKnob, split

        # The condition is on another knob: named by its class, so a rename stays one edit.
        return split(settings.get(ExecutionKnob.name, ExecutionKnob.default))[0] == INDUCTOR

    def process(self, value: str, backend: Backend) -> contextlib.AbstractContextManager[Any]:
        return _compiler_settings(flags(value))

    def forward(
        self, value: str, fn: Callable[..., Any], backend: BackendLike, static_shapes: bool = False
    ) -> Callable[..., Any]:
        from tpu_tuner.knobs.execution import COMPILE_KWARGS_ATTR, EXECUTION_ATTR, compile_options, split

        execution = getattr(fn, EXECUTION_ATTR, None)  # set by the execution knob's forward
        if value == DEFAULT or execution is None or split(execution)[0] != INDUCTOR:
            return fn  # not compiled by inductor: nothing for these options to change
        import torch
        import torch._inductor

        if isinstance(fn, torch._dynamo.eval_frame.OptimizedModule):
            original = fn._orig_mod
        else:  # torch.compile's wrapper of a function, which carries what it wraps
            original = fn._torchdynamo_orig_callable  # type: ignore[attr-defined]  # set by torch.compile, untyped
        kwargs = compile_options(execution) or {}
        # torch.compile takes a mode or options, not both: the mode's own options, then ours.
        mode = kwargs.pop("mode", None)
        # Every option this knob owns is spelled out (off unless the mode or the value sets it), so
        # any non-default value (fullgraph alone too) gives a backend unequal to plain inductor's.
        inductor: dict[str, Any] = {key: False for key in _INDUCTOR_CONFIG.values()}
        inductor.update(torch._inductor.list_mode_options(mode) if mode else {})
        inductor.update({_INDUCTOR_CONFIG[f]: True for f in flags(value) if f in _INDUCTOR_CONFIG})
        kwargs["options"] = inductor
        if FULLGRAPH in flags(value):
            kwargs["fullgraph"] = True
        if static_shapes:
            kwargs["dynamic"] = False
        compiled = torch.compile(original, **kwargs)
        setattr(compiled, EXECUTION_ATTR, execution)
        setattr(compiled, COMPILE_KWARGS_ATTR, kwargs)
        return compiled

    def describe(self, value: str) -> str:
        return "" if value == DEFAULT else value.replace("+", ", ")

    def code(self, value: str, device_kind: str) -> list[str]:
        lines = []
        for flag in flags(value):
            if flag == FULLGRAPH:
                lines.append(
                    "torch._dynamo.error_on_graph_break(True).__enter__()  # as fullgraph=True: a graph break fails"
                )
            else:
                lines.append(f"torch._inductor.config.{_INDUCTOR_CONFIG[flag]} = True")
        if FREEZING in flags(value):
            lines.append("model = model.eval()  # freezing: inference under torch.no_grad() only")
        return lines

    def observe(self, model: nn.Module, forward: Callable[..., Any], backend: BackendLike) -> str | None:
        import torch._inductor.config as inductor_config
        from torch._dynamo.decorators import _get_error_on_graph_break

        on = {flag for flag, key in _INDUCTOR_CONFIG.items() if _config_get(inductor_config, key)}
        if _get_error_on_graph_break():
            on.add(FULLGRAPH)
        return "+".join(f for f in FLAGS if f in on) or DEFAULT


def _config_get(config: Any, dotted: str) -> Any:
    return functools.reduce(getattr, dotted.split("."), config)


class _compiler_settings(contextlib.AbstractContextManager[None]):
    """Every flag set as `on` says (the others off), restored on exit, so a previous candidate's
    options never leak into the next one in the same worker. Nothing is restored while the
    interpreter shuts down (torch's config module can no longer be written then)."""

    def __init__(self, on: tuple[str, ...]) -> None:
        self.on = on
        self.saved: dict[str, Any] = {}
        self.graph_break: contextlib.AbstractContextManager[Any] | None = None

    def __enter__(self) -> None:
        import torch._dynamo
        import torch._inductor.config as inductor_config

        for flag, key in _INDUCTOR_CONFIG.items():
            self.saved[key] = _config_get(inductor_config, key)
            _config_set(inductor_config, key, flag in self.on)
        self.graph_break = torch._dynamo.error_on_graph_break(FULLGRAPH in self.on)
        self.graph_break.__enter__()

    def __exit__(self, *exc: object) -> None:
        if sys.is_finalizing():
            # `tpu_tuner.apply` keeps its settings open (Candidate.process is a generator, closed
            # by garbage collection at exit); torch's modules are half torn down by then.
            return
        import torch._inductor.config as inductor_config

        if self.graph_break is not None:
            self.graph_break.__exit__(None, None, None)
        for key, value in self.saved.items():
            _config_set(inductor_config, key, value)


def _config_set(config: Any, dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    setattr(functools.reduce(getattr, parents, config), last, value)
