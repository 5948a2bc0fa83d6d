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
- ``random_map`` — the control for the training signal: the same MLP, loss and ``λ`` as
  ``supervised(Tk)``, distilling the seeded ``random`` target (:mod:`midas_nb.targets.maps`:
  fixed uniform values per training image, the same for every scorer seed) instead of ``Tk``.
  Under the ``st`` relaxation ``L_cls`` reaches only the kept tokens while ``L_ga`` gives every
  token a gradient (DESIGN.md §5), so ``supervised(Tk) − unsupervised`` mixes the target's
  content with merely having a full-ranking signal; ``D`` of ``Tk`` against ``random_map``
  (``decoupling_D(table, reference="random_map")``) keeps the content only. Its rows have
  ``target = "random"`` and ``lambda_ga = λ`` (:data:`CONTROL_TARGETS`);
- scorer families that are conditions of their own (``cropr``, ``iared``;
  :func:`midas_nb.scorers.list_scorer_conditions`, :mod:`midas_nb.scorers`) — built by name,
  trained with their own objective (:meth:`~midas_nb.scorers.TokenScorer.training_loss`) on the
  same cached block-``L`` states and evaluated by top-``k`` at the same ``(L, b)``; their own
  readouts (:func:`midas_nb.metrics.family_readout`) add columns to their rows.

Seeds: trainable conditions train once per seed (seed = MLP initialisation and batch order);
``random`` draws its ranking from each seed; ``reference`` is deterministic — it is evaluated
once and its row is repeated for every seed (so tables stay one row per condition × seed and
the seed spread of the reference is 0).

Metrics per row (test split, :mod:`midas_nb.metrics`): part mIoU of the kept mask (box
coverage when the dataset has no parts) with a bootstrap CI over images; IDAUC in token space
with the scorer's block-``L`` scores as the ranking and the full model's prediction as the
class, with CI, plus insertion and deletion AUC; top-1 accuracy of the pruned model with CI;
Point-in-Box of the scorer's top-ranked patch (``pib``: the fraction of images whose
highest-scoring patch lies in the object box, LaSt-ViT's probe applied to the ranking) beside
its baselines on the same images (``pib_centre``: the centre patch alone; ``pib_box_area``: the
box's share of patches, a random patch's expected PiB);
throughput of the pruned forward (images/s, from images, stem included). The unpruned model's
accuracy and throughput are in every row (``full_accuracy``, ``throughput_full``) and in
``df.attrs``; the settings are in ``df.attrs["params"]`` (:func:`protocol_params`).

Block-``L`` states of both splits are cached once (:func:`midas_nb.train.block_cache`); each
condition then only runs its scorer and blocks ``L+1..n`` on the kept tokens (and the
insertion/deletion forwards). Apart from the target maps (which need the attention matrices),
the run uses timm's fused attention (:func:`fused_attention`; numerically the same, faster) for
every block — throughput included, for the full and the pruned model alike — and restores the
backbone's setting afterwards. IDAUC costs about ``S−1`` full forwards per image and ranking: the tokens
and the all-token ``p_c`` are computed once per split and a ranking met before is not measured again
(decision 0071); ``max_idauc_images`` can bound it.

