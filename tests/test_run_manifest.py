"""Robust runs (issue 15, item 5): a kernel that dies or a cell that times out goes to
``failed/`` with a message; copies from an older run that a failed rerun did not replace are
marked stale in the run summary and in the HTML edition."""
from __future__ import annotations

import json
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
from midas_nb.runs import RunManifest, notebook_states, run_summary

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
    return {s.name: s for s in notebook_states(out)}


@pytest.mark.slow
@pytest.mark.parametrize("how", ["dies", "times out"])
def test_dead_or_timed_out_kernel_goes_to_failed_and_later_copies_turn_stale(three, how, capsys):
    src, out = three
    cli.run_notebooks("smoke", output=out, progress=False)                 # run 1: all good
    first = {s.name: s.run_id for s in notebook_states(out)}
    assert set(first) == {"00_first.ipynb", "01_middle.ipynb", "02_last.ipynb"} and len(set(first.values())) == 1
    assert all(s.state == "current" for s in notebook_states(out))
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

    states = _states(out)
    assert states["00_first.ipynb"].state == "current" and states["00_first.ipynb"].run_id != first["00_first.ipynb"]
    assert states["01_middle.ipynb"].state == "stale" and "failed here" in states["01_middle.ipynb"].reason
    assert states["02_last.ipynb"].state == "stale" and "did not reach it" in states["02_last.ipynb"].reason
    printed = capsys.readouterr().out
    assert "STALE    01_middle.ipynb" in printed and "STALE    02_last.ipynb" in printed
    assert "current  00_first.ipynb" in printed

    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        index = export_html(out)
    page = index.read_text()
    items = {ln.split('href="')[1].split('.html')[0]: ln for ln in page.splitlines() if "<li>" in ln}
    assert "midas-stale" not in items["00_first"]
    assert "stale:" in items["01_middle"] and "failed here" in items["01_middle"]
    assert "stale:" in items["02_last"] and "did not reach it" in items["02_last"]
    assert "this page is not from the latest run" in (index.parent / "02_last.html").read_text()
    assert "this page is not from the latest run" not in (index.parent / "00_first.html").read_text()


@pytest.mark.slow
def test_rerun_with_other_settings_marks_the_untouched_notebooks_stale(three, capsys):
    src, out = three
    cli.run_notebooks("smoke", output=out, progress=False)
    assert capsys.readouterr().out.rstrip().endswith("midas-nb report --profile smoke  (REPORT.md from the result store)")
    cli.run_notebooks("smoke", output=out, notebooks="01", extra={"budget": 0.5}, progress=False)
    # the copy's run and parameters are papermill's own record (its output_path), not a second stamp
    meta = nbformat.read(str(out / "01_middle.ipynb"), as_version=4).metadata
    latest = json.loads((out / "run.json").read_text())["latest"]
    assert "midas_nb" not in meta and Path(meta["papermill"]["output_path"]).parent.name == latest
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


def test_copies_the_manifest_does_not_account_for_are_stale(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    nb = new_notebook(cells=[new_code_cell("x = 1", execution_count=1)], metadata=KERNEL)
    nbformat.write(nb, str(out / "00_a.ipynb"))
    assert [s.state for s in notebook_states(out)] == ["unrecorded"]      # no manifest: older layout
    man = RunManifest(out)
    r1 = man.start({"profile": "smoke"}, ["00_a.ipynb"])
    man.finish(r1, completed=True)
    st = notebook_states(out)[0]
    assert st.state == "stale" and "not produced by a run recorded" in st.reason     # no run id in the copy
    nb.metadata["papermill"] = {"output_path": str(out / ".partial" / r1 / "00_a.ipynb")}   # as papermill wrote it
    nbformat.write(nb, str(out / "00_a.ipynb"))
    assert notebook_states(out)[0].state == "current"
    data = json.loads((out / "run.json").read_text())
    assert data["latest"] == r1 and data["runs"][r1]["settings"] == {"profile": "smoke"}
    assert "current  00_a.ipynb" in run_summary(out)


def test_two_runs_into_one_folder_both_finish_and_the_manifest_keeps_both(three, tmp_path):
    """Two `midas-nb run` processes, one output folder, their notebooks running at once: the first
    to finish removed `.partial` under the second (both failed, no copy kept), and run.json, read
    once and rewritten whole, lost the other run's update (one run stayed "running")."""
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
    runs = json.loads((out / "run.json").read_text())["runs"]
    assert len(runs) == 2 and [r["status"] for r in runs.values()] == ["done", "done"]
    assert _states(out)["00_first.ipynb"].run_id in runs and not (out / ".partial").exists()
    assert _states(out)["00_first.ipynb"].state == "current"   # whichever run wrote it last
