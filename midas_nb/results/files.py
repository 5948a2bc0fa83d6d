"""Writing and reading results tables: CSV (per-image lists as JSON) and parquet when pyarrow is installed."""
from __future__ import annotations

import contextlib
import importlib.util
import json
import re
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd

from .. import config
from ..identity import atomic_write, atomic_write_text
from .table import cast_columns, PER_IMAGE_COLUMNS, SCHEMA, SCHEMA_COLUMNS

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def _paths(name: str, runs_dir: str | Path | None) -> tuple[Path, Path]:
    if not _NAME_RE.match(name):
        raise ValueError(f"table name must be a plain file stem (letters, digits, . _ -), got {name!r}")
    root = Path(runs_dir) if runs_dir is not None else config.runs_dir()
    root.mkdir(parents=True, exist_ok=True)
    return root / f"{name}.csv", root / f"{name}.parquet"


def save_table(table: pd.DataFrame, name: str, runs_dir: str | Path | None = None) -> Path:
    """Write ``table`` to ``<runs_dir>/<name>.csv`` (and ``.parquet`` if pyarrow is importable);
    returns the CSV path. Default ``runs_dir``: :func:`midas_nb.config.runs_dir`."""
    csv, parquet = _paths(name, runs_dir)
    enc = encode_lists(table)
    atomic_write_text(csv, enc.to_csv(index=False))
    if importlib.util.find_spec("pyarrow"):
        atomic_write(parquet, lambda f: enc.to_parquet(f, index=False))
    return csv


def encode_lists(table: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``table`` with its list-valued columns (the per-image values) as JSON text
    (``[0.5, NaN]``), so CSV and parquet keep them; other columns unchanged."""
    out = table.copy()
    for c in out.columns:
        if out[c].dtype == object and out[c].map(lambda v: isinstance(v, (list, tuple))).any():
            out[c] = out[c].map(lambda v: json.dumps(list(v), allow_nan=True) if isinstance(v, (list, tuple)) else v)
    return out


def load_table(name: str, runs_dir: str | Path | None = None,
               format: Literal["auto", "csv", "parquet"] = "auto") -> pd.DataFrame:
    """Read a table written by :func:`save_table`, with the schema's dtypes (``format="auto"``:
    the parquet file when it exists and pyarrow is importable), the :data:`PER_IMAGE_COLUMNS` decoded
    (:func:`encode_lists`); ``FileNotFoundError`` when it is absent, ``json.JSONDecodeError`` for a per-image
    cell that starts with ``[`` but is not JSON."""
    csv, parquet = _paths(name, runs_dir)
    use_parquet = format == "parquet" or (format == "auto" and parquet.exists()
                                          and importlib.util.find_spec("pyarrow") is not None)
    path = parquet if use_parquet else csv
    if not path.exists():
        raise FileNotFoundError(f"no results table at {path}")
    if use_parquet:
        df = pd.read_parquet(path)
    else:
        # read every cell as text so that strings such as "None" or "" survive, then parse
        # the non-text columns ("" → NaN; "True"/"False" → bool)
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