Size: one file holds the protocol's steps (settings, scorers, evaluation split, rows) so that a
reader follows a cell from its settings to its row without leaving it.
"""
from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

import pandas as pd
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Subset
from ..config import PRECISIONS
from ..progress import tqdm

from ..data import collate_samples, evaluation_subset
from ..metrics import (InsDel, bootstrap_ci, box_coverage, box_share, centre_in_box, family_readout,
                      insertion_deletion_auc, iou_ceiling, measure_speed, part_miou, point_in_box)
from ..pruning import check_depth, prune_tokens
from ..scorers import list_scorer_conditions, RandomScorer, ReferenceScorer, speed_scorers, TokenScorer
from ..identity import dataset_identity, state_dict_digest
from ..results import make_table, summarise_metrics
from ..targets import list_targets, target_caches
from ..train import BlockCache, block_caches, frozen, key_hash, load_or_train_scorer, load_or_train_scorers
from ..point import Budget
from ..backbones.vit import classify_tokens, embed_tokens, fused_attention, grid_size, run_blocks

__all__ = ["BASE_CONDITIONS", "CONTROL_TARGETS",
           "SEEDLESS_CONDITIONS", "condition_target", "PROTOCOL_DEFAULTS", "list_conditions", "protocol_params",
           "with_band_check",
           "get_params", "fused_attention", "run_protocol", "protocol_cells"]

#: conditions that are not a supervision target id
BASE_CONDITIONS: tuple[str, ...] = ("reference", "unsupervised", "random", "random_map")

#: control conditions that distil a registered target under a name of their own (module
#: docstring): ``random_map`` = supervised(``random``), the full-ranking signal without content
CONTROL_TARGETS: dict[str, str] = {"random_map": "random"}

#: conditions without trainable parameters whose ranking does not depend on the seed (the T0
#: scorer): :func:`run_protocol` evaluates them once and repeats the row for every seed, and
#: :func:`midas_nb.study.make_grid` gives them only the first seed's cell
SEEDLESS_CONDITIONS: tuple[str, ...] = ("reference",)

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
    precision="float32",      # "float32" | "bfloat16": autocast of training and IDAUC (protocol_autocast)
)


def with_band_check(conditions: Sequence[str], protocol_conditions: Sequence[str]) -> list[str]:
    """``conditions`` plus ``random`` where ``reference`` is among them, the profile's protocol
    (``protocol_conditions``) has ``random`` and ``conditions`` does not: the parity band's check
    that the reference ranks tokens better than random (:func:`midas_nb.metrics.decoupling_D`);
    without a random row in a cell the band is untested."""
    out = list(conditions)
    if "reference" in out and "random" in protocol_conditions and "random" not in out:
        out.append("random")
    return out


def list_conditions() -> list[str]:
    """Every valid condition: ``reference``, ``unsupervised``, ``random``, ``random_map``, the
    target ids (``supervised(Tk)``) and the scorer families of
    :func:`midas_nb.scorers.list_scorer_conditions`."""
    targets = [t for t in list_targets() if t not in BASE_CONDITIONS]
    families = [f for f in list_scorer_conditions() if f not in BASE_CONDITIONS and f not in targets]
    return list(BASE_CONDITIONS) + targets + families


def condition_target(condition: str) -> str:
    """The target id a condition's rows carry in ``target``: ``"T0"`` for ``reference``, ``""``
    for the conditions without a distillation target (``unsupervised``, ``random``, scorer
    families), :data:`CONTROL_TARGETS` for the controls, the condition itself for
    ``supervised(Tk)``."""
    if condition == "reference":
        return "T0"
    if condition in CONTROL_TARGETS:
        return CONTROL_TARGETS[condition]
    if condition in BASE_CONDITIONS or condition in set(list_scorer_conditions()):
        return ""
    return condition


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


def protocol_autocast(device: torch.device | str, precision: str):
    """The context factory of a protocol run's numerics on ``device``: ``"float32"``, a null
    context; ``"bfloat16"``, :class:`torch.autocast` for the passes each cell repeats — scorer
    training, the insertion/deletion forwards, the throughput. Block-``L`` states, T0, target maps,
    scores and the kept tokens (coverage, accuracy) stay float32: the token selection is exact
    (docs/decisions/0063; ``bench/gpu_check.py`` part (a) checks bfloat16 against float32).

    Raises:
        ValueError: an unknown ``precision``, or ``"bfloat16"`` on a CUDA device without it.
    """
    device = torch.device(device)
    if precision not in PRECISIONS:
        raise ValueError(f"precision: expected one of {list(PRECISIONS)}, got {precision!r}")
    if precision == "float32":
        return contextlib.nullcontext
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError(f"precision 'bfloat16': {torch.cuda.get_device_name(device)} does not compute bfloat16; "
                         "use a GPU that does or precision 'float32' (get_profile('paper', precision='float32'))")
    return functools.partial(torch.autocast, device_type=device.type, dtype=torch.bfloat16)


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


def _pruned_eval(backbone, cache: BlockCache, scores: list[Tensor], depth, budget, batch_size, device,
                 progress: bool = False):
    """``(logits [K,n,C], keep masks [K,n,N])`` of the pruned forward with each of ``K`` rankings: per
    chunk of images one forward of the ``K`` rankings' kept tokens together (``progress``: a bar over them)."""
    logits, masks = [], []
    with torch.no_grad():
        for i in tqdm(range(0, len(cache), batch_size), desc=f"pruned forward, {len(scores)} rankings at L={depth}, "
                      f"b={budget:g}", unit="image batch", disable=not progress or len(cache) <= batch_size):
            hidden = cache.hidden[i:i + batch_size].to(device, torch.float32)
            out = prune_tokens(backbone, hidden.repeat(len(scores), 1, 1),
                               torch.cat([s[i:i + batch_size] for s in scores]).to(device), depth, budget)
            logits.append(out.logits.float().cpu().unflatten(0, (len(scores), -1)))
            masks.append(out.keep_mask.cpu().unflatten(0, (len(scores), -1)))
    return torch.cat(logits, 1), torch.cat(masks, 1)


