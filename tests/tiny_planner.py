"""What the planner's tests of a tiny decoder share: the model, its matrix weights, the marker
that skips them without the planner extra, and the environment a compiling subprocess needs."""

from __future__ import annotations

import importlib.util
import os

import pytest

needs_planner = pytest.mark.skipif(
    importlib.util.find_spec("torchax") is None or importlib.util.find_spec("libtpu") is None,
    reason="the planner extra is not installed: pip install -e '.[plan]'",
)
TINY = "decoder:vocab=256,d_model=128,layers=2,heads=4,mlp=256"
# The tiny decoder's matrix weights: embedding + head (256 x 128 each) and, in each of 2 blocks,
# q/k/v/o (128 x 128) and gate/up/down (128 x 256).
TINY_MATRIX_PARAMETERS = 2 * 256 * 128 + 2 * (4 * 128 * 128 + 3 * 128 * 256)


def planner_env() -> dict[str, str]:
    """The environment of a subprocess that loads libtpu beside this one, with the repository importable."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return {
        **os.environ,
        "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
        "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p),
    }
