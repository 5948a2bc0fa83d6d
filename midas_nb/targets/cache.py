"""All targets of a split from one capture pass (:func:`compute_targets`), cached on disk by content
(:func:`target_cache`)."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal, Sequence

import torch
from safetensors.torch import load as load_bytes
from safetensors.torch import save as save_bytes
from torch import Tensor, nn
from ..progress import tqdm

from ..capture import capture
from ..config import cache_dir as default_cache_dir
from ..data import collate_samples
from ..identity import (CacheIntegrityError, atomic_write_bytes, atomic_write_text, dataset_identity, hash_json,
                        report_corrupt, state_dict_digest, tensor_digest)
from ..backbones.vit import grid_size, num_prefix_tokens
from .registry import DEFAULT_RANDOM_SEED, get_target, list_targets
from .rules import LAST_STATISTIC


def _check_ids(ids: Sequence[str]) -> list[str]:
    ids, known = list(ids), set(list_targets())
    unknown = [i for i in ids if i not in known]
    if unknown or not ids:
        raise ValueError(f"unknown or no target ids {unknown or ids}; expected some of {list_targets()}")
    return list(dict.fromkeys(ids))


def _capture_and_compute(backbone: nn.Module, images: Tensor | None, wanted: dict[int, list[str]],
                         class_index: Tensor | None, labels: Tensor | None, tokens: Tensor | None,
                         indices: Tensor | None, seed: int | None) -> dict[int, dict[str, Tensor]]:
    """``{L: {id: map}}`` of the ids ``wanted`` at each depth ``L``, from one capture (the loss gradient
    reaches only the depths that want T2; the same values as one capture per depth)."""
    n_blocks = len(backbone.blocks)
    for depth in wanted:
        if not (1 <= int(depth) <= n_blocks):
            raise ValueError(f"depth L must be in 1..{n_blocks} (1-based block of the backbone), got {depth!r}")
    loss_blocks = [int(L) - 1 for L, ids in wanted.items() if "T2" in ids]
    if loss_blocks:
        if labels is None:
            raise ValueError("T2 needs labels [B] (ground truth) for the cross-entropy loss")
        if bool((torch.as_tensor(labels) < 0).any()):
            raise ValueError("T2 needs ground-truth labels ≥ 0; this split has unlabelled images (-1)")
    cap = capture(backbone, images, class_index, labels if loss_blocks else None, tokens=tokens,
                  loss_blocks=loss_blocks or None, prob_grad=any("tokentm" in ids for ids in wanted.values()))
    if indices is not None:
        cap.extras["indices"] = torch.as_tensor(indices).reshape(-1).cpu()
    if seed is not None:
        cap.extras["seed"] = int(seed)
    cap.extras["final_norm"] = backbone.norm          # last_votes reads x = norm(h_L) (LaSt-ViT)
    return {L: {i: get_target(i)(cap, L, cap.class_index) for i in ids} for L, ids in wanted.items()}


def compute_targets(backbone: nn.Module, images: Tensor | None, ids: Sequence[str], depth: int, class_index: Tensor,
                    labels: Tensor | None = None, *, tokens: Tensor | None = None, indices: Tensor | None = None,
                    seed: int | None = None) -> dict[str, Tensor]:
    """Targets ``ids`` of a batch from **one** forward and its backward passes.

    One :func:`midas_nb.capture.capture` call: the logit gradient ``∂y_c/∂·``, only when
    ``"tokentm"`` is requested the probability gradient ``∂p_c/∂A``, and only when ``"T2"`` is
    requested the loss gradient ``∂ℓ/∂·`` come from ``autograd.grad`` calls on the same graph;
    the loss backward stops at block ``L`` (``loss_blocks=[L-1]``).

    Args:
        backbone: timm ViT (eval mode is used; fused attention is switched off in place).
        images: ``[B,3,H,W]`` normalised images (or ``None`` with ``tokens``).
        ids: target ids from :func:`list_targets`.
        depth: 1-based depth ``L``, ``1 ≤ L ≤ len(backbone.blocks)``.
        class_index: ``[B]`` long, the class ``c`` (ground truth on the train split, the
            prediction otherwise; DESIGN.md §3). Required, no default rule here.
        labels: ``[B]`` long ground-truth labels; required for ``"T2"``, unused otherwise.
        tokens: ``[B,T,D]`` embedded tokens instead of ``images`` (see ``capture``).
        indices: ``[B]`` dataset indices of the images (seed the ``random`` target per image).
        seed: seed of the ``random`` target (default :data:`DEFAULT_RANDOM_SEED`).

    Returns:
        ``{id: [B,N] float32}`` on the backbone's device, patch tokens only, row-major.

    Raises:
        ValueError: unknown ids, ``depth`` out of range, ``class_index`` missing, or ``"T2"``
            without labels.
    """
    ids = _check_ids(ids)
    if class_index is None:
        raise ValueError("class_index [B] is required (ground truth on the train split, prediction otherwise)")
    return _capture_and_compute(backbone, images, {depth: ids}, class_index, labels, tokens, indices, seed)[depth]


# ------------------------------------------------------------------------ disk cache

#: version of the registered targets' definitions, part of every target cache key: bump it
#: whenever a target's values change, so that maps cached under the old definition are not reused.
#: 2: TokenTM per the paper's code (Ẽ = attn.proj(v_j), E = residual stream, ∂p_c/∂A).
TARGET_DEFINITIONS_VERSION = 2


def _cache_key(key: dict, depth: int, class_rule: str, backbone: nn.Module, seed: int) -> dict:
    return dict(key, depth=int(depth), class_rule=class_rule, grid_size=list(grid_size(backbone)),
                num_prefix_tokens=num_prefix_tokens(backbone), random_seed=int(seed), format=1,
                last_statistic=LAST_STATISTIC, target_definitions=TARGET_DEFINITIONS_VERSION)


def target_cache_path(full_key: dict, cache_dir: str | os.PathLike | None = None) -> Path:
    """``<cache_dir>/targets/targets-<sha256(key JSON)[:16]>.safetensors`` for a full cache key."""
    return default_cache_dir(cache_dir) / "targets" / f"targets-{hash_json(full_key)}.safetensors"


def _maps_digest(maps: dict[str, Tensor]) -> str:
    """SHA-256 over the maps (sorted ids; dtype, shape, bytes): the target cache's integrity record."""
    return hash_json({k: tensor_digest(maps[k], None) for k in sorted(maps)}, 64)