def _load_images(dataset, n: int | Sequence[int], batch_size: int) -> Tensor:
    """Images of the first ``n`` items of ``dataset``, or of the positions ``n``."""
    idx = list(range(min(n, len(dataset)))) if isinstance(n, int) else [int(i) for i in n]
    sub = Subset(dataset, idx)
    return torch.cat([b.images for b in DataLoader(sub, batch_size=batch_size, collate_fn=collate_samples)])


def _insdel(backbone, ev: "_EvalSplit", scores: list[Tensor], steps: int, batch_size: int, device,
            progress: bool = False) -> list[InsDel]:
    """Token-space IDAUC of each of ``K`` rankings of the IDAUC images, from their tokens and all-token ``p_c``
    (embedded and classified once per split, :func:`_idauc_inputs`), the rankings of a chunk of images in one
    call; a ranking seen before in this split (the reference at another budget, the random ranking) is not
    measured twice (decision 0071). ``progress``: a bar over the chunks of images (the longest silent phase)."""
    keys = [hash((steps, s.numpy().tobytes())) for s in scores]
    new = list(dict.fromkeys(k for k in keys if k not in ev.insdel_memo))
    todo = [scores[keys.index(k)] for k in new]
    if todo:
        K, parts, (tokens, full), cls = len(todo), [], ev.idauc_inputs, ev.full_pred[ev.ipos]
        chunks = range(0, tokens.shape[0], batch_size)
        for i in tqdm(chunks, desc=f"insertion/deletion, {K} rankings", unit="image batch",
                      disable=not progress or len(chunks) < 2):
            sl = slice(i, i + batch_size)
            parts.append(insertion_deletion_auc(backbone, tokens[sl].to(device).repeat(K, 1, 1),
                                                torch.cat([s[sl] for s in todo]).to(device), steps,
                                                class_index=cls[sl].to(device).repeat(K), space="token",
                                                full_probs=full[sl].repeat(K)))

        def cat(name: str, k: int) -> Tensor:
            return torch.cat([getattr(p, name).float().cpu().unflatten(0, (K, -1))[k] for p in parts])
        for k, key in enumerate(new):
            ev.insdel_memo[key] = InsDel(cat("ins_auc", k), cat("del_auc", k), cat("idauc", k),
                                         parts[0].fractions.cpu(), cat("ins_curve", k), cat("del_curve", k),
                                         cat("class_index", k).long(), "token")
    return [ev.insdel_memo[k] for k in keys]


