"""Joint transforms of image, part keypoints and box.

Every transform maps ``(PIL image, parts [P,3], box [4], part_names)`` to
``(image [3,H,W] float32 normalised, parts [P,3] float32, box [4] float32)`` with
the keypoints and the box expressed in the *output* image's pixels.

Coordinate convention (used throughout :mod:`midas_nb.data`): continuous pixel
coordinates, origin at the top-left corner of the top-left pixel; pixel
``(row r, col c)`` covers ``[c, c+1) x [r, r+1)``, its centre is ``(c+0.5, r+0.5)``.
Under this convention

* a crop-and-resize of the source region ``[rx0, rx1) x [ry0, ry1)`` to ``W x H``
  maps ``x -> (x - rx0) * W / (rx1 - rx0)`` (same for ``y``), exactly what
  ``PIL.Image.resize(size, box=region)`` samples;
* a horizontal flip maps ``x -> W - x`` (pixel ``c`` goes to ``W - 1 - c``, its
  centre ``c + 0.5`` to ``W - c - 0.5``); boxes become ``(W - x1, y0, W - x0, y1)``;
* a keypoint is inside the image when ``0 <= x < W`` and ``0 <= y < H``; visible
  keypoints that leave the crop become invisible, ``(0, 0, 0)``;
* boxes are clipped to ``[0, W] x [0, H]`` (a box that leaves the crop entirely
  becomes empty and its ``box_mask`` all False).

A flip also swaps left/right parts *by name* (``"left eye" <-> "right eye"``,
``left leg``/``right leg``, ``left wing``/``right wing`` for CUB, Wah et al. 2011):
the slot named "left eye" then holds the mirrored "right eye".
"""

from __future__ import annotations

import math
import re
from functools import lru_cache
from typing import Sequence

import numpy as np
import torch
import torch.utils.data
from PIL import Image
from torch import Tensor

__all__ = ["EvalTransform", "TrainTransform", "JointTransform", "flip_permutation",
           "crop_resize", "to_normalised_tensor", "denormalize", "DEFAULT_MEAN", "DEFAULT_STD"]

#: Default normalisation: the offline hybrid backbone's ``(0.5, 0.5, 0.5)``.
DEFAULT_MEAN: tuple[float, float, float] = (0.5, 0.5, 0.5)
DEFAULT_STD: tuple[float, float, float] = (0.5, 0.5, 0.5)

Region = tuple[float, float, float, float]


def _hw(image_size: int | Sequence[int]) -> tuple[int, int]:
    h, w = (image_size, image_size) if isinstance(image_size, int) else (int(v) for v in image_size)
    if h <= 0 or w <= 0:
        raise ValueError(f"image_size must be positive, got {image_size}")
    return h, w


_SIDE = re.compile(r"\b(left|right)\b", re.IGNORECASE)


def _swap_side(name: str) -> str:
    def rep(m: re.Match) -> str:
        w = m.group(0)
        o = "right" if w.lower() == "left" else "left"
        return o.capitalize() if w[0].isupper() else o
    return _SIDE.sub(rep, name)


@lru_cache(maxsize=64)
def _flip_perm_cached(names: tuple[str, ...]) -> tuple[int, ...]:
    index = {n: i for i, n in enumerate(names)}
    return tuple(index.get(_swap_side(n), i) for i, n in enumerate(names))


def flip_permutation(part_names: Sequence[str]) -> list[int]:
    """Index permutation applied to the parts under a horizontal flip.

    ``perm[i]`` is the part whose mirrored keypoint goes into slot ``i``: the slot of
    a name containing the word ``left`` receives the part named with ``right``
    instead, and vice versa; names without a counterpart stay in place.
    """
    return list(_flip_perm_cached(tuple(str(n) for n in part_names)))


def to_normalised_tensor(image: Image.Image, mean: Sequence[float], std: Sequence[float]) -> Tensor:
    """RGB PIL image -> ``[3, H, W]`` float32, ``(x / 255 - mean) / std``."""
    arr = np.asarray(image.convert("RGB"), dtype=np.uint8)
    t = torch.from_numpy(arr.copy()).permute(2, 0, 1).to(torch.float32).div_(255.0)
    m = torch.tensor(mean, dtype=torch.float32).view(3, 1, 1)
    s = torch.tensor(std, dtype=torch.float32).view(3, 1, 1)
    return t.sub_(m).div_(s)