def _read_verified_maps(path: Path, key_text: str, load_bytes) -> dict[str, Tensor]:
    """The maps of a target cache file after checking its key and its digest.

    Raises:
        CacheIntegrityError: unreadable (truncated) file, another key, or a digest mismatch.
    """
    data = path.read_bytes()
    try:
        maps = load_bytes(data)
        header_len = int.from_bytes(data[:8], "little")
        meta = json.loads(data[8:8 + header_len]).get("__metadata__", {}) or {}
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error types
        raise CacheIntegrityError(f"unreadable safetensors file ({type(e).__name__}: {e})") from None
    if meta.get("key") != key_text:
        raise CacheIntegrityError(f"holds key {meta.get('key')!r}, expected {key_text!r}")
    if meta.get("sha256") != _maps_digest(maps):
        raise CacheIntegrityError("the maps' SHA-256 differs from the one recorded when the file was written")
    return maps


def target_cache(backbone: nn.Module, dataset: torch.utils.data.Dataset, *, ids: Sequence[str], depth: int,
                 class_rule: Literal["label", "prediction"], key: dict[str, Any],
                 cache_dir: str | os.PathLike | None = None, batch_size: int = 32, device: torch.device | str = "cpu",
                 progress: bool = True, seed: int | None = None) -> dict[str, Tensor]:
    """Target maps of a whole dataset split, computed once and stored on disk.

    The file is one safetensors file per cache key: ``key`` (the caller's dataset name, split,
    backbone checkpoint id, …) plus the dataset's content identity
    (:attr:`midas_nb.identity.DatasetIdentity.model_inputs`: images, labels, transform — target
    maps do not read the part keypoints), the backbone's weights digest, ``depth``,
    ``class_rule``, the backbone's patch grid and prefix count, the ``random`` seed, the LaSt
    statistic's version (:data:`~midas_nb.targets.LAST_STATISTIC`) and the version of the
    target definitions (:data:`TARGET_DEFINITIONS_VERSION`), hashed
    into the file name (:func:`target_cache_path`); the key JSON is stored beside it (``.json``)
    and in the file's metadata with the SHA-256 of the maps. The file holds one
    ``[len(dataset), N]`` tensor per target id, in dataset order. An existing file is loaded
    after its key and digest are checked (a truncated or corrupt file is reported with
    :class:`midas_nb.identity.CacheIntegrityWarning` and recomputed); ids missing from it are
    computed (one pass over the dataset for all missing ids together) and added to the file
    (atomic rewrite) — stored maps are never recomputed.

    Args:
        backbone: timm ViT; moved to ``device``.
        dataset: ``Dataset`` of :class:`midas_nb.data.Sample` (batched with
            ``collate_samples``); iterated in order, without shuffling.
        ids: target ids from :func:`list_targets`.
        depth: 1-based depth ``L``.
        class_rule: ``"label"`` — ``c`` is the ground-truth label (train split);
            ``"prediction"`` — ``c`` is the backbone's argmax, from the same forward.
        key: JSON-serialisable description of dataset, split and backbone checkpoint.
        cache_dir: root of the cache (default :func:`midas_nb.config.cache_dir`).
        batch_size: images per forward.
        device: where the backbone runs (``"cpu"``, ``"cuda"``…). Maps are stored on CPU.
        progress: show a tqdm bar while filling.
        seed: seed of the ``random`` target (default :data:`DEFAULT_RANDOM_SEED`); the image's
            dataset index (``Sample.index``) seeds it per image.

    Returns:
        ``{id: [len(dataset), N] float32}`` on CPU.

    Raises:
        ValueError: bad ``class_rule``, unknown ids, missing labels for ``"label"``/``"T2"``.
    """
    return target_caches(backbone, dataset, ids_by_depth={depth: ids}, class_rule=class_rule, key=key,
                         cache_dir=cache_dir, batch_size=batch_size, device=device, progress=progress, seed=seed)[depth]


