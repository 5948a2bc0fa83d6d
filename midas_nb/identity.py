"""Identity and writes: what a cached artifact or a result depends on, and how it reaches disk.

Every cache and every result store of midas_nb goes through this module, so that a number is
recomputed exactly when something it depends on changed, and a crash or a second worker never
leaves a half-written file that is later read as valid: content hashes (:func:`hash_json`,
:func:`file_digest`, :func:`tensor_digest`, :func:`state_dict_digest`), a dataset split's
identity by content (:func:`dataset_identity`), atomic writes (:func:`atomic_write`) and
verified cache files (:func:`save_verified`, :func:`load_or_build`). Decisions 0015 and 0028.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import tempfile
import threading
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable, TypeVar

import numpy as np

__all__ = [
    "RESULT_FORMAT_VERSION", "IDENTITY_VERSION",
    "canonical_json", "hash_json", "hash_bytes", "jsonable",
    "file_digest", "file_digest_memo", "add_file_digests", "tensor_digest", "state_dict_digest",
    "DatasetIdentity", "dataset_identity", "annotation_stamp",
    "atomic_write", "new_file_mode", "atomic_write_bytes", "atomic_write_text",
    "CacheIntegrityError", "CacheIntegrityWarning", "save_verified", "load_verified", "load_or_build",
    "torch_payload", "load_torch_payload", "cache_events", "reset_cache_events",
]

#: Version of the meaning of result rows; bump when a metric definition changes (it enters every
#: result-store cell key, so old rows are never served for the new definition).
#: 2: per-image mIoU / IDAUC values and ``weights_digest`` in every protocol row; paired CIs.
RESULT_FORMAT_VERSION: int = 2

#: Version of :func:`dataset_identity`'s recipe (enters every identity it returns).
IDENTITY_VERSION: str = "midas_nb.dataset_identity/1"

_MAGIC = b"MIDASNB-CACHE/1\n"
T = TypeVar("T")


# ---- hashing ---------------------------------------------------------------------------------

def jsonable(o: Any) -> Any:
    """``json.dumps`` fallback (``default=jsonable``) for numpy / torch / pandas / path values (sets →
    sorted lists, pandas ``NA``/``NaT`` → ``None``); ``TypeError`` for any other type, as ``json.dumps``."""
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    if isinstance(o, (set, frozenset)):
        return sorted(o, key=str)
    if isinstance(o, tuple):
        return list(o)
    if hasattr(o, "isoformat"):
        return o.isoformat()
    if type(o).__name__ in ("NAType", "NaTType"):     # pandas missing values
        return None
    if hasattr(o, "detach") and hasattr(o, "tolist"):  # torch.Tensor without importing torch
        return o.detach().cpu().tolist()
    if type(o).__module__ == "torch" and type(o).__name__ in ("dtype", "device"):
        return str(o)
    raise TypeError(f"value of type {type(o).__name__} is not JSON-serialisable: {o!r:.80}")


def canonical_json(obj: Any) -> str:
    """Deterministic JSON (sorted keys, no whitespace, ``NaN`` allowed) used for hashing.

    Raises:
        TypeError: for a value that has no JSON form (never silently ``str()``-ed, so two
            different objects cannot hash alike by their repr).
    """
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=jsonable)


def hash_json(obj: Any, n: int = 16) -> str:
    """First ``n`` hex digits of the SHA-256 of :func:`canonical_json` of ``obj``."""
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()[:n]


def hash_bytes(data: bytes | bytearray | memoryview, n: int | None = None) -> str:
    """SHA-256 hex digest of ``data`` (first ``n`` digits when given)."""
    h = hashlib.sha256(data).hexdigest()
    return h if n is None else h[:n]


_FILE_DIGESTS: dict[tuple, str] = {}
_FILE_LOCK = threading.Lock()


def file_digest(path: str | os.PathLike) -> str:
    """SHA-256 hex digest of a file's bytes, memoised per process.

    The memo is keyed by the resolved path, size, ``st_mtime_ns``, ``st_ctime_ns`` and inode,
    so a file edited in place (or replaced) during the process is hashed again.

    Raises:
        FileNotFoundError: the file does not exist.
    """
    p = Path(path)
    st = os.stat(p)
    key = (str(p.resolve()), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    with _FILE_LOCK:
        hit = _FILE_DIGESTS.get(key)
    if hit is not None:
        return hit
    with open(p, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    with _FILE_LOCK:
        _FILE_DIGESTS[key] = digest
        _EVENTS["file_hashed"] += 1
    return digest


def file_digest_memo() -> dict[tuple, str]:
    """A copy of this process's :func:`file_digest` memo: ``{(resolved path, size, mtime_ns,
    ctime_ns, inode): SHA-256 hex}``."""
    with _FILE_LOCK:
        return dict(_FILE_DIGESTS)


def add_file_digests(entries: dict[tuple, str]) -> None:
    """Add ``entries`` (keys and digests as :func:`file_digest_memo` gives them, e.g. written by
    another process) to this process's :func:`file_digest` memo."""
    with _FILE_LOCK:
        _FILE_DIGESTS.update(entries)


