"""The typed run description (midas_nb.study.RunSettings): built once, every problem at once,
one line each; its parts hold what the profile says; a study's settings cannot be changed."""
from __future__ import annotations

import dataclasses

import pytest

from midas_nb import config
from midas_nb.config import ProfileError
from midas_nb.study import RunSettings, Study


def _lines(**kw) -> list[str]:
    with pytest.raises(ProfileError) as e:
        RunSettings.build(kw.pop("profile", "quick"), **kw)
    return e.value.problems


def test_parts_hold_the_profile_resolved():
    s = RunSettings.build("quick", budget=0.1, seeds=[3])
    p = config.get_profile("quick", budget=0.1, seeds=[3])
    assert (s.point.depth, s.point.budget) == (p["depth"], 0.1)
    assert s.protocol.seeds == (3,) and s.sweep.seeds == tuple(p["sweep_seeds"])        # quick sweeps one seed
    assert s.statistics.bootstrap == p["bootstrap"] and s.protocol.idauc_steps == p["idauc_steps"]
    # the embedded set: CUB's reader, labelled synthetic, the synthetic recipe (not the backbone's 24 epochs)
    assert (s.data.dataset, s.data.loader, s.data.label, s.data.embedded) == ("cub", "cub", "synthetic", True)
    assert s.backbone.recipe.epochs == p["synthetic_finetune"]["epochs"]
    assert s.backbone.kwargs == {} and s.backbone.weights is None          # the offline hybrid: no hub weights
    assert s.sweep.related_seeds == (0,) and s.sweep.other_backbones is False


def test_protocol_and_statistics_parts_are_the_profile_model_itself():
    """One typed description (issue 54): the statistics part is the profile's validated model, the protocol
    part that model with the protocol settings a run receives (a scorer_train key wins, else the top level,
    else PROTOCOL_DEFAULTS' 3 repeats); every other setting the model's own."""
    s = RunSettings.build("smoke", scorer_train=dict(epochs=2, eval_subset_seed=5), throughput_batch=8)
    run, problems = config.RunProfile.check(s.values)
    assert problems == [] and s.statistics == run and s.statistics.bootstrap == 100
    assert (s.protocol.eval_subset_seed, s.protocol.throughput_batch, s.protocol.throughput_repeats) == (5, 8, 3)
    assert (run.eval_subset_seed, run.throughput_repeats) == (0, 1)          # the model's own defaults
    assert dict(s.protocol.scorer_train) == {"epochs": 2, "eval_subset_seed": 5} and s.protocol.seeds == (0,)
    own = {"eval_subset_seed", "throughput_batch", "throughput_repeats", "scorer_train", "conditions", "targets",
           "seeds"}
    assert s.protocol.model_dump(exclude=own) == run.model_dump(exclude=own)


def test_every_problem_at_once_one_line_each():
    lines = _lines(depth=99, budget=2, dataset="aircraft", budgte=0.5)
    assert len(lines) == 4, lines
    assert lines[0] == "budgte: unknown setting (did you mean 'budget'?); expected a key of the profiles " \
                       "(midas_nb.config.PROFILES)"
    assert lines[1].startswith("budget: expected a kept fraction b in (0, 1]")
    assert lines[2].startswith("depth: L = 99 is outside 1..11")                   # needs the backbone
    assert lines[3].startswith("dataset 'aircraft' has no data root: pass --data-root aircraft=")
    assert _lines(profile="smook") == ["profile: expected one of ['paper', 'quick', 'rehearsal', 'smoke'], "
                                       "got 'smook'"]
    assert _lines(dataset="aircraft", data_roots={"aircraft": "/no/such/dir"}) == [
        "data root '/no/such/dir' of dataset 'aircraft' does not exist or is not a directory"]
    # a missing root does not hold back the schedule's problem on that dataset: both at once
    assert _lines(dataset="cub", data_root="/no/such/dir", finetune={"epochs": 5}) == [
        "data root '/no/such/dir' of dataset 'cub' does not exist or is not a directory",
        "finetune.epochs: on cub, hybrid_lite0_deit trains its first 18 epochs on coarse tokens (DISTILLED_RECIPES, "
        "progressive token resolution); expected more than 18 epochs, got 5"]
    # CUB asked for by name is read from a root: the embedded set stands in only where no dataset is named
    assert _lines(dataset="cub") == ["dataset 'cub' has no data root: pass --data-root cub=/path/to/cub (CUB asked "
                                     "for by name is never the embedded synthetic set, dataset 'synthetic' is)"]
    assert RunSettings.build("quick", dataset="synthetic").data.label == "synthetic"
    assert _lines(datasets=["cub"])[0].startswith("dataset 'cub' has no data root")       # a sweep's datasets too
    # the top-level protocol settings are checked, and one given twice is an error, not a silent choice
    assert _lines(profile="smoke", throughput_batch=0, eval_subset_seed=1.5) == [
        "eval_subset_seed: expected an integer >= 0, got 1.5",
        "throughput_batch: expected an integer >= 1, got 0",
        "throughput_batch: 0 at the top level and 4 in scorer_train; give one (scorer_train's would be used)"]
    # protocol settings of the profile's top level are known names
    assert RunSettings.build("smoke", relaxation="soft", lam=2.0).values["lam"] == 2.0


