"""What the run ran on: the device it resolved to and the versions a result depends on."""
from __future__ import annotations

import functools
import platform
import socket
import subprocess
from pathlib import Path

import torch
import transformers

REPO = Path(__file__).resolve().parents[1]


def resolve_device(name: str) -> torch.device:
    """`auto` is cuda when a GPU is visible, else cpu."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _run(*cmd: str, cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


@functools.lru_cache(maxsize=1)
def git_state() -> tuple[str, bool]:
    """(commit, dirty) of the harness checkout; ("unknown", False) outside git."""
    commit = _run("git", "rev-parse", "HEAD", cwd=REPO)
    if not commit:
        return "unknown", False
    return commit, bool(_run("git", "status", "--porcelain", "--untracked-files=no", cwd=REPO))


@functools.lru_cache(maxsize=8)
def gpu_facts(index: int) -> dict[str, str]:
    """Name, driver and UUID of one GPU, from nvidia-smi when present."""
    facts = {"gpu_name": torch.cuda.get_device_name(index)}
    smi = _run("nvidia-smi", f"--id={index}", "--query-gpu=driver_version,uuid", "--format=csv,noheader")
    if smi:
        driver, uuid = (part.strip() for part in smi.split(",", 1))
        facts.update(gpu_driver=driver, gpu_uuid=uuid)
    return facts


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
        "git_dirty": str(dirty).lower(),
    }
    if device.type == "cuda":
        tags.update(gpu_facts(device.index if device.index is not None else torch.cuda.current_device()))
    else:
        tags["cpu"] = platform.processor() or platform.machine()
    return tags