def target_caches(backbone: nn.Module, dataset: torch.utils.data.Dataset, *, ids_by_depth: dict[int, Sequence[str]],
                  class_rule: Literal["label", "prediction"], key: dict[str, Any],
                  cache_dir: str | os.PathLike | None = None, batch_size: int = 32, device: torch.device | str = "cpu",
                  progress: bool = True, seed: int | None = None) -> dict[int, dict[str, Tensor]]:
    """:func:`target_cache` at several depths, ``{L: {id: [len(dataset), N]}}`` for ``ids_by_depth``
    ``{L: ids}``: one file per depth as :func:`target_cache` keys it; the maps missing at any depth come
    from one pass over ``dataset`` (one capture per batch for every depth; docs/decisions/0069). Arguments
    and errors as :func:`target_cache`."""
    wanted = {L: _check_ids(ids) for L, ids in ids_by_depth.items()}
    if class_rule not in ("label", "prediction"):
        raise ValueError(f"class_rule must be 'label' or 'prediction', got {class_rule!r}")
    seed = DEFAULT_RANDOM_SEED if seed is None else int(seed)
    data_key = dict(key, data=dataset_identity(dataset).model_inputs, weights=state_dict_digest(backbone))
    full_keys = {L: _cache_key(data_key, L, class_rule, backbone, seed) for L in wanted}
    stored = {L: _read_stored(target_cache_path(k, cache_dir), k, len(dataset)) for L, k in full_keys.items()}
    missing = {L: m for L, ids in wanted.items() if (m := [i for i in ids if i not in stored[L]])}
    if missing:
        loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=False, collate_fn=collate_samples)
        backbone.to(device)
        new: dict[int, dict[str, list[Tensor]]] = {L: {i: [] for i in ids} for L, ids in missing.items()}
        for batch in tqdm(loader, desc=f"targets L={sorted(missing)}", disable=not progress):
            images, labels = batch.images.to(device), batch.labels.to(device)
            if class_rule == "label" and bool((labels < 0).any()):
                raise ValueError("class_rule='label' needs ground-truth labels ≥ 0; "
                                 "use class_rule='prediction' on unlabelled splits")
            # None: capture() takes the argmax of the same forward
            class_index = labels if class_rule == "label" else None
            maps = _capture_and_compute(backbone, images, missing, class_index, labels, None, batch.indices, seed)
            for L, ids in missing.items():
                for i in ids:
                    new[L][i].append(maps[L][i].detach().float().cpu())
        for L in missing:
            stored[L].update({i: torch.cat(v).contiguous() for i, v in new[L].items()})
            _write_stored(target_cache_path(full_keys[L], cache_dir), full_keys[L], stored[L])
    return {L: {i: stored[L][i] for i in ids} for L, ids in wanted.items()}


def _read_stored(path: Path, full_key: dict, n: int) -> dict[str, Tensor]:
    """The verified maps of a target cache file (``{}``: none, or a corrupt one, reported)."""
    if not path.exists():
        return {}
    try:
        stored = _read_verified_maps(path, json.dumps(full_key, sort_keys=True, default=str), load_bytes)
        for name, t in stored.items():
            if t.shape[0] != n:
                raise CacheIntegrityError(f"{name} has {t.shape[0]} rows, the dataset {n} images")
        return stored
    except (CacheIntegrityError, OSError, ValueError, RuntimeError) as e:
        report_corrupt(path, str(e), "target cache")
        return {}


def _write_stored(path: Path, full_key: dict, stored: dict[str, Tensor]) -> None:
    key_text = json.dumps(full_key, sort_keys=True, default=str)
    atomic_write_bytes(path, save_bytes(stored, metadata={"key": key_text, "sha256": _maps_digest(stored)}))
    atomic_write_text(path.with_suffix(".json"),
                      json.dumps(dict(full_key, ids=sorted(stored)), indent=2, sort_keys=True, default=str))
