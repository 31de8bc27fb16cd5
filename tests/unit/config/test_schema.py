"""The config tree (conf/) composed through Hydra's compose API against the schema (harness/config/schema.py):
defaults, model presets, experiment presets, the README's table, a stored run's hash."""
from __future__ import annotations

import itertools
import json
import re

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from transformers import AutoConfig, AutoModelForCausalLM

from harness.config.schema import CONF_DIR, schema_defaults, config_hash
from harness.config.validate import check_overrides, to_run_config
from harness.errors import ConfigError
from tests.support import REPO, compose_cfg, run_config


def test_defaults_are_qwen3_0_6b_eager():
    cfg = run_config()
    assert cfg.model.name == "qwen3-0.6b" and cfg.mode == "eager"
    assert (cfg.bs, cfg.decode_tokens, cfg.warmup, cfg.device) == (1, 128, 10, "auto")
    assert cfg.dtype.value == "bf16" and cfg.attn == "sdpa"
    assert cfg.model.weights is None


def test_qwen3_0_6b_is_the_exact_architecture():
    m = run_config("model=qwen3-0.6b").model
    assert m.architecture() == {
        "vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
        "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-6,
        "rope_theta": 1e6, "tie_word_embeddings": True, "max_position_embeddings": 40960,
    }


def test_tiny_is_a_two_layer_qwen3():
    m = run_config("model=tiny").model
    assert m.model_type == "qwen3" and m.num_hidden_layers == 2


@pytest.mark.slow
def test_the_design_card_preset_is_the_design_cards_sweep():
    """Reads conf/experiment/design-card.yaml itself. Bugs caught: a preset that drifts from the design card
    (another bs list, a mode dropped, a key the article did not sweep), or one whose jobs would not all compose:
    its 8 jobs must be the 8 distinct configs bs 1,2,4,8 x eager,graphed of the default model."""
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=["+experiment=design-card"], return_hydra_config=True)
    params = {k: str(v) for k, v in cfg.hydra.sweeper.params.items()}
    assert params == {"bs": "1,2,4,8", "mode": "eager,graphed"} and cfg.hydra.mode.name == "MULTIRUN"
    jobs = [run_config("+experiment=design-card", f"bs={bs}", f"mode={mode}")
            for bs, mode in itertools.product(params["bs"].split(","), params["mode"].split(","))]
    assert {(j.bs, j.mode, j.model.name, j.context_len) for j in jobs} == {
        (bs, mode, "qwen3-0.6b", 16) for bs in (1, 2, 4, 8) for mode in ("eager", "graphed")}


@pytest.mark.parametrize("override, says", [
    ("dtype=int3", "expected one of [bf16, fp16, fp32]"),
    ("bs=four", "could not be converted to Integer"),
    ("model.hidden_size=wide", "could not be converted to Integer"),
    ("model=llama-9000", "Available options in 'model'"),
    ("no_such_key=1", "Could not override 'no_such_key'"),
])
def test_hydra_rejects_bad_values_naming_the_options(override, says):
    with pytest.raises(ConfigCompositionException) as err:
        compose_cfg(override)
    text = str(err.value) + str(err.value.__cause__)
    assert says in text
    if override.startswith("model="):
        assert "qwen3-0.6b" in text and "tiny" in text


def test_the_readme_config_table_is_the_schema():
    readme = (REPO / "README.md").read_text()
    table = dict(re.findall(r"^\| `([\w.]+)` \| `([^`]*)` \|", readme, flags=re.M))
    # every key with a default, as the README writes it (an architecture key has none: each preset states it)
    defaults = {k: json.dumps(v).replace(" ", "").strip('"') for k, v in schema_defaults().items()}
    assert table.pop("model") == "qwen3-0.6b" == compose_cfg().model.name  # the group conf/config.yaml selects
    assert table == defaults


# the presets of dozens of jobs compose for seconds each (Hydra's compose, a job at a time): slow
MANY_JOBS = {"context", "ladder", "models", "modes-bs"}


