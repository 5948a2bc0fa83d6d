"""Scorer training at depth ``L`` and budget ``b`` with the backbone frozen (DESIGN.md §5).

The loss of a trainable scorer (:class:`~midas_nb.scorers.MLPScorer`) is

    ``L = L_cls + λ·L_ga``

- ``L_cls`` — cross-entropy of the *pruned* model's logits on the label. It reaches the
  scorer through a relaxation of the hard top-k selection (``relaxation``):

  * ``"st"`` (default) — hard top-k forward; the kept tokens ``x_j`` (block-``L`` output) are
    multiplied by the straight-through multiplier ``m_j = 1 + s_j − sg(s_j)`` (value 1,
    gradient 1 w.r.t. ``s_j``), so ``∂L_cls/∂s_j = ⟨∂L_cls/∂x_j, x_j⟩`` for kept tokens — an
    input×gradient signal at depth ``L``, i.e. T5-like (DESIGN.md §4) — and **0 for dropped
    tokens**. The forward equals the evaluation forward exactly. Only ``P + k`` tokens run
    through blocks ``L+1..depth``.
  * ``"soft"`` — all ``P + N`` tokens run through blocks ``L+1..depth`` with an additive
    attention bias on the *keys*: ``β_j = log σ((s_j − t) / (τ_m·sd(s)))`` for patch tokens and
    ``0`` for prefix tokens, where ``t`` is the midpoint between the ``k``-th and ``(k+1)``-th
    highest score and ``sd(s)`` the per-image standard deviation of the scores (both
    detached, so ``τ_m`` is in units of the score spread and the mask does not soften or
    sharpen with the scores' scale). ``exp(β_j)`` multiplies the attention every query pays to
    key ``j`` (before renormalisation) — the attention masking of DynamicViT (Rao et al., 2021,
    https://arxiv.org/abs/2106.02034, Eq. 8–9) with a sigmoid gate around the top-k threshold
    instead of Gumbel samples. Every token gets a gradient; evaluation uses the hard top-k.
    Needs CLS pooling (``global_pool="token"``).

- ``L_ga`` — distillation of a cached target map ``T [B,N]`` into the scores (:func:`distill_loss`);
  default ``"kl"``: ``KL(softmax(z(T)/τ) ‖ softmax(s/τ))`` with ``z`` the per-image z-score
  (the attention-guidance loss of MIDAS; the ListNet top-one loss, Cao et al., 2007).

The backbone stays frozen and in eval mode (:func:`frozen`); only scorer parameters train.
Block-``L`` hidden states of a split are computed once and cached (:func:`block_cache`), so a
scorer step runs only the scorer and blocks ``L+1..depth`` on the kept tokens. No flip
augmentation is used (cached states are of the un-augmented images; the scorer has ~D²/2
parameters and a frozen backbone). Trained scorers are cached by key
(:func:`load_or_train_scorer`) under ``midas_nb.config.cache_dir()/scorers``.
"""
from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Literal, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from .config import cache_dir as default_cache_dir
from .identity import load_torch_payload, torch_payload
from .pruning import check_depth, record_attention, select_top_k
from .scorers import MLPScorer, TokenScorer, build_scorer, cls_attention
from .vit import classify_tokens, embed_tokens, gather_tokens, keep_count, num_prefix_tokens, run_blocks

__all__ = [
    "Relaxation",
    "DistillForm",
    "BlockCache",
    "TrainResult",
    "zscore",
    "distill_loss",
    "relaxed_logits",
    "frozen",
    "key_hash",
    "block_cache",
    "train_scorer",
    "load_or_train_scorer",
]

Relaxation = Literal["st", "soft"]
DistillForm = Literal["kl", "mse_z", "rank"]


# --------------------------------------------------------------------------------------------
# losses


def zscore(x: Tensor, dim: int = -1, eps: float = 1e-6) -> Tensor:
    """Per-row z-score ``(x − mean) / (std + eps)`` along ``dim`` (population std)."""
    mu = x.mean(dim=dim, keepdim=True)
    sd = x.std(dim=dim, keepdim=True, unbiased=False)
    return (x - mu) / (sd + eps)


