"""The shape that keeps the harness extensible (harness/registry.py, harness/modes, harness/kernels): a mode is
one class and one registry line, an attention backend one function and one registry line."""
from __future__ import annotations

import subprocess
import sys

import pytest
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from harness.analysis.report import table_markdown
from harness.analysis.rows import row_of
from harness.errors import ConfigError
from harness.kernels import ATTENTION, VALID_PREFIX, AttentionSpec
from harness.measure.job import measure
from harness.modes import MODES, ModeSpec
from harness.modes.eager import EagerMode, EagerStepper
from harness.record import JobRecord
from tests.support import FAST, run_config

pytestmark = pytest.mark.usefixtures("fresh_model_cache")


@pytest.mark.slow
def test_every_registered_mode_names_a_mode_class_that_is_there():
    """Bug caught: a registry line whose target names a module or class that is not there (a rename, a typo). The
    schema reads names only, so it would accept `mode=NAME`, and every job of that mode would fail as it started."""
    from harness.modes.base import DecodeMode

    classes = {name: spec.mode_class() for name, spec in MODES.items()}
    assert all(issubclass(c, DecodeMode) and c is not DecodeMode for c in classes.values())
    assert len(set(classes.values())) == len(MODES)  # no two names for one class
    for name in MODES:
        assert run_config(f"mode={name}").mode == name


class ThrowawayStepper(EagerStepper):
    """A mode that exists only in this test: eager steps, reported under another name."""


class ThrowawayMode(EagerMode):
    name = "throwaway"

    def prepare(self, model, prompt, cfg):
        stepper = ThrowawayStepper(model, prompt, cfg.cache_len)
        stepper.tags["throwaway"] = "yes"
        return stepper


@pytest.mark.slow
def test_a_new_mode_is_one_class_and_one_registry_line(monkeypatch):
    monkeypatch.setitem(MODES, "throwaway", ModeSpec("throwaway", f"{__name__}:ThrowawayMode", graph_steps=True))
    cfg = run_config(*FAST, "mode=throwaway", "graph_steps=2", "device=cpu", "dtype=fp32")  # the schema asks the registry
    assert cfg.label == "tiny bs=1 ctx=8 cache=64 throwaway steps=2"
    result = measure(run_config(*FAST, "mode=throwaway", "device=cpu", "dtype=fp32"))
    assert result.failure is None and result.mode_tags["throwaway"] == "yes"
    assert result.metrics["tokens_match"] == 1.0 and result.metrics["max_logit_diff"] == 0  # verified like any mode
    rows = [dict(id=i, name=f"run {i}", status="FINISHED", model="tiny", cache_len=64, bs=1, context_len=8, dtype="fp32", mode=mode,
                 variant=mode, median_ms=1.0, efficiency=None, floor_ms=None, reason="")
            for i, mode in enumerate(["throwaway", "compiled", "eager"])]
    assert table_markdown(rows).splitlines()[0] == "| model | context_len | cache_len | bs | eager | compiled | throwaway |"
    monkeypatch.delitem(MODES, "throwaway")
    with pytest.raises(ConfigError, match="mode=throwaway is invalid: use one of eager, graphed"):
        run_config(*FAST, "mode=throwaway")


def test_the_registry_imports_no_torch():
    code = "import sys, harness.modes, harness.config; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


calls = []


def counted_sdpa(module, query, *args, **kwargs):
    """transformers' sdpa, counted: proof that a model built with attn=throwaway calls this backend."""
    calls.append(query.shape[2])
    return sdpa_attention_forward(module, query, *args, **kwargs)


def use_throwaway(device) -> None:
    AttentionInterface.register("throwaway", counted_sdpa)
    AttentionMaskInterface.register("throwaway", sdpa_mask)


@pytest.mark.slow
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
