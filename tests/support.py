"""Plain helpers the tests share (fixtures are in conftest.py): the CLI in a subprocess, the config
composed in code, a real `mlflow server`, and the store read back."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig

from harness.config.schema import CONF_DIR, RunConfig
from harness.config.validate import to_run_config
from harness.measure.environment import SET_BY_TORCH

REPO = Path(__file__).resolve().parents[1]
# The tree whose CLI the subprocess tests run: this one, or another checkout (to show a regression test
# failing on older code: HARNESS_REPO_UNDER_TEST=/path/to/old/checkout python -m pytest ...)
CLI_REPO = Path(os.environ.get("HARNESS_REPO_UNDER_TEST", REPO))
# Each model family at a tiny size, for tests that run every family's architecture
TINY_DIMS = ["model.vocab_size=1024", "model.hidden_size=64", "model.intermediate_size=128", "model.num_hidden_layers=2",
             "model.num_attention_heads=4", "model.num_key_value_heads=2", "model.head_dim=16"]
FAMILIES = {"qwen3": ["model=tiny"], "llama": ["model=llama-3.2-1b", *TINY_DIMS],
            "qwen3_moe": ["model=qwen3-30b-a3b", *TINY_DIMS, "model.extra.num_experts=4",
                          "model.extra.num_experts_per_tok=2", "model.extra.moe_intermediate_size=32"]}
FAST = ["model=tiny", "decode_tokens=8", "warmup=2", "context_len=8", "cache_len=64", "repeats=1"]
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
SECRET = "s3cretTOKEN"  # a password or token that must never leave the process
# A store that is down costs a test seconds, not the default retry budget
QUICK_STORE = {"HARNESS_STORE_RETRY_S": "2", "HARNESS_STORE_TIMEOUT_S": "2"}


def compose_cfg(*overrides: str) -> DictConfig:
    """The config a command line with these overrides would run, composed from conf/ in code."""
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def run_config(*overrides: str) -> RunConfig:
    return to_run_config(compose_cfg(*overrides))


def tiny_fp32(*overrides: str):
    """The tiny model in fp32 on CPU at bs=2 (FAST's sizes, more overrides after), its config and its seeded
    prompt: what the tests of verification's parts judge."""
    from harness import models
    from harness.measure.job import seeded_prompt

    cfg = run_config(*FAST, "device=cpu", "bs=2", "dtype=fp32", *overrides)
    model = models.get_model(cfg.model, "fp32", "sdpa", torch.device("cpu"), 0).model
    return cfg, model, seeded_prompt(2, 8, model.config.vocab_size, 0, torch.device("cpu"))


def harness_env(env: dict | None = None) -> dict:
    """This process's environment less the store it may name and what torch's imports set here."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", *SET_BY_TORCH)}
    full_env.update(PYTHONPATH=str(CLI_REPO), **(env or {}))
    return full_env


def compiled_for_the_gpu(script: str, timeout: float = 600) -> str:
    """What `script` prints, run in a Python process of its own with Triton's interpreter off, so that its kernels
    go through Triton's ahead-of-time compiler for the GPU (no GPU needed), where this process's run interpreted;
    the process must exit cleanly."""
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def run_harness(*args: str, cwd: Path, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """The real CLI in a subprocess, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, env=harness_env(env),
                          capture_output=True, text=True, timeout=timeout)


@contextmanager
def logging_as_it_was():
    """Each run of main() in process lets Hydra configure logging (its handlers on the test's captured streams, which
    close once it ends; existing loggers disabled): the handlers, levels and switches every logger had before are put
    back, and the loggers made meanwhile lose their handlers."""
    import logging

    loggers = [logging.getLogger(), *(v for v in logging.Logger.manager.loggerDict.values()
                                      if isinstance(v, logging.Logger))]
    before = {id(lg): (lg, lg.handlers[:], lg.level, lg.propagate, lg.disabled) for lg in loggers}
    try:
        yield
    finally:
        for lg, handlers, level, propagate, disabled in before.values():
            lg.handlers[:] = handlers
            lg.setLevel(level)
            lg.propagate, lg.disabled = propagate, disabled
        for lg in list(logging.Logger.manager.loggerDict.values()):
            if isinstance(lg, logging.Logger) and id(lg) not in before:
                lg.handlers.clear()


@contextmanager
def process_state_kept():
    """What main() sets for the process it runs in, put back after: the signal handlers, torch's thread count, the
    environment (the compile caches' folders for the jobs it starts), logging, and the store's client. A store's
    client is made once a process and sets MLflow's HTTP settings (no retries of its own, the harness's timeout, no
    progress bar) in the environment as it is made; with the environment put back, a client kept from an earlier
    call would leave a later one, in process or not, to MLflow's defaults (minutes on a down store, a progress bar
    on stderr): none is kept, before or after."""
    from harness.store import tracking

    handlers, threads = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}, torch.get_num_threads()
    environment = dict(os.environ)
    tracking.client.cache_clear()
    try:
        with logging_as_it_was():
            yield
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        torch.set_num_threads(threads)
        os.environ.clear()
        os.environ.update(environment)
        tracking.client.cache_clear()


