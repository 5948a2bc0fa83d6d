"""A single-node Slurm on localhost for the tests: munged, slurmctld, slurmd from Debian's packages.

:func:`start_cluster` writes ``slurm.conf`` (no cgroups: ``proctrack/linuxproc``, ``task/none``) and a munge key into a temporary
directory, starts the three daemons (as root), waits for ``sinfo`` to show the node idle and
returns a :class:`Cluster` whose ``env`` points ``SLURM_CONF`` at the file; :meth:`Cluster.stop`
stops them. :func:`missing` says why no cluster can be started here (``None`` when one can).
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

_TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "sinfo", "scancel")


def missing() -> str | None:
    """Why a test Slurm cannot start here, or ``None``."""
    absent = [t for t in _TOOLS if shutil.which(t) is None and not Path(f"/usr/sbin/{t}").exists()]
    if absent:
        return (f"Slurm is not installed ({', '.join(absent)} missing): "
                "apt-get install -y slurmctld slurmd munge (.ci/run does)")
    if os.geteuid() != 0:
        return "the test Slurm runs its daemons as root (SlurmUser=root); run the tests as root"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _which(tool: str) -> str:
    return shutil.which(tool) or f"/usr/sbin/{tool}"


@dataclass
class Cluster:
    root: Path
    env: dict[str, str]
    max_array_size: int
    procs: list[subprocess.Popen] = field(default_factory=list)

    def run(self, *args: str, check: bool = True) -> str:
        out = subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=60)
        if check and out.returncode != 0:
            raise RuntimeError(f"{' '.join(args)}: {out.stderr.strip() or out.stdout.strip()}")
        return out.stdout

    def stop(self) -> None:
        subprocess.run([_which("scancel"), "--full", "-u", "root"], env=self.env, capture_output=True, timeout=30)
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)


def start_cluster(root: Path, max_array_size: int = 4, cpus: int = 2) -> Cluster:
    """Start munged, slurmctld and slurmd on localhost with state under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    node = socket.gethostname().split(".")[0]
    for d in ("state", "spool", "log", "munge"):
        (root / d).mkdir(exist_ok=True)
    os.chmod(root / "munge", 0o700)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    os.chmod(key, 0o400)
    sock = root / "munge" / "munge.socket"
    ctl_port, d_port = _free_port(), _free_port()
    conf = root / "slurm.conf"
    conf.write_text(f"""ClusterName=midastest
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ctl_port}
SlurmdPort={d_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={sock}
CredType=cred/munge
StateSaveLocation={root / 'state'}
SlurmdSpoolDir={root / 'spool'}
SlurmctldPidFile={root / 'slurmctld.pid'}
SlurmdPidFile={root / 'slurmd.pid'}
SlurmctldLogFile={root / 'log' / 'slurmctld.log'}
SlurmdLogFile={root / 'log' / 'slurmd.log'}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1
MaxArraySize={max_array_size}
ReturnToService=2
MpiDefault=none
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=2
MinJobAge=300
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=test Nodes={node} Default=YES MaxTime=INFINITE State=UP
""")
    env = dict(os.environ, SLURM_CONF=str(conf))
    cl = Cluster(root, env, max_array_size)
    log = open(root / "log" / "daemons.log", "ab")
    try:
        cl.procs.append(subprocess.Popen([_which("munged"), "-F", "--key-file", str(key), "--socket", str(sock),
                                          "--pid-file", str(root / "munge" / "munged.pid"),
                                          "--log-file", str(root / "munge" / "munged.log"),
                                          "--seed-file", str(root / "munge" / "munged.seed"), "--force"],
                                         stdout=log, stderr=log))
        _wait(lambda: sock.exists(), "munged's socket", cl)
        cl.procs.append(subprocess.Popen([_which("slurmctld"), "-D", "-i", "-f", str(conf)], env=env,
                                         stdout=log, stderr=log))
        cl.procs.append(subprocess.Popen([_which("slurmd"), "-D", "-f", str(conf), "-N", node], env=env,
                                         stdout=log, stderr=log))
        _wait(lambda: "idle" in cl.run(_which("sinfo"), "-h", "-o", "%t", check=False), "the node to be idle", cl)
    except BaseException:
        cl.stop()
        raise
    return cl


def _wait(cond, what: str, cl: Cluster, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        dead = [p.args[0] for p in cl.procs if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            logs = "".join((cl.root / "log" / f).read_text(errors="replace")[-2000:]
                           for f in ("daemons.log", "slurmctld.log", "slurmd.log") if (cl.root / "log" / f).exists())
            raise RuntimeError(f"test Slurm: waiting for {what} failed (exited: {dead})\n{logs}")
        time.sleep(0.2)
