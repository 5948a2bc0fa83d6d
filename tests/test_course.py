"""Course edition: exercise checkers, notebook structure, strip-solutions, HTML export, browser.

Checkers are tested on hand-built contexts (tiny tensors and tables) whose right answers are
computed here by hand; the notebooks' reference solutions run under nbval (smoke profile).
"""
from __future__ import annotations

import ast
import base64
import io
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pandas as pd
import pytest
import torch
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from midas_nb import course
from midas_nb.course import EXERCISES, check_exercise, check_solution, export_html, strip_solutions

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
CHROMIUM = Path("/usr/bin/chromium")


# ------------------------------------------------------------------------------ contexts
class _Study(SimpleNamespace):
    """What the checkers read of a Study: grid, settings, test_set[i].part_mask."""


def _settings(budget=0.25, budgets=(0.1, 0.25, 0.5), depth=6, backbone="bb", bootstrap=1000):
    """The parts of :class:`midas_nb.study.RunSettings` the checkers read (mutable, for the tests)."""
    return SimpleNamespace(point=SimpleNamespace(depth=depth, budget=budget), sweep=SimpleNamespace(budgets=tuple(budgets)),
                           backbone=SimpleNamespace(name=backbone), statistics=SimpleNamespace(bootstrap=bootstrap),
                           protocol=SimpleNamespace(eval_subset_seed=0))


def _study(grid=(4, 4), budget=0.25, budgets=(0.1, 0.25, 0.5), part_masks=None):
    test_set = [SimpleNamespace(part_mask=m) for m in (part_masks or [])]
    return _Study(grid=grid, settings=_settings(budget, budgets), test_set=test_set)


def _table():
    # two seeds; reference idauc 0.50, T1 loses 0.05 (outside band), T5 gains coverage in band
    rows = []
    for seed in (0, 1):
        rows += [dict(condition="reference", seed=seed, miou=0.30, idauc=0.50),
                 dict(condition="unsupervised", seed=seed, miou=0.31 + 0.01 * seed, idauc=0.495),
                 dict(condition="T1", seed=seed, miou=0.40, idauc=0.45),
                 dict(condition="T5", seed=seed, miou=0.35, idauc=0.505)]
    return pd.DataFrame(rows)


def test_registry_has_two_to_four_exercises_per_notebook():
    for path in NOTEBOOKS:
        n = len(course.list_exercises(path.name[:2]))
        assert 2 <= n <= 4, f"{path.name}: {n} exercises"
    assert all(re.fullmatch(r"\d\d\.\w+", k) for k in EXERCISES)


def test_unanswered_exercise_is_false_and_silent(capsys):
    # an executed or HTML edition shows nothing under an unanswered question
    assert check_exercise("00.keep_count", None) is False      # no context needed for None
    assert capsys.readouterr().out == ""
    with pytest.raises(KeyError, match="unknown exercise"):
        check_exercise("00.no_such_exercise", 1)


def test_missing_context_is_reported_not_raised(capsys):
    assert check_exercise("00.keep_count", 3) is False
    assert "needs study=" in capsys.readouterr().out


def test_keep_count():
    s = _study(grid=(14, 14), budgets=(0.1, 0.25, 0.5))      # N = 196
    assert check_exercise("00.keep_count", 20, study=s)      # ceil(19.6)
    assert not check_exercise("00.keep_count", 19, study=s)
    assert not check_exercise("00.keep_count", 19.6, study=s)
    assert not check_exercise("00.keep_count", "20", study=s)


def test_iou_ceiling():
    part_mask = torch.zeros(2, 16, dtype=torch.bool)
    part_mask[0, :3] = True                                  # f = 3/32
    batch = SimpleNamespace(part_mask=part_mask)
    assert check_exercise("00.iou_ceiling", (3 / 32) / 0.10, batch=batch)
    assert check_exercise("00.iou_ceiling", 0.938, batch=batch)          # 0.9375 as printed to 3 decimals
    assert not check_exercise("00.iou_ceiling", 0.10 / (3 / 32), batch=batch)


def test_abs_t5_miou():
    t5 = torch.tensor([[-4.0, 1.0, 0.5, -0.1], [0.2, -3.0, 2.0, 0.0]])
    maps = {"T5": t5}
    # budget 0.5 of N=4 keeps 2: |T5| keeps {0,1} and {1,2}; parts {0} and {2,3} -> IoU 1/2 and 1/3
    parts = [torch.tensor([True, False, False, False]), torch.tensor([False, False, True, True])]
    s = _study(grid=(2, 2), budget=0.5, part_masks=parts)
    assert check_exercise("01.abs_t5_miou", (1 / 2 + 1 / 3) / 2, maps=maps, study=s)
    # the signed T5 would keep {1,2} and {2,3}: IoU 0 and 1 -> 0.5, which is wrong for |T5|
    assert not check_exercise("01.abs_t5_miou", 0.5, maps=maps, study=s)


def test_abs_t5_miou_matches_the_package_metric():
    """The checker's answer is midas_nb.metrics.part_miou of the top-k of |T5| at the study's budget (k = 4 of 16),
    with an image without parts left out (test_abs_t5_miou checks the same by hand)."""
    from midas_nb import metrics, pruning
    g = torch.Generator().manual_seed(0)
    t5 = torch.randn(6, 16, generator=g)
    parts = torch.rand(6, 16, generator=g) < 0.3
    parts[0] = False                                         # an image without parts is skipped
    s = _study(grid=(4, 4), budget=0.25, part_masks=list(parts))
    keep = pruning.keep_mask_from_indices(pruning.select_top_k(t5.abs(), 4), 16)
    assert check_exercise("01.abs_t5_miou", metrics.part_miou(keep, parts).mean, maps={"T5": t5}, study=s)


def test_best_target_accepts_ties():
    cov = pd.DataFrame(dict(target=["T0", "T5", "random"], miou=[0.4, 0.4, 0.1]))
    assert check_exercise("01.best_target", "T5", coverage=cov)
    assert check_exercise("01.best_target", "t0", coverage=cov)
    assert not check_exercise("01.best_target", "random", coverage=cov)


