"""Writing and reading results tables as CSV (per-image lists as JSON)."""
from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

from .. import config
from ..identity import atomic_write_text
from .table import cast_columns, PER_IMAGE_COLUMNS, SCHEMA, SCHEMA_COLUMNS

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def _path(name: str, runs_dir: str | Path | None) -> Path:
    if not _NAME_RE.match(name):
        raise ValueError(f"table name must be a plain file stem (letters, digits, . _ -), got {name!r}")
    root = Path(runs_dir) if runs_dir is not None else config.runs_dir()
    root.mkdir(parents=True, exist_ok=True)
    return root / f"{name}.csv"


def save_table(table: pd.DataFrame, name: str, runs_dir: str | Path | None = None) -> Path:
    """Write ``table`` to ``<runs_dir>/<name>.csv`` (default :func:`midas_nb.config.runs_dir`), return that path;
    ``ValueError`` for a ``name`` that is not a plain file stem."""
    atomic_write_text(csv := _path(name, runs_dir), encode_lists(table).to_csv(index=False))
    return csv


def encode_lists(table: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``table`` with its list-valued columns (per-image values) as JSON text (``[0.5, NaN]``)."""
    out = table.copy()
    for c in out.columns:
        if out[c].dtype == object and out[c].map(lambda v: isinstance(v, (list, tuple))).any():
            out[c] = out[c].map(lambda v: json.dumps(list(v), allow_nan=True) if isinstance(v, (list, tuple)) else v)
    return out


def load_table(name: str, runs_dir: str | Path | None = None) -> pd.DataFrame:
    """A table :func:`save_table` wrote, with the schema's dtypes, the :data:`PER_IMAGE_COLUMNS` decoded;
    ``FileNotFoundError``: none; ``json.JSONDecodeError``: a per-image cell starting with ``[`` that is not JSON."""
    if not (path := _path(name, runs_dir)).exists():
        raise FileNotFoundError(f"no results table at {path}")
    # every cell read as text so that "None" or "" survive, then the other columns parsed ("" → NaN; "True" → bool)
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    text_cols = {c.name for c in SCHEMA if c.dtype == "str"}
    for c in [c for c in df.columns if c not in text_cols]:
        col = df[c].replace({"": np.nan})
        if set(col.dropna()) <= {"True", "False"} and col.notna().any():
            df[c] = col.map({"True": True, "False": False})
        else:
            with contextlib.suppress(ValueError, TypeError):
                df[c] = pd.to_numeric(col)
    if all(c in df.columns for c in SCHEMA_COLUMNS):
        df = cast_columns(df)
    for c in set(PER_IMAGE_COLUMNS) & set(df.columns):
        df[c] = df[c].map(lambda v: json.loads(v) if isinstance(v, str) and v.startswith("[") else v)
    return df
