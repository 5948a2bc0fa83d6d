"""The report's CSV tables (:func:`build_tables`) from a profile's result store (:func:`load_store_rows`), its missing
cells and cosine probes; the paper-shaped table (:func:`paper_table`) ``midas-nb run`` prints."""
from __future__ import annotations

import json
import math
import os
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from .. import config
from ..config import DATASET_NAMES, PAPER_BACKBONES
from ..identity import atomic_write_text, canonical_json
from ..metrics import parity_band
from ..study import grid_spans, protocol_settings, ReportSettings, sweep_cells
from ..sweeps import ResultStore
from ..sweeps.plan import CELL_IDENTITY, cell_ident
from ..analysis.protocol import PROTOCOL_DEFAULTS
from ..analysis.paper_reference import PAPER_COSINE_MAX, PAPER_D_T1, PAPER_SETTING, paper_status, paper_value
from ..results import aggregate_seeds, coverage_name
from ..analysis.findings import BOOTSTRAP_SEED, ci_text, d_by_condition, paper_findings, plural
from .tables import BACKBONE_COLUMNS, counted, number_text, read_csv_table, SECTIONS, SKIPPED_ROW


def store_root(profile: str, store: str | Path | None = None) -> Path:
    """The result store's directory: ``store``, or by default ``runs/sweeps/<profile>``."""
    return config.runs_dir() / "sweeps" / profile if store is None else Path(store)


def load_store_rows(profile: str = "quick", store: str | Path | None = None, *,
                    settings: ReportSettings | None = None) -> tuple[pd.DataFrame, dict[str, Any]]:
    """``(rows, left_out)``: the store's done rows of the report's ``settings`` (default the profile's), newest
    checkpoint per dataset × backbone × build and record per cell (decisions 0009, 0066); ``left_out``: what was not
    kept, by reason, and ``cell_states`` (why a cell has no row). FileNotFoundError: no store; ValueError: no row."""
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
    """``{setting: the cell's value}`` where its ``params`` differ from ``want`` (absent: its default; no ``build``)."""
    have, d = cell.get("params") or {}, PROTOCOL_DEFAULTS
    return {k: have.get(k, d.get(k)) for k in sorted((set(have) | set(want)) - {"build"})
            if have.get(k, d.get(k)) != want.get(k, d.get(k))}


def _cell_states(st, records: Mapping[str, dict], problems: Sequence[Mapping[str, str]],
                 want: Mapping[str, Any]) -> dict[tuple, str]:
    """Why a cell of the report's settings ``want`` has no row, by cell identity (see :func:`load_store_rows`)."""
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
    if (m := miss[miss["sections"].str.split(",").apply(lambda s: section in s)] if len(miss) else miss).empty:
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
    """Keep ``study``'s cosine probes (:func:`~midas_nb.metrics.probes.hidden_vs_attention_gradient` ``tables``) in
    ``<store>/derived/cosine_probes.csv``, its path; rows of the same cell and pair replaced. ValueError: bad input."""
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
    return atomic_write_text(path, new.to_csv(index=False))


def load_probes(profile: str = "quick", store: str | Path | None = None) -> pd.DataFrame | None:
    """The probes :func:`save_probes` kept in the store, or ``None`` when there are none."""
    path = store_root(profile, store) / "derived" / "cosine_probes.csv"
    return read_csv_table(path, "the cosine probes notebook 03 saved (rerun it, or delete the file to report "
                                "without probes)") if path.is_file() else None


def _first(series: pd.Series) -> Any:
    return next(iter(series.dropna()), "")


def order_first(values: Sequence[str], first: Sequence[str]) -> list[str]:
    """The distinct ``values``: those in ``first`` in its order, then the others as they come."""
    values = list(dict.fromkeys(values))
    return [v for v in first if v in values] + [v for v in values if v not in first]


