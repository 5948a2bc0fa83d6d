"""Token scorers: one score per patch token from the hidden states at the output of block ``L``.

A scorer ranks the ``N`` patch tokens of a timm ViT at depth ``L`` (DESIGN.md §3, §5); the
pruned forward of :mod:`midas_nb.pruning` keeps the top ``k = ceil(b·N)`` of them. Higher
score = keep. Every scorer derives from :class:`TokenScorer` and overrides one method,
:meth:`TokenScorer.score`.

- ``reference`` — :class:`ReferenceScorer`: the CLS attention of block ``L``, ``E_h A_h[cls,j]``
  (target T0 of DESIGN.md §4), no parameters. The attention-based ranking of EViT (Liang et
  al., 2022, "Not All Patches are What You Need", https://arxiv.org/abs/2202.07800).
- ``mlp`` — :class:`MLPScorer`: LayerNorm → Linear → GELU → Linear, one score per patch token,
  the per-token predictor of DynamicViT (Rao et al., 2021, https://arxiv.org/abs/2106.02034)
  without its global-feature branch. Trained by :mod:`midas_nb.train` (unsupervised or
  supervised by a target).
- ``random`` — :class:`RandomScorer`: a seeded uniform random ranking (lower bound).

Further families (``cropr``, ``iared``; DESIGN.md §5, :mod:`midas_nb.scorers.cropr`,
:mod:`midas_nb.scorers.iared`) register
themselves with :func:`register_scorer` (``condition=True``: a protocol condition of its own) and
are built by name with :func:`build_scorer`. A family with its own objective (an auxiliary head,
REINFORCE) overrides :meth:`TokenScorer.training_loss`, which :func:`midas_nb.train.train_scorers`
calls in place of the default ``L_cls``. The contract :class:`TokenScorer` is defined on the
floor below, in :mod:`midas_nb.pruning` (the pruned forward calls it), and re-exported here.

Example::

    >>> scorer = build_scorer("mlp", dim=192)
    >>> scorer(hidden, num_prefix=1).shape        # hidden: B x (1+N) x 192
    torch.Size([B, N])
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import Tensor, nn

from ..pruning import TokenScorer
from ..targets import cls_attention_map
from ..targets.registry import Registry

__all__ = ["TokenScorer", "ReferenceScorer", "MLPScorer", "RandomScorer", "register_scorer", "list_scorers",
           "list_scorer_conditions", "build_scorer", "cls_attention"]


#: the T0 operator on one block's attention (:func:`midas_nb.targets.cls_attention_map`)
cls_attention = cls_attention_map


class ReferenceScorer(TokenScorer):
    """Training-free reference: CLS attention of block ``L`` (T0, DESIGN.md §4, §5).

    ``s_j = E_h A_h[cls, j]`` with ``A_h`` the attention probabilities of block ``L`` (the block
    whose output the other scorers read). Liang et al., 2022 (EViT),
    https://arxiv.org/abs/2202.07800, Eq. 3.
    """

    needs_attention = True

    def score(self, tokens: Tensor, num_prefix: int, attn: Tensor | None = None) -> Tensor:
        if attn.shape[-1] != tokens.shape[1]:
            raise ValueError(f"attention is over T={attn.shape[-1]} tokens but tokens has T={tokens.shape[1]}")
        return cls_attention(attn, num_prefix).to(tokens.dtype)


class MLPScorer(TokenScorer):
    """Per-token MLP scorer: LayerNorm → Linear(D, hidden) → GELU → Linear(hidden, 1).

    Reads each patch token's hidden state at the output of block ``L`` and returns one score
    per patch token (prefix tokens are not scored). The local branch of DynamicViT's predictor
    (Rao et al., 2021, https://arxiv.org/abs/2106.02034, Eq. 2–4).

    Args:
        dim: embedding width ``D`` of the backbone.
        hidden: width of the hidden layer. Default: ``dim // 2``.
    """

    trainable = True

    def __init__(self, dim: int, hidden: int | None = None):
        super().__init__()
        assert dim > 0, f"dim must be positive, got {dim}"
        hidden = max(1, dim // 2) if hidden is None else int(hidden)
        assert hidden > 0, f"hidden must be positive, got {hidden}"
        self.dim, self.hidden = int(dim), hidden
        self.mlp = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, 1))

    def score(self, tokens: Tensor, num_prefix: int, attn: Tensor | None = None) -> Tensor:
        return self.mlp(tokens[:, num_prefix:]).squeeze(-1)


class RandomScorer(TokenScorer):
    """Seeded uniform random ranking (the lower bound of DESIGN.md §4 ``random``).

    Scores are drawn on the CPU from a generator seeded with ``seed`` (so CPU and CUDA runs
    rank identically) and moved to the tokens' device. The sequence of draws advances with
    every call; :meth:`reset` restarts it, so a fixed order of batches gives fixed rankings.

    Args:
        seed: seed of the generator. Default: 0.
    """

    def __init__(self, seed: int = 0):
        super().__init__()
        self.seed = int(seed)
        self.generator = torch.Generator().manual_seed(self.seed)

    def reset(self) -> None:
        """Restart the sequence of draws from ``seed``."""
        self.generator.manual_seed(self.seed)

    def score(self, tokens: Tensor, num_prefix: int, attn: Tensor | None = None) -> Tensor:
        B, T, _ = tokens.shape
        s = torch.rand(B, T - num_prefix, generator=self.generator)
        return s.to(device=tokens.device, dtype=tokens.dtype)


_SCORERS = Registry("scorer")
_CONDITIONS: list[str] = []
def register_scorer(
        name: str, *, condition: bool = False) -> Callable[[Callable[..., TokenScorer]], Callable[..., TokenScorer]]:
    """Decorator registering a scorer factory ``f(dim: int, **kwargs) -> TokenScorer`` by name.

    Args:
        name: registry key.
        condition: the family is a protocol condition of its own (``cropr``, ``iared``): the
            protocol builds it with :func:`build_scorer`, trains it with
            :func:`midas_nb.train.train_scorers` (its :meth:`TokenScorer.training_loss`) and
            evaluates it by top-``k`` like every other condition; its factory is then called
            as ``f(dim, num_classes=C, **kwargs)`` (auxiliary heads need ``C``). Default: ``False``.

    Raises:
        ValueError: if ``name`` is already registered.
    """
    def deco(factory: Callable[..., TokenScorer]) -> Callable[..., TokenScorer]:
        _SCORERS.add(name, factory)
        if condition:
            _CONDITIONS.append(name)
        return factory
    return deco


def list_scorers() -> list[str]:
    """Names of the registered scorers, in registration order."""
    return list(_SCORERS)


def list_scorer_conditions() -> list[str]:
    """Scorer families that are protocol conditions of their own (``condition=True``).

    Importing :mod:`midas_nb.scorers` registers every family (each where it is defined), so the
    list does not depend on what the caller imported.
    """
    return list(_CONDITIONS)


def build_scorer(name: str, dim: int, **kwargs) -> TokenScorer:
    """Build the scorer registered as ``name`` for embedding width ``dim``.

    Raises:
        ValueError: for an unknown name.
    """
    return _SCORERS[name](dim, **kwargs)


register_scorer("reference")(lambda dim: ReferenceScorer())
register_scorer("mlp")(MLPScorer)
register_scorer("random")(lambda dim, seed=0: RandomScorer(seed=seed))


def speed_scorers(kinds: Sequence[str], dim: int, mlp_hidden: int, num_classes: int,
                  device: torch.device | str) -> dict[str, TokenScorer]:
    """One scorer per kind (``reference``, ``random``, ``mlp`` or a scorer family) for timing."""
    out: dict[str, TokenScorer] = {}
    for k in kinds:
        try:
            s = (ReferenceScorer() if k == "reference" else RandomScorer(0) if k == "random"
                 else MLPScorer(dim, mlp_hidden) if k == "mlp" else build_scorer(k, dim, num_classes=num_classes))
        except ValueError:
            if k in ("reference", "random", "mlp"):
                raise
            continue        # a family that cannot be built at this width has no rows to time either
        out[k] = s.to(device).eval()
    return out