def tensor_digest(t: Any, n: int | None = 16) -> str:
    """SHA-256 of a tensor's (or array's) dtype, shape and bytes (contiguous, on CPU).

    Equal digests ⇔ bit-identical tensors (up to SHA-256 collisions); ``-0.0`` and ``0.0`` differ.
    """
    h = hashlib.sha256()
    _update_tensor(h, t)
    return h.hexdigest() if n is None else h.hexdigest()[:n]


def _update_tensor(h: "hashlib._Hash", t: Any) -> None:
    if hasattr(t, "detach"):
        import torch

        t = t.detach().cpu().contiguous()
        h.update(f"{t.dtype}|{tuple(t.shape)}|".encode())
        if t.numel():   # raw bytes through a uint8 view (bfloat16 has no numpy dtype)
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        return
    a = np.ascontiguousarray(np.asarray(t))
    h.update(f"{a.dtype}|{a.shape}|".encode())
    h.update(a.tobytes())


def state_dict_digest(obj: Any, n: int = 16) -> str:
    """Digest of a model's weights: every tensor of ``obj.state_dict()`` (or of a mapping of
    tensors) — name, dtype, shape and bytes, in sorted name order. 16 hex digits by default.

    This is the ``weights_digest`` every protocol row records: rows computed from different
    weights under one checkpoint id are visible as different digests.
    """
    sd = obj.state_dict() if hasattr(obj, "state_dict") else obj
    h = hashlib.sha256()
    for name in sorted(sd):
        h.update(name.encode() + b"\0")
        _update_tensor(h, sd[name])
    return h.hexdigest()[:n]


# ---- dataset identity ------------------------------------------------------------------------

@dataclass(frozen=True)
class DatasetIdentity:
    """Content identity of a dataset split (16-hex-digit components, see :func:`dataset_identity`).

    Attributes:
        images: image ids and the bytes of every image (files; or the transformed tensors for
            datasets without files).
        labels: dataset kind, split, class names and per-image labels.
        annotations: part names, raw part keypoints ``[M,P,3]`` and boxes ``[M,4]`` of the
            split's images, and the patch size of the masks.
        transform: transform class and parameters, dataset preprocessing options.
        n: number of images.
    """

    images: str
    labels: str
    annotations: str
    transform: str
    n: int

    @property
    def model_inputs(self) -> str:
        """What a model sees and is trained on: images + labels + transform (no annotations)."""
        return hash_json([IDENTITY_VERSION, "model_inputs", self.images, self.labels, self.transform, self.n])

    @property
    def full(self) -> str:
        """Everything: model inputs and the part / box annotations evaluation reads."""
        return hash_json([IDENTITY_VERSION, "full", self.images, self.labels, self.annotations,
                          self.transform, self.n])


def _transform_spec(transform: Any) -> dict[str, Any]:
    """Class and public scalar / tuple parameters of a joint transform."""
    spec: dict[str, Any] = {"class": type(transform).__name__}
    for k, v in sorted(vars(transform).items()) if hasattr(transform, "__dict__") else []:
        if k.startswith("_"):
            continue
        if isinstance(v, (bool, int, float, str, type(None))):
            spec[k] = v
        elif isinstance(v, (tuple, list)) and all(isinstance(x, (bool, int, float, str)) for x in v):
            spec[k] = list(v)
    if len(spec) == 1 and not hasattr(transform, "__dict__") and transform is not None:
        spec["repr"] = repr(transform)
    return spec


