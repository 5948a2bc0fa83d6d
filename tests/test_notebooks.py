"""The notebooks: structure of every notebook, and one papermill run with injected parameters.

nbval (``--nbval-lax`` over ``notebooks/``, smoke profile) executes every notebook; these
tests add what nbval cannot see: the committed files are clean (no outputs), each has exactly
one ``parameters`` cell with the agreed names, imports only ``midas_nb`` and ``os``, and a
papermill run picks up injected parameters and writes results that can be read back.
"""
from __future__ import annotations

import ast
import json
import math
import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import nbformat
import pandas as pd
import pytest
import torch

from midas_nb.data import evaluation_subset
from midas_nb.analysis.last import pib_table

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
PARAMETERS = ["profile", "data_root", "data_roots", "dataset", "aircraft_level", "builds", "build", "backbone", "weights",
              "backbone_kwargs", "depth", "budget", "seeds", "device", "precision", "output_dir"]
# a notebook's own parameters, just before output_dir
EXTRA_PARAMETERS = {"04_regime_sweeps": ["depths", "budgets"], "05_scale_sensitivity": ["other_backbones", "compare_with"],
                    "07_deployment_guide": ["depths", "budgets"]}  # 07 reads 04's sweep: the same grid
EXPECTED = ["00_quickstart", "01_supervision_targets", "02_three_condition_protocol", "03_cosine_probes",
            "04_regime_sweeps", "05_scale_sensitivity", "06_related_methods", "07_deployment_guide"]


def _code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