def _idauc_inputs(run: "_Run", eval_set, ipos: list[int], cls: Tensor) -> tuple[Tensor, Tensor]:
    """The IDAUC images' tokens ``[n,P+N,D]`` (``vit.embed_tokens``) and ``p_c`` with every token ``[n]``
    (``cls``: the full model's predictions): the same for every ranking, so computed once per split."""
    tokens, probs = [], []
    with torch.no_grad(), run.amp():
        for i in range(0, len(ipos), run.ebs):
            x = embed_tokens(run.backbone, _load_images(eval_set, ipos[i:i + run.ebs], run.ebs).to(run.device))
            logits = classify_tokens(run.backbone, run_blocks(run.backbone, x)).float()
            c = cls[i:i + run.ebs].to(run.device).view(-1, 1)
            tokens.append(x.cpu())
            probs.append(logits.softmax(-1).gather(1, c).squeeze(1).cpu())
    return torch.cat(tokens), torch.cat(probs)


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
            ``random``, ``random_map``, target ids such as ``T1``..``T5`` for ``supervised(Tk)``, scorer
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
            (:func:`midas_nb.data.evaluation_subset`); ``None``: all.
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
        ValueError: unknown conditions, empty seeds, bad depth or budget, a test image without a
            label (``-1``).
    """
    params = protocol_params(relaxation=relaxation, lam=lam, temperature=temperature, epochs=epochs,
                             batch_size=batch_size, lr=lr, idauc_steps=idauc_steps,
                             max_eval_images=max_eval_images, bootstrap=bootstrap, **settings)
    depth, budget = check_depth(backbone, depth), Budget(budget)
    conditions, seeds, _ = _check_conditions(conditions, seeds)
    table = protocol_cells(train_set, test_set, backbone,
                           cells=[(depth, budget, c, s) for c in conditions for s in seeds], dataset_name=dataset_name,
                           backbone_name=backbone_name, checkpoint_id=checkpoint_id, device=device,
                           cache_dir=cache_dir, progress=progress, prefetch_targets={depth: prefetch_targets}, **params)
    table.attrs["params"] = dict(params, depth=depth, budget=float(budget), conditions=conditions, seeds=seeds,
                                 checkpoint_id=checkpoint_id, dataset=dataset_name, backbone=backbone_name)
    return table


def protocol_cells(train_set, test_set, backbone: nn.Module, *, cells: Sequence[tuple[int, float, str, int]],
                   dataset_name: str, backbone_name: str, checkpoint_id: str, device: str | torch.device = "cpu",
                   cache_dir: str | Path | None = None, progress: bool = True,
                   prefetch_targets: Mapping[int, Sequence[str]] | None = None, **settings: Any) -> pd.DataFrame:
    """The rows of :func:`run_protocol` for the ``(L, budget, condition, seed)`` quadruples ``cells``, in their
    order, computed together (docs/decisions/0069): the target maps and the block-``L`` states of every depth
    from one pass over each split (:func:`midas_nb.targets.target_caches`, :func:`midas_nb.train.block_caches`),
    the full model's predictions once; per ``(L, b)``, the throughput once, the scorers not cached trained in one
    loop (:func:`midas_nb.train.load_or_train_scorers`) and every ranking's pruned forward and insertion/deletion
    forwards run together; a seedless condition's row computed once. Arguments and errors as
    :func:`run_protocol` (``settings``: the keys of :data:`PROTOCOL_DEFAULTS`; ``prefetch_targets``:
    ``{L: ids}``); ``df.attrs``: ``full_accuracy``, ``full_accuracy_ci``,
    ``throughput_full`` (of the last point), ``seconds``."""
    params = protocol_params(**settings)
    cells = [(check_depth(backbone, L), Budget(b), str(c), int(s)) for L, b, c, s in cells]
    _, _, groups = _check_conditions([c for *_, c, _ in cells], [s for *_, s in cells])
    depths = list(dict.fromkeys(L for L, *_ in cells))
    device = torch.device(device)
    ident = dict(checkpoint_id=checkpoint_id, dataset=dataset_name, backbone=backbone_name)
    backbone.to(device)
    # the weights every row was computed from (one checkpoint id could be retrained into other
    # bits on another machine; the digest makes that visible, and the caches key on it)
    run = _Run(backbone=backbone, depth=depths[0], budget=cells[0][1], params=params, ident=ident,
               weights_digest=state_dict_digest(backbone), device=device, ebs=int(params["eval_batch_size"]),
               cache_dir=cache_dir, progress=progress, amp=protocol_autocast(device, params["precision"]))
    t_start = time.perf_counter()
    # (capture unfuses the attention in place: the targets are computed before fused_attention)
    targets = _supervision_targets(run, train_set, groups["supervised"], depths, prefetch_targets)
    # a sweep cell is one (b, condition, seed): one cell draws no bar (it would hide the sweep's own)
    bar = tqdm(total=len(cells), desc="protocol", unit="condition", disable=not progress or len(cells) < 2)
    with bar, frozen(backbone), fused_attention(backbone):
        train_caches = {}
        if groups["trainable"]:
            train_caches = block_caches(backbone, train_set, depths=depths, key=dict(ident, split="train"),
                                        cache_dir=cache_dir, batch_size=run.ebs, device=device, progress=progress,
                                        full_logits=False, masks=False)
        evs = _evaluation_splits(run, test_set, depths)
        points, source = [], {}
        speeds = _throughputs(run, evs[depths[0]], list(dict.fromkeys((L, b) for L, b, _, _ in cells)))
        for L, b in speeds:
            at = replace(run, depth=L, budget=b)
            pairs = [(c, s) for LL, bb, c, s in cells if (LL, bb) == (L, b)]
            first = {}                      # a seedless condition: evaluated once, its row repeated per seed
            for c, s in pairs:
                first.setdefault(c, s if c in SEEDLESS_CONDITIONS else None)
            source.update({(L, b, c, s): (L, b, c, first[c] if first[c] is not None else s) for c, s in pairs})
            todo = list(dict.fromkeys((c, first[c] if first[c] is not None else s) for c, s in pairs))
            trained = _condition_scorers(at, todo, train_caches.get(L), targets.get(L, {}), groups["families"],
                                         evs[L].n_classes)
            points.append((at, evs[L], speeds[(L, b)], trained))
            bar.update(len(pairs))
        done = _evaluate(points, groups["families"])
    rows = {c: dict(done[source[c]], seed=c[-1]) for c in cells}
    table = make_table([rows[c] for c in cells])
    ev = evs[depths[-1]]
    table.attrs["full_accuracy"] = ev.full_accuracy
    table.attrs["full_accuracy_ci"] = bootstrap_ci(ev.full_correct, n_boot=int(params["bootstrap"]))
    table.attrs["throughput_full"] = points[-1][2].full
    table.attrs["seconds"] = time.perf_counter() - t_start
    return table


# ----------------------------------------------------------------------------------------------
# the steps of run_protocol


@dataclass
class _Run:
    """The settings one protocol run shares between its steps."""

    backbone: nn.Module
    depth: int
    budget: Budget
    params: dict[str, Any]
    ident: dict[str, str]
    weights_digest: str
    device: torch.device
    ebs: int
    cache_dir: str | Path | None
    progress: bool
    amp: Any                    # protocol_autocast's context factory


def _check_conditions(conditions: Sequence[str], seeds: Sequence[int]
                      ) -> tuple[list[str], list[int], dict[str, list[str]]]:
    """``(conditions without repeats, seeds, groups)``; ``groups``: ``families`` (scorer
    families with their own objective), ``supervised`` (the conditions that distil a target: the
    target ids and :data:`CONTROL_TARGETS`), ``trainable`` (both, plus ``unsupervised``).

    Raises:
        ValueError: unknown or no conditions, no seeds.
    """
    valid = list_conditions()
    unknown = [c for c in conditions if c not in valid]
    if unknown or not conditions:
        raise ValueError(f"unknown or no conditions {unknown or list(conditions)}; expected some of {valid}")
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise ValueError("seeds must hold at least one seed")
    conditions = list(dict.fromkeys(conditions))
    families = [c for c in conditions if c in set(list_scorer_conditions())]
    supervised = [c for c in conditions
                  if (c not in BASE_CONDITIONS or c in CONTROL_TARGETS) and c not in families]
    trainable = [c for c in conditions if c == "unsupervised" or c in supervised or c in families]
    return conditions, seeds, dict(families=families, supervised=supervised, trainable=trainable)


def _supervision_targets(run: _Run, train_set, supervised: list[str], depths: list[int],
                         prefetch: Mapping[int, Sequence[str]] | None) -> dict[int, dict[str, Tensor]]:
    """``{L: {condition: [n,N]}}``: the train-split maps of the supervised conditions' targets (label class
    rule) at each depth, from the target cache (:func:`condition_target`); one pass over the split for every
    depth, the ``prefetch[L]`` targets computed in it too."""
    if not supervised:
        return {}
    known = set(list_targets())
    ids = list(dict.fromkeys(condition_target(c) for c in supervised))
    wanted = {L: ids + [t for t in dict.fromkeys((prefetch or {}).get(L, ())) if t in known and t not in ids]
              for L in depths}
    with frozen(run.backbone):
        maps = target_caches(run.backbone, train_set, ids_by_depth=wanted, class_rule="label",
                             key=dict(run.ident, split="train", n=len(train_set)), cache_dir=run.cache_dir,
                             batch_size=run.ebs, device=run.device, progress=run.progress)
    return {L: {c: maps[L][condition_target(c)] for c in supervised} for L in depths}


@dataclass
class _EvalSplit:
    """The evaluated test images: their block-``L`` cache, the full model's predictions and the
    IDAUC subset (positions ``ipos`` into the cache, their tokens and all-token ``p_c``)."""

    eval_set: Any
    cache: BlockCache
    fingerprint: str
    full_pred: Tensor
    full_correct: Tensor
    full_accuracy: float
    has_parts: bool
    n_idauc: int
    ipos: list[int]
    idauc_inputs: tuple[Tensor, Tensor] | None
    n_classes: int
    #: the decoded images the throughput is timed on, by how many (decoded once per split)
    speed_images: dict[int, Tensor] = field(default_factory=dict)
    #: IDAUC by ranking (the hash of its scores on the IDAUC images): each distinct ranking is measured once
    insdel_memo: dict[int, InsDel] = field(default_factory=dict)


#: the evaluation splits of the last :func:`run_protocol` call of this process, by depth: consecutive cells
#: of one (dataset, backbone) — a sweep worker's chunk, a notebook's calls — load the test split's block-L
#: states once per L and embed its IDAUC images once (docs/decisions/0063, 0069, 0071)
_EVAL_MEMO: dict[tuple, dict[int, _EvalSplit]] = {}


def _evaluation_splits(run: _Run, test_set, depths: list[int]) -> dict[int, _EvalSplit]:
    """``{L: split}`` of ``depths``: the block states of the depths not in the memo from one pass; the
    decoded images kept for the next call."""
    p = run.params
    subset = evaluation_subset(len(test_set), p["max_eval_images"], p["eval_subset_seed"])
    eval_set = test_set if len(subset) == len(test_set) else Subset(test_set, subset)
    key = (run.weights_digest, tuple(sorted(run.ident.items())), run.ebs, str(run.device),
           str(run.cache_dir), dataset_identity(eval_set).full, tuple(subset), p["max_idauc_images"],
           p["eval_subset_seed"], p["idauc_steps"] > 0, p["precision"])
    if key not in _EVAL_MEMO:
        _EVAL_MEMO.clear()
        _EVAL_MEMO[key] = {}
    memo = _EVAL_MEMO[key]
    if missing := [L for L in depths if L not in memo]:
        memo.update(_read_evaluation_split(run, test_set, subset, eval_set, missing, next(iter(memo.values()), None)))
    for L in [L for L in memo if L not in depths]:      # the states of other depths are not held
        del memo[L]
    return {L: memo[L] for L in depths}


def _read_evaluation_split(run: _Run, test_set, subset: list[int], eval_set, depths: list[int],
                           known: _EvalSplit | None) -> dict[int, _EvalSplit]:
    """The splits of ``depths``; the IDAUC inputs, decoded images and measured rankings of ``known`` (a split of
    another depth) shared."""
    p = run.params
    caches = block_caches(run.backbone, eval_set, depths=depths,
                          key=dict(run.ident, split="test", subset=key_hash({"i": subset})),
                          cache_dir=run.cache_dir, batch_size=run.ebs, device=run.device, progress=run.progress)
    cache = caches[depths[0]]
    n_eval = len(cache)
    unlabelled = int((cache.labels < 0).sum())
    if unlabelled:  # accuracy against label -1 would be 0 for every condition, stored as a result
        raise ValueError(f"the test split has {unlabelled} of {n_eval} evaluated images without a label (-1); the "
                         "protocol's accuracies need labels (Stanford Cars: cars_test_annos_withlabels.mat)")
    fingerprint = dataset_identity(eval_set).full     # the evaluated images, by content
    full_pred = cache.logits.argmax(-1)               # the full model's logits: the same at every L
    full_correct = (full_pred == cache.labels).float()
    n_idauc = n_eval if p["max_idauc_images"] is None else min(n_eval, int(p["max_idauc_images"]))
    # IDAUC images: a seeded random subset of the evaluated ones (test splits are ordered by
    # class, so the first n would cover only the first classes), the same for every row
    ipos = evaluation_subset(n_eval, n_idauc, int(p["eval_subset_seed"]) + 1)
    if known is not None:   # the tokens, p_c, decoded images and measured rankings are the same at every L
        idauc_inputs, speed_images, insdel_memo = known.idauc_inputs, known.speed_images, known.insdel_memo
    else:
        idauc_inputs = (_idauc_inputs(run, eval_set, ipos, full_pred[ipos]) if p["idauc_steps"] > 0 and n_idauc > 0
                        else None)
        speed_images, insdel_memo = {}, {}
    return {L: _EvalSplit(eval_set=eval_set, cache=caches[L], fingerprint=fingerprint, full_pred=full_pred,
                          full_correct=full_correct, full_accuracy=float(full_correct.mean()),
                          has_parts=bool(getattr(test_set, "has_parts", True)), n_idauc=n_idauc, ipos=ipos,
                          idauc_inputs=idauc_inputs, n_classes=int(cache.logits.shape[-1]),
                          speed_images=speed_images, insdel_memo=insdel_memo) for L in depths}


@dataclass
class _Speed:
    """Throughput (images/s) of the full model and of the pruned forward per scorer kind, and
    the images it was measured on."""

    full: float
    pruned: dict[str, float]
    images: Tensor


#: throughputs measured in this process, by (weights digest, evaluated images, images timed,
#: repeats, device, L, b, scorer kinds and width): the pruned forward's cost depends on the
#: architecture, L and b, not on the scorer's weights, so the cells of one (backbone, L, b) share
#: one measurement instead of timing the same computation once per cell (and the points of one
#: protocol_cells call are measured together: decision 0069)
_SPEED_MEMO: dict[tuple, dict[str, float]] = {}

def _throughputs(run: _Run, ev: _EvalSplit, points: list[tuple[int, Budget]]) -> dict[tuple[int, Budget], _Speed]:
    """The :class:`_Speed` of each point ``(L, b)``: the points not measured yet in this process in one
    interleaved measurement (the full model timed once for all of them; ``ev``: a split of any depth)."""
    p = run.params
    backbone, device = run.backbone, run.device
    n_timed = int(p["throughput_batch"])
    if n_timed not in ev.speed_images:
        ev.speed_images[n_timed] = _load_images(ev.eval_set, n_timed, run.ebs)
    tp_images = ev.speed_images[n_timed].to(device)
    reps = int(p["throughput_repeats"])
    # every scorer kind, whatever this call evaluates: rows of separate calls (notebook 06's MIDAS
    # conditions and scorer families) then share one interleaved measurement and compare
    kinds = ["reference", "random", "mlp"] + list(list_scorer_conditions())
    key = (run.weights_digest, ev.fingerprint, tuple(tp_images.shape), reps, str(device), tuple(kinds),
           p["mlp_hidden"], p["precision"])
    if todo := [pt for pt in points if key + pt not in _SPEED_MEMO]:
        scorers = speed_scorers(kinds, ev.cache.hidden.shape[-1], p["mlp_hidden"], ev.n_classes, device)
        with run.amp():
            full, pruned = measure_speed(backbone, tp_images, todo, scorers, repeats=reps, progress=run.progress)
        _SPEED_MEMO.update({key + pt: dict(pruned[pt], full=full) for pt in todo})
    return {pt: _Speed(full=_SPEED_MEMO[key + pt]["full"], pruned=_SPEED_MEMO[key + pt], images=tp_images)
            for pt in points}           # (pruned: by kind; its "full" is never a row's kind)


@dataclass
class _Trained:
    """A condition's scorer and its training record (``kind``: the scorer column)."""

    scorer: TokenScorer
    kind: str
    target_id: str
    relaxation: str
    info: dict[str, Any]


