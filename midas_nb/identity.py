"""Identity and writes for every cache and result store: content hashes, a dataset split's identity by
content, atomic writes and verified cache files (decisions 0015 and 0028)."""
from __future__ import annotations

import contextlib
import fcntl
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
from typing import Any, BinaryIO, Callable, Iterator, TypeVar

import numpy as np

__all__ = ["RESULT_FORMAT_VERSION", "IDENTITY_VERSION", "canonical_json", "hash_json", "hash_bytes", "jsonable",
           "file_digest", "save_file_digests", "load_file_digests", "tensor_digest", "state_dict_digest",
           "DatasetIdentity", "dataset_identity", "annotation_stamp", "atomic_write", "new_file_mode",
           "atomic_write_bytes", "atomic_write_text", "file_lock", "CacheIntegrityError", "CacheIntegrityWarning",
           "save_verified", "load_verified", "load_or_build", "torch_payload", "load_torch_payload", "cache_events",
           "reset_cache_events"]

#: Version of the meaning of result rows, in every result-store cell key; bump when a metric changes.
RESULT_FORMAT_VERSION: int = 2

#: Version of :func:`dataset_identity`'s recipe (enters every identity it returns).
IDENTITY_VERSION: str = "midas_nb.dataset_identity/1"

_MAGIC = b"MIDASNB-CACHE/1\n"
T = TypeVar("T")


def jsonable(o: Any) -> Any:
    """``json.dumps``'s ``default`` for numpy / torch / pandas / path / set values; ``TypeError`` for others."""
    if isinstance(o, (np.generic, np.ndarray)):
        return o.tolist()
    if isinstance(o, Path) or type(o).__module__ == "torch" and type(o).__name__ in ("dtype", "device"):
        return str(o)
    if isinstance(o, (set, frozenset)):
        return sorted(o, key=str)
    if type(o).__name__ in ("NAType", "NaTType"):     # pandas missing values (NaT has an isoformat too)
        return None
    if hasattr(o, "isoformat"):
        return o.isoformat()
    if hasattr(o, "detach") and hasattr(o, "tolist"):  # torch.Tensor without importing torch
        return o.detach().cpu().tolist()
    raise TypeError(f"value of type {type(o).__name__} is not JSON-serialisable: {o!r:.80}")


def canonical_json(obj: Any) -> str:
    """Deterministic JSON (sorted keys, no whitespace, ``NaN`` allowed) for hashing; ``TypeError`` as json."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=jsonable)


def hash_json(obj: Any, n: int = 16) -> str:
    """First ``n`` hex digits of the SHA-256 of :func:`canonical_json` of ``obj``."""
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()[:n]


def hash_bytes(data: bytes | bytearray | memoryview, n: int | None = None) -> str:
    """SHA-256 hex digest of ``data`` (first ``n`` digits when given)."""
    return hashlib.sha256(data).hexdigest()[:n]


_FILE_DIGESTS: dict[tuple, str] = {}
_FILE_LOCK = threading.Lock()


def file_digest(path: str | os.PathLike) -> str:
    """SHA-256 hex digest of a file, memoised by resolved path, size, mtime, ctime, inode; ``FileNotFoundError``."""
    st = os.stat(path)
    key = (str(Path(path).resolve()), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    if (hit := _FILE_DIGESTS.get(key)) is not None:
        return hit
    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    with _FILE_LOCK:
        _FILE_DIGESTS[key] = digest
        _EVENTS["file_hashed"] += 1
    return digest


def save_file_digests(path: str | os.PathLike) -> Path:
    """Merge this process's :func:`file_digest` memo into the JSON file ``path`` (a sweep's preparation job's)."""
    load_file_digests(path)
    with _FILE_LOCK:
        return atomic_write(path, json.dumps({json.dumps(list(k)): v for k, v in _FILE_DIGESTS.items()}))