def _shown_path(p: str | Path) -> str:
    """A path as the report prints it, naming no machine (decision 0021)."""
    p = Path(p).resolve()
    bases = [("$MIDAS_CACHE_DIR/", config.cache_dir()), ("", config.project_root())]
    bases += [("$MIDAS_RUNS_DIR/", Path(os.environ["MIDAS_RUNS_DIR"]))] if os.environ.get("MIDAS_RUNS_DIR") else []
    for prefix, base in bases:
        if p.is_relative_to(base.resolve()):
            return prefix + p.relative_to(base.resolve()).as_posix()
    return "…/" + "/".join(p.parts[-2:])


def _distinct(g: pd.DataFrame, col: str, f: Any = str) -> list:
    """The sorted distinct non-empty values ``f(v)`` of ``g[col]`` (``[]``: no such column)."""
    return sorted({f(v) for v in g[col].dropna() if str(v)}) if col in g.columns else []


def _provenance(rows: pd.DataFrame, left_out: Mapping[str, Any], s: ReportSettings,
                blocks: list[tuple[str, str]], probes_used: Mapping[tuple[str, str], int],
                exp: pd.DataFrame, miss: pd.DataFrame) -> pd.DataFrame:
    run = {"profile": s.profile, "run kind": str(s.values.get("run_kind") or s.profile),   # the profile's own words
           "result store": _shown_path(left_out["store"]) if left_out.get("store") else "not recorded",
           "relaxation": left_out.get("relaxation", "st"),
           "failed cells left out": len(left_out.get("failed_cells", [])),
           "rows of other relaxations left out": left_out.get("other_relaxation", 0),
           "rows of other settings left out": "; ".join(f"{n} with {d}" for d, n in
                                                        left_out.get("other_settings", {}).items()) or 0,
           "rows of older checkpoints left out": sum(left_out.get("stale_checkpoint", {}).values()),
           "rows superseded by a newer record": left_out.get("superseded", 0),
           "invalid store files ignored": len(left_out.get("problems", [])),
           "bootstrap": f"{s.bootstrap} resamples per interval (the profile's `bootstrap`), seed {BOOTSTRAP_SEED}",
           "interval of a mean over seeds": "a t interval over the seeds plus a bootstrap over the images, as for D "
           "(one seed: a percentile bootstrap over the images), cut at the metric's range"}   # aggregate_seeds, 0007
    for sec, name in SECTIONS.items():
        n = int((exp["section"] == sec).sum())
        k = int(miss["sections"].str.split(",").apply(lambda v: sec in v).sum()) if len(miss) else 0
        run[f"completeness: {name}"] = (f"INCOMPLETE: {k} of {n} expected cells {'has' if k == 1 else 'have'} no result"
                                        if k else f"complete: all {n} expected cells have results")
    out = [("", "", k, str(v)) for k, v in run.items()]
    out += [("", "", "missing cell", f"{r['label']} ({', '.join(SECTIONS[x] for x in r['sections'].split(','))}): "
                                     f"{r['state']}") for r in miss.to_dict("records")]
    out.append(("", "", "versions", " | ".join(_distinct(rows, "versions")) or "not recorded"))
    for ds, bb in blocks:
        g = rows[(rows["dataset"] == ds) & (rows["backbone"] == bb)]
        out += [(ds, bb, k, str(v)) for k, v in _block_provenance(g, s, ds, probes_used.get((ds, bb), 0)).items()]
    return pd.DataFrame(out, columns=["dataset", "backbone", "setting", "value"])