def _train_info(result: Any, loaded: bool) -> dict[str, Any]:
    return dict(train_loss=result.loss[-1] if result.loss else float("nan"),
                train_accuracy=result.train_accuracy[-1] if result.train_accuracy else float("nan"),
                train_seconds=result.seconds, from_cache=loaded)


def _condition_scorers(run: _Run, pairs: list[tuple[str, int]], train_cache: BlockCache | None,
                       targets: dict[str, Tensor], families: list[str], n_classes: int) -> dict[tuple[str, int], _Trained]:
    """The scorer of each ``(condition, seed)``: built (``reference``, ``random``) or trained and cached
    (:func:`midas_nb.train.load_or_train_scorers`; the MLP conditions in one loop)."""
    p = run.params
    none = dict(train_loss=float("nan"), train_accuracy=float("nan"), train_seconds=0.0, from_cache=False)
    common = dict(depth=run.depth, budget=run.budget, cache_dir=run.cache_dir, device=run.device,
                  progress=run.progress, epochs=p["epochs"], batch_size=p["batch_size"], lr=p["lr"],
                  weight_decay=p["weight_decay"])
    ident = run.ident if p["precision"] == "float32" else dict(run.ident, precision=p["precision"])  # cached apart
    out, mlp = {}, []
    for cond, seed in pairs:
        if cond == "reference":
            out[(cond, seed)] = _Trained(ReferenceScorer(), "reference", "T0", "", none)
        elif cond == "random":
            out[(cond, seed)] = _Trained(RandomScorer(seed), "random", "", "", none)
        elif cond in families:      # a scorer family with its own objective
            with run.amp():
                scorer, result, loaded = load_or_train_scorer(
                    run.backbone, train_cache, key=dict(ident, condition=cond, target=""), targets=None,
                    scorer=cond, scorer_kwargs=dict(num_classes=n_classes), seed=seed, **common)
            out[(cond, seed)] = _Trained(scorer, cond, "", "", _train_info(result, loaded))
        else:
            mlp.append((cond, seed))
    if mlp:   # target id: "" (unsupervised), Tk, or a control's target
        with run.amp():
            got = load_or_train_scorers(
                run.backbone, train_cache, keys=[dict(ident, condition=c, target=condition_target(c)) for c, _ in mlp],
                targets=[targets.get(c) for c, _ in mlp], seeds=[s for _, s in mlp], mlp_hidden=p["mlp_hidden"],
                relaxation=p["relaxation"], lam=p["lam"], temperature=p["temperature"],
                distill_form=p["distill_form"], mask_temperature=p["mask_temperature"], **common)
        for (cond, seed), (scorer, result, loaded) in zip(mlp, got):
            out[(cond, seed)] = _Trained(scorer, "mlp", condition_target(cond), p["relaxation"],
                                         _train_info(result, loaded))
    return out


