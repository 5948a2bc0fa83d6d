"""``midas-nb`` command line: argument checks before any kernel, failure handling of ``run``."""
from __future__ import annotations

import os

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from midas_nb import cli, config
from midas_nb.cli import runner
from midas_nb.cli.args import param_value

KERNEL = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}


def test_bad_data_settings_and_unknown_parameters_stop_before_any_kernel(tmp_path, capsys, monkeypatch):
    def no_kernel(*a, **k):
        raise AssertionError("a notebook was executed")
    monkeypatch.setattr("papermill.execute_notebook", no_kernel)
    assert cli.main(["run", "--data-root", str(tmp_path / "nowhere"), "--output", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert cli.main(["run", "--dataset", "aircraft", "--output", str(tmp_path / "o")]) == 2
    assert "dataset 'aircraft' has no data root: pass --data-root aircraft=" in capsys.readouterr().err
    assert cli.main(["run", "-p", "no_such_param", "3", "--notebooks", "07", "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "unknown notebook parameter(s) ['no_such_param']" in err and "'budget'" in err
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").glob("*.ipynb"))


def test_data_root_message_names_the_path_as_typed(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    where = tmp_path.resolve() / "rel" / "nowhere"
    for typed, shown in ((str(tmp_path.resolve() / "nowhere"), repr(str(tmp_path.resolve() / "nowhere"))),
                         ("rel/nowhere", f"'rel/nowhere' ({where})"), ("cub=rel/nowhere", f"'rel/nowhere' ({where})")):
        assert cli.main(["run", "--data-root", typed, "--output", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err
        lines = [ln for ln in err.splitlines() if "does not exist" in ln]
        # one line, the path as typed; the resolved one beside it only where they differ
        assert len(lines) == 1 and lines[0].startswith(f"midas-nb run: data root {shown} "), err
        assert "Traceback" not in err


def test_a_failing_notebook_keeps_the_earlier_good_copy(tmp_path, monkeypatch):
    src = tmp_path / "notebooks"
    src.mkdir()
    params = new_code_cell("budget = None", metadata={"tags": ["parameters"]})
    nbformat.write(new_notebook(cells=[new_markdown_cell("# ok"), params, new_code_cell("x = 1")], metadata=KERNEL),
                   str(src / "00_ok.ipynb"))
    nbformat.write(new_notebook(cells=[params, new_code_cell("y = 2"), new_code_cell("raise ValueError('boom')")],
                                metadata=KERNEL), str(src / "01_fails.ipynb"))
    monkeypatch.setattr(runner, "notebooks_dir", lambda: src)
    out = tmp_path / "out"
    out.mkdir()
    (out / "01_fails.ipynb").write_text("earlier good copy")
    monkeypatch.delenv("MIDAS_HEADLESS", raising=False)
    with pytest.raises(RuntimeError) as err:
        cli.run_notebooks("smoke", extra={"budget": 0.5}, output=out, progress=False)
    assert "MIDAS_HEADLESS" not in os.environ                  # the kernels' setting, not left to the caller
    msg = str(err.value)
    # execution count 4: the parameters cell, papermill's injected-parameters cell, y = 2, raise
    assert "01_fails.ipynb failed in cell 4" in msg and "ValueError: boom" in msg
    assert str(out / "failed" / "01_fails.ipynb") in msg
    assert (out / "01_fails.ipynb").read_text() == "earlier good copy"         # not overwritten
    failed = nbformat.read(str(out / "failed" / "01_fails.ipynb"), as_version=4)
    assert any(o.get("output_type") == "error" for c in failed.cells for o in c.get("outputs", []))
    done = nbformat.read(str(out / "00_ok.ipynb"), as_version=4)               # the first one finished
    assert any("budget = 0.5" in "".join(c.source) for c in done.cells)        # injected parameter
    assert not (out / ".partial").exists()                                    # emptied and removed


# ---------------------------------------------------------------- issue 31: a command line that answers at once
def _in_fresh_python(code: str) -> list[str]:
    """Run ``code`` in a new interpreter (this checkout first on the path); its stdout lines."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=repo, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().splitlines()


def test_help_version_and_argument_errors_answer_without_torch():
    out = _in_fresh_python(
        "import contextlib, io, sys\n"
        "from midas_nb import cli\n"
        "for argv in (['--help'], ['--version'], ['run', '--help'], ['run', '--bogus'],"
        " ['run', '-p', 'seeds', '[0,', '1]'], ['report', '--depth', 'x'],"
        " ['sweep', 'plan', '--sweep', 'regime,bogus']):\n"
        "    buf = io.StringIO()\n"
        "    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):\n"
        "        try:\n"
        "            rc = cli.main(argv)\n"
        "        except SystemExit as e:\n"
        "            rc = e.code\n"
        "    print(argv[0], argv[-1], rc, 'torch' in sys.modules, 'midas_nb.study' in sys.modules)\n")
    assert out == ["--help --help 0 False False", "--version --version 0 False False", "run --help 0 False False",
                   "run --bogus 2 False False", "run 1] 2 False False",
                   "report x 2 False False", "sweep regime,bogus 2 False False"]


def test_a_selection_of_no_notebook_answers_before_torch_and_papermill_load():
    out = _in_fresh_python(
        "import contextlib, io, sys\n"
        "from midas_nb import cli\n"
        "for argv in (['run', '--profile', 'smoke', '--notebooks', '99'],):\n"
        "    buf = io.StringIO()\n"
        "    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):\n"
        "        rc = cli.main(argv)\n"
        "    print(argv[0], rc, 'torch' in sys.modules, 'papermill' in sys.modules)\n"
        "    print(buf.getvalue(), end='')\n")
    available = ("available: ['00_quickstart', '01_supervision_targets', '02_three_condition_protocol', "
                 "'03_cosine_probes', '04_regime_sweeps', '05_scale_sensitivity', '06_related_methods', "
                 "'07_deployment_guide']")
    assert out == ["run 2 False False",
                   f"midas-nb run: --notebooks: no notebook matches '99'; {available} (the other settings are "
                   "checked once it names one)",
                   "midas-nb run: 1 problem; no notebook was started"]


def test_version_is_the_installed_package_version(capsys):
    from importlib import metadata

    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"midas-nb {metadata.version('midas_nb')}"


def test_package_names_load_on_use_and_the_scorer_families_register_without_the_package_import():
    out = _in_fresh_python(
        "import sys, midas_nb\n"
        "print('torch' in sys.modules)\n"
        "print(midas_nb.get_profile('smoke')['backbone'], midas_nb.Study.__name__, 'list_profiles' in dir(midas_nb))\n")
    assert out == ["False", "vit_smoke Study True"]
    # only the protocol imported: cropr and iared are conditions all the same (loaded on the first registry read)
    out = _in_fresh_python("from midas_nb.analysis.protocol import list_conditions\nprint(sorted(list_conditions())[:3])\n"
                           "from midas_nb.scorers import list_scorer_conditions\nprint(list_scorer_conditions())")
    assert out[1] == "['cropr', 'iared']"


def _options(parser):
    import argparse
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from ((f"{name} {a}", h) for a, h in _options(sub))
        elif action.option_strings:
            yield "/".join(action.option_strings), action.help


def test_every_option_has_help_and_every_command_an_example():
    import argparse
    ap = cli.build_parser()
    missing = [name for name, text in _options(ap) if not text]
    assert missing == []
    subs = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction)).choices
    for name, sub in subs.items():
        text = sub.format_help()
        assert f"example:\n  midas-nb {name}" in text or f"examples:\n  midas-nb {name}" in text, name
        assert "``" not in text and ":func:" not in text, name
    top = ap.format_help()
    assert "``" not in top and top.count("\n  midas-nb ") >= len(subs)


@pytest.mark.parametrize("text, name, value", [
    ("0,1", "seeds", [0, 1]), ("0", "seeds", [0]), ("[0, 1]", "seeds", [0, 1]), ("null", "seeds", None),
    ("None", "seeds", None), ("None", "budget", None), ("none", "backbone", "none"),
    ("0.1,0.25", "budgets", [0.1, 0.25]), ("T1,T5", "conditions", ["T1", "T5"]), ("1e-1", "budget", 0.1),
    ("3", "depth", 3),
])
def test_list_valued_parameters_take_commas_and_single_values(text, name, value):
    assert param_value(name, text) == value


def test_run_file_and_command_line_give_lists_for_list_parameters(tmp_path):
    run_file = tmp_path / "run.yaml"
    run_file.write_text("profile: smoke\nparams:\n  seeds: 0,1\n  depths: 2\n")
    args = cli.build_parser().parse_args(["run", "--config", str(run_file), "-p", "budgets", "0.25,0.5"])
    from midas_nb.cli.runspec import spec_from_args

    spec, problems = spec_from_args(args)
    assert problems == []
    assert (spec.params["seeds"], spec.params["depths"], spec.params["budgets"]) == ([0, 1], [2], [0.25, 0.5])


def test_a_value_split_by_the_shell_is_named_with_how_to_write_it(capsys):
    assert cli.main(["run", "-p", "seeds", "[0,", "1]", "--profile", "smoke"]) == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments" not in err
    assert "split at its spaces by the shell; quote it: -p seeds '[0, 1]'" in err and "-p seeds 0,1" in err


def test_a_misspelt_parameter_gets_a_suggestion_and_profile_is_not_offered(tmp_path, capsys, monkeypatch):
    def no_kernel(*a, **k):
        raise AssertionError("a notebook was executed")
    monkeypatch.setattr("papermill.execute_notebook", no_kernel)
    assert cli.main(["run", "--profile", "smoke", "-p", "seed", "0", "--notebooks", "07",
                     "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "unknown notebook parameter(s) ['seed'] (did you mean 'seeds'?)" in err
    assert "'profile'" not in err  # -p refuses it, so it is not offered


def test_a_one_digit_notebook_prefix_suggests_only_an_existing_notebook():
    with pytest.raises(ValueError) as e:
        cli.notebook_paths("8")
    assert "no notebook matches '8'" in str(e.value) and "'08'" not in str(e.value)
    with pytest.raises(ValueError, match=r"'2' \(prefixes have two digits: '02'\)"):
        cli.notebook_paths("2")


def test_sweep_status_exits_non_zero_while_cells_failed(monkeypatch, capsys):
    import pandas as pd

    rows = [dict(status="done", label="a", key="k1", attempt=1, error="", job_state="", job_id=""),
            dict(status="failed", label="b", key="k2", attempt=2, error="Traceback\nValueError: boom",
                 job_state="", job_id="17_0")]
    monkeypatch.setattr("midas_nb.sweeps.store.open_store", lambda name, must_exist=True: name)
    monkeypatch.setattr("midas_nb.sweeps.slurm.cell_states", lambda store: pd.DataFrame(rows))
    assert cli.main(["sweep", "status", "quick"]) == 1
    assert "FAILED b" in capsys.readouterr().out
    monkeypatch.setattr("midas_nb.sweeps.slurm.cell_states", lambda store: pd.DataFrame(rows[:1]))
    assert cli.main(["sweep", "status", "quick"]) == 0


def test_sweep_status_takes_the_store_from_profile_and_refuses_two_different_names(monkeypatch, capsys):
    import pandas as pd

    opened = []
    monkeypatch.setattr("midas_nb.sweeps.store.open_store", lambda name, must_exist=True: opened.append(name))
    monkeypatch.setattr("midas_nb.sweeps.slurm.cell_states", lambda store: pd.DataFrame(
        [dict(status="done", label="a", key="k1", attempt=1, error="", job_state="", job_id="")]))
    assert cli.main(["sweep", "status", "--profile", "smoke"]) == 0 and opened == ["smoke"]
    assert cli.main(["sweep", "status", "smoke", "--profile", "smoke"]) == 0 and opened == ["smoke", "smoke"]
    capsys.readouterr()
    assert cli.main(["sweep", "status", "quick", "--profile", "smoke"]) == 2 and opened == ["smoke", "smoke"]
    assert capsys.readouterr().err == ("midas-nb sweep status: store 'quick' and --profile 'smoke' differ; expected "
                                       "one of them (a store is named after its profile)\n")


def test_the_command_named_for_the_parameters_lists_what_p_accepts():
    """`midas-nb params` went (papermill lists a notebook's parameters): the command that `run --help` and the
    README name lists every parameter `-p` accepts, with its help."""
    import re
    import subprocess
    import sys

    import papermill as pm

    from midas_nb.cli.args import COMMANDS

    helped = next(text for flags, _, text in COMMANDS["run"][3] if flags == "-p --param")   # run --help's -p line
    command = re.search(r"`(papermill --help-notebook \S+)`", helped)[1]
    assert command.split()[-1] == "notebooks/02_*.ipynb"
    readme = " ".join((config.project_root() / "README.md").read_text().split())
    assert "`papermill --help-notebook NOTEBOOK` lists a notebook's `-p` parameters" in readme
    nb = cli.notebook_paths("02")[0]
    listed = subprocess.run([sys.executable, "-m", "papermill", "--help-notebook", str(nb)], capture_output=True,
                            text=True, timeout=120)
    info = pm.inspect_notebook(str(nb))
    assert listed.returncode == 0 and "backbone_kwargs" in info
    for name, param in info.items():
        assert f"  {name}: " in listed.stdout and param["help"] in listed.stdout


# ---------------------------------------------------------------- issue 27: no silent harm
@pytest.fixture
def source_copy(tmp_path, monkeypatch):
    """A copy of notebooks/ standing in for the source folder (runner.notebooks_dir), so that a
    regression harms the copy, never the checkout; its files' bytes before the test."""
    import shutil

    src = tmp_path / "notebooks"
    src.mkdir()
    for p in cli.notebook_paths():
        shutil.copy(p, src / p.name)
    monkeypatch.setattr(runner, "notebooks_dir", lambda: src)
    return src, {p.name: p.read_bytes() for p in src.iterdir()}


def test_run_refuses_the_source_notebooks_folder_as_output(source_copy, capsys, monkeypatch):
    def no_kernel(*a, **k):
        raise AssertionError("a notebook was executed")
    monkeypatch.setattr("papermill.execute_notebook", no_kernel)
    src, before = source_copy
    assert cli.main(["run", "--profile", "smoke", "--notebooks", "00", "--output", str(src)]) == 2
    err = capsys.readouterr().err
    assert "is the folder of the source notebooks" in err and "no notebook was started" in err
    assert {p.name: p.read_bytes() for p in src.iterdir()} == before


def test_strip_solutions_in_place_without_paths_is_refused(source_copy, capsys):
    src, before = source_copy
    assert cli.main(["strip-solutions", "--in-place"]) == 2
    err = capsys.readouterr().err
    assert "--in-place would remove the solutions from every source notebook" in err
    assert {p.name: p.read_bytes() for p in src.iterdir()} == before


def test_strip_solutions_keeps_sources_and_a_students_edits(source_copy, capsys):
    """--in-place on a source notebook stripped it; a second strip replaced an edited student copy (exit 0)."""
    src, before = source_copy
    nb = src / "01_supervision_targets.ipynb"
    assert cli.main(["strip-solutions", "--in-place", str(nb)]) == 2
    assert "from the source notebook(s) 01_supervision_targets.ipynb" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in src.iterdir()} == before
    assert cli.main(["strip-solutions", str(nb)]) == 0
    student = src / "student" / nb.name
    assert cli.main(["strip-solutions", str(nb)]) == 0                    # the same file again: no change, fine
    student.write_text(student.read_text().replace('"cells": [', '"cells": [{"cell_type": "markdown", '
                                                   '"metadata": {}, "source": "my answer"}, ', 1))
    edited = student.read_bytes()
    assert cli.main(["strip-solutions", str(nb)]) == 2
    err = capsys.readouterr().err
    assert f"{student} differs from the student edition of {nb}" in err and "--force" in err
    assert student.read_bytes() == edited
    assert cli.main(["strip-solutions", "--force", str(nb)]) == 0 and student.read_bytes() != edited


def test_export_html_of_the_source_notebooks_does_not_suggest_running_into_them(capsys):
    from midas_nb.course import export_html

    assert cli.main(["export-html", "--input", str(runner.notebooks_dir())]) == 2
    err = capsys.readouterr().err
    assert "source notebooks" in err and "--output" not in err and "midas-nb run --profile quick" in err
    with pytest.raises(FileNotFoundError) as e, pytest.warns(UserWarning, match="no executed code cell"):
        export_html(runner.notebooks_dir())
    assert "--output" not in str(e.value) and "source notebooks" in str(e.value)


def test_pyyaml_is_a_declared_dependency():
    import re
    import tomllib
    from pathlib import Path

    deps = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]["dependencies"]
    assert "pyyaml" in {re.split(r"[<>=!~\[ ;]", d, maxsplit=1)[0].lower() for d in deps}


def test_a_run_file_params_split_at_a_comma_is_named_with_how_to_write_it(tmp_path):
    from midas_nb.cli.runspec import load_run_file

    run_file = tmp_path / "run.yaml"
    run_file.write_text("profile: smoke\nparams: {seeds: 0,1}\n")
    settings, problems = load_run_file(run_file)
    assert "params" not in settings and len(problems) == 1
    assert "params: 1 is read as a parameter name: YAML splits {name: a,b} at the comma" in problems[0]
    assert "{seeds: [0, 1]}" in problems[0]


def test_the_report_command_carries_the_runs_cache_and_store(monkeypatch):
    """Issue 52: the report command printed at the end of a run omitted the run's MIDAS_CACHE_DIR, so the
    report said top-1 and training images were "not in this cache". It now carries MIDAS_CACHE_DIR and
    MIDAS_RUNS_DIR where they are set (quoted for the shell), and nothing where they are not."""
    from midas_nb.cli.runspec import RunSpec
    spec = RunSpec(profile="quick", params={"budget": 0.5})
    monkeypatch.delenv("MIDAS_RUNS_DIR", raising=False)
    monkeypatch.setenv("MIDAS_CACHE_DIR", "/data/my cache")
    assert runner.report_command(spec) == "MIDAS_CACHE_DIR='/data/my cache' midas-nb report --profile quick --budget 0.5"
    monkeypatch.setenv("MIDAS_RUNS_DIR", "/data/runs")
    assert runner.report_command(spec).startswith("MIDAS_CACHE_DIR='/data/my cache' MIDAS_RUNS_DIR=/data/runs midas-nb ")
    monkeypatch.delenv("MIDAS_CACHE_DIR")
    monkeypatch.delenv("MIDAS_RUNS_DIR")
    assert runner.report_command(spec) == "midas-nb report --profile quick --budget 0.5"


def test_run_leaves_the_callers_sigterm_handler_as_it_found_it():
    """`run` stops on SIGTERM as on Ctrl-C; called in-process (a notebook, a test) it gave the caller's
    SIGTERM handler back only when the process ended."""
    import signal

    before = signal.getsignal(signal.SIGTERM)
    assert cli.main(["run", "--profile", "nope"]) == 2
    assert signal.getsignal(signal.SIGTERM) is before



def test_an_interrupted_run_leaves_the_asyncio_logger_on_and_exits_without_a_task_traceback(monkeypatch, capsys):
    """After Ctrl-C `main` turned the asyncio logger off (nbclient's abandoned cell task logs a traceback as it is
    collected at exit) and left it off for an in-process caller (a notebook, a test). The CLI's exit stays quiet:
    a pending task collected at exit, as nbclient's is, prints nothing."""
    import logging

    def interrupted(**kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, "run_notebooks", interrupted)
    # on, whatever an earlier test left (a library's logging.config call disables existing loggers)
    monkeypatch.setattr(logging.getLogger("asyncio"), "disabled", False)
    assert cli.main(["run", "--profile", "smoke"]) == 130
    assert "midas-nb run: interrupted" in capsys.readouterr().err
    assert not logging.getLogger("asyncio").disabled
    import subprocess
    import sys
    from pathlib import Path

    code = ("import asyncio\nfrom midas_nb import cli\nasync def cell():\n    await asyncio.sleep(3600)\n"
            "loop = asyncio.new_event_loop()\ntask = loop.create_task(cell())\nloop.run_until_complete(asyncio.sleep(0))\n"
            "def interrupted(**kwargs):\n    raise KeyboardInterrupt\n"
            "cli.run_notebooks = interrupted\nraise SystemExit(cli.main(['run', '--profile', 'smoke']))")
    repo = str(Path(cli.__file__).parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=repo, timeout=120)
    assert r.returncode == 130 and "Task was destroyed" not in r.stderr, r.stderr
