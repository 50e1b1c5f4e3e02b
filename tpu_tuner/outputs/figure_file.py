"""A figure written as one PNG file, whole or not at all.

Matplotlib's ``savefig(path)`` writes the file as it renders: a full disk (or a crash) midway leaves
half a PNG under the final name, which a reader would take for the plot. Rendered in memory first,
the file goes through `run_folder.write_atomic` (a temporary file, then a rename).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from tpu_tuner.core.run_folder import write_atomic


def save_figure(fig: Any, path: str | Path, dpi: int) -> Path:
    """Lay out `fig` (a pyplot Figure) tightly, render it as PNG at `dpi`, close it and write it
    to `path` atomically."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    plt.close(fig)
    return write_atomic(path, buffer.getvalue())
