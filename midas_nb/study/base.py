"""One study = one (profile, dataset, backbone): its data splits, fine-tuned backbone and target maps."""
from __future__ import annotations

import copy
from functools import cached_property
from typing import Any

import pandas as pd
import torch

from ..backbones import backbone_normalization, checkpoint_key, load_or_finetune
from ..data import (collate_samples, data_note, DatasetError, load_dataset, make_synthetic_cub, TRAIN_SPLIT,
                    unlabelled_test_message)
from ..progress import progress_enabled
from ..results import format_ci
from ..analysis.target_maps import iou_ceiling_table, target_coverage, target_insdel, target_pib_table
from ..targets import target_cache
from ..backbones.vit import grid_size
from .settings import RunSettings

__all__ = ["StudyBase"]


_TORCH_DEFAULT_THREADS = torch.get_num_threads()


class StudyBase:
    """Data, backbone and cached pipeline stages for ``profile`` (DESIGN.md §7) with ``overrides`` (any profile key;
    ``None`` ignored). Raises :class:`midas_nb.config.ProfileError`: every problem of the settings."""

    def __init__(self, profile: str = "quick", progress: bool = True, **overrides: Any):
        self._settings = RunSettings.build(profile, **overrides)
        self.progress = progress_enabled(progress)
        d = self.settings.data
        if d.embedded and not (d.root / "images.txt").is_file():
            make_synthetic_cub(d.root, **d.synthetic)
        self.loader_name, self.data_root, self.dataset_name = d.loader, d.root, d.label
        self.device = torch.device(self.settings.device)
        self.own_threads()

    @property
    def settings(self) -> RunSettings:
        """The typed run description, built and checked once (read-only)."""
        return self._settings

    @property
    def params(self) -> dict[str, Any]:
        """A copy of the profile with its overrides, as sweep cells are keyed."""
        return copy.deepcopy(dict(self._settings.values))

    def own_threads(self) -> None:
        """Torch's threads := the profile's ``torch_threads`` (``None``: the count at import; decision 0051)."""
        torch.set_num_threads(self.settings.torch_threads or _TORCH_DEFAULT_THREADS)

    def __repr__(self) -> str:
        s = self.settings
        b = s.backbone
        return (f"Study(profile={s.profile!r}, dataset={self.dataset_name!r}, backbone={b.name!r}, build={b.build}"
                + (f" of builds {b.build}–{b.build + b.builds - 1}" if b.builds > 1 else "")
                + f", depth={s.point.depth}, budget={s.point.budget}, device={str(self.device)!r})")

    @cached_property
    def normalization(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        return backbone_normalization(self.settings.backbone.name)

    def dataset(self, split: str, train: bool = False):
        """The ``split`` with the backbone's normalisation; ``DatasetError`` for a split without labels."""
        mean, std = self.normalization
        if split == "train":
            split = TRAIN_SPLIT.get(self.loader_name, "train")
        d = self.settings.data
        extra = {} if d.max_images_per_class is None else dict(max_images_per_class=d.max_images_per_class)
        if d.loader == "aircraft":
            extra["annotation_level"] = d.aircraft_level
        ds = load_dataset(d.loader, d.root, split, image_size=d.image_size, patch_size=d.patch_size,
                          train=train, mean=mean, std=std, **extra)
        if not getattr(ds, "has_labels", True):  # refused before anything is trained or stored
            raise DatasetError(unlabelled_test_message(self.loader_name, self.data_root, ds))
        return ds

    @cached_property
    def train_set(self):
        return self.dataset("train")

    @cached_property
    def test_set(self):
        return self.dataset("test")

    def data_note(self) -> str:
        """The data line every notebook prints: :func:`midas_nb.data.data_note`, else the dataset and its root."""
        return data_note(self.train_set, self.test_set) or f"Data: {self.dataset_name} from {self.data_root}"

    def checkpoint_key(self, device: str | torch.device | None = None) -> tuple[str, dict[str, Any]]:
        """``(checkpoint_id, key)`` of the fine-tuned backbone, nothing trained (``device``: another's numerics)."""
        self.own_threads()
        b = self.settings.backbone
        return checkpoint_key(b.name, self.train_set, self.test_set, b.recipe, weights=b.weights,
                              backbone_kwargs=dict(b.kwargs) or None, device=self.device if device is None else device)

    @property
    def checkpoint_id(self) -> str:
        """The fine-tuned checkpoint's id: the loaded backbone's, else :meth:`checkpoint_key`'s."""
        return str(self.meta["checkpoint_id"]) if "_backbone" in self.__dict__ else self.checkpoint_key()[0]

    @cached_property
    def _backbone(self):
        self.own_threads()
        b = self.settings.backbone
        return load_or_finetune(b.name, self.train_set, self.test_set, b.recipe, device=self.device, weights=b.weights,
                                backbone_kwargs=dict(b.kwargs) or None, progress=self.progress)

    model = property(lambda self: self._backbone[0], doc="The fine-tuned, frozen backbone (eval mode).")
    meta = property(lambda self: self._backbone[1], doc="Checkpoint metadata (``checkpoint_id``, accuracies, ...).")

    @property
    def grid(self) -> tuple[int, int]:
        """The backbone's patch grid ``(rows, cols)``; ``N = rows·cols`` patch tokens."""
        return grid_size(self.model)

    def batch(self, n: int = 4, split: str = "test", indices: list[int] | None = None):
        """A :class:`midas_nb.data.Batch` of the split's ``indices`` (default ``n`` spread evenly over it)."""
        ds = self.train_set if split == "train" else self.test_set
        if indices is None:
            n = max(1, min(int(n), len(ds)))
            indices = [round(i * (len(ds) - 1) / max(1, n - 1)) for i in range(n)] if n > 1 else [0]
        return collate_samples([ds[int(i)] for i in indices])

    def summary(self) -> pd.DataFrame:
        """The study at a glance (data, backbone, patch grid, accuracies): index ``setting``, column ``value``."""
        m, ds = self.meta, self.test_set
        rows = [("profile", self.settings.profile), ("dataset", self.dataset_name),
                ("data root", str(self.data_root)), ("classes", ds.num_classes),
                ("classes present (test)", ds.num_classes_present),
                ("train images", len(self.train_set)), ("test images", len(ds)),
                ("part keypoints", ", ".join(ds.part_names) if ds.has_parts else "none (box coverage)"),
                ("backbone", self.settings.backbone.name), ("checkpoint", m.get("checkpoint_id")),
                ("image size (px)", self.settings.data.image_size),
                ("patch grid", "{}x{} = {} patch tokens".format(*self.grid, self.grid[0] * self.grid[1])),
                ("blocks", len(self.model.blocks)), ("embedding width", self.model.embed_dim),
                ("fine-tuning epochs", m.get("epochs")), ("train accuracy", format_ci(m.get("train_accuracy"))),
                ("test accuracy", format_ci(m.get("test_accuracy"))),
                # a distilled student: its teacher's and each head's (00 says why the student can pass its teacher)
                *((f"test accuracy, {what}", format_ci(d[k])) for d in [m.get("distillation") or {}] for what, k in (
                    ("teacher (frozen ImageNet stages + linear probe)", "teacher_test_accuracy"),
                    ("class-token head (learns the labels)", "student_test_accuracy_cls"),
                    ("distillation head (learns the teacher's scores)", "student_test_accuracy_dist")) if k in d),
                ("chance accuracy", format_ci(ds.chance_accuracy)), ("device", str(self.device))]
        return pd.DataFrame(rows, columns=["setting", "value"]).set_index("setting")

    def target_maps(self, split: str = "test", depth: int | None = None,
                    ids: list[str] | None = None) -> dict[str, torch.Tensor]:
        """Target maps ``{id: [M, N]}`` over the split's images (cached on disk)."""
        depth = self.settings.point.depth if depth is None else int(depth)
        ids = list(self.settings.protocol.targets if ids is None else ids)
        ds = self.train_set if split == "train" else self.test_set
        rule = "label" if split == "train" else "prediction"
        key = dict(dataset=self.dataset_name, split=split, checkpoint=self.meta["checkpoint_id"],
                   depth=depth, class_rule=rule)
        return target_cache(self.model, ds, ids=ids, depth=depth, class_rule=rule, key=key,
                            device=self.device, progress=self.progress)

    def target_coverage(self, budget: float | None = None, ids: list[str] | None = None) -> pd.DataFrame:
        """:func:`~midas_nb.analysis.target_maps.target_coverage` of the test split at ``budget`` (default: own)."""
        b = float(self.settings.point.budget if budget is None else budget)
        return target_coverage(self.target_maps(ids=ids), self.test_set, b, n_boot=self.settings.statistics.bootstrap)

    def iou_ceiling(self, budgets: list[float] | None = None) -> pd.DataFrame:
        """:func:`~midas_nb.analysis.target_maps.iou_ceiling_table` on the evaluated images (default: every budget)."""
        s = self.settings
        budgets = sorted({float(b) for b in s.sweep.budgets} | {float(s.point.budget)}) if budgets is None else budgets
        return iou_ceiling_table(self.test_set, budgets, max_images=s.protocol.max_eval_images,
                                 subset_seed=s.protocol.eval_subset_seed)

    def insertion_deletion(self, ids: list[str] | None = None, n: int = 16) -> dict:
        """:func:`midas_nb.analysis.target_maps.target_insdel` of ``ids`` (default T0, T5) on :meth:`batch` ``(n)``."""
        return target_insdel(self.model, self.batch(n), self.target_maps(ids=list(ids or ["T0", "T5"])),
                             steps=self.settings.protocol.idauc_steps, device=self.device)

    def point_in_box(self, ids: list[str] | None = None, n: int | None = None) -> pd.DataFrame:
        """:func:`midas_nb.analysis.target_maps.target_pib_table` on ``n`` test images (default ``max_eval_images``)."""
        pr, maps = self.settings.protocol, self.target_maps(ids=ids)
        return target_pib_table(self.model, self.test_set, maps, max_images=pr.max_eval_images if n is None else n,
                                subset_seed=pr.eval_subset_seed, device=self.device,
                                n_boot=self.settings.statistics.bootstrap)
