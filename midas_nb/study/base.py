"""One study = one (profile, dataset, backbone): its data splits, fine-tuned backbone and target maps."""
from __future__ import annotations

import copy
import os
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from ..backbones import backbone_normalization, checkpoint_key, load_or_finetune
from ..data import collate_samples, data_note, DatasetError, evaluation_subset, load_dataset, make_synthetic_cub
from ..progress import progress_enabled
from ..metrics import (bootstrap_ci, box_coverage, insertion_deletion_auc, iou_ceiling, part_miou,
                       point_in_box)
from ..pruning import keep_mask_from_indices, select_top_k
from ..analysis.last import pib_columns, pib_table
from ..targets import LAST_VOTES_K, target_cache
from ..backbones.vit import grid_size, keep_count
from .settings import RunSettings

__all__ = ["StudyBase", "check_layout", "unlabelled_test_message", "TRAIN_SPLIT"]


#: torch's intra-op thread count of this process before any study set it (``torch_threads: None``)
_TORCH_DEFAULT_THREADS = torch.get_num_threads()


def check_layout(dataset: str, root: str | os.PathLike, *, max_images_per_class: int | None = None) -> list[str]:
    """Problems (one line each) of reading ``root`` as ``dataset`` (both splits built, no image decoded;
    Stanford Cars needs test labels); ``[]`` when it has the layout."""
    root = Path(root).expanduser()
    if not root.is_dir():
        return [f"data root {str(root)!r} (dataset {dataset!r}) does not exist or is not a directory"]
    extra = {} if max_images_per_class is None else dict(max_images_per_class=int(max_images_per_class))
    problems, errors = [], {}  # errors: split -> error; one line for a root that no split can read
    for split in (TRAIN_SPLIT.get(dataset, "train"), "test"):
        try:
            ds = load_dataset(dataset, root, split, **extra)
        except (DatasetError, ValueError, OSError) as e:
            errors[split] = str(e)
            continue
        if not getattr(ds, "has_labels", True):
            problems.append(unlabelled_test_message(dataset, root, ds))
    if not errors:
        return problems
    (_, text), *rest = errors.items()
    tail = os.path.commonprefix([m[::-1] for m in errors.values()])[::-1]
    tail = tail[tail.find("; "):] if "; " in tail else ""  # the shared "; expected ..." part
    more = "".join(f"; {split} split: {m[:len(m) - len(tail)]}" for split, m in rest if m != text)
    return [f"data root {str(root)!r} does not have the {dataset} layout ({' and '.join(errors)} "
            f"split{'s' if len(errors) > 1 else ''}): {text[:len(text) - len(tail)] + more + tail}"] + problems


def unlabelled_test_message(dataset: str, root: str | os.PathLike, ds: Any) -> str:
    return (f"data root {str(root)!r} ({dataset}): the test split {ds.annotation_file} has no class field (labels "
            f"-1); the protocol's accuracies and the backbone's test accuracy need the labelled test file "
            f"cars_test_annos_withlabels.mat — put it in {getattr(ds, 'devkit', root)}")


#: the split each dataset's backbone and scorers train on (FGVC-Aircraft's standard protocol: trainval)
TRAIN_SPLIT: dict[str, str] = {"cub": "train", "aircraft": "trainval", "cars": "train"}


def _fraction(v: Any) -> str:
    """``0.417`` for a fraction, ``n/a`` for ``None`` / NaN."""
    try:
        return "n/a" if v is None or v != v else f"{float(v):.3f}"
    except (TypeError, ValueError):
        return str(v)


