"""What the run ran on: the device it resolved to and the versions a result depends on."""
from __future__ import annotations

import functools
import hashlib
import os
import platform
import socket
from pathlib import Path

import torch
import transformers

from harness import ENV_AT_START
from harness.clock import device_index
from harness.measure.gpu_state import command_output, gpu_facts

REPO = Path(__file__).resolve().parents[2]


@functools.lru_cache(maxsize=1)
def git_state() -> tuple[str, str]:
    """(commit, dirty) of the harness checkout: dirty is "false", or a hash of the uncommitted changes, so that
    two runs of one commit with different edits do not look alike to `harness compare`; ("unknown", "false")
    outside git."""
    commit = command_output("git", "rev-parse", "HEAD", cwd=REPO)
    if not commit:
        return "unknown", "false"
    diff = command_output("git", "diff", "HEAD", cwd=REPO)
    return commit, f"diff-{hashlib.sha256(diff.encode()).hexdigest()[:12]}" if diff else "false"


# Set by torch's own import chain (Inductor's cache folder): logged only where the user had set it
SET_BY_TORCH = ("TORCHINDUCTOR_CACHE_DIR",)
# and the variables that set a CPU's threads and torch's or CUDA's kernels (OMP_NUM_THREADS alone moves a tiny
# CPU run from 3 to 120 ms a step)
TUNING_ENV_PREFIXES = ("TORCHINDUCTOR_", "TORCH_", "CUBLAS_", "CUBLASLT_", "NVIDIA_TF32", "CUDA_", "OMP_", "MKL_",
                       "OPENBLAS_")
GOVERNOR = Path("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")


@functools.lru_cache(maxsize=1)
def cpu_model() -> str:
    """The host CPU's model name (Linux), else what `platform` knows."""
    try:
        with open("/proc/cpuinfo") as info:
            names = [line.split(":", 1)[1].strip() for line in info if line.startswith("model name")]
    except OSError:
        names = []
    return names[0] if names else platform.processor() or platform.machine()


def environment_tags(device: torch.device) -> dict[str, str]:
    commit, dirty = git_state()
    tags = {
        "device": str(device),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "cuda": torch.version.cuda or "none",
        "hostname": socket.gethostname(),
        "git_commit": commit,
        "git_dirty": dirty,
    }
    if device.type == "cuda":
        from harness.measure.fingerprint import fingerprint

        tags.update(gpu_facts(device_index(device)))
        tags.update(fingerprint(device_index(device)))  # measured once per process
    if slot := os.environ.get("CUDA_VISIBLE_DEVICES", "").strip():  # the GPU a launcher pinned the job to
        tags["gpu_slot"] = slot
    # the host launches every eager kernel: its CPU, its clock policy and torch's threads set eager's step time
    tags.update(cpu=cpu_model(), torch_threads=str(torch.get_num_threads()),
                torch_interop_threads=str(torch.get_num_interop_threads()))
    if GOVERNOR.is_file():
        tags["cpu_governor"] = GOVERNOR.read_text().strip()
    # Switches that change what a run measures without appearing in its config
    tags.update({name: value for name, value in os.environ.items() if name.startswith(TUNING_ENV_PREFIXES)
                 and (name not in SET_BY_TORCH or name in ENV_AT_START)})
    return tags


def usable_cores() -> int:
    """The cores this process may run on (its affinity: what taskset, cgroups' cpusets or SLURM leave it)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # a platform without affinity: every core
        return os.cpu_count() or 1


def running_threads() -> int | None:
    """Threads running or waiting for a core on the whole machine now (/proc/stat's procs_running), the reader's
    own included; None where the kernel does not say."""
    try:
        with open("/proc/stat") as stat:
            for line in stat:
                if line.startswith("procs_running "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def contention(threads: int, cores: int, machine_cores: int, load: float | None) -> list[str]:
    """Why a host-timed step would time the scheduler rather than the work, each as a sentence: more torch threads
    than the `cores` the process may use (its threads then take turns), or a machine `load` (threads running or
    waiting, this job's reader among them) that leaves fewer free cores than the job's `threads` need."""
    why = []
    if threads > cores:
        why.append(f"cpu_threads={threads} exceeds the {cores} cores this process may use (os.sched_getaffinity); "
                   f"use cpu_threads<={cores}")
    others = None if load is None else load - 1  # the thread that read the load is this job's
    if others is not None and others + threads > machine_cores:
        why.append(f"the machine's load ({load:g} threads running or waiting while it timed) leaves fewer than "
                   f"cpu_threads={threads} of its {machine_cores} cores free")
    return why


class LoadProbe:
    """The machine's load during timing: procs_running read a few times at each block's start and end (between
    blocks, never inside a timed loop), its median the load a job reports."""

    READS = 3  # reads per sample: one read may catch a short-lived thread

    def __init__(self) -> None:
        self.reads: list[int] = []

    def sample(self) -> None:
        self.reads += [n for n in (running_threads() for _ in range(self.READS)) if n is not None]

    def load(self) -> float | None:
        if not self.reads:
            return None
        ordered = sorted(self.reads)
        mid = len(ordered) // 2
        return float(ordered[mid]) if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
