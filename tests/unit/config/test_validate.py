"""A composed config's checks (harness/config/validate.py): bad values give one clear line."""
from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from harness.errors import ConfigError
from harness.config.validate import to_run_config
from tests.support import compose_cfg, run_config


@pytest.mark.parametrize("overrides, says", [
    (["bs=0"], "bs=0 is invalid: the batch size must be >= 1"),
    (["mode=bogus"], "mode=bogus is invalid: use one of eager, graphed, bucketed, compiled-nograph, compiled"),
    (["bs=-3"], "bs=-3 is invalid"),
    (["cache_len=100", "context_len=16", "warmup=10", "decode_tokens=128"],
     "cache_len=100 is too short: context_len (16) + warmup (10) + decode_tokens (128) = 154"),
    (["decode_tokens=1"], "decode_tokens=1 is invalid"),
    (["warmup=0"], "warmup=0 is invalid"),
    (["device=tpu"], "device='tpu' is invalid: use auto, cpu, cuda or cuda:N"),
    (["model=tiny", "model.num_key_value_heads=3"], "must be a multiple of model.num_key_value_heads=3"),
])
def test_schema_checks_give_one_clear_line(overrides, says):
    with pytest.raises(ConfigError) as err:
        run_config(*overrides)
    assert says in str(err.value)
    assert "\n" not in str(err.value)


def test_cache_len_exactly_enough_is_accepted():
    assert run_config("cache_len=154", "context_len=16", "warmup=10", "decode_tokens=128").cache_len == 154


def test_a_saved_config_validates_and_unknown_keys_are_refused():
    saved = OmegaConf.to_container(compose_cfg("model=tiny", "bs=4"), resolve=True)
    assert to_run_config(OmegaConf.create(saved)).bs == 4
    saved["_target_"] = "os.system"
    with pytest.raises(ConfigError, match="_target_"):
        to_run_config(OmegaConf.create(saved))


def test_cpu_threads_below_one_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"^cpu_threads=0 is invalid: it must be >= 1") as err:
        run_config("cpu_threads=0")
    assert "\n" not in str(err.value)


@pytest.mark.usefixtures("fresh_model_cache")
@pytest.mark.parametrize("overrides, says", [
    (["buckets=[]"], "buckets=[] is invalid: give at least one batch size"),
    (["buckets=[4,2,8]"], "buckets=[4, 2, 8] is invalid: list them in increasing order without repeats, e.g. [2, 4, 8]"),
    (["buckets=[1,1,2]"], "in increasing order without repeats"),
    (["buckets=[0,2]"], "buckets=[0, 2] is invalid: every bucket must be >= 1"),
    (["graph_steps=0", "mode=graphed"], "graph_steps=0 is invalid"),
    (["graph_steps=4", "mode=eager"],
     "graph_steps=4 applies to mode=graphed or mode=bucketed or mode=fused only, not mode=eager"),
    (["compile_mode=max-autotune", "mode=compiled-nograph"],
     "compile_mode=max-autotune is invalid for mode=compiled-nograph: use one of default, max-autotune-no-cudagraphs"),
    (["compile_mode=default", "mode=graphed"], "only the compiled modes take it"),
    (["+inductor.epilogue_fusion=false", "mode=graphed"],
     "inductor.epilogue_fusion applies to the compiled modes only (mode=compiled or compiled-nograph), not mode=graphed"),
    (["+inductor.epilog_fusion=false", "mode=compiled"], "inductor.epilog_fusion is not an option of torch._inductor.config"),
    (["+inductor.triton.cudagraphs=false", "mode=compiled"],
     "inductor.triton.cudagraphs is the mode's choice: use mode=compiled (Inductor's kernels replayed from CUDA graphs)"),
    (["+inductor.epilogue_fusion=maybe", "mode=compiled"],
     "inductor.epilogue_fusion='maybe' is invalid: torch._inductor.config.epilogue_fusion takes a bool"),
])
def test_graph_options_are_checked(overrides, says):
    with pytest.raises(ConfigError) as err:
        run_config(*overrides)
    assert says in str(err.value)


@pytest.mark.usefixtures("fresh_model_cache")
def test_cache_len_counts_whole_replays_of_graph_steps():
    # 16 prompt + warmup 10 (its 3 replays of 4 end at 28, and the timed blocks start at 26: timing.to_the_window)
    # + decode 130 -> 33 replays (132) = 158
    ok = ["graph_steps=4", "mode=graphed", "context_len=16", "warmup=10", "decode_tokens=130"]
    assert run_config(*ok, "cache_len=158").cache_len == 158
    with pytest.raises(ConfigError, match="in whole replays of graph_steps=4, = 158 tokens must fit; use cache_len>=158"):
        run_config(*ok, "cache_len=157")


@pytest.mark.usefixtures("fresh_model_cache")
def test_a_config_saved_with_prompt_len_reruns_as_context_len():
    saved = {"model": dict(run_config("model=tiny").model.__dict__), "bs": 2, "prompt_len": 8, "cache_len": 256}
    cfg = to_run_config(saved)
    assert (cfg.context_len, cfg.cache_len) == (8, 256)
