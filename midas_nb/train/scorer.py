"""Scorer training: ``L = L_cls + λ·L_ga`` at depth ``L`` and budget ``b`` (see
:mod:`midas_nb.train` for the definitions and their sources)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import cache_dir as default_cache_dir
from ..identity import load_or_build, state_dict_digest, tensor_digest
from ..pruning import check_depth, select_top_k
from ..scorers import MLPScorer, TokenScorer, build_scorer
from ..backbones.vit import classify_tokens, frozen, gather_tokens, keep_count, math_sdpa, num_prefix_tokens, run_blocks
from .cache import BlockCache, key_hash
from .loop import optimise_on_cache

__all__ = ["Relaxation", "DistillForm", "TrainResult", "zscore", "distill_loss", "relaxed_logits",
           "train_scorer", "load_or_train_scorer"]

Relaxation = Literal["st", "soft"]
DistillForm = Literal["kl", "mse_z", "rank"]


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
        with math_sdpa(hidden.is_cuda):
            for blk in backbone.blocks[depth:]:
                x = blk(x, attn_mask=attn_mask)
        return classify_tokens(backbone, x)
    raise ValueError(f"unknown relaxation {relaxation!r}; expected 'st' or 'soft'")


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
    auxiliary head, IA-RED²'s REINFORCE; :mod:`midas_nb.scorers`) is trained with that loss in
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
    sums = torch.zeros(4, dtype=torch.float64)
    hook = getattr(scorer, "training_loss", None)

    def step(idx: Tensor) -> Tensor:
        nonlocal sums
        hidden = cache.hidden[idx].to(device, torch.float32)
        labels = cache.labels[idx].to(device)
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
        b = len(idx)
        sums += torch.tensor([loss.item() * b, loss_cls.item() * b, loss_ga.item() * b,
                              (logits.argmax(-1) == labels).sum().item()], dtype=torch.float64)
        return loss

    def end_epoch() -> None:
        nonlocal sums
        result.loss.append(float(sums[0] / n))
        result.loss_cls.append(float(sums[1] / n))
        result.loss_ga.append(float(sums[2] / n))
        result.train_accuracy.append(float(sums[3] / n))
        sums = torch.zeros(4, dtype=torch.float64)

    t0 = time.perf_counter()
    scorer.train()
    with frozen(backbone):
        optimise_on_cache(params, n, step, epochs=epochs, batch_size=batch_size, lr=lr, weight_decay=weight_decay,
                          seed=seed, desc="train scorer", progress=progress, end_epoch=end_epoch, show_loss=True)
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
            digest, the SHA-256 of the target maps and, for other families, the scorer class's
            ``architecture`` string, so a scorer is never reused for other data, other targets or
            another architecture.
        **train_kwargs: the other keyword arguments of :func:`train_scorer`.

    Returns:
        ``(scorer on device in eval mode, TrainResult, loaded_from_cache)``.
    """
    dim = cache.hidden.shape[-1]
    family = str(scorer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        if family == "mlp":
            model = MLPScorer(dim, hidden=mlp_hidden)
        else:
            model = build_scorer(family, dim, **dict(scorer_kwargs or {}))
    model.to(device)
    # a family's architecture identity keys its cache: a checkpoint of another version is never loaded
    extra_key = {} if family == "mlp" else dict(scorer_kwargs=dict(scorer_kwargs or {}),
                                                architecture=getattr(model, "architecture", None))
    full_key = dict(key, depth=int(depth), budget=float(budget), seed=int(seed), mlp_hidden=mlp_hidden,
                    dim=int(dim), n_train=len(cache), supervised=targets is not None,
                    train_data=cache.data_id or None, weights=state_dict_digest(backbone),
                    targets_digest=None if targets is None else tensor_digest(targets),
                    kind=f"{family}_scorer", **extra_key,
                    **{k: (float(v) if isinstance(v, (int, float)) and not
                           isinstance(v, bool) else v) for k, v in train_kwargs.items()})
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = root / "scorers" / f"{key_hash(full_key)}.pt"

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
