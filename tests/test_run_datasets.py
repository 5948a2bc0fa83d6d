"""``midas-nb run`` over several data roots: the notebooks run once per dataset, every run is
checked before the first kernel, and the report over the datasets follows."""
from __future__ import annotations

from pathlib import Path

import pytest

from midas_nb import cli
from midas_nb.cli import runner
from midas_nb.cli.runspec import RunSpec


def test_which_datasets_a_run_executes():
    roots = {"cars": "/c", "cub": "/b", "aircraft": "/a"}
    assert runner.run_datasets(RunSpec(profile="quick", data_roots=roots)) == ["cub", "aircraft", "cars"]
    # one named dataset, an explicit --dataset, a profile or -p with its own datasets grid: one run
    assert runner.run_datasets(RunSpec(profile="quick", data_roots={"cub": "/b"})) == [None]
    assert runner.run_datasets(RunSpec(profile="quick", data_roots=roots, dataset="cars")) == [None]
    assert runner.run_datasets(RunSpec(profile="rehearsal", data_roots=roots)) == [None]
    assert runner.run_datasets(RunSpec(profile="quick", data_roots=roots, params={"datasets": ["cub"]})) == [None]


def test_every_datasets_run_is_checked_before_any_kernel(tmp_path, capsys, monkeypatch):
    def no_kernel(*a, **k):
        raise AssertionError("a notebook was executed")
    monkeypatch.setattr("papermill.execute_notebook", no_kernel)
    cub = tmp_path / "cub"
    cub.mkdir()
    rc = cli.main(["run", "--profile", "smoke", "--data-root", f"cub={cub}", "--data-root",
                   f"aircraft={tmp_path / 'no-aircraft'}", "--output", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and "no notebook was started" in err
    # the problems of both datasets' runs, each named by its dataset
    assert any(ln.startswith("midas-nb run: aircraft: ") and "no-aircraft" in ln for ln in err.splitlines())
    assert any(ln.startswith("midas-nb run: cub: ") for ln in err.splitlines())



def test_a_problem_of_every_datasets_run_is_said_once(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("papermill.execute_notebook", lambda *a, **k: pytest.fail("a notebook was executed"))
    cub = tmp_path / "cub"
    cub.mkdir()
    rc = cli.main(["run", "--profile", "smoke", "-p", "budget", "3", "--data-root", f"cub={cub}", "--data-root",
                   f"aircraft={tmp_path / 'no-aircraft'}", "--output", str(tmp_path / "o")])
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "budget" in ln]
    assert rc == 2 and lines == ["midas-nb run: budget: expected a kept fraction b in (0, 1] (e.g. 0.25), got 3"]


def test_the_datasets_run_one_after_another_then_the_report(tmp_path, monkeypatch, capsys):
    calls, reports, checks = [], [], []
    monkeypatch.setattr("midas_nb.cli.runspec.preflight", lambda spec, *a, **k: checks.append(spec.dataset) or [])

    monkeypatch.setenv("MIDAS_FIGURES_DIR", str(tmp_path / "fig"))

    def fake_run(spec, paths, accepted_by, *, progress):
        import os
        assert os.environ["MIDAS_FIGURES_DIR"] == str(tmp_path / "fig" / spec.dataset)  # one folder per dataset
        assert [p.name[:2] for p in paths] == ["00", "01", "02", "03", "04", "05", "06", "07"]
        calls.append((spec.dataset, Path(spec.output).name))
        return Path(spec.output)
    monkeypatch.setattr(runner, "run_checked", fake_run)

    def fake_report(profile, *, output, overrides, allow_incomplete, allow_mixed_settings):
        reports.append((profile, Path(output).name, overrides, allow_incomplete, allow_mixed_settings))
        return Path(output) / "REPORT.md"
    monkeypatch.setattr("midas_nb.report.make_report", fake_report)
    monkeypatch.setattr("midas_nb.report.markdown.datasets_summary", lambda d: "| the paper's table |")
    spec = RunSpec(profile="quick", data_roots={"cars": "/c", "cub": "/b"}, output=str(tmp_path / "o"),
                   params={"precision": "bfloat16"})
    out = runner.run_each_dataset(spec, runner.run_datasets(spec), progress=False, problems=())
    assert out == tmp_path / "o"
    assert calls == [("cub", "cub"), ("cars", "cars")]
    assert checks == ["cub", "cars"]   # each dataset's run is checked once, all before the first kernel
    import os
    assert os.environ["MIDAS_FIGURES_DIR"] == str(tmp_path / "fig")  # restored after the run
    # the report of the run's own settings (issue 53): the store's rows of others are left out, not refused
    assert reports == [("quick", "report", {"backbone": "hybrid_lite0_deit", "precision": "bfloat16"}, True, True)]
    printed = capsys.readouterr().out
    assert "=== dataset 1/2: cub ===" in printed and "| the paper's table |" in printed


def test_the_three_real_roots_pass_the_checks_and_reach_the_first_kernel(shared_data, tmp_path, capsys, monkeypatch):
    """The paper's three-dataset command: each dataset's run keeps only its own root, so no run
    rejects the other two roots as unread and the first notebook starts."""
    started = []

    def first_kernel(nb, *a, **k):
        started.append(Path(nb).name)
        raise KeyboardInterrupt  # stop the run right there
    monkeypatch.setattr("midas_nb.cli.runner.execute_notebook", first_kernel)
    args = ["run", "--profile", "quick", "--output", str(tmp_path / "o"),
            "--data-root", f"cub={shared_data / 'cub200_subset'}",
            "--data-root", f"aircraft={shared_data / 'fgvc_aircraft_subset' / 'fgvc-aircraft-2013b'}",
            "--data-root", f"cars={shared_data / 'stanford_cars_subset'}"]
    rc = cli.main(args)  # the interrupt is reported, not raised
    out = capsys.readouterr()
    assert rc != 0 and "interrupted" in out.err
    assert "no notebook was started" not in out.err, out.err
    assert started == ["00_quickstart.ipynb"] and "=== dataset 1/3: cub ===" in out.out
