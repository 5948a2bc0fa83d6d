"""The caveat of every notebook: read before the results (right after the parameters), and true
about the offline backbone (the distilled hybrid_lite0_deit, not a backbone trained from scratch);
and the computed "What this run shows" box every results notebook ends with (decision 0073)."""
from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from midas_nb import config

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_caveat_stands_after_the_parameters_and_names_the_distilled_backbone(path):
    cells = nbformat.read(str(path), as_version=4).cells
    params = [i for i, c in enumerate(cells) if "parameters" in c.metadata.get("tags", [])]
    caveats = [i for i, c in enumerate(cells) if c.cell_type == "markdown" and "**Caveat.**" in c.source]
    assert len(params) == 1 and caveats == [params[0] + 1]
    text = cells[caveats[0]].source
    quick = config.get_profile("quick")["backbone"]
    assert f"`{quick}`" in text and "distilled" in text
    assert "trained from scratch on the data" not in text
    # the smoke profile's tiny ViT is the one backbone trained from scratch
    assert "tiny ViT trained from scratch" in text


#: the notebooks that compute results end with the box; 00 (a tour of the data and backbone) is not among them
BOXED = ("01", "02", "03", "04", "05", "06", "07")


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p.name[:2] in BOXED], ids=lambda p: p.stem)
def test_the_notebook_ends_with_a_computed_box_before_its_exercises(path):
    cells = nbformat.read(str(path), as_version=4).cells
    heads = [i for i, c in enumerate(cells) if c.cell_type == "markdown" and c.source.startswith("## What this run shows")]
    exercises = next(i for i, c in enumerate(cells) if c.cell_type == "markdown" and c.source.startswith("## Exercises"))
    assert len(heads) == 1 and heads[0] + 2 == exercises, (heads, exercises)
    box = cells[heads[0] + 1]
    assert box.cell_type == "code" and "print(synthesis.box(" in box.source
    if path.name[:2] in ("02", "03", "04", "05", "07"):  # the per-claim table: read from computed verdicts
        assert "claims" in box.source and any(f in box.source for f in ("run_claims(", "claims_table(", "probe_claims("))
