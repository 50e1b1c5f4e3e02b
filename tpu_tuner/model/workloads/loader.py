"""Load a `Workload` from a user's model file.

Two conventions are accepted (see docs/model-file.md):

* **benchmark convention** (KernelBench style): ``class Model(nn.Module)``, ``get_inputs()``
  returning the forward inputs, optionally ``get_init_inputs()`` returning constructor
  arguments. It is an inference workload.
* **native contract**: ``build_model()``, ``make_batch(batch_size, seq_len)``, ``BATCH_SIZE``,
  optionally ``SEQ_LEN``, ``loss(output, target)`` (makes it a training step),
  ``make_optimizer(params)``, ``sample_lengths()``, ``model_flops(batch_size, seq_len,
  training)``, ``TRANSFORMER = dict(layers=..., heads=..., head_dim=..., causal=...)``, and
  ``PRESETS`` (named sizes; ``build_model(preset=...)``, ``transformer_dims(preset)``).

Every problem with the file becomes a `WorkloadError` that names the file.
"""

from __future__ import annotations

import importlib.util
import sys
import types
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

from torch import nn

from tpu_tuner.core.errors import UserInputError, WorkloadError
from tpu_tuner.model.decoders.transformer_dims import TransformerDims
from tpu_tuner.model.workloads.batch import resize_batch
from tpu_tuner.model.workloads.model_argument import check_model_file
from tpu_tuner.model.workloads.workload import Workload

NATIVE_REQUIRED = ("build_model", "make_batch")
NATIVE_OPTIONAL_CALLABLES = ("loss", "make_optimizer", "sample_lengths", "model_flops")


def load_workload(path: str | Path) -> Workload:
    """Import `path` and return the workload it defines, or raise `WorkloadError`. A decoder
    shape (a .toml file or an inline ``decoder:d_model=...,layers=...`` spec) needs no code: the
    generic decoder of tpu_tuner/model/decoders/decoder.py is built from it; an ``hf:`` source names a
    Hugging Face model (model/workloads/hf_source.py)."""
    from tpu_tuner.model.decoders.decoder import is_shape_source, shape_module
    from tpu_tuner.model.workloads.hf_source import is_hf_source

    if is_hf_source(path):
        from tpu_tuner.model.workloads.hf_workload import hf_module

        module = hf_module(str(path))
        workload = _native_workload(module, Path(str(path)))
        return replace(
            workload,
            name=module.NAME,
            source=Path(str(path)),
            hf_config=module.HF_CONFIG,
            hf_task=module.HF_TASK,
            notes=list(module.NOTES),
        )
    if is_shape_source(path):
        module = shape_module(path)
        workload = _native_workload(module, Path(str(path)))
        return replace(
            workload,
            name=module.NAME,
            source=Path(str(path)).resolve() if str(path).endswith(".toml") else Path(str(path)),
        )
    path = Path(path)
    module = _import_file(path)
    if all(hasattr(module, name) for name in NATIVE_REQUIRED):
        return _native_workload(module, path)
    if hasattr(module, "Model") and hasattr(module, "get_inputs"):
        return _benchmark_workload(module, path)
    raise WorkloadError(
        "no workload found: define build_model() and make_batch(batch_size, seq_len) "
        "(native contract) or class Model(nn.Module) with get_inputs() (benchmark convention)",
        path,
    )


def _import_file(path: Path) -> types.ModuleType:
    check_model_file(path)
    # A unique module name: loading two files with the same stem must not collide.
    module_name = f"tpu_tune_workload_{path.stem}_{uuid.uuid4().hex[:8]}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise WorkloadError("cannot be imported as a Python module", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look the module up here
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        sys.modules.pop(module_name, None)
        raise WorkloadError(f"syntax error at line {exc.lineno}: {exc.msg}", path) from exc
    except BaseException as exc:
        sys.modules.pop(module_name, None)
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise WorkloadError(f"error while importing: {type(exc).__name__}: {exc}", path) from exc
    return module


