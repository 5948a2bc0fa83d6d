"""Robust runs (issue 15, item 5): a kernel that dies or a cell that times out goes to
``failed/`` with a message; copies from an older run that a failed rerun did not replace are
marked stale in the run summary and in the HTML edition."""
from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from midas_nb import cli
from midas_nb.course import export_html
from midas_nb.cli import runner
from midas_nb.runs import run_state, run_summary

KERNEL = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}


def _write(src, name, code):
    params = new_code_cell("budget = None", metadata={"tags": ["parameters"]})
    nb = new_notebook(cells=[new_markdown_cell(f"# {name}"), params, new_code_cell(code)], metadata=KERNEL)
    nbformat.write(nb, str(src / name))


@pytest.fixture
def three(tmp_path, monkeypatch):
    src = tmp_path / "notebooks"
    src.mkdir()
    _write(src, "00_first.ipynb", "x = 1")
    _write(src, "01_middle.ipynb", "y = 2")
    _write(src, "02_last.ipynb", "z = 3")
    monkeypatch.setattr(runner, "notebooks_dir", lambda: src)
    return src, tmp_path / "out"


def _states(out):
    return {s.name: s for s in run_state(out).notebooks}


@pytest.mark.slow
@pytest.mark.parametrize("how", ["dies", "times out"])
def test_dead_or_timed_out_kernel_goes_to_failed_and_later_copies_turn_stale(three, how, capsys):
    src, out = three
    cli.run_notebooks("smoke", output=out, progress=False)                 # run 1: all good
    first = {s.name: s.run_id for s in run_state(out).notebooks}
    assert set(first) == {"00_first.ipynb", "01_middle.ipynb", "02_last.ipynb"} and len(set(first.values())) == 1
    assert all(s.state == "current" for s in run_state(out).notebooks)
    good_01 = (out / "01_middle.ipynb").read_text()

    _write(src, "01_middle.ipynb", "import os\nos._exit(1)" if how == "dies" else "import time\ntime.sleep(60)")
    with pytest.raises(RuntimeError) as e:                                  # run 2 stops at 01
        cli.run_notebooks("smoke", output=out, progress=False, cell_timeout=3 if how == "times out" else None)
    msg = str(e.value)
    expected = "the kernel died" if how == "dies" else "ran longer than the cell timeout (3 s)"
    assert "01_middle.ipynb" in msg and expected in msg and str(out / "failed" / "01_middle.ipynb") in msg
    failed = nbformat.read(str(out / "failed" / "01_middle.ipynb"), as_version=4)
    assert failed.cells[0].cell_type == "markdown" and expected in failed.cells[0].source
    assert not list((out / ".partial").glob("*.ipynb"))
    assert (out / "01_middle.ipynb").read_text() == good_01                 # the good copy stays

    run, states = run_state(out), _states(out)
    assert states["00_first.ipynb"].state == "current" and states["00_first.ipynb"].run_id == run.latest
    assert run.latest != first["00_first.ipynb"]
    assert states["01_middle.ipynb"].reason.startswith(f"from run {first['01_middle.ipynb']} (")   # the good copy's run
    assert states["01_middle.ipynb"].state == "stale" and f"the later run {run.latest} failed here: " \
        + ("the kernel died" if how == "dies" else "a cell ran longer than the cell timeout (3 s)") \
        in states["01_middle.ipynb"].reason
    # 02 was not reached: its copy (run 1, the same settings) reads as current; only a manifest knew better
    assert states["02_last.ipynb"].state == "current" and states["02_last.ipynb"].run_id == first["02_last.ipynb"]
    printed = capsys.readouterr().out
    assert "STALE    01_middle.ipynb" in printed and f"current  00_first.ipynb  (run {run.latest})" in printed

    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        index = export_html(out)
    page = index.read_text()
    items = {ln.split('href="')[1].split('.html')[0]: ln for ln in page.splitlines() if "<li>" in ln}
    assert "midas-stale" not in items["00_first"]
    assert "stale:" in items["01_middle"] and "failed here" in items["01_middle"]
    assert "this page is not from the latest run" in (index.parent / "01_middle.html").read_text()
    assert "this page is not from the latest run" not in (index.parent / "00_first.html").read_text()
    assert f"Run <code>{run.latest}</code> of 20" in page                  # the header: the same run


