"""matplotlib for the report: imported on first use, with the install hint when it is missing,
and figures made without pyplot (no global state, no display needed; PNGs through Agg)."""
from __future__ import annotations

import io
from typing import Any

__all__ = ["new_figure", "png_bytes", "require_matplotlib"]


def require_matplotlib() -> Any:
    """The matplotlib module, or ImportError with the install hint."""
    try:
        import matplotlib
    except ImportError as exc:
        raise ImportError("gru4rec report needs matplotlib: pip install 'gru4rec[report]'") from exc
    return matplotlib


def new_figure(width: float, height: float) -> Any:
    """A ``matplotlib.figure.Figure`` of ``width`` × ``height`` inches with a constrained layout."""
    require_matplotlib()
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def png_bytes(figure: Any, dpi: int = 100) -> bytes:
    """The figure as PNG (matplotlib renders PNGs with Agg, whatever the backend)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")  # no label cut off at the edges
    return buffer.getvalue()
