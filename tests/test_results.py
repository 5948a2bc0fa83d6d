"""Tests of midas_nb.results: schema, seed aggregation, files, deployment advice."""
from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import torch

from midas_nb import results as R
from midas_nb.analysis import recommend_deployment
from midas_nb.metrics import InsDel, PartIoU


def _row(**kw):
    base = dict(dataset="cub", backbone="deit_s", checkpoint_id="ck0", condition="reference",
                target="T0", depth=6, budget=0.25, seed=0, n_images=10)
    base.update(kw)
    return base


def test_make_table_fills_defaults_and_orders_columns():
    rows = [R.ResultRow(**_row(miou=0.4), extras={"lambda_ga": 1.0}),
            _row(condition="unsupervised", target="", relaxation="ste_topk", miou=0.5)]
    t = R.make_table(rows)
    assert list(t.columns[:len(R.SCHEMA_COLUMNS)]) == list(R.SCHEMA_COLUMNS)
    assert t.columns[-1] == "lambda_ga"
    assert t["coverage_kind"].tolist() == ["part mIoU", "part mIoU"]
    assert t["n_skipped_parts"].tolist() == [0, 0]
    assert t["target"].tolist() == ["T0", ""]
    assert math.isnan(t.loc[0, "idauc"])
    assert t.loc[0, "versions"].startswith("torch=") and "timm=" in t.loc[0, "versions"]
    assert t["depth"].dtype == "int64" and t["budget"].dtype == "float64"


def test_schema_validation_errors():
    bad = _row()
    del bad["seed"]
    with pytest.raises(ValueError, match=r"missing required column\(s\) \['seed'\]"):
        R.make_table([bad])
    with pytest.raises(ValueError, match=r"required column 'seed' is empty in row\(s\) \[1\]"):
        R.make_table([_row(), bad])
    with pytest.raises(ValueError, match=r"missing required column\(s\) \['checkpoint_id'\]"):
        R.validate_table(pd.DataFrame([_row()]).drop(columns="checkpoint_id"))
    with pytest.raises(ValueError, match="budget must be in"):
        R.make_table([_row(budget=1.5)])
    with pytest.raises(ValueError, match="coverage_kind must be one of"):
        R.make_table([_row(coverage_kind="mIoU")])
    with pytest.raises(ValueError, match="'dataset' is empty"):
        R.make_table([_row(dataset="")])
    with pytest.raises(ValueError, match="repeats schema column"):
        R.ResultRow(**_row(), extras={"miou": 1.0}).to_dict()


def test_summarise_metrics_from_metric_outputs():
    cov = PartIoU(torch.tensor([1 / 3, 0.0, math.nan, 1.0]), 4 / 9, 4, 1, "box coverage")
    f = torch.tensor([0.0, 0.5, 1.0])
    ins = torch.tensor([[0.2, 0.6, 1.0], [0.0, 1.0, 1.0], [0.5, 0.5, 0.5], [0.1, 0.1, 0.1]])
    dele = torch.tensor([[1.0, 0.2, 0.0], [1.0, 1.0, 1.0], [0.5, 0.5, 0.5], [0.1, 0.1, 0.1]])
    ia, da = torch.trapezoid(ins, f), torch.trapezoid(dele, f)   # [.6, .75, .5, .1], [.35, 1, .5, .1]
    insdel = InsDel(ia, da, ia - da, f, ins, dele, torch.zeros(4, dtype=torch.long))
    out = R.summarise_metrics(cov, insdel, correct=torch.tensor([1, 0, 1, 1]),
                              in_box=torch.tensor([True, False, False, False]), n_boot=200)
    assert out["miou"] == pytest.approx(4 / 9) and out["miou_lo"] <= out["miou"] <= out["miou_hi"]
    assert out["n_images"] == 4 and out["n_skipped_parts"] == 1
    assert out["coverage_kind"] == "box coverage"
    # IDAUC per image = .25, −.25, 0, 0 → mean 0
    assert out["idauc"] == pytest.approx(0.0, abs=1e-7)
    assert out["ins_auc"] == pytest.approx(0.4875) and out["del_auc"] == pytest.approx(0.4875)
    assert out["idauc_steps"] == 2 and out["idauc_space"] == "token"
    assert out["accuracy"] == 0.75 and out["pib"] == 0.25
    R.make_table([_row(**out)])                               # fits the schema


