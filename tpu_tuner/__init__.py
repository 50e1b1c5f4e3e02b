"""tpu-tune: automated performance tuning for PyTorch models on TPUs (and GPUs and CPUs).

The public API is re-exported here; everything else is internal.
"""

from tpu_tuner.core.lazy import lazy_exports
from tpu_tuner.core.tpu_host import settle_tpu_environment
from tpu_tuner.core.version import __version__  # noqa: F401 - the package version

# Before anything here can load libtpu: on a host without a TPU chip, libtpu (which torch-tpu's
# autoload brings into every `import torch`) must not spend minutes asking GCE's metadata server
# for a TPU at the first backward pass (tpu_tuner/core/tpu_host.py).
settle_tpu_environment()

# Public name -> the module that defines it. Imported on first use (PEP 562) rather than here, so
# that commands which never run a model (`tpu-tune dashboard`, `plan`'s parent process) do not pay
# for importing torch, seconds per process (docs/design.md, "Layers").
_EXPORTS = {
    "Backend": "tpu_tuner.devices",
    "DeviceInfo": "tpu_tuner.devices",
    "get_backend": "tpu_tuner.devices",
    "Candidate": "tpu_tuner.knobs.candidate",
    "BackendError": "tpu_tuner.core.errors",
    "DefinitionError": "tpu_tuner.core.errors",
    "TpuTuneError": "tpu_tuner.core.errors",
    "UserInputError": "tpu_tuner.core.errors",
    "WorkloadError": "tpu_tuner.core.errors",
    "load_workload": "tpu_tuner.model.workloads.loader",
    "Profile": "tpu_tuner.profiling",
    "ProfilerSettings": "tpu_tuner.profiling",
    "profile": "tpu_tuner.profiling",
    "AppliedConfig": "tpu_tuner.knobs.tuned_config",
    "TunedConfig": "tpu_tuner.knobs.tuned_config",
    "apply": "tpu_tuner.knobs.tuned_config",
    "TuneOptions": "tpu_tuner.tuning",
    "TuningResult": "tpu_tuner.tuning",
    "tune": "tpu_tuner.api",
    "study_storage": "tpu_tuner.api",
    "TransformerDims": "tpu_tuner.model.decoders.transformer_dims",
    "Workload": "tpu_tuner.model.workloads.workload",
    "PlanOptions": "tpu_tuner.planner.plans.plan",
    "plan": "tpu_tuner.planner.plans.plan",
    "BucketOptions": "tpu_tuner.bucketing.study",
    "plan_buckets": "tpu_tuner.bucketing.study",
    # Run folders: the same files the CLI writes (tpu_tuner/outputs/write.py).
    "plan_to_folder": "tpu_tuner.plan_api",
    "save_buckets": "tpu_tuner.outputs.write",
    "save_profile": "tpu_tuner.outputs.write",
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = sorted(_EXPORTS)  # the public names, listed once: the keys above
