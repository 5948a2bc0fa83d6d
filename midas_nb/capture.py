"""One-pass activation and gradient capture for timm Vision Transformers.

One forward and the backward passes of ``torch.autograd.grad`` on that same graph record,
for every block ``b``:

- attention probabilities ``A_b [B,H,T,T]`` (the output of ``attn.attn_drop``; attention is
  switched to the unfused path, DESIGN.md §3) and their gradient w.r.t. the class logit
  ``y_c`` and, where asked, the cross-entropy loss ``ℓ``;
- the block's input and output hidden states ``[B,T,D]`` and the gradient of ``y_c`` w.r.t.
  the output (and, where asked, of ``ℓ``);
- the input and output of the MHSA module and of the FFN module ``[B,T,D]``;
- what TokenTM (Wu et al., CVPR 2024, https://arxiv.org/abs/2403.14552) needs besides: the
  residual stream between MHSA and FFN (the input of ``norm2``), each token's own
  value→output transform ``attn.proj(v_j)`` ``[B,T,D]`` (computed without grad in a hook on
  ``attn.qkv``: one extra linear map per block), and, where asked (``prob_grad=True``), the
  gradient of the class *probability* ``p_c = softmax(y)_c`` w.r.t. ``A`` (one more
  ``autograd.grad`` on the same graph).

It follows the hook pattern of pytorch-grad-cam's ``ActivationsAndGradients`` and of
Chefer et al. (2021, https://arxiv.org/abs/2103.15679), but without a private model copy:
hooks are installed on the timm modules by :class:`Capture` and removed on exit.

The scalar for the logit gradient is ``Σ_b y_{b,c_b}``, for the probability gradient
``Σ_b p_{b,c_b}``, and the loss is the cross-entropy with ``reduction="sum"``; images do not interact in eval mode, so every image receives exactly
its own gradient and results do not depend on batch composition.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .backbones.vit import classify_tokens, disable_fused_attention, embed_tokens, grid_size, num_prefix_tokens

__all__ = ["Capture", "CaptureResult", "capture"]


@dataclass
class CaptureResult:
    """Everything one forward + backward recorded. Lists are indexed by block, 0-based.

    Attributes:
        logits: ``[B,C]`` logits of the forward pass.
        class_index: ``[B]`` class ``c`` whose logit was differentiated.
        labels: ``[B]`` labels of the loss, or ``None`` when no loss gradient was taken.
        attn: per block ``[B,H,T,T]`` attention probabilities.
        attn_grad: per block ``[B,H,T,T]`` ``∂y_c/∂A``.
        attn_grad_loss: per block ``[B,H,T,T]`` ``∂ℓ/∂A`` or ``None`` (blocks not asked).
        hidden_in: per block ``[B,T,D]`` block input.
        hidden: per block ``[B,T,D]`` block output ``h``.
        hidden_grad: per block ``[B,T,D]`` ``∂y_c/∂h``.
        hidden_grad_loss: per block ``[B,T,D]`` ``∂ℓ/∂h`` or ``None``.
        attn_in / attn_out: per block ``[B,T,D]`` input (after ``norm1``) and output of MHSA.
        mlp_in / mlp_out: per block ``[B,T,D]`` input (after ``norm2``) and output of the FFN.
        hidden_mid: per block ``[B,T,D]`` residual stream between MHSA and FFN (the input of
            ``norm2``: block input + MHSA output).
        value_proj: per block ``[B,T,D]`` each token's value through the output projection,
            ``attn.proj(attn.norm(v_j))`` (TokenTM's MHSA transform ``Ẽ``); the MHSA output is
            its attention-weighted mix per head.
        attn_grad_prob: per block ``[B,H,T,T]`` ``∂p_c/∂A`` with ``p_c = softmax(y)_c``, or
            ``None`` (captured without ``prob_grad``).
        num_prefix_tokens: ``P``.
        grid_size: patch grid ``(rows, cols)``; ``N = rows·cols`` on unpruned sequences.
    """

    logits: Tensor
    class_index: Tensor
    labels: Tensor | None
    attn: list[Tensor]
    attn_grad: list[Tensor]
    attn_grad_loss: list[Tensor | None]
    hidden_in: list[Tensor]
    hidden: list[Tensor]
    hidden_grad: list[Tensor]
    hidden_grad_loss: list[Tensor | None]
    attn_in: list[Tensor]
    attn_out: list[Tensor]
    mlp_in: list[Tensor]
    mlp_out: list[Tensor]
    num_prefix_tokens: int
    grid_size: tuple[int, int]
    extras: dict = field(default_factory=dict)
    hidden_mid: list[Tensor] = field(default_factory=list)
    value_proj: list[Tensor] = field(default_factory=list)
    attn_grad_prob: list[Tensor | None] = field(default_factory=list)

    @property
    def num_blocks(self) -> int:
        """Number of blocks recorded (not the depth ``L``, which names one of them)."""
        return len(self.attn)

    def patch(self, t: Tensor) -> Tensor:
        """Drop prefix tokens along dim 1: ``[B,T,...] → [B,N,...]``."""
        return t[:, self.num_prefix_tokens:]

    def to(self, device: torch.device | str) -> "CaptureResult":
        """Move every tensor to ``device`` (returns a new result)."""
        def mv(v):
            return v.to(device) if isinstance(v, Tensor) else [mv(t) for t in v] if isinstance(v, list) else v
        return CaptureResult(**{k: mv(getattr(self, k)) for k in self.__dataclass_fields__})


class Capture:
    """Context manager that hooks every block of a timm ViT and records activations.

    Inside the ``with``, any forward of the model (full, or the staged token path of
    :mod:`midas_nb.backbones.vit`, pruned sequences included) fills ``self.records``; on exit every
    hook is removed. Use :func:`capture` for the usual one-call use.

    Args:
        model: a timm ``VisionTransformer`` (or any module with ``blocks`` whose blocks have
            ``attn.attn_drop``, ``attn``, ``mlp``). Fused attention is switched off in place.

    Example::

        >>> with Capture(model) as cap:
        ...     logits = model(images)            # B x C
        >>> cap.records["attn"][0].shape          # B x H x T x T
    """

    def __init__(self, model: nn.Module):
        self.model = model
        self.handles: list = []
        self.records: dict[str, list] = {}

    def _store(self, key: str, i: int, value: Tensor) -> None:
        self.records[key][i] = value

    def _io_hook(self, name: str, i: int):
        def hook(module, args, out):
            self.records[f"{name}_in"][i] = args[0]
            self.records[f"{name}_out"][i] = out
        return hook

    def _value_proj_hook(self, attn: nn.Module, i: int):
        # qkv output is [B,T,3·H·hd] laid out (3, H, hd): its last third is v with heads in the
        # order that Attention.forward concatenates them before ``norm`` and ``proj``
        def hook(module, args, out):
            with torch.no_grad():
                v = out[..., 2 * out.shape[-1] // 3:]
                v = getattr(attn, "norm", nn.Identity())(v)
                if getattr(attn, "gate", None) is not None:
                    v = v * attn.gate(args[0]).sigmoid()
                self.records["value_proj"][i] = attn.proj(v)
        return hook

    def __enter__(self) -> "Capture":
        disable_fused_attention(self.model)
        n = len(self.model.blocks)
        self.records = {k: [None] * n for k in ("attn", "hidden_in", "hidden", "attn_in", "attn_out", "mlp_in",
                        "mlp_out", "hidden_mid", "value_proj")}

        def first_block_pre(module, args):
            # Frozen backbones give tokens without grad: make block 1's input a leaf that needs
            # grad so that every later activation is part of the graph.
            x = args[0]
            if torch.is_grad_enabled() and not x.requires_grad:
                return (x.detach().requires_grad_(True),) + tuple(args[1:])
            return None

        add = self.handles.append
        add(self.model.blocks[0].register_forward_pre_hook(first_block_pre))
        for i, blk in enumerate(self.model.blocks):
            add(blk.register_forward_pre_hook(lambda m, a, i=i: self._store("hidden_in", i, a[0])))
            add(blk.register_forward_hook(lambda m, a, o, i=i: self._store("hidden", i, o)))
            add(blk.attn.attn_drop.register_forward_hook(lambda m, a, o, i=i: self._store("attn", i, o)))
            add(blk.attn.register_forward_hook(self._io_hook("attn", i)))
            add(blk.mlp.register_forward_hook(self._io_hook("mlp", i)))
            if hasattr(blk, "norm2") and hasattr(blk.attn, "qkv"):     # timm Block / Attention
                add(blk.norm2.register_forward_pre_hook(lambda m, a, i=i: self._store("hidden_mid", i, a[0])))
                add(blk.attn.qkv.register_forward_hook(self._value_proj_hook(blk.attn, i)))
        return self

    def __exit__(self, *_exc) -> None:
        self.remove()

    def remove(self) -> None:
        """Remove every hook (idempotent)."""
        for h in self.handles:
            h.remove()
        self.handles = []


def _grads(scalar: Tensor, tensors: Sequence[Tensor], retain: bool) -> list[Tensor]:
    gs = torch.autograd.grad(scalar, list(tensors), retain_graph=retain, allow_unused=True)
    return [torch.zeros_like(t) if g is None else g for t, g in zip(tensors, gs)]


def capture(model: nn.Module, images: Tensor | None, class_index: Tensor | None = None, labels: Tensor | None = None, *,
            tokens: Tensor | None = None, loss_blocks: Sequence[int] | None = None, forward_fn=None,
            prob_grad: bool = False) -> CaptureResult:
    """One forward and the backward passes on the same graph; returns a :class:`CaptureResult`.

    Args:
        model: timm ViT in eval mode (its parameters may be frozen).
        images: ``[B,3,H,W]`` normalised images, or ``None`` when ``tokens`` is given.
        class_index: ``[B]`` long, the class ``c`` whose logit ``y_c`` is differentiated.
            ``None`` means the model's prediction (argmax).
        labels: ``[B]`` long; when given, ``∂ℓ/∂A`` and ``∂ℓ/∂h`` of the cross-entropy loss
            (``reduction="sum"``) are recorded too, from a second ``autograd.grad`` on the
            *same* graph (no second forward).
        tokens: ``[B,T,D]`` output of :func:`midas_nb.backbones.vit.embed_tokens` computed elsewhere
            (e.g. from cached stem features); bypasses the patch embedding.
        loss_blocks: 0-based blocks whose loss gradients are wanted (``None``: all). The loss
            backward only reaches as deep as the shallowest of them, which saves time.
        forward_fn: optional ``f(model, tokens) -> logits`` replacing
            ``classify_tokens(model, run_blocks(model, tokens))`` (e.g. a pruned forward).
        prob_grad: also record ``∂p_c/∂A`` of the softmax probability ``p_c`` of the same class
            (TokenTM), from one more ``autograd.grad`` on the same graph.

    Returns:
        CaptureResult with every tensor detached (the graph is freed on return).

    Raises:
        ValueError: if neither ``images`` nor ``tokens`` is given, or shapes disagree.
    """
    if images is None and tokens is None:
        raise ValueError("capture needs images [B,3,H,W] or tokens [B,T,D]")
    was_training = model.training
    model.eval()
    try:
        with torch.enable_grad(), Capture(model) as cap:
            x = tokens if tokens is not None else embed_tokens(model, images)
            logits = classify_tokens(model, model.blocks(x)) if forward_fn is None else forward_fn(model, x)
            B = logits.shape[0]
            class_index = logits.argmax(-1) if class_index is None else class_index
            class_index = torch.as_tensor(class_index, device=logits.device).long().reshape(B)
            rec = cap.records
            depth = len(rec["attn"])
            det = lambda ts: [None if t is None else t.detach() for t in ts]  # noqa: E731
            if any(a is None for a in rec["attn"]):
                raise RuntimeError("attention was not recorded for every block; is the model a timm ViT?")
            y = logits.gather(1, class_index[:, None]).sum()
            grads = _grads(y, rec["attn"] + rec["hidden"], retain=labels is not None or prob_grad)
            attn_grad, hidden_grad = grads[:depth], grads[depth:]
            attn_grad_prob: list[Tensor | None] = [None] * depth
            if prob_grad:
                p = logits.softmax(-1).gather(1, class_index[:, None]).sum()
                attn_grad_prob = det(_grads(p, rec["attn"], retain=labels is not None))
            attn_grad_loss: list[Tensor | None] = [None] * depth
            hidden_grad_loss: list[Tensor | None] = [None] * depth
            if labels is not None:
                labels = torch.as_tensor(labels, device=logits.device).long().reshape(B)
                blocks = list(range(depth)) if loss_blocks is None else sorted(set(loss_blocks))
                loss = F.cross_entropy(logits, labels, reduction="sum")
                g = _grads(loss, [rec["attn"][b] for b in blocks] + [rec["hidden"][b] for b in blocks], retain=False)
                for j, b in enumerate(blocks):
                    attn_grad_loss[b] = g[j].detach()
                    hidden_grad_loss[b] = g[len(blocks) + j].detach()
            return CaptureResult(logits=logits.detach(), class_index=class_index.detach(),
                labels=None if labels is None else labels.detach(), attn_grad=det(attn_grad),
                attn_grad_loss=attn_grad_loss, hidden_grad=det(hidden_grad), hidden_grad_loss=hidden_grad_loss,
                num_prefix_tokens=num_prefix_tokens(model), grid_size=grid_size(model),
                attn_grad_prob=attn_grad_prob, **{k: det(v) for k, v in rec.items()})
    finally:
        model.train(was_training)