def _evaluate(points: list[tuple[_Run, _EvalSplit, _Speed, dict[tuple[str, int], _Trained]]],
              families: list[str]) -> dict[tuple[int, Budget, str, int], dict[str, Any]]:
    """The results row of each ``(L, b, condition, seed)`` of the points ``(run, split, speed, scorers)``: its
    ranking of the evaluated images, scored. Per point the pruned forwards of all rankings run together;
    the insertion/deletion forwards of every point's rankings too (the IDAUC tokens and the full model's
    classes are the same at every L; a ranking met before is not measured again, :func:`_insdel`), so many
    that a forward holds at most as many images as the largest point's rankings times ``eval_batch_size``."""
    evaluated, ranked = [], []
    for run, ev, _, trained in points:
        scores = [_scores(t.scorer, ev.cache, run.ebs, run.device) for t in trained.values()]
        evaluated.append((scores, *_pruned_eval(run.backbone, ev.cache, scores, run.depth, run.budget, run.ebs,
                                                run.device, run.progress)))
        ranked += [s[ev.ipos] for s in scores]
    run, ev = points[0][:2]
    insdels: list[Any] = [None] * len(ranked)
    if ev.idauc_inputs is not None:
        per_call = max(len(p[3]) for p in points) * run.ebs // min(run.ebs, ev.n_idauc)
        with run.amp():
            insdels = [d for i in range(0, len(ranked), per_call)
                       for d in _insdel(run.backbone, ev, ranked[i:i + per_call], run.params["idauc_steps"],
                                        run.ebs, run.device, run.progress)]
    rows, i = {}, 0
    for (run, ev, speed, trained), (scores, logits, keep_masks) in zip(points, evaluated):
        for j, ((cond, seed), t) in enumerate(trained.items()):
            rows[(run.depth, run.budget, cond, seed)] = _row(run, ev, speed, cond, seed, t, scores[j], logits[j],
                                                             keep_masks[j], insdels[i], cond in families)
            i += 1
    return rows