def distill_loss(
    scores: Tensor,
    target: Tensor,
    form: DistillForm = "kl",
    temperature: float = 1.0,
) -> Tensor:
    """Attention-guidance loss ``L_ga``: distil a target map into the scores (DESIGN.md §5).

    Args:
        scores: ``[B,N]`` scorer output (differentiable).
        target: ``[B,N]`` target map (no gradient is taken through it).
        form: ``"kl"`` (default) — ``KL(softmax(z(T)/τ) ‖ softmax(s/τ))``, mean over images
            (``F.kl_div(log_softmax(s/τ), softmax(z(T)/τ), reduction="batchmean")``); 0 iff
            ``s = z(T) + c``. ListNet top-one loss (Cao et al., 2007, "Learning to Rank: From
            Pairwise Approach to Listwise Approach", Eq. 4). ``"mse_z"`` — mean squared error
            between the z-scores of ``s`` and ``T``; 0 iff ``s = a·T + c`` with ``a > 0``.
            ``"rank"`` — pairwise logistic (RankNet, Burges et al., 2005):
            mean over pairs with ``T_i > T_j`` of ``softplus(−(s_i − s_j)/τ)``.
        temperature: ``τ > 0``. Default: 1.0.

    Returns:
        scalar loss.

    Raises:
        ValueError: on shape mismatch, unknown form or ``τ ≤ 0``.
    """
    if scores.shape != target.shape or scores.dim() != 2:
        raise ValueError(f"scores and target must both be [B,N]; got {tuple(scores.shape)} "
                         f"and {tuple(target.shape)}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    target = target.detach().to(scores.dtype)
    if form == "kl":
        return F.kl_div(F.log_softmax(scores / temperature, dim=1),
                        F.softmax(zscore(target) / temperature, dim=1), reduction="batchmean")
    if form == "mse_z":
        return F.mse_loss(zscore(scores), zscore(target))
    if form == "rank":
        order = (target[:, :, None] > target[:, None, :]).to(scores.dtype)   # [B,N,N]: T_i > T_j
        margin = (scores[:, :, None] - scores[:, None, :]) / temperature
        return (F.softplus(-margin) * order).sum() / order.sum().clamp_min(1.0)
    raise ValueError(f"unknown distillation form {form!r}; expected 'kl', 'mse_z' or 'rank'")


def relaxed_logits(
    backbone: nn.Module,
    hidden: Tensor,
    scores: Tensor,
    depth: int,
    budget: float,
    relaxation: Relaxation = "st",
    mask_temperature: float = 0.25,
) -> Tensor:
    """Logits of the pruned model with a differentiable path from ``L_cls`` to the scores.

    Args:
        backbone: frozen timm ViT.
        hidden: ``[B,P+N,D]`` output of block ``L``.
        scores: ``[B,N]`` scorer output (requires grad).
        depth: ``L``.
        budget: ``b``; ``k = ceil(b·N)``.
        relaxation: ``"st"`` (hard top-k + straight-through multiplier; gradient
            ``⟨∂L/∂x_j, x_j⟩`` on kept tokens, 0 on dropped) or ``"soft"`` (all tokens, key bias
            ``log σ((s_j − t)/(τ_m·sd(s)))``; gradient on every token). See the module docstring.
        mask_temperature: ``τ_m`` of ``"soft"``, in units of the per-image score std.
            Default: 0.25 (a token one std below the threshold keeps ``e^{-4} ≈ 2%`` of its
            attention).

    Returns:
        ``[B,C]`` logits.

    Raises:
        ValueError: unknown relaxation; ``"soft"`` on a backbone without CLS pooling.
    """
    depth = check_depth(backbone, depth)
    P = num_prefix_tokens(backbone)
    B, T, _ = hidden.shape
    N = T - P
    k = keep_count(budget, N)
    if relaxation == "st":
        keep_idx = select_top_k(scores, k)
        s_kept = scores.gather(1, keep_idx)
        multiplier = 1.0 + s_kept - s_kept.detach()                     # value 1, d/ds = 1
        x = gather_tokens(hidden, keep_idx, P)
        x = torch.cat([x[:, :P], x[:, P:] * multiplier.unsqueeze(-1).to(x.dtype)], dim=1)
        return classify_tokens(backbone, run_blocks(backbone, x, depth, None))
    if relaxation == "soft":
        pool = getattr(backbone, "global_pool", "token")
        if pool != "token":
            raise ValueError(f"relaxation='soft' needs CLS pooling (global_pool='token'); the "
                             f"backbone pools with {pool!r} and would average soft-dropped tokens")
        s_sorted = scores.detach().sort(dim=1, descending=True).values
        spread = scores.detach().std(dim=1, unbiased=False, keepdim=True).clamp_min(1e-6)
        if k < N:
            threshold = 0.5 * (s_sorted[:, k - 1:k] + s_sorted[:, k:k + 1])
        else:   # everything kept: the threshold lies one std below the lowest score
            threshold = s_sorted[:, -1:] - spread
        bias = F.logsigmoid((scores - threshold) / (mask_temperature * spread))
        bias = torch.cat([bias.new_zeros(B, P), bias], dim=1).to(hidden.dtype)
        attn_mask = bias[:, None, None, :]                               # [B,1,1,T] on keys
        x = hidden
        # CUDA's memory-efficient SDPA kernel rejects this broadcast additive mask in the
        # backward pass ("LSE is not correctly aligned" for T not a multiple of 8); the math
        # kernel computes the same softmax(QKᵀ/√d + bias)·V. CPU keeps its default kernel.
        with _math_sdpa(hidden.is_cuda):
            for blk in backbone.blocks[depth:]:
                x = blk(x, attn_mask=attn_mask)
        return classify_tokens(backbone, x)
    raise ValueError(f"unknown relaxation {relaxation!r}; expected 'st' or 'soft'")


@contextmanager
def _math_sdpa(enabled: bool) -> Iterator[None]:
    """Restrict ``F.scaled_dot_product_attention`` to the math kernel when ``enabled``."""
    if not enabled:
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel([SDPBackend.MATH]):
        yield


@contextmanager
def frozen(backbone: nn.Module) -> Iterator[nn.Module]:
    """Eval mode and ``requires_grad=False`` on every parameter; both restored on exit."""
    was_training = backbone.training
    flags = [(p, p.requires_grad) for p in backbone.parameters()]
    backbone.eval()
    for p, _ in flags:
        p.requires_grad_(False)
    try:
        yield backbone
    finally:
        for p, f in flags:
            p.requires_grad_(f)
        backbone.train(was_training)


# --------------------------------------------------------------------------------------------
# block-L cache


def key_hash(key: dict[str, Any]) -> str:
    """Stable 16-hex-digit hash of a JSON-able key dict (:func:`midas_nb.identity.hash_json`)."""
    from .identity import hash_json
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


def _loader(dataset, batch_size: int):
    from torch.utils.data import DataLoader

    from .data import collate_samples
    return DataLoader(dataset, batch_size=batch_size, shuffle=False, collate_fn=collate_samples)


@torch.no_grad()
def _compute_block_cache(backbone, dataset, depth, batch_size, device, progress, dtype,
                         full_logits, masks: bool = True) -> BlockCache:
    P = num_prefix_tokens(backbone)
    out: dict[str, list] = {k: [] for k in ("hidden", "cls_attn", "logits", "labels", "part_mask",
                                            "box_mask", "indices")}
    ids: list[str] = []
    for batch in tqdm(_loader(dataset, batch_size), desc=f"block-{depth} cache", disable=not progress,
                      leave=False):
        x = embed_tokens(backbone, batch.images.to(device))
        x = run_blocks(backbone, x, 0, depth - 1)
        with record_attention(backbone.blocks[depth - 1]) as rec:
            x = backbone.blocks[depth - 1](x)
        if full_logits:
            logits = classify_tokens(backbone, run_blocks(backbone, x, depth, None))
        else:
            logits = x.new_zeros(x.shape[0], 0)
        out["hidden"].append(x.to("cpu", dtype))
        out["cls_attn"].append(cls_attention(rec["attn"], P).float().cpu())
        out["logits"].append(logits.float().cpu())
        out["labels"].append(batch.labels.long().cpu())
        if masks:
            out["part_mask"].append(batch.part_mask.bool().cpu())
            out["box_mask"].append(batch.box_mask.bool().cpu())
        else:       # training never reads them; not stored, so the cache needs no annotations
            out["part_mask"].append(torch.zeros(x.shape[0], 0, dtype=torch.bool))
            out["box_mask"].append(torch.zeros(x.shape[0], 0, dtype=torch.bool))
        out["indices"].append(batch.indices.long().cpu())
        ids.extend(str(i) for i in batch.image_ids)
    cat = {k: torch.cat(v) for k, v in out.items()}
    return BlockCache(**cat, depth=depth, num_prefix=P, image_ids=ids)


def block_cache(
    backbone: nn.Module,
    dataset,
    *,
    depth: int,
    key: dict[str, Any] | None,
    cache_dir: str | Path | None = None,
    batch_size: int = 32,
    device: str | torch.device = "cpu",
    progress: bool = True,
    dtype: torch.dtype = torch.float32,
    full_logits: bool = True,
    masks: bool = True,
) -> BlockCache:
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
        full_logits: also run blocks ``L+1..depth`` on all tokens for the full model's logits
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
    from .identity import dataset_identity, load_or_build, state_dict_digest

    depth = check_depth(backbone, depth)

    def build() -> BlockCache:
        with frozen(backbone):
            return _compute_block_cache(backbone, dataset, depth, batch_size, device, progress, dtype,
                                        full_logits, masks)

    if key is None:
        return build()
    ident = dataset_identity(dataset)
    full_key = dict(key, depth=depth, n=len(dataset), dtype=str(dtype), full_logits=bool(full_logits),
                    masks=bool(masks), data=ident.full if masks else ident.model_inputs,
                    weights=state_dict_digest(backbone), kind="block_cache")
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = root / "blocks" / f"{key_hash(full_key)}.pt"
    fields = list(BlockCache.__dataclass_fields__)
    def build_keyed() -> BlockCache:
        c = build()
        c.data_id = full_key["data"]
        return c

    cache, _ = load_or_build(
        path, build_keyed, key=full_key, what="block-state cache",
        encode=lambda c: torch_payload({k: getattr(c, k) for k in fields}),
        decode=lambda b: BlockCache(**load_torch_payload(b)),
        validate=lambda c: None if len(c) == len(dataset) else f"{len(c)} rows for {len(dataset)} images")
    return cache


# --------------------------------------------------------------------------------------------
# training


@dataclass
class TrainResult:
    """What :func:`train_scorer` returns besides the trained scorer (in place).

    Attributes:
        loss: mean total loss per epoch.
        loss_cls: mean ``L_cls`` per epoch.
        loss_ga: mean ``L_ga`` per epoch (0 for unsupervised training).
        train_accuracy: pruned top-1 accuracy of the (relaxed) training forward per epoch.
        seconds: wall time of the training.
        params: the training settings.
    """

    loss: list[float] = field(default_factory=list)
    loss_cls: list[float] = field(default_factory=list)
    loss_ga: list[float] = field(default_factory=list)
    train_accuracy: list[float] = field(default_factory=list)
    seconds: float = 0.0
    params: dict[str, Any] = field(default_factory=dict)


def train_scorer(
    backbone: nn.Module,
    scorer: TokenScorer,
    cache: BlockCache,
    *,
    depth: int,
    budget: float,
    targets: Tensor | None = None,
    relaxation: Relaxation = "st",
    lam: float = 1.0,
    temperature: float = 1.0,
    distill_form: DistillForm = "kl",
    mask_temperature: float = 0.25,
    epochs: int = 4,
    batch_size: int = 64,
    lr: float = 1e-3,
    weight_decay: float = 0.01,
    seed: int = 0,
    device: str | torch.device = "cpu",
    progress: bool = True,
) -> TrainResult:
    """Train ``scorer`` in place on cached block-``L`` states with ``L = L_cls + λ·L_ga``.

    A scorer whose :meth:`~midas_nb.scorers.TokenScorer.training_loss` returns a loss (Cropr's
    auxiliary head, IA-RED²'s REINFORCE; :mod:`midas_nb.related`) is trained with that loss in
    place of ``L_cls`` (``relaxation`` and ``mask_temperature`` are then unused); ``loss_cls``
    of the result records it.

    The backbone is frozen and in eval mode throughout (its weights are not changed); only
    ``scorer.parameters()`` are optimised (AdamW, cosine decay of the learning rate per step).
    ``seed`` fixes the batch order (the scorer's initialisation is the caller's; see
    :func:`load_or_train_scorer`).

    Args:
        backbone: timm ViT on ``device``.
        scorer: trainable scorer on ``device`` (``scorer.trainable``).
        cache: :class:`BlockCache` of the training split at depth ``L``.
        depth: ``L``; must equal ``cache.depth``.
        budget: ``b``.
        targets: ``[n,N]`` supervision target, rows aligned with ``cache`` (dataset order), or
            ``None`` for the unsupervised condition (``L_cls`` only).
        relaxation: ``"st"`` (default) or ``"soft"`` (see :func:`relaxed_logits`).
        lam: ``λ``, weight of ``L_ga``. Default: 1.0.
        temperature: ``τ`` of :func:`distill_loss`. Default: 1.0.
        distill_form: ``"kl"`` (default), ``"mse_z"`` or ``"rank"``.
        mask_temperature: ``τ_m`` of the ``"soft"`` relaxation. Default: 0.25.
        epochs, batch_size, lr, weight_decay: optimisation settings.
        seed: seed of the batch order.
        device: where the steps run.
        progress: show a tqdm bar.

    Returns:
        :class:`TrainResult`.

    Raises:
        ValueError: on a depth that differs from the cache's, targets of the wrong shape or a
            scorer without parameters.
    """
    depth = check_depth(backbone, depth)
    if cache.depth != depth:
        raise ValueError(f"cache holds block-{cache.depth} states but depth={depth} was asked")
    params = [p for p in scorer.parameters() if p.requires_grad]
    if not params:
        raise ValueError(f"{type(scorer).__name__} has no trainable parameters")
    n = len(cache)
    N = cache.hidden.shape[1] - cache.num_prefix
    if targets is not None and tuple(targets.shape) != (n, N):
        raise ValueError(f"targets must be [n,N]=({n},{N}) aligned with the cache, got "
                         f"{tuple(targets.shape)}")
    settings = dict(depth=depth, budget=float(budget), relaxation=relaxation, lam=float(lam),
                    temperature=float(temperature), distill_form=distill_form,
                    mask_temperature=float(mask_temperature), epochs=int(epochs),
                    batch_size=int(batch_size), lr=float(lr), weight_decay=float(weight_decay),
                    seed=int(seed), supervised=targets is not None)
    result = TrainResult(params=settings)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    steps_per_epoch = math.ceil(n / batch_size)
    total = max(1, epochs * steps_per_epoch)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 0.5 * (1 + math.cos(math.pi * min(i, total) / total)))
    gen = torch.Generator().manual_seed(int(seed))
    t0 = time.perf_counter()
    scorer.train()
    with frozen(backbone), tqdm(total=total, desc="train scorer", disable=not progress, leave=False) as bar:
        for _ in range(epochs):
            sums = torch.zeros(4, dtype=torch.float64)
            for idx in torch.randperm(n, generator=gen).split(batch_size):
                hidden = cache.hidden[idx].to(device, torch.float32)
                labels = cache.labels[idx].to(device)
                hook = getattr(scorer, "training_loss", None)
                own = None if hook is None else hook(backbone, hidden, labels, depth=depth,
                                                     budget=budget, num_prefix=cache.num_prefix)
                if own is None:
                    scores = scorer(hidden, cache.num_prefix)
                    logits = relaxed_logits(backbone, hidden, scores, depth, budget, relaxation, mask_temperature)
                    loss_cls = F.cross_entropy(logits, labels)
                else:       # a family with its own objective (TokenScorer.training_loss)
                    loss_cls, logits, scores = own
                loss_ga = (distill_loss(scores, targets[idx].to(device), distill_form, temperature)
                           if targets is not None else scores.new_zeros(()))
                loss = loss_cls + lam * loss_ga
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                sched.step()
                b = len(idx)
                sums += torch.tensor([loss.item() * b, loss_cls.item() * b, loss_ga.item() * b,
                                      (logits.argmax(-1) == labels).sum().item()], dtype=torch.float64)
                bar.update(1)
                bar.set_postfix(loss=f"{loss.item():.3f}")
            result.loss.append(float(sums[0] / n))
            result.loss_cls.append(float(sums[1] / n))
            result.loss_ga.append(float(sums[2] / n))
            result.train_accuracy.append(float(sums[3] / n))
    scorer.eval()
    result.seconds = time.perf_counter() - t0
    return result


