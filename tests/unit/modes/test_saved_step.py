"""Compiled steps kept on disk between sweeps (harness/modes/saved_step.py), in process."""
from __future__ import annotations

import os
import time

import pytest
import torch

from harness.modes.compiled import LOADED, TRACED
from tests.support import FAST


@pytest.mark.slow
def test_a_steps_name_changes_with_all_that_decides_its_code_and_only_that(fresh_model_cache):
    from harness.models import get_model
    from harness.modes.saved_step import step_key
    from tests.support import run_config

    cfg = run_config(*FAST, "device=cpu")
    model = get_model(cfg.model, "bf16", "sdpa", torch.device("cpu"), 0).model
    again = get_model(cfg.model, "bf16", "sdpa", torch.device("cpu"), seed=1).model  # other weights, same code
    cpu = torch.device("cpu")
    key = step_key(model, (1, 64), torch.bfloat16, cpu, {"triton.cudagraphs": False}, False)
    assert step_key(again, (1, 64), torch.bfloat16, cpu, {"triton.cudagraphs": False}, False) == key
    others = [step_key(model, (2, 64), torch.bfloat16, cpu, {"triton.cudagraphs": False}, False),  # rows
              step_key(model, (1, 128), torch.bfloat16, cpu, {"triton.cudagraphs": False}, False),  # capacity
              step_key(model, (1, 64), torch.float32, cpu, {"triton.cudagraphs": False}, False),  # cache dtype
              step_key(model, (1, 64), torch.bfloat16, cpu, {"triton.cudagraphs": True}, False),  # options
              step_key(model, (1, 64), torch.bfloat16, cpu, {"triton.cudagraphs": False}, True)]  # regions
    deeper = get_model(run_config(*FAST, "device=cpu", "model.num_hidden_layers=3").model, "bf16", "sdpa", cpu, 0).model
    others.append(step_key(deeper, (1, 64), torch.bfloat16, cpu, {"triton.cudagraphs": False}, False))
    with torch.inference_mode():  # inference tensors for parameters, which the step's guards tell apart
        inference = get_model(cfg.model, "bf16", "sdpa", cpu, seed=2).model
    assert next(inference.parameters()).is_inference()
    others.append(step_key(inference, (1, 64), torch.bfloat16, cpu, {"triton.cudagraphs": False}, False))
    assert len({key, *others}) == len(others) + 1


def test_a_step_with_a_graph_break_is_not_saved_and_later_sweeps_are_told_why(tmp_path):
    from harness.modes import saved_step

    def with_a_break(x):
        y = x * 2
        torch._dynamo.graph_break()
        return y + 1

    path = tmp_path / "steps" / "k.step"
    with pytest.raises(saved_step.StepNotSaved, match="the step cannot be kept on disk: "):
        saved_step.compile_and_save(path, with_a_break, {}, (torch.ones(3),))
    assert not path.exists()
    assert saved_step.not_kept_note(path).read_text().startswith("the step cannot be kept on disk: ")


