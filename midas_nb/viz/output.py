"""Where figures and their tables go (:func:`set_output`, :func:`save_figure`, :func:`save_csv`), how a
figure is shown (:func:`finish_figure`) and the shared font sizes."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import matplotlib
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from .. import config
from ..identity import atomic_write_text
from ..results import encode_lists


#: font sizes used by every figure (points)
FONT = dict(title=12, label=11, tick=9, annot=9, legend=9)
_STATE: dict[str, Any] = {"notebook": None, "directory": None}
Normalization = tuple[Sequence[float], Sequence[float]] | None


def set_output(notebook: str | None, directory: str | Path | None = None, *, profile: str | None = None) -> Path:
    """Name the notebook whose figures follow and where they go; returns the directory.

    Args:
        notebook: the notebook's stem (``"02_three_condition_protocol"``); it prefixes every
            saved figure and table. ``None`` → no prefix.
        directory: output directory; ``None`` → :func:`midas_nb.config.figures_dir` of ``profile``
            (``figures/<profile>/``, or ``MIDAS_FIGURES_DIR``).
        profile: the run's profile name (keeps each profile's figures apart).

    Raises:
        ValueError: ``directory`` is an empty or blank string (it would be the working
            directory, e.g. ``notebooks/`` beside the committed notebooks).
    """
    if isinstance(directory, str) and not directory.strip():
        raise ValueError(f"output_dir: expected a directory path or None (figures/<profile>/), got {directory!r}")
    _STATE["notebook"] = notebook
    _STATE["directory"] = (Path(directory).expanduser() if directory is not None
                           else config.figures_dir(profile) if profile else None)
    return output_dir()


def output_dir() -> Path:
    """The directory :func:`set_output` chose (created), else ``config.figures_dir()``."""
    d = _STATE["directory"]
    if d is None:
        return config.figures_dir()
    d.mkdir(parents=True, exist_ok=True)
    return d


def figure_path(name: str, suffix: str = ".png") -> Path:
    """``<output dir>/<notebook>_<name><suffix>`` (no notebook prefix when none is set)."""
    if not name or any(c in name for c in "/\\"):
        raise ValueError(f"figure name must be a plain file stem, got {name!r}")
    stem = f"{_STATE['notebook']}_{name}" if _STATE["notebook"] else name
    return output_dir() / f"{stem}{suffix}"


def save_figure(fig: Figure, name: str, dpi: int = 130) -> Path:
    """Write ``fig`` as PNG to :func:`figure_path` ``(name)``; returns the path."""
    path = figure_path(name)
    fig.savefig(path, dpi=dpi, bbox_inches="tight", facecolor="white")
    return path


def save_csv(table: pd.DataFrame, name: str) -> Path:
    """Write ``table`` as CSV beside the figures (``<output dir>/<notebook>_<name>.csv``), atomically
    (:func:`midas_nb.identity.atomic_write_text`); list columns (per-image values) as JSON."""
    path = figure_path(name, ".csv")
    atomic_write_text(path, encode_lists(table).to_csv(index=False))
    return path


def figure_title(fig: Figure) -> str:
    """What ``fig`` shows, in words: its suptitle, else its axes' titles joined with ``"; "``, else
    ``"figure"`` (the alt text of its image in the HTML edition)."""
    sup = fig._suptitle.get_text() if getattr(fig, "_suptitle", None) is not None else ""
    return " ".join((sup or "; ".join(t for ax in fig.axes if (t := ax.get_title())) or "figure").split())


def finish_figure(fig: Figure, save: str | None) -> Figure:
    """The last step of every figure function: save ``fig`` as ``save`` (:func:`save_figure`) when a
    name is given; in a notebook (inline backend) show it now, its :func:`figure_title` as the image's
    ``alt`` (the HTML edition's alt text); close it unless a widget or window shows it. Returns ``fig``."""
    if save:
        save_figure(fig, save)
    backend = matplotlib.get_backend().lower()
    if "inline" in backend:
        from IPython.display import display
        display(fig, metadata={"image/png": {"alt": figure_title(fig)}})
    if "inline" in backend or backend in ("agg", "cairo", "pdf", "pgf", "ps", "svg", "template"):
        plt.close(fig)          # shown once; the Figure object stays usable (savefig, axes) after closing
    return fig