def _block_provenance(g: pd.DataFrame, s: ReportSettings, ds: str, n_probes: int) -> dict[str, Any]:
    """One block's provenance: checkpoint, data and sample with their sources (decisions 0054, 0057), accuracy bases."""
    at = g[(g["depth"] == s.point.depth) & np.isclose(g["budget"].astype(float), float(s.point.budget))]
    meta, where = _checkpoint_meta(ckpt := str(_first(g["checkpoint_id"])))
    sets = {split: (meta or {}).get(f"{split}_set") or {} for split in ("test", "train")}
    digests, fps = _distinct(g, "weights_digest"), _distinct(g, "dataset_fingerprint")
    of = (f"{', '.join(map(str, _distinct(g, 'n_images', int))) or '?'} of "
          f"{sets['test'].get('num_images') or 'M (split size: no checkpoint metadata)'} test images")
    n_train, cap = sets["train"].get("num_images"), config.images_per_class(dict(s.values), ds)
    block = {"checkpoint": _first(g["checkpoint_id"]),
             "weights digest": ", ".join(digests) or "not recorded in the result store",
             "evaluated images' fingerprint": (f"{', '.join(fps)} ({of}; from the result rows)" if fps else
                                               "not recorded in the result rows"),
             "training images": str(n_train) if n_train else "not available: no checkpoint metadata"}
    if cap is not None and (not n_train or n_train <= cap * int((meta or {}).get("num_classes") or 0)):
        block["training images per class (cap)"] = str(cap)
    for split, info in sets.items():
        block[f"{split} split fingerprint"] = (
            f"{info['fingerprint']} (checkpoint metadata {_shown_path(where)})" if info.get("fingerprint") else
            f"not available: no {split}-split fingerprint in {_shown_path(where)}" if meta else
            f"not available: no metadata of checkpoint {ckpt} in this machine's cache {_shown_path(where)} "
            "(MIDAS_CACHE_DIR)")
    block.update({"depth L, budget b": f"{s.point.depth}, {float(s.point.budget):.0%}",
                  "seeds": ",".join(str(int(x)) for x in sorted(set(at["seed"]))) if len(at) else "",
                  "conditions": ", ".join(c for c in order_first(at["condition"], s.conditions)
                                          if c in set(s.conditions) | {"random"}),
                  "coverage": coverage_name(at)})
    for col, name in (("n_images", "test images (mIoU, accuracy)"), ("n_idauc_images", "IDAUC images"),
                      ("idauc_steps", "IDAUC steps S"), ("n_skipped_parts", SKIPPED_ROW)):
        block[name] = ", ".join(map(str, _distinct(at, col, int))) or "not recorded"
    if "full_accuracy" in at.columns and at["full_accuracy"].notna().any():
        block["backbone test accuracy (all tokens)"] = f"{float(at['full_accuracy'].mean()):.3f}"
    if config.dataset_of_label(ds) == "aircraft":
        block["class labels"] = f"FGVC-Aircraft {_aircraft_level(ds)}"
    block["backbone test top-1 (whole test split)"] = (number_text(meta.get("test_accuracy"), ".3f", "not recorded")
                                                       if meta else "checkpoint metadata not in this cache")
    if meta:
        if (teacher := (meta.get("distillation") or {}).get("teacher_test_accuracy")) is not None:
            block["teacher test top-1"] = number_text(teacher, ".3f", "not recorded")
        split = _test_split(meta, ds)
        block["chance, majority share"] = ("test split not readable on this machine" if split is None else
                                           f"{split.chance_accuracy:.3f} (1 / {split.num_classes_present} classes "
                                           f"present), {split.majority_fraction:.3f}")
    pts = sorted(set(zip(g["depth"].astype(int), g["budget"].astype(float))))
    others = sorted(set(g["condition"]) - set(s.conditions) - {"random"})
    return dict(block, **{"(L, b) points": " ".join(f"({L}, {b:.0%})" for L, b in pts),
                          "other conditions in the store (not in this report)": ", ".join(others) or "none",
                          "cosine probe rows": n_probes})


def _incomplete_note(miss: pd.DataFrame, finding: str, dataset: str, backbone: str) -> str:
    """" — INCOMPLETE: …" where cells the finding reads (scale: the dataset's; others: the block's) are missing."""
    sections = ({"scale"} if finding == "scale" else {"three_conditions", "regime"}
                if finding in ("t5_gain_in_band", "t1_below_reference", "fades_deep", "fades_loose") else None)
    if not sections or miss.empty:
        return ""
    m = miss[(miss["dataset"] == dataset) & ((miss["backbone"] == backbone) | (finding == "scale"))
             & miss["sections"].str.split(",").apply(lambda v: bool(set(v) & sections))]
    return f" — INCOMPLETE: {plural(len(m), 'expected cell', 'expected cells')} missing" if len(m) else ""


