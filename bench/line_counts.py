"""Lines of the package, science against plumbing.

Counts the lines of every ``midas_nb`` module (a package such as ``midas_nb/data/`` counts as
one module, all its files together) and prints them grouped as

- **science**: what the analysis computes — data, backbones (with the token path), capture,
  targets, scorers, pruning, scorer training, metrics (with probes, perturbation tests and
  statistics) and the analysis (protocol, LaSt-ViT, related methods);
- **plumbing**: what runs, stores, checks and reports it — the command line, profiles and
  paths, the typed point, identities and caches, progress, run summaries, the study and sweep
  engines, result tables and verdicts, the report (with the paper table and the scale readout);
- **edition**: what readers see and teach with — figures, the explorer and the course;

with each group's share of the package. Issue 29 counted the first two (science 49 %, plumbing
39 % and 7.7k lines when it was filed, the edition apart) and set the goal printed last: plumbing
at most 3,900 lines, science at least 60 % of the package. A module in no list is an error
(classify it here first). Plumbing files that a later issue added (:data:`LATER_ISSUES`) are
counted apart, as issue 29 says, before the goal is checked. Prints only; no ``ratio:`` line
(nothing is timed).

Issue 54's goal is printed too: the whole package at most 21,000 lines, all plumbing (the later
issues' files included) at most 5,000, science at least 60 % (all lines; not with ``--code``).

Usage: ``python bench/line_counts.py [--code]`` (``--code``: the non-blank lines that are neither
comments nor docstrings, instead of all lines).
"""
from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "midas_nb"

SCIENCE = ("data", "backbones", "capture", "targets", "scorers", "pruning", "train", "metrics", "analysis")
PLUMBING = ("__init__", "cli", "config", "point", "identity", "progress", "runs", "study", "sweeps", "results",
            "report", "kernel")   # kernel/: the batch kernel's config file (runs)
EDITION = ("viz", "course")
#: issue 29's goal (physical lines; science's share of the whole package)
GOAL_PLUMBING, GOAL_SCIENCE_SHARE = 3900, 60.0
#: issue 54's goal: the package and all plumbing (physical lines)
GOAL_54_PACKAGE, GOAL_54_PLUMBING = 21000, 5000
#: plumbing files a later issue added after issue 29 was filed, which the issue counts apart: issue 30's
#: Slurm path (submission, the sweep plan and commands, the worker) and streamed progress
LATER_ISSUES: dict[str, int] = {"sweeps/slurm.py": 30, "sweeps/plan.py": 30, "progress.py": 30}
#: (sweeps/commands.py, 76 lines: into cli, issue 54; sweeps/worker.py, 121 lines: into sweeps/executors.py, issue 54)


def _docstring_lines(tree: ast.AST):
    """The line numbers of every module, class and function docstring of ``tree``."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) \
                and ast.get_docstring(node, clean=False) is not None:
            yield from range(node.body[0].lineno, node.body[0].end_lineno + 1)


def count(path: Path, code_only: bool) -> int:
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    if not code_only:
        return len(lines)
    docs = set(_docstring_lines(ast.parse(text)))
    return sum(1 for i, ln in enumerate(lines, 1) if ln.strip() and not ln.strip().startswith("#") and i not in docs)


def module_lines(code_only: bool = False) -> dict[str, int]:
    """Lines per top-level module of the package (a subpackage summed over its files)."""
    out: dict[str, int] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        name = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        out[name] = out.get(name, 0) + count(path, code_only)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--code", action="store_true", help="count non-blank lines that are no comment or docstring")
    args = ap.parse_args(argv)
    lines = module_lines(args.code)
    unknown = sorted(set(lines) - set(SCIENCE) - set(PLUMBING) - set(EDITION))
    if unknown:
        print(f"unclassified modules: {', '.join(unknown)} (add them to SCIENCE, PLUMBING or EDITION)",
              file=sys.stderr)
        return 2
    total = sum(lines.values())
    sums = {}
    for group, names in (("science", SCIENCE), ("plumbing", PLUMBING), ("edition", EDITION)):
        part = {n: lines[n] for n in names if n in lines}
        sums[group] = sum(part.values())
        print(f"{group}: {sums[group]} lines, {100 * sums[group] / total:.1f} % of {total}")
        for name, n in sorted(part.items(), key=lambda kv: -kv[1]):
            print(f"  {name:<18} {n:>6}")
    share = 100 * sums["science"] / total
    later = {f: count(PACKAGE / f, args.code) for f in LATER_ISSUES if (PACKAGE / f).is_file()}
    counted = sums["plumbing"] - sum(later.values())
    print(f"plumbing added by later issues, counted apart: {sum(later.values())} lines ("
          + ", ".join(f"{f} {n} (issue {LATER_ISSUES[f]})" for f, n in later.items()) + ")")
    met = counted <= GOAL_PLUMBING and share >= GOAL_SCIENCE_SHARE
    print(f"issue 29's goal: plumbing <= {GOAL_PLUMBING} lines (now {counted}), science >= "
          f"{GOAL_SCIENCE_SHARE:g} % (now {share:.1f} %): {'met' if met else 'not met'}")
    if not args.code:
        met = total <= GOAL_54_PACKAGE and sums["plumbing"] <= GOAL_54_PLUMBING and share >= GOAL_SCIENCE_SHARE
        print(f"issue 54's goal: package <= {GOAL_54_PACKAGE} lines (now {total}), all plumbing <= "
              f"{GOAL_54_PLUMBING} (now {sums['plumbing']}), science >= {GOAL_SCIENCE_SHARE:g} % (now {share:.1f} %): "
              f"{'met' if met else 'not met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
