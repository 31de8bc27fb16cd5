"""A real single-node SLURM cluster on this machine (Debian's slurm-wlm and munge), cgroup-free,
started by a test fixture and stopped by its pid files. Needs root, as CI runs."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

SLURM_CONF = """\
ClusterName=harness
SlurmctldHost={host}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={root}/jobcomp.log
MpiDefault=none
ReturnToService=2
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
NodeName={host} CPUs={cpus} RealMemory={mem_mb} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


def missing() -> str | None:
    """Why no cluster can start here, or None."""
    for tool in ("slurmctld", "slurmd", "munged", "sbatch", "sinfo"):
        if not shutil.which(tool):
            return f"{tool} not found: apt-get install slurm-wlm munge"
    if os.geteuid() != 0:
        return "a SLURM cluster needs root to start munged and slurmd"
    return None


def _run(*cmd: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, **kw)


def start_munge() -> None:
    if _run("sh", "-c", "munge -n | unmunge").returncode == 0:
        return  # already running
    key = Path("/etc/munge/munge.key")
    if not key.exists():
        key.parent.mkdir(parents=True, exist_ok=True)
        key.write_bytes(os.urandom(1024))
    for d in ("/run/munge", "/var/lib/munge", "/var/log/munge", "/etc/munge"):
        Path(d).mkdir(parents=True, exist_ok=True)
        shutil.chown(d, "munge", "munge")
    shutil.chown(key, "munge", "munge")
    key.chmod(0o400)
    _run("runuser", "-u", "munge", "--", "munged", "--force")
    _wait(lambda: _run("sh", "-c", "munge -n | unmunge").returncode == 0, "munged", 30)


def start(root: Path) -> dict[str, str]:
    """Start slurmctld and slurmd under `root`; returns the environment that reaches the cluster."""
    start_munge()
    for d in ("state", "spool"):
        (root / d).mkdir(parents=True, exist_ok=True)
    host = socket.gethostname()
    free_mb = int(next(ln for ln in open("/proc/meminfo") if ln.startswith("MemAvailable")).split()[1]) // 1024
    conf = root / "slurm.conf"
    conf.write_text(SLURM_CONF.format(host=host, root=root, cpus=os.cpu_count(), mem_mb=max(1024, free_mb // 2)))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    for daemon in ("slurmctld", "slurmd"):
        proc = _run(daemon, "-f", str(conf), env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"{daemon} did not start: {proc.stderr.strip() or proc.stdout.strip()}; "
                               f"see {root / (daemon + '.log')}")
    _wait(lambda: "idle" in _run("sinfo", "-h", "-o", "%T", env=env).stdout, "the node to become idle", 60)
    return {"SLURM_CONF": str(conf)}


def stop(root: Path) -> None:
    for daemon in ("slurmd", "slurmctld"):
        pid_file = root / f"{daemon}.pid"
        if pid_file.is_file():
            try:
                os.kill(int(pid_file.read_text().strip()), 15)
            except (ProcessLookupError, ValueError):
                pass


def completed_jobs(root: Path) -> list[str]:
    """The jobcomp log's lines: one per finished job, with its JobState (sacct needs slurmdbd)."""
    log = root / "jobcomp.log"
    return log.read_text().splitlines() if log.is_file() else []


def _wait(ok, what: str, seconds: float) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if ok():
            return
        time.sleep(0.5)
    raise RuntimeError(f"timed out after {seconds:.0f} s waiting for {what}")