class StudyBase:
    """Data, backbone and cached pipeline stages for ``profile`` (DESIGN.md §7) with ``overrides``
    (any profile key; ``None`` ignored); ``progress``: bars for the long stages. Raises
    :class:`midas_nb.config.ProfileError`: every problem of the settings (:meth:`RunSettings.build`)."""

    def __init__(self, profile: str = "quick", progress: bool = True, **overrides: Any):
        self._settings = RunSettings.build(profile, **overrides)
        self.progress = progress_enabled(progress)
        d = self.settings.data
        if d.embedded and not (d.root / "images.txt").is_file():  # generated once, deterministic by seed
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
        return (f"Study(profile={s.profile!r}, dataset={self.dataset_name!r}, "
                f"backbone={s.backbone.name!r}, depth={s.point.depth}, budget={s.point.budget}, "
                f"device={str(self.device)!r})")

    # ----------------------------------------------------------------------------- data
    @cached_property
    def normalization(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        return backbone_normalization(self.settings.backbone.name)

    def dataset(self, split: str, train: bool = False):
        """The ``split`` with the backbone's normalisation; ``DatasetError`` for a split without labels."""
        mean, std = self.normalization
        if split == "train":  # the split the backbone and scorers train on (TRAIN_SPLIT)
            split = TRAIN_SPLIT.get(self.loader_name, "train")
        d = self.settings.data
        extra = {} if d.max_images_per_class is None else dict(max_images_per_class=d.max_images_per_class)
        if d.loader == "aircraft":  # the profile's label level (enters the data identity)
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
        """The data line every notebook prints: :func:`midas_nb.data.data_note`'s caveat on the embedded synthetic
        set, else the dataset and its root."""
        return data_note(self.train_set, self.test_set) or f"Data: {self.dataset_name} from {self.data_root}"

    # ------------------------------------------------------------------------- backbone
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

    @property
    def model(self) -> torch.nn.Module:
        """The fine-tuned, frozen backbone (eval mode)."""
        return self._backbone[0]

    @property
    def meta(self) -> dict:
        """Checkpoint metadata (``checkpoint_id``, accuracies, versions, ...)."""
        return self._backbone[1]

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
                ("fine-tuning epochs", m.get("epochs")),
                ("train accuracy", _fraction(m.get("train_accuracy"))),
                ("test accuracy", _fraction(m.get("test_accuracy"))),
                ("chance accuracy", _fraction(ds.chance_accuracy)), ("device", str(self.device))]
        return pd.DataFrame(rows, columns=["setting", "value"]).set_index("setting")

    # -------------------------------------------------------------------------- targets
    def target_maps(self, split: str = "test", depth: int | None = None,
                    ids: list[str] | None = None) -> dict[str, torch.Tensor]:
        """Target maps ``{id: [M, N]}`` over the split's images (cached on disk)."""
        depth = self.settings.point.depth if depth is None else int(depth)
        ids = list(self.settings.protocol.targets if ids is None else ids)
        ds = self.train_set if split == "train" else self.test_set
        rule = "label" if split == "train" else "prediction"
        # no data path: target_cache adds the split's content identity and the weights digest
        key = dict(dataset=self.dataset_name, split=split, checkpoint=self.meta["checkpoint_id"],
                   depth=depth, class_rule=rule)
        return target_cache(self.model, ds, ids=ids, depth=depth, class_rule=rule, key=key,
                            device=self.device, progress=self.progress)

    def target_coverage(self, budget: float | None = None, ids: list[str] | None = None) -> pd.DataFrame:
        """Part mIoU of each target map's own top ``k = ceil(b·N)`` tokens on the test split.

        Columns ``target``, ``miou``, ``miou_lo``, ``miou_hi`` (bootstrap 95 % CI over images),
        ``n_images``, ``n_skipped``, ``coverage_kind``, ``budget``, ``image_ids``, ``miou_per_image``.
        """
        budget = float(self.settings.point.budget if budget is None else budget)
        ds = self.test_set
        ref = torch.stack([ds[i].part_mask if ds.has_parts else ds[i].box_mask for i in range(len(ds))])
        metric = part_miou if ds.has_parts else box_coverage
        rows = []
        for k, v in self.target_maps(ids=ids).items():
            keep = keep_mask_from_indices(select_top_k(v.float(), keep_count(budget, v.shape[1])), v.shape[1])
            r = metric(keep, ref)
            mean, lo, hi = bootstrap_ci(r.per_image, n_boot=self.settings.statistics.bootstrap)
            rows.append(dict(target=k, miou=mean, miou_lo=lo, miou_hi=hi, n_images=r.n_images,
                             n_skipped=r.n_skipped, coverage_kind=r.name, budget=budget,
                             image_ids=list(ds.image_ids), miou_per_image=[float(x) for x in r.per_image]))
        return pd.DataFrame(rows)

    def iou_ceiling(self, budgets: list[float] | None = None) -> pd.DataFrame:
        """The best part mIoU (box coverage) any ranking reaches per budget (default: the sweep's and the
        study's) on the evaluated test images: ``budget``, ``k``, ``ceiling``, ``n_images``, ``coverage_kind``."""
        ds = self.test_set
        pr = self.settings.protocol
        subset = evaluation_subset(len(ds), pr.max_eval_images, pr.eval_subset_seed)
        ref = torch.stack([ds[i].part_mask if ds.has_parts else ds[i].box_mask for i in subset])
        if budgets is None:
            budgets = sorted({float(b) for b in self.settings.sweep.budgets} | {float(self.settings.point.budget)})
        rows = []
        for b in budgets:
            k = keep_count(b, ref.shape[1])
            c = iou_ceiling(ref, k, boxes=not ds.has_parts)     # over the images coverage evaluates
            rows.append(dict(budget=float(b), k=k, ceiling=float(c.nanmean()), n_images=int(c.isfinite().sum()),
                             coverage_kind="part mIoU" if ds.has_parts else "box coverage"))
        return pd.DataFrame(rows)

    def insertion_deletion(self, ids: list[str] | None = None, n: int = 16) -> dict:
        """``{id: InsDel}``: insertion/deletion curves of target rankings on the ``n`` images of :meth:`batch`."""
        ids = list(ids or ["T0", "T5"])
        b = self.batch(n)
        maps = self.target_maps(ids=ids)
        return {k: insertion_deletion_auc(self.model, b.images.to(self.device), maps[k][b.indices].to(self.device),
                                          steps=self.settings.protocol.idauc_steps, device=self.device)
                for k in ids}

    # ----------------------------------------------------------------------- LaSt-ViT
    def point_in_box(self, ids: list[str] | None = None, n: int | None = None) -> pd.DataFrame:
        """Point-in-Box rates (DESIGN.md §6) of the patch score and each target map in ``ids`` on ``n``
        test images (default ``max_eval_images``): ``ranking``, ``pib``, ``pib_lo``, ``pib_hi``,
        ``pib_centre``, ``pib_box_area``, ``n_images``, ``last_K`` (``last_votes`` only)."""
        ds, seed, n_boot = self.test_set, self.settings.protocol.eval_subset_seed, self.settings.statistics.bootstrap
        n = n if n is not None else self.settings.protocol.max_eval_images
        subset = evaluation_subset(len(ds), n, seed)
        pib = pib_table({"patch_score": self.model}, ds, max_images=n, subset_seed=seed, device=self.device,
                        n_boot=n_boot, progress=False)
        cols = ["pib", "pib_lo", "pib_hi", "pib_centre", "pib_box_area"]
        rows = [dict(ranking="patch_score", **{c: pib.at[0, c] for c in cols}, n_images=len(subset))]
        box = torch.stack([ds[i].box_mask for i in subset])
        for k, v in self.target_maps(ids=ids).items():
            hits = point_in_box(v[subset].float(), box)
            rows.append(dict(ranking=k, **pib_columns(hits, box, self.grid, n_boot=n_boot), n_images=len(subset),
                             **({"last_K": LAST_VOTES_K} if k == "last_votes" else {})))
        return pd.DataFrame(rows)
