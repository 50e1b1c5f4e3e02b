"""What a study's workload is, and how far an earlier study's workload is from it: the warm
start's ranking (tuning/search/warm_start.py).

Ranking (`distance`, lower first):

* **0: the same workload**: the same model file (sha256), batch size, sequence length, ranks
  and step kind. Its best was measured on exactly this step, so it goes first.
* otherwise ``NOT_SAME_WORKLOAD`` (0.1), plus ``OTHER_MODEL_FILE`` (0.25) when the model file
  differs, plus ``|ln(FLOPs per parameter there / here)|``, plus ``OTHER_BOUND`` (1.0) when the
  verdicts' bounds differ, plus ``OTHER_KIND`` (1.5) when the model kinds differ; an unknown
  FLOPs per parameter counts as ``UNKNOWN_RATIO`` (ln 8), an unknown bound or kind as differing.

Why these weights: FLOPs per parameter (model FLOPs of a step over the parameter count: about 2x
the tokens a step processes, 6x when it trains) is how much work each weight does, which decides
whether a step is dominated by big matmuls (precision and autocast pay) or by small launches
(compilation and threads pay); on a log scale so that 2x more and 2x fewer are equally far. A
different bound means the bottleneck differs, and with it which knobs win (lower precision for a
compute-bound step, fusion for a memory-bound one, compilation for an overhead-bound one): as far
as an e-fold (2.7x) difference in FLOPs per parameter. A different model kind means a different
operator mix (convolutions: memory format; attention: the SDPA kernels compilers rewrite):
weighed more, as far as a 4.5x difference. The same model file at other sizes comes before
another model with the same features (`OTHER_MODEL_FILE`), and any exact match before both
(`NOT_SAME_WORKLOAD`). Ties go to the newer study.

Model kind, from what the profile records (`model_kind_of`): "transformer" when the FLOPs report
declares attention or an attention operator ran (a ViT's patch convolution does not make it
convolutional); "convolutional" when the model has 4-D weights (``traits.conv_weights``) or a
convolution ran; "recurrent" when an LSTM/GRU/RNN operator ran; "mlp" when only matmuls (mm,
addmm, linear) remain; None when the profile records none of these.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tpu_tuner.profiling.profile import Profile

# The distance's weights (see the module docstring for why).
NOT_SAME_WORKLOAD = 0.1
OTHER_MODEL_FILE = 0.25
OTHER_BOUND = 1.0
OTHER_KIND = 1.5
UNKNOWN_RATIO = math.log(8.0)
# Farther than this, an earlier best is a guess no better than the agents' own and would only take
# a trial of a small budget: another model kind (1.5 alone) never qualifies; the same kind and
# bound does within about 3.2x FLOPs per parameter (another model file), another bound within 1.16x.
MAX_DISTANCE = 1.5

SAME_WORKLOAD = "same workload"


@dataclass(frozen=True)
class WorkloadFeatures:
    """What a study's workload is, as far as choosing an earlier study's setting goes."""

    device_kind: str
    sha256: str | None  # the model file's hash (fingerprint["sha256"])
    batch_size: int | None
    seq_len: int | None
    nproc: int
    step_kind: str | None  # "training step", "inference (forward)", ...
    flops_per_param: float | None  # model FLOPs of a step / total parameters
    bound: str | None  # the baseline profile's verdict ("compute-bound", ...)
    model_kind: str | None  # "transformer", "convolutional", "recurrent", "mlp" (model_kind_of)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WorkloadFeatures:
        """From `to_dict` output; KeyError/TypeError/ValueError when malformed."""
        return cls(
            device_kind=str(data["device_kind"]),
            sha256=optional(str, data.get("sha256")),
            batch_size=optional(int, data.get("batch_size")),
            seq_len=optional(int, data.get("seq_len")),
            nproc=int(data.get("nproc") or 1),
            step_kind=optional(str, data.get("step_kind")),
            flops_per_param=optional(float, data.get("flops_per_param")),
            bound=optional(str, data.get("bound")),
            model_kind=optional(str, data.get("model_kind")),
        )

    def same_workload(self, other: WorkloadFeatures) -> bool:
        """The same step: model file, sizes, ranks, step kind and device kind."""
        return (
            self.sha256 is not None
            and self.sha256 == other.sha256
            and self.device_kind == other.device_kind
            and (self.batch_size, self.seq_len, self.nproc, self.step_kind)
            == (other.batch_size, other.seq_len, other.nproc, other.step_kind)
        )


def optional(kind: Callable[[Any], Any], value: Any) -> Any:
    """`value` converted by `kind`, None kept."""
    return None if value is None else kind(value)


def features_of(profile: Profile, fingerprint: Mapping[str, Any]) -> WorkloadFeatures:
    """The features of a run: its baseline `profile` and its `fingerprint` (fingerprint.py)."""
    flops = profile.flops
    verdict = getattr(profile, "verdict", None)
    return _features(
        device_kind=fingerprint.get("device_kind") or profile.device.kind,
        fingerprint=fingerprint,
        workload=profile.workload,
        model_flops=getattr(flops, "model_per_step", None),
        parameters=getattr(flops, "total_parameters", None),
        attention=getattr(flops, "attention_convention", None),
        bound=getattr(verdict, "bound", None),
        operators=[getattr(op, "name", "") for op in getattr(profile, "operators", None) or []],
    )


def features_of_json(profile: Mapping[str, Any], fingerprint: Mapping[str, Any]) -> WorkloadFeatures:
    """`features_of` on a profile.json read as plain JSON (no Profile rebuilt: a folder scan
    reads dozens). KeyError/TypeError/ValueError when it is not a profile."""
    flops = profile.get("flops") or {}
    return _features(
        device_kind=fingerprint.get("device_kind") or profile["device"]["kind"],
        fingerprint=fingerprint,
        workload=profile.get("workload") or {},
        model_flops=flops.get("model_per_step"),
        parameters=flops.get("total_parameters"),
        attention=flops.get("attention_convention"),
        bound=(profile.get("verdict") or {}).get("bound"),
        operators=[op.get("name", "") if isinstance(op, Mapping) else str(op) for op in profile.get("operators") or []],
    )


def _features(
    device_kind: str,
    fingerprint: Mapping[str, Any],
    workload: Mapping[str, Any],
    model_flops: Any,
    parameters: Any,
    attention: Any,
    bound: Any,
    operators: list[str],
) -> WorkloadFeatures:
    def size(key: str) -> int | None:
        # The fingerprint's, else the profile's: fingerprints of older runs hold None for "the
        # file's own size", which the profile's workload records.
        value = fingerprint.get(key)
        value = workload.get(key) if value is None else value
        return None if value is None else int(value)

    flops_per_param = (
        float(model_flops) / float(parameters) if model_flops and parameters and float(parameters) > 0 else None
    )
    return WorkloadFeatures(
        device_kind=str(device_kind),
        sha256=optional(str, fingerprint.get("sha256")),
        batch_size=size("batch_size"),
        seq_len=size("seq_len"),
        nproc=int(fingerprint.get("nproc") or 1),
        step_kind=optional(str, fingerprint.get("step_kind") or workload.get("step")),
        flops_per_param=flops_per_param,
        bound=optional(str, bound),
        model_kind=model_kind_of(workload.get("traits"), attention, operators),
    )


def model_kind_of(traits: Any, attention_convention: Any, operators: Iterable[str]) -> str | None:
    """ "transformer", "convolutional", "recurrent", "mlp" or None (the rule: module docstring)."""
    names = [str(name).lower() for name in operators]
    declared = (
        isinstance(attention_convention, str)
        and attention_convention
        and not attention_convention.startswith("not applicable")
    )
    if declared or any("attention" in n for n in names):
        return "transformer"
    conv_weights = traits.get("conv_weights") if isinstance(traits, Mapping) else None
    if (conv_weights or 0) > 0 or any("conv" in n for n in names):
        return "convolutional"
    if any(word in n for n in names for word in ("lstm", "gru", "rnn")):
        return "recurrent"
    if any(n.endswith(("::mm", "::addmm", "::bmm", "::linear", "::matmul")) for n in names):
        return "mlp"
    return None


def distance(here: WorkloadFeatures, there: WorkloadFeatures) -> tuple[float, str]:
    """How far `there`'s best setting is from fitting `here` (0: the same workload), and the
    words that say why: "same workload", or "nearest: FLOPs/parameter 1.40x, same bound
    (compute-bound), same kind (transformer)"."""
    if here.same_workload(there):
        return 0.0, SAME_WORKLOAD
    d, words = NOT_SAME_WORKLOAD, []
    if here.sha256 is not None and here.sha256 == there.sha256:
        words.append("same model file, other sizes")
    else:
        d += OTHER_MODEL_FILE
    if here.flops_per_param and there.flops_per_param:
        ratio = there.flops_per_param / here.flops_per_param
        d += abs(math.log(ratio))
        words.append(f"FLOPs/parameter {ratio:.2f}x")
    else:
        d += UNKNOWN_RATIO
        words.append("FLOPs/parameter unknown")
    for weight, name, a, b in (
        (OTHER_BOUND, "bound", here.bound, there.bound),
        (OTHER_KIND, "kind", here.model_kind, there.model_kind),
    ):
        if a is not None and a == b:
            words.append(f"same {name} ({a})")
        else:
            d += weight
            words.append(f"other {name} ({b or 'unknown'} vs {a or 'unknown'} here)")
    return d, "nearest: " + ", ".join(words)


__all__ = [
    "MAX_DISTANCE",
    "SAME_WORKLOAD",
    "WorkloadFeatures",
    "distance",
    "features_of",
    "features_of_json",
    "model_kind_of",
    "optional",
]
