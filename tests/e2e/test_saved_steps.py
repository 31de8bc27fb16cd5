"""Compiled steps and kernels kept on disk, read by a later sweep of the real CLI."""
from __future__ import annotations

import json
import os

import pytest

from harness import models
from harness.cli import commands as cli
from harness.measure.environment import SET_BY_TORCH
from harness.modes.compiled import LOADED, TRACED
from tests.support import FAST, run_harness, run_in_process


REGIONAL_FP32 = [*FAST, "mode=compiled-nograph", "device=cpu", "dtype=fp32", "compile_regions=true",
                 "model.tie_word_embeddings=false"]


def _results(folder):
    return [json.loads(p.read_text()) for p in folder.glob("outputs/**/result.json")]


@pytest.mark.slow
def test_a_later_sweep_reads_the_kernels_or_loads_the_step_the_first_saved_and_a_fault_or_damage_traces_afresh(
        workdir, capfd, monkeypatch, fresh_model_cache):
    """Sweeps, one cache folder:
    - with the saved steps off, the second sweep's process compiles by reading Inductor's FX graph cache under
      HARNESS_CACHE_DIR, which the first's wrote;
    - with them on, a sweep traces, compiles and saves the step; the next sweep's process loads it (no trace) and is
      verified;
    - a cut-short file is traced and saved again; a test's fault never loads the clean step (it would then pass) and
      is not saved.
    The sweeps that save, or are refused a saved step, run in the test's process: what they show is not about a
    process."""
    cache = workdir / "cache"
    env = {"HARNESS_CACHE_DIR": str(cache), "HARNESS_SAVE_COMPILED_STEPS": "1"}

    def sweep(name: str, in_process: bool = False, **more_env: str) -> dict:
        (workdir / name).mkdir()
        if in_process:  # a model of its own, as a new process builds, and the compile caches' folders left to the
            models.release_models()  # harness, as a subprocess's environment leaves them (harness_env)
            for variable in SET_BY_TORCH:
                monkeypatch.delenv(variable, raising=False)
            monkeypatch.chdir(workdir / name)
            done = run_in_process(capfd, monkeypatch, *REGIONAL_FP32, env={**env, **more_env})
        else:
            done = run_harness(*REGIONAL_FP32, cwd=workdir / name, env={**env, **more_env})
        (result,) = _results(workdir / name)
        assert done.returncode == (0 if result["status"] == "FINISHED" else 1), done.stderr
        return result

    fx_cold, fx_warm = (sweep(name, HARNESS_SAVE_COMPILED_STEPS="0")["metrics"] for name in ("fx-cold", "fx-warm"))
    assert fx_cold["compile_cache_hit"] == 0.0 and fx_cold["compile_graphs_compiled"] >= 1
    assert fx_warm["compile_cache_hit"] == 1.0 and fx_warm["compile_graphs_from_cache"] >= 1
    assert fx_warm["verified"] == 1.0 and any((cache / "compile" / "inductor").rglob("*"))
    assert not (cache / "compile" / "steps").exists() or not any((cache / "compile" / "steps").iterdir())
    # where each compile's time went: both traced the step; the warm one's backend read what the cold one built
    for m in (fx_cold, fx_warm):
        assert 0 < m["compile_trace_ms"] and 0 < m["compile_backend_ms"]
        assert m["compile_trace_ms"] + m["compile_backend_ms"] <= m["compile_dynamo_ms"] <= m["compile_ms"]
        assert m["compile_calls_ms"] == pytest.approx(m["compile_ms"] - m["compile_dynamo_ms"])
    assert fx_warm["compile_backend_ms"] < fx_cold["compile_backend_ms"]

    cold = sweep("cold", in_process=True)
    (saved,) = (cache / "compile" / "steps").glob("*.step")
    assert cold["mode_tags"]["compiled_step"].startswith("traced and compiled, and saved for later sweeps")
    assert cold["metrics"]["compile_step_loaded"] == 0.0 and cold["metrics"]["compile_trace_ms"] > 0
    warm = sweep("warm")
    assert warm["mode_tags"]["compiled_step"] == f"loaded: the saved step (its trace and Inductor's code) of an " \
                                                f"earlier sweep, {saved.stem}"
    assert warm["metrics"]["compile_step_loaded"] == 1.0 and warm["metrics"]["compile_cache_hit"] == 1.0
    assert warm["metrics"].get("compile_trace_ms", 0.0) == 0.0  # Dynamo read no Python
    assert warm["metrics"]["compile_ms"] < cold["metrics"]["compile_ms"]
    assert cold["metrics"]["verified"] == warm["metrics"]["verified"] == 1.0

    saved.write_bytes(saved.read_bytes()[:1000])
    damaged = sweep("damaged", in_process=True)
    assert damaged["mode_tags"]["compiled_step_load_failed"].startswith(
        f"the saved step {saved.name} could not be loaded")
    assert damaged["metrics"]["compile_step_loaded"] == 0.0 and damaged["metrics"]["verified"] == 1.0
    assert saved.stat().st_size > 1000  # traced and saved whole again

    mutated = sweep("mutated", in_process=True, HARNESS_INJECT_MUTATION="rope_off_by_one")
    assert mutated["status"] == "FAILED" and mutated["metrics"]["verified"] == 0.0
    assert mutated["mode_tags"]["compiled_step"] == "not kept: a test's fault (rope_off_by_one) is injected"
    assert [p.name for p in (cache / "compile" / "steps").iterdir()] == [saved.name]