def test_which_is_best_accepts_every_condition_tied_within_noise():
    """Issue 52: 02.2 accepted only the highest mean while T2, T3 and T4 tied within noise. A "which is
    best" question now accepts every name whose interval overlaps the leader's, and rejects the others."""
    cov = pd.DataFrame(dict(target=["T2", "T3", "T4", "T0"], miou=[0.30, 0.32, 0.29, 0.10],
                            miou_lo=[0.26, 0.28, 0.25, 0.07], miou_hi=[0.34, 0.36, 0.33, 0.13]))
    for t in ("T2", "T3", "T4"):
        assert check_exercise("01.best_target", t, coverage=cov), t
    assert not check_exercise("01.best_target", "T0", coverage=cov)           # its interval lies below T3's
    D = pd.DataFrame(dict(condition=["T5"] * 3, backbone=["a", "b", "c"], D_pp=[2.0, 2.5, -3.0],
                          D_pp_lo=[0.5, 1.0, -4.0], D_pp_hi=[3.5, 4.0, -2.0]))
    assert check_exercise("05.best_backbone_T5", "a", D=D) and check_exercise("05.best_backbone_T5", "b", D=D)
    assert not check_exercise("05.best_backbone_T5", "c", D=D)
    res = SimpleNamespace(perturbation=pd.DataFrame(dict(target=["T0", "tokentm"], neg_minus_pos=[0.1, 0.3],
                                                         neg_minus_pos_lo=[0.0, 0.05], neg_minus_pos_hi=[0.2, 0.5])))
    assert check_exercise("06.best_separation", "T0", res=res)                 # [0, 0.2] overlaps [0.05, 0.5]
    ids = ["T0", "T3", "T5"]
    mean = pd.DataFrame([[1.0, 0.2, 0.6], [0.2, 1.0, 0.5], [0.6, 0.5, 1.0]], index=ids, columns=ids)
    lo, hi = mean - 0.15, mean + 0.15
    assert check_exercise("03.most_similar_pair", ("T3", "T5"), mean=mean, lo=lo, hi=hi)   # 0.5 ties with 0.6
    assert not check_exercise("03.most_similar_pair", ("T0", "T3"), mean=mean, lo=lo, hi=hi)


def test_a_number_typed_as_printed_is_accepted_and_a_wrong_one_rejected():
    """Issue 52: typing the printed 6.158 for 02.1 got "too high" (relative tolerance 1e-6). The D table
    prints D_pp to 3 decimals (results.compact); the value typed as printed is accepted, one unit off in
    its last decimal is not."""
    from midas_nb import results
    from midas_nb.metrics import decoupling_D
    table = _table().copy()
    table.loc[table["condition"] == "T5", "miou"] = 0.3615812          # D(T5) = 6.15812 pp
    D = decoupling_D(table)
    printed = results.compact(D, ["D_pp"], signed=["D_pp"]).loc["T5", "D_pp"]
    typed = float(printed.split()[0])
    assert typed == 6.158 and check_exercise("02.D_T5", typed, table=table)
    assert check_exercise("02.D_T5", 6.15812, table=table)                   # full precision as well
    assert not check_exercise("02.D_T5", 6.157, table=table) and not check_exercise("02.D_T5", 6.159, table=table)
    assert not check_exercise("02.D_T5", 6.16, table=table)                  # fewer decimals than printed


def test_at_least_half_of_the_exercises_are_reasoning():
    """Issue 52: about 13 of the 25 exercises were look-ups of a printed number; at least half are now why /
    what-if / predict-then-check questions (``kind == "reasoning"``, option letters computed from the run)."""
    kinds = [e.kind for e in EXERCISES.values()]
    assert set(kinds) <= {"look-up", "computation", "reasoning"}
    assert 2 * kinds.count("reasoning") >= len(kinds), kinds
    assert all((e.kind == "reasoning") == (e.compare.__name__ == "option") for e in EXERCISES.values())


def test_protocol_exercises_on_a_hand_built_table():
    table = _table()
    assert check_exercise("02.D_T5", 5.0, table=table)                   # 100·(0.35 − 0.30)
    assert not check_exercise("02.D_T5", 0.05, table=table)              # a fraction, not pp
    # coverage-first: in band {reference 0, unsupervised +1.5, T5 +5} -> T5
    assert check_exercise("07.coverage_first", "T5", table=table)
    assert not check_exercise("07.coverage_first", "T1", table=table)


def test_coverage_first_accepts_every_candidate_the_pick_ties_with():
    """Issue 52: a "which is best" question accepts every condition tied within noise; 07.coverage_first accepted
    only the advised condition although the advice names its in-band ties."""
    from test_verdict import _table as noisy_table
    from midas_nb.analysis import recommend_deployment
    # T4 and T5 cover 0.180 and 0.181 at parity (0.01 noise per image): a tie; T1 covers 0.12, resolvably less
    t = noisy_table({"reference": (0.10, 0.20), "T1": (0.12, 0.20), "T4": (0.180, 0.20), "T5": (0.181, 0.20)})
    adv = recommend_deployment(t)[0].set_index("goal").loc["coverage-first"]
    assert adv["status"] == "in band" and {adv["condition"], adv["ties"]} == {"T4", "T5"}
    assert check_exercise("07.coverage_first", "T4", table=t) and check_exercise("07.coverage_first", "T5", table=t)
    assert not check_exercise("07.coverage_first", "T1", table=t)


def _D(D_pp, lo, hi, delta=(0.0, -0.005, -0.05, 0.005), delta_lo=(0.0, -0.008, -0.07, -0.02)):
    return pd.DataFrame(dict(condition=["reference", "unsupervised", "T1", "T5"], D_pp=D_pp, D_pp_lo=lo, D_pp_hi=hi,
                             delta_idauc=delta, delta_idauc_lo=delta_lo, delta_idauc_hi=[0.0, -0.002, -0.03, 0.03]))


def test_D_leaders_resolved_or_tied():
    apart = _D([0.0, 1.5, 10.0, 5.0], [0.0, 0.5, 8.0, 3.0], [0.0, 2.5, 12.0, 7.0])      # T1 above every other
    assert check_exercise("02.D_leaders", "a", D=apart) and not check_exercise("02.D_leaders", "b", D=apart)
    tied = _D([0.0, 1.5, 10.0, 9.0], [0.0, 0.5, 8.0, 7.5], [0.0, 2.5, 12.0, 10.5])     # T5 overlaps T1
    assert check_exercise("02.D_leaders", "b", D=tied) and not check_exercise("02.D_leaders", "a", D=tied)
    # the random_map control is no candidate: its interval may overlap without making a tie
    ctrl = pd.concat([apart, pd.DataFrame(dict(condition=["random_map"], D_pp=[9.0], D_pp_lo=[7.0], D_pp_hi=[11.0]))])
    assert check_exercise("02.D_leaders", "a", D=ctrl)


def test_mean_vs_interval():
    D = _D([0.0, 1.5, 10.0, 5.0], [0.0, 0.5, 8.0, 3.0], [0.0, 2.5, 12.0, 7.0])
    # unsupervised: mean −0.005, interval lower end −0.008 (resolved); T5: mean +0.005, lower end −0.02
    assert check_exercise("02.mean_vs_interval", "b", D=D) and not check_exercise("02.mean_vs_interval", "a", D=D)
    agree = D.assign(delta_idauc_lo=[0.0, -0.008, -0.07, 0.001])
    assert check_exercise("02.mean_vs_interval", "a", D=agree)
    none = D.assign(delta_idauc=[0.0, -0.05, -0.05, -0.02])
    assert check_exercise("02.mean_vs_interval", "c", D=none) and not check_exercise("02.mean_vs_interval", "b", D=none)


