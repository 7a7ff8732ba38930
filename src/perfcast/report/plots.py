"""Figures of a command's result (``--plot DIR``): the style every figure shares, the colours
that mean the same thing in every figure, and the writer of ``NAME.png`` and ``NAME.svg``.

Drawn with matplotlib's object API — a :class:`~matplotlib.figure.Figure` on the Agg canvas,
no pyplot and no process-wide backend switch — under matplotlib's default style with a few fixed
settings, whatever the user's matplotlibrc says. The same result gives byte-identical files: a
fixed size and resolution, glyphs drawn as paths, no date or software stamp in the metadata, a
fixed salt for the SVG's ids (matplotlib's ``svg.hashsalt``; "Reproducible builds", the
``SOURCE_DATE_EPOCH`` section of matplotlib's backend_svg).

The figures themselves, formatting only (every number comes from the command's result):
:mod:`.plots_step` (text-generate, kernel), :mod:`.plots_serving` (serve, optimize),
:mod:`.plots_validation` (validate)."""

from __future__ import annotations

import contextlib
import functools
import io
from dataclasses import dataclass
from pathlib import Path

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from perfcast.perf import Provenance

#: Provenance → colour, the same in every figure (Okabe & Ito's colour-blind-safe palette, then
#: Tol's); "fallback": an analytic price standing in for a profiling table's miss.
PROVENANCE_COLOURS = {
    Provenance.MEASURED.value: "#009E73",
    Provenance.INTERPOLATED.value: "#56B4E9",
    Provenance.PARTIAL.value: "#E69F00",
    Provenance.DERIVED.value: "#CC79A7",
    Provenance.ANALYTIC.value: "#0072B2",
    Provenance.MAPPED.value: "#DDDDDD",
    "fallback": "#D55E00",
    "fallback (derived)": "#882255",
    "unknown": "#999999",
}
#: Bound (:data:`perfcast.perf.BOUNDS`, and "none" for a leaf with no time term) → colour (Tol's
#: muted palette), the same in every figure that stacks by bound.
BOUND_COLOURS = {"compute": "#332288", "memory": "#44AA99", "comm": "#DDCC77", "latency": "#AA4499",
                 "none": "#BBBBBB"}

#: Every figure's size (inches) and resolution: a PNG of 1000 × 600 pixels.
SIZE_IN = (10.0, 6.0)
DPI = 100
#: Settings over matplotlib's defaults; every figure is drawn and saved under them.
RC = {"svg.hashsalt": "perfcast", "svg.fonttype": "path", "font.family": "DejaVu Sans", "figure.dpi": DPI,
      "savefig.dpi": DPI, "figure.figsize": SIZE_IN, "axes.grid": True, "grid.alpha": 0.3,
      "legend.fontsize": "small", "axes.titlesize": "medium", "figure.titlesize": "medium"}
FORMATS = ("png", "svg")
#: The metadata each format would otherwise stamp with the time or the software's version.
_METADATA = {"png": {"Software": None}, "svg": {"Date": None, "Creator": None}}


def provenance_colour(label: str) -> str:
    return PROVENANCE_COLOURS.get(label, PROVENANCE_COLOURS["unknown"])


@contextlib.contextmanager
def style():
    """matplotlib's default style with :data:`RC`, for this block only (restored after)."""
    with matplotlib.rc_context():
        matplotlib.rcdefaults()
        matplotlib.rcParams.update(RC)
        yield


def styled(draw):
    """A figure function drawn under :func:`style` (rcParams are read as artists are made)."""
    @functools.wraps(draw)
    def wrapper(*args, **kwargs):
        with style():
            return draw(*args, **kwargs)
    return wrapper


def figure(nrows: int = 1, ncols: int = 1, **kwargs) -> tuple[Figure, object]:
    """A figure on the Agg canvas and its axes (an array of them when there are several)."""
    fig = Figure(figsize=SIZE_IN, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(nrows, ncols, **kwargs)


def plain_log(*axes) -> None:
    """Log axes ticked at 1, 2 and 5 × 10ⁿ, written plainly (``20``, not ``2 × 10¹``)."""
    from matplotlib import ticker

    for axis in axes:
        axis.set_major_locator(ticker.LogLocator(subs=(1, 2, 5)))
        axis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(ticker.NullFormatter())


@dataclass(frozen=True)
class Skipped:
    """A figure that does not apply to the run, and why."""

    name: str
    why: str


def encoded(fig: Figure, fmt: str) -> bytes:
    """The figure's file in ``fmt`` (one of :data:`FORMATS`), as :func:`save` writes it."""
    buf = io.BytesIO()
    with style():
        fig.savefig(buf, format=fmt, metadata=_METADATA[fmt])
    return buf.getvalue()


def save(fig: Figure, directory: str | Path, name: str) -> list[Path]:
    """``NAME.png`` and ``NAME.svg`` in ``directory``; ``OSError`` is the caller's to report."""
    out = []
    for fmt in FORMATS:
        path = Path(directory) / f"{name}.{fmt}"
        path.write_bytes(encoded(fig, fmt))
        out.append(path)
    return out


def write(figures: dict[str, Figure | Skipped], directory: str | Path) -> tuple[list[Path], list[Skipped]]:
    """Every figure's files (in the order given), and the figures skipped."""
    paths, skipped = [], []
    for name, fig in figures.items():
        if isinstance(fig, Skipped):
            skipped.append(fig)
        else:
            paths.extend(save(fig, directory, name))
    return paths, skipped