@pytest.mark.slow
def test_a_loaded_step_runs_its_compiled_code_not_the_models_python(tmp_path, fresh_model_cache):
    """A step loaded from disk by a job with a model of its own: calling it runs no layer's Python (a stepper that
    fell back to eager, or to tracing again, would call the booby-trapped layer), and its logits are eager's."""
    from harness.models import get_model
    from harness.modes.base import Stepper
    from harness.modes.compiled import LOADED, CompiledStepper
    from tests.support import run_config

    cfg, cpu = run_config(*FAST, "device=cpu", "dtype=fp32"), torch.device("cpu")
    prompt = torch.randint(0, 1000, (2, 8), generator=torch.Generator().manual_seed(0))

    def stepper(seed: int):
        model = get_model(cfg.model, "fp32", "sdpa", cpu, seed).model
        return model, CompiledStepper(model, prompt, 64, "default", {}, False, keep_in=tmp_path).compile(prompt)

    with torch.inference_mode():
        _, first = stepper(seed=0)
        assert first.tags["compile_cache"].startswith("traced and compiled")
        model, loaded = stepper(seed=1)  # other weights: a model the saved step never saw, read as inputs
        assert loaded.tags["compile_cache"] == LOADED
        reference = Stepper(model, prompt, 64)  # plain eager, prefilled
        loaded.restart(prompt)

        def trap(*args, **kwargs):
            raise AssertionError("the model's Python ran")

        model.model.layers[0].forward = trap
        logits = loaded.step()
        del model.model.layers[0].forward
        expected = reference.step()
    assert torch.allclose(logits, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_a_saved_step_whose_guards_reject_the_jobs_model_is_traced_afresh_not_called(tmp_path, monkeypatch,
                                                                                      fresh_model_cache):
    """A step saved over a model of ordinary parameters, found under the same name by a job whose model holds
    inference tensors (built under torch.inference_mode): its guards fail on the parameters' dispatch keys, and a call
    would raise (seen on the H200). The job traces the step afresh and says why; its logits are eager's."""
    from harness.models import get_model
    from harness.modes import saved_step
    from harness.modes.base import Stepper
    from harness.modes.compiled import CompiledStepper
    from tests.support import run_config

    monkeypatch.setattr(saved_step, "step_key", lambda *args: "one-name")  # as if the name did not tell them apart
    cfg, cpu = run_config(*FAST, "device=cpu", "dtype=fp32"), torch.device("cpu")
    prompt = torch.randint(0, 1000, (2, 8), generator=torch.Generator().manual_seed(0))

    def stepper(seed: int, model=None):
        model = get_model(cfg.model, "fp32", "sdpa", cpu, seed).model if model is None else model
        return model, CompiledStepper(model, prompt, 64, "default", {}, False, keep_in=tmp_path).compile(prompt)

    ordinary = get_model(cfg.model, "fp32", "sdpa", cpu, seed=0).model  # built outside inference_mode
    with torch.inference_mode():
        _, first = stepper(0, ordinary)
        assert first.tags["compile_cache"] == TRACED
        model, second = stepper(seed=1)
        assert next(model.parameters()).is_inference()
        assert second.tags["compile_cache"] == TRACED, second.tags
        assert "guards fail" in second.tags["compiled_step_load_failed"]
        assert "dispatch key" in second.tags["compiled_step_load_failed"]
        reference = Stepper(model, prompt, 64)
        second.restart(prompt)
        assert torch.allclose(second.step(), reference.step(), rtol=1e-4, atol=1e-4)
        _, third = stepper(seed=2)  # the step saved again over the second: its guards pass
        assert third.tags["compile_cache"] == LOADED


def _file(folder, name: str, size: int, age_s: float):
    path = folder / name
    path.write_bytes(b"x" * size)
    then = time.time() - age_s
    os.utime(path, (then, then))
    return path


def test_pruning_deletes_the_least_recently_used_steps_until_the_rest_fit_and_never_the_new_one(tmp_path):
    """Steps and notes go oldest first until the folder fits; the step just saved stays even where it alone is
    over the budget; a part-written file goes only where its writer died long ago; other files are not ours."""
    from harness.modes.saved_step import STALE_PART_S, prune

    oldest, old = _file(tmp_path, "a.step", 300, 500), _file(tmp_path, "b.not-kept", 50, 400)
    recent, new = _file(tmp_path, "c.step", 300, 100), _file(tmp_path, "d.step", 400, 0)
    dead, writing = _file(tmp_path, "e.1.part", 900, STALE_PART_S + 60), _file(tmp_path, "f.2.part", 900, 1)
    other = _file(tmp_path, "README", 5000, 9999)
    assert prune(tmp_path, 700, new) == [("a.step", 300), ("b.not-kept", 50)]  # 1050 -> 700
    assert {p.name for p in tmp_path.iterdir()} == {recent.name, new.name, writing.name, other.name}
    assert not dead.exists() and not oldest.exists() and not old.exists()
    assert prune(tmp_path, 700, new) == []  # within the budget: nothing more
    assert prune(tmp_path, 0, new) == [("c.step", 300)] and new.exists()  # 0 keeps only the step saved last


@pytest.mark.parametrize("value, budget", [(None, 2048 << 20), ("512", 512 << 20), ("0.5", 1 << 19), ("0", 0)])
def test_the_budget_is_read_in_mb(monkeypatch, value, budget):
    from harness.modes.saved_step import BUDGET_VARIABLE, budget_bytes

    if value is None:
        monkeypatch.delenv(BUDGET_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(BUDGET_VARIABLE, value)
    assert budget_bytes() == budget


@pytest.mark.slow
def test_a_saved_step_prunes_the_folder_and_a_loaded_one_counts_as_used(tmp_path, monkeypatch, fresh_model_cache):
    """A job that traces and saves its step brings the folder within HARNESS_SAVED_STEPS_MAX_MB, oldest first, and
    says so in a tag; a job that loads a step marks it used, so that the next pruning keeps it over older ones."""
    from harness.models import get_model
    from harness.modes.compiled import CompiledStepper
    from tests.support import run_config

    cfg, cpu = run_config(*FAST, "device=cpu", "dtype=fp32"), torch.device("cpu")
    prompt = torch.randint(0, 1000, (2, 8), generator=torch.Generator().manual_seed(0))
    for i in range(3):  # 30 MB, old0 the oldest
        _file(tmp_path, f"old{i}.step", 10 << 20, 1000 - i)

    def stepper(seed: int):
        model = get_model(cfg.model, "fp32", "sdpa", cpu, seed).model
        return CompiledStepper(model, prompt, 64, "default", {}, False, keep_in=tmp_path).compile(prompt)

    monkeypatch.setenv("HARNESS_SAVED_STEPS_MAX_MB", "25")
    with torch.inference_mode():
        traced = stepper(seed=0)
        (saved,) = [p for p in tmp_path.glob("*.step") if not p.name.startswith("old")]
        size_mb = saved.stat().st_size / (1 << 20)
        assert size_mb < 5  # a tiny model's step (1.6 MB here): with it the folder is over 25 MB until old0 goes
        assert {p.name for p in tmp_path.iterdir()} == {saved.name, "old1.step", "old2.step"}
        assert traced.tags["compiled_steps_pruned"] == (
            f"1 saved step least recently used deleted, 10.0 MB, to keep {tmp_path} within "
            "HARNESS_SAVED_STEPS_MAX_MB=25 MB")

        then = time.time() - 2000  # older than every stale file
        os.utime(saved, (then, then))
        loaded = stepper(seed=1)  # another model object: nothing compiled in process, the saved step is loaded
    assert loaded.metrics["compile_step_loaded"] == 1.0 and "compiled_steps_pruned" not in loaded.tags
    assert saved.stat().st_mtime > time.time() - 60  # marked used
    from harness.modes.saved_step import prune
    assert [name for name, _ in prune(tmp_path, 5 << 20, tmp_path / "none.step")] == ["old1.step", "old2.step"]
    assert saved.exists()