def build_tables(rows: pd.DataFrame, s: ReportSettings, *,
                 left_out: Mapping[str, Any] | None = None, probes: pd.DataFrame | None = None,
                 band: float | None = None) -> dict[str, pd.DataFrame]:
    """The report's tables (:data:`TABLES`) from :func:`load_store_rows`' rows and ``left_out``, :func:`load_probes`'
    ``probes`` and the parity ``band`` (``None``: ``PARITY_BAND``), missing cells marked (decision 0052); intervals
    of ``s.bootstrap`` resamples. ValueError: no reference rows of the profile's backbone at its ``(L, b)``."""
    L0, b0, n_boot = s.point.depth, float(s.point.budget), s.bootstrap
    at = rows[(rows["depth"] == L0) & np.isclose(rows["budget"].astype(float), b0)]
    main = at[at["backbone"] == s.backbone]
    if main.empty or not (main["condition"] == "reference").any():
        have = sorted(set(zip(rows["backbone"], rows["depth"].astype(int), rows["budget"].astype(float))))
        raise ValueError(f"no reference rows of backbone {s.backbone!r} at L={L0}, b={b0:g} in the store; "
                         f"it has (backbone, L, b) = {have[:8]}")
    blocks = [(ds, s.backbone) for ds in order_first(main["dataset"], DATASET_NAMES)]
    exp, miss = expected_cells(s, sorted(set(rows["dataset"]))), missing_cells(rows, s, left_out)
    tc = mark_missing(_three_conditions_table(main, s, band, n_boot), exp, miss, "three_conditions",
                      with_reference=True)
    rg = mark_missing(_regime_table(rows, s, band, n_boot), exp, miss, "regime", with_reference=False)
    sc = mark_missing(_scale_table(at, s, band, n_boot), exp, miss, "scale", with_reference=False)
    pr = pd.DataFrame(columns=_PROBE_COLUMNS)          # the cosine probes of the reported checkpoints
    if probes is not None and len(probes):
        pr = probes[probes["checkpoint_id"].isin(set(main["checkpoint_id"])) & (probes["backbone"] == s.backbone)
                    ].assign(paper_max_abs=PAPER_COSINE_MAX)
        pr = pr[[c for c in _PROBE_COLUMNS if c in pr.columns]].sort_values(["dataset", "depth", "hidden", "attention"],
                                                                           kind="stable").reset_index(drop=True)
    probes_used = {k: len(g) for k, g in pr.groupby(["dataset", "backbone"])}
    # the findings of each block, plus the scale finding of the scale readout's backbones at the profile's point
    scale_bbs = _scale_display(s)
    fnd_rows = rows[rows["condition"].isin(set(s.conditions) | set(s.sweep.conditions) | {"random"})]
    fnd = paper_findings(fnd_rows[(fnd_rows["backbone"] == s.backbone) |
                                  (fnd_rows["backbone"].isin(scale_bbs) & (fnd_rows["depth"] == L0) &
                                   np.isclose(fnd_rows["budget"].astype(float), b0))],
                         pr if len(pr) else None, depth=L0, budget=b0, band=band, n_boot=n_boot,
                         scale_backbones=scale_bbs)
    fnd = fnd[(fnd["backbone"] == s.backbone) | (fnd["finding"] == "scale")].reset_index(drop=True)
    fnd["evidence"] = [ev + _incomplete_note(miss, f, ds, bb) for ev, f, ds, bb in
                       zip(fnd["evidence"], fnd["finding"], fnd["dataset"], fnd["backbone"])]
    prov = _provenance(rows, left_out or {}, s, blocks, probes_used, exp, miss)
    bbt = (backbones_table(rows, probes, s, band, n_boot) if len(s.sweep.compare_backbones) > 1
           else pd.DataFrame(columns=BACKBONE_COLUMNS))
    return counted(dict(provenance=prov, three_conditions=tc, cosine_probes=pr, regime=rg, scale=sc, findings=fnd,
                        backbones=bbt))

