"""A tiny map-style dataset with the fields of ``midas_nb.data.Sample`` (shared by test modules)."""
from __future__ import annotations

import torch

from midas_nb.data import Sample


class TinyDataset(torch.utils.data.Dataset):
    """Samples with the fields of ``midas_nb.data.Sample``: 32×32 images, 4×4 patch grid.

    Images are Gaussian noise shifted by ``0.5·label`` (so a tiny ViT can learn the classes);
    part and box masks are random. ``first_without_parts`` clears image 0's part mask (an image
    with no visible part); ``images`` / ``labels`` replace the generated ones.
    """

    def __init__(self, n: int, seed: int, has_parts: bool = True, num_classes: int = 4,
                 images: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                 first_without_parts: bool = False):
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.arange(n) % num_classes if labels is None else labels
        self.images = (torch.randn(n, 3, 32, 32, generator=g) + self.labels[:, None, None, None] * 0.5
                       if images is None else images)
        self.part_mask = torch.rand(n, 16, generator=g) < 0.3
        if first_without_parts:
            self.part_mask[0] = False
        self.box_mask = torch.rand(n, 16, generator=g) < 0.5
        self.has_parts, self.num_classes = has_parts, num_classes
        self.classes = [f"c{i}" for i in range(num_classes)]

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return Sample(image=self.images[i], label=int(self.labels[i]), parts=torch.zeros(0, 3),
                      box=torch.tensor([0.0, 0.0, 32.0, 32.0]), part_mask=self.part_mask[i],
                      box_mask=self.box_mask[i], image_id=str(i), index=i)