def test_a_study_settings_cannot_change():
    st = Study("smoke")
    with pytest.raises(dataclasses.FrozenInstanceError):
        st.settings.point = None
    with pytest.raises(AttributeError):
        st.settings = None
    # params is a copy: what a caller does to it never reaches the study or its cells' keys
    st.params["seeds"].append(7)
    st.params["budget"] = 0.9
    assert st.params["seeds"] == [0] and st.params["budget"] == 0.25 and st.settings.protocol.seeds == (0,)


def test_report_settings_read_the_same_from_a_study_or_a_mapping():
    from midas_nb.study import ReportSettings

    run = RunSettings.build("quick", budget=0.5, depth=3)
    p = config.get_profile("quick", budget=0.5, depth=3)
    a, b, c = ReportSettings.of(run.values), ReportSettings.of(p), ReportSettings.of(config.get_profile("quick"))
    assert a == b and ReportSettings.of(a) is a
    assert (a.point.depth, a.point.budget, a.profile) == (3, 0.5, "quick") and (c.point.depth, c.point.budget) == (
        config.get_profile("quick")["depth"], config.get_profile("quick")["budget"])
    assert a.bootstrap == run.statistics.bootstrap and a.conditions == p["conditions"]
    assert a.sweep == run.sweep and a.relaxation == p.get("relaxation", "st")
    with pytest.raises(TypeError):
        a.values["budget"] = 0.1                       # the cells' key mapping is read-only
    with pytest.raises(ValueError):
        ReportSettings.of(dict(p, budget=1.5))         # a budget outside (0, 1] (midas_nb.point.Point)
    with pytest.raises(ValueError, match="conditions: expected a non-empty list of names, got None"):
        ReportSettings.of({k: v for k, v in p.items() if k != "conditions"})   # the profile's model checks it


def test_precision_is_checked_with_the_profile_and_keys_only_the_profiles_that_set_it():
    """``precision`` (decision 0063): a bad value is one line of the profile check; the paper
    profile's ``bfloat16`` enters its cells' protocol settings, while the profiles that leave it
    out keep the keys they had (no ``precision`` among their protocol settings)."""
    from midas_nb.study import protocol_settings

    lines = config.RunProfile.problems(dict(config.get_profile("smoke"), precision="fp16"))
    assert lines == ["precision: expected one of ['float32', 'bfloat16'], got 'fp16'"]
    assert protocol_settings(config.get_profile("paper"))["precision"] == "bfloat16"
    for name in ("smoke", "quick", "rehearsal"):
        assert "precision" not in protocol_settings(config.get_profile(name)), name


def test_no_function_takes_a_profile_name_or_settings_or_a_mapping():
    """Issue 54, move 1: the sweep layer takes one kind of profile, the mapping the cells are keyed
    by (a study's ``RunSettings.values``); no signature takes a name, ``RunSettings`` or a mapping (before: 13, one with "quick" as its default)."""
    import re
    from pathlib import Path

    union = re.compile(r"RunSettings \| (str \| )?Mapping|\bstr \| Mapping\[str, Any\]")
    found = [f"{p.name}: {line.strip()}" for p in Path(config.__file__).parent.rglob("*.py")
             for line in p.read_text(encoding="utf-8").splitlines() if union.search(line)]
    assert found == [], found


def test_a_studys_header_names_the_build_its_maps_are_drawn_on():
    """Notebooks 01 and 03 draw maps and probes on one backbone build while 02 carries every build; their header
    line (the study's repr) names it, and the profile's builds beside it (a fresh reader of a 3-build run)."""
    assert "backbone='vit_smoke', build=0 of builds 0–2, depth=" in repr(Study("smoke", builds=3))
    assert "build=1, depth=" in repr(Study("smoke", build=1))