def _records_annotated(ds: Any) -> dict[str, Any]:
    """Per-item records of an :class:`midas_nb.data.AnnotatedDataset` from its files."""
    parts = np.ascontiguousarray(np.asarray(ds.raw_parts, dtype=np.float32))
    boxes = np.ascontiguousarray(np.asarray(ds.raw_boxes, dtype=np.float32))
    options = ds.identity_options() if hasattr(ds, "identity_options") else {}
    return dict(
        kind=type(ds).__name__,
        split=str(getattr(ds, "split", "")),
        classes=[str(c) for c in ds.classes],
        ids=[str(i) for i in ds.image_ids],
        image=[file_digest(p) for p in ds.paths],
        ann=[hash_bytes(parts[i].tobytes() + boxes[i].tobytes(), 32) for i in range(len(ds.paths))],
        labels=[int(v) for v in ds.labels],
        part_names=[str(p) for p in ds.part_names],
        patch_size=int(getattr(ds, "patch_size", 0)),
        transform=dict(_transform_spec(ds.transform), options=options),
    )


def _records_generic(ds: Any) -> dict[str, Any]:
    """Per-item records of any dataset of ``Sample``: every sample is read (its image as the
    model sees it, so the transform is implicit in ``image``)."""
    ids, image, ann, labels = [], [], [], []
    for i in range(len(ds)):
        s = ds[i]
        ids.append(str(getattr(s, "image_id", i)))
        image.append(tensor_digest(s.image, 32))
        h = hashlib.sha256()
        for name in ("parts", "box", "part_mask", "box_mask"):
            v = getattr(s, name, None)
            if v is not None:
                h.update(name.encode())
                _update_tensor(h, v)
        ann.append(h.hexdigest()[:32])
        labels.append(int(s.label))
    return dict(
        kind=type(ds).__name__,
        split=str(getattr(ds, "split", "")),
        classes=[str(c) for c in (getattr(ds, "classes", None) or [])],
        ids=ids, image=image, ann=ann, labels=labels,
        part_names=[str(p) for p in (getattr(ds, "part_names", None) or [])],
        patch_size=int(getattr(ds, "patch_size", 0) or 0),
        transform={"class": "samples (transform implicit in the image tensors)"},
    )


def _records(ds: Any) -> dict[str, Any]:
    from torch.utils.data import Subset

    if isinstance(ds, Subset):
        base = _records(ds.dataset)
        idx = [int(i) for i in ds.indices]
        out = dict(base)
        for k in ("ids", "image", "ann", "labels"):
            out[k] = [base[k][i] for i in idx]
        out["kind"] = f"Subset({base['kind']})"
        return out
    if all(hasattr(ds, a) for a in ("paths", "image_ids", "raw_parts", "raw_boxes", "transform", "labels")):
        return _records_annotated(ds)
    return _records_generic(ds)


def dataset_identity(dataset: Any) -> DatasetIdentity:
    """Content identity of a dataset split, path-independent (see :class:`DatasetIdentity`).

    For a :class:`midas_nb.data.AnnotatedDataset` (CUB, Aircraft, Cars, the synthetic set) the
    image *files* are hashed (bytes, memoised per process by :func:`file_digest`: cheap, about
    0.1 s for 2,300 JPEGs) together with the parsed annotations of the split's images; a
    ``torch.utils.data.Subset`` is the identity of its base restricted to its indices; any
    other dataset of ``Sample`` is read sample by sample (tensors hashed).

    Moving the dataset directory keeps every component; editing one keypoint line changes
    ``annotations`` (and ``full``) of the split holding that image only; replacing an image
    changes ``images``.

    Raises:
        ValueError: for an empty dataset.
        FileNotFoundError: an image file listed by the dataset is missing.
    """
    n = len(dataset)
    if n == 0:
        raise ValueError("dataset is empty; an identity needs at least one image")
    r = _records(dataset)
    return DatasetIdentity(
        images=hash_json(["images", r["ids"], r["image"]]),
        labels=hash_json(["labels", r["kind"], r["split"], r["classes"], r["labels"]]),
        annotations=hash_json(["annotations", r["part_names"], r["patch_size"], r["ann"]]),
        transform=hash_json(["transform", r["transform"]]),
        n=n,
    )


_IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm"})


def annotation_stamp(root: str | os.PathLike | None, depth: int = 2) -> tuple:
    """``(relative path, size, st_mtime_ns)`` of every non-image file within ``depth`` levels of
    ``root`` (the annotation files of CUB, FGVC-Aircraft, Stanford Cars), sorted; ``()`` for
    ``None`` or a missing root. Cheap (directory listings and ``stat`` only): callers that keep
    parsed datasets alive use it to notice edited annotation files."""
    if root is None or not Path(root).is_dir():
        return ()
    out = []
    for d, dirs, files in os.walk(root, followlinks=True):
        rel = os.path.relpath(d, root)
        if (0 if rel == os.curdir else rel.count(os.sep) + 1) + 1 >= depth:
            dirs.clear()   # ``depth`` levels of folders are listed, the root being the first
        for path in (os.path.join(d, f) for f in files if Path(f).suffix.lower() not in _IMAGE_SUFFIXES):
            try:
                st = os.stat(path)
            except OSError:
                continue
            out.append((os.path.relpath(path, root), st.st_size, st.st_mtime_ns))
    return tuple(sorted(out))


# ---- atomic writes ---------------------------------------------------------------------------

_TMP_SUFFIX = ".tmp"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def new_file_mode(directory: bool = False) -> int:
    """``0o666`` (a file) or ``0o777`` (a folder) less the umask, as ``open``/``mkdir`` give, where
    ``mkstemp``/``mkdtemp`` give ``0o600``/``0o700``, unreadable to the group sharing a store."""
    try:  # Linux shows the umask without changing it
        return (0o777 if directory else 0o666) & ~int(re.search(r"^Umask:\s*([0-7]+)", Path(
            "/proc/self/status").read_text(), re.M).group(1), 8)
    except (OSError, AttributeError, ValueError):
        mask = os.umask(0o022)  # read by setting it back at once
        os.umask(mask)
        return (0o777 if directory else 0o666) & ~mask


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> Path:
    """Write a file atomically through ``write(binary_file)``.

    ``write`` writes into a temporary file ``.<name>.<random>.tmp`` in ``path``'s directory
    (unique per process and call, with the umask's mode, :func:`new_file_mode`), which is
    flushed and ``fsync``-ed, then ``os.replace``-d over ``path``; the directory is ``fsync``-ed.
    Readers see either the old file or the complete new one. On any error the temporary file is
    removed and the error re-raised.

    Returns:
        ``path`` as a ``Path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=_TMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), new_file_mode())
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(path.parent)
    return path


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """:func:`atomic_write` of ``data``."""
    return atomic_write(path, lambda f: f.write(data))


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """:func:`atomic_write` of ``text`` (UTF-8)."""
    return atomic_write(path, lambda f: f.write(text.encode("utf-8")))


# ---- verified cache files --------------------------------------------------------------------

class CacheIntegrityError(ValueError):
    """A cache file is truncated, corrupt, or holds another key than its name says."""


class CacheIntegrityWarning(UserWarning):
    """A cache file failed its integrity check and is being rebuilt."""


_EVENTS: Counter = Counter()
_PROBLEMS: list[dict[str, str]] = []


def cache_events() -> dict[str, Any]:
    """Counts of this process's cache events — ``loaded``, ``built``, ``corrupt``,
    ``file_hashed`` (files read and hashed by :func:`file_digest`, memo misses) — and the
    ``problems`` (path, reason) of every file that failed its check (then rebuilt)."""
    return dict(loaded=_EVENTS["loaded"], built=_EVENTS["built"], corrupt=_EVENTS["corrupt"],
                file_hashed=_EVENTS["file_hashed"], problems=list(_PROBLEMS))


def reset_cache_events() -> None:
    """Clear :func:`cache_events` (tests)."""
    _EVENTS.clear()
    _PROBLEMS.clear()


def save_verified(path: str | os.PathLike, payload: bytes, key: Any = None) -> Path:
    """Write ``payload`` atomically as a verified cache file.

    Layout: ``MIDASNB-CACHE/1\\n``, one JSON line ``{"key", "length", "sha256"}``, then the
    payload bytes. ``key`` (JSON-able) is stored so a reader can check the file holds what its
    name says.
    """
    header = json.dumps(dict(key=key, length=len(payload), sha256=hash_bytes(payload)),
                        sort_keys=True, default=jsonable, allow_nan=True).encode() + b"\n"

    def write(f: BinaryIO) -> None:
        f.write(_MAGIC)
        f.write(header)
        f.write(payload)

    return atomic_write(path, write)


def load_verified(path: str | os.PathLike, key: Any = None) -> bytes:
    """The payload of a file written by :func:`save_verified`, after checking it.

    Args:
        path: the file.
        key: when not ``None``, the key the file must hold (compared as canonical JSON).

    Raises:
        FileNotFoundError: no such file.
        CacheIntegrityError: not a cache container, truncated (length differs), corrupt
            (SHA-256 differs), or another key.
    """
    p = Path(path)
    data = p.read_bytes()
    if not data.startswith(_MAGIC):
        raise CacheIntegrityError(f"{p}: not a midas_nb cache file (no {_MAGIC[:-1].decode()} header)")
    nl = data.find(b"\n", len(_MAGIC))
    if nl < 0:
        raise CacheIntegrityError(f"{p}: truncated header")
    try:
        head = json.loads(data[len(_MAGIC):nl])
    except json.JSONDecodeError as e:
        raise CacheIntegrityError(f"{p}: unreadable header ({e})") from None
    payload = memoryview(data)[nl + 1:]
    if len(payload) != head.get("length"):
        raise CacheIntegrityError(f"{p}: truncated or extended: {len(payload)} payload bytes, "
                                  f"header says {head.get('length')}")
    if hash_bytes(payload) != head.get("sha256"):
        raise CacheIntegrityError(f"{p}: corrupt: payload SHA-256 differs from the header's")
    if key is not None and canonical_json(head.get("key")) != canonical_json(json.loads(canonical_json(key))):
        raise CacheIntegrityError(f"{p}: holds key {head.get('key')!r}, expected {key!r}")
    return bytes(payload)


def torch_payload(obj: Any) -> bytes:
    """``torch.save`` bytes of ``obj`` (tensors, dicts, lists, numbers, strings)."""
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def load_torch_payload(payload: bytes, map_location: Any = "cpu") -> Any:
    """Inverse of :func:`torch_payload` (``weights_only=True``: no code is unpickled)."""
    import torch

    return torch.load(io.BytesIO(payload), map_location=map_location, weights_only=True)


def report_corrupt(path: str | os.PathLike, reason: str, what: str = "cache file") -> None:
    """Warn (:class:`CacheIntegrityWarning`) and count a cache file that failed its check."""
    _EVENTS["corrupt"] += 1
    _PROBLEMS.append(dict(path=str(path), reason=reason))
    warnings.warn(CacheIntegrityWarning(f"{what} {path} failed its integrity check and is rebuilt: {reason}"),
                  stacklevel=3)


def load_or_build(
    path: str | os.PathLike,
    build: Callable[[], T],
    *,
    key: Any,
    encode: Callable[[T], bytes] = torch_payload,
    decode: Callable[[bytes], T] = load_torch_payload,
    validate: Callable[[T], str | None] | None = None,
    what: str = "cache file",
) -> tuple[T, bool]:
    """The verified cached value at ``path``, or ``build()`` saved there.

    A file that is truncated, corrupt, holds another key, cannot be decoded, or fails
    ``validate`` (which returns a reason, or ``None`` when the value is fine) is reported —
    :class:`CacheIntegrityWarning` and :func:`cache_events` ``["corrupt"]`` — and rebuilt; it is
    never returned.

    Returns:
        ``(value, loaded_from_cache)``.
    """
    p = Path(path)
    if p.exists():
        try:
            value = decode(load_verified(p, key))
            problem = validate(value) if validate is not None else None
        except CacheIntegrityError as e:
            problem = str(e)
        except Exception as e:  # noqa: BLE001 - an undecodable payload is a corrupt file
            problem = f"undecodable payload ({type(e).__name__}: {e})"
        if problem is None:
            _EVENTS["loaded"] += 1
            return value, True
        report_corrupt(p, problem, what)
    value = build()
    save_verified(p, encode(value), key)
    _EVENTS["built"] += 1
    return value, False
