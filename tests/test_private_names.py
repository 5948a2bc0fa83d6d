"""No module uses another module's private names (issue 29).

A name that starts with an underscore (``_roots``, ``_digest``) belongs to the module that
defines it; another module of ``midas_nb`` may not import it (``from .config import _roots``) or
reach it through a module it imported (``config._roots(...)``, ``getattr(config, "_roots")``),
so a module can change its private helpers without breaking a distant reader. A package folder
is not one module: its ``__init__`` and its children are modules like the others. Dunder names
(``__version__``, ``__all__``) are public. A private module (``data/_common.py``) is the package's
own: its modules may take its public names. The notebooks and the bench scripts are users of the
package and may use only public names (nor import a private module such as ``data._common``);
the tests may use private names and are not checked.
"""
from __future__ import annotations

import ast
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "midas_nb"
ROOT = PACKAGE.name


def _dotted(path: Path) -> tuple[str, bool]:
    """The module name of a file of the package and whether it is a package's ``__init__``."""
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


SOURCES = sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)
MODULES = frozenset(_dotted(p)[0] for p in SOURCES)
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
BENCH = sorted((REPO / "bench").glob("*.py"))


def is_private(name: str) -> bool:
    """``_x`` and ``__x`` are private; ``__x__`` (a dunder) and ``x`` are not."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__") and len(name) > 4)


def _absolute(importer: str | None, is_package: bool, level: int, module: str | None) -> str:
    """The absolute module name of ``from <level dots><module> import ...`` written in ``importer``."""
    if level == 0:
        return module or ""
    if importer is None:
        raise ValueError("a relative import outside the package")
    base = importer.split(".")
    base = base if is_package else base[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def _in_package(name: str) -> bool:
    return name == ROOT or name.startswith(ROOT + ".")


def crossings(trees: list[ast.Module], importer: str | None = None, is_package: bool = False,
              modules: frozenset[str] = MODULES) -> list[tuple[int, int, str]]:
    """Uses of another package module's private names in ``trees`` (the parts of one file, in
    order: a module has one, a notebook one per code cell), as ``(part, line, what)``.

    ``importer`` is the dotted name of the module being checked (``None`` for a user outside the
    package: a notebook, a bench script; a user also may not import a private module)."""
    aliases: dict[str, str] = {}          # a name bound to a package module -> that module
    found: list[tuple[int, int, str]] = []
    imports = [(i, n) for i, t in enumerate(trees) for n in ast.walk(t) if isinstance(n, (ast.Import, ast.ImportFrom))]
    for part, node in sorted(imports, key=lambda x: (x[0], x[1].lineno)):
        if isinstance(node, ast.Import):
            for a in node.names:
                if not _in_package(a.name):
                    continue
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else ROOT
                if importer is None and any(is_private(s) for s in a.name.split(".")):
                    found.append((part, node.lineno, f"imports the private module {a.name}"))
            continue
        source = _absolute(importer, is_package, node.level, node.module)
        if not _in_package(source):
            continue
        if importer is None and any(is_private(s) for s in source.split(".")):
            found.append((part, node.lineno, f"imports from the private module {source}"))
        for a in node.names:
            if f"{source}.{a.name}" in modules:
                aliases[a.asname or a.name] = f"{source}.{a.name}"
            if is_private(a.name) and source != importer:
                found.append((part, node.lineno, f"imports {a.name} from {source}"))

    def module_of(expr: ast.expr) -> str | None:
        if isinstance(expr, ast.Name):
            return aliases.get(expr.id)
        if isinstance(expr, ast.Attribute):
            base = module_of(expr.value)
            if base is not None and f"{base}.{expr.attr}" in modules:
                return f"{base}.{expr.attr}"
        return None

    def by_name(node: ast.AST) -> bool:
        """``getattr(m, "_y")`` (``setattr``, ``hasattr``): an attribute named by a constant."""
        return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "setattr", "hasattr") and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str))

    for part, tree in enumerate(trees):
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                owner, name = module_of(node.value), node.attr
            elif by_name(node):
                owner, name = module_of(node.args[0]), node.args[1].value
            else:
                continue
            if owner is not None and owner != importer and is_private(name):
                found.append((part, node.lineno, f"uses {owner}.{name}"))
    return sorted(set(found))


def _module_crossings(path: Path) -> list[str]:
    name, is_package = _dotted(path)
    rel = path.relative_to(REPO).as_posix()
    return [f"{rel}:{line}: {what}" for _, line, what in crossings([ast.parse(path.read_text())], name, is_package)]


def _notebook_crossings(path: Path) -> list[str]:
    cells = [c for c in nbformat.read(str(path), as_version=4).cells if c.cell_type == "code"]
    rel = path.relative_to(REPO).as_posix()
    return [f"{rel} (code cell {part + 1}):{line}: {what}"
            for part, line, what in crossings([ast.parse(c.source) for c in cells])]


def _check(source: str, importer: str | None = "midas_nb.data.grid", is_package: bool = False) -> list[str]:
    return [what for _, _, what in crossings([ast.parse(source)], importer, is_package)]


def test_the_checker_finds_imports_and_attribute_uses():
    assert _check("from ..config import _roots, settings") == ["imports _roots from midas_nb.config"]
    assert _check("from . import _common") == ["imports _common from midas_nb.data"]
    assert _check("from .sample import _x as x") == ["imports _x from midas_nb.data.sample"]
    assert _check("from .. import config\nconfig._roots(1)") == ["uses midas_nb.config._roots"]
    assert _check("from ..backbones import weights as w\nw._a") == ["uses midas_nb.backbones.weights._a"]
    assert _check("import midas_nb.identity as ident\nident._digest") == ["uses midas_nb.identity._digest"]
    assert _check("import midas_nb.config\nmidas_nb.config._roots") == ["uses midas_nb.config._roots"]
    assert _check("def f():\n    from .. import identity\n    return getattr(identity, '_digest')") == [
        "uses midas_nb.identity._digest"]
    # a folder is not one module: its __init__ may not use its children's private names either
    assert _check("from .grid import _cells", "midas_nb.data", is_package=True) == [
        "imports _cells from midas_nb.data.grid"]


def test_the_checker_spares_public_dunder_own_and_foreign_names():
    assert _check("from ..config import settings, __version__\nfrom .. import config\nconfig.__all__") == []
    assert _check("from ._common import DatasetError\nfrom . import grid\ngrid.grid_shape") == []
    assert _check("import numpy as np\nnp._NoValue\nfrom torch import _C\nx = object()\nx._private") == []
    assert _check("from . import grid\ngrid._own", importer="midas_nb.data.grid") == []
    # a name that is not a module (a function, a class) is not followed
    assert _check("from ..config import settings\nsettings._cache") == []


def test_the_checker_holds_users_to_public_modules():
    assert _check("from midas_nb.data._common import DatasetError", importer=None) == [
        "imports from the private module midas_nb.data._common"]
    assert _check("import midas_nb.data._common", importer=None) == ["imports the private module midas_nb.data._common"]
    assert _check("from midas_nb import runs\nruns._store", importer=None) == ["uses midas_nb.runs._store"]
    # a notebook's later cell uses an alias bound by an earlier one
    cells = [ast.parse("from midas_nb import identity as idn"), ast.parse("idn._digest(b'')")]
    assert crossings(cells) == [(1, 1, "uses midas_nb.identity._digest")]


def test_every_kind_of_file_is_found():
    assert len(SOURCES) > 40 and len(NOTEBOOKS) >= 8 and len(BENCH) >= 5
    assert {"midas_nb.config", "midas_nb.data", "midas_nb.data._common"} <= MODULES


def test_no_package_module_uses_another_modules_private_names():
    found = [hit for path in SOURCES for hit in _module_crossings(path)]
    assert not found, f"{len(found)} uses of another module's private names:\n" + "\n".join(found)


@pytest.mark.parametrize("path", NOTEBOOKS + BENCH, ids=lambda p: p.relative_to(REPO).as_posix())
def test_notebooks_and_bench_scripts_use_only_public_names(path):
    found = _notebook_crossings(path) if path.suffix == ".ipynb" else [
        f"{path.relative_to(REPO).as_posix()}:{line}: {what}"
        for _, line, what in crossings([ast.parse(path.read_text())])]
    assert not found, "a user of the package uses private names:\n" + "\n".join(found)
