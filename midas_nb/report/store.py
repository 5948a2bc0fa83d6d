"""A profile's result store for the report: its rows, the expected cells without a result, the cosine probes."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd

from .. import config
from ..analysis.protocol import PROTOCOL_DEFAULTS
from ..identity import atomic_write_text, canonical_json
from ..study import grid_spans, protocol_settings, ReportSettings, sweep_cells
from ..sweeps import ResultStore
from ..sweeps.plan import CELL_IDENTITY, cell_ident
from .tables import read_csv_table


def store_root(profile: str, store: str | Path | None = None) -> Path:
    """The result store's directory: ``store``, or by default ``runs/sweeps/<profile>``."""
    return config.runs_dir() / "sweeps" / profile if store is None else Path(store)


def load_store_rows(profile: str = "quick", store: str | Path | None = None, *,
                    settings: ReportSettings | None = None) -> tuple[pd.DataFrame, dict[str, Any]]:
    """``(rows, left_out)``: the store's done rows of the report's ``settings`` (default the profile's) protocol
    settings, newest checkpoint per dataset × backbone × build and newest record per cell (decisions 0009, 0066),
    with ``cell_key`` and ``finished``; ``left_out`` counts ``failed_cells``, ``other_relaxation``,
    ``other_settings`` (``{difference: rows}``), ``stale_checkpoint``, ``superseded``, ``problems`` and holds
    ``cell_states`` (why a cell has no row). FileNotFoundError: no store; ValueError: no done cell of these settings."""
    root = store_root(profile, store)
    if not (root / "cells").is_dir():
        state = "is a file" if root.is_file() else "has no cells/ folder" if root.is_dir() else "does not exist"
        todo = (f"run the notebooks first (`midas-nb run --profile {profile}`) or pass --store" if store is None
                else "expected the directory holding a result store's cells/ (runs/sweeps/<profile>)")
        raise FileNotFoundError(f"no result store at {root}: it {state}; {todo}")
    st = ResultStore(root)
    s = settings or ReportSettings.of(config.get_profile(profile))
    want = json.loads(canonical_json(protocol_settings(s.values)))     # as a cell holds them
    records, problems = st.scan()
    rows, failed, other_relax, other = [], [], 0, Counter()
    for key, rec in records.items():
        if rec["status"] != "done":
            failed.append(str(rec.get("label", key)))
            continue
        if diff := _differences(cell := rec["cell"], want):
            if list(diff) == ["relaxation"]:
                other_relax += len(rec["rows"])
            else:
                other["; ".join(f"{k} {v!r} (the report's {want.get(k, PROTOCOL_DEFAULTS.get(k))!r})"
                                for k, v in diff.items())] += len(rec["rows"])
            continue
        own = {c: cell.get(c) for c in ("dataset", "backbone", "depth", "budget", "condition", "seed", "checkpoint_id")}
        rows += [{**r, **{c: v for c, v in own.items() if c not in r}, "cell_key": key,
                  "finished": float(rec.get("finished") or 0.0)} for r in rec["rows"]]
    if not rows:
        raise ValueError(f"the result store {st.root} has no finished rows with the report's settings (relaxation "
                         f"{s.relaxation!r}; {sum(other.values())} rows of other settings, {len(failed)} failed "
                         "cells); run the notebooks first")
    df = pd.DataFrame(rows)
    df["build"] = [cell_ident(r, ["build"])[0] for r in df.to_dict("records")]
    newest = df.groupby(["dataset", "backbone", "build"], sort=False)["finished"].transform("idxmax")
    fresh = df["checkpoint_id"].to_numpy() == df.loc[newest, "checkpoint_id"].to_numpy()
    stale = {str(ck): int(n) for ck, n in df.loc[~fresh, "checkpoint_id"].value_counts().items()}
    df = df[fresh].sort_values("finished", kind="stable")
    superseded = int(df.duplicated(CELL_IDENTITY, keep="last").sum())
    df = df.drop_duplicates(CELL_IDENTITY, keep="last").reset_index(drop=True)
    return df, dict(failed_cells=sorted(failed), other_relaxation=other_relax, other_settings=dict(other),
                    stale_checkpoint=stale, superseded=superseded, problems=[p["reason"] for p in problems],
                    relaxation=s.relaxation, store=str(st.root), cell_states=_cell_states(st, records, problems, want))


