"""The documentation map holds together: every relative link of the README, the changelog and
docs/ resolves, every `docs/decisions/NNNN-*.md` named in the package, the tests, the notebooks
or the bench scripts exists, the decision records are short and numbered once each, and the
README and docs/architecture.md stay within their sizes."""
from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DECISIONS = REPO / "docs" / "decisions"

RECORD_MAX_CHARS = 2_500
README_MAX_CHARS = 10_000
ARCHITECTURE_MAX_CHARS = 20_000

LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)")
RECORD_PATH = re.compile(r"docs/decisions/(\d{4}-[\w.-]+?\.md)")


def _markdown_files() -> list[Path]:
    return [REPO / "README.md", REPO / "CHANGELOG.md", *sorted((REPO / "docs").rglob("*.md"))]


def _records() -> list[Path]:
    return sorted(DECISIONS.glob("[0-9][0-9][0-9][0-9]-*.md"))


def test_relative_links_of_the_docs_resolve():
    broken = []
    for md in _markdown_files():
        for target in LINK.findall(md.read_text(encoding="utf-8")):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (md.parent / target).exists():
                broken.append(f"{md.relative_to(REPO)} -> {target}")
    assert not broken, broken


def test_named_decision_records_exist():
    names = {p.name for p in _records()}
    missing = []
    for folder in ("midas_nb", "tests", "notebooks", "bench", "docs"):
        for path in sorted((REPO / folder).rglob("*")):
            if path.suffix not in {".py", ".ipynb", ".md", ".toml"} or not path.is_file():
                continue
            for name in RECORD_PATH.findall(path.read_text(encoding="utf-8", errors="replace")):
                if name not in names:
                    missing.append(f"{path.relative_to(REPO)}: {name}")
    for path in (REPO / "README.md", REPO / "CHANGELOG.md", REPO / "pyproject.toml"):
        missing += [f"{path.name}: {n}" for n in RECORD_PATH.findall(path.read_text(encoding="utf-8"))
                    if n not in names]
    assert not missing, missing


def test_decision_records_are_short_and_numbered_once():
    records = _records()
    assert records
    numbers = [p.name[:4] for p in records]
    assert len(numbers) == len(set(numbers)), f"a number is used twice: {numbers}"
    assert numbers == [f"{i:04d}" for i in range(1, len(numbers) + 1)], "record numbers have a gap"
    for p in records:
        text = p.read_text(encoding="utf-8")
        assert text.startswith(f"# {p.name[:4]} — "), f"{p.name}: the title starts with its number"
        assert len(text) <= RECORD_MAX_CHARS, f"{p.name}: {len(text)} characters > {RECORD_MAX_CHARS}"


def test_readme_and_architecture_stay_within_their_sizes():
    assert len((REPO / "README.md").read_text(encoding="utf-8")) <= README_MAX_CHARS
    assert len((REPO / "docs" / "architecture.md").read_text(encoding="utf-8")) <= ARCHITECTURE_MAX_CHARS