def test_aggregate_seeds_by_hand():
    t = R.make_table([_row(seed=0, miou=0.4, idauc=0.30, miou_lo=0.35, miou_hi=0.45),
                      _row(seed=1, miou=0.5, idauc=math.nan, miou_lo=0.45, miou_hi=0.55),
                      _row(condition="T5", target="T5", seed=0, miou=0.6, idauc=0.2)])
    agg = R.aggregate_seeds(t).set_index("condition")
    assert agg.loc["reference", "n_seeds"] == 2 and agg.loc["reference", "seeds"] == "0,1"
    assert agg.loc["reference", "miou_mean"] == pytest.approx(0.45)
    assert agg.loc["reference", "miou_std"] == pytest.approx(math.sqrt(0.005))   # ddof=1
    assert agg.loc["reference", "miou_n"] == 2 and agg.loc["reference", "idauc_n"] == 1
    assert agg.loc["reference", "idauc_mean"] == pytest.approx(0.30)
    # no per-image values: no interval (never the mean of the per-seed bounds, 0.40 here)
    assert math.isnan(agg.loc["reference", "miou_lo"]) and math.isnan(agg.loc["reference", "miou_hi"])
    assert agg.loc["reference", "ci_method"] == "unavailable: no per-image values"
    assert agg.loc["T5", "n_seeds"] == 1 and math.isnan(agg.loc["T5", "miou_std"])


def test_save_load_round_trip(tmp_path):
    t = R.make_table([R.ResultRow(**_row(miou=0.4, idauc=-0.01), extras={"note": "None", "ok": True}),
                      R.ResultRow(**_row(condition="unsupervised", target="", seed=1),
                                  extras={"note": "x", "ok": False})])
    path = R.save_table(t, "unit_table", runs_dir=tmp_path)
    assert sorted(tmp_path.iterdir()) == [tmp_path / "unit_table.csv"] == [path]     # one file, CSV
    back = R.load_table("unit_table", runs_dir=tmp_path)
    pd.testing.assert_frame_equal(back, t)
    with pytest.raises(ValueError, match="plain file stem"):
        R.save_table(t, "../escape", runs_dir=tmp_path)
    with pytest.raises(FileNotFoundError):
        R.load_table("absent", runs_dir=tmp_path)


def test_save_table_default_runs_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MIDAS_RUNS_DIR", str(tmp_path / "runs"))
    p = R.save_table(R.make_table([_row()]), "t")
    assert p == tmp_path / "runs" / "t.csv"


def _advice_table():
    rows = []
    for seed in (0, 1):
        rows += [
            _row(seed=seed, condition="reference", target="T0", miou=0.40, idauc=0.300,
                 miou_lo=0.38, miou_hi=0.42, idauc_lo=0.29, idauc_hi=0.31),
            # highest mIoU overall but far outside the band: must not win coverage-first
            _row(seed=seed, condition="T1", target="T1", miou=0.55, idauc=0.250),
            # in band, D = +3 pp: the coverage-first pick
            _row(seed=seed, condition="T5", target="T5", miou=0.43, idauc=0.295),
            # in band, D = +1 pp, best IDAUC: the faithfulness-first pick
            _row(seed=seed, condition="unsupervised", target="", miou=0.41, idauc=0.340),
        ]
    return R.make_table(rows)


