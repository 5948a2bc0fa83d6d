"""`Sample` and `Batch`: what every dataset in :mod:`midas_nb.data` yields.

Conventions (see ``docs/architecture.md``):

* coordinates are continuous pixel coordinates of the *transformed* image; the
  top-left corner of the top-left pixel is ``(0, 0)``, pixel ``(row r, col c)``
  covers ``[c, c+1) x [r, r+1)`` and has its centre at ``(c + 0.5, r + 0.5)``;
* the patch grid is row-major: patch ``(i, j)`` (row ``i``, column ``j``) is token
  ``i * (W // p) + j``;
* invisible parts are ``(0, 0, 0)``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

__all__ = ["Sample", "Batch", "collate_samples", "evaluation_subset"]


@dataclass
class Sample:
    """One transformed example.

    Attributes:
        image: ``[3, H, W]`` float32, normalised for the backbone.
        label: contiguous class index (``-1`` when the split carries no labels,
            e.g. the unlabelled Stanford Cars test file).
        parts: ``[P, 3]`` float32 ``(x, y, visible)`` in the transformed image's
            pixels; invisible parts are ``(0, 0, 0)``; ``P = 0`` for datasets
            without parts.
        box: ``[4]`` float32 ``(x0, y0, x1, y1)`` in the transformed image's pixels,
            clipped to ``[0, W] x [0, H]``.
        part_mask: ``[N]`` bool, patch holds a visible part keypoint (row-major).
        box_mask: ``[N]`` bool, patch centre lies in the box (row-major).
        image_id: the dataset's own image identifier, as a string.
        index: position of the example in its dataset.
    """

    image: Tensor
    label: int
    parts: Tensor
    box: Tensor
    part_mask: Tensor
    box_mask: Tensor
    image_id: str
    index: int

    @property
    def has_visible_part(self) -> bool:
        """True when at least one part keypoint is visible after the transform."""
        return bool(self.part_mask.any())


@dataclass
class Batch:
    """Stacked samples (``B`` examples, ``N`` patch tokens, ``P`` parts).

    Attributes:
        images: ``[B, 3, H, W]`` float32.
        labels: ``[B]`` long.
        parts: ``[B, P, 3]`` float32.
        boxes: ``[B, 4]`` float32.
        part_mask: ``[B, N]`` bool.
        box_mask: ``[B, N]`` bool.
        image_ids: ``list[str]`` of length ``B``.
        indices: ``[B]`` long, positions in the dataset.
    """

    images: Tensor
    labels: Tensor
    parts: Tensor
    boxes: Tensor
    part_mask: Tensor
    box_mask: Tensor
    image_ids: list[str]
    indices: Tensor

    def __len__(self) -> int:
        return int(self.images.shape[0])

    @property
    def has_visible_part(self) -> Tensor:
        """``[B]`` bool: images with at least one visible part (the ones part
        metrics average over)."""
        return self.part_mask.any(dim=1)

    def _map(self, fn: Callable[[Any], Any]) -> "Batch":
        return Batch(**{f.name: fn(getattr(self, f.name)) for f in fields(self)})

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "Batch":
        """Return a copy with every tensor moved to ``device``."""
        return self._map(lambda v: v.to(device, non_blocking=non_blocking) if isinstance(v, Tensor) else list(v))

    def pin_memory(self) -> "Batch":
        """Pin every tensor (used by ``DataLoader(pin_memory=True)``)."""
        return self._map(lambda v: v.pin_memory() if isinstance(v, Tensor) else v)


def collate_samples(samples: Sequence[Sample]) -> Batch:
    """Stack a list of :class:`Sample` into a :class:`Batch` (``collate_fn`` for
    ``torch.utils.data.DataLoader``).

    Raises:
        ValueError: empty list, or samples whose image sizes / part counts differ.
    """
    if len(samples) == 0:
        raise ValueError("collate_samples: got an empty list of samples")
    shapes = {tuple(s.image.shape) for s in samples}
    if len(shapes) != 1:
        raise ValueError(f"collate_samples: images have different shapes {sorted(shapes)}; "
                         "use a transform with a fixed image_size")
    pcount = {int(s.parts.shape[0]) for s in samples}
    if len(pcount) != 1:
        raise ValueError(f"collate_samples: samples have different part counts {sorted(pcount)}")
    return Batch(images=torch.stack([s.image for s in samples]),
                 labels=torch.tensor([int(s.label) for s in samples], dtype=torch.long),
                 parts=torch.stack([s.parts for s in samples]).float(),
                 boxes=torch.stack([s.box for s in samples]).float(),
                 part_mask=torch.stack([s.part_mask for s in samples]).bool(),
                 box_mask=torch.stack([s.box_mask for s in samples]).bool(),
                 image_ids=[str(s.image_id) for s in samples],
                 indices=torch.tensor([int(s.index) for s in samples], dtype=torch.long))


def evaluation_subset(n: int, max_images: int | None, seed: int = 0) -> list[int]:
    """Indices of the evaluated test images: all of them, or ``max_images`` drawn without
    replacement with ``seed`` and sorted (datasets are often ordered by class, so the first
    ``max_images`` would cover few classes)."""
    if max_images is None or max_images >= n:
        return list(range(n))
    g = torch.Generator().manual_seed(int(seed))
    return sorted(torch.randperm(n, generator=g)[: int(max_images)].tolist())
