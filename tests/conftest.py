from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from harness.sweep import compose_config as compose_cfg
from harness.sweep import compose_run_config as run_config

REPO = Path(__file__).resolve().parents[1]
FAST = ["model=tiny", "decode_tokens=8", "warmup=2", "prompt_len=8", "cache_len=64"]

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def run_harness(*args: str, cwd: Path, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """The real CLI in a subprocess, as a user runs it."""
    full_env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    full_env.update(PYTHONPATH=str(REPO), **(env or {}))
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch) -> Path:
    """A fresh folder for outputs/ and mlruns/, with no tracking URI inherited."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path