@pytest.mark.slow
def test_rerun_with_other_settings_marks_the_untouched_notebooks_stale(three, capsys):
    src, out = three
    cli.run_notebooks("smoke", output=out, progress=False)
    assert capsys.readouterr().out.rstrip().endswith("midas-nb report --profile smoke  (REPORT.md from the result store)")
    cli.run_notebooks("smoke", output=out, notebooks="01", extra={"budget": 0.5}, progress=False)
    # the copy's run and parameters are papermill's own record (its output_path), not a second stamp
    meta = nbformat.read(str(out / "01_middle.ipynb"), as_version=4).metadata
    latest = run_state(out).latest
    assert not (out / "run.json").exists() and "midas_nb" not in meta and Path(meta["papermill"]["output_path"]).parent.name == latest
    assert _states(out)["01_middle.ipynb"].run_id == latest and meta["papermill"]["parameters"] == {"budget": 0.5}
    # the report command names the point the run overrode, so it reports that run's cells
    # (a selection of notebooks: the others' cells have no result, which the report would refuse)
    assert "midas-nb report --profile smoke --budget 0.5 --allow-incomplete  (" in capsys.readouterr().out
    from midas_nb.cli.runspec import RunSpec   # --backbone as -p backbone
    assert runner.report_command(RunSpec(profile="quick", backbone="vit_smoke", params={"depth": 3})).endswith(
        " midas-nb report --profile quick --backbone vit_smoke --depth 3")
    assert runner.report_command(RunSpec(profile="quick", params={"precision": "bfloat16", "seeds": [0]})).endswith(
        " midas-nb report --profile quick -p precision bfloat16")     # the settings its cells are keyed by
    states = _states(out)
    assert states["01_middle.ipynb"].state == "current"
    for name in ("00_first.ipynb", "02_last.ipynb"):
        assert states[name].state == "stale" and "with other settings" in states[name].reason
        assert "budget None -> 0.5" in states[name].reason
    # back to the default settings, selecting only 00: 02 (run 1) matches the latest run again,
    # 01 (budget 0.5) is now the odd one out
    cli.run_notebooks("smoke", output=out, notebooks="00", progress=False)
    states = _states(out)
    assert states["00_first.ipynb"].state == "current" and states["02_last.ipynb"].state == "current"
    assert states["01_middle.ipynb"].state == "stale"


def _copy(path, params_cell, run_id=None, params=None, cells=()):
    """A copy as `midas-nb run` leaves it: papermill's metadata, its output_path under `.partial/<run_id>/`."""
    made = {"papermill": {"output_path": str(path.parent / ".partial" / run_id / path.name), "parameters": params,
                          "start_time": f"2026-01-0{run_id[-1]}T10:00:00.5+00:00"}} if run_id else {}
    nb = new_notebook(cells=[*cells, new_code_cell(params_cell, metadata={"tags": ["parameters"]}),
                             new_code_cell("x = 1", execution_count=1)], metadata={**KERNEL, **made})
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))


