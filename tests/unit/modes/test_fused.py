"""harness/modes/fused.py: mode=fused's jobs in process (Triton's interpreter) verified against fp32, the faults that
a fused kernel can hide failing the run, the switches a device lacks run off, and tune's job without a GPU."""
from __future__ import annotations

import dataclasses

import pytest

from harness.config.fused import FUSED_SWITCHES, FusedConfig
from harness.kernels.fused.attention import attention_chunks, one_chunk_max_slots
from harness.kernels.fused.knobs import KNOBS
from harness.measure import context_check
from harness.measure.job import measure
from harness.modes.fused import as_run
from tests.support import run_config
from tests.unit.kernels.fused.support import FUSED, tiny_model_and_prompt

# A job's context 4 slots short of a block edge of 64 (the fused attention's, as triton-decode's), its verification
# cut to 8 steps (short_verification): the checks still decode across the edge (verified_steps: to two steps past it)
# and judge each step against fp32, in 18 fused steps in Triton's interpreter where FAST's context of 8 slots in a
# cache of 64 and the 32-step window took 66.
SHORT_JOB = ("context_len=60", "cache_len=128")


@pytest.fixture(autouse=True)
def short_verification(monkeypatch):
    """Each job of this file verifies 8 steps past its context (or up to two past the first block edge, where more)."""
    monkeypatch.setattr(context_check, "VERIFY_TOKENS", 8)


@pytest.mark.slow
def test_a_bs1_fused_job_past_one_chunk_runs_the_attention_as_three_launches_and_verifies():
    """The rule in a job: a bs=1 run whose longest prefix passes one chunk a KV head (384 slots for the tiny model's
    heads of 16; its K/V ask L2 for none of its MLP) launches seven kernels a layer, computes what fp32 does, and its
    plan tag says why."""
    result = measure(run_config(*FUSED, "bs=1", "context_len=380", "cache_len=448"))  # 391 slots at most
    m, plan_tag = result.metrics, result.mode_tags["fused_plan"]
    assert result.failure is None and m["verified"] == 1.0, result.failure
    assert m["kernel_launches_per_step"] == 7 * 2 + 1 and m["attention_chunks_per_kv_head"] > 1
    assert ("; attention: three launches (bs=1 past one chunk a KV head, under 4.0 MiB of K/V or 7% of the MLP's "
            "weights asked ahead)") in plan_tag  # and none asked by its merge: a CPU has no bulk prefetch
    assert result.mode_tags["fused"].startswith("pdl=off split_k=on packed=on prefetch=off fold_attention=on")


@pytest.mark.parametrize("steps_after_prompt, one_chunk", [(60, True), (200, False)],
                         ids=["one-chunk", "chunks-and-merge"])
def test_a_fused_run_logs_its_attention_chunks_a_kv_head(steps_after_prompt, one_chunk):
    """The attention's grid as the run planned it, from the longest prefix it decodes to: 100 slots of context and
    60 steps after them (161 slots), one chunk a KV head; 200 steps after them (301 slots), the grid for about 264
    programs, several chunks and their merge."""
    from harness.modes.fused import FusedStepper

    cfg, model, prompt = tiny_model_and_prompt("context_len=100", "cache_len=320")
    stepper = FusedStepper(model, prompt, cfg.cache_len, FusedConfig(pdl=False), steps_after_prompt=steps_after_prompt)
    chunks = stepper.metrics["attention_chunks_per_kv_head"]
    assert chunks == stepper.decoder.attn_acc.shape[2] == attention_chunks(
        KNOBS, 2, model.config.num_key_value_heads, 100 + steps_after_prompt + 1, KNOBS.attention_programs,
        model.config.head_dim)
    assert (chunks == 1) == one_chunk


@pytest.mark.slow
def test_a_fused_job_is_verified_against_fp32_with_its_kernels_named():
    result = measure(run_config(*FUSED, *SHORT_JOB, "model.tie_word_embeddings=false"))
    m, tags = result.metrics, result.mode_tags
    assert result.failure is None and m["verified"] == 1.0, result.failure
    assert "kl_nats" in m and m["fp32_rows_checked"] == 2  # judged against fp32, as an inexact mode
    assert m["kernel_launches_per_step"] == 5 * 2 + 1  # five a layer, the attention folded into one
    # on a CPU the GPU's techniques are off, and the tag says so
    assert tags["fused"] == ("pdl=off split_k=on packed=on prefetch=off fold_attention=on tune=off slices=off "
                             "weights_ahead=off tma=off")
    assert tags["fused_plan"].endswith("; attention: no weights asked of L2; mlp: gate/up, then down")
    prefetched = run_config(*FUSED, "fused.prefetch=true", "fused.split_k=false", "fused.fold_attention=false")
    assert prefetched.label.endswith("fused split_k=off prefetch=on fold_attention=off")  # each switch named where off its default
    # the label's defaults are the schema's: a default changed in one place only would name (or hide) a switch
    assert FUSED_SWITCHES == {f"fused.{k}": v for k, v in dataclasses.asdict(FusedConfig()).items()}
    assert tags["captured"].startswith("no: ")