def load_file_digests(path: str | os.PathLike) -> int:
    """Add the digests :func:`save_file_digests` wrote to this process's memo; the number read."""
    try:
        entries = json.loads(Path(path).read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return 0
    entries = entries if isinstance(entries, dict) else {}
    with _FILE_LOCK:
        _FILE_DIGESTS.update({tuple(json.loads(k)): v for k, v in entries.items()})
    return len(entries)


def tensor_digest(t: Any, n: int | None = 16) -> str:
    """SHA-256 of a tensor's (or array's) dtype, shape and bytes: equal only for bit-identical tensors."""
    _update_tensor(h := hashlib.sha256(), t)
    return h.hexdigest()[:n]


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
    """SHA-256 of ``obj.state_dict()``'s (or a mapping's) names, dtypes, shapes, bytes: rows' ``weights_digest``."""
    sd = obj.state_dict() if hasattr(obj, "state_dict") else obj
    h = hashlib.sha256()
    for name in sorted(sd):
        h.update(name.encode() + b"\0")
        _update_tensor(h, sd[name])
    return h.hexdigest()[:n]


@dataclass(frozen=True)
class DatasetIdentity:
    """Content identity of a dataset split (:func:`dataset_identity`): 16-hex-digit hashes of ``images``
    (ids, bytes), ``labels`` (kind, split, classes, labels), ``annotations`` (part names, keypoints
    ``[M,P,3]``, boxes ``[M,4]``, mask patch size), ``transform`` (class, parameters); ``n`` images."""

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
        return hash_json([IDENTITY_VERSION, "full", self.images, self.labels, self.annotations, self.transform, self.n])


def _transform_spec(transform: Any) -> dict[str, Any]:
    items = [(k, v) for k, v in (vars(transform).items() if hasattr(transform, "__dict__") else []) if k[:1] != "_"]
    scalar = (bool, int, float, str)
    spec = {"class": type(transform).__name__, **{k: v for k, v in items if v is None or isinstance(v, scalar)},
            **{k: list(v) for k, v in items if isinstance(v, (tuple, list)) and all(isinstance(x, scalar) for x in v)}}
    if len(spec) == 1 and not hasattr(transform, "__dict__") and transform is not None:
        spec["repr"] = repr(transform)
    return spec


def _records(ds: Any) -> dict[str, Any]:
    """The split's kind, classes, parts and per-item records (an annotated dataset's files, else by sample)."""
    from torch.utils.data import Subset

    if isinstance(ds, Subset):
        base = _records(ds.dataset)
        idx = [int(i) for i in ds.indices]
        picked = {k: [base[k][i] for i in idx] for k in ("ids", "image", "ann", "labels")}
        return dict(base, **picked, kind=f"Subset({base['kind']})")
    out = dict(kind=type(ds).__name__, split=str(getattr(ds, "split", "")),
               classes=[str(c) for c in (getattr(ds, "classes", None) or [])],
               part_names=[str(p) for p in (getattr(ds, "part_names", None) or [])],
               patch_size=int(getattr(ds, "patch_size", 0) or 0))
    if all(hasattr(ds, a) for a in ("paths", "image_ids", "raw_parts", "raw_boxes", "transform", "labels")):
        parts = np.ascontiguousarray(np.asarray(ds.raw_parts, dtype=np.float32))
        boxes = np.ascontiguousarray(np.asarray(ds.raw_boxes, dtype=np.float32))
        options = ds.identity_options() if hasattr(ds, "identity_options") else {}
        return dict(out, ids=[str(i) for i in ds.image_ids], image=[file_digest(p) for p in ds.paths],
                    ann=[hash_bytes(parts[i].tobytes() + boxes[i].tobytes(), 32) for i in range(len(ds.paths))],
                    labels=[int(v) for v in ds.labels], transform=dict(_transform_spec(ds.transform), options=options))
    ids, image, ann, labels = [], [], [], []
    for i in range(len(ds)):
        s = ds[i]
        ids.append(str(getattr(s, "image_id", i)))
        image.append(tensor_digest(s.image, 32))
        h = hashlib.sha256()
        for name in ("parts", "box", "part_mask", "box_mask"):
            if (v := getattr(s, name, None)) is not None:
                h.update(name.encode())
                _update_tensor(h, v)
        ann.append(h.hexdigest()[:32])
        labels.append(int(s.label))
    return dict(out, ids=ids, image=image, ann=ann, labels=labels,
                transform={"class": "samples (transform implicit in the image tensors)"})


def dataset_identity(dataset: Any) -> DatasetIdentity:
    """Content identity of a split, path-free; ``ValueError`` if empty, ``FileNotFoundError`` for a lost image."""
    n = len(dataset)
    if n == 0:
        raise ValueError("dataset is empty; an identity needs at least one image")
    r = _records(dataset)
    return DatasetIdentity(images=hash_json(["images", r["ids"], r["image"]]),
                           labels=hash_json(["labels", r["kind"], r["split"], r["classes"], r["labels"]]),
                           annotations=hash_json(["annotations", r["part_names"], r["patch_size"], r["ann"]]),
                           transform=hash_json(["transform", r["transform"]]), n=n)


_IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm"})


def annotation_stamp(root: str | os.PathLike | None) -> tuple:
    """``(relative path, size, st_mtime_ns)`` of the non-image files in ``root`` and its folders, sorted, or ``()``."""
    if root is None or not Path(root).is_dir():
        return ()
    out = []
    for d, dirs, files in os.walk(root, followlinks=True):
        if d != os.fspath(root):
            dirs.clear()   # two levels: the root's folders are listed, not theirs
        for path in (os.path.join(d, f) for f in files if Path(f).suffix.lower() not in _IMAGE_SUFFIXES):
            with contextlib.suppress(OSError):   # a file gone since the listing
                st = os.stat(path)
                out.append((os.path.relpath(path, root), st.st_size, st.st_mtime_ns))
    return tuple(sorted(out))


def new_file_mode(directory: bool = False) -> int:
    """``0o666`` (``0o777``: ``directory``) less the umask, as ``open`` gives (``mkstemp``: ``0o600``, no group)."""
    try:  # Linux shows the umask without changing it
        mask = int(re.search(r"^Umask:\s*([0-7]+)", Path("/proc/self/status").read_text(), re.M).group(1), 8)
    except (OSError, AttributeError, ValueError):
        mask = os.umask(0o022)  # read by setting it back at once
        os.umask(mask)
    return (0o777 if directory else 0o666) & ~mask


def atomic_write(path: str | os.PathLike, data: bytes | str | Callable[[BinaryIO], None]) -> Path:
    """Write ``path`` atomically: ``data`` (bytes; text as UTF-8) or what ``data(binary_file)`` writes goes to a
    temporary file beside it (mode :func:`new_file_mode`), ``fsync``-ed and ``os.replace``-d over it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), new_file_mode())
            if callable(data):
                data(f)
            else:
                f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:   # the temporary file goes
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # the directory entry too
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return path


#: :func:`atomic_write` of bytes, of text (UTF-8): the names callers write with
atomic_write_bytes = atomic_write_text = atomic_write


@contextlib.contextmanager
def file_lock(path: str | os.PathLike) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing) for the ``with`` block."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


class CacheIntegrityError(ValueError):
    """A cache file is truncated, corrupt, or holds another key than its name says."""


class CacheIntegrityWarning(UserWarning):
    """A cache file failed its integrity check and is being rebuilt."""


_EVENTS: Counter = Counter()
_PROBLEMS: list[dict[str, str]] = []


def cache_events() -> dict[str, Any]:
    """This process's counts of ``loaded``, ``built``, ``corrupt``, ``file_hashed`` and ``problems`` (path, reason)."""
    return {k: _EVENTS[k] for k in ("loaded", "built", "corrupt", "file_hashed")} | {"problems": list(_PROBLEMS)}


def reset_cache_events() -> None:
    """Clear :func:`cache_events` (tests)."""
    _EVENTS.clear()
    _PROBLEMS.clear()


def save_verified(path: str | os.PathLike, payload: bytes, key: Any = None) -> Path:
    """Write ``payload`` atomically behind ``MIDASNB-CACHE/1\\n`` and a JSON line ``{"key", "length", "sha256"}``."""
    header = canonical_json(dict(key=key, length=len(payload), sha256=hash_bytes(payload))).encode() + b"\n"
    return atomic_write(path, lambda f: f.writelines((_MAGIC, header, payload)))


def load_verified(path: str | os.PathLike, key: Any = None) -> bytes:
    """The payload of a :func:`save_verified` file (``key``: unless ``None``, the key it must hold);
    ``FileNotFoundError``, or :class:`CacheIntegrityError` for a file not one, truncated, corrupt, of another key."""
    data = (p := Path(path)).read_bytes()
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


def load_or_build(path: str | os.PathLike, build: Callable[[], T], *, key: Any,
                  encode: Callable[[T], bytes] = torch_payload, decode: Callable[[bytes], T] = load_torch_payload,
                  validate: Callable[[T], str | None] | None = None, what: str = "cache file") -> tuple[T, bool]:
    """``(value, loaded_from_cache)``: the verified value at ``path``, or ``build()`` saved there; a file failing its
    check, ``decode`` or ``validate`` (a reason, or ``None``) is reported (:func:`report_corrupt`) and rebuilt."""
    if (p := Path(path)).exists():
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