_CELL = ["dataset", "backbone", "depth", "budget"]
_PROBE_COLUMNS = ["dataset", "backbone", "checkpoint_id", "depth", "hidden", "attention", "cosine", "lo", "hi",
                  "n_images", "mode", "paper_max_abs"]
#: controls shown beside the profile's conditions where run: the random ranking (the reference's check) and map
_CHECK_CONDITIONS = ("random", "random_map")


def _three_conditions_table(main: pd.DataFrame, s: ReportSettings, band: float | None, n_boot: int) -> pd.DataFrame:
    """The three-condition table at the profile's point: D and the means with intervals, the paper's values."""
    L0, b0, cell, key = s.point.depth, float(s.point.budget), _CELL, _CELL + ["condition"]
    conds = list(s.conditions) + [c for c in _CHECK_CONDITIONS if c not in s.conditions and
                                        (main["condition"] == c).any()]
    proto = main[main["condition"].isin(conds)]
    agg = aggregate_seeds(proto, by=key, metrics=("miou", "idauc", "accuracy"), n_boot=n_boot,
                          seed=BOOTSTRAP_SEED).rename(columns={"accuracy_mean": "accuracy"})
    d = d_by_condition(proto, cell, band, n_boot)
    d_cols = ["D_pp", "D_pp_lo", "D_pp_hi", "D_pp_std", "D_pp_by_seed", "n_builds", "D_pp_by_build", "delta_idauc",
              "delta_idauc_lo", "delta_idauc_hi", "status", "band_reason", "reference_check"]
    on_paper = L0 == int(PAPER_SETTING["depth"]) and math.isclose(b0, float(PAPER_SETTING["budget"]))
    kinds = proto.groupby(["dataset", "backbone"])["coverage_kind"].first() if "coverage_kind" in proto else {}
    tc = d[key + ["miou", "idauc"] + d_cols].assign(
        coverage_kind=[kinds.get((ds, bb)) for ds, bb in zip(d["dataset"], d["backbone"])],
        **{f"paper_{c}": pd.to_numeric([paper_value(k, ds, c) if on_paper else None for k, ds in
                                        zip(d["condition"], d["dataset"])], errors="coerce")
           for c in ("D_pp", "delta_idauc")},
        # at the paper's point a T1 row without the paper's status says what the paper states
        paper_status=[(paper_status(k, ds) or ("below reference" + ("" if ds in PAPER_D_T1 else " (no value given)")
                       if k == "T1" else "")) if on_paper else "" for k, ds in zip(d["condition"], d["dataset"])])
    vs_map = {"D_pp": "D_vs_random_map_pp", "D_pp_lo": "D_vs_random_map_pp_lo", "D_pp_hi": "D_vs_random_map_pp_hi",
              "status": "status_vs_random_map", "band_reason": "band_reason_vs_random_map"}
    tc = tc.merge(agg[key + ["n_seeds", "seeds", "n_images", "miou_lo", "miou_hi", "idauc_lo", "idauc_hi", "accuracy",
                             "accuracy_lo", "accuracy_hi"]], on=key, how="left")
    if (proto["condition"] == "random_map").any():       # D against the random-map control, where run
        dr = d_by_condition(proto, cell, band, n_boot, reference="random_map").rename(columns=vs_map)
        tc = tc.merge(dr[key + list(vs_map.values())], on=key, how="left")
    rank = {"dataset": {v: i for i, v in enumerate(DATASET_NAMES)}, "condition": {c: i for i, c in enumerate(conds)}}
    tc = tc.sort_values(["dataset", "condition"], key=lambda c: c.map(rank[c.name]).fillna(99), kind="stable")
    tc_cols = cell + ["condition", "coverage_kind", "n_seeds", "seeds", "n_images", "miou", "miou_lo", "miou_hi",
                      "idauc", "idauc_lo", "idauc_hi", "accuracy", "accuracy_lo", "accuracy_hi", *d_cols,
                      *vs_map.values(), "paper_D_pp", "paper_delta_idauc", "paper_status"]
    return tc[[c for c in tc_cols if c in tc.columns]].reset_index(drop=True)


