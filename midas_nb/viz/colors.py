"""One colour per meaning, the same in every figure of every notebook: per condition / target name,
for the part patches, the object box and the keypoints (:data:`PART_COLOR`, :data:`BOX_COLOR`,
:data:`KEYPOINT_COLOR`), and one colormap per axis a figure colours by (:data:`AXIS_CMAPS`).

:func:`condition_color` maps each known condition or target id (the protocol's conditions,
:func:`midas_nb.targets.list_targets`, the related methods of notebook 06) to a fixed colour,
so that ``T5`` is the same red in notebook 02's coverage plot, notebook 05's bars and notebook
06's perturbation curves. An unknown name gets a colour from :data:`FALLBACK_PALETTE` chosen by
a digest of the name (:mod:`hashlib`, not Python's per-process salted ``hash``), so it too is
the same in every figure, process and machine.
"""
from __future__ import annotations

import hashlib
from typing import Sequence

__all__ = ["CONDITION_COLORS", "FALLBACK_PALETTE", "condition_color", "condition_colors", "PART_COLOR", "BOX_COLOR",
           "KEYPOINT_COLOR", "AXIS_CMAPS"]

#: part patches (filled or outlined), the object box, the visible part keypoints: in every image figure
PART_COLOR, BOX_COLOR, KEYPOINT_COLOR = "gold", "cyan", "red"
#: the colormap of each axis a figure colours lines by: the budget and the depth never share one
AXIS_CMAPS: dict[str, str] = {"budget": "viridis", "depth": "magma"}

#: fixed colours (hex RGB) of the known conditions and targets: the controls in neutrals, the
#: taxonomy targets T1–T5 in tab10's first hues, the related targets and scorer families in the
#: remaining tab10 / tab20 hues; every value is distinct but T0's, which is the reference's: the
#: reference scorer ranks the patch tokens by T0, one ranking in one colour
CONDITION_COLORS: dict[str, str] = {
    # protocol controls
    "reference": "#000000",     # black: the dense backbone, no pruning
    "unsupervised": "#7f7f7f",  # grey: the scorer without a target
    "random": "#c7c7c7",        # light grey: random target
    "random_map": "#e7ba52",    # gold: a fixed random map as target
    # the T0–T5 taxonomy
    "T0": "#000000",            # the reference's ranking: the reference's black
    "T1": "#ff7f0e",
    "T2": "#2ca02c",
    "T3": "#d62728",
    "T4": "#9467bd",
    "T5": "#8c564b",
    # related targets
    "rollout": "#e377c2",
    "rollout_full": "#f7b6d2",
    "tokentm": "#17becf",
    "last_votes": "#bcbd22",
    # related scorer families
    "cropr": "#393b79",
    "iared": "#637939",
}

#: other spellings of a known name (the LaSt-ViT votes are ``last_votes``)
_ALIASES: dict[str, str] = {"last": "last_votes", "lastvit": "last_votes", "last-vit": "last_votes"}

#: colours an unknown name may get (tab20b / tab20c hues that no known name uses)
FALLBACK_PALETTE: tuple[str, ...] = (
    "#5254a3", "#8ca252", "#bd9e39", "#ad494a", "#a55194", "#6b6ecf", "#b5cf6b", "#e7969c",
    "#ce6dbd", "#3182bd", "#e6550d", "#31a354", "#756bb1", "#636363", "#9c9ede", "#843c39",
)


def condition_color(name: str) -> str:
    """The colour of a condition or target in every figure, as a hex string ``"#rrggbb"``.

    Args:
        name: a condition or target id (``"reference"``, ``"T5"``, ``"cropr"``, …); case and
            surrounding spaces are ignored for the known names. Any other string gets a colour
            of :data:`FALLBACK_PALETTE` picked by the MD5 digest of the name, stable across
            processes (two unknown names may share one).

    Returns:
        ``"#rrggbb"``, usable as any matplotlib ``color=``.
    """
    key = str(name).strip()
    if key in CONDITION_COLORS:
        return CONDITION_COLORS[key]
    folded = {k.lower(): v for k, v in CONDITION_COLORS.items()}
    low = key.lower()
    if low in folded:
        return folded[low]
    if low in _ALIASES:
        return CONDITION_COLORS[_ALIASES[low]]
    digest = hashlib.md5(key.encode("utf-8")).digest()
    return FALLBACK_PALETTE[int.from_bytes(digest[:4], "big") % len(FALLBACK_PALETTE)]


def condition_colors(names: Sequence[str]) -> dict[str, str]:
    """``{name: condition_color(name)}`` for each of ``names`` (order kept)."""
    return {str(n): condition_color(str(n)) for n in names}
