"""Where a backbone's weights come from: a profile's ``weights`` file, the timm hub cache, and the file checks."""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import Tensor, nn

from .registry import BackboneError, LOCAL_ARCHS, timm_pretrained_cfg


def weights_for(profile: dict[str, Any], name: str) -> str | None:
    """The ``weights`` argument of :func:`create_backbone` a profile implies for ``name``.

    The file ``profile["weights"][name]`` when given (``--weights NAME=PATH``); else, for a
    timm backbone, the profile's ``pretrained`` (``"hub"``: timm's pretrained weights, which
    the paper starts from; ``None``: random init); ``None`` for the local hybrid and smoke
    architectures (trained here, no hub weights).
    """
    if w := (profile.get("weights") or {}).get(name):
        return str(Path(w).expanduser())
    return None if name in LOCAL_ARCHS else profile.get("pretrained", "hub")


def expected_weight_files(name: str) -> list[str]:
    """File names a user can pass as ``--weights NAME=PATH`` for a timm backbone: the timm hub's
    ``model.safetensors`` (from ``huggingface.co/<hf_hub_id>``) and the original release file
    (DeiT ``.pth`` ``{"model": state_dict}``, AugReg big_vision ``.npz``) named by timm's
    pretrained config. Empty for local architectures.

    Raises:
        BackboneError: unknown name.
    """
    if name in LOCAL_ARCHS:
        return []
    cfg = timm_pretrained_cfg(name)
    out = []
    if cfg.get("hf_hub_id"):
        out.append(f"{cfg.get('hf_hub_filename') or 'model.safetensors'} (from huggingface.co/{cfg['hf_hub_id']})")
    if cfg.get("url"):
        out.append(f"{cfg['url'].rsplit('/', 1)[-1]} (the original release, {cfg['url']})")
    return out


_HUB_PROBE_SECONDS = 5.0
#: suffixes of the weights files :func:`create_backbone` reads
_WEIGHT_SUFFIXES: tuple[str, ...] = (".pth", ".pt", ".bin", ".safetensors", ".npz")
_WEIGHT_FORMATS = ("a PyTorch state dict (.pth/.pt/.bin; the DeiT release's {'model': state_dict} too), "
                   "timm's model.safetensors, or an AugReg/big_vision .npz")


def _hub_cached(cfg: dict[str, Any]) -> bool:
    if not (repo := cfg.get("hf_hub_id")):
        return False
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - a timm dependency
        return False
    names = [cfg.get("hf_hub_filename")] if cfg.get("hf_hub_filename") else ["model.safetensors", "pytorch_model.bin"]
    return any(isinstance(try_to_load_from_cache(repo, n), str) for n in names)


def _probe(url: str, timeout: float) -> str | None:
    """``None`` when a ``HEAD`` request for ``url`` (the weights file on the hub) succeeds (2xx,
    redirects followed) within ``timeout`` s, else why not. It runs in a worker thread with an
    overall deadline, so neither a hanging name resolver nor a server that accepts the
    connection and never answers can stall the caller."""
    import concurrent.futures
    import urllib.request

    def head() -> None:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout):
            pass  # HTTP errors (404, 5xx, ...) raise HTTPError: the file cannot be downloaded

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    try:
        pool.submit(head).result(timeout=timeout + 0.5)
    except concurrent.futures.TimeoutError:
        return f"no answer from {url} within {timeout:g} s"
    except Exception as e:  # noqa: BLE001 - URLError, HTTPError, socket timeout, refused, bad URL
        reason = getattr(e, "reason", None) or e
        return f"{url}: {type(e).__name__}: {reason}"
    finally:
        pool.shutdown(wait=False)
    return None