def _differences(cell: Mapping[str, Any], want: Mapping[str, Any]) -> dict[str, Any]:
    """``{setting: the cell's value}`` where a cell's ``params`` differ from ``want`` (a setting absent on a side
    reads as its :data:`PROTOCOL_DEFAULTS` value); ``build`` names a cell, it is no setting (decision 0072)."""
    have, d = cell.get("params") or {}, PROTOCOL_DEFAULTS
    return {k: have.get(k, d.get(k)) for k in sorted((set(have) | set(want)) - {"build"})
            if have.get(k, d.get(k)) != want.get(k, d.get(k))}


def _cell_states(st, records: Mapping[str, dict], problems: Sequence[Mapping[str, str]],
                 want: Mapping[str, Any]) -> dict[tuple, str]:
    """Why a cell of the report's settings ``want`` has no row, by :func:`_ident` (see :func:`load_store_rows`)."""
    out: dict[tuple, str] = {}
    for rec in sorted(records.values(), key=lambda r: -float(r.get("finished") or 0.0)):   # newest first
        if rec["status"] == "failed" and not _differences(rec["cell"], want):
            err = str(rec.get("error") or "").strip().splitlines()
            out.setdefault(cell_ident(rec["cell"]), "failed: " + (err[-1] if err else "no error recorded"))
    bad = {Path(p["path"]).name.split(".")[0]: p["reason"] for p in problems}
    for c in st.registered_cells():
        if c.key in records or _differences(c.to_dict(), want):
            continue
        claim = st.claim_info(c.key)                    # a live worker's claim, or one whose worker is gone
        why = (f"unreadable record: {bad[c.key].removeprefix('invalid record ignored: ')}" if c.key in bad else
               "pending (in the store's grid, never finished)" if claim is None else
               "running (a live worker's claim, no record yet)" if claim["live"] else
               "killed (its worker's claim is dead: the process is gone; no record)")
        out.setdefault(cell_ident(c.to_dict()), why)
    for rec in records.values():
        if diff := _differences(rec["cell"], want):
            out.setdefault(cell_ident(rec["cell"]), f"only records of other settings {diff}")
    return out


def expected_cells(s: ReportSettings, datasets_present: Sequence[str] = ()) -> pd.DataFrame:
    """The cells each section of the report reads, from the profile alone (decision 0052), on its dataset and every
    other of ``datasets_present``: one row per (section, cell), ``section`` and :data:`CELL_IDENTITY`."""
    prof, present = dict(s.values), set(datasets_present) | {"synthetic"}

    def label(name: str) -> str:                        # datasets by label, nothing read
        try:
            return name if name in present else config.dataset_label(prof, name)
        except ValueError:                              # a root the report does not know
            return name

    # every dataset the store holds ran the profile's notebooks: its protocol table and regime grid are expected too
    own = list(dict.fromkeys([s.dataset] + [d for d in datasets_present if d != "synthetic"]))
    sections = dict(three_conditions=("protocol", own, None),
                    regime=("regime", grid_spans(prof, "regime")[0] + own[1:], [s.backbone]),
                    scale=("scale", grid_spans(prof, "scale")[0], None))
    out = [(section, *cell_ident(c.to_dict())) for section, (name, names, backbones) in sections.items()
           for c in sweep_cells(prof, name, planned=True, datasets=list(dict.fromkeys(map(label, names))),
                                backbones=backbones)]
    return pd.DataFrame(out, columns=["section"] + CELL_IDENTITY)