def _row(run: _Run, ev: _EvalSplit, speed: _Speed, cond: str, seed: int, t: _Trained, scores: Tensor,
         logits: Tensor, keep_mask: Tensor, insdel: InsDel | None, is_family: bool) -> dict[str, Any]:
    p, backbone, device, cache = run.params, run.backbone, run.device, ev.cache
    coverage = (part_miou(keep_mask, cache.part_mask) if ev.has_parts
                else box_coverage(keep_mask, cache.box_mask))
    correct = (logits.argmax(-1) == cache.labels).float()
    in_box = point_in_box(scores, cache.box_mask)
    id_ = run.ident
    row = dict(dataset=id_["dataset"], backbone=id_["backbone"], checkpoint_id=id_["checkpoint_id"],
               condition=cond, target=t.target_id, relaxation=t.relaxation, depth=run.depth,
               budget=run.budget, seed=seed, device=str(device), precision=p["precision"],
               throughput=speed.pruned[t.kind], scorer=t.kind)
    row.update(summarise_metrics(coverage, insdel, correct, in_box, n_boot=int(p["bootstrap"])))
    # per-image values with the image ids, for paired intervals (decoupling_D) and the
    # seed × image bootstrap (aggregate_seeds); NaN where an image has no visible part
    row.update(image_ids=list(cache.image_ids),
               miou_per_image=[float(v) for v in coverage.per_image.tolist()],
               idauc_image_ids=[cache.image_ids[i] for i in ev.ipos] if insdel is not None else [],
               idauc_per_image=[float(v) for v in insdel.idauc.tolist()] if insdel is not None else [],
               accuracy_per_image=[float(v) for v in correct.tolist()],
               weights_digest=run.weights_digest, dataset_fingerprint=ev.fingerprint)
    row.update(pib_centre=float(centre_in_box(cache.box_mask, grid_size(backbone)).float().mean()),
               pib_box_area=float(box_share(cache.box_mask).mean()))
    ref = cache.part_mask if ev.has_parts else cache.box_mask     # the best IoU any ranking reaches (decision 0041)
    row.update(n_images=len(cache), full_accuracy=ev.full_accuracy,
               iou_ceiling=float(iou_ceiling(ref, int(keep_mask[0].sum()), boxes=not ev.has_parts).nanmean()),
               agreement=float((logits.argmax(-1) == ev.full_pred).float().mean()),
               throughput_full=speed.full, speedup=speed.pruned[t.kind] / speed.full,
               n_idauc_images=ev.n_idauc if insdel is not None else 0,
               lambda_ga=float(p["lam"]) if t.target_id and cond != "reference" else 0.0,
               temperature=float(p["temperature"]), distill_form=p["distill_form"],
               epochs=int(p["epochs"]) if t.kind not in ("reference", "random") else 0, **t.info)
    if is_family:
        row.update(family_readout(
            t.scorer, backbone, cache.hidden, cache.labels, scores, depth=run.depth, budget=run.budget,
            num_prefix=cache.num_prefix, images=speed.images))
    return row
