"""Compose the real config tree through Hydra's compose API, good input and bad."""
from __future__ import annotations

import itertools
import json
import re

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from harness.config.schema import CONF_DIR
from harness.config.schema import schema_defaults
from harness.errors import ConfigError
from harness.config.validate import to_run_config
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


def test_the_readme_config_table_is_the_schema():
    readme = (REPO / "README.md").read_text()
    table = dict(re.findall(r"^\| `([\w.]+)` \| `([^`]*)` \|", readme, flags=re.M))
    # every key with a default, as the README writes it (an architecture key has none: each preset states it)
    defaults = {k: json.dumps(v).replace(" ", "").strip('"') for k, v in schema_defaults().items()}
    assert table.pop("model") == "qwen3-0.6b" == compose_cfg().model.name  # the group conf/config.yaml selects
    assert table == defaults


@pytest.mark.parametrize("preset", sorted(p.stem for p in (REPO / "conf" / "experiment").glob("*.yaml")))
def test_every_experiment_preset_composes_into_valid_jobs(preset):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"+experiment={preset}"], return_hydra_config=True)
    params = cfg.hydra.sweeper.params
    axes = [[f"{key}={value}" for value in str(values).split(",")] for key, values in params.items()]
    jobs = list(itertools.product(*axes))
    assert len(jobs) >= 2
    for job in jobs:  # every job of the preset passes the schema; none would fail before it ran
        run_config(f"+experiment={preset}", *job)


def test_the_context_preset_measures_one_eager_baseline_per_batch_and_context_and_every_backend_graphed():
    """The sweep's exclude rules, applied to the real preset as `harness plan` and the sweeper apply them. Bugs
    caught: a rule that excludes nothing, or too much (a graphed run, or the eager baseline a graphed run's speedup
    needs); a mode axis not last (a graphed job then does not follow the eager one whose references it can take).
    (A rule on an enum key, dtype, is tests/test_sweep.py's.)"""
    from harness.cli.plan import composed, jobs_of
    from harness.config.exclude import excluding_rule

    jobs, rules = jobs_of(["+experiment=context"])
    kept = [job for job in jobs if excluding_rule(composed(job), rules) is None]
    runs = [run_config(*job) for job in kept]
    combos = {(r.bs, r.context_len, r.attn, r.mode) for r in runs}
    grid = [(bs, ctx) for bs in (1, 8, 32) for ctx in (1024, 4096, 16384, 32768)]
    assert len(runs) == len(combos) == 48 and len(jobs) == 72
    assert combos == ({(bs, ctx, attn, "graphed") for bs, ctx in grid for attn in ("sdpa", "sdpa-gqa", "flex")}
                      | {(bs, ctx, "sdpa", "eager") for bs, ctx in grid})
    after_eager = [(a, b) for a, b in zip(runs, runs[1:]) if a.mode == "eager"]  # in the order the sweep runs them
    assert len(after_eager) == 12 and all((b.mode, b.attn, b.bs, b.context_len) == ("graphed", "sdpa", a.bs, a.context_len)
                                          for a, b in after_eager)