def test_recommend_deployment_picks_expected_rows():
    advice, text = recommend_deployment(_advice_table())
    a = advice.set_index("goal")
    assert a.loc["coverage-first", "condition"] == "T5"
    assert a.loc["coverage-first", "D_pp"] == pytest.approx(3.0)
    assert a.loc["coverage-first", "delta_idauc"] == pytest.approx(-0.005)
    assert a.loc["coverage-first", "status"] == "in band" and not a.loc["coverage-first", "fallback"]
    assert a.loc["faithfulness-first", "condition"] == "unsupervised"
    assert a.loc["faithfulness-first", "idauc"] == pytest.approx(0.34)
    assert a.loc["coverage-first", "n_seeds"] == 2
    lines = text.splitlines()
    assert len(lines) == 2 and lines[0].startswith("coverage-first") and "T5" in lines[0]
    assert "+3.00 pp" in lines[0]


def test_advice_lines_carry_no_identity_strings():
    """Issue 52: each advice line named its cell with the full checkpoint_id and weights_digest; the lines
    name the cell in words, the advice table keeps the identity columns."""
    t = _advice_table().assign(checkpoint_id="ck" + "0" * 40, weights_digest="d" * 64, depth=3)
    advice, text = recommend_deployment(t, by=["depth", "checkpoint_id", "weights_digest"])
    assert "ck000" not in text and "ddd" not in text and "checkpoint_id=" not in text, text
    assert all(line.split(":")[0].endswith("(depth=3)") for line in text.splitlines()), text
    assert set(advice["checkpoint_id"]) == {"ck" + "0" * 40}


def test_recommend_deployment_tie_break_and_fallback():
    t = _advice_table()
    # make T5's IDAUC tie (within 0.001) with unsupervised: the higher mIoU (T5) wins
    t.loc[t.condition == "T5", "idauc"] = 0.3395
    advice, _ = recommend_deployment(t)
    a = advice.set_index("goal")
    assert a.loc["faithfulness-first", "condition"] == "T5"
    assert "breaks the tie" in a.loc["faithfulness-first", "reason"]
    # the pick is not called "highest IDAUC" when another condition's IDAUC is higher
    top = t.loc[t["idauc"].idxmax(), "condition"]
    assert top != "T5" and "highest IDAUC" not in a.loc["faithfulness-first", "reason"]
    assert f"within 0.001 of the highest mean ({top} " in a.loc["faithfulness-first", "reason"]
    # the highest IDAUC with the highest mIoU of its ties: not "within 0.001 of the highest" (itself)
    t.loc[t.condition == "T5", "idauc"] = 0.3405
    reason = recommend_deployment(t)[0].set_index("goal").loc["faithfulness-first", "reason"]
    assert "T5 — highest mean IDAUC 0.341 of the 4 candidates (reference, T1, T5, unsupervised);" in reason
    assert "1 other condition ties within 0.001 of it" in reason
    assert "of the highest" not in reason and "the highest among them" in reason
    # reference outside the band for nobody → still T5 for coverage-first (D=+3, ΔIDAUC>0)
    assert a.loc["coverage-first", "condition"] == "T5"
    # no reference at all: coverage-first falls back to the highest mIoU, flagged
    advice, text = recommend_deployment(t[t.condition != "reference"])
    a = advice.set_index("goal")
    assert a.loc["coverage-first", "condition"] == "T1" and a.loc["coverage-first", "fallback"]
    assert "FALLBACK" in text


