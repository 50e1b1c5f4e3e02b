"""The accuracy guardrail: a trial's outputs against a full-fp32 eager reference and the baseline's.

Inference compares the model outputs; training compares the loss and the gradients of the
first step (before any optimizer step; accumulated over the candidate's micro-batches), on the
same seeded weights and inputs. The error is relative: ||trial - reference|| / ||reference||,
per compared part, its norms in float64. A part of more than `SAMPLE` elements is compared on a
fixed sample of them, the same in every process (`sampled`): a Llama-class model's gradients
were 1.6 GB a copy, read back from the device, written and read again in every worker. The
guardrail judges a setting by how much its error against fp32 exceeds the baseline's
(execution/measurement.py, `accuracy_excess`): the baseline is what the user's code runs, one
bf16 pass on a TPU (docs/tuning.md, "Accuracy against the baseline").
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from tpu_tuner.devices.base import Backend
from tpu_tuner.execution.step import PreparedStep, accumulate_gradients, micro_batches
from tpu_tuner.execution.traced_step import traced_gradients
from tpu_tuner.knobs import capabilities as kinds
from tpu_tuner.knobs import registry as knobs
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.model.workloads.batch import batch_size_of
from tpu_tuner.model.workloads.workload import Workload, call_model

log = logging.getLogger(__name__)

REFERENCE = Candidate()  # eager, fp32 "highest", no autocast
# Elements a float64 copy is made of at a time: a whole model's gradients are never copied at once.
CHUNK = 1 << 22
# Elements compared per part at most. A stratified sample of 2^20 (`sampled`) estimates the
# relative L2 error of the whole to within a few percent of itself unless a handful of elements
# of a large piece carry the difference (docs/tuning.md, "On a sample"); 4 MiB read back.
SAMPLE = 1 << 20


@dataclass
class Outputs:
    """What a step produced that the guardrail compares, on the CPU, in float32."""

    parts: dict[str, torch.Tensor]


def capture(step: PreparedStep, workload: Workload, backend: Backend, candidate: Candidate) -> Outputs:
    """Run the candidate's forward (and backward) once without touching the weights."""
    inputs, target = step.batch
    if workload.is_training:
        assert step.loss is not None
        # The candidate's own accumulation (micro-batches, loss / k): its accumulated gradients
        # are what is compared with the whole-batch fp32 reference.
        if candidate.traces_step(backend.kind):  # the traced program's own loss and gradients
            loss = traced_gradients(step, workload, backend, candidate)
        else:
            slices = micro_batches(inputs, target, candidate.micro_batches(backend), workload)
            loss = accumulate_gradients(step.loss, slices, lambda: candidate.step(backend))
        # As a rank of a sharded step: its slice's loss averaged over the ranks, and every
        # gradient whole (gathered from its shards; every rank takes part, in parameter order).
        loss = backend.mean_over_ranks(loss)
        grads = [whole(p.grad).detach().flatten() for p in step.model.parameters() if p.grad is not None]
        parts = {"loss": loss.detach().float().reshape(1).cpu(), "gradients": sampled(grads)}
        step.model.zero_grad(set_to_none=True)
    else:
        with torch.no_grad(), candidate.step(backend):
            output = call_model(step.forward, inputs)
        # As a rank of a sharded step: the global batch's output, every rank's slice gathered in
        # batch order (every rank takes part), as one device computes it on the whole batch.
        output = candidate.gather_output(output, batch_size_of(inputs), backend)
        parts = {"output": sampled([flatten_output(output)])}
    return Outputs(parts)


def sampled(pieces: list[torch.Tensor], limit: int = SAMPLE) -> torch.Tensor:
    """Flat `pieces` as one float32 CPU tensor: every element where they hold at most `limit`
    (`SAMPLE` by default), else a stratified sample of `limit`: the smallest pieces whole, and an
    equal share of what is left drawn uniformly from each larger one, scaled by sqrt(size / drawn)
    so that the sample's squared norms estimate the whole's (docs/tuning.md, "On a sample").
    Small pieces (a norm's weight) can carry most of a difference; a share by size gave one a
    handful of elements. The draw depends only on each piece's place and size (a seeded CPU
    generator per piece), so the reference, the baseline and every trial compare the same
    elements; it is gathered on the piece's device, and only the sample is read back."""
    total = sum(piece.numel() for piece in pieces)
    if total <= limit:
        return torch.cat([piece.float() for piece in pieces]).cpu() if pieces else torch.zeros(0)  # one read back
    counts = sample_counts([piece.numel() for piece in pieces], limit)
    chosen = []
    for place, (piece, count) in enumerate(zip(pieces, counts, strict=True)):
        if count == piece.numel():
            chosen.append(piece.float())
            continue
        generator = torch.Generator().manual_seed(place)
        index = torch.randint(piece.numel(), (count,), generator=generator)
        chosen.append(piece[index.to(piece.device)].float() * math.sqrt(piece.numel() / count))
    return torch.cat(chosen).cpu()