def check_hub(name: str, timeout: float = _HUB_PROBE_SECONDS) -> list[str]:
    """``[]`` when timm can get ``name``'s pretrained weights (in the local Hugging Face cache,
    or the hub answers within ``timeout`` seconds), else one line saying why not and which local
    file to pass instead (``--weights NAME=/path/to/<file>``, :func:`expected_weight_files`).

    Honours ``HF_HUB_OFFLINE`` (then only the cache counts) and ``HF_ENDPOINT``. Never
    downloads; takes at most about ``timeout`` seconds.
    """
    cfg = timm_pretrained_cfg(name)
    if _hub_cached(cfg):
        return []
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        why = "HF_HUB_OFFLINE is set and they are not in the local hub cache"
    elif cfg.get("hf_hub_id"):
        fname = cfg.get("hf_hub_filename") or "model.safetensors"
        why = _probe(f"{endpoint}/{cfg['hf_hub_id']}/resolve/main/{fname}", timeout)
    else:
        why = _probe(str(cfg.get("url")), timeout)
    if why is None:
        return []
    files = expected_weight_files(name)
    first = files[0].split(" ")[0] if files else "weights.pth"
    return [f"weights of {name}: the Hugging Face hub ({endpoint}) cannot be reached ({why}); "
            f"pass a local file: --weights {name}=/path/to/{first}"
            + (f" (expected: {' or '.join(files)})" if files else "")]


def check_weights_path(path: str | os.PathLike) -> list[str]:
    """``[]`` when ``path`` is an existing file, else why not, in one line: it does not exist,
    or it is a directory (naming the weights files found in it)."""
    path = Path(path).expanduser()
    if path.is_file():
        return []
    if path.is_dir():
        found = sorted(q.name for q in path.iterdir() if q.suffix.lower() in _WEIGHT_SUFFIXES)[:4]
        hint = f" (it holds {', '.join(found)}: name one)" if found else ""
        return [f"weights file {path} is a directory; expected a weights file "
                f"({', '.join(_WEIGHT_SUFFIXES)}){hint}"]
    return [f"weights file {path} does not exist"]