def test_recommend_deployment_names_the_ties_within_noise():
    """A pick whose paired interval against another candidate reaches 0 names it as a tie; a
    lead resolved on every image is named as none. Hand-built per-image values, one seed each."""
    ids = json.dumps(["a", "b", "c", "d"])

    def row(cond, miou, idauc):
        return _row(seed=0, condition=cond, target="" if cond in ("reference", "unsupervised") else cond,
                    miou=sum(miou) / 4, idauc=sum(idauc) / 4, image_ids=ids, miou_per_image=json.dumps(miou),
                    idauc_image_ids=ids, idauc_per_image=json.dumps(idauc))

    # T5 is above the reference on IDAUC on every image (a resolved lead); T1 is above T5 on two
    # images and below on two (its difference from T5 changes sign: a tie within noise)
    t = R.make_table([row("reference", [0.3] * 4, [0.10, 0.11, 0.12, 0.13]),
                      row("T5", [0.3] * 4, [0.30, 0.31, 0.32, 0.33]),
                      row("T1", [0.3] * 4, [0.40, 0.20, 0.41, 0.21])])
    a = recommend_deployment(t, n_boot=200)[0].set_index("goal")
    assert a.loc["faithfulness-first", "condition"] == "T5"
    assert a.loc["faithfulness-first", "ties"] == "T1"
    assert "ties within noise with T1 (paired IDAUC interval" in a.loc["faithfulness-first", "reason"]
    # T1 raised on every image: T5 leads nobody within noise any more
    t.loc[t.condition == "T1", "idauc_per_image"] = json.dumps([0.05, 0.06, 0.07, 0.08])
    t.loc[t.condition == "T1", "idauc"] = 0.065
    a = recommend_deployment(t, n_boot=200)[0].set_index("goal")
    assert a.loc["faithfulness-first", "ties"] == "" and "ties within noise" not in a.loc["faithfulness-first",
                                                                                          "reason"]


def test_side_by_side_means_each_named_set_of_rows():
    import pandas as pd
    from midas_nb.results import side_by_side
    a = pd.DataFrame({"accuracy": [0.5, 0.7], "agreement": [0.6, 0.8], "seed": [0, 1]})
    b = pd.DataFrame({"accuracy": [0.25], "agreement": [1.0]})
    out = side_by_side({"a": a, "b": b}, ["accuracy", "agreement"])
    assert list(out.index) == ["a", "b"] and list(out.columns) == ["accuracy", "agreement"]
    assert out.loc["a", "accuracy"] == pytest.approx(0.6) and out.loc["a", "agreement"] == pytest.approx(0.7)
    assert out.loc["b"].tolist() == [0.25, 1.0]
    with pytest.raises(ValueError, match="'c' are empty"):
        side_by_side({"c": a.iloc[:0]}, ["accuracy"])
    with pytest.raises(ValueError, match=r"lack columns \['idauc'\]"):
        side_by_side({"a": a}, ["idauc"])


def test_coverage_name_is_one_word_for_the_tables_verdicts_and_figures():
    from midas_nb.results import coverage_name
    cub = pd.DataFrame({"coverage_kind": ["part mIoU", "part mIoU"]})
    cars = pd.DataFrame({"coverage_kind": ["box coverage", None]})
    assert coverage_name(cub) == "part mIoU" and coverage_name(cars) == "box coverage"
    assert coverage_name(pd.concat([cars, cub])) == "box coverage, part mIoU"   # a table over datasets
    assert coverage_name(pd.DataFrame({"miou": [0.3]})) == "part mIoU"          # the schema's default
    assert coverage_name(pd.DataFrame({"coverage_kind": ["", "box coverage"]})) == "box coverage"  # "" read from CSV
    assert coverage_name(pd.DataFrame({"coverage_kind": [""]})) == "part mIoU"


def test_result_row_fields_are_the_schema_columns():
    """ResultRow is written out for readers and type checkers and SCHEMA is made from its fields:
    the same names, required columns without a default, the others with the schema's default."""
    import dataclasses
    import math

    fields = {f.name: f for f in dataclasses.fields(R.ResultRow) if f.name != "extras"}
    assert set(fields) == set(R.SCHEMA_COLUMNS)
    for c in R.SCHEMA:
        default = fields[c.name].default
        if c.required:
            assert default is dataclasses.MISSING, c.name
        else:
            assert (math.isnan(default) and math.isnan(c.default)) if isinstance(c.default, float) and \
                math.isnan(c.default) else default == c.default, c.name