@pytest.mark.parametrize("preset", [pytest.param(name, marks=[pytest.mark.slow] if name in MANY_JOBS else [])
                                    for name in sorted(p.stem for p in (REPO / "conf" / "experiment").glob("*.yaml"))])
def test_every_experiment_preset_composes_into_valid_jobs(preset):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"+experiment={preset}"], return_hydra_config=True)
    params = cfg.hydra.sweeper.params
    axes = [[f"{key}={value}" for value in str(values).split(",")] for key, values in params.items()]
    jobs = list(itertools.product(*axes))
    assert len(jobs) >= 2
    for job in jobs:  # every job of the preset passes the schema; none would fail before it ran
        run_config(f"+experiment={preset}", *job)


@pytest.mark.slow
def test_the_context_preset_measures_one_eager_baseline_per_batch_and_context_and_every_backend_graphed():
    """The sweep's exclude rules, applied to the real preset as `harness plan` and the sweeper apply them. Bugs
    caught: a rule that excludes nothing, or too much (a graphed run, or the eager baseline a graphed run's speedup
    needs); a mode axis not last (a graphed job then does not follow the eager one whose references it can take).
    (A rule on an enum key, dtype, is tests/unit/cli/test_app.py's.)"""
    from harness.cli.plan import composed, jobs_of
    from harness.config.exclude import excluding_rule

    jobs, rules = jobs_of(["+experiment=context"])
    runs = [to_run_config(cfg) for cfg in map(composed, jobs) if excluding_rule(cfg, rules) is None]
    combos = {(r.bs, r.context_len, r.attn, r.mode) for r in runs}
    grid = [(bs, ctx) for bs in (1, 8, 32) for ctx in (1024, 4096, 16384, 32768)]
    assert len(runs) == len(combos) == 48 and len(jobs) == 72
    assert combos == ({(bs, ctx, attn, "graphed") for bs, ctx in grid for attn in ("sdpa", "sdpa-gqa", "flex")}
                      | {(bs, ctx, "sdpa", "eager") for bs, ctx in grid})
    after_eager = [(a, b) for a, b in zip(runs, runs[1:]) if a.mode == "eager"]  # in the order the sweep runs them
    assert len(after_eager) == 12 and all((b.mode, b.attn, b.bs, b.context_len) == ("graphed", "sdpa", a.bs, a.context_len)
                                          for a, b in after_eager)


def parameters(model_name: str) -> int:
    """The real parameter count, from the architecture built on the meta device (no memory)."""
    m = run_config(f"model={model_name}").model
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(m.model_type, **m.architecture()))
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name, count", [("llama-3.2-1b", 1_235_814_400), ("llama-3.1-8b", 8_030_261_248),
                                         ("qwen3-30b-a3b", 30_532_122_624)])
def test_presets_are_the_published_architectures(name, count):
    assert parameters(name) == count  # the parameter counts the model cards publish


def _stored_config(*overrides: str) -> dict:
    """A config as a job records it: resolved, enums as strings, the derived cache_len filled in."""
    config = OmegaConf.to_container(compose_cfg(*overrides), resolve=True, enum_to_str=True)
    config["cache_len"] = run_config(*overrides).cache_len
    return config


@pytest.mark.usefixtures("fresh_model_cache")
@pytest.mark.slow
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


@pytest.mark.usefixtures("fresh_model_cache")
@pytest.mark.slow
def test_cache_len_follows_from_the_context_unless_given():
    assert run_config("context_len=1000").cache_len == 1280  # 1000 + 10 + 128, rounded up to 256
    assert run_config("context_len=16").cache_len == 256
    assert run_config("context_len=1000", "cache_len=4096").cache_len == 4096
    with pytest.raises(ConfigError, match=r"cache_len=1100 is too short: context_len \(1000\) .* use cache_len>=1138"):
        run_config("context_len=1000", "cache_len=1100")
    with pytest.raises(ConfigError, match=r"cache_len=1100 is invalid with attn=flex: .* \(e.g. 1152\)"):
        run_config("attn=flex", "cache_len=1100")
    with pytest.raises(ConfigError, match="prompt_len is now called context_len: use context_len=N"):
        check_overrides(["prompt_len=16"])