def run_in_process(capfd, monkeypatch, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The CLI's main() in this process, in the current folder, what it wrote to stdout and stderr read from their file
    descriptors: a sweep on the basic launcher (its jobs in the process that runs it), where the process is not what
    the test is about; run_harness for the real subprocess. Hydra's own exits come back as their status; what main()
    sets for its process is put back after (process_state_kept)."""
    from harness.cli.main import main

    for key, value in (env or {}).items():
        monkeypatch.setenv(key, value)
    capfd.readouterr()
    with process_state_kept():
        try:
            status = main(list(args))
        except SystemExit as exit_:
            status = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess(["harness", *args], status, out, err)


def store(workdir: Path) -> MlflowClient:
    return MlflowClient(f"sqlite:///{workdir / 'mlruns' / 'mlflow.db'}")


def runs_by_kind(client: MlflowClient):
    """The experiment, its parent runs (any kind) and its job runs."""
    exp = client.get_experiment_by_name("harness")
    runs = client.search_runs([exp.experiment_id])
    children = [r for r in runs if r.data.tags.get("harness.kind") == "job"]
    parents = [r for r in runs if r.data.tags.get("harness.kind") not in (None, "job")]
    return exp, parents, children


def child_runs(workdir: Path):
    return runs_by_kind(store(workdir))[2]


def one_line_error(capsys, *argv: str) -> str:
    """Run a subcommand in process; it must fail with exit 2 and exactly one line on stderr."""
    from harness.cli import commands as cli

    assert cli.main(list(argv)) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    return err


def eager_only_records():
    """Two finished eager runs of a bs sweep, as result files hold them."""
    from harness.record import JobRecord

    return [JobRecord(label=f"bs={bs} tiny ctx=8 cache=64 eager", config={"bs": bs, "mode": "eager", "context_len": 8,
                      "cache_len": 64, "dtype": "fp32", "model": {"name": "tiny"}}, status="FINISHED", job_dir=f"/x/{bs}",
                      metrics={"step_ms_median": 2.0 * bs, "verified": 1.0}, mlflow_run_id=f"run{bs}", varying=["bs"])
            for bs in (1, 2)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_http(url: str, proc: subprocess.Popen, seconds: float = 90) -> None:
    """Until url answers 200; fails at once if the process serving it has exited."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the server for {url} exited with {proc.returncode} before answering")
        try:
            if urllib.request.urlopen(url, timeout=2).status == 200:
                return
        except OSError:
            time.sleep(0.3)
    pytest.fail(f"{url} did not answer within {seconds:g} s")


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the process's group, then SIGKILL where it has not ended within 30 s: a server's graceful shutdown
    waits for its open requests, which clients retrying through an outage may keep open on a loaded machine."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


class MlflowServer:
    """A real `mlflow server` on 127.0.0.1 over a SQLite file, which can be stopped and started again."""

    def __init__(self, root: Path):
        self.root, self.port = root, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        """Its store, where new, starts as the harness's own new stores do (a copy of the empty one: no migrations);
        one worker process, as `harness ui` serves (MLflow's default four each import the whole server)."""
        from harness.store.tracking import start_as_the_empty_store

        self.root.mkdir(parents=True, exist_ok=True)
        if not (self.root / "mlflow.db").exists():
            start_as_the_empty_store(self.root / "mlflow.db")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
             "--artifacts-destination", str(self.root / "artifacts"), "--host", "127.0.0.1", "--port", str(self.port),
             "--workers", "1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            wait_for_http(f"{self.url}/health", self.proc)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.proc is not None:
            stop_group(self.proc)
        self.proc = None


def flex_block_mask_one_short(position, slots, device):
    """flex's decode block mask with its block count one short where the position is a multiple of 128: the
    newest token's own block goes unread there (a plausible off-by-one: ceil(position / 128) for position // 128 + 1)."""
    from harness.kernels import attention

    blocks = torch.arange(slots // 128, device=device, dtype=torch.int32).view(1, 1, 1, -1)
    count = torch.clamp((position + 127) // 128, min=1).to(torch.int32).view(1, 1, 1)
    return attention.BlockMask.from_kv_blocks(count, blocks, BLOCK_SIZE=128, seq_lengths=(1, slots),
                                              mask_mod=lambda b, h, q, kv: kv <= position + q, compute_q_blocks=False)