def load_or_train_scorer(
    backbone: nn.Module,
    cache: BlockCache,
    *,
    key: dict[str, Any],
    depth: int,
    budget: float,
    targets: Tensor | None = None,
    seed: int = 0,
    mlp_hidden: int | None = None,
    cache_dir: str | Path | None = None,
    device: str | torch.device = "cpu",
    progress: bool = True,
    scorer: str = "mlp",
    scorer_kwargs: dict[str, Any] | None = None,
    **train_kwargs,
) -> tuple[TokenScorer, TrainResult, bool]:
    """A scorer (default: an :class:`MLPScorer`) trained by :func:`train_scorer`, cached by key.

    The scorer is initialised under ``torch.manual_seed(seed)`` (the global RNG state is
    restored afterwards) and trained with batch-order seed ``seed``.

    Args:
        backbone, cache, depth, budget, targets, seed, device, progress: as in
            :func:`train_scorer`.
        key: identifies the entry together with every training setting, e.g.
            ``{"condition": "T5", "target": "T5", "checkpoint_id": ..., "dataset": "cub"}``.
        mlp_hidden: hidden width of the MLP (default ``D // 2``; ``scorer="mlp"`` only).
        scorer: registered scorer family (:func:`midas_nb.scorers.build_scorer`); ``"mlp"``
            (default) or a family with its own objective such as ``"cropr"``/``"iared"``.
        scorer_kwargs: keyword arguments of that family's factory (part of the key).
        cache_dir: cache root (default ``midas_nb.config.cache_dir()``); entries live under
            ``<cache_dir>/scorers/<hash>.pt``, verified cache files
            (:func:`midas_nb.identity.load_or_build`) keyed by ``key``, every training setting,
            the training cache's content identity (``cache.data_id``), the backbone's weights
            digest and the SHA-256 of the target maps, so a scorer is never reused for other data or other targets.
        **train_kwargs: the other keyword arguments of :func:`train_scorer`.

    Returns:
        ``(scorer on device in eval mode, TrainResult, loaded_from_cache)``.
    """
    from .identity import load_or_build, state_dict_digest, tensor_digest

    dim = cache.hidden.shape[-1]
    family = str(scorer)
    extra_key = {} if family == "mlp" else dict(scorer_kwargs=dict(scorer_kwargs or {}))
    full_key = dict(key, depth=int(depth), budget=float(budget), seed=int(seed), mlp_hidden=mlp_hidden,
                    dim=int(dim), n_train=len(cache), supervised=targets is not None,
                    train_data=cache.data_id or None, weights=state_dict_digest(backbone),
                    targets_digest=None if targets is None else tensor_digest(targets),
                    kind=f"{family}_scorer", **extra_key,
                    **{k: (float(v) if isinstance(v, (int, float)) and not
                           isinstance(v, bool) else v) for k, v in train_kwargs.items()})
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = root / "scorers" / f"{key_hash(full_key)}.pt"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        if family == "mlp":
            model = MLPScorer(dim, hidden=mlp_hidden)
        else:
            model = build_scorer(family, dim, **dict(scorer_kwargs or {}))
    model.to(device)

    def build() -> dict[str, Any]:
        result = train_scorer(backbone, model, cache, depth=depth, budget=budget, targets=targets,
                              seed=seed, device=device, progress=progress, **train_kwargs)
        return {"state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
                "result": result.__dict__, "key": full_key}

    blob, loaded = load_or_build(path, build, key=full_key, what="scorer cache")
    if loaded:
        model.load_state_dict(blob["state_dict"])
        model.eval()
    return model, TrainResult(**blob["result"]), loaded
