"""The shape that keeps the harness extensible: an attention backend is one function plus one registry line;
a stored run's identity survives new keys; Hydra's own flags and the presets behave as a user expects."""
from __future__ import annotations

import re

import pytest
from omegaconf import OmegaConf
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from harness.analysis.report import table_markdown
from harness.analysis.rows import row_of
from harness.config.schema import config_hash, schema_defaults
from harness.errors import ConfigError
from harness.kernels import ATTENTION, VALID_PREFIX, AttentionSpec
from harness.measure.job import measure
from harness.record import JobRecord
from tests.support import FAST, compose_cfg, run_config, run_harness

pytestmark = pytest.mark.usefixtures("fresh_model_cache")

calls = []


def counted_sdpa(module, query, *args, **kwargs):
    """transformers' sdpa, counted: proof that a model built with attn=throwaway calls this backend."""
    calls.append(query.shape[2])
    return sdpa_attention_forward(module, query, *args, **kwargs)


def use_throwaway(device) -> None:
    AttentionInterface.register("throwaway", counted_sdpa)
    AttentionMaskInterface.register("throwaway", sdpa_mask)


def test_a_new_attention_backend_is_one_function_and_one_registry_line(monkeypatch, tmp_path):
    # not the reference, so judged against fp32; "reads" the valid prefix in blocks of 32, for the roofline
    spec = AttentionSpec("throwaway", VALID_PREFIX, setup=f"{__name__}:use_throwaway", block=32, cache_in_blocks=True)
    monkeypatch.setitem(ATTENTION, "throwaway", spec)
    cfg = run_config(*FAST, "attn=throwaway", "device=cpu", "dtype=fp32")  # the schema asks the registry
    assert cfg.label == "tiny bs=1 ctx=8 cache=64 eager throwaway"
    with pytest.raises(ConfigError, match="cache_len=48 is invalid with attn=throwaway: it reads the cache in blocks of 32"):
        run_config(*FAST, "attn=throwaway", "cache_len=48")
    calls.clear()
    result = measure(cfg)
    assert 1 in calls  # its decode steps ran through the backend
    m = result.metrics
    assert result.failure is None and m["verified"] == 1.0 and m["fp32_rows_checked"] == 1  # checked against fp32
    # the roofline reads the registry: positions 10..17 (context 8, warm-up 2, 8 timed steps) read one 32-slot block
    assert m["kv_slots_read"] == 32.0
    record = JobRecord(label=cfg.label, config={"model": {"name": "tiny"}, "mode": "eager", "attn": "throwaway",
                                                "bs": 1, "context_len": 8, "cache_len": 64})
    record.measured(result)
    assert "| eager throwaway |" in table_markdown([row_of(record)]).splitlines()[0]
    monkeypatch.delitem(ATTENTION, "throwaway")
    with pytest.raises(ConfigError, match="attn=throwaway is invalid: use one of sdpa, sdpa-gqa, sdpa-nocudnn, flex, triton-decode, eager"):
        run_config(*FAST, "attn=throwaway")


def _stored_config(*overrides: str) -> dict:
    """A config as a job records it: resolved, enums as strings, the derived cache_len filled in."""
    config = OmegaConf.to_container(compose_cfg(*overrides), resolve=True, enum_to_str=True)
    config["cache_len"] = run_config(*overrides).cache_len
    return config


def test_a_stored_runs_hash_is_unchanged_by_a_new_key_with_its_default():
    config = _stored_config("model=tiny")
    # the hash this version stores for the tiny default run: resume and compare find it across later versions
    assert config_hash(config) == "5c3286621b68b1aa"
    defaults = {**schema_defaults(), "new_axis": "off"}
    assert config_hash({**config, "new_axis": "off"}, defaults) == "5c3286621b68b1aa"
    assert config_hash({**config, "new_axis": "on"}, defaults) != "5c3286621b68b1aa"
    assert config_hash(_stored_config("model=tiny", "bs=2")) != "5c3286621b68b1aa"  # a set key still counts
    # where a run is stored, and how it is scheduled, is not what it measures
    assert config_hash({**config, "tracking": {"uri": "http://elsewhere", "experiment": "x"}, "resume": True}) \
        == "5c3286621b68b1aa"


@pytest.mark.e2e
@pytest.mark.parametrize("flags", [["--cfg", "job"], ["--cfg", "hydra"], ["--cfg", "all"], ["--info"],
                                   ["-m", "bs=1,2", "mode=eager,graphed", "--cfg", "job"],
                                   ["-m", "+experiment=capacity", "--cfg", "job"]])
def test_hydras_own_flags_exit_0(workdir, flags):
    proc = run_harness(*flags, cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and not (workdir / "mlruns").exists()
    if flags[-2:] == ["--cfg", "job"] and "bs=1,2" in flags:
        assert re.search(r"^bs: 1$", proc.stdout, re.M) and "the sweep holds 4 jobs" in proc.stderr


@pytest.mark.e2e
def test_a_preset_sweeps_without_m_and_a_tiny_run_warns_of_nothing_deprecated(workdir):
    proc = run_harness("+experiment=design-card", *FAST, "device=cpu", "bs=1,2", "mode=eager", cwd=workdir,
                       env={"PYTHONWARNINGS": "default"})  # every warning shown, once
    assert proc.returncode == 0, proc.stderr
    assert "sweep: 2 jobs, 2 to run" in proc.stderr and "2 finished, 0 failed" in proc.stdout
    deprecated = [line for line in proc.stderr.splitlines()
                  if re.search(r"(FutureWarning|DeprecationWarning)", line) and re.search(r"torch|transformers", line)]
    assert deprecated == []
