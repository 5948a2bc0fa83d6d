"""``midas-nb run`` checks every argument before any kernel (issue 15, item 2) and carries one
run description — data roots, weights files, run file — to every notebook (issue 14, cases 1–2).

A problem is one line on stderr, the exit status is 2, no kernel starts and nothing in the output
directory changes; ``0`` is a value like any other, never "the profile's default"."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from midas_nb import cli, config
from midas_nb.backbones import create_backbone
from midas_nb.runspec import parse_data_roots, parse_weights

NO_CUDA = not torch.cuda.is_available()


@pytest.fixture
def no_kernel(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a notebook was executed")
    monkeypatch.setattr("papermill.execute_notebook", refuse)


@pytest.fixture
def recorder(monkeypatch):
    """Stands in for papermill: records the injected parameters and writes the output copy."""
    calls = []

    def fake(src, dst, parameters=None, **kw):
        calls.append((Path(src).name, dict(parameters or {})))
        shutil.copy(src, dst)
    monkeypatch.setattr("papermill.execute_notebook", fake)
    return calls


def _run(args, capsys):
    rc = cli.main(["run", "--no-progress", *args])
    err = capsys.readouterr().err
    return rc, [ln for ln in err.splitlines() if ln.strip()]


@pytest.mark.parametrize("args, expected", [
    (["-p", "budget", "abc"], "budget: expected a kept fraction b in (0, 1] (e.g. 0.25), got 'abc' (str)"),
    (["-p", "budget", "1.5"], "budget: expected a kept fraction b in (0, 1] (e.g. 0.25), got 1.5 (float)"),
    (["-p", "budget", "0"], "budget: expected a kept fraction b in (0, 1] (e.g. 0.25), got 0 (int)"),
    (["-p", "depth", "99"], "depth: L = 99 is outside 1..3 for vit_smoke (4 blocks"),
    (["-p", "depth", "0"], "depth: expected an integer L >= 1 (the scorer reads block L), got 0 (int)"),
    (["-p", "depth", "2.5"], "depth: expected an integer L >= 1 (the scorer reads block L), got 2.5 (float)"),
    (["-p", "seeds", "0"], "seeds: expected a non-empty list of integers (e.g. [0, 1]), got 0 (int)"),
    (["-p", "seeds", "[0, x]"], "seeds: expected a list of integers, got [0, 'x']"),
    (["-p", "seeds", "[]"], "seeds: expected a non-empty list of integers (e.g. [0, 1]), got [] (list)"),
    (["--backbone", "vit_nonexistent_patch16"], "unknown backbone 'vit_nonexistent_patch16'"),
    pytest.param(["--device", "cuda"], "device: 'cuda' was asked for but this machine has no CUDA device",
                 marks=pytest.mark.skipif(not NO_CUDA, reason="this machine has CUDA")),
    (["--device", "gpu"], "device: expected 'cpu', 'cuda', 'cuda:N' or 'mps', got 'gpu' (str)"),
])
def test_a_bad_argument_is_one_line_and_exit_2_before_any_kernel(args, expected, tmp_path, capsys, no_kernel):
    out = tmp_path / "out"
    rc, lines = _run(["--profile", "smoke", "--notebooks", "02", *args, "--output", str(out)], capsys)
    assert rc == 2
    problems = [ln for ln in lines if "no notebook was started" not in ln]
    assert len(problems) == 1 and all(ln.startswith("midas-nb run: ") for ln in lines), lines
    assert expected in problems[0]
    assert lines[-1] == "midas-nb run: 1 problem(s); no notebook was started"
    assert not out.exists()                                            # nothing written, no manifest


def test_every_problem_is_listed_and_a_good_copy_is_not_touched(tmp_path, capsys, no_kernel):
    out = tmp_path / "out"
    out.mkdir()
    (out / "00_quickstart.ipynb").write_text("the last good copy")
    args = ["--profile", "smoke", "-p", "budget", "abc", "-p", "depth", "0", "-p", "seeds", "[0, 0]",
            "--output", str(out)] + (["--device", "cuda"] if NO_CUDA else [])
    rc, lines = _run(args, capsys)
    assert rc == 2
    assert lines[-1] == f"midas-nb run: {3 + NO_CUDA} problem(s); no notebook was started"
    text = "\n".join(lines)
    assert "budget: expected" in text and "depth: expected" in text and "seeds: duplicated entries in [0, 0]" in text
    assert (out / "00_quickstart.ipynb").read_text() == "the last good copy"
    assert sorted(p.name for p in out.iterdir()) == ["00_quickstart.ipynb"]


def test_zero_is_never_the_profile_default(tmp_path):
    from midas_nb.study import Study
    for bad, name in ((dict(depth=0), "depth"), (dict(budget=0.0), "budget"), (dict(seeds=[]), "seeds")):
        with pytest.raises(config.ProfileError) as e:
            Study("smoke", progress=False, **bad)
        assert e.value.problems and e.value.problems[0].startswith(f"{name}:")
    if NO_CUDA:
        with pytest.raises(config.ProfileError, match="no CUDA device"):
            Study("smoke", progress=False, device="cuda")           # never a silent CPU run


@pytest.mark.slow
def test_study_methods_take_zero_as_given():
    """``study.protocol(depth=0)`` / ``target_coverage(budget=0)`` used to mean "the default"."""
    from midas_nb.study import Study
    study = Study("smoke", progress=False)
    with pytest.raises(ValueError, match=r"depth.* >= 1"):
        study.protocol(depth=0)
    with pytest.raises(ValueError, match=r"budget must be in \(0, 1\], got 0"):
        study.target_coverage(budget=0.0, ids=["T0"])


def test_weights_parameter_reaches_every_notebook(tmp_path, capsys, recorder):
    """Issue 14, case 1: ``-p weights /path/to/file`` (README) works as written."""
    path = tmp_path / "vit_smoke.pth"
    torch.save(create_backbone("vit_smoke", 4).state_dict(), path)
    rc, lines = _run(["--profile", "smoke", "-p", "weights", str(path), "--output", str(tmp_path / "o")], capsys)
    assert rc == 0, lines
    assert len(recorder) == 8
    for name, params in recorder:
        assert params["weights"] == {"vit_smoke": str(path.resolve())}, name


def test_missing_or_wrong_weights_files_stop_the_run(tmp_path, capsys, no_kernel):
    rc, lines = _run(["--profile", "smoke", "--weights", str(tmp_path / "nope.pth"), "--output", str(tmp_path)], capsys)
    assert rc == 2 and f"--weights vit_smoke: weights file {tmp_path / 'nope.pth'} does not exist" in lines[0]
    wide = tmp_path / "wide.pth"
    torch.save(create_backbone("vit_smoke_wide", 4).state_dict(), wide)
    rc, lines = _run(["--profile", "smoke", "--weights", f"vit_smoke={wide}", "--output", str(tmp_path)], capsys)
    assert rc == 2 and "does not fit VisionTransformer (48 wide, 4 blocks)" in lines[0] and "shape mismatches" in lines[0]
    rc, lines = _run(["--profile", "smoke", "--weights", f"vit_smoke_wide={wide}", "--notebooks", "02",
                      "--output", str(tmp_path)], capsys)
    assert rc == 2 and "--weights vit_smoke_wide: the selected notebooks do not use this backbone" in lines[0]


@pytest.mark.real_data
def test_every_grid_dataset_needs_a_root(shared_data, tmp_path, capsys, no_kernel, monkeypatch):
    """Issue 14, case 2: the paper grid spans cub, aircraft and cars; one --data-root used to leave
    the others without a root (and CUB without one silently became the synthetic set)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")                           # hub lines come at once
    cub = shared_data / "cub200_subset"
    rc, lines = _run(["--profile", "paper", "--device", "cpu", "--data-root", str(cub), "--notebooks", "04",
                      "--output", str(tmp_path)], capsys)
    text = "\n".join(lines)
    assert rc == 2
    assert "dataset 'aircraft' has no data root: pass --data-root aircraft=" in text
    assert "dataset 'cars' has no data root: pass --data-root cars=" in text
    assert "dataset 'cub'" not in text                                  # the plain root is CUB's
    # quick with a root for another dataset only: CUB is not replaced by the synthetic set
    rc, lines = _run(["--profile", "quick", "--data-root", f"aircraft={tmp_path / 'air'}", "--notebooks", "00",
                      "--output", str(tmp_path)], capsys)
    assert rc == 2 and any("dataset 'cub' has no data root" in ln for ln in lines)
    assert any("data root" in ln and "air" in ln and "does not exist" in ln for ln in lines)
    # a root that is not in its dataset's layout is named with what is missing
    rc, lines = _run(["--profile", "smoke", "--dataset", "aircraft", "--data-root", f"aircraft={cub}",
                      "--notebooks", "00", "--output", str(tmp_path)], capsys)
    assert rc == 2 and "does not have the aircraft layout" in lines[0] and "images_variant_trainval.txt" in lines[0]


