"""Block-``L`` states of a split, computed once and cached on disk (:func:`block_cache`).

A scorer step (and a LaSt fine-tune step) then runs only the scorer and the blocks after
``L`` on the cached states.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader
from ..progress import tqdm

from ..config import cache_dir as default_cache_dir
from ..data import collate_samples
from ..identity import dataset_identity, hash_json, load_or_build, load_torch_payload, state_dict_digest, torch_payload
from ..pruning import check_depth, record_attention
from ..scorers import cls_attention
from ..backbones.vit import classify_tokens, embed_tokens, frozen, num_prefix_tokens, run_blocks

__all__ = ["BlockCache", "block_cache", "block_caches", "key_hash"]


def key_hash(key: dict[str, Any]) -> str:
    """Stable 16-hex-digit hash of a JSON-able key dict (:func:`midas_nb.identity.hash_json`)."""
    return hash_json(key)


@dataclass
class BlockCache:
    """Block-``L`` outputs and full-model outputs of a dataset, in dataset order (CPU tensors).

    Attributes:
        hidden: ``[n,P+N,D]`` output of block ``L`` (``dtype`` of the cache).
        cls_attn: ``[n,N]`` CLS attention of block ``L``, ``E_h A_h[cls,j]`` (T0; the reference
            scores).
        logits: ``[n,C]`` logits of the full (unpruned) model (``[n,0]`` when not computed).
        labels: ``[n]`` long.
        part_mask: ``[n,N]`` bool.
        box_mask: ``[n,N]`` bool.
        indices: ``[n]`` long, ``Sample.index`` of each row.
        depth: ``L``.
        num_prefix: ``P``.
        image_ids: ``Sample.image_id`` of each row (the ids per-image results are stored with).
        data_id: content identity of the dataset the rows come from (``""`` when not cached):
            :attr:`~midas_nb.identity.DatasetIdentity.full` with masks, ``model_inputs``
            without; scorer caches key on it.
    """

    hidden: Tensor
    cls_attn: Tensor
    logits: Tensor
    labels: Tensor
    part_mask: Tensor
    box_mask: Tensor
    indices: Tensor
    depth: int
    num_prefix: int
    image_ids: list[str] = field(default_factory=list)
    data_id: str = ""

    def __len__(self) -> int:
        return int(self.hidden.shape[0])


@torch.no_grad()
def _compute_block_caches(backbone, dataset, depths, batch_size, device, progress, dtype,
                          full_logits, masks: bool = True) -> dict[int, BlockCache]:
    """The :class:`BlockCache` of each depth in ``depths`` from one pass over ``dataset`` (docs/decisions/0069):
    every block runs fused; block ``L`` runs once more unfused on the same input to record its attention, and
    its output there is the cached state (as a pass for ``L`` alone computes it); the full logits come from
    the fused chain, the same for every ``L``."""
    P = num_prefix_tokens(backbone)
    depths = sorted(set(depths))
    out: dict[int, dict[str, list]] = {L: {k: [] for k in ("hidden", "cls_attn")} for L in depths}
    shared: dict[str, list] = {k: [] for k in ("logits", "labels", "part_mask", "box_mask", "indices")}
    ids: list[str] = []
    for batch in tqdm(DataLoader(dataset, batch_size=batch_size, shuffle=False, collate_fn=collate_samples),
                      desc=f"block-{depths} cache", disable=not progress, leave=False):
        x, done = embed_tokens(backbone, batch.images.to(device)), 0
        for L in depths:
            x = run_blocks(backbone, x, done, L - 1)
            with record_attention(backbone.blocks[L - 1]) as rec:
                h = backbone.blocks[L - 1](x)
            out[L]["hidden"].append(h.to("cpu", dtype))
            out[L]["cls_attn"].append(cls_attention(rec["attn"], P).float().cpu())
            done = L - 1
        logits = (classify_tokens(backbone, run_blocks(backbone, x, done, None)) if full_logits
                  else x.new_zeros(x.shape[0], 0))
        shared["logits"].append(logits.float().cpu())
        shared["labels"].append(batch.labels.long().cpu())
        # masks=False: training never reads them; not stored, so the cache needs no annotations
        for k in ("part_mask", "box_mask"):
            shared[k].append(getattr(batch, k).bool().cpu() if masks else torch.zeros(x.shape[0], 0, dtype=torch.bool))
        shared["indices"].append(batch.indices.long().cpu())
        ids.extend(str(i) for i in batch.image_ids)
    common = {k: torch.cat(v) for k, v in shared.items()}
    return {L: BlockCache(**{k: torch.cat(v) for k, v in out[L].items()}, **common, depth=L, num_prefix=P,
                          image_ids=list(ids)) for L in depths}


def block_cache(backbone: nn.Module, dataset, *, depth: int, key: dict[str, Any] | None,
                cache_dir: str | Path | None = None, batch_size: int = 32, device: str | torch.device = "cpu",
                progress: bool = True, dtype: torch.dtype = torch.float32, full_logits: bool = True,
                masks: bool = True) -> BlockCache:
    """Block-``L`` hidden states (+ T0, full logits, labels, masks) of ``dataset``, cached on disk.

    The backbone runs frozen in eval mode. Use a dataset with a deterministic transform: each
    image is computed once.

    Args:
        backbone: timm ViT on ``device``.
        dataset: map-style dataset of :class:`midas_nb.data.Sample`.
        depth: ``L``.
        key: what identifies the cache entry besides depth, size and dtype, e.g.
            ``{"checkpoint_id": ..., "dataset": "cub", "split": "train"}``; ``None`` disables
            the disk cache.
        cache_dir: root of the cache. Default: ``midas_nb.config.cache_dir()``; entries live
            under ``<cache_dir>/blocks/<hash>.pt``.
        batch_size: images per forward.
        device: where the backbone runs.
        progress: show a tqdm bar.
        dtype: storage dtype of ``hidden``. Default: float32.
        full_logits: also run blocks ``L+1..n`` on all tokens for the full model's logits
            (``False``: ``logits`` is ``[n,0]``, about half the cost; enough for training).
        masks: store the part and box masks (``False``: ``[n,0]``; training never reads them,
            and the cache then keys on the images, labels and transform only, so editing a
            keypoint of a training image does not invalidate it).

    The disk entry is keyed by ``key`` + depth, size, dtype, the two flags and the dataset's
    content (:func:`midas_nb.identity.dataset_identity`: ``full`` with masks,
    ``model_inputs`` without) and the backbone's weights digest, and stored as a verified cache file: a truncated or corrupt file
    is reported (:class:`midas_nb.identity.CacheIntegrityWarning`) and recomputed.

    Returns:
        :class:`BlockCache` with rows in dataset order.
    """
    return block_caches(backbone, dataset, depths=[depth], key=key, cache_dir=cache_dir, batch_size=batch_size,
                        device=device, progress=progress, dtype=dtype, full_logits=full_logits, masks=masks)[depth]


def block_caches(backbone: nn.Module, dataset, *, depths, key: dict[str, Any] | None,
                 cache_dir: str | Path | None = None, batch_size: int = 32, device: str | torch.device = "cpu",
                 progress: bool = True, dtype: torch.dtype = torch.float32, full_logits: bool = True,
                 masks: bool = True) -> dict[int, BlockCache]:
    """:func:`block_cache` of each depth ``L`` in ``depths`` (``{L: cache}``; one entry per depth on disk, as
    :func:`block_cache` keys it): the depths not cached come from one pass over ``dataset``, its images
    decoded and its blocks run once (docs/decisions/0069)."""
    depths = [check_depth(backbone, L) for L in dict.fromkeys(depths)]
    computed: dict[int, BlockCache] = {}

    def build(todo: list[int]) -> dict[int, BlockCache]:
        if missing := [M for M in todo if M not in computed]:
            with frozen(backbone):
                computed.update(_compute_block_caches(backbone, dataset, missing, batch_size, device, progress,
                                                      dtype, full_logits, masks))
        return computed

    if key is None:
        return build(depths)
    ident = dataset_identity(dataset)
    base = dict(key, n=len(dataset), dtype=str(dtype), full_logits=bool(full_logits), masks=bool(masks),
                data=ident.full if masks else ident.model_inputs, weights=state_dict_digest(backbone),
                kind="block_cache", states="fused chain")      # states: decision 0069's pass (older files differ)
    root = default_cache_dir(cache_dir)
    paths = {L: root / "blocks" / f"{key_hash(dict(base, depth=L))}.pt" for L in depths}
    fields = list(BlockCache.__dataclass_fields__)
    out = {}
    for i, L in enumerate(depths):
        if (hit := _LOADED.get(paths[L])) is not None and hit[0] == _file_state(paths[L]):
            out[L] = hit[1]
            continue
        todo = [L] + [M for M in depths[i + 1:] if not paths[M].exists()]

        def build_keyed(L=L, todo=todo) -> BlockCache:
            c = build(todo)[L]
            c.data_id = base["data"]
            return c

        out[L], _ = load_or_build(paths[L], build_keyed, key=dict(base, depth=L), what="block-state cache",
            encode=lambda c: torch_payload({k: getattr(c, k) for k in fields}),
            decode=lambda b: BlockCache(**load_torch_payload(b)),
            validate=lambda c: None if len(c) == len(dataset) else f"{len(c)} rows for {len(dataset)} images")
        _LOADED[paths[L]] = (_file_state(paths[L]), out[L])
        while len(_LOADED) > 2:
            _LOADED.pop(next(iter(_LOADED)))
    return out


#: the block caches last read or built in this process, by file (content-keyed) and its size and
#: time: consecutive protocol runs of one (dataset, backbone, L) — a sweep worker's cells — read
#: each file once; the two most recent (a train and a test split) are kept; a changed file is read again
_LOADED: dict[Path, tuple[tuple[int, int] | None, BlockCache]] = {}


def _file_state(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns
