"""`pip install -e .` in a fresh virtual environment."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_installing_keeps_a_torch_already_in_the_supported_range(tmp_path):
    """`pip install -e .` next to a CUDA torch of another supported version must not replace it."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    purelib = subprocess.run([venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    dist = Path(purelib) / "torch-2.11.0.dist-info"  # as the H200's torch 2.11.0+cu130 declares itself
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.11.0\n")
    (dist / "RECORD").write_text("")
    report = tmp_path / "report.json"
    subprocess.run([venv / "bin" / "pip", "install", "-q", "--dry-run", "--report", report, "-e", str(Path(__file__).resolve().parents[2])],
                   check=True, capture_output=True)
    installs = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    assert "torch" not in installs and "harness" in installs