def test_run_file_and_command_line(tmp_path, capsys, recorder):
    run = tmp_path / "run.yaml"
    run.write_text("profile: smoke\nnotebooks: '07'\nparams:\n  budget: 0.5\n  seeds: [0]\n")
    rc, lines = _run(["--config", str(run), "--output", str(tmp_path / "o")], capsys)
    assert rc == 0, lines
    assert recorder == [("07_deployment_guide.ipynb", {"profile": "smoke", "budget": 0.5, "seeds": [0]})]
    recorder.clear()
    rc, lines = _run(["--config", str(run), "-p", "budget", "0.25", "--output", str(tmp_path / "o")], capsys)
    assert rc == 0 and recorder[0][1]["budget"] == 0.25                 # the command line wins
    run.write_text("profile: smoke\ndata_root: /x\nbudget: 0.5\n")
    rc, lines = _run(["--config", str(run), "--output", str(tmp_path / "o")], capsys)
    assert rc == 2 and any("unknown setting 'budget'" in ln for ln in lines)


def test_data_root_and_weights_forms():
    assert parse_data_roots(["/d/CUB_200_2011"]) == ("/d/CUB_200_2011", {}, [])
    plain, roots, problems = parse_data_roots(["cub=/d/cub", "aircraft=/d/fgvc-aircraft-2013b", "cars=/d/cars"])
    assert plain is None and roots == {"cub": "/d/cub", "aircraft": "/d/fgvc-aircraft-2013b", "cars": "/d/cars"}
    assert not problems
    assert "unknown dataset 'birds'" in parse_data_roots(["birds=/d/x"])[2][0]
    assert "two plain paths" in parse_data_roots(["/a", "/b"])[2][0]
    bare, named, problems = parse_weights(["/w/deit_small.pth", "vit_base_patch16_224.augreg_in21k_ft_in1k=/w/B.npz"])
    assert bare == "/w/deit_small.pth" and named == {"vit_base_patch16_224.augreg_in21k_ft_in1k": "/w/B.npz"}
    assert not problems