def _reason(e: BaseException, limit: int = 200) -> str:
    """``Type: message`` of a reader's exception on one line; torch's weights-only unpickler (a file
    that pickles code) is said as a refusal naming the object, without its advice to load unsafely."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    if lines and lines[0].startswith("Weights only load failed"):
        what = re.search(r"GLOBAL ([\w.]+)", str(e))
        return (f"refused: it pickles {what.group(1) if what else 'Python objects'}, code that would run when "
                "loaded; a weights file holds tensors only")
    return f"{type(e).__name__}: {lines[0][:limit]}" if lines else type(e).__name__


def _load_file_state_dict(path: Path) -> dict[str, Tensor]:
    suffix = path.suffix.lower()
    try:
        if suffix == ".safetensors":
            from safetensors.torch import load_file
            sd: Any = load_file(str(path), device="cpu")
        else:
            sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - re-raised with the file named
        raise BackboneError(f"{path} is not a weights file this loader can read ({_reason(e)}); "
                            f"expected {_WEIGHT_FORMATS}") from e
    if isinstance(sd, dict):
        for key in ("state_dict_ema", "model_ema", "state_dict", "model"):
            if key in sd and isinstance(sd[key], dict):
                sd = sd[key]
                break
    if not isinstance(sd, dict) or not all(isinstance(v, Tensor) for v in sd.values()):
        raise BackboneError(f"{path} does not hold a state dict of tensors; expected {_WEIGHT_FORMATS}")
    if sd and all(k.startswith("module.") for k in sd):
        sd = {k[len("module."):]: v for k, v in sd.items()}
    return dict(sd)


def _classifier_names(model: nn.Module) -> tuple[str, ...]:
    cls = (getattr(model, "pretrained_cfg", None) or {}).get("classifier", "head")
    return (cls,) if isinstance(cls, str) else tuple(cls)


def _fmt_keys(keys: Sequence[str], limit: int = 8) -> str:
    return ", ".join(keys[:limit]) + (f" … (+{len(keys) - limit} more)" if len(keys) > limit else "")


def _raise_if_unfit(path: Path, model: nn.Module, noun: str, missing: Sequence[str],
                    unexpected: Sequence[str], mismatches: Sequence[str]) -> None:
    """One :class:`BackboneError` naming the ``missing`` / ``unexpected`` entries (``noun``:
    "arrays" of an .npz file, "keys" of a state dict) and the shape ``mismatches`` (already
    formatted "KEY file SHAPE vs model SHAPE"); nothing when all three are empty."""
    parts = [f"{len(v)} {what}: {_fmt_keys(v)}" for what, v in
             ((f"missing {noun}", missing), (f"unexpected {noun}", unexpected), ("shape mismatches", mismatches)) if v]
    if parts:
        raise BackboneError(f"weights file {path} does not fit {type(model).__name__} "
                            f"({getattr(model, 'embed_dim', '?')} wide, {len(getattr(model, 'blocks', []))} blocks): "
                            + "; ".join(parts))


def _npz_layout(model: nn.Module) -> dict[str, tuple[int | None, ...]]:
    """Keys and shapes (``None``: any size) of an original ViT/AugReg ``.npz`` checkpoint for
    ``model`` — the layout timm's ``_load_weights`` reads (Steiner et al. 2022, the
    ``vision_transformer`` release: ``Transformer/encoderblock_<i>/...``). The patch kernel may
    have another patch size and the position table another grid: timm resamples both."""
    D = int(model.embed_dim)
    out: dict[str, tuple[int | None, ...]] = {
        "embedding/kernel": (None, None, int(model.patch_embed.proj.weight.shape[1]), D),
        "embedding/bias": (D,), "cls": (1, 1, D), "Transformer/posembed_input/pos_embedding": (1, None, D),
        "Transformer/encoder_norm/scale": (D,), "Transformer/encoder_norm/bias": (D,),
        "head/kernel": (D, None), "head/bias": (None,)}
    for i, blk in enumerate(model.blocks):
        b = f"Transformer/encoderblock_{i}/"
        H, hidden = int(blk.attn.num_heads), int(blk.mlp.fc1.out_features)
        hd = D // H
        for ln in ("LayerNorm_0", "LayerNorm_2"):
            out[f"{b}{ln}/scale"] = out[f"{b}{ln}/bias"] = (D,)
        for n in ("query", "key", "value"):
            out[f"{b}MultiHeadDotProductAttention_1/{n}/kernel"] = (D, H, hd)
            out[f"{b}MultiHeadDotProductAttention_1/{n}/bias"] = (H, hd)
        out[f"{b}MultiHeadDotProductAttention_1/out/kernel"] = (H, hd, D)
        out[f"{b}MultiHeadDotProductAttention_1/out/bias"] = (D,)
        out.update({f"{b}MlpBlock_3/Dense_0/kernel": (D, hidden), f"{b}MlpBlock_3/Dense_0/bias": (hidden,),
                    f"{b}MlpBlock_3/Dense_1/kernel": (hidden, D), f"{b}MlpBlock_3/Dense_1/bias": (D,)})
    return out


def _check_npz(model: nn.Module, path: Path) -> None:
    """Name the missing, unexpected and wrong-shape arrays of an original-layout ``.npz`` before
    timm copies them (its reader stops at the first one with a bare size error). big_vision
    layouts (``params/...``, stacked ``encoderblock``) are left to timm's reader."""
    import numpy as np

    try:
        with np.load(path) as npz:
            shapes = {k: tuple(npz[k].shape) for k in npz.files}
    except Exception as e:  # noqa: BLE001 - not a readable .npz
        raise BackboneError(f"{path} is not a readable .npz weights file ({_reason(e)}); "
                            f"expected {_WEIGHT_FORMATS}") from e
    if any(k.startswith("params/") for k in shapes) or "Transformer/encoderblock/LayerNorm_0/scale" in shapes:
        return
    layout = _npz_layout(model)
    missing = sorted(set(layout) - set(shapes))
    # pre_logits: the representation layer of old in21k files, which timm deliberately ignores
    unexpected = sorted(k for k in set(shapes) - set(layout) if not k.startswith("pre_logits/"))
    wrong = sorted(k for k in set(layout) & set(shapes) if len(layout[k]) != len(shapes[k])
                   or any(e is not None and e != g for e, g in zip(layout[k], shapes[k])))
    _raise_if_unfit(path, model, "arrays", missing, unexpected,
                    [f"{k} file {shapes[k]} vs model {tuple('*' if e is None else e for e in layout[k])}"
                     for k in wrong])