def _swept_d(rows: pd.DataFrame, group: list[str], s: ReportSettings, band: float | None,
             n_boot: int) -> pd.DataFrame | None:
    """D of the swept conditions of ``rows`` whose ``group`` has a reference (random: a check, unless swept)."""
    swept = list(s.sweep.conditions)
    rows = rows[rows["condition"].isin(swept + ["random"])]
    rows = rows[rows.groupby(group)["condition"].transform(lambda c: (c == "reference").any())]
    if not len(rows):
        return None
    d = d_by_condition(rows, _CELL, band, n_boot)
    return d[~d["condition"].isin(["reference"] + (["random"] if "random" not in swept else []))].copy()


def _regime_table(rows: pd.DataFrame, s: ReportSettings, band: float | None, n_boot: int) -> pd.DataFrame:
    """D over the regime grid: the profile's backbone, every point with a reference."""
    rg_cols = _CELL + ["condition", "D_pp", "D_pp_lo", "D_pp_hi", "delta_idauc", "delta_idauc_lo", "delta_idauc_hi",
                       "status", "band_reason", "n_seeds", "n_builds", "paper_expectation"]
    if (rg := _swept_d(rows[rows["backbone"] == s.backbone], _CELL, s, band, n_boot)) is None:
        return pd.DataFrame(columns=rg_cols)
    rg["paper_expectation"] = ["strongest (L ≤ 6, b ≤ 25 %)" if (L <= 6 and b <= 0.25 + 1e-9) else
                               "fades or reverses (L ≥ 9 or b ≥ 50 %)" if (L >= 9 or b >= 0.5 - 1e-9) else ""
                               for L, b in zip(rg["depth"], rg["budget"])]
    rg = rg.sort_values(["dataset", "condition", "depth", "budget"], kind="stable")
    return rg[rg_cols].reset_index(drop=True)


def _scale_display(s: ReportSettings) -> list[str]:
    """The profile's ``scale_backbones``, after its own backbone where ``other_backbones`` is false."""
    listed = list(s.sweep.scale_backbones)
    return listed if s.sweep.other_backbones else list(dict.fromkeys([s.backbone] + listed))


def _scale_table(at: pd.DataFrame, s: ReportSettings, band: float | None, n_boot: int) -> pd.DataFrame:
    """The scale readout: D of every scale backbone at the profile's point, with the paper's notes."""
    scale_bbs = _scale_display(s)
    sc_cols = ["dataset", "backbone", "depth", "budget", "condition", "D_pp", "D_pp_lo", "D_pp_hi", "delta_idauc",
               "status", "band_reason", "n_seeds", "n_builds", "miou", "idauc", "paper"]
    if (sc := _swept_d(at[at["backbone"].isin(scale_bbs)], ["dataset", "backbone"], s, band, n_boot)) is None:
        return pd.DataFrame(columns=sc_cols)
    # the paper's statement beside each row (backbones matched by exact timm name)
    sc["paper"] = ["decoupling reproduces (D > 0)" if c == "T5" and bb == PAPER_BACKBONES[0] else
                   "decoupling reverses" if c == "T5" and bb == PAPER_BACKBONES[2] else
                   f"D = {paper_value(c, ds):+.2f} pp"
                   if bb == PAPER_SETTING["backbone"] and paper_value(c, ds) is not None else ""
                   for bb, c, ds in zip(sc["backbone"], sc["condition"], sc["dataset"])]
    bb_order = {b: i for i, b in enumerate(scale_bbs)}
    sc = sc.sort_values(["dataset", "backbone", "condition"], key=lambda s: s.map(bb_order) if s.name == "backbone"
                        else s, kind="stable")
    return sc[sc_cols].reset_index(drop=True)