def test_the_runs_are_read_from_the_copies_papermill_metadata(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    assert run_summary(out) == f"run summary of {out}: no notebook has finished yet"   # not a bare heading
    _copy(out / "00_a.ipynb", "budget = None")                     # executed by hand: names no run
    assert [(s.state, s.run_id) for s in run_state(out).notebooks] == [("unrecorded", None)]
    assert run_state(out).latest is None and "?        00_a.ipynb" in run_summary(out)
    _copy(out / "00_a.ipynb", "budget = None", "20260101-100000-aaaaa1", {"budget": 0.5})
    _copy(out / "01_b.ipynb", "budget = None\nbudgets: list = [0.1]", "20260101-100000-aaaaa1",
          {"budget": 0.5, "budgets": [0.2]})
    _copy(out / "02_c.ipynb", "budget = None", "20260101-100000-aaaaa1", {"budget": 0.5})
    assert all(s.state == "current" for s in run_state(out).notebooks)
    # run 2: 00 with budget 0.25 (a parameter 00 does not take, `budgets`, plays no part), 01 fails
    _copy(out / "00_a.ipynb", "budget = None", "20260102-100000-bbbbb2", {"budget": 0.25})
    fail = new_markdown_cell("**midas-nb run: this notebook did not finish.** the kernel died (DeadKernelError)",
                             metadata={"tags": ["midas-run-failure"]})
    _copy(out / "failed" / "01_b.ipynb", "budget = None", "20260102-100000-bbbbb2", {"budget": 0.25}, [fail])
    _copy(out / "failed" / "03_d.ipynb", "budget = None", "20260102-100000-bbbbb2", {"budget": 0.25}, [fail])
    run = run_state(out)
    assert (run.latest, run.started, run.settings) == ("20260102-100000-bbbbb2", "2026-01-02 10:00 UTC", {"budget": 0.25})
    states = {s.name: s for s in run.notebooks}
    assert states["00_a.ipynb"].state == "current"
    assert states["01_b.ipynb"].reason == ("from run 20260101-100000-aaaaa1 (2026-01-01 10:00 UTC); the later run "
                                           "20260102-100000-bbbbb2 failed here: the kernel died (DeadKernelError)")
    assert states["02_c.ipynb"].reason == ("from run 20260101-100000-aaaaa1 (2026-01-01 10:00 UTC) with other settings "
                                           "than the latest run 20260102-100000-bbbbb2: budget 0.5 -> 0.25")
    assert run.failed == {"03_d.ipynb": "the kernel died (DeadKernelError)"}
    said = run_summary(out).splitlines()
    assert said[0] == f"run summary of {out} (latest run 20260102-100000-bbbbb2, 2026-01-02 10:00 UTC)"
    assert said[1:] == ["  current  00_a.ipynb  (run 20260102-100000-bbbbb2)", "  STALE    01_b.ipynb  " +
                        states["01_b.ipynb"].reason, "  STALE    02_c.ipynb  " + states["02_c.ipynb"].reason,
                        "  FAILED   03_d.ipynb  the kernel died (DeadKernelError) (no earlier copy)"]
    # an earlier failure that a later run made good is history, not a mark
    _copy(out / "01_b.ipynb", "budget = None\nbudgets: list = [0.1]", "20260103-100000-ccccc3", {"budget": 0.25})
    assert _states(out)["01_b.ipynb"].state == "current"


def test_two_runs_into_one_folder_both_finish(three, tmp_path):
    """Two `midas-nb run` processes, one output folder, their notebooks running at once: the first
    to finish removed `.partial` under the second (both failed, no copy kept). Nothing else is shared
    (no manifest to lock): the copy in the folder is one run's, whole, and current."""
    src, out = three
    marks = tmp_path / "marks"
    marks.mkdir()
    _write(src, "00_first.ipynb", f"import os, pathlib, time\nd = pathlib.Path({str(marks)!r})\n"
           f"(d / f'start-{{os.getpid()}}').touch()\nt = time.time()\n"
           f"while len(list(d.glob('start-*'))) < 2 and time.time() - t < 120:\n    time.sleep(0.05)")
    code = (f"from pathlib import Path; from midas_nb import cli; cli.runner.notebooks_dir = lambda: Path({str(src)!r}); "
            f"raise SystemExit(cli.main(['run', '--profile', 'smoke', '--notebooks', '00', '--no-progress', "
            f"'--output', {str(out)!r}]))")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(cli.__file__).parents[2]), os.environ.get("PYTHONPATH", "")]))
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for _ in range(2)]
    said = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], said
    assert len(list(marks.iterdir())) == 2                                  # the two kernels ran at once
    ids = [line.rsplit("(run ", 1)[1].split(")")[0] for text in said for line in text.splitlines()
           if " ran in " in line]
    assert len(set(ids)) == 2 and not (out / "run.json").exists() and not (out / ".partial").exists()
    assert _states(out)["00_first.ipynb"].run_id in ids   # whichever run wrote it last
    assert _states(out)["00_first.ipynb"].state == "current" and run_state(out).latest in ids
