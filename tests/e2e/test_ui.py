"""`harness ui` on loopback."""
from __future__ import annotations

import socket
import subprocess
import sys

from harness.cli import commands as cli
from tests.support import harness_env, free_port, stop_group, wait_for_http


def test_ui_refuses_a_busy_port(workdir, capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        assert cli.main(["ui", "--port", str(port)]) == 2
    assert f"port {port} on 127.0.0.1 is already in use" in capsys.readouterr().err


def test_harness_ui_serves_the_store_on_loopback_only_without_mlflow_on_path(workdir):
    port = free_port()
    bare_path = {"PATH": "/usr/bin:/bin"}  # no venv bin/ (a user's PATH without the venv): mlflow comes from this interpreter
    proc = subprocess.Popen([sys.executable, "-m", "harness", "ui", "--port", str(port)], cwd=workdir,
                            env=harness_env(bare_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        wait_for_http(f"http://127.0.0.1:{port}/health", proc)  # fails at once if the server exits
    finally:
        stop_group(proc)
        _, err = proc.communicate(timeout=30)
    assert (f"mlflow ui --backend-store-uri sqlite:///{workdir}/mlruns/mlflow.db --host 127.0.0.1 --port {port} "
            "--workers 1") in err  # one worker: each more imports the whole server before the page opens
