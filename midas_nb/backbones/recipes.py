"""Training recipes: the schedule every backbone trains with (:class:`TrainingRecipe`) and what
distilled backbones add (:class:`DistillRecipe`); both enter checkpoint keys."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

from ..config import is_int, Schedule, setting_of

#: Bumped when the meaning of a recipe field or the training loop changes (enters checkpoint keys).
DISTILL_VERSION = 1


@dataclass(frozen=True)
class TrainingRecipe:
    """The schedule a backbone is fine-tuned (or trained from nothing) with; its fields enter
    the checkpoint key (:func:`midas_nb.backbones.checkpoint_key`).

    Attributes:
        epochs: passes over the training split (>= 1).
        batch_size: images per step (>= 1).
        lr: peak learning rate of AdamW (> 0), reached after the warm-up.
        warmup_epochs: linear warm-up, in epochs (>= 0; per step), then cosine decay to 0.
        seed: initialisation, order and flips.
        label_smoothing: of the cross-entropy (Szegedy et al., 2016), in ``[0, 1)``.
        weight_decay: AdamW's, on weights other than biases, norms, position embedding and
            prefix tokens.

    Raises:
        ValueError: a value outside its range (one message naming every such field).
    """

    epochs: int
    batch_size: int
    lr: float
    warmup_epochs: float = 0.0
    seed: int = 0
    label_smoothing: float = 0.1
    weight_decay: float = 0.05

    def __post_init__(self) -> None:   # the schedule's constraints are the profile's (config.Schedule)
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        wrong = {setting_of(line) for line in Schedule.problems(values)} | (set() if is_int(self.seed) else {"seed"})
        if bad := [f"{k}={v!r}" for k, v in values.items() if k in wrong]:
            raise ValueError(f"training recipe: expected epochs >= 1, batch_size >= 1, lr > 0, warmup_epochs >= 0, "
                             f"an integer seed, label_smoothing in [0, 1), weight_decay >= 0; got {', '.join(bad)}")

    def key(self) -> dict[str, Any]:
        """The fields as plain ``int`` / ``float`` in declaration order (the checkpoint key's)."""
        return dict(epochs=int(self.epochs), batch_size=int(self.batch_size), lr=float(self.lr),
                    warmup_epochs=float(self.warmup_epochs), seed=int(self.seed),
                    label_smoothing=float(self.label_smoothing), weight_decay=float(self.weight_decay))


@dataclass(frozen=True)
class DistillRecipe:
    """How a distilled backbone is trained besides the fine-tuning schedule (epochs, lr, ...).

    Attributes:
        token: distillation-token target: ``"soft"`` (KL at temperature ``tau``), ``"hard"``
            (cross-entropy on the teacher's arg max, DeiT), ``"none"`` (the token's head then
            learns the label too).
        alpha: weight of the distillation-token loss; the class token's CE gets ``1 - alpha``.
        tau: temperature of the soft target (the KL is multiplied by ``tau²``, Hinton et al.).
        token_label_weight: weight of the dense token labels (0 switches them off): per-location
            teacher class scores (the probe applied to every location of the teacher's map
            before pooling) distilled into the patch tokens through a training-only linear head
            (KL per location, mean over locations; Jiang et al., 2021, token labeling).
        hint_weight: ``λ`` of the dense feature hint (0 switches it off).
        mix_prob: probability of MixToken per batch (Jiang et al., 2021: CutMix on the token grid
            after the patch embedding): a box of the stem-feature grid, aligned with the teacher's
            grid, is pasted from another image of the batch; labels mix by area, the teacher's
            dense targets are pasted with the same box.
        token_keep: fraction of the teacher-grid cells whose patch tokens enter the blocks in a
            training step (PatchDropout, Liu et al., 2023, "PatchDropout: Economizing Vision
            Transformers Using Patch Dropout", https://arxiv.org/abs/2208.07220: a random subset of
            patch tokens per image, prefix tokens always kept); the cells are the teacher's grid
            (2×2 patch tokens at stride 16), so the token labels of the kept cells stay exact.
            1.0 switches it off; evaluation and the saved backbone always see every token.
        coarse_epochs: the first ``coarse_epochs`` training epochs run on the teacher's grid
            instead of the patch grid (progressive token resolution, in the spirit of FixRes,
            Touvron et al., 2019, https://arxiv.org/abs/1906.06423, and of progressive ViT
            training, Li et al., 2022, AutoProg, https://arxiv.org/abs/2203.14509): the patch
            tokens of every cell of the teacher's stride-32 grid (2×2 of them at stride 16, 4×4 at
            stride 8), taken after the position embedding and ``norm_pre``, are replaced by their
            mean, so the blocks see one token per cell (49 at 224 px) and each is exactly one
            teacher cell for the token labels; the later epochs and evaluation see every token.
            0 switches it off; it must be below the schedule's epochs.
        oof_folds: folds of the out-of-fold teacher logits on the training images (0: the
            probe's own, in-sample logits).
        probe_steps, probe_lr, probe_weight_decay, probe_label_smoothing: the teacher's linear
            probe (full-batch AdamW on standardised pooled features).
    """

    token: Literal["soft", "hard", "none"] = "soft"
    alpha: float = 0.5
    tau: float = 1.0
    token_label_weight: float = 1.0
    hint_weight: float = 0.0
    mix_prob: float = 0.5
    token_keep: float = 1.0
    coarse_epochs: int = 0
    oof_folds: int = 5
    probe_steps: int = 100
    probe_lr: float = 1e-2
    probe_weight_decay: float = 0.1
    probe_label_smoothing: float = 0.1

    def __post_init__(self) -> None:
        checks = [(self.token in ("soft", "hard", "none"), f"token must be soft, hard or none, got {self.token!r}"),
                  (0.0 <= self.alpha <= 1.0, f"alpha must be in [0, 1], got {self.alpha}"),
                  (self.tau > 0 and self.hint_weight >= 0 and self.token_label_weight >= 0,
                   f"need tau > 0 and weights >= 0; got {self.tau}, {self.hint_weight}, {self.token_label_weight}"),
                  (0.0 <= self.mix_prob <= 1.0, f"mix_prob must be in [0, 1], got {self.mix_prob}"),
                  (0.0 < self.token_keep <= 1.0, f"token_keep must be in (0, 1], got {self.token_keep}"),
                  (self.coarse_epochs >= 0, f"coarse_epochs must be >= 0, got {self.coarse_epochs}"),
                  (self.coarse_epochs == 0 or self.token_keep == 1.0, "coarse_epochs and token_keep < 1 do not combine"),
                  (self.oof_folds == 0 or self.oof_folds >= 2, f"oof_folds must be 0 or >= 2, got {self.oof_folds}")]
        bad = [why for ok, why in checks if not ok]
        if bad:        # a ValueError, not an assert: python -O must not let a bad recipe through
            raise ValueError("distillation recipe: " + "; ".join(bad))

    def key(self) -> dict[str, Any]:
        """The fields and :data:`DISTILL_VERSION`, for checkpoint keys (``token_keep`` only when
        PatchDropout is on, ``coarse_epochs`` only when non-zero, so checkpoints built before
        these fields existed keep their keys)."""
        off = (("token_keep", 1.0), ("coarse_epochs", 0))
        return dict({k: v for k, v in asdict(self).items() if (k, v) not in off}, version=DISTILL_VERSION)


#: Distilled backbone names (registered in :mod:`midas_nb.backbones`) and their recipes.
#: ``hybrid_lite0_deit`` trains its first 18 epochs on the teacher's 7×7 grid (progressive token
#: resolution; docs/decisions/0002-progressive-token-resolution.md, measurements in
#: docs/benchmarks.md). An absolute count, not a fraction of the schedule (the same decision
#: record says why). A schedule must have more epochs than that (the run's preflight and the build check it).
DISTILLED_RECIPES: dict[str, DistillRecipe] = {"hybrid_lite0_deit": DistillRecipe(coarse_epochs=18),
                                               "vit_smoke_deit": DistillRecipe()}


def is_distilled_name(name: str) -> bool:
    """True for a backbone trained with :func:`finetune_distilled`."""
    return name in DISTILLED_RECIPES


def distill_recipe(name: str) -> DistillRecipe:
    """The :class:`DistillRecipe` of a distilled backbone name.

    Raises:
        KeyError: naming the known distilled backbones.
    """
    if name not in DISTILLED_RECIPES:
        raise KeyError(f"{name!r} is not a distilled backbone; expected one of {sorted(DISTILLED_RECIPES)}")
    return DISTILLED_RECIPES[name]


def check_epochs(name: str, epochs: Any) -> list[str]:
    """``[]`` when backbone ``name`` can train for ``epochs`` epochs; else why not (one line).

    A distilled backbone with ``coarse_epochs`` (:attr:`DistillRecipe.coarse_epochs`) needs
    more epochs than that: its last epochs must see every patch token, as evaluation does.
    Backbones without a coarse stage, and non-integer ``epochs`` (reported by the profile
    check), give ``[]``; NumPy integers count as integers.
    """
    coarse = distill_recipe(name).coarse_epochs if is_distilled_name(name) else 0
    if not coarse or not is_int(epochs) or epochs > coarse:
        return []
    return [f"{name} trains its first {coarse} epochs on coarse tokens (DISTILLED_RECIPES, progressive "
            f"token resolution); expected more than {coarse} epochs, got {epochs}"]


def schedule_text(meta: dict[str, Any]) -> str:
    """A backbone's training schedule in words, from its checkpoint ``meta`` (``epochs``, and for a distilled
    backbone ``distillation["coarse_epochs"]``, :attr:`DistillRecipe.coarse_epochs`): ``"60 epochs, the first 18
    on the teacher's stride-32 grid (coarse tokens)"``, or ``"15 epochs"``; ``"epochs unrecorded"``
    without ``epochs``. The one wording notebooks 00 and 05 print (the recipe differs per dataset: the synthetic
    set's ``synthetic_finetune``, decision 0003)."""
    epochs = meta.get("epochs")
    if not is_int(epochs):
        return "epochs unrecorded"
    coarse = int((meta.get("distillation") or {}).get("coarse_epochs") or 0)
    return f"{epochs} epochs" + (f", the first {coarse} on the teacher's stride-32 grid (coarse tokens)"
                                 if coarse else "")


#: label-trained offline backbone -> its distilled student (notebook 05 and the report put them side by side)
OFFLINE_PARTNERS: dict[str, str] = {"hybrid_lite0_vit": "hybrid_lite0_deit", "vit_smoke": "vit_smoke_deit"}
_REVERSE = {v: k for k, v in OFFLINE_PARTNERS.items()}


def comparison_backbones(params: dict[str, Any], *, planned: bool = False) -> list[str]:
    """Backbones of the side-by-side readout for a profile: ``params["compare_backbones"]``
    when set; else the profile's backbone and its offline partner (label-trained first,
    :data:`OFFLINE_PARTNERS`); else the profile's backbone alone. Where ``other_backbones`` is
    false (quick) a run computes the profile's backbone alone; ``planned=True`` still lists
    every backbone of the side-by-side (the report shows those the store holds and names the
    others as not run)."""
    if not planned and not params.get("other_backbones", True):
        return [params["backbone"]]
    if given := params.get("compare_backbones"):
        return list(dict.fromkeys(given))
    b = params["backbone"]
    return [b, OFFLINE_PARTNERS[b]] if b in OFFLINE_PARTNERS else [_REVERSE[b], b] if b in _REVERSE else [b]