@pytest.mark.slow
def test_compiled_ab_arms_read_the_cache_then_load_saved_steps_and_fresh_compiles_compile_again(workdir, monkeypatch,
                                                                                              fresh_model_cache):
    """One config's A/Bs on one machine, in the order a user meets them, sharing the cold compiles:
    - two processes with the saved steps off: the first compiles, the second reads the first's Inductor cache (two
      machines' A/Bs ran the same kernels only where the second read the first's cache);
    - with them on, an A/B traces and saves both steps, and the next loads them (these two in this process, each
      with models of its own);
    - `--fresh-compiles` asks what a machine that never compiled the config would run: a process of its own, whose
      empty cache folders make it compile again. Bug caught: the fresh processes given empty Inductor and Triton caches
      but the harness's own folder, where each loaded the saved step (`prepared`: loaded) and compiled nothing."""
    cache = workdir / "cache"
    for variable, folder in (("HARNESS_CACHE_DIR", ""), ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
                             ("TRITON_CACHE_DIR", "triton")):
        monkeypatch.setenv(variable, str(cache / folder))  # a cold cache, whatever torch's imports set
    arms = ["+inductor.epilogue_fusion=false", "+inductor.epilogue_fusion=true"]
    common = [*REGIONAL_FP32, "--pairs", "2", "--threshold", "50%"]

    def ab(out: str, *more: str) -> dict:
        models.release_models()  # each A/B builds its models and compiles, as a process of its own would
        assert cli.main(["ab", *arms, *common, "--out", out, *more]) in (0, 1)  # 1: B slower, as tiny CPU arms may be
        return json.loads((workdir / out / "ab.json").read_text())

    cold = ab("cold", "--processes", "2")
    first, second = zip(*cold["prepared"])  # each arm's line from each process
    assert all(line.startswith("0 of") and not line.endswith(" 0 compiled") for line in first), first  # cold
    assert all(not line.startswith("0 of") and line.endswith(" 0 compiled") for line in second), second  # read
    assert "prepared in" in (workdir / "cold" / "ab.md").read_text()
    assert not (cache / "compile" / "steps").exists() or not any((cache / "compile" / "steps").iterdir())

    monkeypatch.setenv("HARNESS_SAVE_COMPILED_STEPS", "1")
    first = ab("first")
    saved = sorted(p.name for p in (cache / "compile" / "steps").glob("*.step"))
    assert len(saved) == 2 and [line for arm in first["prepared"] for line in arm] == [TRACED] * 2
    assert [line for arm in ab("again")["prepared"] for line in arm] == [LOADED] * 2  # the saved steps do load

    fresh = ab("fresh", "--fresh-compiles")
    assert fresh["fresh_compiles"] and fresh["processes"] == 1 and len(fresh["process_ratios"]) == 1
    assert [line for arm in fresh["prepared"] for line in arm] == [TRACED] * 2
    assert sorted(p.name for p in (cache / "compile" / "steps").glob("*.step")) == saved  # nor wrote there
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(cache / "inductor")  # this process's, given back
