"""PNG figures drawn on matplotlib's Agg canvas, without :mod:`matplotlib.pyplot`.

A figure made here belongs to its caller alone: pyplot's registry of open figures, its backend
selection and its interactive machinery are never loaded, so nothing needs closing and a process that
only writes files does not pay for them. The PNG carries no timestamp or version: the same figure gives
the same bytes.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from steps.files import write_bytes

__all__ = ["IMPORTS", "new_figure", "save_png"]

#: What drawing a figure imports (about 0.9 s of CPU): a step module that draws names these in its
#: ``FORK_SERVER_PRELOAD`` so that a local runner's fork server imports them once (:mod:`steps.forkserver`).
IMPORTS = ("matplotlib.figure", "matplotlib.backends.backend_agg")


def new_figure(**options: Any) -> Any:
    """A :class:`matplotlib.figure.Figure` on an Agg canvas; ``options`` go to its constructor."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(**options)
    FigureCanvasAgg(figure)
    return figure


def save_png(figure: Any, path: Path) -> Path:
    """Lay ``figure`` out tightly and write it to ``path`` as a PNG at 100 dpi, atomically; ``path``."""
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, metadata={"Software": None})
    return write_bytes(path, buffer.getvalue())