def test_cosine_exercises():
    ids = ["T0", "T3", "T5"]
    mean = pd.DataFrame([[1.0, 0.2, 0.6], [0.2, 1.0, 0.05], [0.6, 0.05, 1.0]], index=ids, columns=ids)
    lo, hi = mean - 0.02, mean + 0.02
    assert check_exercise("03.most_similar_pair", ("T5", "T0"), mean=mean, lo=lo, hi=hi)
    assert not check_exercise("03.most_similar_pair", ("T0", "T0"), mean=mean, lo=lo, hi=hi)
    assert not check_exercise("03.most_similar_pair", ("T0", "T3"), mean=mean, lo=lo, hi=hi)
    for (a, b), pick in (((0.03, 0.07), "a"), ((0.1, 0.3), "b"), ((-0.3, -0.1), "b"), ((0.05, 0.12), "c")):
        lo.loc["T5", "T3"], hi.loc["T5", "T3"] = a, b
        for letter in "abc":
            assert check_exercise("03.t5_t3_vs_paper", letter, mean=mean, lo=lo, hi=hi) == (letter == pick), (a, b)


def test_band_exercises_agree_with_decoupling_D_status_at_the_edges():
    """The in-band exercises count what decoupling_D's status says, also where a plain
    ``delta_idauc_lo >= -0.01`` does not: ΔIDAUC = −0.01 on every image (−0.01 − 9e-18 in
    floating point: in band by the metric's tolerance) and a row whose D is undefined (its
    interval is inside, its status "undefined"). The notebook 04 solution failed on the first."""
    from midas_nb.metrics import decoupling_D
    ref, ids, rows = [0.30, 0.20, 0.40, 0.10], ["a", "b", "c", "d"], []
    for cond, miou, idauc in (("reference", 0.30, ref), ("T5", 0.35, [x - 0.01 for x in ref]),
                              ("T1", 0.32, [ref[0] + 0.05, ref[1] - 0.08, ref[2] + 0.04, ref[3] - 0.05]),
                              ("unsupervised", 0.31, [x + 0.02 for x in ref]),
                              ("T4", math.nan, [x + 0.02 for x in ref])):
        rows.append(dict(dataset="d", backbone="b", depth=2, budget=0.25, condition=cond, seed=0, miou=miou,
                         idauc=sum(idauc) / 4, image_ids=ids, idauc_image_ids=ids, miou_per_image=[miou] * 4,
                         idauc_per_image=idauc))
    D = decoupling_D(pd.DataFrame(rows), n_boot=200)
    status = dict(zip(D["condition"], D["status"]))
    assert status == {"reference": "in band", "T5": "in band", "T1": "not resolved", "unsupervised": "in band",
                      "T4": "undefined"}
    naive = set(D.loc[D["delta_idauc_lo"] >= -0.01, "condition"])
    assert "T5" not in naive and "T4" in naive                   # the float edge and the undefined row
    assert check_exercise("04.T5_cells_in_band", 1, D=D)         # T5's one cell is in band
    assert not check_exercise("04.T5_cells_in_band", 0, D=D)


def test_sweep_and_scale_exercises():
    # T5: cell a resolved in band, b outside, c's interval straddles −0.01 (point: in band)
    D = pd.DataFrame(dict(condition=["T5", "T5", "T5", "T1"], backbone=["a", "b", "c", "a"],
                          in_band=[True, False, True, True], D_pp=[1.5, -2.0, 3.0, 9.0],
                          delta_idauc=[0.01, -0.03, 0.0, 0.02], delta_idauc_lo=[-0.005, -0.05, -0.04, 0.0],
                          delta_idauc_hi=[0.02, -0.02, 0.04, 0.04]))
    assert check_exercise("04.T5_cells_in_band", 1, D=D)
    assert not check_exercise("04.T5_cells_in_band", 2, D=D)                    # the point decision
    assert check_exercise("05.best_backbone_T5", "c", D=D)
    assert not check_exercise("05.best_backbone_T5", "a", D=D)


def test_related_exercises():
    res = SimpleNamespace(perturbation=pd.DataFrame(dict(target=["T0", "tokentm"], neg_minus_pos=[0.1, 0.3])))
    assert check_exercise("06.best_separation", "tokentm", res=res)
    assert not check_exercise("06.best_separation", "T0", res=res)
    pib = pd.DataFrame(dict(ranking=["patch_score", "T0"], pib=[0.9, 0.75], n_images=[4, 4]))
    assert check_exercise("06.pib_T0", 3 / 4, pib=pib)
    assert not check_exercise("06.pib_T0", 0.9, pib=pib)


# ------------------------------------------------------------------------ notebook structure
def _tags(cell) -> list[str]:
    return cell.metadata.get("tags", [])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_has_objectives_and_checked_exercises(path):
    nb = nbformat.read(str(path), as_version=4)
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")
    lo = nb.cells[1]
    assert "learning-objectives" in _tags(lo) and "**Prerequisite:**" in lo.source
    assert re.search(r"\*\*Time:\*\* about \d+ min", lo.source)           # issue 52: a time estimate per notebook
    assert 3 <= sum(line.startswith("* ") for line in lo.source.splitlines()) + 1 <= 6
    names = course.list_exercises(path.name[:2])
    solutions = [c for c in nb.cells if "solution" in _tags(c)]
    assert len(solutions) == len(names)
    for name in names:
        student = [c for c in nb.cells if "exercise" in _tags(c) and c.cell_type == "code" and f'"{name}"' in c.source
                   and "answer = None" in c.source]
        assert len(student) == 1
        # the prompt: a Markdown cell, or — for an exercise a run may not be able to answer (e.g. one
        # backbone) — a code cell that shows it through show_exercise, only where it applies
        head = f"**Exercise {course.exercise_label(name)}** (`{name}`). "
        if EXERCISES[name].applies is None:
            prompt = [c for c in nb.cells if c.cell_type == "markdown" and "exercise" in _tags(c) and head in c.source]
            # the question's one copy (the registry holds none: issue 54) and its option letters, as checked
            assert len(prompt) == 1 and prompt[0].source.startswith(head) and not EXERCISES[name].prompt, name
            if EXERCISES[name].kind == "reasoning":
                options = re.findall(r"^\* \((\w)\) ", prompt[0].source, re.M)
                assert len(options) >= 2 and options == list("abcde"[:len(options)]), name
        else:
            prompt = [c for c in nb.cells if c.cell_type == "code" and "exercise" in _tags(c)
                      and f'show_exercise("{name}"' in c.source]
            assert len(prompt) == 1, name
        sol = [c for c in solutions if f'"{name}"' in c.source]
        assert len(sol) == 1 and sol[0].metadata["jupyter"]["source_hidden"] is True
        last = ast.parse(sol[0].source).body[-1]
        assert isinstance(last, ast.Expr) and ast.unparse(last.value).startswith(f"check_solution('{name}', answer")
        # every keyword the checker needs is passed from the notebook
        call = last.value
        assert {kw.arg for kw in call.keywords} == set(EXERCISES[name].needs)
    # exercises come after every other cell (appended), the last cell is a solution
    first_ex = next(i for i, c in enumerate(nb.cells) if "exercise" in _tags(c))
    assert all(set(_tags(c)) & {"exercise", "solution"} for c in nb.cells[first_ex:])