def _checkpoint_meta(ckpt: str) -> tuple[dict[str, Any] | None, Path]:
    """``(metadata, its file)`` of a checkpoint in this machine's cache, else ``(None, <cache>/checkpoints)``."""
    cache = config.cache_dir() / "checkpoints"
    for path in sorted(cache.glob(f"*-{ckpt}.json")) if ckpt else []:
        try:
            return json.loads(path.read_text()), path
        except (OSError, json.JSONDecodeError):
            continue
    return None, cache


def _aircraft_level(label: str) -> str:
    return label.partition(" (")[2].rstrip(")") or config.AIRCRAFT_LEVELS[0]


def _test_split(meta: Mapping[str, Any], label: str):
    """The checkpoint's test split (labels only), or ``None`` where it cannot be read here."""
    from ..data import AircraftDataset, CarsDataset, CUBDataset, DatasetError
    ts = meta.get("test_set") or {}
    cls = {c.__name__: c for c in (CUBDataset, AircraftDataset, CarsDataset)}.get(str(ts.get("type")))
    if cls is None or not (root := Path(str(ts.get("root", "")))).exists():
        return None
    kw = {"annotation_level": _aircraft_level(label)} if cls is AircraftDataset else {}
    try:
        return cls(root, str(ts.get("split", "test")), **kw)
    except (DatasetError, OSError, ValueError):
        return None


def backbones_table(rows: pd.DataFrame, probes: pd.DataFrame | None, s: ReportSettings, band: float | None,
                     n_boot: int) -> pd.DataFrame:
    """Notebook 05's comparison backbones side by side at the profile's ``(L, b)`` (:data:`BACKBONE_COLUMNS`), rows of
    ``kind`` ``D`` (per swept condition), ``cosine``, ``finding``, or ``missing`` / ``not run`` (no reference rows)."""
    L0, b0, swept, out = s.point.depth, float(s.point.budget), list(s.sweep.conditions), []
    for ds in order_first(rows["dataset"], DATASET_NAMES) if len(rows) else []:
        for bb in s.sweep.compare_backbones:
            g = rows[(rows["dataset"] == ds) & (rows["backbone"] == bb) & rows["condition"].isin(swept + ["random"])]
            at = g[(g["depth"] == L0) & np.isclose(g["budget"].astype(float), b0)]
            base = dict(dataset=ds, backbone=bb, depth=L0, budget=b0)
            if at.empty or not (at["condition"] == "reference").any():
                kind = "not run" if bb != s.backbone and not s.sweep.other_backbones else "missing"
                out.append(dict(base, kind=kind, verdict=kind, evidence=(
                    f"the {s.profile} profile trains no other backbone (other_backbones=false); "
                    "`midas-nb run -p other_backbones true` adds it" if kind == "not run" else
                    f"no reference rows at L={L0}, b={b0:g} in the store (notebook 05)")))
                continue
            meta = _checkpoint_meta(ck := str(_first(at["checkpoint_id"])))[0] or {}
            base.update(checkpoint_id=ck, test_accuracy=meta.get("test_accuracy", np.nan),
                        teacher_test_accuracy=(meta.get("distillation") or {}).get("teacher_test_accuracy", np.nan),
                        full_accuracy=float(_first(at["full_accuracy"])) if "full_accuracy" in at.columns and
                        str(_first(at["full_accuracy"])) != "" else np.nan)
            d = d_by_condition(at, _CELL, band, n_boot)
            for r in d[~d["condition"].isin(["reference", "random"])].itertuples():
                di = ci_text(r.delta_idauc, r.delta_idauc_lo, r.delta_idauc_hi, "+.3f", edges=(0, -parity_band(band)))
                out.append(dict(base, kind="D", item=r.condition, estimate=r.D_pp, lo=r.D_pp_lo, hi=r.D_pp_hi,
                                verdict=r.status, evidence=f"ΔIDAUC {di}"
                                + (f"; {r.band_reason}" if r.status == "uninformative" else "")))
            pr = None if probes is None or not len(probes) else probes[
                (probes["dataset"] == ds) & (probes["backbone"] == bb) & (probes["depth"] == L0) &
                (probes["checkpoint_id"].astype(str) == ck)]
            out += [dict(base, kind="cosine", item=f"{r.hidden}·{r.attention}", estimate=r.cosine, lo=r.lo, hi=r.hi,
                         verdict="", evidence=f"{int(r.n_images)} images")
                    for r in ([] if pr is None else pr.sort_values(["hidden", "attention"]).itertuples())]
            f = paper_findings(g, pr if pr is not None and len(pr) else None, depth=L0, budget=b0, band=band,
                               n_boot=n_boot, scale_backbones=[])
            for r in f[(f["backbone"] == bb) & (f["finding"] != "scale")].itertuples():
                out.append(dict(base, kind="finding", item=r.finding, verdict=str(r.holds), evidence=r.evidence))
    return pd.DataFrame(out, columns=BACKBONE_COLUMNS)