def denormalize(images: Tensor, mean: Sequence[float] = DEFAULT_MEAN, std: Sequence[float] = DEFAULT_STD) -> Tensor:
    """Invert the normalisation of ``[..., 3, H, W]`` images, clamped to ``[0, 1]``."""
    m = torch.tensor(mean, dtype=images.dtype, device=images.device).view(3, 1, 1)
    s = torch.tensor(std, dtype=images.dtype, device=images.device).view(3, 1, 1)
    return (images * s + m).clamp(0, 1)


def crop_resize(image: Image.Image, parts: Tensor, box: Tensor, region: Region, out_hw: tuple[int, int],
                flip: bool = False, part_names: Sequence[str] = ()) -> tuple[Image.Image, Tensor, Tensor]:
    """Resample ``region`` (source pixels, ``(x0, y0, x1, y1)``) to ``out_hw`` and
    map keypoints and box accordingly; optionally flip horizontally afterwards.

    Returns the output PIL image, parts ``[P, 3]`` and box ``[4]`` (clipped) in
    output pixels. Visible keypoints outside the output become ``(0, 0, 0)``.
    """
    out_h, out_w = out_hw
    rx0, ry0, rx1, ry1 = (float(v) for v in region)
    if not (rx1 > rx0 and ry1 > ry0):
        raise ValueError(f"crop region must have positive size, got {region}")
    out = image.resize((out_w, out_h), Image.BILINEAR, box=(rx0, ry0, rx1, ry1))
    sx, sy = out_w / (rx1 - rx0), out_h / (ry1 - ry0)

    p = torch.as_tensor(parts, dtype=torch.float32).reshape(-1, 3).clone()
    x, y = (p[:, 0] - rx0) * sx, (p[:, 1] - ry0) * sy
    vis = (p[:, 2] > 0) & (x >= 0) & (x < out_w) & (y >= 0) & (y < out_h)
    new_parts = torch.stack([x, y, torch.ones_like(x)], dim=1) * vis[:, None].to(torch.float32)

    b = torch.as_tensor(box, dtype=torch.float32).reshape(4)
    new_box = torch.stack([((b[0] - rx0) * sx).clamp(0, out_w), ((b[1] - ry0) * sy).clamp(0, out_h),
                           ((b[2] - rx0) * sx).clamp(0, out_w), ((b[3] - ry0) * sy).clamp(0, out_h)])

    if flip:
        out = out.transpose(Image.FLIP_LEFT_RIGHT)
        v = new_parts[:, 2] > 0
        new_parts[:, 0] = torch.where(v, out_w - new_parts[:, 0], new_parts[:, 0])
        if len(part_names) == new_parts.shape[0]:
            new_parts = new_parts[flip_permutation(part_names)]
        elif len(part_names):
            raise ValueError(f"got {len(part_names)} part names for {new_parts.shape[0]} parts")
        new_box = torch.stack([out_w - new_box[2], new_box[1], out_w - new_box[0], new_box[3]])
    return out, new_parts, new_box


