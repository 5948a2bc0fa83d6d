"""The evaluation step of the three-condition protocol (:mod:`midas_nb.analysis.protocol`, DESIGN.md §5, §6):
the evaluated test split (:class:`EvalSplit`: block-``L`` states, the full model's predictions, the IDAUC
images' tokens and all-token ``p_c``; read once per process and depth), the throughput of each point ``(L, b)``
(:func:`throughputs`, one interleaved measurement) and the results row of each condition × seed
(:func:`evaluate_points`): its ranking of the evaluated images, the pruned forward's kept mask and
prediction, part mIoU (box coverage), token-space IDAUC, accuracy and Point-in-Box with their per-image
values. The row columns are those :func:`midas_nb.analysis.protocol.run_protocol` documents.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Subset

from ..backbones.vit import classify_tokens, embed_tokens, grid_size, run_blocks
from ..data import collate_samples, evaluation_subset
from ..identity import dataset_identity
from ..metrics import (InsDel, box_coverage, box_share, centre_in_box, family_readout, insertion_deletion_auc,
                       iou_ceiling, measure_speed, part_miou, point_in_box)
from ..point import Budget
from ..progress import tqdm
from ..pruning import prune_tokens
from ..results import summarise_metrics
from ..scorers import RandomScorer, ReferenceScorer, speed_scorers, TokenScorer
from ..train import BlockCache, block_caches, key_hash

__all__ = ["ProtocolRun", "TrainedScorer", "EvalSplit", "Speed", "evaluation_splits", "scorer_kind", "throughputs",
           "evaluate_points"]


@dataclass
class ProtocolRun:
    """The settings one protocol run shares between its steps (:func:`midas_nb.analysis.protocol.protocol_cells`
    makes it; ``amp``: :func:`~midas_nb.analysis.protocol.protocol_autocast`'s context factory)."""

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
    amp: Any


@dataclass
class TrainedScorer:
    """A condition's scorer and its training record (``kind``: the scorer column)."""

    scorer: TokenScorer
    kind: str
    target_id: str
    relaxation: str
    info: dict[str, Any]


@dataclass
class EvalSplit:
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


#: the evaluation splits of the last :func:`~midas_nb.analysis.protocol.run_protocol` call of this process, by depth: consecutive cells
#: of one (dataset, backbone) — a sweep worker's chunk, a notebook's calls — load the test split's block-L
#: states once per L and embed its IDAUC images once (docs/decisions/0063, 0069, 0071)
_EVAL_MEMO: dict[tuple, dict[int, EvalSplit]] = {}


def evaluation_splits(run: ProtocolRun, test_set, depths: list[int]) -> dict[int, EvalSplit]:
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
    memo = _EVAL_MEMO.setdefault(key, {})
    if missing := [L for L in depths if L not in memo]:
        memo.update(_read_evaluation_split(run, test_set, subset, eval_set, missing, next(iter(memo.values()), None)))
    for L in [L for L in memo if L not in depths]:      # the states of other depths are not held
        del memo[L]
    return {L: memo[L] for L in depths}


def _read_evaluation_split(run: ProtocolRun, test_set, subset: list[int], eval_set, depths: list[int],
                           known: EvalSplit | None) -> dict[int, EvalSplit]:
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
    return {L: EvalSplit(eval_set=eval_set, cache=caches[L], fingerprint=fingerprint, full_pred=full_pred,
                          full_correct=full_correct, full_accuracy=float(full_correct.mean()),
                          has_parts=bool(getattr(test_set, "has_parts", True)), n_idauc=n_idauc, ipos=ipos,
                          idauc_inputs=idauc_inputs, n_classes=int(cache.logits.shape[-1]),
                          speed_images=speed_images, insdel_memo=insdel_memo) for L in depths}


def _scores(scorer: TokenScorer, cache: BlockCache, batch_size: int, device) -> Tensor:
    """``[n,N]`` scores of a scorer over a cache (reference: the cached T0)."""
    if isinstance(scorer, ReferenceScorer):
        return cache.cls_attn.clone()
    if isinstance(scorer, RandomScorer):
        scorer.reset()
    with torch.no_grad():
        return torch.cat([scorer(cache.hidden[i:i + batch_size].to(device, torch.float32), cache.num_prefix).float()
                          for i in range(0, len(cache), batch_size)]).cpu()


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


def _insdel(backbone, ev: "EvalSplit", scores: list[Tensor], steps: int, batch_size: int, device,
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


def _idauc_inputs(run: "ProtocolRun", eval_set, ipos: list[int], cls: Tensor) -> tuple[Tensor, Tensor]:
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


@dataclass
class Speed:
    """Throughput (images/s) of the pruned forward per scorer kind at one point, the full model's of the
    measurement each kind's was taken in, and the images it was measured on."""

    full: dict[str, float]
    pruned: dict[str, float]
    images: Tensor


#: throughputs measured in this process, by (weights digest, evaluated images, images timed, repeats, device,
#: scorer width, precision, L, b, scorer kind): the pruned forward's cost depends on the architecture, L, b and
#: the scorer kind, not on the scorer's weights, so the cells of one (backbone, L, b) share a measurement instead
#: of timing the same computation once per cell (and the points of one protocol_cells call are measured
#: together: decision 0069); each entry ``(pruned, full)``: its rate and the full model's of its measurement
_SPEED_MEMO: dict[tuple, tuple[float, float]] = {}


def scorer_kind(condition: str, families: Sequence[str]) -> str:
    """The scorer kind (the ``scorer`` column) of a condition's rows: ``reference``, ``random``, a scorer family,
    else ``mlp``."""
    return condition if condition in ("reference", "random") or condition in families else "mlp"


def throughputs(run: ProtocolRun, ev: EvalSplit, wanted: dict[tuple[int, Budget], Sequence[str]]
                ) -> dict[tuple[int, Budget], Speed]:
    """The :class:`Speed` of each point ``(L, b)`` for the scorer kinds ``wanted`` there (those of the call's
    rows, decision 0092): the kinds not measured yet in this process, at the points that lack one, in one
    interleaved measurement (the full model timed once for all of them; ``ev``: a split of any depth)."""
    p = run.params
    if (n_timed := int(p["throughput_batch"])) not in ev.speed_images:
        ev.speed_images[n_timed] = _load_images(ev.eval_set, n_timed, run.ebs)
    tp_images = ev.speed_images[n_timed].to(run.device)
    reps = int(p["throughput_repeats"])
    key = (run.weights_digest, ev.fingerprint, tuple(tp_images.shape), reps, str(run.device), p["mlp_hidden"],
           p["precision"])
    missing = {pt: [k for k in kinds if key + pt + (k,) not in _SPEED_MEMO] for pt, kinds in wanted.items()}
    if todo := [pt for pt, kinds in missing.items() if kinds]:
        kinds = list(dict.fromkeys(k for pt in todo for k in missing[pt]))
        scorers = speed_scorers(kinds, ev.cache.hidden.shape[-1], p["mlp_hidden"], ev.n_classes, run.device)
        with run.amp():
            full, pruned = measure_speed(run.backbone, tp_images, todo, scorers, repeats=reps, progress=run.progress)
        _SPEED_MEMO.update({key + pt + (k,): (rate, full) for pt in todo for k, rate in pruned[pt].items()})
    got = {pt: {k: _SPEED_MEMO[key + pt + (k,)] for k in kinds if key + pt + (k,) in _SPEED_MEMO}
           for pt, kinds in wanted.items()}      # (a family that cannot be built at this width has no rows)
    return {pt: Speed(full={k: f for k, (_, f) in rates.items()}, pruned={k: r for k, (r, _) in rates.items()},
                      images=tp_images) for pt, rates in got.items()}


def evaluate_points(points: list[tuple[ProtocolRun, EvalSplit, Speed, dict[tuple[str, int], TrainedScorer]]],
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


def _row(run: ProtocolRun, ev: EvalSplit, speed: Speed, cond: str, seed: int, t: TrainedScorer, scores: Tensor,
         logits: Tensor, keep_mask: Tensor, insdel: InsDel | None, is_family: bool) -> dict[str, Any]:
    p, backbone, device, cache = run.params, run.backbone, run.device, ev.cache
    coverage = part_miou(keep_mask, cache.part_mask) if ev.has_parts else box_coverage(keep_mask, cache.box_mask)
    correct = (logits.argmax(-1) == cache.labels).float()
    in_box = point_in_box(scores, cache.box_mask)
    id_ = run.ident
    row = dict(dataset=id_["dataset"], backbone=id_["backbone"], checkpoint_id=id_["checkpoint_id"], condition=cond,
               target=t.target_id, relaxation=t.relaxation, depth=run.depth, budget=run.budget, seed=seed,
               device=str(device), precision=p["precision"], throughput=speed.pruned[t.kind], scorer=t.kind)
    row.update(summarise_metrics(coverage, insdel, correct, in_box, n_boot=int(p["bootstrap"])))
    # per-image values with the image ids, for paired intervals (decoupling_D) and the
    # seed × image bootstrap (aggregate_seeds); NaN where an image has no visible part
    row.update(image_ids=list(cache.image_ids), miou_per_image=[float(v) for v in coverage.per_image.tolist()],
               idauc_image_ids=[cache.image_ids[i] for i in ev.ipos] if insdel is not None else [],
               idauc_per_image=[float(v) for v in insdel.idauc.tolist()] if insdel is not None else [],
               accuracy_per_image=[float(v) for v in correct.tolist()], weights_digest=run.weights_digest,
               dataset_fingerprint=ev.fingerprint)
    row.update(pib_centre=float(centre_in_box(cache.box_mask, grid_size(backbone)).float().mean()),
               pib_box_area=float(box_share(cache.box_mask).mean()))
    ref = cache.part_mask if ev.has_parts else cache.box_mask     # the best IoU any ranking reaches (decision 0041)
    row.update(n_images=len(cache), full_accuracy=ev.full_accuracy,
               iou_ceiling=float(iou_ceiling(ref, int(keep_mask[0].sum()), boxes=not ev.has_parts).nanmean()),
               agreement=float((logits.argmax(-1) == ev.full_pred).float().mean()),
               throughput_full=speed.full[t.kind], speedup=speed.pruned[t.kind] / speed.full[t.kind],
               n_idauc_images=ev.n_idauc if insdel is not None else 0,
               lambda_ga=float(p["lam"]) if t.target_id and cond != "reference" else 0.0,
               temperature=float(p["temperature"]), distill_form=p["distill_form"],
               epochs=int(p["epochs"]) if t.kind not in ("reference", "random") else 0, **t.info)
    if is_family:
        row.update(family_readout(t.scorer, backbone, cache.hidden, cache.labels, scores, depth=run.depth,
                                  budget=run.budget, num_prefix=cache.num_prefix, images=speed.images))
    return row