# ------------------------------------------------------------------------------- stripping
def test_strip_solutions_default_and_explicit_paths(tmp_path):
    src = tmp_path / "00_quickstart.ipynb"
    shutil.copy(NOTEBOOKS[0], src)
    n_solutions = sum("solution" in _tags(c) for c in nbformat.read(str(src), as_version=4).cells)
    assert strip_solutions(src) == n_solutions > 0
    student = nbformat.read(str(tmp_path / "student" / src.name), as_version=4)
    nbformat.validate(student)
    assert not any("solution" in _tags(c) for c in student.cells)
    assert sum("parameters" in _tags(c) for c in student.cells) == 1
    assert len(student.cells) == len(nbformat.read(str(src), as_version=4).cells) - n_solutions
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    assert strip_solutions(src, out_dir) == n_solutions and (out_dir / src.name).is_file()
    assert strip_solutions(src, src) == n_solutions                       # in place
    assert strip_solutions(src, src) == 0                                 # idempotent
    with pytest.raises(FileNotFoundError):
        strip_solutions(tmp_path / "missing.ipynb")


def test_cli_strip_solutions(tmp_path, capsys):
    from midas_nb.cli import main
    src = tmp_path / "01_supervision_targets.ipynb"
    shutil.copy(NOTEBOOKS[1], src)
    assert main(["strip-solutions", str(src)]) == 0
    assert "solution cell(s) removed" in capsys.readouterr().out
    assert (tmp_path / "student" / src.name).is_file()


@pytest.mark.slow
def test_stripped_notebook_still_runs(tmp_path, monkeypatch):
    """The student edition of 00 runs in the smoke profile; unanswered checks print nothing."""
    import papermill as pm
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    monkeypatch.setenv("MIDAS_PROFILE", "smoke")
    strip_solutions(NOTEBOOKS[0], tmp_path / NOTEBOOKS[0].name)
    out = tmp_path / "executed.ipynb"
    pm.execute_notebook(str(tmp_path / NOTEBOOKS[0].name), str(out), parameters=dict(profile="smoke",
                        output_dir=str(tmp_path)), cwd=str(REPO / "notebooks"), kernel_name="python3",
                        progress_bar=False)
    text = "".join(o.get("text", "") for c in nbformat.read(str(out), as_version=4).cells
                   if c.cell_type == "code" for o in c.outputs)
    assert "✗" not in text and "✓" not in text


# ------------------------------------------------------------------------------- HTML export
def _png_b64() -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(2, 1.5))
    ax.plot([0, 1, 2], [0, 1, 0])
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def executed_dir(tmp_path_factory):
    """Three executed notebooks: 00 run by nbclient (a matplotlib PNG), 01/02 hand-built."""
    from nbclient import NotebookClient
    d = tmp_path_factory.mktemp("executed")
    nb = new_notebook(cells=[new_markdown_cell("# Zero · first steps\n\ntext"),
                             new_code_cell("%matplotlib inline\nimport matplotlib.pyplot as plt\nfig, ax = plt.subplots(figsize=(2, 1.5))\n"
                                           "ax.plot([0, 1, 2], [0, 1, 0])\nplt.show()")],
                      metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(d)}}).execute()
    nbformat.write(nb, str(d / "00_first.ipynb"))
    for i, title in ((1, "One · the middle"), (2, "Two · the end")):
        cell = new_code_cell("fig", execution_count=1,
                             outputs=[new_output("display_data", data={"image/png": _png_b64(), "text/plain": "<Figure>"})])
        sol = new_code_cell("# reference-solution-marker", execution_count=2, metadata={"tags": ["solution"]})
        nbformat.write(new_notebook(cells=[new_markdown_cell(f"intro\n\n## {title}"), cell, sol]),
                       str(d / f"0{i}_page.ipynb"))
    nbformat.write(new_notebook(cells=[new_code_cell("1")]), str(d / "03_never_run.ipynb"))   # not executed
    return d


@pytest.fixture(scope="module")
def html_dir(executed_dir):
    with pytest.warns(UserWarning, match="03_never_run"):
        index = export_html(executed_dir)
    assert index == executed_dir / "html" / "index.html"
    return index.parent


def test_export_pages_titles_links_and_images(html_dir):
    pages = ["00_first.html", "01_page.html", "02_page.html"]
    assert sorted(p.name for p in html_dir.glob("*.html")) == sorted(pages + ["index.html"])
    index = (html_dir / "index.html").read_text()
    hrefs = re.findall(r'<li><a href="([^"]+)">([^<]+)</a>', index)
    assert hrefs == [("00_first.html", "Zero · first steps"), ("01_page.html", "One · the middle"),
                     ("02_page.html", "Two · the end")]
    for i, name in enumerate(pages):
        text = (html_dir / name).read_text()
        prev = re.findall(r'class="midas-prev" rel="prev" href="([^"]+)"', text)
        nxt = re.findall(r'class="midas-next" rel="next" href="([^"]+)"', text)
        assert prev == ([pages[i - 1]] * 2 if i > 0 else [])               # top and bottom bars
        assert nxt == ([pages[i + 1]] * 2 if i + 1 < len(pages) else [])
        assert text.count('href="index.html"') == 2
        pngs = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=\s]+)"', text)
        assert pngs and base64.b64decode(re.sub(r"\s", "", pngs[0]))[:8] == b"\x89PNG\r\n\x1a\n"
    assert "reference-solution-marker" in (html_dir / "01_page.html").read_text()        # solutions kept by default


