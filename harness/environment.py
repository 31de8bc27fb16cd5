"""What the run ran on: the device it resolved to and the versions a result depends on."""
from __future__ import annotations

import functools
import hashlib
import os
import platform
import re
import socket
import subprocess
from pathlib import Path

import torch
import transformers

from harness import ENV_AT_START

REPO = Path(__file__).resolve().parents[1]


def resolve_device(name: str) -> torch.device:
    """`auto` is cuda when a GPU is visible, else cpu."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def device_index(device: torch.device) -> int:
    """The CUDA index a device names, `cuda` alone being the current one."""
    return device.index if device.index is not None else torch.cuda.current_device()


def _run(*cmd: str, cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


@functools.lru_cache(maxsize=1)
def git_state() -> tuple[str, str]:
    """(commit, dirty) of the harness checkout: dirty is "false", or a hash of the uncommitted changes, so that
    two runs of one commit with different edits do not look alike to `harness compare`; ("unknown", "false")
    outside git."""
    commit = _run("git", "rev-parse", "HEAD", cwd=REPO)
    if not commit:
        return "unknown", "false"
    diff = _run("git", "diff", "HEAD", cwd=REPO)
    return commit, f"diff-{hashlib.sha256(diff.encode()).hexdigest()[:12]}" if diff else "false"


@functools.lru_cache(maxsize=8)
def gpu_facts(index: int) -> dict[str, str]:
    """Name, driver and UUID of the GPU this process sees as `index`. The UUID names the physical GPU
    even when SLURM (or CUDA_VISIBLE_DEVICES) renumbers what the process sees."""
    props = torch.cuda.get_device_properties(index)
    facts = {"gpu_name": props.name}
    uuid = str(getattr(props, "uuid", "") or "").removeprefix("GPU-")
    if _UUID.match(uuid):
        facts["gpu_uuid"] = f"GPU-{uuid}"
    elif (visible := _visible_gpu(index)) is not None:  # nvidia-smi numbers physical GPUs
        found = _run("nvidia-smi", f"--id={visible}", "--query-gpu=uuid", "--format=csv,noheader")
        if found:
            facts["gpu_uuid"] = found.strip()
    driver = _run("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader")
    if driver:
        facts["gpu_driver"] = driver.splitlines()[0].strip()
    return facts


# Set by torch's own import chain (Inductor's cache folder): logged only where the user had set it
SET_BY_TORCH = ("TORCHINDUCTOR_CACHE_DIR",)
TUNING_ENV_PREFIXES = ("TORCHINDUCTOR_", "TORCH_CUDNN_", "CUBLAS_", "CUBLASLT_", "NVIDIA_TF32")
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def _visible_gpu(index: int) -> str | None:
    """The physical GPU (index or UUID, as nvidia-smi takes it) behind this process's `cuda:index`."""
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if not visible:
        return str(index)
    return visible[index] if index < len(visible) else None


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
        tags.update(gpu_facts(device_index(device)))
    # the host launches every eager kernel: its CPU sets eager's step time as much as the GPU does
    tags["cpu"] = cpu_model()
    # Switches that change what a run measures without appearing in its config
    tags.update({name: value for name, value in os.environ.items() if name.startswith(TUNING_ENV_PREFIXES)
                 and (name not in SET_BY_TORCH or name in ENV_AT_START)})
    return tags
