"""Progress of the library's long loops: :func:`tqdm`, a drop-in for ``tqdm.auto.tqdm``, draws bars in a notebook
and throttled plain lines in a streamed batch run, e.g. ``distil ..., epoch 7/24 (02:41, 3:12 left), loss=1.234``
(docs/decisions/0023-batch-run-progress.md, 0091-progress-lines-once-per-step.md)."""
from __future__ import annotations

import os
import re
import sys
from typing import Any, Literal

__all__ = ["LineWriter", "PROGRESS_ENV", "PROGRESS_LINE", "progress_enabled", "progress_mode", "tqdm"]

PROGRESS_ENV = "MIDAS_PROGRESS"
#: seconds between two lines of one loop in ``"lines"`` mode (``MIDAS_PROGRESS_INTERVAL`` overrides)
LINE_INTERVAL = 10.0

_LINE_FORMAT = "{desc}, {unit} {n_fmt}/{total_fmt} ({elapsed}, {remaining} left){postfix}"


def progress_mode() -> Literal["bar", "lines", "off"]:
    """``"lines"`` under ``MIDAS_PROGRESS=lines``, else ``"off"`` under ``TQDM_DISABLE``, else ``"bar"``."""
    if os.environ.get(PROGRESS_ENV, "").strip().lower() == "lines":
        return "lines"
    return "off" if os.environ.get("TQDM_DISABLE", "").strip().lower() not in ("", "0", "false", "no") else "bar"


def progress_enabled(requested: bool = True) -> bool:
    """Whether a loop that asked for progress shows any."""
    return requested and progress_mode() != "off"


#: terminal control sequences (cursor moves, colours): never written as a line
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")

#: a progress line as the line writer prints it; ``midas-nb run`` drops these from the executed notebooks
PROGRESS_LINE = re.compile(r"^(?P<desc>.*), (?P<unit>\w+(?: \w+)?) (?P<n>\d+)/(?P<total>\S+) "
                           r"\((?P<elapsed>[^(),]*), [^()]* left\)(?:, )?(?P<postfix>.*)$")
_TIMES = re.compile(r" \([^(),]*, [^()]* left\)")   # a progress line's (elapsed, remaining left)


class LineWriter:
    """A file for tqdm that turns its carriage-return refreshes into whole lines on ``stream``; a line that differs
    from the one before only in its times is not repeated (tqdm's monitor and closing refresh redraw a step)."""

    def __init__(self, stream: Any):
        self.stream, self.last = stream, ""

    def write(self, text: str) -> None:
        for line in (part.strip() for part in ANSI.sub("", text).replace("\n", "\r").split("\r")):
            if line and (key := _TIMES.sub("", line)) != self.last:
                self.last = key
                self.stream.write(line + "\n")
                self.stream.flush()

    def flush(self) -> None:
        self.stream.flush()


def tqdm(iterable: Any = None, *args: Any, **kwargs: Any):
    """``tqdm.auto.tqdm(iterable, ...)`` in the mode of :func:`progress_mode` (``disable=True`` honoured in each). In
    ``"lines"`` mode: a line on stderr every :data:`LINE_INTERVAL` s (it sets ``file``, ``bar_format``, ``mininterval``,
    ``leave``), ``set_postfix`` / ``set_description`` shown with the next line, ``unit`` default ``"step"``."""
    from tqdm.std import tqdm as std_tqdm

    if (mode := progress_mode()) == "bar":
        from tqdm.auto import tqdm as auto_tqdm

        return auto_tqdm(iterable, *args, **kwargs)
    if mode == "off" or kwargs.pop("disable", False):
        return std_tqdm(iterable, *args, **dict(kwargs, disable=True))
    interval = float(os.environ.get("MIDAS_PROGRESS_INTERVAL") or LINE_INTERVAL)
    kwargs.update(unit="step" if kwargs.get("unit", "it") == "it" else kwargs["unit"], file=LineWriter(sys.stderr),
                  bar_format=_LINE_FORMAT, mininterval=interval, maxinterval=max(interval, 10.0), leave=True,
                  dynamic_ncols=False, ascii=True)
    bar = std_tqdm(iterable, *args, disable=False, **kwargs)
    postfix, describe = bar.set_postfix, bar.set_description   # throttled: shown with the next line
    bar.set_postfix = lambda ordered_dict=None, refresh=True, **kw: postfix(ordered_dict, refresh=False, **kw)
    bar.set_description = lambda desc=None, refresh=True: describe(desc, refresh=False)
    return bar
