"""The report's CSV tables (:data:`TABLES`) written, read back, their findings counted by the fitness rule; no torch
here, so ``midas-nb report --from-tables`` renders without it (decision 0080)."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from ..analysis.findings import backbone_fitness, count_fitness
from ..metrics.stats import is_finite_number

#: the provenance row of the test images coverage leaves out ("images without a visible part" in older tables)
SKIPPED_ROW = "images left out of coverage (no visible part, or an empty or uninformative box)"

#: the CSV tables of a report, in the order REPORT.md shows them
TABLES: tuple[str, ...] = ("provenance", "three_conditions", "cosine_probes", "regime", "scale", "findings",
                           "backbones")

#: the report's sections built from result cells, and how the report names them
SECTIONS: dict[str, str] = {"three_conditions": "three-condition table", "regime": "regime grid",
                            "scale": "scale readout"}


class IncompleteReportError(ValueError):
    """The result store lacks cells the profile's report needs (``--allow-incomplete`` writes it anyway)."""


class MixedSettingsError(ValueError):
    """The result store holds rows of other settings than the report's (``--allow-mixed-settings`` writes it anyway)."""


#: columns of the ``backbones`` table (one row per dataset × backbone × quantity)
BACKBONE_COLUMNS = ["dataset", "backbone", "checkpoint_id", "test_accuracy", "teacher_test_accuracy",
                    "full_accuracy", "depth", "budget", "kind", "item", "estimate", "lo", "hi", "verdict", "evidence"]


def fitness(tables: Mapping[str, pd.DataFrame]) -> dict[tuple[str, str], tuple[bool, str]]:
    """``{(dataset, backbone): (fit, text)}`` (:func:`~midas_nb.analysis.findings.backbone_fitness`, decision 0070),
    from the tables alone: test top-1 of the provenance (else ``backbones``), test split of the dataset's provenance."""
    prov, out, split = tables["provenance"], {}, {}
    if not {"dataset", "backbone", "setting", "value"} <= set(prov.columns):
        return out                          # not a provenance table: the renderer names what it lacks
    for (ds, bb), g in prov[prov["dataset"] != ""].groupby(["dataset", "backbone"], sort=False):
        v = dict(zip(g["setting"], g["value"]))
        cm = re.match(r"([\d.]+) \(1 / (\d+) classes present\), ([\d.]+)", v.get("chance, majority share", ""))
        n = (re.search(r" of (\d+) test images", v.get("evaluated images' fingerprint", ""))   # the split's size,
             or re.match(r"(\d+)$", v.get("test images (mIoU, accuracy)", "")))            # else those evaluated
        if cm and n:
            split[ds] = (int(n.group(1)), 1 / int(cm.group(2)), float(cm.group(3)))
            top1, teacher = v.get("backbone test top-1 (whole test split)"), v.get("teacher test top-1")
            if is_finite_number(top1):
                out[(ds, bb)] = backbone_fitness(float(top1), *split[ds],
                                                 float(teacher) if is_finite_number(teacher) else None)
    bt = tables.get("backbones", pd.DataFrame(columns=BACKBONE_COLUMNS))
    for r in bt.drop_duplicates(["dataset", "backbone"]).itertuples():
        if r.dataset in split and (r.dataset, r.backbone) not in out and is_finite_number(r.test_accuracy):
            t = float(r.teacher_test_accuracy) if is_finite_number(r.teacher_test_accuracy) else None
            out[(r.dataset, r.backbone)] = backbone_fitness(float(r.test_accuracy), *split[r.dataset], t)
    return out


def counted(tables: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """``tables``, each finding (also of ``backbones``) of a backbone failing :func:`fitness` ``"not counted"``."""
    fit = fitness(tables)
    tables["findings"] = count_fitness(tables["findings"], fit)
    if (bt := tables.get("backbones")) is not None and (m := bt["kind"] == "finding").any():
        tables["backbones"] = pd.concat([bt[~m], count_fitness(bt[m], fit, verdict="verdict")]).sort_index()
    return tables


def number_text(x: Any, fmt: str, empty: str = "") -> str:
    """``x`` in format ``fmt`` where it reads as a finite number, else ``empty``."""
    return format(float(x), fmt) if is_finite_number(x) else empty


def read_csv_table(path: Path, expected: str, **kwargs: Any) -> pd.DataFrame:
    """``pd.read_csv(path, **kwargs)``; ValueError naming the file and what was ``expected`` where it is unreadable."""
    try:
        return pd.read_csv(path, **kwargs)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a readable CSV table ({e}); expected {expected}") from None


def write_tables(tables: Mapping[str, pd.DataFrame], output: str | Path) -> None:
    """Write each table to ``<output>/<name>.csv``."""
    (out := Path(output)).mkdir(parents=True, exist_ok=True)
    for name in TABLES:
        tables[name].to_csv(out / f"{name}.csv", index=False)


def read_tables(directory: str | Path) -> dict[str, pd.DataFrame]:
    """A report folder's :data:`TABLES`, findings :func:`counted`; FileNotFoundError / ValueError: one missing / bad."""
    d = Path(directory)
    missing = [n for n in TABLES if not (d / f"{n}.csv").is_file()]
    if missing:
        raise FileNotFoundError(f"report tables {missing} missing in {d}; expected {list(TABLES)}")
    out = {n: read_csv_table(d / f"{n}.csv", "the table `midas-nb report` wrote", keep_default_na=False,
                             na_values=[""]) for n in TABLES}
    for df in out.values():
        for c in set(_TEXT_COLUMNS) & set(df.columns):
            df[c] = df[c].astype(object).where(df[c].notna(), "").astype(str)
    return counted(out)        # tables written before the fitness rule are judged by it too


#: the columns :func:`read_tables` reads as text, an empty cell as ``""``
_TEXT_COLUMNS = ("dataset", "backbone", "setting", "value", "condition", "status", "band_reason", "reference_check",
                 "D_pp_by_seed", "D_pp_by_build", "status_vs_random_map", "band_reason_vs_random_map", "seeds",
                 "paper_status", "evidence", "statement", "paper", "paper_expectation", "hidden", "attention",
                 "checkpoint_id", "missing", "kind", "item", "verdict")
