"""Claims on running sweep cells and the store's locks: exclusive create, heartbeat, expiry.

A worker claims a cell by creating ``cells/<key>.running`` exclusively (under a per-key ``flock``)
and heart-beats its mtime; a claim whose heartbeat is older than its time-to-live, or whose
process on this host is gone, is dead and taken over (docs/decisions/0025-shared-result-store.md).
``flock`` also serialises writers across nodes on NFSv4 / Lustre / GPFS with locking enabled.
"""
from __future__ import annotations

import errno
import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from ..identity import file_lock

__all__ = ["CLAIM_TTL_S", "Claim", "claim_ttl", "file_lock", "read_claim"]

#: default time-to-live of a claim (seconds without a heartbeat before another worker takes it
#: over); ``MIDAS_CLAIM_TTL_S`` overrides it. The heartbeat runs every ttl/4.
CLAIM_TTL_S = 600.0


def claim_ttl() -> float:
    """The claim time-to-live in seconds (``MIDAS_CLAIM_TTL_S``, else :data:`CLAIM_TTL_S`).

    Raises:
        ValueError: ``MIDAS_CLAIM_TTL_S`` is not a positive number.
    """
    raw = os.environ.get("MIDAS_CLAIM_TTL_S")
    if raw is None or raw == "":
        return CLAIM_TTL_S
    try:
        ttl = float(raw)
    except ValueError:
        ttl = -1.0
    if not ttl > 0:
        raise ValueError(f"MIDAS_CLAIM_TTL_S must be a positive number of seconds, got {raw!r}")
    return ttl


def _pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host and is not a zombie (killed, not yet reaped)."""
    try:
        os.kill(pid, 0)
    except OSError as e:
        return e.errno == errno.EPERM
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: existence is all we know
    return stat.rsplit(")", 1)[-1].split()[:1] != ["Z"]


def read_claim(path: str | os.PathLike) -> dict[str, Any] | None:
    """The claim at ``path`` with ``age_s`` (since its last heartbeat) and ``live``, or ``None``.

    A claim is live while its heartbeat is younger than its ``ttl_s`` and, where it was made on
    this host, its process exists. A marker that is not a claim (older layout, unreadable) is
    judged by its age alone, with :func:`claim_ttl`.
    """
    p = Path(path)
    try:
        mtime = p.stat().st_mtime
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        info = json.loads(text)
        if not isinstance(info, dict):
            raise ValueError
    except ValueError:
        info = {}
    age = max(0.0, time.time() - mtime)
    ttl = float(info.get("ttl_s") or claim_ttl())
    live = age < ttl
    if live and info.get("host") == socket.gethostname() and isinstance(info.get("pid"), int):
        live = _pid_alive(info["pid"])
    return dict(info, age_s=age, live=live)


def _lock_path(path: Path) -> Path:
    return path.parent.parent / "locks" / f"{path.name}.lock"


class Claim:
    """An exclusive, heart-beating claim on one cell.

    Use :meth:`acquire`; :meth:`release` stops the heartbeat and removes the file only if it is
    still this claim's.
    """

    def __init__(self, path: Path, token: str, ttl_s: float) -> None:
        self.path, self.token, self.ttl_s = path, token, ttl_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"claim-{path.stem}", daemon=True)
        self._thread.start()

    @classmethod
    def acquire(cls, path: str | os.PathLike, ttl_s: float | None = None,
                **info: Any) -> "Claim | None":
        """Claim ``path``; ``None`` when another worker holds a live claim on it.

        A dead claim (see :func:`read_claim`) is replaced. ``info`` (e.g. the Slurm job id) is
        stored in the claim beside host, pid, start time and time-to-live.
        """
        p = Path(path)
        ttl = float(ttl_s if ttl_s is not None else claim_ttl())
        token = f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}:{time.time_ns()}"
        body = json.dumps(dict(info, host=socket.gethostname(), pid=os.getpid(), started=time.time(),
                               ttl_s=ttl, token=token))
        with file_lock(_lock_path(p)):
            held = read_claim(p)
            if held is not None:
                if held["live"]:
                    return None
                os.unlink(p)  # dead: its heartbeat stopped, or its process is gone
            fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            try:
                os.write(fd, body.encode("utf-8"))
                os.fsync(fd)
            finally:
                os.close(fd)
        return cls(p, token, ttl)

    def _mine(self) -> bool:
        try:
            return json.loads(self.path.read_text(encoding="utf-8")).get("token") == self.token
        except (OSError, ValueError, AttributeError):
            return False

    def _beat(self) -> None:
        while not self._stop.wait(self.ttl_s / 4):
            try:
                os.utime(self.path)
            except FileNotFoundError:
                return

    def release(self) -> None:
        """Stop the heartbeat and remove the claim if it is still this one."""
        self._stop.set()
        self._thread.join(timeout=5)
        with file_lock(_lock_path(self.path)):
            if self._mine():
                self.path.unlink(missing_ok=True)