@pytest.mark.parametrize("leases, ran", [("every lease", 48), ("without the last lease", 46)])
def test_plan_estimates_a_preset_from_committed_result_files(workdir, capsys, leases, ran):
    """`harness plan --past DIR` with no store: each job's estimate is the median of its config's finished runs among
    the result files (the sum of their phases), the total is their sum, and a config that never finished says so
    (without the last lease's files, two: bs=32 at context 32768 under sdpa, one of them killed). Computed here by
    hand from the files. Bugs caught: a killed run counted, a config's runs not grouped by hash (the eager run at
    bs=32, context 4096 finished on two leases), the total summed over runs instead of configs."""
    import shutil
    import statistics

    from harness.cli import commands

    folder = REPO / "tests" / "data" / "h200-context"
    if leases != "every lease":
        folder = shutil.copytree(folder, workdir / "past", ignore=shutil.ignore_patterns("lease-c7c6099f-*"))
    phases = ("build_ms", "prepare_ms", "prefill_ms", "warmup_ms", "decode_wall_ms", "verify_ms")
    by_hash: dict[str, list[float]] = {}
    for path in folder.glob("**/result.json"):
        record = json.loads(path.read_text())
        if record["status"] == "FINISHED":
            by_hash.setdefault(record["config_hash"], []).append(sum(record["metrics"].get(p, 0.0) for p in phases) / 1e3)
    expected = sum(statistics.median(seconds) for seconds in by_hash.values())
    assert commands.main(["plan", "+experiment=context", "--past", str(folder)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "48 jobs (24 more excluded: mode=eager attn=sdpa-gqa; mode=eager attn=flex)"
    never = f"; {48 - ran} never ran here" if ran < 48 else ""
    total = next(line for line in out if line.startswith("total: "))
    assert len(by_hash) == ran and total == f"total: {expected:.1f} s for the {ran} jobs that ran before{never}"
    twice = [line for line in out if line.endswith("bs=32 ctx=4096 eager qwen3-0.6b cache=4352")]
    assert len(twice) == 1 and "(median of 2 past runs)" in twice[0]
    assert sum("no past run" in line for line in out) == 48 - ran


def test_plan_on_several_gpus_gives_each_job_in_turn_the_first_gpu_free(workdir, capsys):
    """`harness plan --gpus N`: the sweep's wall where each job, in the sweep's order, takes the first GPU to come free
    (hydra/launcher=gpus's queue). Bugs caught: jobs dealt round-robin (20 s below), the total split evenly (11 s)."""
    from harness.cli import commands
    from harness.cli.plan import wall_on_gpus

    assert wall_on_gpus([10.0, 1.0, 1.0, 1.0, 9.0], 2) == 12.0  # 10 | 1+1+1, then 9 on the one free at 3
    assert wall_on_gpus([10.0, 1.0, 1.0, 1.0, 9.0], 1) == 22.0 and wall_on_gpus([3.0, 5.0], 8) == 5.0
    folder = str(REPO / "tests" / "data" / "h200-context-whole")
    assert commands.main(["plan", "+experiment=context", "--past", folder, "--gpus", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    total = float(out[-3].split()[1])
    assert out[-2].startswith(f"on 1 GPU, one job each at a time (hydra/launcher=gpus): about {total:.1f} s ")
    assert commands.main(["plan", "+experiment=context", "--past", folder, "--gpus", "8"]) == 0
    eight = float(capsys.readouterr().out.splitlines()[-2].split("about ")[1].split()[0])
    assert total / 8 <= eight < total / 4
    assert commands.main(["plan", "+experiment=context", "--gpus", "0"]) == 2
    assert "--gpus: '0' is not a count of GPUs: use a whole number of 1 or more" in capsys.readouterr().err


def test_plan_numbers_the_jobs_as_the_sweep_ran_them(workdir, capsys):
    """`harness plan` lists a preset's jobs in the order the harness sweeper runs them (grouped by model, the grid's
    order within one), checked against the job numbers of the models preset's sweep on the H200, whose result files
    are committed. Bug caught: the plan listing Hydra's grid order (qwen3-0.6b first) while the sweep runs llama first."""
    from harness.cli import commands

    folder = REPO / "tests" / "data" / "h200-models-regional" / "lease-2cd8f179-preset"
    ran = {(r := json.loads(p.read_text()))["job_num"]: r["label"] for p in folder.glob("*/result.json")}
    assert commands.main(["plan", "+experiment=models"]) == 0
    # "  N   ESTIMATE  (WHERE FROM)  LABEL", marked where this machine cannot run the job
    lines = [line.split("  [cannot run here")[0] for line in capsys.readouterr().out.splitlines()
             if "(no past run" in line or "(median of" in line]
    # the preset's attention was plain sdpa then, which labels leave out; it is sdpa-nocudnn now
    listed = {int(line.split()[0]): line.rsplit(")", 1)[1].strip().removesuffix(" sdpa-nocudnn") for line in lines}
    assert len(listed) == 54 and len(ran) == 35
    # the committed runs were named before names led with the keys a sweep varies: the same words, in another order
    words = lambda label: sorted(label.split())  # noqa: E731
    assert {n: words(listed[n]) for n in ran} == {n: words(label) for n, label in ran.items()}
