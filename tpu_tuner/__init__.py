"""tpu-tune: automated performance tuning for PyTorch models on TPUs (and GPUs and CPUs).

The public API is re-exported here; everything else is internal.
"""

from tpu_tuner.backends import Backend, DeviceInfo, get_backend
from tpu_tuner.candidate import Candidate
from tpu_tuner.errors import BackendError, DefinitionError, TpuTuneError, UserInputError, WorkloadError
from tpu_tuner.loader import load_workload
from tpu_tuner.profiling import Profile, ProfilerSettings, profile
from tpu_tuner.tuned_config import AppliedConfig, TunedConfig, apply
from tpu_tuner.tuning import TuneOptions, TuningResult, tune
from tpu_tuner.workload import TransformerDims, Workload

__all__ = [
    "AppliedConfig",
    "Backend",
    "BackendError",
    "Candidate",
    "DefinitionError",
    "DeviceInfo",
    "Profile",
    "ProfilerSettings",
    "TpuTuneError",
    "TransformerDims",
    "TuneOptions",
    "TunedConfig",
    "TuningResult",
    "UserInputError",
    "Workload",
    "WorkloadError",
    "apply",
    "get_backend",
    "load_workload",
    "profile",
    "tune",
]
__version__ = "0.1.0"
