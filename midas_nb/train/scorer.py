"""Scorer training: ``L = L_cls + λ·L_ga`` at depth ``L`` and budget ``b`` (see
:mod:`midas_nb.train` for the definitions and their sources)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Sequence

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
           "train_scorers", "load_or_train_scorer", "load_or_train_scorers"]

Relaxation = Literal["st", "soft"]
DistillForm = Literal["kl", "mse_z", "rank"]


def zscore(x: Tensor, dim: int = -1, eps: float = 1e-6) -> Tensor:
    """Per-row z-score ``(x − mean) / (std + eps)`` along ``dim`` (population std)."""
    return (x - x.mean(dim=dim, keepdim=True)) / (x.std(dim=dim, keepdim=True, unbiased=False) + eps)


def distill_loss(scores: Tensor, target: Tensor, form: DistillForm = "kl", temperature: float = 1.0) -> Tensor:
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


def relaxed_logits(backbone: nn.Module, hidden: Tensor, scores: Tensor, depth: int, budget: float,
                   relaxation: Relaxation = "st", mask_temperature: float = 0.25) -> Tensor:
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
    return _blocks_after(backbone, depth, *_relaxed_inputs(backbone, hidden, scores, depth, budget, relaxation,
                                                              mask_temperature))


def _relaxed_inputs(backbone, hidden, scores, depth, budget, relaxation, mask_temperature) -> tuple[Tensor, Tensor | None]:
    """``(tokens [B,T',D], key bias [B,1,1,T] or None)`` that :func:`relaxed_logits` runs through blocks
    ``L+1..n``: per image, so the inputs of several scorers concatenate along the batch."""
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
        return torch.cat([x[:, :P], x[:, P:] * multiplier.unsqueeze(-1).to(x.dtype)], dim=1), None
    if relaxation == "soft":
        if (pool := getattr(backbone, "global_pool", "token")) != "token":
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
        return hidden, bias[:, None, None, :]                            # [B,1,1,T] on keys
    raise ValueError(f"unknown relaxation {relaxation!r}; expected 'st' or 'soft'")


def _blocks_after(backbone, depth: int, x: Tensor, attn_mask: Tensor | None) -> Tensor:
    """Logits ``[B,C]`` of blocks ``L+1..n`` and the head on :func:`_relaxed_inputs`."""
    if attn_mask is None:
        return classify_tokens(backbone, run_blocks(backbone, x, depth, None))
    # CUDA's memory-efficient SDPA kernel rejects this broadcast additive mask in the
    # backward pass ("LSE is not correctly aligned" for T not a multiple of 8); the math
    # kernel computes the same softmax(QKᵀ/√d + bias)·V. CPU keeps its default kernel.
    with math_sdpa(x.is_cuda):
        for blk in backbone.blocks[depth:]:
            x = blk(x, attn_mask=attn_mask)
    return classify_tokens(backbone, x)


@dataclass
class TrainResult:
    """What :func:`train_scorers` returns (one per scorer) besides the trained scorer (in place).

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


def train_scorers(backbone: nn.Module, scorers: Sequence[TokenScorer], cache: BlockCache, *, depth: int,
                  budget: float, targets: Sequence[Tensor | None], seeds: Sequence[int], relaxation: Relaxation = "st",
                  lam: float = 1.0, temperature: float = 1.0, distill_form: DistillForm = "kl",
                  mask_temperature: float = 0.25, epochs: int = 4, batch_size: int = 64, lr: float = 1e-3,
                  weight_decay: float = 0.01, device: str | torch.device = "cpu",
                  progress: bool = True) -> list[TrainResult]:
    """Train each of ``scorers`` in place on cached block-``L`` states with ``L = L_cls + λ·L_ga``, all in one
    loop over the cache (docs/decisions/0069): each scorer has the optimiser, schedule and batch order it would
    have alone; the blocks after ``L`` run once per step on the kept tokens of every scorer that trains with
    ``L_cls`` (concatenated along the batch). The same result as training each alone, to the float rounding of
    a larger batch; each result's ``seconds`` is an equal share of the loop's.

    A scorer whose :meth:`~midas_nb.scorers.TokenScorer.training_loss` returns a loss (Cropr's
    auxiliary head, IA-RED²'s REINFORCE; :mod:`midas_nb.scorers`) is trained with that loss in
    place of ``L_cls`` (``relaxation`` and ``mask_temperature`` are then unused; it runs its own forward);
    ``loss_cls`` of its result records it.

    The backbone is frozen and in eval mode throughout (its weights are not changed); only
    the scorers' parameters are optimised (AdamW, cosine decay of the learning rate per step).
    ``seeds[i]`` fixes scorer ``i``'s batch order (its initialisation is the caller's; see
    :func:`load_or_train_scorer`).

    Args:
        backbone: timm ViT on ``device``.
        scorers: trainable scorers on ``device`` (``scorer.trainable``).
        cache: :class:`BlockCache` of the training split at depth ``L``.
        depth: ``L``; must equal ``cache.depth``.
        budget: ``b``.
        targets: per scorer, its ``[n,N]`` supervision target, rows aligned with ``cache`` (dataset order),
            or ``None`` for the unsupervised condition (``L_cls`` only).
        seeds: per scorer, the seed of its batch order.
        relaxation: ``"st"`` (default) or ``"soft"`` (see :func:`relaxed_logits`).
        lam: ``λ``, weight of ``L_ga``. Default: 1.0.
        temperature: ``τ`` of :func:`distill_loss`. Default: 1.0.
        distill_form: ``"kl"`` (default), ``"mse_z"`` or ``"rank"``.
        mask_temperature: ``τ_m`` of the ``"soft"`` relaxation. Default: 0.25.
        epochs, batch_size, lr, weight_decay: optimisation settings.
        device: where the steps run.
        progress: show a tqdm bar.

    Returns:
        one :class:`TrainResult` per scorer, in order.

    Raises:
        ValueError: on a depth that differs from the cache's, targets of the wrong shape, a
            scorer without parameters, or lists of different lengths.
    """
    depth = check_depth(backbone, depth)
    if cache.depth != depth:
        raise ValueError(f"cache holds block-{cache.depth} states but depth={depth} was asked")
    if not len(scorers) == len(targets) == len(seeds):
        raise ValueError(f"train_scorers: {len(scorers)} scorers, {len(targets)} targets and {len(seeds)} seeds; "
                         "expected one target (or None) and one seed per scorer")
    params = [[p for p in scorer.parameters() if p.requires_grad] for scorer in scorers]
    for scorer, own in zip(scorers, params):
        if not own:
            raise ValueError(f"{type(scorer).__name__} has no trainable parameters")
    n, N = len(cache), cache.hidden.shape[1] - cache.num_prefix
    for t in targets:
        if t is not None and tuple(t.shape) != (n, N):
            raise ValueError(f"targets must be [n,N]=({n},{N}) aligned with the cache, got {tuple(t.shape)}")
    settings = dict(depth=depth, budget=float(budget), relaxation=relaxation, lam=float(lam),
                    temperature=float(temperature), distill_form=distill_form, mask_temperature=float(mask_temperature),
                    epochs=int(epochs), batch_size=int(batch_size), lr=float(lr), weight_decay=float(weight_decay))
    results = [TrainResult(params=dict(settings, seed=int(seed), supervised=t is not None))
               for seed, t in zip(seeds, targets)]
    sums = torch.zeros(len(scorers), 4, dtype=torch.float64)
    hooks = [getattr(scorer, "training_loss", None) for scorer in scorers]

    def step(idxs: list[Tensor]) -> Tensor:
        out: list[Any] = [None] * len(scorers)
        shared = []         # (i, scores, labels, inputs) of the scorers whose L_cls runs the shared forward
        for i, (scorer, idx) in enumerate(zip(scorers, idxs)):
            hidden = cache.hidden[idx].to(device, torch.float32)
            labels = cache.labels[idx].to(device)
            own = None if hooks[i] is None else hooks[i](backbone, hidden, labels, depth=depth, budget=budget,
                                                         num_prefix=cache.num_prefix)
            if own is None:
                scores = scorer(hidden, cache.num_prefix)
                shared.append((i, scores, labels, _relaxed_inputs(backbone, hidden, scores, depth, budget,
                                                                  relaxation, mask_temperature)))
            else:       # a family with its own objective (TokenScorer.training_loss)
                out[i] = (*own, labels)
        if shared:
            masks = [inputs[1] for *_, inputs in shared]
            logits = _blocks_after(backbone, depth, torch.cat([inputs[0] for *_, inputs in shared]),
                                   None if masks[0] is None else torch.cat(masks))
            for (i, scores, labels, _), part in zip(shared, logits.split([len(x[2]) for x in shared])):
                out[i] = (F.cross_entropy(part, labels), part, scores, labels)
        total = 0.0
        for i, ((loss_cls, logits, scores, labels), idx, t) in enumerate(zip(out, idxs, targets)):
            loss_ga = (distill_loss(scores, t[idx].to(device), distill_form, temperature)
                       if t is not None else scores.new_zeros(()))
            loss = loss_cls + lam * loss_ga
            b = len(idx)
            sums[i] += torch.tensor([loss.item() * b, loss_cls.item() * b, loss_ga.item() * b,
                                     (logits.argmax(-1) == labels).sum().item()], dtype=torch.float64)
            total = total + loss
        return total

    def end_epoch() -> None:
        for r, row in zip(results, (sums / n).tolist()):
            for values, v in zip((r.loss, r.loss_cls, r.loss_ga, r.train_accuracy), row):
                values.append(v)
        sums.zero_()

    t0 = time.perf_counter()
    for scorer in scorers:
        scorer.train()
    with frozen(backbone):
        optimise_on_cache(params, n, step, epochs=epochs, batch_size=batch_size, lr=lr, weight_decay=weight_decay,
                          seed=list(seeds), desc="train scorer", progress=progress, end_epoch=end_epoch, show_loss=True)
    for scorer, result in zip(scorers, results):
        scorer.eval()
        result.seconds = (time.perf_counter() - t0) / len(scorers)
    return results


def load_or_train_scorer(backbone: nn.Module, cache: BlockCache, *, key: dict[str, Any], depth: int, budget: float,
                         targets: Tensor | None = None, seed: int = 0, mlp_hidden: int | None = None,
                         cache_dir: str | Path | None = None, device: str | torch.device = "cpu", progress: bool = True,
                         scorer: str = "mlp", scorer_kwargs: dict[str, Any] | None = None,
                         **train_kwargs) -> tuple[TokenScorer, TrainResult, bool]:
    """A scorer (default: an :class:`MLPScorer`) trained by :func:`train_scorers`, cached by key.

    The scorer is initialised under ``torch.manual_seed(seed)`` (the global RNG state is
    restored afterwards) and trained with batch-order seed ``seed``.

    Args:
        backbone, cache, depth, budget, device, progress: as in :func:`train_scorers`; ``targets``, ``seed``:
            this scorer's.
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
        **train_kwargs: the other keyword arguments of :func:`train_scorers`.

    Returns:
        ``(scorer on device in eval mode, TrainResult, loaded_from_cache)``.
    """
    return load_or_train_scorers(backbone, cache, keys=[key], depth=depth, budget=budget, targets=[targets],
                                 seeds=[seed], mlp_hidden=mlp_hidden, cache_dir=cache_dir, device=device,
                                 progress=progress, scorer=scorer, scorer_kwargs=scorer_kwargs, **train_kwargs)[0]


def load_or_train_scorers(backbone: nn.Module, cache: BlockCache, *, keys: Sequence[dict[str, Any]], depth: int,
                          budget: float, targets: Sequence[Tensor | None], seeds: Sequence[int],
                          mlp_hidden: int | None = None, cache_dir: str | Path | None = None,
                          device: str | torch.device = "cpu", progress: bool = True, scorer: str = "mlp",
                          scorer_kwargs: dict[str, Any] | None = None, weights_digest: str | None = None,
                          **train_kwargs) -> list[tuple[TokenScorer, TrainResult, bool]]:
    """:func:`load_or_train_scorer` for several scorers of one family (``keys[i]``, ``targets[i]``,
    ``seeds[i]``: scorer ``i``'s), each cached under its own key; those not cached are trained together
    (:func:`train_scorers`). ``weights_digest``: the backbone's :func:`state_dict_digest`, where the caller has it."""
    dim = cache.hidden.shape[-1]
    family = str(scorer)
    weights = weights_digest or state_dict_digest(backbone)
    digests = {id(t): tensor_digest(t) for t in targets if t is not None}
    root = default_cache_dir(cache_dir)
    models, full_keys = [], []
    for key, seed, t in zip(keys, seeds, targets, strict=True):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(seed))
            model = (MLPScorer(dim, hidden=mlp_hidden) if family == "mlp"
                     else build_scorer(family, dim, **dict(scorer_kwargs or {})))
        models.append(model.to(device))
        # a family's architecture identity keys its cache: a checkpoint of another version is never loaded
        extra_key = {} if family == "mlp" else dict(scorer_kwargs=dict(scorer_kwargs or {}),
                                                    architecture=getattr(model, "architecture", None))
        full_keys.append(dict(key, depth=int(depth), budget=float(budget), seed=int(seed), mlp_hidden=mlp_hidden,
                              dim=int(dim), n_train=len(cache), supervised=t is not None,
                              train_data=cache.data_id or None, weights=weights,
                              targets_digest=None if t is None else digests[id(t)],
                              kind=f"{family}_scorer", **extra_key,
                              **{k: (float(v) if isinstance(v, (int, float)) and not
                                     isinstance(v, bool) else v) for k, v in train_kwargs.items()}))
    paths = [root / "scorers" / f"{key_hash(k)}.pt" for k in full_keys]
    built: dict[int, dict[str, Any]] = {}

    def build(i: int) -> dict[str, Any]:   # scorer i and every other one without a file, in one loop
        if i not in built:
            todo = [i] + [j for j, p in enumerate(paths) if j != i and j not in built and not p.exists()]
            results = train_scorers(backbone, [models[j] for j in todo], cache, depth=depth, budget=budget,
                                    targets=[targets[j] for j in todo], seeds=[seeds[j] for j in todo],
                                    device=device, progress=progress, **train_kwargs)
            for j, result in zip(todo, results):
                built[j] = {"state_dict": {k: v.detach().cpu() for k, v in models[j].state_dict().items()},
                            "result": result.__dict__, "key": full_keys[j]}
        return built[i]

    out = []
    for i, (model, path, full_key) in enumerate(zip(models, paths, full_keys)):
        blob, loaded = load_or_build(path, lambda i=i: build(i), key=full_key, what="scorer cache")
        if loaded:
            model.load_state_dict(blob["state_dict"])
            model.eval()
        out.append((model, TrainResult(**blob["result"]), loaded))
    return out
