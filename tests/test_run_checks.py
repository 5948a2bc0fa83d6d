"""``midas-nb run`` checks every argument before any kernel (issue 15, item 2) and carries one
run description — data roots, weights files, run file — to every notebook (issue 14, cases 1–2).

A problem is one line on stderr, the exit status is 2, no kernel starts and nothing in the output
directory changes; ``0`` is a value like any other, never "the profile's default"."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from midas_nb import cli, config
from midas_nb.cli.args import param_value
from midas_nb.cli import runspec
from midas_nb.backbones import create_backbone
from midas_nb.cli.runspec import parse_data_roots, parse_weights

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
    (["-p", "budget", "abc"], "budget: expected a kept fraction b in (0, 1] (e.g. 0.25), got 'abc'"),
    (["-p", "budget", "1.5"], "budget: expected a kept fraction b in (0, 1] (e.g. 0.25), got 1.5"),
    (["-p", "budget", "0"], "budget: expected a kept fraction b in (0, 1] (e.g. 0.25), got 0"),
    (["-p", "depth", "99"], "depth: L = 99 is outside 1..3 for vit_smoke (4 blocks"),
    (["-p", "depth", "0"], "depth: expected an integer L >= 1 (the scorer reads block L), got 0"),
    (["-p", "depth", "2.5"], "depth: expected an integer L >= 1 (the scorer reads block L), got 2.5"),
    (["-p", "seeds", "0,x"], "seeds: expected a list of integers; wrong: 'x' (in [0, 'x'])"),  # -p seeds 0 is [0]
    (["-p", "seeds", "[0, x]"], "seeds: expected a list of integers; wrong: 'x' (in [0, 'x'])"),
    (["-p", "seeds", "[]"], "seeds: expected a non-empty list of integers (e.g. [0, 1]), got []"),
    # an empty value (an unset shell variable) is named, never read as the profile's default (null is)
    (["-p", "seeds", ""], "seeds: expected a list of integers; wrong: '' (in [''])"),
    (["-p", "budget", " "], "budget: expected a kept fraction b in (0, 1] (e.g. 0.25), got ' '"),
    (["-p", "output_dir", ""], "output_dir: expected a directory path, got ''"),
    (["--backbone", "vit_nonexistent_patch16"], "unknown backbone 'vit_nonexistent_patch16'"),
    pytest.param(["--device", "cuda"], "device: 'cuda' was asked for but this machine has no CUDA device",
                 marks=pytest.mark.skipif(not NO_CUDA, reason="this machine has CUDA")),
    (["--device", "gpu"], "device: expected 'cpu', 'cuda', 'cuda:N' or 'mps', got 'gpu'"),
    # the run description and the profile check a name with one rule: said once, not once by each
    (["--device", ""], "device: expected 'cpu', 'cuda', 'cuda:N' or 'mps', got ''"),
    (["--backbone", ""], "backbone: expected a backbone name, got ''; the names: "
     "python -c 'import midas_nb.backbones as b; print(b.list_backbones())' or a timm ViT name"),
    # a setting of the run alone (not a profile's) is named by its option
    (["--cell-timeout", "-5"], "midas-nb run: --cell-timeout: expected seconds > 0, got -5.0"),
    (["-p", "data_root", ""], "data_root: expected a directory path, got ''"),
])
def test_a_bad_argument_is_one_line_and_exit_2_before_any_kernel(args, expected, tmp_path, capsys, no_kernel):
    out = tmp_path / "out"
    rc, lines = _run(["--profile", "smoke", "--notebooks", "02", *args, "--output", str(out)], capsys)
    assert rc == 2
    problems = [ln for ln in lines if "no notebook was started" not in ln]
    assert len(problems) == 1 and all(ln.startswith("midas-nb run: ") for ln in lines), lines
    assert expected in problems[0]
    assert lines[-1] == "midas-nb run: 1 problem; no notebook was started"
    assert not out.exists()                                            # nothing written, no manifest


def test_the_command_an_empty_backbone_name_points_to_prints_the_names(capsys):
    line, = config.RunProfile.problems(config.get_profile("smoke", backbone=""))
    exec(line.split("python -c '")[1].split("'")[0], {})   # the code the shell hands python -c
    from midas_nb.backbones import list_backbones
    assert capsys.readouterr().out.strip() == str(list_backbones()) and "hybrid_lite0_deit" in list_backbones()


def test_every_problem_is_listed_and_a_good_copy_is_not_touched(tmp_path, capsys, no_kernel):
    out = tmp_path / "out"
    out.mkdir()
    (out / "00_quickstart.ipynb").write_text("the last good copy")
    args = ["--profile", "smoke", "-p", "budget", "abc", "-p", "depth", "0", "-p", "seeds", "[0, 0]",
            "--output", str(out)]
    rc, lines = _run(args, capsys)
    assert rc == 2
    assert lines[-1] == "midas-nb run: 3 problems; no notebook was started"
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
    with pytest.raises(ValueError, match=r"budget: expected a kept fraction b in \(0, 1\] \(e.g. 0.25\), got 0.0$"):
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


def test_notebook_05s_side_by_side_backbone_is_one_the_run_uses(tmp_path, capsys, recorder):
    """The backbones preflight checks are the cells' of the sweeps ``config.SWEEPS`` gives the notebooks: 05's
    side-by-side (the smoke profile's partner ``vit_smoke_deit``) is trained by it, so its weights are checked
    and passed on (before: refused as a backbone no selected notebook uses)."""
    path, wide = tmp_path / "deit.pth", tmp_path / "wide.pth"
    torch.save(create_backbone("vit_smoke_deit", 2).state_dict(), path)
    torch.save(create_backbone("vit_smoke_wide", 4).state_dict(), wide)
    rc, lines = _run(["--profile", "smoke", "--notebooks", "05", "--weights", f"vit_smoke_deit={path}",
                      "--output", str(tmp_path / "o")], capsys)
    assert rc == 0 and recorder[0][1]["weights"] == {"vit_smoke_deit": str(path.resolve())}, lines
    rc, lines = _run(["--profile", "smoke", "--notebooks", "05", "--weights", f"vit_smoke_deit={wide}",
                      "--output", str(tmp_path / "o")], capsys)
    assert rc == 2 and lines[0].startswith("midas-nb run: --weights vit_smoke_deit: ") and "does not fit" in lines[0]


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
    # a root that is not in its dataset's layout is named with the layout it has (a root of none: with what is
    # missing, test_a_plain_root_of_another_dataset_is_named_as_that_datasets)
    rc, lines = _run(["--profile", "smoke", "--dataset", "aircraft", "--data-root", f"aircraft={cub}",
                      "--notebooks", "00", "--output", str(tmp_path)], capsys)
    assert rc == 2 and lines[0].endswith(f"is read as aircraft but has the cub layout; expected --data-root cub={cub} "
                                         "(or --dataset cub)")        # as typed: a command to copy


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


# ------------------------------------------------------------------------------------------
# review of the command line (issue 14/15 follow-up): every problem checkable before a kernel
# starts is one line, all of them together, exit status 2, never a traceback
# ------------------------------------------------------------------------------------------

def _problems(lines):
    m = re.fullmatch(r"midas-nb run: (\d+) (problems?); no notebook was started", lines[-1] if lines else "")
    assert m and (m[1] == "1") == (m[2] == "problem"), lines   # the singular for one
    assert not any("Traceback" in ln for ln in lines)
    return lines[:-1]


def test_a_data_root_for_the_synthetic_set_is_an_error(tmp_path, capsys, no_kernel):
    """It used to be dropped (config.data_roots_of) and recorded in the notebooks' metadata."""
    out = tmp_path / "out"
    rc, lines = _run(["--profile", "smoke", "--notebooks", "02", "--data-root", str(tmp_path), "--output", str(out)],
                     capsys)
    (line,) = _problems(lines)
    assert rc == 2 and "the run's dataset is 'synthetic', which is generated and takes no data root" in line
    assert "use --dataset cub --data-root PATH" in line and str(tmp_path) in line
    rc, lines = _run(["--profile", "quick", "--dataset", "synthetic", "--notebooks", "02", "--data-root",
                      str(tmp_path), "--output", str(out)], capsys)
    assert rc == 2 and "takes no data root" in _problems(lines)[0]
    # a named root for a dataset that no notebook of the run reads is not silently unused either
    rc, lines = _run(["--profile", "smoke", "--notebooks", "02", "--data-root", f"cub={tmp_path}",
                      "--output", str(out)], capsys)
    assert rc == 2 and any("no notebook of this run reads dataset 'cub'" in ln and "--dataset cub" in ln
                           for ln in _problems(lines))
    assert not out.exists()


@pytest.mark.parametrize("args, expected", [
    (["-p", "backbone_kwargs", "{embed_dim: 7}"],
     "backbone: 'vit_smoke' (built here from timm's VisionTransformer) cannot be built with backbone_kwargs "
     "{'embed_dim': 7}: AssertionError: dim should be divisible by num_heads"),
    (["-p", "backbone_kwargs", "{nosuch: 7}"], "unexpected keyword argument 'nosuch'"),
    (["-p", "backbone_kwargs", "{vit_smoke: 5}"], "unexpected keyword argument 'vit_smoke'"),
    (["-p", "budget", "2e0"], "budget: expected a kept fraction b in (0, 1] (e.g. 0.25), got 2.0"),
    (["--data-root", "cub="], "--data-root 'cub=': empty path"),
    (["--weights", "vit_smoke="], "--weights 'vit_smoke=': empty path"),
    (["--notebooks", ","], "--notebooks: ',' names no notebook; expected comma-separated prefixes such as 00,02"),
    (["--notebooks", "2"], "--notebooks: no notebook matches '2' (prefixes have two digits: '02')"),
    (["-p", "depth", "9", "-p", "depth", "3"], "-p depth: given 2 times (9, 3); expected one value"),
    (["--notebooks", "0"], "--notebooks: no notebook matches '0' (prefixes have two digits: '00')"),  # not all 0x
    (["--notebooks", "00,,02"], "--notebooks: '00,,02' has an empty entry; expected comma-separated prefixes"),
    (["-p", "dataset", "[cub]"], "dataset: expected one of ['cub', 'aircraft', 'cars', 'synthetic'], got ['cub']"),
])
def test_more_bad_arguments_are_one_line_before_any_kernel(args, expected, tmp_path, capsys, no_kernel):
    out = tmp_path / "out"
    rc, lines = _run(["--profile", "smoke", "--notebooks", "02", *args, "--output", str(out)], capsys)
    (line,) = _problems(lines)
    assert rc == 2 and expected in line, line
    assert not out.exists()


@pytest.mark.parametrize("args", [["--device", "cuda:7", "-p", "device", "cpu"],
                                  ["--backbone", "vit_smoke", "-p", "backbone", "vit_tiny_patch16_224"],
                                  ["--dataset", "synthetic", "-p", "dataset", "cub"],
                                  ["--weights", "a.pth", "-p", "weights", "b.pth"]])
def test_an_option_and_a_p_that_disagree_are_refused(args, tmp_path, capsys, no_kernel):
    """They used to run with the -p value, silently."""
    rc, lines = _run(["--profile", "smoke", "--notebooks", "02", *args, "--output", str(tmp_path / "o")], capsys)
    assert rc == 2 and f"midas-nb run: {args[0]} {args[1]!r} and -p {args[3]} {args[4]!r} differ; give one of them" \
        in lines


def test_an_option_and_a_p_with_one_value_run(tmp_path, capsys, recorder):
    rc, _ = _run(["--profile", "smoke", "--notebooks", "02", "--device", "cpu", "-p", "device", "cpu",
                  "--backbone", "vit_smoke", "-p", "backbone", "vit_smoke", "--output", str(tmp_path / "o")], capsys)
    assert rc == 0 and recorder[0][1]["device"] == "cpu" and recorder[0][1]["backbone"] == "vit_smoke"


def test_numbers_with_an_exponent_are_numbers(tmp_path, capsys, recorder):
    """PyYAML (YAML 1.1) reads ``1e-1`` as a string: ``-p budget 1e-1`` used to be "got '1e-1' (str)"."""
    assert param_value("", "1e-9") == 1e-9 and param_value("", "010") == 10 and param_value("", "-3") == -3
    assert param_value("", "[1e-1, 0.5]") == [0.1, 0.5] and param_value("", "{img_size: 64}") == {"img_size": 64}
    assert param_value("", "abc") == "abc" and param_value("", "null") is None
    rc, lines = _run(["--profile", "smoke", "--notebooks", "07", "-p", "budget", "1e-1", "--output",
                      str(tmp_path / "o")], capsys)
    assert rc == 0 and recorder[0][1]["budget"] == 0.1


def test_weights_that_are_not_a_file_say_what_they_are(tmp_path, capsys, no_kernel):
    text = tmp_path / "notes.pth"
    text.write_text("not weights\n" * 5)
    rc, lines = _run(["--profile", "smoke", "--notebooks", "02", "--weights", f"vit_smoke={text}",
                      "--output", str(tmp_path / "o")], capsys)
    (line,) = _problems(lines)
    assert rc == 2 and f"--weights vit_smoke: {text} is not a weights file this loader can read" in line
    assert "expected a PyTorch state dict (.pth/.pt/.bin" in line and ".safetensors" in line and ".npz" in line
    folder = tmp_path / "weights"
    folder.mkdir()
    torch.save(create_backbone("vit_smoke", 4).state_dict(), folder / "vit_smoke.pth")
    rc, lines = _run(["--profile", "smoke", "--notebooks", "02", "--weights", f"vit_smoke={folder}",
                      "--output", str(tmp_path / "o")], capsys)
    (line,) = _problems(lines)
    assert rc == 2 and f"weights file {folder} is a directory" in line and "it holds vit_smoke.pth" in line
    assert "does not exist" not in line


def test_an_output_directory_that_cannot_be_made_is_a_preflight_line(tmp_path, capsys, no_kernel):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    rc, lines = _run(["--profile", "smoke", "--notebooks", "02", "--output", str(blocker / "out")], capsys)
    (line,) = _problems(lines)
    assert rc == 2 and f"--output '{blocker / 'out'}': cannot be created: '{blocker}' is a file" in line
    rc, lines = _run(["--profile", "smoke", "--notebooks", "02", "--output", str(blocker)], capsys)
    assert rc == 2 and f"--output '{blocker}': is a file" in _problems(lines)[0]
    assert blocker.read_text() == "x" and sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def test_every_group_of_problems_is_listed_in_one_pass(tmp_path, capsys, no_kernel):
    """Preflight used to stop after the settings' group: the device hid the roots and weights."""
    rc, lines = _run(["--profile", "smoke", "--notebooks", "02", "--dataset", "cub",
                      "--device", "cuda:99", "--data-root", str(tmp_path / "no_cub"),
                      "--weights", str(tmp_path / "no.pth"), "--output", str(tmp_path / "o")], capsys)
    problems = _problems(lines)
    assert rc == 2 and len(problems) == 3, problems
    assert "device: 'cuda:99'" in problems[0]
    assert any("no_cub" in ln and "does not exist or is not a directory" in ln for ln in problems)
    assert any(f"--weights vit_smoke: weights file {tmp_path / 'no.pth'} does not exist" in ln for ln in problems)


def _paper_file(tmp_path, name="deit_tiny_patch16_224.fb_in1k"):
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from weight_files import SMALL_KWARGS, paper_arch, write_deit_release

    model = paper_arch(name.split(".")[0], **SMALL_KWARGS[name])          # 224 px, as released
    return write_deit_release(model, tmp_path / "deit_tiny.pth"), SMALL_KWARGS[name]


def test_a_backbone_with_other_patches_than_the_profile_fails_in_preflight(tmp_path, capsys, no_kernel):
    """Smoke cuts 8 px patches; DeiT-Ti/16 used to pass preflight and fail in notebook 00 cell 7
    ("Input height (64) doesn't match model (224)")."""
    deit = "deit_tiny_patch16_224.fb_in1k"
    path, small = _paper_file(tmp_path)
    kwargs = "{%s: {embed_dim: %d, num_heads: %d}}" % (deit, small["embed_dim"], small["num_heads"])
    rc, lines = _run(["--profile", "smoke", "--notebooks", "02", "--backbone", deit, "--weights", f"{deit}={path}",
                      "-p", "backbone_kwargs", kwargs, "--output", str(tmp_path / "o")], capsys)
    (line,) = _problems(lines)
    assert rc == 2 and f"patch_size: {deit} has 16 px patches but the profile's patch_size is 8 px" in line
    assert "a profile with 16 px patches (paper, quick, rehearsal)" in line


def test_the_input_size_follows_the_profile_and_a_224_file_loads(tmp_path):
    """A 224 px weights file in a 64 px profile: ``img_size`` follows ``image_size`` (timm resamples
    the position embeddings), as the rehearsal's own ``img_size: 64`` did; a ``backbone_kwargs``
    that replaces the rehearsal's used to leave a 224 px model fed 64 px images."""
    from midas_nb.backbones import backbone_kwargs, check_backbone

    deit = "deit_tiny_patch16_224.fb_in1k"
    path, small = _paper_file(tmp_path)
    prof = config.get_profile("rehearsal", backbone=deit, backbone_kwargs={deit: small})
    kwargs = backbone_kwargs(prof, deit)
    assert kwargs == dict(small, img_size=64)
    model = create_backbone(deit, 4, weights=path, **kwargs)
    assert model.patch_embed.img_size == (64, 64) and tuple(model.pos_embed.shape) == (1, 1 + 16, small["embed_dim"])
    assert model(torch.zeros(2, 3, 64, 64)).shape == (2, 4)
    # the profiles' own backbones get nothing added (their checkpoint keys stay as they were)
    for name in ("smoke", "quick", "paper"):
        p = config.get_profile(name)
        assert all("img_size" not in backbone_kwargs(p, b) for b in [p["backbone"], *p["scale_backbones"]])
    # an img_size that contradicts the images is a problem, not a silent mismatch
    rng = torch.random.get_rng_state()
    assert check_backbone(deit, dict(small, img_size=96), [6], image_size=64, patch_size=16) == [
        f"image_size: {deit} is built for 96×96 px inputs (backbone_kwargs img_size) but the profile's images are "
        f"64 px; drop img_size from backbone_kwargs (it then follows image_size) or pass -p image_size 96"]
    assert torch.equal(rng, torch.random.get_rng_state())              # a meta-device build draws nothing


@pytest.mark.parametrize("text, expected", [
    ("notebooks: 2\n", ["notebooks: expected prefixes as a string '00,02' or a list of quoted strings ['00', '02'], "
                        "got 2"]),
    ("notebooks: [00, 02]\n", ["got [0, 2] (YAML reads 00 and 02 as the numbers 0 and 2: quote them)"]),
    ("profile: [smoke]\n", ["profile: expected one of ['paper', 'quick', 'rehearsal', 'smoke'], got ['smoke']"]),
    ("profile: smoke\ndataset: [cub]\n", ["dataset: expected one of ['cub', 'aircraft', 'cars', 'synthetic'], "
                                         "got ['cub']"]),
    ("data_root: 5\noutput: 5\n", ["data_root: expected a directory path, got 5",
                                   "output: expected a directory path, got 5"]),
    ("profile: smoke\ndata_roots: {cub: }\n", ["data_roots.cub: expected a directory path, got None"]),
    ("profile: smoke\nweights: {vit_smoke: [1]}\n", ["weights.vit_smoke: expected a weights file path, got [1]"]),
    ("profile: smoke\nparams: [1]\ncell_timeout: 0\n", ["params: expected a mapping of notebook parameters",
                                                       "cell_timeout: expected seconds > 0, got 0"]),
])
def test_run_file_fields_are_type_checked(text, expected, tmp_path, capsys, no_kernel):
    run = tmp_path / "run.yaml"
    run.write_text(text)
    rc, lines = _run(["--config", str(run), "--output", str(tmp_path / "o")], capsys)
    problems = _problems(lines)
    assert rc == 2 and len(problems) == len(expected), problems
    for line, want in zip(problems, expected):
        assert line.startswith(f"midas-nb run: --config '{run}': ") and want in line, line
    rc, lines = _run(["--config", str(tmp_path), "--output", str(tmp_path / "o")], capsys)
    assert rc == 2 and f"--config '{tmp_path}': is a directory; expected a YAML run file" in _problems(lines)[0]


def test_run_file_paths_are_relative_to_the_run_file(tmp_path, capsys, recorder, monkeypatch):
    """Values are no longer turned into strings before the check, and a relative path names the
    same file from any working directory."""
    here = tmp_path / "project"
    (here / "w").mkdir(parents=True)
    torch.save(create_backbone("vit_smoke", 4).state_dict(), here / "w" / "vit_smoke.pth")
    run = here / "run.yaml"
    run.write_text("profile: smoke\nnotebooks: ['07']\nweights: {vit_smoke: w/vit_smoke.pth}\noutput: executed\n"
                   "params: {budget: 1e-1}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    rc, lines = _run(["--config", str(run)], capsys)
    assert rc == 0, lines
    assert recorder == [("07_deployment_guide.ipynb", {"profile": "smoke", "budget": 0.1,
                                                       "weights": {"vit_smoke": str(here / "w" / "vit_smoke.pth")}})]
    assert (here / "executed" / "07_deployment_guide.ipynb").is_file() and not any(elsewhere.iterdir())


def test_export_html_answers_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MIDAS_RUNS_DIR", str(tmp_path / "runs"))
    assert cli.main(["export-html", "--profile", "smoke"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{tmp_path / 'runs' / 'smoke'} does not exist" in err[0]
    assert "run `midas-nb run --profile smoke` first" in err[0]
    (tmp_path / "runs" / "smoke").mkdir(parents=True)
    assert cli.main(["export-html", "--profile", "smoke"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no executed notebook (NN_*.ipynb with outputs)" in err[0]
    assert "run `midas-nb run --profile smoke` first" in err[0] and "--output" not in err[0]


def test_strip_solutions_answers_every_bad_path_in_one_line_each(tmp_path, capsys):
    bad = tmp_path / "notes.ipynb"
    bad.write_text("vm\n")
    missing = tmp_path / "nope.ipynb"
    assert cli.main(["strip-solutions", str(missing), str(bad), str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"midas-nb strip-solutions: {missing} does not exist; expected an .ipynb file",
                   err[1],
                   f"midas-nb strip-solutions: {tmp_path} is a directory; expected an .ipynb file"]
    assert err[1].startswith(f"midas-nb strip-solutions: {bad} is not a Jupyter notebook (NotJSONError")
    assert not (tmp_path / "student").exists()      # nothing written


def test_report_arguments_are_checked(tmp_path, capsys):
    out = tmp_path / "report"
    assert cli.main(["report", "--depth", "0", "--budget", "7", "--from-tables", "results", "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == ("midas-nb report: --from-tables re-renders the saved tables as they are; --depth, --budget "
                      "select what is read from a result store and would be ignored: drop them or drop --from-tables")
    assert err[1:] == ["midas-nb report: --depth: expected an integer L >= 1 (the scorer reads block L), got 0",
                       "midas-nb report: --budget: expected a kept fraction b in (0, 1] (e.g. 0.25), got 7.0",
                       "midas-nb report: 3 problems; nothing was written"]   # all of them at once
    assert cli.main(["report", "--profile", "smoke", "--depth", "0", "--budget", "7", "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[:2] == ["midas-nb report: --depth: expected an integer L >= 1 (the scorer reads block L), got 0",
                       "midas-nb report: --budget: expected a kept fraction b in (0, 1] (e.g. 0.25), got 7.0"]
    assert cli.main(["report", "--profile", "smoke", "--depth", "9", "--output", str(out)]) == 2
    assert "--depth: L = 9 is outside 1..3 for vit_smoke (4 blocks" in capsys.readouterr().err
    # a backbone is checked with the run's own checks, at the profile's depth (quick: L = 6); the quick
    # profile's other settings (its sweep lists, data) are not the report's to name
    assert cli.main(["report", "--profile", "quick", "--backbone", "vit_smoke", "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["midas-nb report: --depth: L = 6, 9 is outside 1..3 for vit_smoke (4 blocks; the scorer reads "
                   "block L and blocks L+1..4 see the kept tokens)", "midas-nb report: 1 problem; nothing was written"]
    assert not out.exists()


def test_a_budget_below_the_cells_resolution_is_refused_before_any_kernel(tmp_path, capsys, no_kernel):
    """``-p budget 1e-9`` used to pass preflight as a number in (0, 1] and fail in notebook 02's
    cell 4: result cells key b to 6 decimals (``SweepCell``), so it became 0.0."""
    from midas_nb.sweeps import SweepCell

    with pytest.raises(ValueError, match="budget: 1e-09 is below 1e-06"):           # why the floor is 1e-6
        SweepCell("synthetic", "vit_smoke", 2, 1e-9, "T1", 0)
    assert SweepCell("synthetic", "vit_smoke", 2, 1e-6, "T1", 0).budget == 1e-6
    rc, lines = _run(["--profile", "smoke", "--notebooks", "02", "-p", "budget", "1e-9", "--output",
                      str(tmp_path / "o")], capsys)
    (line,) = _problems(lines)
    assert rc == 2 and line == ("midas-nb run: budget: 1e-09 is below 1e-06, the resolution at which result cells "
                                "key b (6 decimals; it would round to 0); expected b in [1e-06, 1]")
    assert config.RunProfile.problems(config.get_profile("smoke", budget=1e-6, budgets=[1e-6, 1.0])) == []
    assert config.RunProfile.problems(config.get_profile("smoke", budgets=[5e-7, 0.5])) == [
        "budgets: expected a list of kept fractions b in (0, 1], at least 1e-06; wrong: 5e-07 (in [5e-07, 0.5])"]
    assert config.RunProfile.problems(config.get_profile("smoke", depths=[1, 0, 2.5])) == [  # each wrong entry
        "depths: expected a list of integers L >= 1; wrong: 0, 2.5 (in [1, 0, 2.5])"]


def test_report_paths_are_checked_before_anything_is_written(tmp_path, capsys):
    """A missing README used to fail after REPORT.md and its tables were written (exit 1); a missing
    --from-tables directory said "tables missing"; every problem is now listed at once, exit 2."""
    out = tmp_path / "report"
    no_markers = tmp_path / "README.md"
    no_markers.write_text("# a README without a results section\n")
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    assert cli.main(["report", "--from-tables", str(tmp_path / "nope"), "--readme",
                     str(tmp_path / "missing.md"), "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == f"midas-nb report: --from-tables '{tmp_path / 'nope'}': does not exist; expected the directory " \
                     f"of a report's CSV tables"
    assert err[1].startswith(f"midas-nb report: --readme '{tmp_path / 'missing.md'}': does not exist; expected a "
                             f"README file with the results section markers")
    assert err[2:] == ["midas-nb report: 2 problems; nothing was written"]
    assert cli.main(["report", "--profile", "smoke", "--readme", str(no_markers),
                     "--budget", "0", "--output", str(blocker / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"midas-nb report: --readme '{no_markers}': has no results section; expected the markers "
        f"'<!-- midas-nb report: begin (generated by `midas-nb report` from the results/ tables; do not edit) -->' "
        f"... '<!-- midas-nb report: end -->' around the section to rewrite",
        f"midas-nb report: --output '{blocker / 'out'}': cannot be created: '{blocker}' is a file; expected a "
        f"directory for the report",
        "midas-nb report: --budget: expected a kept fraction b in (0, 1] (e.g. 0.25), got 0.0",
        "midas-nb report: 3 problems; nothing was written"]
    assert not out.exists() and no_markers.read_text() == "# a README without a results section\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README.md", "a_file"]


def test_sweep_status_refuses_a_folder_that_is_not_a_store(tmp_path, capsys):
    (tmp_path / "notes").mkdir()
    assert cli.main(["sweep", "status", str(tmp_path / "notes")]) == 2  # a bad store is a usage error
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a sweep store" in err[0] and "cells/" in err[0]
    from midas_nb.sweeps import ResultStore, SweepCell
    store = ResultStore(tmp_path / "real")
    store.register([SweepCell(dataset="cub", backbone="b", depth=6, budget=0.25, condition="T5", seed=0,
                              checkpoint_id="c", params={})])
    assert cli.main(["sweep", "status", str(tmp_path / "real")]) == 0
    assert "pending" in capsys.readouterr().out


def test_ctrl_c_is_one_line_and_exit_130(tmp_path, capsys, monkeypatch):
    def interrupted(src, dst, **k):   # papermill stopped mid-notebook: its half copy under .partial/<run_id>/
        Path(dst).write_text("half")
        raise KeyboardInterrupt
    monkeypatch.setattr("papermill.execute_notebook", interrupted)
    code = cli.main(["run", "--profile", "smoke", "--notebooks", "00", "--output", str(tmp_path / "nb")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 130 and "interrupted" in err[-1] and "Traceback" not in "\n".join(err)
    assert "a build stopped mid-training starts again" in err[-1]   # only finished builds are cached
    assert not (tmp_path / "nb" / "00_quickstart.ipynb").exists()
    assert not (tmp_path / "nb" / ".partial").exists()   # the half copy went with this run's folder


def test_per_backbone_finetune_entries_are_checked_like_the_shared_recipe():
    ok = config.get_profile("quick", finetune=dict(epochs=15, batch_size=64, lr=2e-3, warmup_epochs=1,
                                                   hybrid_lite0_deit=dict(epochs=20)))
    assert config.RunProfile.problems(ok) == []
    bad = config.get_profile("quick", finetune=dict(epochs=15, batch_size=64, lr=2e-3, warmup_epochs=1,
                                                    hybrid_lite0_deit=dict(epochs=0, lr=-1)))
    assert config.RunProfile.problems(bad) == [
        "finetune.hybrid_lite0_deit.epochs: expected an integer >= 1, got 0",
        "finetune.hybrid_lite0_deit.lr: expected a number > 0, got -1"]
    # label smoothing and weight decay are profile problems too (before: the recipe's bare ValueError later)
    bad = config.get_profile("quick", finetune=dict(epochs=15, batch_size=64, lr=2e-3, label_smoothing=1.0,
                                                    weight_decay=-0.1))
    assert config.RunProfile.problems(bad) == [
        "finetune.weight_decay: expected a number >= 0, got -0.1",
        "finetune.label_smoothing: expected a number in [0, 1), got 1.0"]


def test_a_run_file_problem_does_not_hide_the_other_problems(tmp_path, capsys, no_kernel):
    rf = tmp_path / "run.yaml"
    rf.write_text(f"profile: quick\nfoo: 1\ndata_roots:\n  cub: {tmp_path / 'nope'}\n")
    assert cli.main(["run", "--config", str(rf), "--output", str(tmp_path / "nb")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert any("unknown setting 'foo'" in ln for ln in lines)
    assert any("does not exist" in ln and "nope" in ln for ln in lines)
    assert lines[-1] == "midas-nb run: 2 problems; no notebook was started"
    assert not (tmp_path / "nb").exists()


def test_report_from_a_folder_without_the_tables_is_one_line_exit_2(tmp_path, capsys):
    (tmp_path / "findings.csv").write_text("x\n")
    assert cli.main(["report", "--from-tables", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "6 of the report's 7 tables missing" in err[0] and "findings.csv" not in err[0]
    assert err[-1] == "midas-nb report: 1 problem; nothing was written"
    # the tables are rendered as they are: a profile would be ignored, so it is refused (it was, silently)
    assert cli.main(["report", "--profile", "smoke", "--from-tables", "results", "--output", str(tmp_path / "o")]) == 2
    assert "--profile selects what is read from a result store" in capsys.readouterr().err


def test_a_refused_parameter_is_reported_once_not_also_value_checked(tmp_path, capsys, no_kernel):
    assert cli.main(["run", "--profile", "smoke", "--notebooks", "00", "--output", str(tmp_path / "nb"),
                     "-p", "finetune", '{"epochs": 0}']) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and "unknown notebook parameter(s) ['finetune']" in lines[0]
    assert lines[1] == "midas-nb run: 1 problem; no notebook was started"


def test_a_distilled_schedule_no_longer_than_its_coarse_epochs_fails_before_any_kernel(tmp_path, capsys, no_kernel):
    """``hybrid_lite0_deit`` trains its first ``coarse_epochs`` (18) epochs on the teacher's grid; a
    shorter schedule passed every setting check and failed only in notebook 00, after the stem
    features (minutes on real data)."""
    import numpy as np
    from midas_nb.backbones import check_epochs, distill_recipe
    from midas_nb.data import make_synthetic_cub
    from midas_nb.study import Study
    assert distill_recipe("hybrid_lite0_deit").coarse_epochs == 18
    assert check_epochs("hybrid_lite0_deit", 19) == [] and check_epochs("hybrid_lite0_vit", 1) == []
    assert check_epochs("vit_smoke_deit", 1) == []  # no coarse stage
    assert check_epochs("hybrid_lite0_deit", 18) == [
        "hybrid_lite0_deit trains its first 18 epochs on coarse tokens (DISTILLED_RECIPES, progressive token "
        "resolution); expected more than 18 epochs, got 18"]
    cub = make_synthetic_cub(tmp_path / "cub", num_classes=2, images_per_class=2, image_size=64)
    # the rehearsal trains 1 epoch: reported before any kernel, as one line
    rc, lines = _run(["--profile", "rehearsal", "--backbone", "hybrid_lite0_deit", "--notebooks", "02",
                      "--data-root", str(cub), "--output", str(tmp_path / "o")], capsys)
    assert rc == 2 and _problems(lines) == [
        "midas-nb run: finetune.epochs: on cub, hybrid_lite0_deit trains its first 18 epochs on coarse tokens "
        "(DISTILLED_RECIPES, progressive token resolution); expected more than 18 epochs, got 1"]
    # the embedded synthetic set reads synthetic_finetune (the Python API checks it too; NumPy integers
    # are integers); a per-backbone entry is named as such
    with pytest.raises(config.ProfileError, match=r"synthetic_finetune\.epochs: on synthetic, hybrid_lite0_deit "
                                                  r".*expected more than 18 epochs, got 18"):
        Study("quick", synthetic_finetune=dict(epochs=np.int64(18), batch_size=16, lr=1e-3, warmup_epochs=2))
    with pytest.raises(config.ProfileError, match=r"^finetune\.hybrid_lite0_deit\.epochs: on cub, .*got 17$"):
        Study("quick", data_root=str(cub), finetune=dict(epochs=15, batch_size=64, lr=2e-3, warmup_epochs=1,
                                                         hybrid_lite0_deit=dict(epochs=17)))
    # a refused -p finetune is reported once, as unknown, not also as a schedule
    rc, lines = _run(["--profile", "quick", "--notebooks", "02", "-p", "finetune", "{epochs: 3}",
                      "--output", str(tmp_path / "o")], capsys)
    assert rc == 2 and len(_problems(lines)) == 1 and "unknown notebook parameter(s) ['finetune']" in lines[0]
    # the profiles' own schedules pass: 24 epochs on real data, 60 on the synthetic set
    for spec in (runspec.RunSpec(profile="quick"), runspec.RunSpec(profile="quick", data_root=str(cub))):
        assert runspec.preflight(spec, ["02_three_condition_protocol.ipynb"]) == []


@pytest.mark.parametrize("dataset", ["cub", "aircraft", "cars"])
def test_a_root_without_the_annotation_files_is_one_problem_naming_both_splits(tmp_path, dataset):
    """Both splits read the same missing file: one line, not one per split."""
    from midas_nb.data import check_layout

    problems = check_layout(dataset, tmp_path)
    assert len(problems) == 1, problems
    split = "trainval" if dataset == "aircraft" else "train"
    assert f"does not have the {dataset} layout ({split} and test splits)" in problems[0]


@pytest.mark.parametrize("notebook, name, good, bad, expected", [
    # issue 28: the FGVC-Aircraft label level
    ("07", "aircraft_level", "family", "model",
     "aircraft_level: expected one of ['variant', 'family', 'manufacturer'], got 'model'"),
    # the protocol's autocast: the paper profile's on a quick run, or float32 on a paper run
    ("02", "precision", "bfloat16", "float16", "precision: expected one of ['float32', 'bfloat16'], got 'float16'"),
])
def test_a_choice_setting_is_a_run_parameter(tmp_path, capsys, recorder, notebook, name, good, bad, expected):
    """``-p NAME VALUE`` reaches every notebook's study; a value not offered is one preflight line."""
    rc, lines = _run(["--profile", "smoke", "--notebooks", notebook, "-p", name, good, "--output",
                      str(tmp_path / "o")], capsys)
    assert rc == 0 and recorder[0][1][name] == good
    rc, lines = _run(["--profile", "smoke", "--notebooks", notebook, "-p", name, bad, "--output",
                      str(tmp_path / "p")], capsys)
    (line,) = _problems(lines)
    assert rc == 2 and expected in line


def test_images_per_class_cap_is_one_integer_or_a_mapping_by_dataset():
    quick = config.get_profile("quick")
    assert config.images_per_class(quick, "cars") == 12
    assert config.images_per_class(quick, "cub") is None
    assert config.images_per_class(quick, "aircraft (family)") is None
    assert config.images_per_class(config.get_profile("quick", max_images_per_class=3), "cub") == 3
    assert config.images_per_class(config.get_profile("smoke"), "synthetic") is None
    assert config.RunProfile.problems(quick) == []
    bad = config.get_profile("quick", max_images_per_class=dict(cars=0, bikes=4))
    assert config.RunProfile.problems(bad) == [
        "max_images_per_class: expected {dataset: integer >= 1} with datasets from "
        "['cub', 'aircraft', 'cars', 'synthetic'], got {'cars': 0, 'bikes': 4}"]
    assert config.RunProfile.problems(config.get_profile("quick", max_images_per_class="x")) == [
        "max_images_per_class: expected None (all), an integer >= 1 or {dataset: integer >= 1}, got 'x'"]


def test_a_recipe_entry_of_a_dataset_applies_to_that_dataset_and_a_backbone_entry_wins():
    quick = config.get_profile("quick")
    bb = "hybrid_lite0_deit"
    # CUB and Cars keep the shared recipe (their checkpoint keys do not change)
    assert config.finetune_settings(quick, "cub", bb) == dict(epochs=24, batch_size=64, lr=2e-3, warmup_epochs=1)
    assert config.finetune_settings(quick, "aircraft", bb) == dict(epochs=24, batch_size=16, lr=1e-3, warmup_epochs=1)
    assert config.finetune_settings(quick, "aircraft (family)", "vit_small") == dict(
        epochs=15, batch_size=16, lr=1e-3, warmup_epochs=1)
    assert config.finetune_setting_name(quick, "aircraft", bb, "batch_size") == "finetune.aircraft.batch_size"
    assert config.finetune_setting_name(quick, "aircraft", bb, "epochs") == f"finetune.{bb}.epochs"
    assert config.finetune_setting_name(quick, "cub", bb, "lr") == "finetune.lr"
    both = config.get_profile("quick", finetune=dict(epochs=15, aircraft=dict(epochs=30), **{bb: dict(epochs=20)}))
    assert config.finetune_settings(both, "aircraft", bb)["epochs"] == 20
    bad = config.get_profile("quick", finetune=dict(epochs=15, batch_size=64, lr=2e-3, aircraft=dict(batch_size=0)))
    assert config.RunProfile.problems(bad) == [
        "finetune.aircraft.batch_size: expected an integer >= 1, got 0"]


def test_profile_and_dataset_names_are_checked_with_the_other_settings(tmp_path, capsys, no_kernel):
    # argparse's choices would stop at the first bad name; the preflight lists every problem
    rc, lines = _run(["--profile", "smoke", "--notebooks", "02", "--dataset", "nope", "-p", "budget", "3",
                      "--output", str(tmp_path / "o")], capsys)
    assert rc == 2 and _problems(lines) == [
        "midas-nb run: dataset: expected one of ['cub', 'aircraft', 'cars', 'synthetic'], got 'nope'",
        "midas-nb run: budget: expected a kept fraction b in (0, 1] (e.g. 0.25), got 3"]
    # an unknown profile is listed with the problems that can be checked without one
    rc, lines = _run(["--profile", "smook", "--notebooks", "02", "--cell-timeout", "-1", "--output",
                      str(tmp_path / "o")], capsys)
    assert rc == 2 and _problems(lines) == [
        "midas-nb run: profile: expected one of ['paper', 'quick', 'rehearsal', 'smoke'], got 'smook' "
        "(did you mean 'smoke'?)", "midas-nb run: --cell-timeout: expected seconds > 0, got -1.0"]
    run_file = tmp_path / "run.yaml"
    run_file.write_text("profile: smook\n")
    rc, lines = _run(["--config", str(run_file), "--notebooks", "02", "--output", str(tmp_path / "o")], capsys)
    assert rc == 2 and any("got 'smook' (did you mean 'smoke'?)" in ln for ln in _problems(lines)), lines
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("argv", [["report", "--profile", "smook"], ["sweep", "plan", "--profile", "smook"],
                                  ["export-html", "--profile", "smook"]])
def test_other_commands_name_the_closest_profile(argv, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2
    assert err == (f"midas-nb {argv[0]}: error: argument --profile: unknown profile 'smook' (did you mean "
                   "'smoke'?); expected one of ['paper', 'quick', 'rehearsal', 'smoke']")


def test_the_regime_sweeps_values_are_run_parameters_of_04_and_07(tmp_path, capsys, recorder):
    """``-p depths`` / ``-p budgets`` reach the notebooks that run and read the regime sweep (04,
    07), as lists; a wrong entry is named before any kernel; another notebook refuses them."""
    rc, lines = _run(["--profile", "smoke", "--notebooks", "04,07", "-p", "depths", "1,3", "-p", "budgets", "0.5",
                      "--output", str(tmp_path / "o")], capsys)
    assert rc == 0 and [(nb, p["depths"], p["budgets"]) for nb, p in recorder] == [
        ("04_regime_sweeps.ipynb", [1, 3], [0.5]), ("07_deployment_guide.ipynb", [1, 3], [0.5])]
    rc, lines = _run(["--profile", "smoke", "--notebooks", "04", "-p", "depths", "0,2", "--output",
                      str(tmp_path / "p")], capsys)
    assert rc == 2 and _problems(lines) == [
        "midas-nb run: depths: expected a list of integers L >= 1; wrong: 0 (in [0, 2])"]
    rc, lines = _run(["--profile", "smoke", "--notebooks", "02", "-p", "budgets", "0.5", "--output",
                      str(tmp_path / "q")], capsys)
    assert rc == 2 and "unknown notebook parameter(s) ['budgets'] (did you mean 'budget'?)" in _problems(lines)[0]


def test_compare_with_is_checked_before_any_kernel(tmp_path, capsys, recorder):
    """Notebook 05's side-by-side backbones: a list (``a,b`` splits), distinct names, each a
    backbone that can be built; an empty value is named, not read as the default."""
    rc, _ = _run(["--profile", "smoke", "--notebooks", "05", "-p", "compare_with", "vit_smoke,vit_smoke_deit",
                  "--output", str(tmp_path / "o")], capsys)
    assert rc == 0 and recorder[0][1]["compare_with"] == ["vit_smoke", "vit_smoke_deit"]
    for value, expected in (("", "compare_with: expected a list of distinct backbone names (e.g. [hybrid_lite0_deit, "
                                 "hybrid_lite0_vit]), got ['']"),
                            ("vit_smoke,vit_smoke", "got ['vit_smoke', 'vit_smoke']"),
                            ("vit_nope", "unknown backbone 'vit_nope'")):
        rc, lines = _run(["--profile", "smoke", "--notebooks", "05", "-p", "compare_with", value, "--output",
                          str(tmp_path / "p")], capsys)
        (line,) = _problems(lines)
        assert rc == 2 and expected in line, (value, line)


@pytest.mark.parametrize("env", ["MIDAS_RUNS_DIR", "MIDAS_CACHE_DIR", "MIDAS_FIGURES_DIR"])
def test_an_output_directory_variable_naming_a_file_is_one_line_before_any_kernel(env, tmp_path, monkeypatch,
                                                                                 capsys, no_kernel):
    """Where the run, its kernels and the other commands write: a variable naming a file is a bad setting
    (one line, exit 2), never a traceback nor a kernel that fails at its first figure."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    monkeypatch.setenv(env, str(afile))
    rc, lines = _run(["--profile", "smoke", "--notebooks", "00", "--output", str(tmp_path / "out")], capsys)
    assert rc == 2 and _problems(lines) == [f"midas-nb run: {afile} is a file; expected a writable directory "
                                            f"({env} names it)"]
    if env == "MIDAS_RUNS_DIR":   # the commands that read the runs directory answer the same line
        for argv in (["sweep", "status", "smoke"], ["export-html", "--profile", "smoke"]):
            assert cli.main(argv) == 2, argv
            err = capsys.readouterr().err
            assert f"{afile} is a file; expected a writable directory (MIDAS_RUNS_DIR names it)" in err
            assert "Traceback" not in err


def _in_read_only_cache(cache: Path, code: str) -> subprocess.CompletedProcess:
    """``python -c code`` with ``cache`` mounted read-only (a user and mount namespace) as MIDAS_CACHE_DIR."""
    if not shutil.which("unshare") or subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode:
        pytest.skip("no unprivileged mount namespace here (unshare -rm) for a read-only mount")
    env = dict(os.environ, MIDAS_CACHE_DIR=str(cache), PYTHONPATH=str(Path(cli.__file__).parents[2]))
    script = f'mount --bind -o ro "$0" "$0" && exec "$1" -c "$2"'
    return subprocess.run(["unshare", "-rm", "sh", "-c", script, str(cache), sys.executable, code], env=env,
                          capture_output=True, text=True, timeout=300)


def test_a_read_only_cache_without_the_checkpoints_is_one_line_before_any_kernel(tmp_path):
    """The check tested that the cache is a folder, not that it can be written: the run failed inside the
    notebook (``OSError: Read-only file system: …/checkpoints/….lock``)."""
    cache = tmp_path / "cache"
    (cache / "checkpoints").mkdir(parents=True)
    code = ("import papermill, shutil; papermill.execute_notebook = lambda src, dst, **k: shutil.copy(src, dst); "
            "from midas_nb import cli; raise SystemExit(cli.main(['run', '--no-progress', '--profile', 'smoke', "
            f"'--notebooks', '02', '--output', {str(tmp_path / 'out')!r}]))")
    r = _in_read_only_cache(cache, code)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and lines[0] == (
        f"midas-nb run: cache {cache} cannot be written (Read-only file system) and holds no checkpoint of vit_smoke "
        "(checkpoints/<backbone>-*.pt), which the run would train and write; expected a writable MIDAS_CACHE_DIR, or "
        "a cache prepared by a run of these backbones") and len(lines) == 2, r.stderr
    (cache / "checkpoints" / "vit_smoke-0123456789ab.pt").write_bytes(b"")     # a prepared cache: the run starts
    r = _in_read_only_cache(cache, code)
    assert r.returncode == 0, r.stderr


def test_a_bad_setting_is_answered_before_torch_loads_with_every_problem_at_once(tmp_path):
    """New-user findings (issue 54): ``--profile nope`` or ``-p budget abc`` took over a minute under load
    (torch and the study were imported before any check), and an unknown profile hid the other problems."""
    code = ("import contextlib, io, sys\nfrom midas_nb import cli\nbuf = io.StringIO()\n"
            "with contextlib.redirect_stderr(buf):\n"
            f"    rc = cli.main(['run', '--profile', 'nope', '-p', 'budget', 'abc', '--output', {str(tmp_path)!r}])\n"
            "print(rc, 'torch' in sys.modules, 'midas_nb.study' in sys.modules)\nprint(buf.getvalue(), end='')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=str(Path(cli.__file__).parents[2])))
    assert r.stdout.splitlines() == [
        "2 False False",
        "midas-nb run: profile: expected one of ['paper', 'quick', 'rehearsal', 'smoke'], got 'nope'",
        "midas-nb run: budget: expected a kept fraction b in (0, 1] (e.g. 0.25), got 'abc'",
        "midas-nb run: 2 problems; no notebook was started"], r.stderr


def test_a_depth_outside_every_backbone_is_said_once(tmp_path, capsys, no_kernel):
    """Notebook 05 builds three backbones: ``-p depth 99`` was one line per backbone."""
    rc, lines = _run(["--profile", "smoke", "--notebooks", "05", "-p", "depth", "99", "--output",
                      str(tmp_path / "o")], capsys)
    assert rc == 2 and _problems(lines) == [
        "midas-nb run: depth: L = 99 is outside 1..3 for vit_smoke (4 blocks; the scorer reads block L and blocks "
        "L+1..4 see the kept tokens)"]


def test_a_plain_root_of_another_dataset_is_named_as_that_datasets(tmp_path, capsys):
    """A fresh reader: a plain ``--data-root`` of Stanford Cars was read as CUB (the quick profile's dataset) and
    refused as 'does not have the cub layout'; the layout its loader does read names the fix in one line."""
    from midas_nb.data import make_cars_from_cub, make_synthetic_cub
    cub = make_synthetic_cub(tmp_path / "cub", num_classes=2, images_per_class=2, image_size=64)
    cars = make_cars_from_cub(cub, tmp_path / "cars", num_classes=2, per_split=(1, 1))
    rc, lines = _run(["--profile", "quick", "--notebooks", "00", "--data-root", str(cars),
                      "--output", str(tmp_path / "o")], capsys)
    assert rc == 2 and _problems(lines) == [f"midas-nb run: data root {str(cars)!r} is read as cub but has the cars "
                                            f"layout; expected --data-root cars={cars} (or --dataset cars)"]
    fixed = runspec.RunSpec(profile="quick", dataset="cars", data_root=str(cars))
    assert not any("layout" in p for p in runspec.preflight(fixed, ["00_quickstart.ipynb"]))
    # a root of no dataset's layout keeps the loader's own line
    assert "does not have the cub layout" in runspec.preflight(runspec.RunSpec(profile="quick", data_root=str(
        tmp_path)), ["00_quickstart.ipynb"])[0]


def test_a_rebuild_on_other_seeds_is_one_notebook_parameter():
    """Issue 51's rebuild comparison (builds 3-5 against 0-2): `-p build 3` was refused as an unknown notebook
    parameter. Every notebook now takes `build` and hands it to its Study, and the protocol grid at the point then
    plans builds 3, 4, 5, each a cell key of its own, none of them a key of builds 0-2."""
    import json

    import papermill as pm

    from midas_nb.study.grid import sweep_cells

    for nb in cli.notebook_paths():
        assert "build" in pm.inspect_notebook(str(nb)), nb.name
        code = "".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code")
        assert "build=build," in code, nb.name          # the parameter reaches the study
    prof = dict(config.get_profile("smoke"), builds=3)
    first, rebuild = (sweep_cells(dict(prof, build=k), "protocol", planned=True) for k in (0, 3))
    assert sorted({c.params.get("build", 0) for c in first}) == [0, 1, 2]
    assert sorted({c.params.get("build", 0) for c in rebuild}) == [3, 4, 5]
    assert not {c.key for c in first} & {c.key for c in rebuild}