class JointTransform:
    """Base class: subclasses choose the source region and whether to flip."""

    def __init__(self, image_size: int | Sequence[int] = 224,
                 mean: Sequence[float] = DEFAULT_MEAN, std: Sequence[float] = DEFAULT_STD) -> None:
        self.image_size = _hw(image_size)
        if len(mean) != 3 or len(std) != 3:
            raise ValueError(f"mean and std need 3 values, got {mean}, {std}")
        if any(float(s) == 0 for s in std):
            raise ValueError(f"std must be non-zero, got {std}")
        self.mean = tuple(float(v) for v in mean)
        self.std = tuple(float(v) for v in std)

    def region(self, width: int, height: int) -> tuple[Region, bool]:  # pragma: no cover
        """Return the source region ``(x0, y0, x1, y1)`` and the flip decision."""
        raise NotImplementedError

    def __call__(self, image: Image.Image, parts: Tensor | np.ndarray, box: Tensor | np.ndarray,
                 part_names: Sequence[str] = ()) -> tuple[Tensor, Tensor, Tensor]:
        """Transform jointly; see the module docstring for conventions.

        Args:
            image: PIL image (any mode; converted to RGB).
            parts: ``[P, 3]`` ``(x, y, visible)`` in source pixels.
            box: ``[4]`` ``(x0, y0, x1, y1)`` in source pixels.
            part_names: names of the ``P`` parts (for the left/right swap on flip).

        Returns:
            ``image [3, H, W]`` float32 normalised, ``parts [P, 3]``, ``box [4]``.
        """
        if image.mode != "RGB":
            image = image.convert("RGB")
        region, flip = self.region(*image.size)
        out, p, b = crop_resize(image, torch.as_tensor(parts), torch.as_tensor(box), region,
                                self.image_size, flip=flip, part_names=part_names)
        return to_normalised_tensor(out, self.mean, self.std), p, b


class EvalTransform(JointTransform):
    """Resize the shorter side, then centre crop (the usual ImageNet evaluation).

    The image is resized so that it covers ``(round(H * resize_ratio),
    round(W * resize_ratio))`` — for a square output: shorter side to
    ``round(image_size * resize_ratio)``, aspect kept — and the centre
    ``H x W`` is cropped (offsets ``round((resized - out) / 2)``, as torchvision).
    Resize and crop are done in one bilinear resample of the matching source region.

    Args:
        image_size: output ``int`` or ``(H, W)`` in pixels.
        resize_ratio: resize target / crop size (``256/224`` by default; ``1.0`` gives
            a crop of the full shorter side).
        mean, std: normalisation (default ``(0.5, 0.5, 0.5)``).
    """

    def __init__(self, image_size: int | Sequence[int] = 224, resize_ratio: float = 256 / 224,
                 mean: Sequence[float] = DEFAULT_MEAN, std: Sequence[float] = DEFAULT_STD) -> None:
        super().__init__(image_size, mean, std)
        if resize_ratio < 1.0:
            raise ValueError(f"resize_ratio must be >= 1 (crop inside the resized image), got {resize_ratio}")
        self.resize_ratio = float(resize_ratio)

    def region(self, width: int, height: int) -> tuple[Region, bool]:
        out_h, out_w = self.image_size
        s = max(round(out_h * self.resize_ratio) / height, round(out_w * self.resize_ratio) / width)
        rw, rh = max(out_w, round(width * s)), max(out_h, round(height * s))
        left, top = int(round((rw - out_w) / 2.0)), int(round((rh - out_h) / 2.0))
        fx, fy = width / rw, height / rh
        return (left * fx, top * fy, (left + out_w) * fx, (top + out_h) * fy), False

    def __repr__(self) -> str:
        return (f"EvalTransform(image_size={self.image_size}, resize_ratio={self.resize_ratio:.4f}, "
                f"mean={self.mean}, std={self.std})")


