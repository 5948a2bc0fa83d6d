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

This module holds the settings, the conditions and their scorers; the evaluation on the test split
(the evaluated images, the throughput, each row) is :mod:`midas_nb.analysis.evaluation`.
"""
from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

import pandas as pd
import torch
from torch import Tensor, nn

from ..backbones.vit import fused_attention
from ..config import PRECISIONS
from ..identity import state_dict_digest
from ..metrics import bootstrap_ci
from ..point import Budget
from ..progress import tqdm
from ..pruning import check_depth
from ..results import make_table
from ..scorers import list_scorer_conditions, RandomScorer, ReferenceScorer
from ..targets import list_targets, target_caches
from ..train import BlockCache, block_caches, frozen, load_or_train_scorer, load_or_train_scorers
from .evaluation import evaluate_points, evaluation_splits, ProtocolRun, scorer_kind, throughputs, TrainedScorer

__all__ = ["BASE_CONDITIONS", "CONTROL_TARGETS", "SEEDLESS_CONDITIONS", "condition_target", "PROTOCOL_DEFAULTS",
           "list_conditions", "protocol_params", "with_band_check", "fused_attention", "run_protocol", "protocol_cells"]

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
    epochs=4, batch_size=64, lr=1e-3, weight_decay=0.01,
    mlp_hidden=None,          # None: D // 2
    idauc_steps=10,
    max_eval_images=None,     # None: the whole test split; else a seeded random subset
    max_idauc_images=None,    # None: every evaluated image
    eval_subset_seed=0, bootstrap=1000, eval_batch_size=64, throughput_batch=16, throughput_repeats=3,
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
    if condition == "reference" or condition in CONTROL_TARGETS:
        return CONTROL_TARGETS.get(condition, "T0")
    return "" if condition in BASE_CONDITIONS or condition in list_scorer_conditions() else condition


def protocol_params(**overrides: Any) -> dict[str, Any]:
    """:data:`PROTOCOL_DEFAULTS` with ``overrides`` merged in.

    Raises:
        ValueError: for a key that is not a protocol setting.
    """
    unknown = sorted(set(overrides) - set(PROTOCOL_DEFAULTS))
    if unknown:
        raise ValueError(f"unknown protocol setting(s) {unknown}; expected some of {sorted(PROTOCOL_DEFAULTS)}")
    return dict(PROTOCOL_DEFAULTS, **overrides)


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


def run_protocol(train_set, test_set, backbone: nn.Module, *, depth: int, budget: float, conditions: Sequence[str],
                 seeds: Sequence[int], dataset_name: str, backbone_name: str, checkpoint_id: str,
                 relaxation: Literal["st", "soft"] = "st", lam: float = 1.0, temperature: float = 1.0, epochs: int = 4,
                 batch_size: int = 64, lr: float = 1e-3, idauc_steps: int = 10, max_eval_images: int | None = None,
                 bootstrap: int = 1000, device: str | torch.device = "cpu", cache_dir: str | Path | None = None,
                 progress: bool = True, prefetch_targets: Sequence[str] = (), **settings: Any) -> pd.DataFrame:
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
    run = ProtocolRun(backbone=backbone, depth=depths[0], budget=cells[0][1], params=params, ident=ident,
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
        evs = evaluation_splits(run, test_set, depths)
        points, source = [], {}
        wanted: dict[tuple[int, Budget], list[str]] = {}
        for L, b, c, _ in cells:        # the scorer kinds of each point's rows (decision 0092)
            wanted.setdefault((L, b), []).append(scorer_kind(c, groups["families"]))
        speeds = throughputs(run, evs[depths[0]], {pt: list(dict.fromkeys(ks)) for pt, ks in wanted.items()})
        for L, b in speeds:
            at = replace(run, depth=L, budget=b)
            pairs = [(c, s) for LL, bb, c, s in cells if (LL, bb) == (L, b)]
            # a seedless condition: evaluated once, its row repeated per seed
            first = {c: s for c, s in reversed(pairs) if c in SEEDLESS_CONDITIONS}
            source.update({(L, b, c, s): (L, b, c, first.get(c, s)) for c, s in pairs})
            todo = list(dict.fromkeys((c, first.get(c, s)) for c, s in pairs))
            trained = _condition_scorers(at, todo, train_caches.get(L), targets.get(L, {}), groups["families"],
                                         evs[L].n_classes)
            points.append((at, evs[L], speeds[(L, b)], trained))
            bar.update(len(pairs))
        done = evaluate_points(points, groups["families"])
    table, ev = make_table([dict(done[source[c]], seed=c[-1]) for c in cells]), evs[depths[-1]]
    table.attrs.update(full_accuracy=ev.full_accuracy,
                       full_accuracy_ci=bootstrap_ci(ev.full_correct, n_boot=int(params["bootstrap"])),
                       throughput_full=next(iter(points[-1][2].full.values())), seconds=time.perf_counter() - t_start)
    return table

# ----------------------------------------------------------------------------------------------
# the steps of run_protocol before the evaluation (midas_nb.analysis.evaluation)


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
    supervised = [c for c in conditions if (c not in BASE_CONDITIONS or c in CONTROL_TARGETS) and c not in families]
    trainable = [c for c in conditions if c == "unsupervised" or c in supervised or c in families]
    return conditions, seeds, dict(families=families, supervised=supervised, trainable=trainable)


def _supervision_targets(run: ProtocolRun, train_set, supervised: list[str], depths: list[int],
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


def _train_info(result: Any, loaded: bool) -> dict[str, Any]:
    return dict(train_loss=result.loss[-1] if result.loss else float("nan"),
                train_accuracy=result.train_accuracy[-1] if result.train_accuracy else float("nan"),
                train_seconds=result.seconds, from_cache=loaded)


def _condition_scorers(run: ProtocolRun, pairs: list[tuple[str, int]], train_cache: BlockCache | None,
                       targets: dict[str, Tensor], families: list[str], n_classes: int) -> dict[tuple[str, int], TrainedScorer]:
    """The scorer of each ``(condition, seed)``: built (``reference``, ``random``) or trained and cached
    (:func:`midas_nb.train.load_or_train_scorers`; the MLP conditions in one loop)."""
    p = run.params
    none = dict(train_loss=float("nan"), train_accuracy=float("nan"), train_seconds=0.0, from_cache=False)
    common = dict(depth=run.depth, budget=run.budget, cache_dir=run.cache_dir, device=run.device,
                  progress=run.progress, epochs=p["epochs"], batch_size=p["batch_size"], lr=p["lr"],
                  weight_decay=p["weight_decay"], weights_digest=run.weights_digest)
    ident = run.ident if p["precision"] == "float32" else dict(run.ident, precision=p["precision"])  # cached apart
    out, mlp = {}, []
    for cond, seed in pairs:
        if (kind := scorer_kind(cond, families)) == "reference":
            out[(cond, seed)] = TrainedScorer(ReferenceScorer(), kind, "T0", "", none)
        elif kind == "random":
            out[(cond, seed)] = TrainedScorer(RandomScorer(seed), kind, "", "", none)
        elif kind == "mlp":
            mlp.append((cond, seed))
        else:      # a scorer family with its own objective
            with run.amp():
                scorer, result, loaded = load_or_train_scorer(
                    run.backbone, train_cache, key=dict(ident, condition=cond, target=""), targets=None,
                    scorer=cond, scorer_kwargs=dict(num_classes=n_classes), seed=seed, **common)
            out[(cond, seed)] = TrainedScorer(scorer, kind, "", "", _train_info(result, loaded))
    if mlp:   # target id: "" (unsupervised), Tk, or a control's target
        with run.amp():
            got = load_or_train_scorers(
                run.backbone, train_cache, keys=[dict(ident, condition=c, target=condition_target(c)) for c, _ in mlp],
                targets=[targets.get(c) for c, _ in mlp], seeds=[s for _, s in mlp], mlp_hidden=p["mlp_hidden"],
                relaxation=p["relaxation"], lam=p["lam"], temperature=p["temperature"],
                distill_form=p["distill_form"], mask_temperature=p["mask_temperature"], **common)
        for (cond, seed), (scorer, result, loaded) in zip(mlp, got):
            out[(cond, seed)] = TrainedScorer(scorer, "mlp", condition_target(cond), p["relaxation"],
                                         _train_info(result, loaded))
    return out

