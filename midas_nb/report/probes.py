"""The cosine probes notebook 03 saves beside the result store, and reading them back."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..identity import atomic_write_text
from .store import store_root
from .tables import read_csv_table


def _probe_path(profile: str, store: str | Path | None = None) -> Path:
    return store_root(profile, store) / "derived" / "cosine_probes.csv"


def save_probes(study, *tables: pd.DataFrame, store: str | Path | None = None) -> Path:
    """Keep ``study``'s cosine probes (:func:`~midas_nb.metrics.probes.hidden_vs_attention_gradient`
    ``tables``, NaN ``depth`` = the study's) in ``<store>/derived/cosine_probes.csv``, replacing rows of the
    same dataset × backbone × depth × pair; returns its path. Raises ValueError: no table, or one without the
    probe columns."""
    if not tables:
        raise ValueError("save_probes needs at least one probe table")
    need = {"hidden", "attention", "cosine", "lo", "hi", "n_images"}
    frames, depth = [], study.settings.point.depth
    for t in tables:
        missing = need - set(t.columns)
        if missing:
            raise ValueError(f"save_probes: a table lacks {sorted(missing)}; expected the output of "
                             "probes.hidden_vs_attention_gradient")
        t = t.copy()
        t["depth"] = t["depth"].fillna(depth).astype(int) if "depth" in t else depth
        frames.append(t)
    new = pd.concat(frames, ignore_index=True)
    new.insert(0, "checkpoint_id", str(study.meta["checkpoint_id"]))
    new.insert(0, "backbone", study.settings.backbone.name)
    new.insert(0, "dataset", str(study.dataset_name))
    ident = ["dataset", "backbone", "depth", "hidden", "attention"]
    new = new.drop_duplicates(ident, keep="last")
    path = _probe_path(study.settings.profile, store)
    if path.is_file():
        old = pd.read_csv(path)
        old = old.merge(new[ident], on=ident, how="left", indicator=True)
        old = old[old["_merge"] == "left_only"].drop(columns="_merge")
        new = pd.concat([old, new], ignore_index=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, new.to_csv(index=False))
    return path


def load_probes(profile: str = "quick", store: str | Path | None = None) -> pd.DataFrame | None:
    """The probes :func:`save_probes` kept in the store, or ``None`` when there are none."""
    path = _probe_path(profile, store)
    if not path.is_file():
        return None
    return read_csv_table(path, "the cosine probes notebook 03 saved (rerun it, or delete the file to report "
                                "without probes)")