def load_weights_file(model: nn.Module, path: Path, head: str, timm_filter: bool) -> None:
    """Strictly load the weights file ``path`` (``.npz`` JAX/big_vision, else a torch or
    safetensors state dict) into ``model``, in place.

    ``head="keep"`` loads the file's classifier too (it must fit ``num_classes``);
    ``head="replace"`` keeps the model's freshly initialised classifier. ``timm_filter`` passes
    the state dict through timm's ``checkpoint_filter_fn`` first (position-embedding resize,
    key renames of timm tags).

    Raises:
        BackboneError: a file that cannot be read, missing, unexpected or mis-shaped keys, or a
            classifier that does not match ``num_classes`` under ``head="keep"``.
    """
    if path.suffix.lower() == ".npz":
        if not hasattr(model, "load_pretrained"):
            raise BackboneError(f"{path}: .npz (JAX) weights need a timm VisionTransformer")
        _check_npz(model, path)
        head_before = {n: getattr(model, n).state_dict() for n in _classifier_names(model)
                       if isinstance(getattr(model, n, None), nn.Module)}
        if head == "keep":
            import numpy as np
            with np.load(path) as npz:
                kernel = [npz[k].shape for k in npz.files if k.endswith("head/kernel")]
            if not kernel or kernel[0][-1] != getattr(model, "num_classes", None):
                raise BackboneError(f"{path}: classifier does not match num_classes="
                                    f"{getattr(model, 'num_classes', '?')} (head/kernel "
                                    f"{kernel[0] if kernel else 'missing'}); use head='replace'")
        try:
            model.load_pretrained(str(path))  # timm's big_vision/AugReg .npz reader
        except Exception as e:  # noqa: BLE001
            raise BackboneError(f"could not load JAX weights {path} into {type(model).__name__}: "
                                f"{type(e).__name__}: {e}") from e
        if head == "replace":
            for n, sd in head_before.items():
                getattr(model, n).load_state_dict(sd)
        return
    sd = _load_file_state_dict(path)
    if timm_filter:
        from timm.models.vision_transformer import checkpoint_filter_fn
        try:
            sd = checkpoint_filter_fn(sd, model)
        except Exception as e:  # noqa: BLE001
            raise BackboneError(f"{path}: the state dict does not fit {type(model).__name__}: "
                                f"{type(e).__name__}: {e}") from e
    own = model.state_dict()
    head_keys = {f"{c}.{p}" for c in _classifier_names(model) for p in ("weight", "bias")} & set(own)
    head_mismatch = sorted(k for k in head_keys if k in sd and tuple(sd[k].shape) != tuple(own[k].shape))
    if head == "keep" and (head_mismatch or not head_keys <= set(sd)):
        detail = "; ".join(f"{k}: file {tuple(sd[k].shape)} vs model {tuple(own[k].shape)}" for k in head_mismatch)
        raise BackboneError(f"{path}: classifier does not match num_classes={getattr(model, 'num_classes', '?')} "
                            f"({detail or 'classifier keys missing from the file'}); use head='replace'")
    drop = head_keys if head == "replace" else set(head_mismatch)
    sd = {k: v for k, v in sd.items() if k not in drop}
    shapes = sorted(k for k in set(sd) & set(own) if tuple(sd[k].shape) != tuple(own[k].shape))
    _raise_if_unfit(path, model, "keys", sorted(set(own) - set(sd) - drop), sorted(set(sd) - set(own)),
                    [f"{k} file {tuple(sd[k].shape)} vs model {tuple(own[k].shape)}" for k in shapes])
    model.load_state_dict(sd, strict=False)  # only the dropped classifier keys stay at their init