def paper_table(rows: pd.DataFrame, s: ReportSettings, *, expected: Sequence[tuple[str, str]] = (),
                backbone_order: Sequence[str] = ()) -> pd.DataFrame:
    """The paper-shaped table (decision 0036): the three-condition table of every block of ``rows`` at ``s``'s point,
    paper values beside DeiT-S/16 rows only; an ``expected`` block without D: a "no result" row. ValueError/KeyError."""
    at = rows[(rows["depth"] == s.point.depth) & np.isclose(rows["budget"].astype(float), float(s.point.budget))
              ] if len(rows) else pd.DataFrame(columns=_CELL + ["condition"])
    tc = (_three_conditions_table(at, s, None, s.bootstrap) if (at["condition"] == "reference").any()
          else pd.DataFrame(columns=_CELL + ["condition"]))
    tc.loc[tc["backbone"] != PAPER_SETTING["backbone"], ["paper_D_pp", "paper_delta_idauc", "paper_status"]] = None
    have, n_at = set(zip(tc["dataset"], tc["backbone"])), set(zip(at["dataset"], at["backbone"]))
    extra = [dict(dataset=d, backbone=b, status="no reference row" if (d, b) in n_at else "no result")
             for d, b in expected if (d, b) not in have]
    tc = pd.concat([tc, pd.DataFrame(extra)], ignore_index=True) if extra else tc
    rank = {"dataset": list(DATASET_NAMES), "backbone": list(backbone_order)}
    return tc.sort_values(["dataset", "backbone"], kind="stable", key=lambda c: c.map(
        {v: i for i, v in enumerate(rank[c.name])}).fillna(99)).reset_index(drop=True)


def paper_table_for(profile: Mapping[str, Any]) -> pd.DataFrame:
    """:func:`paper_table` of the scale readout's cells of a profile's result store, each of its blocks expected."""
    s = ReportSettings.of(profile)
    datasets, backbones = grid_spans(dict(s.values), "scale")
    return paper_table(ResultStore(name=s.profile).results(sweep_cells(dict(s.values), "scale")), s,
                       expected=[(config.dataset_label(dict(s.values), d), b) for d in datasets for b in backbones],
                       backbone_order=backbones)


def format_paper_table(table: pd.DataFrame) -> str:
    """Plain text: per dataset × backbone its coverage kind, then a line per condition (or the block's status)."""
    fmt = {c: lambda x, f=f: number_text(x, f, "—") for c, f in (("miou", ".3f"), ("idauc", "+.3f"), ("D_pp", "+.2f"),
           ("delta_idauc", "+.3f"), ("paper_D_pp", "+.2f"), ("paper_delta_idauc", "+.3f"))}
    blocks = [f"{d} × {b}  ({coverage_name(g)})\n" + textwrap.indent(
        str(g["status"].iloc[0]) if g["condition"].isna().all() else
        g[["condition", *fmt, "status"]].to_string(index=False, formatters=fmt, na_rep="—"), "    ")
        for (d, b), g in table.groupby(["dataset", "backbone"], sort=False)]
    return "\n".join(blocks) or "paper table: no rows"