def sample_counts(sizes: list[int], limit: int) -> list[int]:
    """How many elements of each piece the sample takes: `limit` shared out equally, smallest
    pieces first, each taking the whole of itself where that is less than its share."""
    counts = [0] * len(sizes)
    left, remaining = limit, sum(1 for size in sizes if size)
    for place in sorted(range(len(sizes)), key=lambda i: sizes[i]):
        if not sizes[place]:
            continue
        counts[place] = min(sizes[place], max(1, left // remaining))
        left, remaining = left - counts[place], remaining - 1
    return counts


def relative_error(trial: Outputs, reference: Outputs) -> dict[str, float]:
    """Relative L2 error of each compared part (inf where shapes differ or values are not finite)."""
    errors: dict[str, float] = {}
    for name, expected in reference.parts.items():
        got = trial.parts.get(name)
        if got is None or got.shape != expected.shape or not torch.isfinite(got).all():
            errors[name] = float("inf")
            continue
        errors[name] = _relative(got.reshape(-1), expected.reshape(-1))
    return errors


def _relative(got: torch.Tensor, expected: torch.Tensor) -> float:
    """||got - expected|| / ||expected|| (the absolute norm where `expected` is all zeros).

    In float32, squares of values near 1e-21 underflow to zero (an error read as 0) and those
    near 1e21 overflow (inf / inf: NaN, which passes any `>` check). Here both tensors are first
    divided by the reference's largest magnitude and summed in float64, a chunk at a time."""
    scale = expected.abs().max().item() if expected.numel() else 0.0
    if not math.isfinite(scale):  # a non-finite reference: nothing to be relative to
        return float("inf")
    scale = scale or 1.0
    diff_sq = ref_sq = 0.0
    for start in range(0, expected.numel(), CHUNK):
        e = expected[start : start + CHUNK].double() / scale
        diff_sq += (got[start : start + CHUNK].double() / scale - e).square().sum().item()
        ref_sq += e.square().sum().item()
    return math.sqrt(diff_sq) / (math.sqrt(ref_sq) or 1.0)  # an all-zero reference: scale 1, absolute


@dataclass(frozen=True)
class AccuracyErrors:
    """A trial's relative errors by part: against the fp32 reference, the baseline's against the
    same reference, and against the baseline's outputs (`Measurement`'s fields of those names)."""

    accuracy_errors: dict[str, float] = field(default_factory=dict)
    baseline_errors: dict[str, float] = field(default_factory=dict)
    errors_vs_baseline: dict[str, float] = field(default_factory=dict)

    def fields(self) -> dict[str, dict[str, float]]:
        """The three, as `Measurement` / `EarlyStop` keyword arguments."""
        return asdict(self)


@dataclass(frozen=True)
class BaselineOutputs:
    """The baseline's outputs and their errors against the fp32 reference; `outputs` None where
    the baseline could not run (a trial is then judged against fp32 alone)."""

    outputs: Outputs | None
    errors: dict[str, float]


def single_device(candidate: Candidate) -> Candidate:
    """`candidate` on one process: its layout (each `SpreadsOverRanks` knob) at its default. The
    baseline's outputs are computed as the reference's are, on the whole batch in one process."""
    spread = {name: knob.default for name, knob in knobs.REGISTRY.items() if isinstance(knob, kinds.SpreadsOverRanks)}
    return Candidate({**candidate.to_dict(), **spread})


def baseline_outputs(run: Callable[[Candidate], Outputs], baseline: Candidate, reference: Outputs) -> BaselineOutputs:
    """The baseline's outputs (`run` computes a candidate's on one process) and errors against
    `reference`; where it cannot run, none, and a warning: every trial would otherwise fail with it."""
    try:
        outputs = run(single_device(baseline))
    except Exception as exc:  # any failure of the user's step (its OOM too): the trials still run
        log.warning("the baseline's outputs could not be computed (%s): accuracy judged against fp32 alone", exc)
        return BaselineOutputs(None, {})
    return BaselineOutputs(outputs, relative_error(outputs, reference))


def judge(outputs: Outputs, reference: Outputs, baseline: BaselineOutputs | None, is_baseline: bool) -> AccuracyErrors:
    """A trial's errors against the fp32 reference and the baseline (None: no baseline given, the
    fp32 rule). The baseline's own trial takes its own errors as the baseline's, so it never fails
    its own guardrail, even where two runs of it differ."""
    errors = relative_error(outputs, reference)
    if baseline is None or baseline.outputs is None:
        return AccuracyErrors(errors)
    return AccuracyErrors(
        errors, dict(errors) if is_baseline else baseline.errors, relative_error(outputs, baseline.outputs)
    )


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor (a sharded gradient) gathered whole; any other tensor as it is."""
    if type(tensor).__name__ == "DTensor":  # no torch.distributed import for single-process steps
        return tensor.full_tensor()  # type: ignore[attr-defined]  # a DTensor, found by name above
    return tensor


def flatten_output(output: Any) -> torch.Tensor:
    """A model's output (a tensor, a dict by key, a tuple or list of them) as one flat float32
    tensor: what the guardrail compares."""
    if isinstance(output, torch.Tensor):
        return whole(output).detach().float().flatten()
    if isinstance(output, dict):
        return torch.cat([flatten_output(v) for _, v in sorted(output.items())])
    if isinstance(output, (tuple, list)):
        return torch.cat([flatten_output(v) for v in output])
    raise TypeError(f"cannot compare a model output of type {type(output).__name__}")
