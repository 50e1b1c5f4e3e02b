"""The user's workload and its loading: what a model file (or a shape, or an ``hf:`` source)
provides, and what tpu-tune knows of it. The top room of `model/`: it imports `decoders/` (the
loader builds a shape's decoder; a Hugging Face model's positions) and `meshes/` (a model's
dimensions as the layouts read them).

* `workload.py`: the `Workload` contract (build the model, make a batch, the loss and optimizer)
  and how a step calls it;
* `loader.py`: `load_workload` from a file of either convention, a shape or an ``hf:`` source;
  `model_argument.py` checks the argument first without importing torch;
* `hf_source.py`, `hf_workload.py`: an ``hf:`` source to a transformers config, and the native
  contract built from it;
* `batch.py`, `input_dims.py`: a batch resized or sliced, and which input sizes are the batch and
  the sequence;
* `profiled.py`: the workload as the profiler ran it (`Profile.workload`); `summary.py`: what the
  parent process knows of a model file without importing it;
* `blocks.py`, `structure.py`: a model's repeated blocks and its dimensions (width, depth, heads,
  vocabulary), read off its module tree.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpu_tuner.core.lazy import lazy_exports

if TYPE_CHECKING:
    from tpu_tuner.model.workloads.blocks import repeated_blocks
    from tpu_tuner.model.workloads.hf_source import HfSource
    from tpu_tuner.model.workloads.input_dims import InputDims
    from tpu_tuner.model.workloads.loader import load_workload
    from tpu_tuner.model.workloads.model_argument import check_model_argument
    from tpu_tuner.model.workloads.profiled import ProfiledWorkload
    from tpu_tuner.model.workloads.summary import WorkloadSummary
    from tpu_tuner.model.workloads.workload import Workload, call_model

# Imported on first use (PEP 562): the face imports none of its modules, and so no torch.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "Workload": f"{__name__}.workload",
        "call_model": f"{__name__}.workload",
        "load_workload": f"{__name__}.loader",
        "check_model_argument": f"{__name__}.model_argument",
        "HfSource": f"{__name__}.hf_source",
        "InputDims": f"{__name__}.input_dims",
        "ProfiledWorkload": f"{__name__}.profiled",
        "WorkloadSummary": f"{__name__}.summary",
        "repeated_blocks": f"{__name__}.blocks",
    },
)

__all__ = [
    "HfSource",
    "InputDims",
    "ProfiledWorkload",
    "Workload",
    "WorkloadSummary",
    "call_model",
    "check_model_argument",
    "load_workload",
    "repeated_blocks",
]
