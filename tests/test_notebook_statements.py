"""What the notebooks say about the parity band and their intervals, checked in their source.

- A reader-facing statement of band status (a printed or displayed value) comes from
  ``status`` — the verdict of the paired ΔIDAUC interval, which can say "not resolved" — never
  from the point decision ``in_band`` alone (``assert`` lines may use it), and no "(out)" label.
- Every interval a notebook draws (``decoupling_D``, ``aggregate_seeds``,
  ``coverage_vs_faithfulness``, ``recommend_deployment``) uses the profile's ``bootstrap``
  (an ``n_boot=`` argument), so one D never gets two intervals in one run.
"""
from __future__ import annotations

import ast
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
INTERVAL_CALLS = {"decoupling_D", "aggregate_seeds", "coverage_vs_faithfulness", "recommend_deployment",
                  "paper_table", "related_table", "claim_verdict", "targets_vs_scorers", "content_vs_signal",
                  "run_claims"}
# notebooks known to break these rules, with the reason (strict xfail: the mark must go when fixed)
_PENDING: dict[str, str] = {}


def _param(path: Path):
    marks = [pytest.mark.xfail(strict=True, reason=_PENDING[path.stem])] if path.stem in _PENDING else []
    return pytest.param(path, id=path.stem, marks=marks)


def _in_band_shown(source: str) -> list[str]:
    """Simple statements of a code cell, other than ``assert``, that use ``in_band``."""
    def uses(stmt: ast.stmt) -> bool:
        return any(isinstance(n, ast.Constant) and n.value == "in_band" or
                   isinstance(n, ast.Attribute) and n.attr == "in_band" or
                   isinstance(n, ast.Name) and n.id == "in_band" for n in ast.walk(stmt))

    return [ast.get_source_segment(source, n) for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.stmt) and not hasattr(n, "body") and not isinstance(n, ast.Assert) and uses(n)]


def _calls_without_n_boot(source: str) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in INTERVAL_CALLS and not any(k.arg == "n_boot" for k in node.keywords):
                out.append(ast.unparse(node))
    return out


def _cells(path: Path) -> list:
    return nbformat.read(str(path), as_version=4).cells


@pytest.mark.parametrize("path", [_param(p) for p in NOTEBOOKS])
def test_band_status_shown_to_readers_is_the_interval_verdict(path):
    cells = _cells(path)
    bad = [c.source for c in cells if "(out)" in c.source]
    bad += [s for c in cells if c.cell_type == "code" for s in _in_band_shown(c.source)]
    assert not bad, f"{path.name}: band status from the point decision in_band / an '(out)' label:\n" + "\n".join(bad)


@pytest.mark.parametrize("path", [_param(p) for p in NOTEBOOKS])
def test_intervals_use_the_profiles_bootstrap(path):
    missing = [s for c in _cells(path) if c.cell_type == "code" for s in _calls_without_n_boot(c.source)]
    assert not missing, f"{path.name}: intervals without the profile's n_boot: {missing}"


def test_the_checks_flag_the_mistakes_they_are_for():
    """The shapes of the mistakes fixed in notebooks 02 and 04 are flagged; their fixes are not."""
    assert _in_band_shown("for c, g in D.groupby('condition'):\n"
                          "    print(f\"in band in {int(g['in_band'].sum())}/{len(g)} cells\")")
    assert _in_band_shown('D[["condition", "in_band", "status"]]')
    assert not _in_band_shown("assert bool(cov['in_band'])")
    assert not _in_band_shown('D[["condition", "status"]]')
    assert not _in_band_shown('ok = check_exercise("02.in_band", answer, D=D)')
    assert _calls_without_n_boot("D = metrics.decoupling_D(table)") == ["metrics.decoupling_D(table)"]
    assert not _calls_without_n_boot("D = metrics.decoupling_D(table, n_boot=n_boot)")


def test_backbone_compare_intervals_use_the_profiles_bootstrap():
    """notebook 05's side-by-side comparison (midas_nb.report.scale) is the report's backbones table
    (one code path, no second table of its own), its probe intervals drawn with the profile's resamples
    and the report's fixed seed."""
    import midas_nb.report.scale as bc

    tree = ast.parse(Path(bc.__file__).read_text())
    calls = {n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", ""): n
             for n in ast.walk(tree) if isinstance(n, ast.Call)}
    given = {k.arg: ast.unparse(k.value) for k in calls["hidden_vs_attention_gradient"].keywords}
    assert given == {"bootstrap": "n_boot", "seed": "BOOTSTRAP_SEED"}
    assert "backbones_table" in calls and "n_boot = s.statistics.bootstrap" in ast.unparse(tree)
    assert not any(isinstance(n, ast.ClassDef) for n in tree.body) and bc.__all__ == ["compare_backbones"]
    src = "".join(c.source for c in nbformat.read(REPO / "notebooks/05_scale_sensitivity.ipynb", 4).cells)
    assert "backbones_section(bt)" in src and "pair." not in src
