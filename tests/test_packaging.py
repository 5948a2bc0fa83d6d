"""environment.yml and pyproject.toml list the same packages; the console script exists."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml  # pyyaml comes with jupyter / papermill

REPO = Path(__file__).resolve().parents[1]


def _name(req: str) -> str:
    return re.split(r"[<>=!~\[ ;]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_environment_yml_mirrors_pyproject():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    project = pyproject["project"]
    wanted = {_name(r): r for r in project["dependencies"] + project["optional-dependencies"]["test"]}
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    assert env["name"] == "midas_nb"
    assert "python=3.11" in env["dependencies"]
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    listed = {_name(r): r for r in pip_section if not r.startswith("-e")}
    assert set(listed) == set(wanted), (set(listed) ^ set(wanted))
    # the same version pins, letter for letter
    for name, req in wanted.items():
        assert listed[name].replace(" ", "") == req.replace(" ", ""), name
    assert "-e ." in pip_section


def test_console_script_declared():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert pyproject["project"]["scripts"]["midas-nb"] == "midas_nb.cli:main"
