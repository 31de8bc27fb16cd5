from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from harness.sweep import compose_config as compose_cfg  # noqa: F401 - for the tests
from harness.sweep import compose_run_config as run_config  # noqa: F401

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MlflowServer:
    """A real `mlflow server` on 127.0.0.1 over a SQLite file, which can be stopped and started again."""

    def __init__(self, root: Path):
        self.root, self.port = root, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
             "--artifacts-destination", str(self.root / "artifacts"), "--host", "127.0.0.1", "--port", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.time() + 90
        while time.time() < deadline:
            try:
                if urllib.request.urlopen(f"{self.url}/health", timeout=2).status == 200:
                    return
            except OSError:
                time.sleep(0.5)
        self.stop()
        pytest.fail("mlflow server did not answer /health within 90 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
        self.proc = None


@pytest.fixture
def mlflow_server(tmp_path):
    server = MlflowServer(tmp_path / "server")
    server.start()
    yield server.url
    server.stop()
