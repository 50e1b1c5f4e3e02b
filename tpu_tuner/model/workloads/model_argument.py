"""The model a command names, checked without importing torch, numpy or transformers.

The CLI runs `check_model_argument` first, before building a command's flags (those of `plan`
and `buckets` import torch): a model file that is not there was refused after 4 to 19 s, once a
worker or the planner had imported torch to load it; now in a fraction of a second, in one line
with exit status 2 (docs/run-safety.md). The loader runs `check_model_file` on the same path again,
since a library caller reaches it without the CLI.
"""

from __future__ import annotations

from pathlib import Path

from tpu_tuner.core.errors import WorkloadError
from tpu_tuner.model.decoders.decoder_shape import is_shape_source, read_shape
from tpu_tuner.model.workloads.hf_source import check_folder, is_hf_source, parse


def check_model_file(path: Path) -> None:
    """A one-line `WorkloadError` naming `path` unless it is a Python file that is there."""
    if not path.exists():
        raise WorkloadError("file not found", path)
    if not path.is_file():
        raise WorkloadError("not a file", path)
    if path.suffix != ".py":
        raise WorkloadError("a model file must be a Python file ending in .py", path)


def check_model_argument(text: str | Path) -> None:
    """Refuse in one line (`UserInputError`) a model argument that names nothing usable: a model
    file or shape file that is not there, a decoder shape no decoder has, an ``hf:`` folder
    without a config.json or a malformed ``hf:`` source. A hub id or a model type is left to the
    loader, which needs transformers to know them."""
    text = str(text)
    if is_hf_source(text):
        source = parse(text)
        if source.kind == "directory":
            check_folder(source)
    elif is_shape_source(text):
        read_shape(text)
    else:
        check_model_file(Path(text))


__all__ = ["check_model_argument", "check_model_file"]
