"""The profiler agent: step time, FLOPs, MFU, memory, compilations, top operators, verdict."""

from tpu_tuner.profiling.profile import Profile, profile
from tpu_tuner.profiling.settings import ProfilerSettings

__all__ = ["Profile", "ProfilerSettings", "profile"]
