"""One table of the related methods beside the MIDAS conditions (notebook 06).

:func:`related_table` merges three kinds of rows into one frame (``kind`` column):

- ``"pruning"`` — every protocol condition at ``(L, b)`` (MIDAS conditions, ``cropr``,
  ``iared``): part mIoU, IDAUC, accuracy with 95 % intervals of the mean over seeds
  (a t interval over seeds plus a bootstrap over images, :func:`midas_nb.results.aggregate_seeds`) and seed std, ``D`` with its parity-band status (:func:`midas_nb.metrics.decoupling_D`),
  Point-in-Box of the scorer's top patch beside its centre-patch and box-area baselines
  (``pib_centre``, ``pib_box_area``), throughput and speed-up, and the families' extra
  columns (Cropr's last-layer fusion, IA-RED²'s 0.5-threshold keep rate);
- ``"relevance map"`` — TokenTM's positive/negative perturbation AUCs of target maps
  (:func:`~midas_nb.metrics.perturbation.perturbation_table`; by default
  :data:`PERTURBATION_MAPS`, with the rollout over all blocks);
- ``"backbone"`` — Point-in-Box of the Patch Score with its baselines and its paired difference
  to the backbone, and accuracy, of the backbone and its LaSt (and CLS-control) fine-tunes
  (:func:`~midas_nb.analysis.last.pib_table`).

Every LaSt row says its ``K`` (tokens selected per channel) in ``last_K``: the ``last_votes``
pruning row :data:`midas_nb.targets.LAST_VOTES_K`, the LaSt fine-tune its aggregation's ``K``
(also in its name, e.g. ``LaSt fine-tune (K=1)``).

:func:`run_related` computes all three from a :class:`midas_nb.study.Study` and returns them
with the merged table.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import pandas as pd
from torch import nn

from ..metrics import BUILD_COLUMN, CHECKPOINT_COLUMNS, SPEED_ROUNDS, decoupling_D
from .verdict import paired_gap
from ..results import aggregate_seeds, compact, format_ci, METRIC_COLUMNS
from ..targets import LAST_VOTES_K
from .last import LAST_FINETUNE_K, last_finetune, pib_table
from ..metrics.perturbation import perturbation_table

__all__ = ["RELATED_CONDITIONS", "PERTURBATION_MAPS", "FAMILY_COLUMNS", "related_table", "RelatedResults",
           "run_related", "speed_table", "speed_note", "family_table", "training_caveats"]

#: conditions of notebook 06 (MIDAS conditions, related targets, related scorer families)
RELATED_CONDITIONS: tuple[str, ...] = ("reference", "unsupervised", "T3", "T5", "tokentm", "rollout",
                                       "last_votes", "cropr", "iared")
#: maps compared by the perturbation tests (TokenTM's comparison). TokenTM, T3 and the rollout explain
#: the model output, so the rollout is ``rollout_full`` (all blocks), not the block-1..L target
#: ``rollout``; T5 is the block-L map of the MIDAS taxonomy
PERTURBATION_MAPS: tuple[str, ...] = ("tokentm", "rollout_full", "T3", "T5")
#: per-row columns that only some scorer families fill; averaged over seeds when present
FAMILY_COLUMNS: tuple[str, ...] = ("pib_centre", "pib_box_area", "speedup", "full_accuracy", "throughput_full",
                                   "accuracy_llf", "accuracy_llf_lo", "accuracy_llf_hi", "throughput_llf",
                                   "llf_speed_ratio", "aux_accuracy", "threshold_keep_rate", "threshold_accuracy",
                                   "threshold_accuracy_lo", "threshold_accuracy_hi", "train_seconds")


def related_table(protocol_table: pd.DataFrame, *, perturbation: pd.DataFrame | None = None,
                  pib: pd.DataFrame | None = None, band: float | None = None, n_boot: int = 1000) -> pd.DataFrame:
    """Protocol rows, perturbation AUCs and Point-in-Box rows as one frame (``kind`` column).

    Args:
        protocol_table: results rows of :func:`midas_nb.analysis.protocol.run_protocol` (any number of
            seeds; must contain the ``reference`` condition for ``D``).
        perturbation: :func:`~midas_nb.metrics.perturbation.perturbation_table` output, or ``None``.
        pib: :func:`~midas_nb.analysis.last.pib_table` output, or ``None``.
        band: IDAUC parity band of ``D``; ``None``: :data:`midas_nb.metrics.PARITY_BAND`.
        n_boot: bootstrap resamples of the intervals and of ``D_status`` (:func:`run_related`
            passes the profile's ``bootstrap``).

    Returns:
        One row per pruning condition (``method`` = condition; metric columns are means over
        seeds, ``*_std`` the seed std, ``*_lo``/``*_hi`` the seeds × images interval; ``D_pp``
        with its paired interval ``D_pp_lo``/``D_pp_hi``, ``D_status``, ``D_cell``; with ``random`` rows, their mean
        ``random_accuracy`` and ``accuracy_vs_random`` (+ ``_lo``/``_hi``: pruned accuracy minus random top-k's,
        paired over seeds and images, :func:`~midas_nb.analysis.verdict.paired_gap`); the family columns are means
        over every build's rows, as the metrics), per relevance map (``pos_auc``, ``neg_auc`` with CIs) and per
        backbone variant (``pib``, ``accuracy`` with CIs). ``pib_centre`` and ``pib_box_area`` (the
        Point-in-Box baselines) stand beside every ``pib``; ``last_K`` on the LaSt rows.
        Columns a row kind does not have are NaN.
    """
    agg = aggregate_seeds(protocol_table, n_boot=n_boot).rename(columns={f"{m}_mean": m for m in METRIC_COLUMNS})
    keys = [c for c in ("dataset", "backbone", "checkpoint_id", "condition", "target", "relaxation", "depth",
                        "budget") if c in agg.columns]
    extra = [c for c in FAMILY_COLUMNS if c in protocol_table.columns]
    if extra:      # over every build, as aggregate_seeds pools the metrics (its checkpoint_id is build 0's)
        pooled = [c for c in keys if not (BUILD_COLUMN in protocol_table.columns and c in CHECKPOINT_COLUMNS)]
        means = protocol_table.groupby(pooled, dropna=False, sort=False)[extra].mean().reset_index()
        agg = agg.merge(means, on=pooled, how="left")
    agg = _against_random(agg, protocol_table, n_boot)
    D = decoupling_D(protocol_table, band=band, n_boot=n_boot)
    dkeys = [c for c in keys if c in D.columns]
    agg = agg.merge(D[dkeys + ["D_pp", "D_pp_lo", "D_pp_hi", "D_pp_std", "delta_idauc", "status", "D_cell"]]
                    .rename(columns={"status": "D_status"}), on=dkeys, how="left")
    agg.insert(0, "method", agg["condition"])
    agg["last_K"] = agg["condition"].map({"last_votes": LAST_VOTES_K})
    parts = {"pruning": agg}
    if perturbation is not None and len(perturbation):
        parts["relevance map"] = perturbation.drop(columns=["pos_curve", "neg_curve", "fractions"],
                                                   errors="ignore").rename(columns={"target": "method"})
    if pib is not None and len(pib):
        parts["backbone"] = pib.rename(columns={"model": "method"})
    return pd.concat([p.reindex(columns=["kind", *p.columns]).assign(kind=k) for k, p in parts.items()],
                     ignore_index=True, sort=False)


def _against_random(agg: pd.DataFrame, rows: pd.DataFrame, n_boot: int) -> pd.DataFrame:
    """``agg`` with each condition's pruned accuracy against the ``random`` top-k of its cell (columns of
    :func:`related_table`); unchanged without ``random`` rows or per-image accuracy."""
    if "accuracy_per_image" not in rows.columns or not (rows["condition"] == "random").any():
        return agg
    cell = [c for c in ("depth", "budget") if c in rows.columns]
    out = []
    for _, r in agg.iterrows():
        here = rows[(rows[cell] == r[cell]).all(axis=1)] if cell else rows
        rand = here[here["condition"] == "random"]
        m, lo, hi, n = paired_gap(here[here["condition"] == r["condition"]], rand, "accuracy", n_boot=n_boot)
        out.append((rand["accuracy"].mean(), *((m, lo, hi) if n else (float("nan"),) * 3)))
    cols = ["random_accuracy", "accuracy_vs_random", "accuracy_vs_random_lo", "accuracy_vs_random_hi"]
    return agg.assign(**dict(zip(cols, map(list, zip(*out)))))


def training_caveats(table: pd.DataFrame) -> list[str]:
    """One line per scorer that did not learn to prune here: a ``"pruning"`` row of :func:`related_table` (not the
    training-free ``reference``) whose pruned accuracy lies resolvably below the random top-k's of its cell
    (``accuracy_vs_random_hi < 0``). Its coverage and IDAUC are then a failed run's, not its method's. Without
    such a row, one line that says so (or that the table has no random top-k to check against)."""
    if "accuracy_vs_random_hi" not in table.columns:
        return ["no random top-k rows: the scorers' pruned accuracy is not checked against it"]
    bad = table[(table["kind"] == "pruning") & ~table["method"].isin(["reference", "random"])
                & (table["accuracy_vs_random_hi"] < 0)]
    return [f"{r['method']}: did not train here (pruned accuracy {r['accuracy']:.3f} vs random top-k "
            f"{r['random_accuracy']:.3f}, paired difference {r['accuracy_vs_random']:+.3f} "
            f"[{r['accuracy_vs_random_lo']:+.3f}, {r['accuracy_vs_random_hi']:+.3f}]): read its coverage and IDAUC "
            "as a failed run, not as the method's" for _, r in bad.iterrows()] or [
        "no scorer's pruned accuracy lies resolvably below random top-k's"]


def speed_table(table: pd.DataFrame) -> pd.DataFrame:
    """Accuracy and speed of each pruning row beside the unpruned model's, for a reader.

    Args:
        table: the ``"pruning"`` rows of :func:`related_table` (``method``, ``accuracy`` with
            ``accuracy_lo``/``_hi``, ``throughput``, ``throughput_full``, ``speedup``,
            ``train_seconds``).

    Returns:
        Index ``method``; ``accuracy`` (top-1, fraction, ``m [lo, hi]``), ``img/s`` (the pruned
        forward's images per second), ``full img/s`` (the unpruned model's, from the same
        interleaved measurement), ``speed-up`` (the mean over the row's runs of each run's ratio to its own
        unpruned model, ``speedup``, as notebook 07 reads it; without that column the ratio of the means, ``1.87×``)
        and ``train s`` (scorer
        training, seconds; ``0`` for the untrained ``reference`` / ``random``).

    Raises:
        ValueError: a row without ``throughput`` (or ``throughput_full``) or without ``accuracy``.
    """
    miss = [c for c in ("throughput", "throughput_full", "accuracy") if c not in table.columns]
    if miss or table[["throughput", "throughput_full"]].isna().any().any():
        raise ValueError(f"speed_table: rows without {miss or ['throughput', 'throughput_full']}")
    out = compact(table, ["accuracy"], index="method")
    out["img/s"] = [format_ci(v, fmt=".0f") for v in table["throughput"]]
    out["full img/s"] = [format_ci(v, fmt=".0f") for v in table["throughput_full"]]
    ratio = table.get("speedup", pd.Series(float("nan"), index=table.index)).fillna(
        table["throughput"] / table["throughput_full"])
    out["speed-up"] = [f"{r:.2f}×" for r in ratio]
    if "train_seconds" in table.columns:
        out["train s"] = [format_ci(v, fmt=".2f") for v in table["train_seconds"].fillna(0.0)]
    return out


def speed_note(protocol: pd.DataFrame, settings: Any) -> str:
    """The settings line of :func:`speed_table`: the images and device of the one interleaved
    throughput measurement that every row and the unpruned model share
    (:func:`midas_nb.metrics.measure_speed`), and the images of the accuracy.

    Args:
        protocol: the protocol rows (``n_images``, ``device``, ``depth``, ``budget``).
        settings: the study's protocol settings (``study.settings.protocol``; ``study.settings``
            is read the same): its ``throughput_batch`` and ``throughput_repeats``, as the cells'
            runs received them.

    Raises:
        TypeError: ``settings`` is not a study's settings (a profile mapping, as before).
        ValueError: no rows.
    """
    settings = getattr(settings, "protocol", settings)          # a study's RunSettings: its protocol part
    if not hasattr(settings, "throughput_batch"):
        raise TypeError(f"speed_note: expected the study's protocol settings (speed_note(rows, "
                        f"study.settings.protocol)), got {type(settings).__name__}")
    if protocol.empty:
        raise ValueError("speed_note: the table has no rows")
    batch, reps = int(settings.throughput_batch), int(settings.throughput_repeats)
    dev = ", ".join(sorted({str(d) for d in protocol.get("device", pd.Series(["?"])).dropna()})) or "?"
    n_acc = ", ".join(str(int(n)) for n in sorted(set(protocol["n_images"].dropna())))
    L = ", ".join(str(int(x)) for x in sorted(set(protocol["depth"])))
    b = ", ".join(f"{float(x):.0%}" for x in sorted(set(protocol["budget"])))
    full = protocol["throughput_full"].dropna().round(6).nunique() if "throughput_full" in protocol.columns else 1
    runs = (f"; the rows come from {full} such measurements (builds, seeds, or rows computed in other notebooks): a "
            f"row's speed-up is the mean of each run's pruned over its own unpruned throughput, as notebook 07 "
            f"gives it; img/s of rows from different measurements are not comparable (the machine's load changes "
            f"between them): compare the speed-ups") if full > 1 else ""
    return (f"accuracy: {n_acc} test images; throughput: the unpruned model and every pruned forward timed together on "
            f"{batch} test images, {reps} call{'s' if reps != 1 else ''} per round, median of {SPEED_ROUNDS} "
            f"interleaved rounds, on {dev}{runs}; L = {L}, b = {b}")


def family_table(table: pd.DataFrame) -> pd.DataFrame:
    """The scorer families' own readouts, only on the rows that have them: Cropr's accuracy with
    last-layer fusion (``accuracy_llf``, fraction with CI) and its speed relative to plain Cropr
    pruning (``llf_speed_ratio``), IA-RED²'s 0.5-threshold keep rate and accuracy.

    Args:
        table: the ``"pruning"`` rows of :func:`related_table`.

    Returns:
        Index ``method``; the columns that some row fills (none: an empty frame).
    """
    cols = [c for c in ("accuracy_llf", "llf_speed_ratio", "threshold_keep_rate", "threshold_accuracy")
            if c in table.columns]
    rows = table[table[cols].notna().any(axis=1)] if cols else table.iloc[0:0]
    return compact(rows, cols, index="method") if len(rows) else pd.DataFrame(index=pd.Index([], name="method"))


@dataclass
class RelatedResults:
    """What :func:`run_related` computed.

    Attributes:
        table: :func:`related_table` of the three parts.
        protocol: protocol rows (one per condition × seed).
        perturbation: perturbation AUCs and curves per map.
        pib: Point-in-Box and accuracy per backbone variant.
        models: the LaSt and CLS-control fine-tunes (``{"CLS fine-tune": ..., "LaSt fine-tune (K=1)": ...}``).
    """

    table: pd.DataFrame
    protocol: pd.DataFrame
    perturbation: pd.DataFrame | None = None
    pib: pd.DataFrame | None = None
    models: dict[str, nn.Module] = field(default_factory=dict)


def run_related(study: Any, *, conditions: Sequence[str] | None = None,
                perturbation_maps: Sequence[str] | None = PERTURBATION_MAPS, last: bool = True, last_epochs: int = 3,
                last_tune_blocks: int = 1, last_k: int = LAST_FINETUNE_K, max_images: int | None = None,
                **protocol_kwargs: Any) -> RelatedResults:
    """Every related method of notebook 06 on a :class:`midas_nb.study.Study`, and the table.

    1. the protocol at the study's ``(L, b)``: the catalogue's ``"related"`` sweep
       (:data:`midas_nb.study.grid.CATALOGUE`) with ``conditions`` (default :data:`RELATED_CONDITIONS`;
       unknown ones dropped), cells of ``Study.protocol``'s store; Cropr's and IA-RED²'s rows carry their
       extra columns; the ``random`` ranking is run beside them where the profile's protocol has it (each
       row's ``D_status`` tests the reference against it) and left out of the returned rows;
    2. positive/negative perturbation tests of ``perturbation_maps`` (test-split target maps,
       class = prediction) — skipped with ``None``;
    3. LaSt-ViT: the last ``last_tune_blocks`` block(s) and head fine-tuned for ``last_epochs``
       with LaSt aggregation and, as a control, with the CLS head (cached by checkpoint); Point-in-Box and
       accuracy of backbone, control and LaSt variant — skipped with ``last=False``.

    Args:
        study: a :class:`midas_nb.study.Study`.
        conditions: protocol conditions.
        perturbation_maps: target ids for the perturbation tests, or ``None``.
        last: run the LaSt-ViT part.
        last_epochs, last_tune_blocks: LaSt fine-tune settings.
        last_k: ``K`` of the LaSt aggregation (default 1, the official config); in the row's name.
        max_images: test images of parts 2 and 3 (seeded subset); ``None``: the profile's
            ``max_idauc_images`` (else ``max_eval_images``) for the perturbation curves and
            ``max_eval_images`` for Point-in-Box.
        **protocol_kwargs: passed to ``Study.protocol`` (e.g. ``seeds``, ``epochs``). Without
            ``seeds``, the systems outside the profile's ``conditions`` train with its ``related_seeds``
            on one backbone build, the others with its ``seeds`` and builds (rows shared with notebook 02).

    Returns:
        :class:`RelatedResults`.
    """
    s = study.settings
    # the catalogue's 06 sweep (midas_nb.study.grid.CATALOGUE["related"]): the random ranking beside the reference
    # where the profile's protocol has it (the band's check), read only through each row's D_status
    protocol = study.protocol(sweep="related", conditions=conditions, **protocol_kwargs)
    n_img = max_images if max_images is not None else s.protocol.max_eval_images
    # the perturbation curves cost S forwards per image, like IDAUC: same image bound
    n_curve = max_images if max_images is not None else (s.protocol.max_idauc_images or n_img)
    n_boot = s.statistics.bootstrap
    pert = None
    if perturbation_maps:
        maps = study.target_maps(split="test", ids=list(perturbation_maps))
        pert = perturbation_table(study.model, study.test_set, maps, steps=s.protocol.idauc_steps,
                                  max_images=n_curve, device=study.device, n_boot=n_boot, progress=study.progress)
    pib, models = None, {}
    if last:
        # no data path in the key: last_finetune adds the training split's content identity
        key = dict(dataset=study.dataset_name, checkpoint=study.meta["checkpoint_id"])
        for name, agg in (("CLS fine-tune", "cls"), (f"LaSt fine-tune (K={last_k})", "last")):
            models[name] = last_finetune(study.model, study.train_set, aggregation=agg, tune_blocks=last_tune_blocks,
                                         num_tokens=last_k, epochs=last_epochs, device=study.device, key=key,
                                         progress=study.progress)
        pib = pib_table({"backbone": study.model, **models}, study.test_set, max_images=n_img,
                        device=study.device, n_boot=n_boot, progress=study.progress)
    table = related_table(protocol, perturbation=pert, pib=pib, n_boot=n_boot)
    if "random" not in (conditions or RELATED_CONDITIONS):
        table = table[~((table["kind"] == "pruning") & (table["method"] == "random"))].reset_index(drop=True)
        protocol = protocol[protocol["condition"] != "random"].reset_index(drop=True)
    return RelatedResults(table=table, protocol=protocol, perturbation=pert, pib=pib, models=models)