@pytest.mark.slow
def test_a_fused_graph_of_two_steps_is_judged_against_fp32_step_by_step():
    """graph_steps=2: argmax and feeding inside the call; every step's token shown, so fp32 follows it."""
    two = measure(run_config(*FUSED, *SHORT_JOB, "model.tie_word_embeddings=false", "graph_steps=2"))
    assert two.failure is None and two.metrics["verified"] == 1.0, two.failure
    assert len(two.step_ms) == 8 // 2  # one sample a call of two steps
    assert two.metrics["checks_applied"] == 1.0 and two.metrics["fp32_max_logit_err"] < 1e-3
    assert two.metrics["token_repeat_fraction"] < 0.5  # varied tokens: a stale one would show


def test_a_fused_graph_of_several_steps_sizes_its_attention_for_whole_replays():
    """The attention's chunks are sized for the longest prefix a timed step reaches: with graph_steps=256 the
    decode is a replay of 256 steps from the window's first slot, past one chunk's slots, where its tokens alone are
    not."""
    from harness.modes.fused import FusedMode

    cfg, model, prompt = tiny_model_and_prompt("graph_steps=256", "cache_len=null")
    replays = FusedMode().prepare(model, prompt, cfg)  # 8 + 2 + 256 + 1 slots
    assert one_chunk_max_slots(KNOBS, cfg.bs, model.config.head_dim) < 8 + 2 + 256 + 1
    assert replays.metrics["attention_chunks_per_kv_head"] > 1
    one = FusedMode().prepare(model, prompt, run_config(*FUSED))  # 8 + 2 + 8 + 1 slots
    assert one.metrics["attention_chunks_per_kv_head"] == 1


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["fused_rope_off_by_one", "fused_greedy_not_fed"])
def test_a_fault_inside_a_fused_graph_of_two_steps_fails_the_run(monkeypatch, kind):
    monkeypatch.setenv("HARNESS_INJECT_MUTATION", kind)
    result = measure(run_config(*FUSED, *SHORT_JOB, "model.tie_word_embeddings=false", "graph_steps=2"))
    assert result.failure is not None and result.metrics["verified"] == 0.0, kind
    assert result.mode_tags["mutation"] == kind


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["kv_append_lost", "fused_rope_off_by_one"])
def test_a_fault_inside_a_fused_kernel_fails_the_run(monkeypatch, kind):
    monkeypatch.setenv("HARNESS_INJECT_MUTATION", kind)
    result = measure(run_config(*FUSED, *SHORT_JOB, "model.tie_word_embeddings=false"))
    assert result.failure is not None and result.metrics["verified"] == 0.0, kind
    assert result.mode_tags["mutation"] == kind


def test_a_fault_inside_the_fused_kernels_is_refused_for_another_mode(monkeypatch):
    from harness.measure import mutations

    monkeypatch.setenv("HARNESS_INJECT_MUTATION", "kv_append_lost")
    assert mutations.requested("fused") == "kv_append_lost"
    with pytest.raises(ValueError, match="^HARNESS_INJECT_MUTATION=kv_append_lost acts inside mode=fused's kernels, "
                                         "and this job is mode=eager$"):
        mutations.requested("eager")


@pytest.mark.slow
def test_a_job_that_cannot_time_the_step_says_it_did_not_tune():
    result = measure(run_config(*FUSED, *SHORT_JOB, "model.tie_word_embeddings=false", "fused.tune=true"))
    assert result.failure is None and result.metrics["verified"] == 1.0, result.failure
    assert result.mode_tags["tune"].startswith("not applied: no GPU") and "tune_ms" not in result.metrics
    assert "tune=on" in result.mode_tags["fused"] and result.mode_tags["fused_plan"].startswith("qkv: ")
    assert run_config(*FUSED, "fused.tune=true").label.endswith("fused tune=on")


def test_a_switch_whose_hardware_the_device_lacks_runs_off():
    """On a CPU the Hopper-only techniques and the slices run off; on a GPU older than Hopper the slices stay on;
    a switch the user turned off stays off everywhere."""
    wanted = FusedConfig(prefetch=True, split_k=False)
    cpu, older, hopper = as_run(wanted, False, False), as_run(wanted, True, False), as_run(wanted, True, True)
    assert (cpu.pdl, cpu.prefetch, cpu.weights_ahead, cpu.tma, cpu.slices) == (False,) * 5
    assert (older.slices, older.pdl, older.tma) == (True, False, False)
    assert hopper == wanted and not hopper.split_k and cpu.packed and cpu.fold_attention
