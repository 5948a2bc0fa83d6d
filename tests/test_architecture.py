"""The import rule of docs/architecture.md ("Layers"), enforced: import-linter's contracts in
pyproject.toml ([tool.importlinter]: a layers contract, one import direction, and an
acyclic-siblings contract) hold for the package, no module is part of an import cycle (grimp's
graph, imports inside functions included), and the contracts do fail when a lower layer imports
a higher one or when two modules import each other (shown on a throwaway copy of the package).
"""
from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp
from importlinter.cli import lint_imports

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "midas_nb"


def _contracts() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]


def test_import_contracts_hold():
    assert lint_imports(config_filename=str(REPO / "pyproject.toml"), no_cache=True) == 0


def _cycles(graph: grimp.ImportGraph, modules: set[str]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root) & modules)))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.find_modules_directly_imported_by(w) & modules))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_cycle_finder_finds_a_known_cycle():
    g = grimp.ImportGraph()
    for m in ("p", "p.a", "p.b", "p.c"):
        g.add_module(m)
    g.add_import(importer="p.a", imported="p.b")
    g.add_import(importer="p.b", imported="p.a")
    g.add_import(importer="p.c", imported="p.a")
    assert _cycles(g, {"p.a", "p.b", "p.c"}) == [["p.a", "p.b"]]


def test_no_module_is_part_of_an_import_cycle():
    # annotation-only imports (`if TYPE_CHECKING:`) count too, as in pyproject's contracts (issue 54:
    # pruning and metrics.speed named the scorer type above them, pruning -> scorers.cropr ->
    # pruning); the package's own __init__ files re-export their children; a child never imports
    # its package's __init__, so every module takes part
    assert _contracts()["exclude_type_checking_imports"] is False
    graph = grimp.build_graph("midas_nb", cache_dir=None, exclude_type_checking_imports=False)
    assert len(graph.modules) > 40
    assert _cycles(graph, set(graph.modules)) == []


def _ini(contracts: dict, root: str) -> str:
    """The [tool.importlinter] table of pyproject.toml as an INI config for package ``root``."""
    lines = ["[importlinter]", f"root_package = {root}"]
    lines += [f"{k} = {str(v).lower()}" for k, v in contracts.items() if isinstance(v, bool)]
    lines.append("")
    for c in contracts["contracts"]:
        lines.append(f"[importlinter:contract:{c['id']}]")
        for k, v in c.items():
            if k == "id":
                continue
            if isinstance(v, list):
                v = [x.replace("midas_nb", root) for x in v]
                lines.append(f"{k} =\n" + "\n".join(f"    {x}" for x in v))
            elif isinstance(v, bool):
                lines.append(f"{k} = {'true' if v else 'false'}")
            else:
                lines.append(f"{k} = {v}")
        lines.append("")
    return "\n".join(lines)


def _lint_copy(tmp_path: Path, edits: dict[str, str]) -> subprocess.CompletedProcess:
    """Copy the package as ``midas_probe`` (a name no installed package shadows), append the
    given lines to its modules and run lint-imports on it with the project's contracts."""
    root = "midas_probe"
    dst = tmp_path / root
    shutil.copytree(PACKAGE, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for rel, line in edits.items():
        p = dst / rel
        p.write_text(p.read_text() + "\n" + line + "\n")
    cfg = tmp_path / "contracts.ini"
    cfg.write_text(_ini(_contracts(), root))
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from importlinter.cli import lint_imports; "
            "sys.exit(lint_imports(config_filename=sys.argv[2], no_cache=True))")
    return subprocess.run([sys.executable, "-c", code, str(tmp_path), str(cfg)], capture_output=True,
                          text=True, cwd=tmp_path, timeout=300)


def test_contracts_fail_on_an_upward_import_and_on_a_cycle(tmp_path):
    # the unchanged copy keeps both contracts (so what breaks below is the added import)
    ok = _lint_copy(tmp_path / "same", {})
    assert ok.returncode == 0, ok.stdout + ok.stderr
    # data (the lowest domain layer) importing the command line: an upward import
    up = _lint_copy(tmp_path / "up", {"data/grid.py": "from .. import cli  # noqa"})
    assert up.returncode == 1, up.stdout
    assert "midas_probe.data is not allowed to import midas_probe.cli" in up.stdout
    # two modules of one package may import each other, but not both ways: the token path
    # (backbones.vit) importing the distilled backbone that imports it
    cyc = _lint_copy(tmp_path / "cycle", {"backbones/vit.py": "from . import distilled  # noqa"})
    assert cyc.returncode == 1, cyc.stdout
    assert "No cycles are allowed in midas_probe" in cyc.stdout


def _code_lines(lines: list[str], fn: "ast.FunctionDef | ast.AsyncFunctionDef") -> int:
    """Lines of code of a function's body: no docstring, blank lines or comment lines."""
    body = fn.body
    start = body[0].lineno
    first = body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        start = first.end_lineno + 1
    return sum(1 for ln in lines[start - 1:fn.end_lineno] if ln.strip() and not ln.strip().startswith("#"))


def test_code_lines_counts_a_known_function():
    src = 'def f(x):\n    """doc\n    more"""\n    # note\n\n    y = x\n    return y\n'
    fn = ast.parse(src).body[0]
    assert _code_lines(src.splitlines(), fn) == 2


def _size_problems(path: Path, src: str) -> list[str]:
    """A module over 600 lines (no exemption: issue 54), and each function over 80 lines of code (issue 16)."""
    lines = src.splitlines()
    out = [f"{path.relative_to(REPO)} ({len(lines)} lines)"] if len(lines) > 600 else []
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _code_lines(lines, node) > 80:
            out.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({_code_lines(lines, node)} lines of code)")
    return out


def test_size_rule_flags_a_long_module_whatever_its_docstring_says():
    # a docstring line "Size: ..." used to exempt a module (analysis/protocol.py, 741 lines, had one)
    long = '"""A module.\n\nSize: one file on purpose.\n"""\n' + "x = 1\n" * 600
    assert _size_problems(PACKAGE / "m.py", long) == ["midas_nb/m.py (604 lines)"]
    body = "".join(f"    y{i} = {i}\n" for i in range(81))
    assert _size_problems(PACKAGE / "m.py", "def f():\n" + body) == ["midas_nb/m.py:1 f (81 lines of code)"]
    assert _size_problems(PACKAGE / "m.py", "x = 1\n" * 600) == []


def test_modules_and_functions_stay_small():
    """No module over 600 lines, no function over 80 lines of code (:func:`_size_problems`)."""
    assert [p for path in sorted(PACKAGE.rglob("*.py")) for p in _size_problems(path, path.read_text())] == []
