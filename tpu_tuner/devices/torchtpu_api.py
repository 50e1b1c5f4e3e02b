"""Every name tpu-tune uses of TorchTPU, in one table, and the check of that table against the
installed package (``tpu-tune devices``, tests/test_torchtpu_contract.py).

The adapter (`devices/torchtpu.py`) reaches TorchTPU only through the names listed here, so an API
change in a new torch-tpu release fails this check with the name that moved, instead of a trial
silently measuring something else. Read against torch-tpu 0.2.0's shipped sources
(docs/torchtpu.md has what each name does and where it is defined).

How each kind of name is checked, on a host without a TPU (``import torch_tpu`` works there: it
installs ``torch.tpu`` and registers the ``"tpu"`` compile backend; only the device runtime needs
a chip):

* public names: listed in the package's public API table (``torch_tpu/_internal/public_api.py``,
  read with ``ast``, no import), and resolved on the imported ``torch.tpu``;
* enum members, keyword parameters, result fields: on the imported objects;
* private names (where 0.2.0 has no public equivalent): resolved on the import;
* compile options: string keys read by the registered ``"tpu"`` backend's ``__call__``;
* the process-group backend: a ``register_backend("<name>", ...)`` call in the package's sources
  (TorchTPU registers it only on a TPU host);
* environment variables read by its C++ runtime: their names in the package's shared libraries;
* variables ``set_tpu_launch_env`` reads or writes for a multi-host slice: string constants of its
  source.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import typing
import warnings
from contextlib import suppress
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from tpu_tuner.core.tpu_host import TORCHTPU_CACHE_VARIABLE
from tpu_tuner.devices.torchtpu_package import (
    installed_version,
    package_folder,
    public_table,
    registered_process_group_backends,
    string_constants,
    strings_in_libraries,
)

TESTED_VERSION = "0.2.0"

# tpu-tune's eager modes -> TorchTPU's EagerMode members and the start-up variables that select
# them (read once by its C++ runtime; LAUNCH_BLOCKING wins over DEFER_AND_FUSE when both are set).
EAGER_MODE_ENUM = {
    "strict": "DEFER_NEVER",
    "debug": "DEFER_NEVER_AND_LAUNCH_BLOCKING",
    "defer_and_fuse": "DEFER_AND_FUSE",
}
EAGER_MODE_ENV = {
    "strict": {},
    "debug": {"TORCH_TPU_LAUNCH_BLOCKING": "1"},
    "defer_and_fuse": {"TORCH_TPU_DEFER_AND_FUSE": "1"},
}

# (public module, attribute) pairs, as the public API table lists them.
PUBLIC_NAMES: tuple[tuple[str, str], ...] = (
    ("torch.tpu", "EagerMode"),  # eager modes (execution knob)
    ("torch.tpu", "eager_mode"),  # the current mode (a get/set property)
    ("torch.tpu", "set_eager_mode"),  # context manager: a mode for a block, restored after
    ("torch.tpu", "Precision"),  # the matmul passes set_float32_matmul_precision maps to
    ("torch.tpu", "get_device_name"),  # "TPU v5p": the generation, for peaks
    ("torch.tpu", "get_device_properties"),  # HBM per device
    ("torch.tpu", "get_amp_supported_dtype"),  # autocast on "tpu" (the autocast knob)
    ("torch.tpu.distributed", "set_tpu_launch_env"),  # the variables every rank of a trial shares
    ("torch.tpu.distributed", "topology_aware_mesh"),  # an ICI-aware rank order for DeviceMesh
    ("torch.tpu.profiler", "TpuProfilerConfig"),  # torch.profiler's XPlane (XProf) trace on TPU
    ("torch.tpu.compiler", "custom_compiler_options"),  # XLA options for a block (xla_optimization_level knob)
    ("torch.tpu.ops", "splash_sdpa"),  # the splash attention kernel (attention_kernel knob)
    ("torch.tpu.optimizers", "SingleTraceTrainer"),  # the whole step traced (compile_scope = step)
    ("torch.tpu.optimizers", "AdamW"),  # its functional AdamW
)
ENUM_MEMBERS: dict[str, tuple[str, ...]] = {
    "EagerMode": tuple(EAGER_MODE_ENUM.values()),
    "Precision": ("DEFAULT", "HIGH", "HIGHEST"),
}
# Keyword parameters the adapter passes: callable (public module, attribute) -> names.
PARAMETERS: dict[tuple[str, str], tuple[str, ...]] = {
    ("torch.tpu.distributed", "set_tpu_launch_env"): ("nproc_per_node", "nnodes"),
    ("torch.tpu.distributed", "topology_aware_mesh"): ("mesh_shape",),
    ("torch.tpu.profiler", "TpuProfilerConfig"): ("run_dir", "worker_rank"),
    ("torch.tpu.compiler", "custom_compiler_options"): ("options",),
    ("torch.tpu.optimizers", "SingleTraceTrainer"): ("optimizer", "compile_fn", "compute_loss_fn"),
    ("torch.tpu.optimizers", "AdamW"): ("lr", "weight_decay", "beta1", "beta2", "eps", "use_bfloat16_moments"),
    ("torch.tpu.ops", "splash_sdpa"): (
        "scale",
        "is_causal",
        "enable_gqa",
        "block_q",
        "block_kv",
        "block_kv_compute",
        "block_q_dkv",
        "block_kv_dkv",
        "block_kv_dkv_compute",
    ),
}
# Fields the adapter reads of a result: (public module, callable) -> field names.
RESULT_FIELDS: dict[tuple[str, str], tuple[str, ...]] = {
    ("torch.tpu", "get_device_properties"): ("total_memory",),
}
# Private names with no public equivalent in 0.2.0: the compile cache's counters, and the peak
# bf16 FLOP/s per device (get_device_properties leaves it out on purpose, its docstring says).
PRIVATE_NAMES: tuple[str, ...] = (
    "torch.tpu._get_cache_stats",
    "torch_tpu._internal.utils.hardware.get_bf16_flops_per_device",
)
CACHE_STATS_FIELDS: tuple[str, ...] = ("num_cache_reqs", "num_cache_hits", "num_compilations")
COMPILE_BACKEND = "tpu"
# torch.compile(backend="tpu", options={...}) keys: bounded dynamism (model/buckets/torchtpu_buckets.py).
COMPILE_OPTIONS: tuple[str, ...] = ("num_dynamic_buckets", "bucket_size")
PROCESS_GROUP_BACKEND = "tpu_dist"
# libtpu's start-up flags (the libtpu_flags knob appends a set to the user's value); its name is
# also in TorchTPU's glue library, which is where the check finds it.
LIBTPU_FLAGS_VARIABLE = "LIBTPU_INIT_ARGS"
# Start-up variables of the eager modes, read only by TorchTPU's C++ runtime, libtpu's flags and
# the persistent compilation cache's root (core/tpu_host.py).
ENVIRONMENT_VARIABLES: tuple[str, ...] = (
    *(name for env in EAGER_MODE_ENV.values() for name in env),
    LIBTPU_FLAGS_VARIABLE,
    TORCHTPU_CACHE_VARIABLE,
)
# The host's place in a multi-host slice, as `set_tpu_launch_env(nnodes=...)` decides it.
NODE_RANK_VARIABLE = "NODE_RANK"
# Variables `set_tpu_launch_env` reads or writes that a multi-host run relies on (docs/sharding.md's
# recipes set the first three; the adapter reads NODE_RANK): string constants of its source.
LAUNCH_VARIABLES: tuple[str, ...] = (
    "TPU_WORKER_HOSTNAMES",
    "TORCH_TPU_TOPOLOGY",
    "JOB_COMPLETION_INDEX",
    NODE_RANK_VARIABLE,
    "TORCH_TPU_SLICEBUILDER_ADDRESSES",
)


@dataclass(frozen=True)
class NameCheck:
    """One used name and whether the installed package has it."""

    name: str
    kind: str
    present: bool
    detail: str = ""  # why it is missing


@dataclass(frozen=True)
class ApiCheck:
    """The adapter's names against the installed torch-tpu."""

    version: str | None  # None: torch-tpu is not installed
    checks: tuple[NameCheck, ...] = ()
    error: str | None = None  # the package could not be imported at all

    @property
    def missing(self) -> list[NameCheck]:
        return [c for c in self.checks if not c.present]

    @property
    def ok(self) -> bool:
        return self.version is not None and self.error is None and not self.missing

    def summary(self) -> str:
        """One line: "TorchTPU 0.2.0: N names used, all present", or what is missing."""
        if self.version is None:
            return "TorchTPU: not installed (pip install -e '.[tpu]')"
        if self.error is not None:
            return f"TorchTPU {self.version}: import failed: {self.error}"
        head = f"TorchTPU {self.version}: {len(self.checks)} names used"
        if not self.missing:
            return f"{head}, all present"
        names = ", ".join(f"{c.name} ({c.detail})" if c.detail else c.name for c in self.missing)
        return f"{head}, {len(self.missing)} missing: {names}"


