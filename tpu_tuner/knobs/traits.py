"""What a workload is, as far as knobs care: the facts that decide which knobs and choices can
mean anything for it.

Read once from the baseline's built model in the profiling worker (`knobs/model_traits.py`) and
stored in the profile, so the parent, which never imports the model file, can narrow the space
(`SearchSpace.for_workload`): a knob that cannot change this workload's step is not a parameter
of its study, rather than a parameter whose other values are all rejected. That keeps the space,
the grid and the trials table to what can be measured (a convolution-free training step has no
memory format to search; an inference step no optimizer).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from tpu_tuner.model.workloads.profiled import ProfiledWorkload


@dataclass(frozen=True)
class WorkloadTraits:
    """The facts knobs are narrowed by (`NarrowedByWorkload` knobs, `knobs/capabilities.py`)."""

    training: bool  # a training step (forward, backward, optimizer), not inference
    conv_weights: int  # 4-D parameters (convolution weights): what a memory format re-lays
    repeated_blocks: int  # members of the model's outermost stack of like blocks
    batch_size: int | None  # the batch one step runs (micro-batches must divide it)
    # The greatest common divisor of what a tensor-parallel axis must divide (the column / row
    # widths and head counts of the repeated blocks, `parallel.apply.tensor_widths`); None where
    # tensor parallelism has nothing to shard (or for a profile written before it was recorded).
    tensor_divisor: int | None = None
    # The attention implementations a transformers model can switch to (`knobs/attn_implementation.py`).
    attention_implementations: tuple[str, ...] = ()
    # nn.Linear modules: what a quantization knob quantizes; None for a profile written before.
    linear_layers: int | None = None
    # Whether the model's code calls torch.nn.functional.scaled_dot_product_attention (what
    # `knobs/attention_kernel.py` replaces); False for a profile written before it was recorded.
    scaled_dot_product_attention: bool = False

    def to_dict(self) -> dict[str, Any]:
        # Lists, as the profile's JSON gives them back (a stored profile equals the live one).
        return {**asdict(self), "attention_implementations": list(self.attention_implementations)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WorkloadTraits:
        """From a stored profile's ``workload["traits"]``; KeyError/TypeError when malformed."""
        return cls(
            training=bool(data["training"]),
            conv_weights=int(data["conv_weights"]),
            repeated_blocks=int(data["repeated_blocks"]),
            batch_size=None if data.get("batch_size") is None else int(data["batch_size"]),
            tensor_divisor=None if data.get("tensor_divisor") is None else int(data["tensor_divisor"]),
            attention_implementations=tuple(str(v) for v in data.get("attention_implementations") or ()),
            linear_layers=None if data.get("linear_layers") is None else int(data["linear_layers"]),
            scaled_dot_product_attention=bool(data.get("scaled_dot_product_attention", False)),
        )


def of_profile(workload: ProfiledWorkload | Mapping[str, Any]) -> WorkloadTraits | None:
    """The traits a profile recorded (`Profile.workload`, or its profile.json table read as plain
    JSON); None for a profile written before traits were recorded (or a malformed entry), so
    callers search the space unnarrowed. A profile's traits take its one `training` flag."""
    if isinstance(workload, ProfiledWorkload):
        if workload.traits is None:
            return None
        data: Any = {**workload.traits, "training": workload.training}
    else:
        data = workload.get("traits")
    if not isinstance(data, Mapping):
        return None
    try:
        return WorkloadTraits.from_dict(data)
    except (KeyError, TypeError, ValueError):
        return None
