"""Synthetic fine-grained "birds" in the exact CUB-200-2011 layout.

:func:`make_synthetic_cub` draws, with PIL, a bird-like object (ellipse body,
round head, triangular beak, wing with a pattern, tail, legs) at a random
position and scale, facing left or right, on a cluttered background (colour
gradient, random rectangles and ellipses in desaturated colours, pixel noise).
Body colour, pose, position, scale, clutter and occluders are random per image and
shared by all classes: **classes differ only in part attributes** — beak colour and
length, crown colour, wing pattern and colour, tail colour — so a classifier has to
look at the parts. Class attribute combinations are chosen to be far apart in
Hamming distance, and the parts are large and saturated so a tiny ViT learns the
task quickly.

The 15 keypoints follow CUB's part list and order (:data:`CUB_PART_NAMES`), with
visibility: the far-side eye is occluded, the far-side wing shows only sometimes,
parts under a random occluder or outside the frame are invisible (``0 0 0`` rows,
as in CUB). A bird facing right shows its right side (the viewer sees the side
opposite to its left), so a horizontal flip turns it into a bird facing left that
shows its left side — consistent with the name swap of the flip transform.

Everything is a function of ``seed`` (per image ``numpy.random.default_rng([seed,
class, index])``): the same arguments give byte-identical files.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from itertools import product
from pathlib import Path
from typing import Any, Callable

import numpy as np
from PIL import Image, ImageDraw

from ..identity import new_file_mode
from ._common import DatasetError, PathLike
from .cub import CUB_PART_NAMES

__all__ = ["make_synthetic_cub", "ensure_synthetic_cub", "synthetic_class_attributes", "data_note", "SYNTHETIC_VERSION"]

#: Bumped whenever the drawing changes (a cached set with another version is redrawn).
SYNTHETIC_VERSION = 1

_COLOURS: dict[str, tuple[int, int, int]] = {"red": (225, 30, 35), "yellow": (250, 215, 20), "blue": (30, 80, 235),
    "green": (25, 185, 60), "orange": (255, 130, 0), "black": (15, 15, 20), "white": (250, 250, 250),
    "magenta": (225, 40, 210), "cyan": (20, 215, 230)}
_ATTRIBUTES: dict[str, tuple[str, ...]] = {"beak_colour": ("orange", "black", "red", "cyan"),
                                           "beak_length": ("short", "long"),
                                           "crown_colour": ("red", "blue", "yellow", "black"),
                                           "wing_pattern": ("solid", "bars", "spots"),
                                           "wing_colour": ("white", "black", "blue"),
                                           "tail_colour": ("red", "blue", "green", "yellow")}
_BODY_COLOURS = ((150, 120, 90), (120, 110, 100), (170, 150, 120), (100, 90, 80), (140, 135, 125), (160, 130, 110))
_FILES_META = "synthetic.json"


def synthetic_class_attributes(num_classes: int, seed: int = 0) -> list[dict[str, str]]:
    """Part attributes of each class: a greedy farthest-point choice (Hamming
    distance) among all attribute combinations, in a seeded order."""
    keys = list(_ATTRIBUTES)
    combos = np.array(list(product(*[range(len(_ATTRIBUTES[k])) for k in keys])), dtype=np.int64)
    if not 1 <= num_classes <= len(combos):
        raise ValueError(f"num_classes must be in 1..{len(combos)}, got {num_classes}")
    rng = np.random.default_rng([int(seed), 7919])
    combos = combos[rng.permutation(len(combos))]
    chosen = [0]
    mind = (combos != combos[0]).sum(axis=1)
    for _ in range(num_classes - 1):
        nxt = int(np.argmax(mind))  # first index of the maximum: deterministic
        chosen.append(nxt)
        mind = np.minimum(mind, (combos != combos[nxt]).sum(axis=1))
    return [{k: _ATTRIBUTES[k][int(v)] for k, v in zip(keys, combos[c])} for c in chosen]


def _class_dir_name(c: int, a: dict[str, str]) -> str:
    return (f"{c + 1:03d}.Synth_beak_{a['beak_colour']}_{a['beak_length']}_crown_{a['crown_colour']}"
            f"_wing_{a['wing_pattern']}_{a['wing_colour']}_tail_{a['tail_colour']}")


def _ellipse_poly(cx: float, cy: float, rx: float, ry: float, angle: float, n: int = 28) -> list[tuple[float, float]]:
    ca, sa = math.cos(angle), math.sin(angle)
    xy = [(rx * math.cos(2 * math.pi * k / n), ry * math.sin(2 * math.pi * k / n)) for k in range(n)]
    return [(cx + ca * x - sa * y, cy + sa * x + ca * y) for x, y in xy]


def _draw_background(rng: np.random.Generator, size: int, ss: int) -> Image.Image:
    S = size * ss
    c0 = rng.integers(40, 215, 3)
    c1 = np.clip(c0 + rng.integers(-60, 61, 3), 0, 255)
    t = np.linspace(0.0, 1.0, S, dtype=np.float32)
    vertical = bool(rng.integers(0, 2))
    ramp = (t[:, None] if vertical else t[None, :]) * np.ones((S, S), np.float32)
    arr = (c0[None, None, :] * (1 - ramp[..., None]) + c1[None, None, :] * ramp[..., None]).astype(np.uint8)
    img = Image.fromarray(arr, "RGB")
    d = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(6, 14))):
        col = rng.integers(0, 256, 3)
        grey = col.mean()
        col = tuple(int(v) for v in (0.45 * col + 0.55 * grey))  # desaturated clutter
        x0, y0 = rng.uniform(-0.1, 1.0, 2) * S
        w, h = rng.uniform(0.05, 0.35, 2) * S
        box = [float(x0), float(y0), float(x0 + w), float(y0 + h)]
        if rng.random() < 0.5:
            d.rectangle(box, fill=col)
        else:
            d.ellipse(box, fill=col)
    return img


def _draw_bird(rng: np.random.Generator, attrs: dict[str, str], size: int, ss: int
               ) -> tuple[Image.Image, np.ndarray, np.ndarray]:
    """Returns the image (supersampled), keypoints ``[15, 3]`` and box ``x0 y0 x1 y1``,
    both in final (not supersampled) pixels."""
    img = _draw_background(rng, size, ss)
    d = ImageDraw.Draw(img)
    L = float(rng.uniform(0.18, 0.30)) * size            # body half-length, px
    facing = 1.0 if rng.random() < 0.5 else -1.0         # +1: facing right
    margin = 0.15 * L
    cx = float(rng.uniform(1.7 * L - margin, size - 1.7 * L + margin)) if size > 3.4 * L else size / 2
    cy = float(rng.uniform(1.0 * L - margin, size - 1.0 * L + margin)) if size > 2.0 * L else size / 2
    body_col = _BODY_COLOURS[int(rng.integers(0, len(_BODY_COLOURS)))]
    body_col = tuple(int(np.clip(v + rng.integers(-15, 16), 0, 255)) for v in body_col)
    beak_len = (0.45 if attrs["beak_length"] == "short" else 0.95) * L
    col = {k: _COLOURS[attrs[k]] for k in ("beak_colour", "crown_colour", "wing_colour", "tail_colour")}
    wing_alt = (235, 235, 235) if attrs["wing_colour"] != "white" else (20, 20, 20)

    def P(x: float, y: float) -> tuple[float, float]:   # local (facing right) -> final px
        return (cx + facing * x * L, cy + y * L)

    def S(pts: list[tuple[float, float]]) -> list[tuple[float, float]]:  # final -> supersampled
        return [(x * ss, y * ss) for x, y in pts]

    hx, hy, hr = 0.95, -0.55, 0.40                        # head centre, radius (units of L)
    far_wing = rng.random() < 0.5
    # tail
    tail = [P(-0.80, -0.20), P(-0.80, 0.22), P(-1.70, 0.30), P(-1.75, -0.30)]
    d.polygon(S(tail), fill=col["tail_colour"])
    # far wing, peeking above the back
    if far_wing:
        fw = _ellipse_poly(*P(-0.25, -0.75), 0.55 * L, 0.22 * L, -facing * 0.35)
        d.polygon(S(fw), fill=col["wing_colour"])
    # legs
    legw = max(1, int(round(0.09 * L * ss)))
    for x0, x1 in ((0.18, 0.25), (-0.12, -0.05)):
        d.line(S([P(x0, 0.5), P(x1, 1.0)]), fill=(60, 50, 40), width=legw)
    # body
    d.polygon(S(_ellipse_poly(*P(0, 0), 1.0 * L, 0.62 * L, 0.0)), fill=body_col)
    # near wing with pattern
    wc = P(-0.15, -0.05)
    wang = -facing * 0.25
    d.polygon(S(_ellipse_poly(*wc, 0.70 * L, 0.34 * L, wang)), fill=col["wing_colour"])
    if attrs["wing_pattern"] == "bars":
        for t in (-0.35, 0.0, 0.35):
            d.line(S([P(-0.15 + t, -0.32), P(-0.15 + t - 0.12, 0.24)]), fill=wing_alt,
                   width=max(1, int(round(0.12 * L * ss))))
    elif attrs["wing_pattern"] == "spots":
        for t, u in ((-0.45, -0.05), (-0.1, -0.15), (0.25, -0.02), (-0.2, 0.15), (0.1, 0.17)):
            x, y = P(-0.15 + t, u)
            r = 0.09 * L
            d.ellipse(S([(x - r, y - r), (x + r, y + r)]), fill=wing_alt)
    # head, crown (upper half of the head), beak, eye
    hcx, hcy = P(hx, hy)
    R = hr * L
    d.ellipse(S([(hcx - R, hcy - R), (hcx + R, hcy + R)]), fill=body_col)
    d.chord(S([(hcx - R, hcy - R), (hcx + R, hcy + R)]), 180, 360, fill=col["crown_colour"])
    beak = [P(hx + 0.30, hy - 0.17), P(hx + 0.30, hy + 0.17), P(hx + 0.30 + beak_len / L + 0.05, hy + 0.04)]
    d.polygon(S(beak), fill=col["beak_colour"])
    ex, ey = P(hx + 0.14, hy - 0.05)
    er = 0.09 * L
    d.ellipse(S([(ex - er * 1.5, ey - er * 1.5), (ex + er * 1.5, ey + er * 1.5)]), fill=(250, 250, 250))
    d.ellipse(S([(ex - er, ey - er), (ex + er, ey + er)]), fill=(10, 10, 10))

    kp = _bird_keypoints(P, facing, hx, hy, beak_len, L, (ex, ey), wc, far_wing)
    # object box: union of the drawn shapes
    pts = np.array(tail + beak + [P(x, y) for x, y in ((-1.0, -0.62), (1.0, 0.62), (0.25, 1.0), (-0.12, 1.0))]
                   + [(hcx - R, hcy - R), (hcx + R, hcy + R)] + ([P(-0.8, -0.97)] if far_wing else []))
    box = np.array([pts[:, 0].min(), pts[:, 1].min(), pts[:, 0].max(), pts[:, 1].max()])
    out = _visible_parts(kp, size, _occluder(rng, d, box, L, ss))
    return img, out, np.clip(box, 0, size)


def _bird_keypoints(P: Callable[[float, float], tuple[float, float]], facing: float, hx: float, hy: float,
                    beak_len: float, L: float, eye: tuple[float, float], wing: tuple[float, float], far_wing: bool
                    ) -> dict[str, tuple[float, float, int]]:
    """The 15 CUB part keypoints ``name -> (x, y, visible)`` of a drawn bird, in final pixels
    (``P``: local bird coordinates in units of the half-length ``L`` px → final pixels;
    ``beak_len`` in px; the far eye is hidden, the far wing visible when drawn)."""
    near, far = ("right", "left") if facing > 0 else ("left", "right")
    xy = {"back": P(-0.25, -0.58), "beak": P(hx + 0.30 + 0.5 * beak_len / L, hy + 0.02), "belly": P(0.0, 0.52),
          "breast": P(0.62, 0.30), "crown": P(hx, hy - 0.28), "forehead": P(hx + 0.27, hy - 0.24),
          f"{near} eye": eye, f"{far} eye": eye, f"{near} leg": P(0.25, 0.98), f"{far} leg": P(-0.05, 0.98),
          f"{near} wing": wing, f"{far} wing": P(-0.25, -0.82), "nape": P(hx - 0.33, hy + 0.12),
          "tail": P(-1.45, 0.0), "throat": P(hx + 0.12, hy + 0.36)}
    hidden = {f"{far} eye": True, f"{far} wing": not far_wing}
    return {k: (x, y, int(not hidden.get(k, False))) for k, (x, y) in xy.items()}


def _occluder(rng: np.random.Generator, d: ImageDraw.ImageDraw, box: np.ndarray, L: float, ss: int
              ) -> tuple[float, float, float, float] | None:
    """With probability 1/4, a clutter-coloured block over part of the bird (drawn on ``d``);
    its rectangle ``x0 y0 x1 y1`` in final pixels, else ``None``."""
    if rng.random() >= 0.25:
        return None
    ow, oh = rng.uniform(0.5, 1.0) * L, rng.uniform(0.5, 1.0) * L
    ox = float(rng.uniform(box[0], box[2])) - ow / 2
    oy = float(rng.uniform(box[1], box[3])) - oh / 2
    occ = (ox, oy, ox + ow, oy + oh)
    g = int(rng.integers(60, 200))
    d.rectangle([(occ[0] * ss, occ[1] * ss), (occ[2] * ss, occ[3] * ss)], fill=(g, g, int(g * 0.9)))
    return occ


def _visible_parts(kp: dict[str, tuple[float, float, int]], size: int,
                   occ: tuple[float, float, float, float] | None) -> np.ndarray:
    """``[15, 3]`` in :data:`CUB_PART_NAMES` order; a keypoint outside the image or under the
    occluder becomes ``(0, 0, 0)``."""
    out = np.zeros((len(CUB_PART_NAMES), 3), np.float32)
    for k, name in enumerate(CUB_PART_NAMES):
        x, y, v = kp[name]
        hidden = occ is not None and occ[0] <= x <= occ[2] and occ[1] <= y <= occ[3]
        out[k] = (x, y, 1) if v and 0 <= x < size and 0 <= y < size and not hidden else (0, 0, 0)
    return out


def _render(rng: np.random.Generator, attrs: dict[str, str], size: int) -> tuple[Image.Image, np.ndarray, np.ndarray]:
    ss = 2  # supersampling for anti-aliased edges
    big, parts, box = _draw_bird(rng, attrs, size, ss)
    arr = np.asarray(big.resize((size, size), Image.BOX), dtype=np.int16)
    arr = np.clip(arr + np.round(rng.normal(0.0, 6.0, arr.shape)), 0, 255).astype(np.uint8)
    return Image.fromarray(arr, "RGB"), parts, box


def _params(num_classes: int, images_per_class: int, image_size: int, seed: int,
            train_fraction: float) -> dict[str, Any]:
    return {"generator": "midas_nb.data.synthetic", "version": SYNTHETIC_VERSION,
            "num_classes": int(num_classes), "images_per_class": int(images_per_class),
            "image_size": int(image_size), "seed": int(seed), "train_fraction": float(train_fraction)}


def _write(root: Path, p: dict[str, Any]) -> None:
    C, n, size, seed, frac = p["num_classes"], p["images_per_class"], p["image_size"], p["seed"], p["train_fraction"]
    attrs = synthetic_class_attributes(C, seed)
    (root / "parts").mkdir(parents=True, exist_ok=True)
    n_train = n if frac >= 1 else (0 if frac <= 0 else min(max(1, round(frac * n)), max(n - 1, 1)))
    images, labels, split, boxes, locs = [], [], [], [], []
    img_id = 0
    for c in range(C):
        cdir = _class_dir_name(c, attrs[c])
        (root / "images" / cdir).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            img_id += 1
            rng = np.random.default_rng([seed, c, i])
            img, parts, box = _render(rng, attrs[c], size)
            rel = f"{cdir}/Synth_{c + 1:03d}_{i + 1:04d}.jpg"
            img.save(root / "images" / rel, format="JPEG", quality=92)
            images.append(f"{img_id} {rel}")
            labels.append(f"{img_id} {c + 1}")
            split.append(f"{img_id} {1 if i < n_train else 0}")
            boxes.append(f"{img_id} {box[0]:.1f} {box[1]:.1f} {box[2] - box[0]:.1f} {box[3] - box[1]:.1f}")
            for k, (x, y, v) in enumerate(parts):
                locs.append(f"{img_id} {k + 1} {x:.1f} {y:.1f} {int(v)}")
    files = {"images.txt": images, "image_class_labels.txt": labels, "train_test_split.txt": split,
             "classes.txt": [f"{c + 1} {_class_dir_name(c, attrs[c])}" for c in range(C)], "bounding_boxes.txt": boxes,
             "parts/parts.txt": [f"{k + 1} {name}" for k, name in enumerate(CUB_PART_NAMES)],
             "parts/part_locs.txt": locs}
    for name, rows in files.items():
        (root / name).write_text("\n".join(rows) + "\n", encoding="utf-8")
    meta = json.dumps(dict(p, class_attributes=attrs), indent=1, sort_keys=True)
    (root / _FILES_META).write_text(meta + "\n", encoding="utf-8")


def make_synthetic_cub(root: PathLike, *, num_classes: int = 4, images_per_class: int = 8,
                       image_size: int = 96, seed: int = 0, train_fraction: float = 0.5) -> Path:
    """Write a synthetic fine-grained set in CUB-200-2011's layout (readable by
    :class:`~midas_nb.data.CUBDataset`).

    Files: ``images.txt``, ``image_class_labels.txt``, ``train_test_split.txt``
    (the first ``round(train_fraction * images_per_class)`` images of each class are
    train, at least one of each split when ``0 < train_fraction < 1`` and
    ``images_per_class >= 2``), ``classes.txt``, ``bounding_boxes.txt`` (x y w h,
    pixels), ``parts/parts.txt`` (the 15 CUB part names), ``parts/part_locs.txt``
    (pixels; invisible rows ``0 0 0``), ``images/<class>/<file>.jpg`` (square,
    ``image_size`` px, JPEG q92) and ``synthetic.json`` (the arguments and each
    class's attributes).

    The directory is written to a temporary sibling and moved into place, so a
    reader never sees a half-written set. An existing ``root`` is replaced only when
    it is empty or was written by this function (has ``synthetic.json``).

    Returns:
        ``Path(root)``.

    Raises:
        ValueError: bad sizes / fractions.
        DatasetError: ``root`` exists, is not empty and was not written by this function.
    """
    if images_per_class < 1:
        raise ValueError(f"images_per_class must be >= 1, got {images_per_class}")
    if image_size < 16:
        raise ValueError(f"image_size must be >= 16 px, got {image_size}")
    if not 0.0 <= train_fraction <= 1.0:
        raise ValueError(f"train_fraction must be in [0, 1], got {train_fraction}")
    synthetic_class_attributes(num_classes, seed)  # validates num_classes
    root = Path(root).expanduser()
    if root.exists():
        if not root.is_dir():
            raise DatasetError(f"{root} exists and is not a directory; expected a directory for the synthetic set")
        if any(root.iterdir()) and not (root / _FILES_META).is_file():
            raise DatasetError(f"{root} is not empty and holds no {_FILES_META}; refusing to overwrite it "
                               "with a synthetic set (choose an empty or new directory)")
    root.parent.mkdir(parents=True, exist_ok=True)
    params = _params(num_classes, images_per_class, image_size, seed, train_fraction)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.tmp-", dir=root.parent))
    try:
        os.chmod(tmp, new_file_mode(directory=True))  # mkdtemp's 0o700 would hide the set from the group
        _write(tmp, params)
        if root.exists():
            old = root.parent / f".{root.name}.old-{os.getpid()}"
            os.replace(root, old)
            shutil.rmtree(old, ignore_errors=True)
        try:
            os.replace(tmp, root)
        except OSError:
            # another process finished first: accept its set if it is the same one
            if _matches(root, params):
                return root
            raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return root


def _matches(root: Path, params: dict[str, Any]) -> bool:
    try:
        meta = json.loads((root / _FILES_META).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return all(meta.get(k) == v for k, v in params.items()) and (root / "images.txt").is_file()


def ensure_synthetic_cub(root: PathLike, *, num_classes: int = 4, images_per_class: int = 8,
                         image_size: int = 96, seed: int = 0, train_fraction: float = 0.5) -> Path:
    """Return ``root`` holding the synthetic set with these arguments, generating it
    only when missing or written with other arguments. A directory that already
    holds a CUB layout (``images.txt``) but no ``synthetic.json`` is left as it is
    (a user-provided CUB-format set)."""
    root = Path(root).expanduser()
    params = _params(num_classes, images_per_class, image_size, seed, train_fraction)
    if _matches(root, params) or ((root / "images.txt").is_file() and not (root / _FILES_META).is_file()):
        return root
    return make_synthetic_cub(root, num_classes=num_classes, images_per_class=images_per_class,
                              image_size=image_size, seed=seed, train_fraction=train_fraction)


def data_note(train_set: Any, test_set: Any) -> str:
    """What a reader must know about the data in one line: on the embedded synthetic set (a root this module
    wrote, marked by its ``synthetic.json``; a ``quick`` or ``smoke`` run without a data root uses it) its
    classes, split sizes and why coverage and faithfulness rising together is expected there; ``""`` on any
    other data (a real CUB, FGVC-Aircraft or Stanford Cars root).

    Args:
        train_set, test_set: the study's datasets (``root``, ``num_classes``, ``len``).
    """
    root = getattr(test_set, "root", None)
    if root is None or not (Path(root) / _FILES_META).is_file():
        return ""
    return (f"Data: the embedded synthetic CUB-format set (no data root given): {test_set.num_classes} cartoon bird "
            f"classes that differ only in their parts (beak, crown, wing, tail; the class names list them), "
            f"{len(train_set)} training / {len(test_set)} test images. The class evidence sits on the parts by "
            "construction, so part coverage and faithfulness rising together is expected here and says nothing "
            "about real photos.")