def test_an_exported_figures_alt_text_is_its_title(tmp_path, monkeypatch):
    """Issue 52: every image of the HTML edition had nbconvert's alt text "No description has been
    provided for this image". A figure finished by midas_nb.viz in a notebook carries its title as the
    image's alt metadata, and the export writes it as the alt text; an image without it keeps nbconvert's."""
    from nbclient import NotebookClient
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    code = ("%matplotlib inline\nimport matplotlib.pyplot as plt\nfrom midas_nb.viz import finish_figure\n"
            "fig, ax = plt.subplots(figsize=(2, 1.5))\nax.plot([0, 1], [1, 0])\n{}\nfig = finish_figure(fig, None)")
    nb = new_notebook(cells=[new_markdown_cell("# Alt"), new_code_cell(code.format("fig.suptitle('D & <b>')")),
                             new_code_cell(code.format("ax.set_title('left'); ax.set_xlabel('x')")),
                             new_code_cell("plt.plot([0, 1]); plt.title('plain pyplot'); plt.show()")],
                      metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    assert [len(c.outputs) for c in nb.cells[1:]] == [1, 1, 1]                  # each figure shown once
    nbformat.write(nb, str(tmp_path / "00_alt.ipynb"))
    page = (export_html(tmp_path).parent / "00_alt.html").read_text()
    alts = re.findall(r'<img [^>]*alt="([^"]*)"', page)
    assert alts == ["D &amp; &lt;b&gt;", "left", "No description has been provided for this image"], alts


def test_export_can_strip_solutions_and_rejects_empty_dirs(executed_dir, tmp_path):
    index = export_html(executed_dir, tmp_path / "student_html", strip_solutions=True)
    assert "reference-solution-marker" not in (index.parent / "01_page.html").read_text()
    with pytest.raises(FileNotFoundError, match="no executed notebook"):
        export_html(tmp_path / "empty")


def test_export_marks_a_notebook_that_stopped_with_an_error(tmp_path):
    ok = new_code_cell("1", execution_count=1, outputs=[new_output("execute_result", data={"text/plain": "1"},
                                                                   execution_count=1)])
    bad = new_code_cell("raise ValueError('no data')", execution_count=1,
                        outputs=[new_output("error", ename="ValueError", evalue="no data", traceback=[])])
    nbformat.write(new_notebook(cells=[new_markdown_cell("# Fine"), ok]), str(tmp_path / "00_fine.ipynb"))
    nbformat.write(new_notebook(cells=[new_markdown_cell("# Broken"), bad]), str(tmp_path / "01_broken.ipynb"))
    with pytest.warns(UserWarning, match=r"01_broken.ipynb stopped with an error \(ValueError: no data\)"):
        index = export_html(tmp_path)
    items = re.findall(r"<li>(.*?)</li>", index.read_text())
    assert len(items) == 2 and "failed" not in items[0]
    assert 'class="midas-failed">failed: ValueError: no data</strong>' in items[1]


# ---------------------------------------------------------------------------------- browser
_PROBE = ("<script>window.addEventListener('load', function () {"
          "var imgs = Array.prototype.slice.call(document.images);"
          "var ok = imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length;"
          "var links = Array.prototype.map.call(document.querySelectorAll('a[href]'), function (a) {"
          " return a.getAttribute('href'); }).join(' ');"
          "document.body.setAttribute('data-images-decoded', String(ok));"
          "document.body.setAttribute('data-images', String(imgs.length));"
          "document.body.setAttribute('data-links', links); });</script>")


def _chromium(args: list[str], user_dir: Path) -> subprocess.CompletedProcess:
    cmd = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-quic", "--no-first-run", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={user_dir}", "--virtual-time-budget=5000", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(not CHROMIUM.is_file(), reason="headless Chromium not installed at /usr/bin/chromium "
                    "(Debian packages chromium and chromium-driver; .ci/run installs them)")
def test_html_edition_in_headless_chromium(html_dir, tmp_path):
    site = tmp_path / "site"
    shutil.copytree(html_dir, site)
    for page in site.glob("*.html"):                         # the probe goes only into this test copy
        page.write_text(page.read_text().replace("</body>", _PROBE + "</body>", 1))
    doms = {}
    for name in ("index.html", "01_page.html"):
        r = _chromium(["--dump-dom", (site / name).as_uri()], tmp_path / "profile")
        assert r.returncode == 0, r.stderr[-2000:]
        doms[name] = r.stdout
    # the contents page shows every title and links to pages that exist
    for title in ("Zero · first steps", "One · the middle", "Two · the end"):
        assert title in doms["index.html"]
    for name, dom in doms.items():
        links = re.search(r'data-links="([^"]*)"', dom)
        assert links, f"{name}: the probe did not run"
        local = [h for h in links.group(1).split() if not re.match(r"^[a-z]+:|^#", h)]
        assert local, f"{name}: no links between pages"
        missing = [h for h in local if not (site / h.split("#")[0]).is_file()]
        assert not missing, f"{name}: broken links {missing}"
    # the notebook page decoded its figure
    decoded = int(re.search(r'data-images-decoded="(\d+)"', doms["01_page.html"]).group(1))
    assert decoded >= 1 and "One · the middle" in doms["01_page.html"]
    shot = tmp_path / "shot.png"
    r = _chromium([f"--screenshot={shot}", "--window-size=1200,900", (site / "index.html").as_uri()],
                  tmp_path / "profile2")
    assert r.returncode == 0 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 1000


def test_a_question_has_one_copy():
    """Issue 54: every prompt was in the registry and, verbatim, in its notebook; the registry now holds only
    the prompts show_exercise shows (an exercise with an applies test), and refuses any other."""
    from midas_nb.course.exercises import _core
    with pytest.raises(ValueError, match="a prompt goes with an applies test"):
        _core.register("99.copy", "a hint", _core.number, lambda: 1.0, prompt="the notebook's question again")
    with pytest.raises(ValueError, match="a prompt goes with an applies test"):
        _core.register("99.silent", "a hint", _core.number, lambda: 1.0, applies=lambda: None)
    assert not {"99.copy", "99.silent"} & set(EXERCISES)
    assert [n for n, e in EXERCISES.items() if e.prompt] == [n for n, e in EXERCISES.items() if e.applies] == [
        "04.budget_fall", "05.best_backbone_T5", "05.spread_resolved"]


def test_check_solution_prints_nothing_and_raises_on_a_wrong_solution(capsys):
    s = _study(grid=(14, 14), budgets=(0.1, 0.25, 0.5))      # N = 196
    check_solution("00.keep_count", 20, study=s)               # ceil(0.1 · 196) = 20
    assert capsys.readouterr().out == ""
    with pytest.raises(AssertionError, match="reference solution of 00.keep_count disagrees"):
        check_solution("00.keep_count", 19, study=s)


def test_solution_cells_reveal_nothing():
    # the solution cells call the silent check_solution, never check_exercise (which prints the answer)
    for path in NOTEBOOKS:
        nb = nbformat.read(str(path), as_version=4)
        for c in nb.cells:
            if "solution" in _tags(c):
                assert "check_exercise(" not in c.source and "check_solution(" in c.source, path.name


def test_export_collapses_solutions_and_heads_the_index_with_the_run(tmp_path):
    import pandas as pd
    from midas_nb.analysis import synthesis
    claims = pd.DataFrame([["T1 covers less than the reference", "D(T1) < 0", "D(T1) = +9.1 pp", "opposite of the paper"],
                           ["two different winners", "coverage-first ≠ faithfulness-first", "not resolved", "not resolved"]],
                          columns=["claim", "paper", "this run", "verdict"])
    out = new_code_cell("print(box)", execution_count=1, outputs=[new_output(
        "stream", name="stdout", text="(a) parity: ...\nThis run does not show a decoupling: (b) no two resolved "
                                      "winners.\n" + synthesis.box(["a sentence"], claims, False) + "\n")])
    sol = new_code_cell("answer = 42  # solution-code", execution_count=2, metadata={"tags": ["solution"]},
                        outputs=[new_output("stream", name="stdout", text="solution-output\n")])
    made = {"papermill": {"output_path": str(tmp_path / ".partial" / "r1" / "02_two.ipynb"),   # a run's copy
                          "start_time": "1970-01-01T00:00:00+00:00",
                          "parameters": {"profile": "quick", "data_root": "/x/cub200_subset"}}}
    nbformat.write(new_notebook(cells=[new_markdown_cell("# Two"), out, sol], metadata=made),
                   str(tmp_path / "02_two.ipynb"))
    (tmp_path / "report").mkdir()
    (tmp_path / "report" / "REPORT.md").write_text("# report\n")
    index = export_html(tmp_path)
    page = (index.parent / "02_two.html").read_text()
    assert "<details><summary>Reference solution (click to expand)</summary>" in page
    assert "solution-code" in page and "solution-output" not in page          # code behind a fold, no output
    head = index.read_text()
    assert "Run <code>r1</code> of 1970-01-01 00:00 UTC" in head and "cub200_subset" in head
    # the closing box's short headline and its per-claim table, not the verdict's own last line
    assert ("Headline:</strong> This run does not show a decoupling — 2 of the paper&#x27;s 9 claims (T1, winners; not "
            "in this table: T5 parity, cosines, depth, budget, scale, co-movement, T5&#x27;s content): 1 opposite of the "
            "paper, 1 not resolved.") in head
    assert "| T1 covers less than the reference | D(T1) &lt; 0 | D(T1) = +9.1 pp | opposite of the paper |" in head
    assert "no two resolved winners" not in head and "a sentence" not in head
    assert 'href="../report/REPORT.md"' in head and str(tmp_path) not in head   # no local folder named
    # a run over several datasets: <run>/<dataset>/ beside <run>/report; the link finds it
    ds_dir = tmp_path / "run" / "cub"
    ds_dir.mkdir(parents=True)
    (ds_dir / "02_two.ipynb").write_bytes((tmp_path / "02_two.ipynb").read_bytes())
    (tmp_path / "run" / "report").mkdir()
    (tmp_path / "run" / "report" / "REPORT.md").write_text("# report\n")
    assert 'href="../../report/REPORT.md"' in export_html(ds_dir).read_text()
    # a run on the embedded synthetic set: its caveat heads the contents page too (a reader saw the headline
    # there without it)
    assert "embedded synthetic" not in head
    note = ("Data: the embedded synthetic CUB-format set (no data root given): 8 cartoon bird classes ... "
            "rising together is expected here and says nothing about real photos.")
    out.outputs[0]["text"] = note + "\n" + out.outputs[0]["text"]
    nbformat.write(new_notebook(cells=[out], metadata=made), str(ds_dir / "02_two.ipynb"))
    assert f"<p><strong>{note}</strong></p>" in export_html(ds_dir).read_text()


# ------------------------------------------------------------------ why / what-if exercises
def test_option_answers_are_letters(capsys):
    mask = torch.zeros(1, 20, dtype=torch.bool)
    mask[0, :1] = True                                          # f = 5 %
    assert check_exercise("00.ceiling_what_if", "b", coverage_mask=mask)
    assert check_exercise("00.ceiling_what_if", "(B)", coverage_mask=mask)
    assert "ceiling is 0.500 at b = 10 % and 0.100 at b = 50 %" in capsys.readouterr().out
    assert not check_exercise("00.ceiling_what_if", "a", coverage_mask=mask)
    assert "is not what this run shows" in capsys.readouterr().out
    assert not check_exercise("00.ceiling_what_if", "e", coverage_mask=mask)
    assert "option letters" in capsys.readouterr().out
    assert not check_exercise("00.ceiling_what_if", 1, coverage_mask=mask)


def test_ceiling_what_if_follows_the_part_fraction():
    # f = 5 %: b = 10 % → 0.5, b = 50 % → 0.1 (falls); f = 60 %: 1/6 → 5/6 (rises);
    # f = 20 %: 0.5 → 0.4 (falls: 50 % is further from f as a ratio); f = √5 % ≈ 22.4 %: equal
    for n_part, n, pick in ((1, 20, "b"), (12, 20, "a"), (4, 20, "b"), (3, 10, "a")):
        mask = torch.zeros(1, n, dtype=torch.bool)
        mask[0, :n_part] = True
        for letter in "abc":
            assert check_exercise("00.ceiling_what_if", letter, coverage_mask=mask) == (letter == pick), (n_part, n)


def test_abs_t5_sign_pairs_the_images():
    # four images, N = 4, budget 0.25 (k = 1); parts at token 0. T5 ranks token 1 first (positive, off
    # the part) while token 0 holds a large negative value: |T5| keeps the part, T5 never does
    t5 = torch.tensor([[-5.0, 1.0, 0.1, 0.0]] * 4)
    parts = [torch.tensor([True, False, False, False])] * 4
    s = _study(grid=(2, 2), budget=0.25, part_masks=parts)
    assert check_exercise("01.abs_t5_sign", "a", maps={"T5": t5}, study=s)           # IoU 1 vs 0 on every image
    assert not check_exercise("01.abs_t5_sign", "c", maps={"T5": t5}, study=s)
    # the negative token off the parts and the positive one on them: the sign points at the parts
    t5b = torch.tensor([[1.0, -5.0, 0.1, 0.0]] * 4)
    assert check_exercise("01.abs_t5_sign", "b", maps={"T5": t5b}, study=s)
    # one image of each kind: +1 and −1 → the interval contains 0
    t5c = torch.cat([t5[:2], t5b[:2]])
    assert check_exercise("01.abs_t5_sign", "c", maps={"T5": t5c}, study=s)
    assert not check_exercise("01.abs_t5_sign", "a", maps={"T5": t5c}, study=s)


def _vs_targets(lo, hi, t5_scorer=(0.3, 0.28, 0.32), t5_own=0.2):
    """T1's scorer covers 0.25 [0.23, 0.27]; the T5 scorer ``t5_scorer`` (mean, lo, hi); the control 0.19."""
    return pd.DataFrame(dict(target=["T1", "T5"], target_miou=[0.3, t5_own], scorer_miou=[0.25, t5_scorer[0]],
                             scorer_miou_lo=[0.23, t5_scorer[1]], scorer_miou_hi=[0.27, t5_scorer[2]],
                             control_miou=[0.19, 0.19], gain_over_control=[-0.01, (lo + hi) / 2],
                             gain_over_control_lo=[-0.03, lo], gain_over_control_hi=[0.01, hi]))


def test_scorer_vs_control_reads_the_paired_gain():
    def accepted(vs):
        return {x for x in "abcde" if check_exercise("02.scorer_vs_control", x, vs_targets=vs)}
    assert accepted(_vs_targets(0.01, 0.07)) == {"a"}                          # content: above control and T1
    # issue 52: above the control, but T5's own map covers no more than the control (0.059 vs 0.058 there)
    assert accepted(_vs_targets(0.01, 0.07, t5_own=0.18)) == {"b"}
    assert accepted(_vs_targets(0.01, 0.07, t5_scorer=(0.27, 0.24, 0.30))) == {"b"}   # tied with T1's scorer
    assert accepted(_vs_targets(-0.02, 0.07)) == {"c"}                         # not separated from the control
    assert accepted(_vs_targets(-0.05, -0.01)) == {"d"}
    assert accepted(_vs_targets(math.nan, math.nan)) == {"e"}
    assert accepted(pd.DataFrame()) == {"e"}


def test_scorer_vs_control_on_targets_vs_scorers():
    """On the real function's output: a T5 scorer that covers 0.1 more than the control on every image."""
    from midas_nb.analysis import targets_vs_scorers
    ids = [f"i{k}" for k in range(6)]
    rows = [dict(condition=c, seed=0, dataset="d", backbone="b", depth=2, budget=0.25, image_ids=ids,
                 miou_per_image=[m + 0.01 * k for k in range(6)], miou=m)
            for c, m in (("reference", 0.3), ("T5", 0.4), ("random_map", 0.3))]
    cov = pd.DataFrame([dict(target="T5", miou=0.35, image_ids=ids, miou_per_image=[0.35] * 6)])
    vs, _ = targets_vs_scorers(cov, pd.DataFrame(rows), n_boot=200)
    assert check_exercise("02.scorer_vs_control", "a", vs_targets=vs)
    own_below = cov.assign(miou=0.2, miou_per_image=[[0.2] * 6])                 # T5's own map under the control
    vs, _ = targets_vs_scorers(own_below, pd.DataFrame(rows), n_boot=200)
    assert check_exercise("02.scorer_vs_control", "b", vs_targets=vs)
    vs, _ = targets_vs_scorers(cov, pd.DataFrame(rows[:2]), n_boot=200)         # without the control
    assert check_exercise("02.scorer_vs_control", "e", vs_targets=vs)


def test_hidden_vs_attention_from_the_intervals():
    def hv(los, his):
        return pd.DataFrame(dict(hidden=["T5", "T5", "T4", "T4"], attention=["T3", "T2", "T3", "T2"],
                                 cosine=[(a + b) / 2 for a, b in zip(los, his)], lo=los, hi=his))
    zero = hv([-0.1] * 4, [0.1] * 4)
    assert check_exercise("03.hidden_vs_attention", "a", hv=zero)
    assert not check_exercise("03.hidden_vs_attention", "b", hv=zero)
    neg = hv([-0.1, -0.1, -0.1, -0.2], [0.1, 0.1, 0.1, -0.01])
    assert check_exercise("03.hidden_vs_attention", "c", hv=neg)
    assert not check_exercise("03.hidden_vs_attention", "a", hv=neg)
    both = hv([0.05, -0.1, -0.1, -0.2], [0.2, 0.1, 0.1, -0.01])
    assert check_exercise("03.hidden_vs_attention", "b", hv=both) and check_exercise("03.hidden_vs_attention", "c", hv=both)
    assert not check_exercise("03.hidden_vs_attention", "a", hv=both)


def _sweep_D(d_near, ci_near, d_far, ci_far, L=2):
    return pd.DataFrame(dict(condition=["T5", "T5", "T5", "T1"], depth=[L, L, L + 1, L], budget=[0.1, 0.5, 0.1, 0.1],
                             D_pp=[d_near, d_far, 9.0, 1.0], D_pp_lo=[d_near - ci_near, d_far - ci_far, 8.0, 0.0],
                             D_pp_hi=[d_near + ci_near, d_far + ci_far, 10.0, 2.0],
                             status=["in band"] * 4))


def test_budget_fall_against_the_ceiling():
    s = _study(grid=(4, 4), budgets=(0.1, 0.5))
    s.settings.point.depth = 2
    ceiling = pd.DataFrame(dict(budget=[0.1, 0.5], ceiling=[0.6, 0.2]))
    cases = [((6.0, 1.0, 2.5, 0.5), "b"),        # shares 0.10 → 0.125: the ceiling's fall
             ((6.0, 1.0, 0.5, 0.5), "c"),        # 0.10 → 0.025: more than the ceiling
             ((6.0, 1.0, 5.5, 1.0), "a"),        # intervals overlap: no resolved fall
             ((-2.0, 0.5, -6.0, 0.5), "c")]      # D not positive at the tightest budget
    for args, pick in cases:
        mine = _sweep_D(*args)
        for letter in "abc":
            assert check_exercise("04.budget_fall", letter, mine=mine, ceiling=ceiling, study=s) == (letter == pick), args
    # one budget at the study's depth: not asked, the solution has nothing to verify
    one = _sweep_D(6.0, 1.0, 2.5, 0.5).iloc[[0, 2, 3]]
    assert "needs T5 at ≥ 2 budgets" in course.not_applicable("04.budget_fall", mine=one, ceiling=ceiling, study=s)
    check_solution("04.budget_fall", "a", mine=one, ceiling=ceiling, study=s)


def _scale_D(rows):
    return pd.DataFrame([dict(dataset="d", backbone=b, condition=c, D_pp=m, D_pp_lo=lo, D_pp_hi=hi, status=st)
                         for b, c, m, lo, hi, st in rows])


def test_own_backbone_verdict():
    s = _study()
    s.settings.backbone.name, s.dataset_name = "tiny", "d"
    cases = [((2.0, 0.5, 3.5, "in band"), "a"), ((2.0, 0.5, 3.5, "not resolved"), "c"),
             ((2.0, 0.5, 3.5, "outside band"), "b"), ((-2.0, -3.0, -0.5, "in band"), "b"),
             ((1.0, -0.5, 2.5, "in band"), "c"), ((2.0, 0.5, 3.5, "uninformative"), "c")]
    for (m, lo, hi, st), pick in cases:
        D = _scale_D([("tiny", "T5", m, lo, hi, st), ("tiny", "T1", 9.0, 8.0, 10.0, "in band"),
                      ("big", "T5", 5.0, 4.0, 6.0, "in band")])
        for letter in "abc":
            assert check_exercise("05.own_backbone_T5", letter, D=D, study=s) == (letter == pick), (m, lo, hi, st)


def test_scale_exercises_need_two_backbones(capsys):
    two = _scale_D([("a", "T5", 1.0, 0.0, 2.0, "in band"), ("b", "T5", 4.0, 3.0, 5.0, "in band"),
                    ("c", "T5", 2.5, 1.0, 4.0, "in band"), ("a", "T1", 9.0, 8.0, 10.0, "in band")])
    assert check_exercise("05.spread_resolved", "a", D=two)                   # [3, 5] vs [0, 2]: apart
    assert not check_exercise("05.spread_resolved", "b", D=two)
    overlap = two.assign(D_pp_lo=[0.0, 1.5, 1.0, 8.0])
    assert check_exercise("05.spread_resolved", "b", D=overlap)
    assert check_exercise("05.best_backbone_T5", "b", D=two)
    capsys.readouterr()
    one = two[two["backbone"] == "a"]
    for name, answer in (("05.best_backbone_T5", "a"), ("05.spread_resolved", "b")):
        assert not check_exercise(name, answer, D=one)                        # never a degenerate "(0)"
        assert "needs ≥ 2 backbones; this run has one (a)" in capsys.readouterr().out
        check_solution(name, None, D=one)                                     # nothing to verify
        note = course.show_exercise(name, D=one).data
        assert "Not asked on this run" in note and EXERCISES[name].prompt not in note
        assert EXERCISES[name].prompt in course.show_exercise(name, D=two).data
        assert repr(course.show_exercise(name, D=one)) == note               # plain text: the prompt, no object repr
        with pytest.raises(course.NotApplicable, match="this run has one"):
            course.expected_answer(name, D=one)
    assert check_exercise("05.best_backbone_T5", None, D=one) is False and capsys.readouterr().out == ""


def test_patch_score_pib_against_its_baselines():
    def pib(lo, centre, area):
        return pd.DataFrame(dict(ranking=["patch_score", "T0"], pib=[lo + 0.1, 0.5], pib_lo=[lo, 0.3],
                                 pib_hi=[lo + 0.2, 0.7], pib_centre=[centre] * 2, pib_box_area=[area] * 2))
    for args, pick in (((0.7, 0.5, 0.4), "a"), ((0.5, 0.5, 0.4), "b"), ((0.45, 0.4, 0.5), "c"),
                       ((0.3, 0.4, 0.5), "b")):
        for letter in "abc":
            assert check_exercise("06.patch_score_pib", letter, pib=pib(*args)) == (letter == pick), args


def test_decoupling_shown_from_the_verdict():
    def v(shown, winners, co):
        return SimpleNamespace(decoupling_shown=shown, winners={"reading": winners}, comovement={"reading": co})
    cases = [(v(True, "different winners", "not resolved"), {"a"}),
             (v(False, "one condition leads both", "move together"), {"b", "c"}),
             (v(False, "not resolved: the coverage lead is within noise", "trade off"), {"b"}),
             (v(False, "different winners", "not resolved"), {"d"}),
             (v(False, "undefined", "undefined"), {"b"})]
    for verdict, accepted in cases:
        for letter in "abcd":
            assert check_exercise("07.decoupling_shown", letter, verdict=verdict) == (letter in accepted), (verdict, letter)


def test_decoupling_shown_on_claim_verdict():
    """On the real verdict: T5 gains coverage at parity, the reference stays most faithful."""
    from midas_nb.analysis import claim_verdict
    ids = [f"i{k}" for k in range(8)]
    rows = []
    for c, m, f in (("reference", 0.30, 0.50), ("unsupervised", 0.31, 0.40), ("T1", 0.32, 0.30), ("T5", 0.45, 0.495)):
        rows.append(dict(dataset="d", backbone="b", depth=2, budget=0.25, condition=c, seed=0, miou=m, idauc=f,
                         image_ids=ids, idauc_image_ids=ids, miou_per_image=[m + 0.01 * (k % 3) for k in range(8)],
                         idauc_per_image=[f + 0.002 * (k % 2) for k in range(8)]))
    verdict = claim_verdict(pd.DataFrame(rows), n_boot=200)
    assert verdict.decoupling_shown
    assert check_exercise("07.decoupling_shown", "a", verdict=verdict)
    assert not check_exercise("07.decoupling_shown", "b", verdict=verdict)


def test_abs_t5_coverage_exercise_reads_box_coverage_on_a_dataset_without_parts():
    """Exercise 01.2's answer key used part masks only, so on FGVC-Aircraft and Stanford Cars it
    expected NaN. On a box-only split it is now the package's box coverage (an independent
    implementation against ``metrics.box_coverage``), boxes over 90 % of the patches left out."""
    from types import SimpleNamespace

    import torch

    from midas_nb import metrics, pruning
    from midas_nb.course.exercises import expected_answer
    from midas_nb.backbones.vit import keep_count

    class BoxOnly(list):
        has_parts = False

    g = torch.Generator().manual_seed(0)
    n = 16
    boxes = torch.zeros(4, n, dtype=torch.bool)
    boxes[0, :4], boxes[1, 2:9], boxes[2, 5:7], boxes[3, :] = True, True, True, True  # image 3: uninformative
    study = SimpleNamespace(settings=_settings(budget=0.25),
                            test_set=BoxOnly(SimpleNamespace(box_mask=b, part_mask=torch.zeros(n, dtype=torch.bool))
                                             for b in boxes))
    t5 = torch.randn(4, n, generator=g)
    keep = pruning.keep_mask_from_indices(pruning.select_top_k(t5.abs(), keep_count(0.25, n)), n)
    want = metrics.box_coverage(keep, boxes)
    assert want.n_skipped == 1
    assert expected_answer("01.abs_t5_miou", maps={"T5": t5}, study=study) == pytest.approx(float(want.mean))


def test_export_in_an_environment_whose_jupyter_paths_miss_the_lab_template(executed_dir, tmp_path, monkeypatch):
    """A virtual environment that reuses another environment's nbconvert: the Jupyter data paths follow
    its own prefix, so nbconvert's lab template is not on them. The export finds the template where
    nbconvert's distribution installed it and writes the pages; JUPYTER_PATH is left as it was."""
    import nbconvert.exporters.templateexporter as te

    monkeypatch.delenv("JUPYTER_PATH", raising=False)
    venv = str(tmp_path / "venv" / "share" / "jupyter")       # the venv's own prefix: no templates

    def jupyter_path(*sub):   # jupyter_core's order: JUPYTER_PATH first, then the prefixes
        extra = [p for p in os.environ.get("JUPYTER_PATH", "").split(os.pathsep) if p]
        return [os.path.join(p, *sub) for p in [*extra, venv]]

    monkeypatch.setattr(te, "jupyter_path", jupyter_path)
    with pytest.raises(ValueError, match="No template sub-directory with name 'lab'"):
        te.TemplateExporter(template_name="lab")             # what nbconvert alone does here
    with pytest.warns(UserWarning, match="03_never_run"):
        index = export_html(executed_dir, tmp_path / "html")
    assert "00_first.html" in index.read_text() and "jp-Notebook" in (index.parent / "00_first.html").read_text()
    assert "JUPYTER_PATH" not in os.environ


def test_export_without_nbconverts_lab_template_says_where_it_is(executed_dir, tmp_path, monkeypatch, capsys):
    """Where nbconvert sees no lab template, not even in the folder its distribution installed it to: one line
    naming the folders and how to fix it, exit 1, no page written (was nbconvert's traceback)."""
    import jupyter_core.paths
    import nbconvert.exporters.templateexporter as te

    from midas_nb import cli
    from midas_nb.course import publish

    empty = [str(tmp_path / "no-templates")]
    monkeypatch.setattr(te, "jupyter_path", lambda *a: empty)
    monkeypatch.setattr(jupyter_core.paths, "jupyter_path", lambda *a: empty)
    monkeypatch.setattr(publish, "jupyter_data_dir", lambda *a: tmp_path / "dist-share")   # a record, no files
    out = tmp_path / "html"
    with pytest.warns(UserWarning):
        assert cli.main(["export-html", "--input", str(executed_dir), "--output", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"midas-nb export-html: nbconvert's 'lab' HTML template is not in the Jupyter data paths "
                   f"({empty[0]}) nor in {tmp_path / 'dist-share'}; reinstall nbconvert in this environment "
                   f"(pip install --force-reinstall nbconvert)"], err
    assert not out.exists() or not any(out.iterdir())