def missing_cells(rows: pd.DataFrame, s: ReportSettings, left_out: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """The :func:`expected_cells` without a row in ``rows``, each once: ``sections`` (comma-joined
    :data:`SECTIONS` keys), :data:`CELL_IDENTITY`, ``label`` and ``state`` (why it is missing)."""
    states: Mapping[tuple, str] = (left_out or {}).get("cell_states", {})
    exp = expected_cells(s, sorted(set(rows["dataset"].astype(str)) | {k[0] for k in states}))
    have = {cell_ident(r) for r in rows.reindex(columns=CELL_IDENTITY).to_dict("records")}
    out: dict[tuple, list[str]] = {}
    for r in exp.to_dict("records"):
        if (k := cell_ident(r)) not in have:
            out.setdefault(k, []).append(r["section"])
    return pd.DataFrame([dict(sections=",".join(secs), **dict(zip(CELL_IDENTITY, k)),
                              label=f"{k[0]}/{k[1]} L{k[2]} b{k[3]:g} {k[4]} s{k[5]}" + f" build {k[6]}" * bool(k[6]),
                              state=states.get(k, "not in the store (never computed)")) for k, secs in out.items()],
                        columns=["sections"] + CELL_IDENTITY + ["label", "state"])


def mark_missing(table: pd.DataFrame, exp: pd.DataFrame, miss: pd.DataFrame, section: str,
                 with_reference: bool) -> pd.DataFrame:
    """``table`` with a ``missing`` column (how many of a row's expected cells, and of its reference,
    have no result), plus a ``status = "missing"`` row for each expected condition it lacks."""
    cols = CELL_IDENTITY[:5]
    out = table.assign(missing="")
    m = miss[miss["sections"].str.split(",").apply(lambda s: section in s)] if len(miss) else miss
    if m.empty:
        return out
    where = {cell_ident(r, cols): i for i, r in zip(out.index, out[cols].to_dict("records"))}
    n_missing = pd.Series([cell_ident(r, cols) for r in m.to_dict("records")]).value_counts().to_dict()
    expected = pd.Series([cell_ident(r, cols) for r in exp[exp.section == section].to_dict("records")]).value_counts()
    extra = []
    for g, n in expected.items():
        k = n_missing.get(g, 0)
        ref = 0 if g[4] == "reference" else n_missing.get(g[:4] + ("reference",), 0)
        if (g[4] == "reference" and not with_reference) or not (k or ref):
            continue
        text = "; ".join(t for t in (f"{k} of {n} cells missing" if k else "",
                                     "its reference cell is missing" if ref else "") if t)
        if g in where:
            out.at[where[g], "missing"] = text
        else:
            extra.append(dict(zip(cols, g), status="missing", missing=text))
    return pd.concat([out, pd.DataFrame(extra)], ignore_index=True) if extra else out


def save_probes(study, *tables: pd.DataFrame, store: str | Path | None = None) -> Path:
    """Keep ``study``'s cosine probes (:func:`~midas_nb.metrics.probes.hidden_vs_attention_gradient` ``tables``, NaN
    ``depth``: the study's) in ``<store>/derived/cosine_probes.csv``, replacing rows of the same dataset × backbone ×
    depth × pair; returns its path. ValueError: no table, or one without the probe columns."""
    if not tables:
        raise ValueError("save_probes needs at least one probe table")
    need = {"hidden", "attention", "cosine", "lo", "hi", "n_images"}
    frames, depth = [], study.settings.point.depth
    for t in tables:
        if missing := need - set(t.columns):
            raise ValueError(f"save_probes: a table lacks {sorted(missing)}; expected the output of "
                             "probes.hidden_vs_attention_gradient")
        frames.append(t.assign(depth=t["depth"].fillna(depth).astype(int) if "depth" in t else depth))
    new = pd.concat(frames, ignore_index=True)
    new.insert(0, "checkpoint_id", str(study.meta["checkpoint_id"]))
    new.insert(0, "backbone", study.settings.backbone.name)
    new.insert(0, "dataset", str(study.dataset_name))
    path = store_root(study.settings.profile, store) / "derived" / "cosine_probes.csv"
    new = pd.concat([load_probes(study.settings.profile, store), new]).drop_duplicates(
        ["dataset", "backbone", "depth", "hidden", "attention"], keep="last")
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, new.to_csv(index=False))
    return path


def load_probes(profile: str = "quick", store: str | Path | None = None) -> pd.DataFrame | None:
    """The probes :func:`save_probes` kept in the store, or ``None`` when there are none."""
    path = store_root(profile, store) / "derived" / "cosine_probes.csv"
    return read_csv_table(path, "the cosine probes notebook 03 saved (rerun it, or delete the file to report "
                                "without probes)") if path.is_file() else None
