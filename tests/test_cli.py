"""``midas-nb`` command line: argument checks before any kernel, failure handling of ``run``."""
from __future__ import annotations

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from midas_nb import cli

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


def test_data_root_message_names_the_path(tmp_path, capsys):
    assert cli.main(["run", "--data-root", str(tmp_path / "nowhere"), "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "nowhere" in err and "does not exist" in err and "Traceback" not in err


def test_a_failing_notebook_keeps_the_earlier_good_copy(tmp_path, monkeypatch):
    src = tmp_path / "notebooks"
    src.mkdir()
    params = new_code_cell("budget = None", metadata={"tags": ["parameters"]})
    nbformat.write(new_notebook(cells=[new_markdown_cell("# ok"), params, new_code_cell("x = 1")], metadata=KERNEL),
                   str(src / "00_ok.ipynb"))
    nbformat.write(new_notebook(cells=[params, new_code_cell("y = 2"), new_code_cell("raise ValueError('boom')")],
                                metadata=KERNEL), str(src / "01_fails.ipynb"))
    monkeypatch.setattr(cli, "notebooks_dir", lambda: src)
    out = tmp_path / "out"
    out.mkdir()
    (out / "01_fails.ipynb").write_text("earlier good copy")
    with pytest.raises(RuntimeError) as err:
        cli.run_notebooks("smoke", extra={"budget": 0.5}, output=out, progress=False)
    msg = str(err.value)
    # execution count 4: the parameters cell, papermill's injected-parameters cell, y = 2, raise
    assert "01_fails.ipynb failed in cell 4" in msg and "ValueError: boom" in msg
    assert str(out / "failed" / "01_fails.ipynb") in msg
    assert (out / "01_fails.ipynb").read_text() == "earlier good copy"         # not overwritten
    failed = nbformat.read(str(out / "failed" / "01_fails.ipynb"), as_version=4)
    assert any(o.get("output_type") == "error" for c in failed.cells for o in c.get("outputs", []))
    done = nbformat.read(str(out / "00_ok.ipynb"), as_version=4)               # the first one finished
    assert any("budget = 0.5" in "".join(c.source) for c in done.cells)        # injected parameter
    assert not any((out / ".partial").glob("*.ipynb"))