def test_the_eight_notebooks_exist():
    assert [p.stem for p in NOTEBOOKS] == EXPECTED


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_valid_and_clean(path):
    raw = json.loads(path.read_text())
    assert raw["nbformat"] == 4
    nb = nbformat.reads(path.read_text(), as_version=4)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    for c in _code_cells(nb):
        assert c.outputs == [], f"{path.name}: committed with outputs"
        assert c.execution_count is None, f"{path.name}: committed with execution counts"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_one_parameters_cell_then_the_study(path):
    nb = nbformat.read(str(path), as_version=4)
    tagged = [i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, f"{path.name}: {len(tagged)} cells tagged 'parameters'"
    cell = nb.cells[tagged[0]]
    assert cell.cell_type == "code"
    tree = ast.parse(cell.source)
    assigned = [t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets]
    expected = PARAMETERS[:-1] + EXTRA_PARAMETERS.get(path.stem, []) + PARAMETERS[-1:]
    assert assigned == expected
    values = {t.id: node.value for node in tree.body if isinstance(node, ast.Assign) for t in node.targets}
    assert ast.unparse(values["profile"]) == "os.environ.get('MIDAS_PROFILE', 'quick')"
    assert all(isinstance(values[k], ast.Constant) and values[k].value is None for k in expected[1:])
    # papermill sees the same names
    import papermill as pm
    assert list(pm.inspect_notebook(str(path))) == expected
    # the next code cell builds the study from every parameter and names the figures after the notebook
    nxt = next(c for c in nb.cells[tagged[0] + 1:] if c.cell_type == "code").source
    call = "Study(profile, data_root=data_root, data_roots=data_roots, dataset=dataset, backbone=backbone,"
    assert call in nxt and "weights=weights, backbone_kwargs=backbone_kwargs, depth=depth, budget=budget" in nxt
    assert "\n              aircraft_level=aircraft_level, builds=builds, build=build,\n" in nxt  # -p aircraft_level, builds, build
    # profile settings among the parameters go to the study too (05: other_backbones)
    tail = "".join(f", {k}={k}" for k in EXTRA_PARAMETERS.get(path.stem, []) if k != "compare_with")
    assert f"seeds=seeds,\n              device=device, precision=precision{tail})" in nxt
    assert f'viz.set_output("{path.stem}", output_dir, profile=profile)' in nxt


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_cells_import_only_midas_nb_and_os(path):
    nb = nbformat.read(str(path), as_version=4)
    asserts = 0
    for c in _code_cells(nb):
        tree = ast.parse(c.source)          # also rejects IPython magics and shell escapes
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                roots = {(node.module or "").split(".")[0]}
            else:
                continue
            assert roots <= {"midas_nb", "os"}, f"{path.name}: imports {roots}"
        asserts += sum(isinstance(n, ast.Assert) for n in ast.walk(tree))
    assert asserts >= 2, f"{path.name}: only {asserts} assert statements"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_figure_cells_end_without_a_figure_repr(path):
    """A cell that draws a figure assigns it (``fig = viz.x(...)``) instead of ending on it."""
    nb = nbformat.read(str(path), as_version=4)
    for c in _code_cells(nb):
        tree = ast.parse(c.source)
        if not tree.body:
            continue
        last = tree.body[-1]
        if isinstance(last, ast.Expr) and isinstance(last.value, ast.Call):
            name = ast.unparse(last.value.func)
            assert not (name.startswith("viz.") and name != "viz.taxonomy_table"), \
                f"{path.name}: cell ends on {name}(...), whose Figure would be shown twice"


# ---------------------------------------------------------------------------------------------
# execution
# ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_papermill_run_with_injected_parameters(tmp_path, monkeypatch):
    """Run 07 in the smoke profile with a non-default budget; read its saved tables back.

    07 recomputes the three-condition table at the injected budget, derives the deployment
    advice from it (the explorer is notebook 00's, not repeated here); both tables are written to the
    injected ``output_dir``."""
    import papermill as pm

    # the kernel starts in notebooks/ and inherits this environment: make the package
    # importable there even when it is not pip-installed
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    path = REPO / "notebooks" / "07_deployment_guide.ipynb"
    out_nb = tmp_path / path.name
    pm.execute_notebook(str(path), str(out_nb), parameters=dict(profile="smoke", budget=0.5,
                                                                  output_dir=str(tmp_path)),
                        cwd=str(path.parent), kernel_name="python3", progress_bar=False)
    from midas_nb.config import get_profile
    from midas_nb.metrics import decoupling_D
    smoke = get_profile("smoke")
    table = pd.read_csv(tmp_path / "07_deployment_guide_table.csv")
    assert set(table["budget"]) == {0.5}
    assert set(table["depth"]) == {smoke["depth"]}
    assert set(table["condition"]) == set(smoke["conditions"])
    assert set(table["seed"]) == set(smoke["seeds"])
    assert table["miou"].between(0, 1).all() and table["idauc"].between(-1, 1).all()
    advice = pd.read_csv(tmp_path / "07_deployment_guide_advice.csv").set_index("goal")
    assert set(advice["budget"]) == {0.5}
    # the coverage-first pick is the in-band condition with the largest D of the saved table
    D = decoupling_D(table)
    inside = D[D["in_band"]].sort_values(["D_pp", "idauc"], kind="stable")
    inside = inside[inside["status"] == "in band"] if (inside["status"] == "in band").any() else inside
    assert advice.loc["coverage-first", "condition"] == inside.iloc[-1]["condition"]
    assert advice.loc["coverage-first", "D_pp"] == pytest.approx(inside.iloc[-1]["D_pp"])
    # the faithfulness-first pick has the highest mean IDAUC (up to the 0.001 tie tolerance) among the
    # deployable conditions (the random ranking and the random_map control are never advised)
    best = table[~table["condition"].isin(["random", "random_map"])].groupby("condition")["idauc"].mean()
    assert best[advice.loc["faithfulness-first", "condition"]] >= best.max() - 1e-3
    assert not (tmp_path / "07_deployment_guide_explorer.png").exists()       # 00's explorer, not repeated
    executed = nbformat.read(str(out_nb), as_version=4)
    injected = [c for c in executed.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert len(injected) == 1 and "budget = 0.5" in injected[0].source


# ---------------------------------------------------------------------------------------------
# the explorer and the Study helpers the notebooks use
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("env, expected", [({"MIDAS_HEADLESS": "1"}, True), ({"MIDAS_HEADLESS": "0"}, False),
                                           ({"MIDAS_PROFILE": "smoke"}, True), ({}, True)])
def test_is_headless(monkeypatch, env, expected):
    from midas_nb.viz import widgets
    monkeypatch.delenv("MIDAS_HEADLESS", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    # no IPython kernel in pytest: headless unless MIDAS_HEADLESS says otherwise
    assert widgets.is_headless() is expected


def test_kept_mask_is_top_k():
    from midas_nb.viz import widgets
    scores = torch.tensor([[0.1, 0.9, 0.5, 0.3], [4.0, 3.0, 2.0, 1.0]])
    m = widgets.kept_mask(scores, 0.5)
    assert m.tolist() == [[False, True, True, False], [True, True, False, False]]
    assert widgets.kept_mask(scores, 0.3).sum(1).tolist() == [2, 2]          # ceil(0.3·4) = 2


@pytest.fixture(scope="module")
def smoke_study():
    from midas_nb.study import Study
    return Study("smoke", progress=False)


# the explorer itself: tests/test_widgets.py (Python) and tests/test_browser.py (JupyterLab)


@pytest.mark.slow
def test_target_coverage_matches_a_direct_computation(smoke_study):
    cov = smoke_study.target_coverage(ids=["T0", "T5"]).set_index("target")
    maps = smoke_study.target_maps(ids=["T5"])
    ds = smoke_study.test_set
    N = maps["T5"].shape[1]
    k = math.ceil(smoke_study.params["budget"] * N)
    ious = []
    for i in range(len(ds)):
        kept = set(torch.topk(maps["T5"][i], k).indices.tolist())
        parts = set(torch.nonzero(ds[i].part_mask).flatten().tolist())
        if parts:
            ious.append(len(kept & parts) / len(kept | parts))
    assert cov.loc["T5", "miou"] == pytest.approx(sum(ious) / len(ious), abs=1e-6)
    assert cov.loc["T5", "miou_lo"] <= cov.loc["T5", "miou"] <= cov.loc["T5", "miou_hi"]
    assert cov.loc["T0", "coverage_kind"] == "part mIoU"


@pytest.mark.slow
def test_point_in_box_of_a_target_is_its_top_patch_in_the_box(smoke_study):
    pib = smoke_study.point_in_box(ids=["T0"], n=10).set_index("ranking")
    maps = smoke_study.target_maps(ids=["T0"])["T0"]
    ds = smoke_study.test_set
    # the protocol's evaluated images (a seeded subset), the same images as related.last.pib_table
    images = evaluation_subset(len(ds), 10, smoke_study.params.get("eval_subset_seed", 0))
    assert len(images) == 10 and images != list(range(10))
    hits = [bool(ds[i].box_mask[int(maps[i].argmax())]) for i in images]
    assert pib.loc["T0", "pib"] == pytest.approx(sum(hits) / len(hits))
    ref = pib_table({"m": smoke_study.model}, ds, max_images=10, n_boot=smoke_study.params["bootstrap"],
                    progress=False)
    assert pib.loc["patch_score", "pib"] == ref.at[0, "pib"]
    assert 0.0 <= pib.loc["patch_score", "pib"] <= 1.0 and pib.loc["T0", "n_images"] == 10
    default = smoke_study.point_in_box(ids=["T0"])
    assert int(default["n_images"].iloc[0]) == min(len(ds), smoke_study.params["max_eval_images"] or len(ds))