def _native_workload(module: types.ModuleType, path: Path) -> Workload:
    for name in NATIVE_REQUIRED + NATIVE_OPTIONAL_CALLABLES:
        value = getattr(module, name, None)
        if value is not None and not callable(value):
            raise WorkloadError(f"{name} must be a function, got {type(value).__name__}", path)
    batch_size = _positive_int(module, "BATCH_SIZE", path, required=True)
    seq_len = _positive_int(module, "SEQ_LEN", path, required=False)
    return Workload(
        name=path.stem,
        source=path.resolve(),
        build_model=module.build_model,
        make_batch=module.make_batch,
        batch_size=batch_size,
        seq_len=seq_len,
        convention="native",
        loss_fn=getattr(module, "loss", None),
        make_optimizer=getattr(module, "make_optimizer", None),
        sample_lengths=getattr(module, "sample_lengths", None),
        model_flops=getattr(module, "model_flops", None),
        transformer=_transformer_dims(module, path),
        presets=_presets(module, path),
        transformer_for_preset=getattr(module, "transformer_dims", None),
    )


def _benchmark_workload(module: types.ModuleType, path: Path) -> Workload:
    model_class = module.Model
    if not (isinstance(model_class, type) and issubclass(model_class, nn.Module)):
        raise WorkloadError("Model must be a subclass of torch.nn.Module", path)
    get_inputs = module.get_inputs
    get_init_inputs = getattr(module, "get_init_inputs", None)
    if not callable(get_inputs):
        raise WorkloadError("get_inputs must be a function", path)
    if get_init_inputs is not None and not callable(get_init_inputs):
        raise WorkloadError("get_init_inputs must be a function", path)

    def build_model() -> nn.Module:
        init_args = get_init_inputs() if get_init_inputs is not None else []
        if isinstance(init_args, dict):
            return model_class(**init_args)
        return model_class(*init_args)

    def make_batch(batch_size: int | None, seq_len: int | None) -> Any:
        # get_inputs() fixes the shapes. A batch size resizes dimension 0 of the inputs that share
        # the leading size (model/workloads/batch.py); a sequence length has no dimension to apply to.
        if seq_len is not None:
            raise UserInputError(SEQ_LEN_REFUSED, path)
        inputs = get_inputs()
        return inputs if batch_size is None else resize_batch(inputs, batch_size)

    return Workload(
        name=path.stem,
        source=path.resolve(),
        build_model=build_model,
        make_batch=make_batch,
        batch_size=None,
        seq_len=None,
        convention="benchmark",
        notes=["benchmark convention: input shapes from get_inputs()"],
    )


SEQ_LEN_REFUSED = (
    "--seq-len cannot be applied to a benchmark-style file (class Model + get_inputs()): "
    "get_inputs() fixes the shapes; change them there"
)


def _presets(module: types.ModuleType, path: Path) -> tuple[str, ...]:
    presets = getattr(module, "PRESETS", None)
    if presets is None:
        return ()
    if not isinstance(presets, dict) or not all(isinstance(k, str) for k in presets):
        raise WorkloadError("PRESETS must be a dict from preset name to configuration", path)
    return tuple(presets)


def _positive_int(module: types.ModuleType, name: str, path: Path, required: bool) -> int | None:
    value = getattr(module, name, None)
    if value is None:
        if required:
            raise WorkloadError(f"{name} is missing: set it to the default batch size", path)
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise WorkloadError(f"{name} must be a positive integer, got {value!r}", path)
    return value


def _transformer_dims(module: types.ModuleType, path: Path) -> TransformerDims | None:
    spec = getattr(module, "TRANSFORMER", None)
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise WorkloadError("TRANSFORMER must be a dict of layers, heads, head_dim, causal", path)
    try:
        dims = TransformerDims(**spec)
    except TypeError as exc:
        raise WorkloadError(f"TRANSFORMER: {exc}", path) from exc
    for name in ("layers", "heads", "head_dim"):
        if not isinstance(getattr(dims, name), int) or getattr(dims, name) <= 0:
            raise WorkloadError(f"TRANSFORMER[{name!r}] must be a positive integer", path)
    return dims
