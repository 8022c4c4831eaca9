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


#: The ``Software`` of every PNG :func:`png_bytes` makes (a report may replace its own figures).
PNG_SOFTWARE = "gru4rec report"


def png_bytes(figure: Any, dpi: int = 100) -> bytes:
    """The figure as PNG (matplotlib renders PNGs with Agg, whatever the backend), marked with
    :data:`PNG_SOFTWARE`."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight",  # no label cut off at the edges
                   metadata={"Software": PNG_SOFTWARE})
    return buffer.getvalue()


def is_report_png(data: bytes, *, beside_report: bool = False) -> bool:
    """Whether ``data``, the start of a PNG file, is one :func:`png_bytes` made: its ``Software``
    text chunk (which Agg writes before the image data) is :data:`PNG_SOFTWARE` or, for a figure
    ``beside_report`` (the page of the same report is ours) made before PNGs were marked,
    matplotlib's own."""
    if not data.startswith(b"\x89PNG"):
        return False
    return b"tEXtSoftware\x00" + PNG_SOFTWARE.encode() in data or (beside_report and b"tEXtSoftware\x00Matplotlib" in data)