class TrainTransform(JointTransform):
    """Random resized crop + random horizontal flip (training augmentation).

    The crop follows torchvision's ``RandomResizedCrop``: area fraction uniform in
    ``scale``, aspect ratio (crop width / height, relative to the output's) log-uniform
    in ``ratio``, 10 attempts, then a centre crop fallback. The flip (probability
    ``flip_prob`` when ``flip``) mirrors x and swaps left/right parts by name.

    Randomness: ``generator`` if given; else, with ``seed``, a private generator
    (seeded ``seed`` in the main process, ``seed`` mixed with the worker's
    ``torch.initial_seed()`` inside ``DataLoader`` workers, so workers and epochs
    differ and ``torch.manual_seed`` in the main process reproduces a run); else
    torch's global RNG.

    Args:
        image_size: output ``int`` or ``(H, W)`` in pixels.
        scale: range of the crop's area as a fraction of the image area.
        ratio: range of the crop's aspect ratio.
        flip: enable random horizontal flips.
        flip_prob: probability of a flip (0.5).
        mean, std: normalisation (default ``(0.5, 0.5, 0.5)``).
        seed, generator: randomness, see above.
    """

    def __init__(self, image_size: int | Sequence[int] = 224, scale: tuple[float, float] = (0.35, 1.0),
                 ratio: tuple[float, float] = (3 / 4, 4 / 3), flip: bool = True,
                 flip_prob: float = 0.5, mean: Sequence[float] = DEFAULT_MEAN, std: Sequence[float] = DEFAULT_STD,
                 seed: int | None = None, generator: torch.Generator | None = None) -> None:
        super().__init__(image_size, mean, std)
        if not (0 < scale[0] <= scale[1] <= 1):
            raise ValueError(f"scale must satisfy 0 < min <= max <= 1, got {scale}")
        if not (0 < ratio[0] <= ratio[1]):
            raise ValueError(f"ratio must satisfy 0 < min <= max, got {ratio}")
        self.scale = (float(scale[0]), float(scale[1]))
        self.ratio = (float(ratio[0]), float(ratio[1]))
        self.flip = bool(flip)
        if not 0.0 <= flip_prob <= 1.0:
            raise ValueError(f"flip_prob must be in [0, 1], got {flip_prob}")
        self.flip_prob = float(flip_prob)
        self.seed = None if seed is None else int(seed)
        self._user_generator = generator
        self._gen: torch.Generator | None = None
        self._gen_owner: int | None = None

    @property
    def generator(self) -> torch.Generator | None:
        """The generator in use: the one passed in; else, with a ``seed``, a private
        one (seeded ``seed`` in the main process; in a ``DataLoader`` worker seeded from
        ``seed`` and the worker's ``torch.initial_seed()``, so workers and epochs differ
        while a ``torch.manual_seed`` in the main process still reproduces them); else
        None (torch's global RNG)."""
        if self._user_generator is not None:
            return self._user_generator
        if self.seed is None:
            return None
        info = torch.utils.data.get_worker_info()
        wid = -1 if info is None else int(info.id)
        if self._gen is None or self._gen_owner != wid:
            # in a worker, torch.initial_seed() = DataLoader base seed + worker id: it differs
            # per worker and per epoch and follows the main process's torch.manual_seed
            s = self.seed if wid < 0 else (self.seed * 1_000_003 + torch.initial_seed()) % (2 ** 63)
            self._gen, self._gen_owner = torch.Generator().manual_seed(s), wid
        return self._gen

    def _uniform(self, lo: float, hi: float) -> float:
        return lo + (hi - lo) * float(torch.rand((), generator=self.generator))

    def _randint(self, lo: int, hi_incl: int) -> int:
        return int(torch.randint(lo, hi_incl + 1, (), generator=self.generator))

    def region(self, width: int, height: int) -> tuple[Region, bool]:
        out_h, out_w = self.image_size
        rel = out_w / out_h
        area = width * height
        lr = (math.log(self.ratio[0] * rel), math.log(self.ratio[1] * rel))
        reg = None
        for _ in range(10):
            target = area * self._uniform(*self.scale)
            aspect = math.exp(self._uniform(*lr))
            cw = int(round(math.sqrt(target * aspect)))
            ch = int(round(math.sqrt(target / aspect)))
            if 0 < cw <= width and 0 < ch <= height:
                top, left = self._randint(0, height - ch), self._randint(0, width - cw)
                reg = (float(left), float(top), float(left + cw), float(top + ch))
                break
        if reg is None:  # centre crop with the aspect clamped into the ratio range
            in_ratio = width / height
            if in_ratio < min(self.ratio) * rel:
                cw = width
                ch = int(round(cw / (min(self.ratio) * rel)))
            elif in_ratio > max(self.ratio) * rel:
                ch = height
                cw = int(round(ch * max(self.ratio) * rel))
            else:
                cw, ch = width, height
            left, top = (width - cw) // 2, (height - ch) // 2
            reg = (float(left), float(top), float(left + cw), float(top + ch))
        do_flip = self.flip and float(torch.rand((), generator=self.generator)) < self.flip_prob
        return reg, do_flip

    def __repr__(self) -> str:
        return (f"TrainTransform(image_size={self.image_size}, scale={self.scale}, ratio={self.ratio}, "
                f"flip={self.flip}, flip_prob={self.flip_prob}, mean={self.mean}, std={self.std})")