def _found(name: str, kind: str, present: bool, why_missing: str) -> NameCheck:
    """The check of one name, which says `why_missing` only where it is missing."""
    return NameCheck(name, kind, present, "" if present else why_missing)


def _resolve(dotted: str) -> Any:
    """Import the longest importable prefix of `dotted`, then walk its attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            value = getattr(value, part)
        return value
    raise ImportError(dotted)


def _has_attribute(module: Any, name: str) -> bool:
    """`name` on `module`, without calling a property's getter (its class holds properties)."""
    return name in vars(type(module)) or name in vars(module) or hasattr(module, name)


def check_api(
    public_names: tuple[tuple[str, str], ...] = PUBLIC_NAMES,
    enum_members: dict[str, tuple[str, ...]] | None = None,
    private_names: tuple[str, ...] = PRIVATE_NAMES,
    compile_options: tuple[str, ...] = COMPILE_OPTIONS,
    environment_variables: tuple[str, ...] = ENVIRONMENT_VARIABLES,
    process_group_backend: str = PROCESS_GROUP_BACKEND,
    launch_variables: tuple[str, ...] = LAUNCH_VARIABLES,
) -> ApiCheck:
    """Check every name the adapter uses against the installed torch-tpu (imports it, and torch;
    a few seconds). The arguments default to the adapter's tables; tests pass a wrong name to
    see the check fail."""
    version, folder = installed_version(), package_folder()
    if version is None or folder is None:
        return ApiCheck(version=None)
    enum_members = ENUM_MEMBERS if enum_members is None else enum_members
    with warnings.catch_warnings():
        # Reading an experimental name warns once ("<TorchTpu/ApiStage/ExperimentalApi/>"): the
        # check reads them all, and says what it found itself.
        warnings.simplefilter("ignore")
        try:
            import torch
            import torch_tpu  # noqa: F401 - installs torch.tpu (also without the autoload)
        except Exception as exc:
            return ApiCheck(version=version, error=f"{type(exc).__name__}: {exc}")
        checks: list[NameCheck] = []
        # Each step reports what it could not read as a missing name rather than raising: a changed
        # release is what this check is for, and it must say what moved.
        try:
            table, table_error = public_table(folder), ""
        except (OSError, SyntaxError, ValueError) as exc:
            table, table_error = {}, f"public API table unreadable: {exc}"

        for module_name, name in public_names:
            dotted = f"{module_name}.{name}"
            if name not in table.get(module_name, set()):
                checks.append(
                    _found(dotted, "public name", False, table_error or "not in torch_tpu's public API table")
                )
                continue
            try:
                present = _has_attribute(_resolve(module_name), name)
            except (ImportError, AttributeError):
                present = False
            checks.append(_found(dotted, "public name", present, "listed but not importable"))

        for enum_name, members in enum_members.items():
            enum = getattr(torch.tpu, enum_name, None)  # type: ignore[attr-defined]  # torch.tpu exists only with torch_tpu installed
            for member in members:
                present = enum is not None and hasattr(enum, member)
                checks.append(_found(f"torch.tpu.{enum_name}.{member}", "enum member", present, "no such member"))

        for (module_name, name), parameters in PARAMETERS.items():
            if (module_name, name) not in public_names:
                continue
            try:
                signature = inspect.signature(getattr(_resolve(module_name), name))
            except (ImportError, AttributeError, ValueError, TypeError):
                signature = None
            for parameter in parameters:
                present = signature is not None and parameter in signature.parameters
                checks.append(_found(f"{module_name}.{name}({parameter}=)", "parameter", present, "no such keyword"))

        for (module_name, name), fields in RESULT_FIELDS.items():
            try:
                returned = typing.get_type_hints(getattr(_resolve(module_name), name))["return"]
                known = {f.name for f in dataclasses.fields(returned)}
            except Exception:
                known = set()
            for field_name in fields:
                checks.append(
                    _found(
                        f"{module_name}.{name}().{field_name}",
                        "result field",
                        field_name in known,
                        "not a field of its result",
                    )
                )

        resolved: dict[str, Any] = {}
        for dotted in private_names:
            with suppress(ImportError, AttributeError):
                resolved[dotted] = _resolve(dotted)
            checks.append(_found(dotted, "private name", dotted in resolved, "not importable"))
        if "torch.tpu._get_cache_stats" in resolved:
            try:
                stats, stats_error = resolved["torch.tpu._get_cache_stats"](), ""  # counters: no device runtime
            except Exception as exc:
                stats, stats_error = None, f"call failed: {type(exc).__name__}: {exc}"
            for field_name in CACHE_STATS_FIELDS:
                present = stats is not None and hasattr(stats, field_name)
                why = stats_error or "not a field of its result"
                checks.append(_found(f"torch.tpu._get_cache_stats().{field_name}", "result field", present, why))

        from torch._dynamo import list_backends
        from torch._dynamo.backends.registry import lookup_backend

        registered = COMPILE_BACKEND in list_backends()
        checks.append(
            _found(
                f'torch.compile(backend="{COMPILE_BACKEND}")',
                "compile backend",
                registered,
                "not registered with dynamo",
            )
        )
        try:
            keys, keys_error = (
                (string_constants(type(lookup_backend(COMPILE_BACKEND)).__call__) if registered else set()),
                "",
            )
        except (OSError, TypeError, SyntaxError) as exc:  # no source to read (a compiled backend)
            keys, keys_error = set(), f"the backend's source is unreadable: {exc}"
        for option in compile_options:
            why = keys_error or "not read by the tpu backend"
            checks.append(_found(f"options={{'{option}': ...}}", "compile option", option in keys, why))

        backends = registered_process_group_backends(folder)
        checks.append(
            _found(
                f'init_process_group("{process_group_backend}")',
                "process group backend",
                process_group_backend in backends,
                "never registered",
            )
        )

        found = strings_in_libraries(folder, environment_variables)
        for variable in environment_variables:
            checks.append(_found(variable, "environment variable", variable in found, "not in its libraries"))
        try:
            launch, launch_error = string_constants(_resolve("torch.tpu.distributed").set_tpu_launch_env), ""
        except (ImportError, AttributeError, OSError, TypeError, SyntaxError) as exc:
            launch, launch_error = set(), f"set_tpu_launch_env's source is unreadable: {exc}"
        for variable in launch_variables:
            why = launch_error or "not read or set by set_tpu_launch_env"
            checks.append(_found(variable, "launch variable", variable in launch, why))
        return ApiCheck(version=version, checks=tuple(checks))


@lru_cache(maxsize=1)
def cached_api_check() -> ApiCheck:
    """`check_api()` once per process (the backend refuses to run on a package that fails it)."""
    return check_api()
