"""The MIDAS three-condition protocol at depth ``L`` and budget ``b`` (DESIGN.md §5, §6).

For one frozen, fine-tuned backbone and one dataset, :func:`run_protocol` builds a scorer per
condition and seed, prunes at ``(L, b)`` and evaluates on the test split:

- ``reference`` — T0 at block ``L`` (:class:`~midas_nb.scorers.ReferenceScorer`), no training;
- ``unsupervised`` — :class:`~midas_nb.scorers.MLPScorer` trained with ``L_cls`` only;
- ``<target id>`` (``T1`` … ``T5``, any id of :func:`midas_nb.targets.list_targets`) — the same
  MLP trained with ``L_cls + λ·L_ga`` on that target (``supervised(Tk)``; the target maps of
  the train split come from :func:`midas_nb.targets.target_cache` with ``class_rule="label"``);
- ``random`` — a seeded random ranking (:class:`~midas_nb.scorers.RandomScorer`), the lower
  bound;
- scorer families that are conditions of their own (``cropr``, ``iared``;
  :func:`midas_nb.scorers.list_scorer_conditions`, :mod:`midas_nb.related`) — built by name,
  trained with their own objective (:meth:`~midas_nb.scorers.TokenScorer.training_loss`) on the
  same cached block-``L`` states and evaluated by top-``k`` at the same ``(L, b)``; their
  :meth:`~midas_nb.scorers.TokenScorer.evaluation_extras` add columns to their rows.

Seeds: trainable conditions train once per seed (seed = MLP initialisation and batch order);
``random`` draws its ranking from each seed; ``reference`` is deterministic — it is evaluated
once and its row is repeated for every seed (so tables stay one row per condition × seed and
the seed spread of the reference is 0).

Metrics per row (test split, :mod:`midas_nb.metrics`): part mIoU of the kept mask (box
coverage when the dataset has no parts) with a bootstrap CI over images; IDAUC in token space
with the scorer's block-``L`` scores as the ranking and the full model's prediction as the
class, with CI, plus insertion and deletion AUC; top-1 accuracy of the pruned model with CI;
Point-in-Box of the scorer's top-ranked patch (``pib``: the fraction of images whose
highest-scoring patch lies in the object box, LaSt-ViT's probe applied to the ranking);
throughput of the pruned forward (images/s, from images, stem included). The unpruned model's
accuracy and throughput are in every row (``full_accuracy``, ``throughput_full``) and in
``df.attrs``; the settings are in ``df.attrs["params"]`` (:func:`protocol_params`).

Block-``L`` states of both splits are cached once (:func:`midas_nb.train.block_cache`); each
condition then only runs its scorer and blocks ``L+1..depth`` on the kept tokens (and the
insertion/deletion forwards). Apart from the target maps (which need the attention matrices),
the run uses timm's fused attention (:func:`fused_attention`; numerically the same, faster) for
every block — throughput included, for the full and the pruned model alike — and restores the
backbone's setting afterwards. IDAUC costs about ``S+1`` full forwards per image and scorer:
``max_idauc_images`` bounds it on CPU.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Literal, Sequence

import pandas as pd
import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from .pruning import check_depth, prune_tokens, pruned_forward
from .scorers import (MLPScorer, RandomScorer, ReferenceScorer, TokenScorer, build_scorer,
                      list_scorer_conditions)
from .identity import dataset_identity, state_dict_digest
from .train import BlockCache, block_cache, frozen, key_hash, load_or_train_scorer
from .vit import keep_count

__all__ = ["BASE_CONDITIONS", "PROTOCOL_DEFAULTS", "list_conditions", "protocol_params",
           "get_params", "evaluation_subset", "fused_attention", "run_protocol"]

#: conditions that are not a supervision target id
BASE_CONDITIONS: tuple[str, ...] = ("reference", "unsupervised", "random")

#: default settings of :func:`run_protocol` (stored with every table in ``df.attrs["params"]``)
PROTOCOL_DEFAULTS: dict[str, Any] = dict(
    relaxation="st",          # differentiable selection for L_cls: "st" | "soft" (midas_nb.train)
    lam=1.0,                  # λ, weight of L_ga
    temperature=1.0,          # τ of the distillation softmax
    distill_form="kl",        # "kl" | "mse_z" | "rank"
    mask_temperature=0.25,    # τ_m of the "soft" relaxation, in units of the score std
    epochs=4,
    batch_size=64,
    lr=1e-3,
    weight_decay=0.01,
    mlp_hidden=None,          # None: D // 2
    idauc_steps=10,
    max_eval_images=None,     # None: the whole test split; else a seeded random subset
    max_idauc_images=None,    # None: every evaluated image
    eval_subset_seed=0,
    bootstrap=1000,
    eval_batch_size=64,
    throughput_batch=16,
    throughput_repeats=3,
)


def list_conditions() -> list[str]:
    """Every valid condition: ``reference``, ``unsupervised``, ``random``, the target ids
    (``supervised(Tk)``) and the scorer families of :func:`midas_nb.scorers.list_scorer_conditions`."""
    from .targets import list_targets
    targets = [t for t in list_targets() if t not in BASE_CONDITIONS]
    families = [f for f in list_scorer_conditions() if f not in BASE_CONDITIONS and f not in targets]
    return list(BASE_CONDITIONS) + targets + families


def protocol_params(**overrides: Any) -> dict[str, Any]:
    """:data:`PROTOCOL_DEFAULTS` with ``overrides`` merged in.

    Raises:
        ValueError: for a key that is not a protocol setting.
    """
    unknown = sorted(set(overrides) - set(PROTOCOL_DEFAULTS))
    if unknown:
        raise ValueError(f"unknown protocol setting(s) {unknown}; expected some of {sorted(PROTOCOL_DEFAULTS)}")
    return dict(PROTOCOL_DEFAULTS, **overrides)


get_params = protocol_params


def evaluation_subset(n: int, max_images: int | None, seed: int = 0) -> list[int]:
    """Indices of the evaluated test images: all of them, or ``max_images`` drawn without
    replacement with ``seed`` and sorted (datasets are often ordered by class, so the first
    ``max_images`` would cover few classes)."""
    if max_images is None or max_images >= n:
        return list(range(n))
    g = torch.Generator().manual_seed(int(seed))
    return sorted(torch.randperm(n, generator=g)[: int(max_images)].tolist())


@contextmanager
def fused_attention(model: nn.Module) -> Iterator[nn.Module]:
    """Switch every timm ``Attention`` of ``model`` to the fused path; restore the flags on exit.

    Speed only (about a quarter faster on CPU): the protocol never reads attention except
    block ``L``'s for T0, which :func:`midas_nb.pruning.record_attention` unfuses itself.
    """
    mods = [m for m in model.modules() if hasattr(m, "fused_attn")]
    flags = [m.fused_attn for m in mods]
    for m in mods:
        m.fused_attn = True
    try:
        yield model
    finally:
        for m, f in zip(mods, flags):
            m.fused_attn = f


def _scores(scorer: TokenScorer, cache: BlockCache, batch_size: int, device) -> Tensor:
    """``[n,N]`` scores of a scorer over a cache (reference: the cached T0)."""
    if isinstance(scorer, ReferenceScorer):
        return cache.cls_attn.clone()
    if isinstance(scorer, RandomScorer):
        scorer.reset()
    out = []
    with torch.no_grad():
        for i in range(0, len(cache), batch_size):
            h = cache.hidden[i:i + batch_size].to(device, torch.float32)
            out.append(scorer(h, cache.num_prefix).float().cpu())
    return torch.cat(out)


def _pruned_eval(backbone, cache: BlockCache, scores: Tensor, depth, budget, batch_size, device):
    logits, masks = [], []
    with torch.no_grad():
        for i in range(0, len(cache), batch_size):
            out = prune_tokens(backbone, cache.hidden[i:i + batch_size].to(device, torch.float32),
                               scores[i:i + batch_size].to(device), depth, budget)
            logits.append(out.logits.float().cpu())
            masks.append(out.keep_mask.cpu())
    return torch.cat(logits), torch.cat(masks)


def _load_images(dataset, n: int | Sequence[int], batch_size: int) -> Tensor:
    """Images of the first ``n`` items of ``dataset``, or of the positions ``n``."""
    from torch.utils.data import DataLoader, Subset

    from .data import collate_samples
    idx = list(range(min(n, len(dataset)))) if isinstance(n, int) else [int(i) for i in n]
    sub = Subset(dataset, idx)
    return torch.cat([b.images for b in DataLoader(sub, batch_size=batch_size, collate_fn=collate_samples)])


def _insdel(backbone, images: Tensor, scores: Tensor, class_index: Tensor, steps: int,
            batch_size: int, device):
    from .metrics import InsDel, insertion_deletion_auc
    parts = []
    for i in range(0, images.shape[0], batch_size):
        r = insertion_deletion_auc(backbone, images[i:i + batch_size].to(device),
                                   scores[i:i + batch_size].to(device), steps,
                                   class_index=class_index[i:i + batch_size].to(device), space="token")
        parts.append(r)
    cat = lambda name: torch.cat([getattr(p, name).float().cpu() for p in parts])  # noqa: E731
    return InsDel(cat("ins_auc"), cat("del_auc"), cat("idauc"), parts[0].fractions.cpu(),
                  cat("ins_curve"), cat("del_curve"), cat("class_index").long(), "token")


def run_protocol(
    train_set,
    test_set,
    backbone: nn.Module,
    *,
    depth: int,
    budget: float,
    conditions: Sequence[str],
    seeds: Sequence[int],
    dataset_name: str,
    backbone_name: str,
    checkpoint_id: str,
    relaxation: Literal["st", "soft"] = "st",
    lam: float = 1.0,
    temperature: float = 1.0,
    epochs: int = 4,
    batch_size: int = 64,
    lr: float = 1e-3,
    idauc_steps: int = 10,
    max_eval_images: int | None = None,
    bootstrap: int = 1000,
    device: str | torch.device = "cpu",
    cache_dir: str | Path | None = None,
    progress: bool = True,
    prefetch_targets: Sequence[str] = (),
    **settings: Any,
) -> pd.DataFrame:
    """Train and evaluate every condition × seed at ``(L, b)``; one results row each.

    Args:
        train_set: map-style dataset of :class:`midas_nb.data.Sample` with a deterministic
            transform (block-``L`` states and targets are cached once per image).
        test_set: the test split (``has_parts`` decides part mIoU vs box coverage).
        backbone: the fine-tuned timm ViT; frozen and in eval mode during the run (restored
            afterwards), moved to ``device``.
        depth: ``L ∈ 1..len(blocks)-1``.
        budget: ``b ∈ (0,1]``.
        conditions: names from :func:`list_conditions` (``reference``, ``unsupervised``,
            ``random``, target ids such as ``T1``..``T5`` for ``supervised(Tk)``, scorer
            families such as ``cropr``, ``iared``).
        seeds: training seeds; every condition gets one row per seed (module docstring).
        dataset_name, backbone_name, checkpoint_id: identity columns of the rows and parts of
            every cache key.
        relaxation: ``"st"`` (default) or ``"soft"`` (:func:`midas_nb.train.relaxed_logits`).
        lam: ``λ`` of ``L_ga``. Default: 1.0.
        temperature: ``τ`` of :func:`midas_nb.train.distill_loss`. Default: 1.0.
        epochs, batch_size, lr: scorer training.
        idauc_steps: ``S`` of the insertion/deletion curves.
        max_eval_images: evaluate on a seeded random subset of this many test images
            (:func:`evaluation_subset`); ``None``: all.
        bootstrap: bootstrap resamples of the CIs.
        device: where everything runs.
        cache_dir: root of the block, target and scorer caches (default
            ``midas_nb.config.cache_dir()``).
        progress: tqdm bars.
        prefetch_targets: further target ids computed in the same pass over the train split
            when the supervised conditions' targets are first computed (one capture pass
            yields every target; later runs with other conditions find them cached). Does not
            change any result.
        **settings: other keys of :data:`PROTOCOL_DEFAULTS` (``distill_form``,
            ``mask_temperature``, ``weight_decay``, ``mlp_hidden``, ``max_idauc_images``,
            ``eval_subset_seed``, ``eval_batch_size``, ``throughput_batch``,
            ``throughput_repeats``).

    Returns:
        ``pd.DataFrame`` validated by :func:`midas_nb.results.make_table`, one row per
        condition × seed (``pib`` filled), with extra columns ``scorer``, ``full_accuracy``,
        ``agreement`` (fraction of images where the pruned prediction equals the full model's;
        finer than accuracy when pruning barely changes it),
        ``throughput_full``, ``speedup``, ``n_idauc_images``, ``lambda_ga``, ``temperature``,
        ``distill_form``, ``epochs``, ``train_loss``, ``train_accuracy``, ``train_seconds``,
        ``from_cache`` (and the scorer families' extra columns, NaN in other rows);
        ``weights_digest`` (:func:`midas_nb.identity.state_dict_digest` of the backbone the row
        was computed with), ``dataset_fingerprint`` (content identity of the evaluated test
        images, :attr:`midas_nb.identity.DatasetIdentity.full`) and the per-image values behind the means (lists, see
        :data:`midas_nb.results.PER_IMAGE_COLUMNS`): ``image_ids``, ``miou_per_image`` (NaN for
        an image without a visible part), ``idauc_image_ids``, ``idauc_per_image``,
        ``accuracy_per_image`` (1 = the pruned prediction is correct; ids as ``image_ids``).
        ``df.attrs`` holds ``params``, ``full_accuracy``, ``throughput_full``.

    Raises:
        ValueError: unknown conditions, empty seeds, bad depth or budget.
    """
    from torch.utils.data import Subset

    from .metrics import bootstrap_ci, box_coverage, measure_throughput, part_miou, point_in_box
    from .results import make_table, summarise_metrics

    params = protocol_params(relaxation=relaxation, lam=lam, temperature=temperature, epochs=epochs,
                             batch_size=batch_size, lr=lr, idauc_steps=idauc_steps,
                             max_eval_images=max_eval_images, bootstrap=bootstrap, **settings)
    depth = check_depth(backbone, depth)
    keep_count(budget, 1)
    valid = list_conditions()
    unknown = [c for c in conditions if c not in valid]
    if unknown or not conditions:
        raise ValueError(f"unknown or no conditions {unknown or list(conditions)}; expected some of {valid}")
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise ValueError("seeds must hold at least one seed")
    conditions = list(dict.fromkeys(conditions))
    families = [c for c in conditions if c in set(list_scorer_conditions())]
    supervised = [c for c in conditions if c not in BASE_CONDITIONS and c not in families]
    trainable = [c for c in conditions if c == "unsupervised" or c in supervised or c in families]
    device = torch.device(device)
    ebs = int(params["eval_batch_size"])
    ident = dict(checkpoint_id=checkpoint_id, dataset=dataset_name, backbone=backbone_name)
    backbone.to(device)
    # the weights every row was computed from (one checkpoint id could be retrained into other
    # bits on another machine; the digest makes that visible, and the caches key on it)
    weights_digest = state_dict_digest(backbone)
    t_start = time.perf_counter()

    targets: dict[str, Tensor] = {}
    if supervised:   # (capture unfuses the attention in place: run it before fused_attention)
        from .targets import list_targets, target_cache
        known = set(list_targets())
        extra = [t for t in dict.fromkeys(prefetch_targets) if t in known and t not in supervised]
        with frozen(backbone):
            targets = target_cache(backbone, train_set, ids=supervised + extra, depth=depth, class_rule="label",
                                   key=dict(ident, split="train", n=len(train_set)), cache_dir=cache_dir,
                                   batch_size=ebs, device=device, progress=progress)
        targets = {k: targets[k] for k in supervised}

    with frozen(backbone), fused_attention(backbone):
        # --- train split: block-L states ------------------------------------------------------
        train_cache = None
        if trainable:
            train_cache = block_cache(backbone, train_set, depth=depth, key=dict(ident, split="train"),
                                      cache_dir=cache_dir, batch_size=ebs, device=device, progress=progress,
                                      full_logits=False, masks=False)

        # --- test split ---------------------------------------------------------------------
        subset = evaluation_subset(len(test_set), params["max_eval_images"], params["eval_subset_seed"])
        eval_set = test_set if len(subset) == len(test_set) else Subset(test_set, subset)
        test_cache = block_cache(backbone, eval_set, depth=depth,
                                 key=dict(ident, split="test", subset=key_hash({"i": subset})),
                                 cache_dir=cache_dir, batch_size=ebs, device=device, progress=progress)
        n_eval = len(test_cache)
        eval_fingerprint = dataset_identity(eval_set).full     # the evaluated images, by content
        full_pred = test_cache.logits.argmax(-1)
        full_correct = (full_pred == test_cache.labels).float()
        full_accuracy = float(full_correct.mean())
        has_parts = bool(getattr(test_set, "has_parts", True))
        n_idauc = n_eval if params["max_idauc_images"] is None else min(n_eval, int(params["max_idauc_images"]))
        # IDAUC images: a seeded random subset of the evaluated ones (test splits are ordered by
        # class, so the first n would cover only the first classes), the same for every row
        ipos = evaluation_subset(n_eval, n_idauc, int(params["eval_subset_seed"]) + 1)
        idauc_images = _load_images(eval_set, ipos, ebs) if idauc_steps > 0 and n_idauc > 0 else None

        # --- throughput of the pruned forward per scorer family, and of the full model -------
        tp_images = _load_images(eval_set, int(params["throughput_batch"]), ebs).to(device)
        reps = int(params["throughput_repeats"])
        dim = test_cache.hidden.shape[-1]
        family = {"reference": ReferenceScorer(), "mlp": MLPScorer(dim, params["mlp_hidden"]).to(device).eval(),
                  "random": RandomScorer(0)}
        n_classes = int(test_cache.logits.shape[-1])      # scorer families may need it (aux heads)
        family.update({c: build_scorer(c, dim, num_classes=n_classes).to(device).eval() for c in families})
        needed = {c if c in ("reference", "random") or c in families else "mlp" for c in conditions}
        family = {k: v for k, v in family.items() if k in needed}
        throughput_full = measure_throughput(backbone, tp_images, repeats=reps, warmup=1)
        throughput = {name: measure_throughput(
            lambda x, s=s: pruned_forward(backbone, x, s, depth, budget).logits, tp_images,
            repeats=reps, warmup=1) for name, s in family.items()}

        # --- conditions × seeds -------------------------------------------------------------
        rows: list[dict[str, Any]] = []
        jobs = [(c, s) for c in conditions for s in seeds]
        evaluated: dict[tuple[str, int], dict[str, Any]] = {}
        for cond, seed in tqdm(jobs, desc="protocol", disable=not progress):
            train_info: dict[str, Any] = dict(train_loss=float("nan"), train_accuracy=float("nan"),
                                              train_seconds=0.0, from_cache=False)
            if cond == "reference":
                if ("reference", 0) in evaluated:
                    rows.append(dict(evaluated[("reference", 0)], seed=seed))
                    continue
                scorer: TokenScorer = ReferenceScorer()
                kind, target_id, relax = "reference", "T0", ""
            elif cond == "random":
                scorer, kind, target_id, relax = RandomScorer(seed), "random", "", ""
            elif cond in families:      # a scorer family with its own objective
                scorer, result, loaded = load_or_train_scorer(
                    backbone, train_cache, key=dict(ident, condition=cond, target=""),
                    depth=depth, budget=budget, targets=None, seed=seed, scorer=cond,
                    scorer_kwargs=dict(num_classes=n_classes),
                    cache_dir=cache_dir, device=device, progress=progress,
                    epochs=epochs, batch_size=batch_size, lr=lr, weight_decay=params["weight_decay"])
                kind, target_id, relax = cond, "", ""
                train_info = dict(train_loss=result.loss[-1] if result.loss else float("nan"),
                                  train_accuracy=result.train_accuracy[-1] if result.train_accuracy else float("nan"),
                                  train_seconds=result.seconds, from_cache=loaded)
            else:
                target_id = "" if cond == "unsupervised" else cond
                scorer, result, loaded = load_or_train_scorer(
                    backbone, train_cache,
                    key=dict(ident, condition=cond, target=target_id),
                    depth=depth, budget=budget,
                    targets=targets.get(cond), seed=seed, mlp_hidden=params["mlp_hidden"],
                    cache_dir=cache_dir, device=device, progress=progress,
                    relaxation=relaxation, lam=lam, temperature=temperature,
                    distill_form=params["distill_form"], mask_temperature=params["mask_temperature"],
                    epochs=epochs, batch_size=batch_size, lr=lr, weight_decay=params["weight_decay"])
                kind, relax = "mlp", relaxation
                train_info = dict(train_loss=result.loss[-1] if result.loss else float("nan"),
                                  train_accuracy=result.train_accuracy[-1] if result.train_accuracy else float("nan"),
                                  train_seconds=result.seconds, from_cache=loaded)
            scores = _scores(scorer, test_cache, ebs, device)
            logits, keep_mask = _pruned_eval(backbone, test_cache, scores, depth, budget, ebs, device)
            coverage = (part_miou(keep_mask, test_cache.part_mask) if has_parts
                        else box_coverage(keep_mask, test_cache.box_mask))
            insdel = None
            if idauc_images is not None:
                insdel = _insdel(backbone, idauc_images, scores[ipos], full_pred[ipos],
                                 idauc_steps, ebs, device)
            correct = (logits.argmax(-1) == test_cache.labels).float()
            in_box = point_in_box(scores, test_cache.box_mask)
            row = dict(dataset=dataset_name, backbone=backbone_name, checkpoint_id=checkpoint_id,
                       condition=cond, target=target_id, relaxation=relax, depth=depth,
                       budget=float(budget), seed=seed, device=str(device),
                       throughput=throughput[kind], scorer=kind)
            row.update(summarise_metrics(coverage, insdel, correct, in_box, n_boot=int(bootstrap)))
            # per-image values with the image ids, for paired intervals (decoupling_D) and the
            # seed × image bootstrap (aggregate_seeds); NaN where an image has no visible part
            row.update(image_ids=list(test_cache.image_ids),
                       miou_per_image=[float(v) for v in coverage.per_image.tolist()],
                       idauc_image_ids=[test_cache.image_ids[i] for i in ipos] if insdel is not None else [],
                       idauc_per_image=[float(v) for v in insdel.idauc.tolist()] if insdel is not None else [],
                       accuracy_per_image=[float(v) for v in correct.tolist()],
                       weights_digest=weights_digest, dataset_fingerprint=eval_fingerprint)
            row.update(n_images=n_eval, full_accuracy=full_accuracy,
                       agreement=float((logits.argmax(-1) == full_pred).float().mean()),
                       throughput_full=throughput_full, speedup=throughput[kind] / throughput_full,
                       n_idauc_images=n_idauc if insdel is not None else 0,
                       lambda_ga=float(lam) if target_id and cond != "reference" else 0.0,
                       temperature=float(temperature), distill_form=params["distill_form"],
                       epochs=int(epochs) if kind not in ("reference", "random") else 0, **train_info)
            if cond in families:
                row.update(scorer.evaluation_extras(
                    backbone, test_cache.hidden, test_cache.labels, scores, depth=depth, budget=budget,
                    num_prefix=test_cache.num_prefix, images=tp_images))
            if cond == "reference":
                evaluated[("reference", 0)] = row
            rows.append(row)

    table = make_table(rows)
    table.attrs["params"] = dict(params, depth=depth, budget=float(budget), conditions=conditions,
                                 seeds=seeds, **ident)
    table.attrs["full_accuracy"] = full_accuracy
    table.attrs["full_accuracy_ci"] = bootstrap_ci(full_correct, n_boot=int(bootstrap))
    table.attrs["throughput_full"] = throughput_full
    table.attrs["seconds"] = time.perf_counter() - t_start
    return table
