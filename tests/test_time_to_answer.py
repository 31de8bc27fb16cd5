"""What a sweep does not do twice, and when a job's timing stops: each shortcut with the check it must not weaken."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from harness.measure import references
from harness.measure.job import measure
from harness.measure.stats import MIN_BLOCK_STEPS, MIN_BLOCKS, block_steps, stop_reason
from harness.measure.timing import warm_up
from harness.modes.eager import EagerStepper
from tests.support import FAST, run_config, tiny_fp32

STEADY = [[1.000, 1.001, 0.999, 1.000] * 8, [1.000, 1.000, 1.001, 0.999] * 8]  # a graphed run: ±0.1% at most
NOISY = [[1.0, 1.4, 0.8, 1.9] * 8, [1.6, 0.9, 1.2, 1.0] * 8]  # a host-bound eager run


def _rule(stop="adaptive", repeats=5, target_ci_pct=0.5, time_budget_s=10.0):
    return SimpleNamespace(stop=stop, repeats=repeats, target_ci_pct=target_ci_pct, time_budget_s=time_budget_s)


def test_the_interval_rule_stops_a_steady_run_after_two_blocks_and_never_after_one():
    assert stop_reason(_rule(), STEADY[:1], spent_s=1.0, next_block_s=1.0) is None  # one block cannot see drift
    why = stop_reason(_rule(), STEADY, spent_s=2.0, next_block_s=1.0)
    assert MIN_BLOCKS == 2 and why.startswith("interval: ±") and why.endswith("after 2 blocks, within target_ci_pct=0.5")
    assert stop_reason(_rule(), NOISY, spent_s=2.0, next_block_s=1.0) is None  # ±10% or more: time another


def test_the_budget_stops_before_a_block_that_would_pass_it_not_after():
    assert stop_reason(_rule(time_budget_s=3.0), NOISY[:1], spent_s=1.5, next_block_s=1.4) is None  # 2.9 s fits
    why = stop_reason(_rule(time_budget_s=3.0), NOISY, spent_s=2.9, next_block_s=1.4)
    assert why == ("time budget: a block more would take the timed decode from 2.9 s to about 4.3 s, "
                   "past time_budget_s=3")


def test_repeats_caps_the_adaptive_rule_and_alone_times_exactly_that_many_blocks():
    assert stop_reason(_rule(repeats=2), NOISY, spent_s=0.1, next_block_s=0.1) == "repeats: 2 blocks (repeats=2)"
    fixed = _rule(stop="repeats", repeats=3, time_budget_s=0.001)
    assert stop_reason(fixed, STEADY, spent_s=100.0, next_block_s=100.0) is None  # neither interval nor budget
    assert stop_reason(fixed, STEADY + STEADY[:1], 100.0, 100.0) == "repeats: 3 blocks (repeats=3)"


def _pace(stop="adaptive", decode_tokens=128, time_budget_s=5.0, graph_steps=1):
    return SimpleNamespace(stop=stop, decode_tokens=decode_tokens, time_budget_s=time_budget_s, graph_steps=graph_steps)


def test_a_block_holds_what_the_budget_does_at_the_warm_ups_pace_and_never_fewer_than_the_checks_compare():
    assert block_steps(_pace(), pace_ms=30.0) == (128, None)  # a host-bound eager step: a whole block fits
    steps, why = block_steps(_pace(), pace_ms=48.0)  # 5 s hold 104 steps of 48 ms
    assert steps == 104 and why == ("104 steps a block, not decode_tokens=128: at the warm-up's 48.0 ms a step, "
                                    "time_budget_s=5 holds 104")
    assert block_steps(_pace(), pace_ms=330.0)[0] == MIN_BLOCK_STEPS == 32  # 15 fit; a median wants 32
    assert block_steps(_pace(), pace_ms=330.0, at_least=121)[0] == 121  # a block edge the lockstep reaches
    assert block_steps(_pace(graph_steps=3), pace_ms=330.0)[0] == 33  # whole calls of a 3-step graph
    assert block_steps(_pace(stop="repeats"), pace_ms=330.0) == (128, None)  # exactly what was asked
    assert block_steps(_pace(), pace_ms=None) == (128, None)  # a warm-up of one call or none has no pace: no cut


def test_a_block_is_cut_to_the_kept_loop_of_its_shape_where_that_loop_is_shorter_and_no_rule_forbids_it():
    # a graphed job after an eager one whose slow steps cut its block to 73: 73 steps, so that eager's loop serves
    steps, why = block_steps(_pace(), pace_ms=12.8, at_least=22, reference_steps=73)
    assert steps == 73 and why == ("73 steps a block, not 128: as many as the loop of an earlier job of this shape "
                                   "decoded, whose logits serve as this run's reference")
    assert block_steps(_pace(), pace_ms=48.0, at_least=22, reference_steps=73)[0] == 73  # shorter than the budget's 104
    assert block_steps(_pace(), pace_ms=12.8, reference_steps=128) == (128, None)  # as long already
    assert block_steps(_pace(), pace_ms=330.0, reference_steps=73)[0] == 32  # the budget's cut is shorter: it stands
    assert block_steps(_pace(), pace_ms=12.8, reference_steps=31)[0] == 128  # under MIN_BLOCK_STEPS: no cut
    assert block_steps(_pace(), pace_ms=12.8, at_least=40, reference_steps=35)[0] == 128  # under what the lockstep needs
    assert block_steps(_pace(graph_steps=4), pace_ms=12.8, reference_steps=73)[0] == 128  # not whole 4-step calls
    assert block_steps(_pace(stop="repeats"), pace_ms=12.8, reference_steps=73) == (128, None)


def test_the_warm_ups_pace_is_its_second_half_so_a_slow_first_call_does_not_cut_a_block(monkeypatch):
    """On the clock the warm-up reads (harness.clock's, stood in for so that a loaded machine cannot move it), a first
    call of 500 ms (a late compile) and nine of 2 ms: the pace is the second half's, 2 ms a step. Bugs caught: the
    mean of all ten calls (51.8 ms), the first half's (101.6 ms)."""
    from harness import clock

    now = [0.0]
    monkeypatch.setattr(clock, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    _, model, prompt = tiny_fp32()
    stepper = EagerStepper(model, prompt, 64)
    step, calls = stepper.step, []

    def timed_call():
        calls.append(1)
        now[0] += 0.5 if len(calls) == 1 else 0.002
        return step()

    stepper.step = timed_call
    with torch.inference_mode():
        tokens, pace_ms = warm_up(stepper, 10, torch.device("cpu"))
        assert tokens.shape == (10, 2) and len(calls) == 10 and pace_ms == pytest.approx(2.0)
        assert warm_up(stepper, 1, torch.device("cpu"))[1] is None  # one call: no second half to time


def test_a_block_cut_to_the_budget_checks_every_token_it_decoded_and_still_fails_a_fault(monkeypatch):
    cut = ["decode_tokens=48", "cache_len=128", "time_budget_s=0.001", "bs=2", "model.tie_word_embeddings=false"]
    result = measure(run_config(*FAST, "device=cpu", "dtype=fp32", *cut))
    m = result.metrics
    assert result.failure is None and m["block_steps"] == 32 and len(result.step_ms) == 32 and m["repeats"] == 1
    assert result.mode_tags["block_cut"].startswith("32 steps a block, not decode_tokens=48: at the warm-up's ")
    assert m["decoded_tokens_checked"] == (2 + 32) * 2 and m["tokens_match"] == 1.0 and m["verified_steps"] == 32
    monkeypatch.setenv("HARNESS_INJECT_MUTATION", "stale_token")
    broken = measure(run_config(*FAST, "device=cpu", "dtype=fp32", *cut))
    assert broken.metrics["block_steps"] == 32 and broken.failure.startswith("logits differ from eager's")


@pytest.mark.parametrize("overrides, blocks, rule", [
    (["stop=adaptive", "time_budget_s=0.001"], 1, "time budget: "),
    (["stop=adaptive", "target_ci_pct=1000"], 2, "interval: "),
    (["stop=repeats", "time_budget_s=0.001"], 3, "repeats: 3 blocks"),
])
def test_a_job_times_the_blocks_its_rule_asks_for_and_says_which_rule_stopped_it(overrides, blocks, rule):
    result = measure(run_config(*FAST, "device=cpu", "dtype=fp32", "repeats=3", *overrides))
    assert result.failure is None and result.metrics["repeats"] == blocks and len(result.step_ms) == 8 * blocks
    assert result.mode_tags["stopped_by"].startswith(rule)


def test_the_next_job_of_a_shape_reuses_its_eager_references_and_still_checks_its_own_decode(monkeypatch):
    # the path of every mode but plain eager: one eager pass computed, kept as both references
    monkeypatch.setattr("harness.measure.references.loop_serves_as_reference", lambda stepper, exact: False)
    cfg = run_config(*FAST, "device=cpu", "dtype=fp32", "bs=2", "model.tie_word_embeddings=false")
    start = references.hits["computed"]
    first = measure(cfg)
    computed = references.hits["computed"]
    hits = references.hits["hits"]
    again = measure(cfg)
    assert first.failure is None and again.failure is None and again.metrics["verified"] == 1.0
    assert references.hits["computed"] == computed and references.hits["hits"] - hits == 2  # lockstep's, tokens'
    assert computed - start == 2  # the first job: one eager pass kept as both references (equal to eager: no second pass)
    for key in ("max_logit_diff", "tokens_match", "decoded_tokens_checked", "decoded_tokens_at_ties"):
        assert again.metrics[key] == first.metrics[key], key
    other = measure(run_config(*FAST, "device=cpu", "dtype=fp32", "bs=2", "seed=1", "model.tie_word_embeddings=false"))
    assert other.failure is None and references.hits["computed"] > computed  # another prompt: its own references


def test_the_next_job_of_a_shape_times_blocks_as_long_as_the_kept_loop_so_that_it_decodes_no_eager_again(monkeypatch):
    # plain eager's block cut to 32 steps by its (slow) pace; the next job of the shape would time 48, and then its
    # token check would decode eager over all 50 of its tokens, where the kept loop covers 34
    shape = [*FAST, "device=cpu", "dtype=fp32", "bs=2", "decode_tokens=48", "cache_len=128",
             "model.tie_word_embeddings=false"]
    eager = measure(run_config(*shape, "time_budget_s=0.001"))
    assert eager.failure is None and eager.metrics["block_steps"] == 32
    monkeypatch.setattr("harness.measure.references.loop_serves_as_reference", lambda stepper, exact: False)  # as graphed
    computed = references.hits["computed"]
    follower = measure(run_config(*shape))
    assert follower.failure is None and follower.metrics["block_steps"] == 32 and len(follower.step_ms) == 32
    assert follower.mode_tags["block_cut"].startswith("32 steps a block, not 48: as many as the loop of an earlier job")
    assert references.hits["computed"] == computed and follower.metrics["decoded_tokens_checked"] == 2 * 34
    monkeypatch.setenv("HARNESS_INJECT_MUTATION", "stale_token")  # the cut block still fails a fault
    assert measure(run_config(*shape)).failure.startswith("logits differ from eager's")
    monkeypatch.delenv("HARNESS_INJECT_MUTATION")
    other = measure(run_config(*shape, "seed=1"))  # another prompt: no loop kept for it, the whole block
    assert other.failure is None and other.metrics["block_steps"] == 48 and "block_cut" not in other.mode_tags


# warm-up and first block cover the 32 verified steps: plain eager's loop holds every reference its checks need
EAGER_LOOP = [*FAST, "device=cpu", "dtype=fp32", "bs=2", "warmup=2", "decode_tokens=32",
              "model.tie_word_embeddings=false"]


def test_plain_eagers_loop_is_its_own_reference_and_no_eager_step_is_taken_again(monkeypatch):
    from harness.measure import lockstep

    passes = []
    monkeypatch.setattr(lockstep, "_token_gaps", lambda *a, **kw: passes.append(1))  # the eager pass it replaces
    start = references.hits["computed"]
    first = measure(run_config(*EAGER_LOOP))
    assert first.failure is None and first.metrics["verified"] == 1.0 and first.metrics["tokens_match"] == 1.0
    assert passes == [] and references.hits["computed"] == start  # nothing decoded again: the loop was the pass
    assert first.metrics["decoded_tokens_checked"] == 2 * 34 and first.metrics["max_logit_diff"] == 0.0
    hits = references.hits["hits"]
    again = measure(run_config(*EAGER_LOOP))
    assert again.failure is None and references.hits["hits"] - hits == 2 and references.hits["computed"] == start


def test_a_plain_eager_run_that_varies_takes_its_free_run_as_the_second_pass_and_decodes_no_third():
    """Where eager varies (noise on its logits, as SDPA over a long cache does on the H200), plain eager's check needs
    a second eager decode over the loop's tokens to measure that variation: the free run, which followed them in the
    same cache, is that decode, kept as it is. The run passes within that variation, and no reference step is
    computed. Bug caught: a third decode of the same steps (10 s at bs=32, context 32768 on the H200)."""
    from harness import models

    cfg = run_config(*EAGER_LOOP)
    model = models.get_model(cfg.model, cfg.dtype.value, cfg.attn, torch.device("cpu"), cfg.seed).model
    noise = model.lm_head.register_forward_hook(lambda module, args, out: out + 0.5 * torch.rand_like(out))
    try:
        start = references.hits["computed"]
        result = measure(cfg)
    finally:
        noise.remove()
    assert result.failure is None and result.metrics["max_logit_diff"] > 0.1
    assert result.metrics["eager_self_max_logit_diff"] == result.metrics["max_logit_diff"]
    assert references.hits["computed"] == start


def _runner_up_at(decoded: torch.Tensor, logits: list[torch.Tensor], step: int, row: int) -> torch.Tensor:
    """The loop's tokens with one row's token at `step` swapped for that step's runner-up: the path a greedy decode
    takes where eager's own variation flips a near-tie (cuDNN's attention at bs 8 and 32 on the H200)."""
    flipped = decoded.clone()
    flipped[step, row] = logits[step][row].topk(2).indices[1]
    return flipped


def test_the_free_run_follows_the_loops_tokens_and_a_graph_that_feeds_itself_its_own():
    from harness.measure.timing import run_steps
    from harness.measure.traces import forced as _forced, free_run as _free_run

    _, model, prompt = tiny_fp32()
    with torch.inference_mode():
        stepper = EagerStepper(model, prompt, 64)
        kept = []
        loop = _runner_up_at(run_steps(stepper, 12, kept), kept, step=3, row=1)  # no greedy decode takes it
        stepper.rewind()
        run = _free_run(stepper, 16, loop)
        assert torch.equal(run.tokens[:12], loop) and not torch.equal(run.tokens[3:4], kept[3].argmax(-1)[None])
        assert torch.equal(run.tokens[12:], run.logits[12:].argmax(-1))  # past the loop's tokens: its own argmax
        stepper.rewind()
        forced = _forced(EagerStepper(model, prompt, 64, shared=stepper), run.tokens)  # eager fed the same history
        assert torch.equal(run.logits, forced.logits)
        stepper.rewind()
        stepper.feeds_itself = True  # a K-step graph feeds itself: nothing is written over its feeding
        assert not torch.equal(_free_run(stepper, 12, loop).tokens, loop)


def test_a_run_whose_greedy_path_would_leave_the_loops_is_checked_in_one_eager_pass(monkeypatch):
    """The lockstep's reference is eager fed the free run's tokens, and the token check's is eager fed the loop's:
    one pass where the two are the same tokens. A greedy free run left the loop's path wherever eager's variation
    flipped a near-tie in the loop, and paid a second pass; following the loop's tokens, it pays none, and the
    loop's odd token is still judged by the token check (which, before failing it, measures eager's variation
    over the loop's history in 1 + RECHECKS more passes)."""
    from harness.measure import context_check, lockstep, traces, verify
    from harness.measure.timing import run_steps

    class Run(EagerStepper):  # a mode's stepper: not plain eager, so its loop is not its own reference
        pass

    cfg, model, prompt = tiny_fp32()
    forced, gaps = [], []  # forced: eager's lockstep decodes (the free run, fed the loop's tokens, runs on the Run)
    real_forced, real_gaps = traces.forced, lockstep._token_gaps
    monkeypatch.setattr(traces, "forced", lambda stepper, *a, **kw: (type(stepper) is EagerStepper and forced.append(1))
                        or real_forced(stepper, *a, **kw))
    monkeypatch.setattr(lockstep, "_token_gaps", lambda *a, **kw: gaps.append(1) or real_gaps(*a, **kw))
    with torch.inference_mode():
        stepper = Run(model, prompt, cfg.cache_len)
        kept = []
        decoded = _runner_up_at(run_steps(stepper, context_check.VERIFY_TOKENS + 2, kept), kept, step=3, row=1)
        references.new_job()
        metrics, failure = verify.verify(model, prompt, stepper, cfg, True, decoded)
    assert forced == [] and metrics["max_logit_diff"] == 0.0  # the lockstep's reference: the token check's pass
    assert failure.startswith("the decoded token at step 3 ") and metrics["tokens_match"] == 0.0
    assert len(gaps) == 2 + lockstep.RECHECKS  # that pass, and more over the same history to measure eager's variation


def test_a_loop_that_feeds_other_than_its_argmax_fails_against_its_own_logits(monkeypatch):
    """The loop's logits are the reference only for the tokens fed after them: a loop that feeds the runner-up
    (a plausible off-by-one in feeding) fails. The check of every recorded token against its call's own logits sees
    it first, at the warm-up's first call (the checks of the fed tokens' gaps, called without it, are tested above)."""
    from harness.measure import timing

    def runner_up(stepper, logits):
        stepper.input_ids.copy_(logits.topk(2, dim=-1).indices[:, 1:])

    monkeypatch.setattr(timing, "feed_argmax", runner_up)
    result = measure(run_config(*EAGER_LOOP))
    assert result.failure.startswith("the token recorded for call 0 of the warm-up is not an argmax of the logits")
    assert result.metrics["recorded_tokens_argmax"] == 0.0 and result.metrics["verified"] == 0.0


def test_a_kept_reference_is_used_only_for_the_very_same_inputs():
    import torch

    calls = []

    def compute():
        calls.append(1)
        return torch.full((2, 3), float(len(calls)))

    shape = ("weights", "sdpa", "torch.float32", 2, 64, 1)
    prompt, first_ids, tokens = torch.zeros(2, 8, dtype=torch.long), torch.ones(2, 1, dtype=torch.long), torch.arange(6).view(3, 2)
    a = references.reference("forced", shape, [prompt, first_ids, tokens], 0, compute)
    assert torch.equal(references.reference("forced", shape, [prompt, first_ids, tokens.clone()], 0, compute), a)
    changed = tokens.clone()
    changed[2, 1] += 1  # one fed token differs: the reference decodes another history
    assert float(references.reference("forced", shape, [prompt, first_ids, changed], 0, compute)[0, 0]) == 2.0
    assert float(references.reference("forced", shape[:-1] + (2,), [prompt, first_ids, changed], 0, compute)[0, 0]) == 3.0
    assert len(calls) == 3


@pytest.mark.e2e
@pytest.mark.slow
def test_a_second_sweep_takes_its_compiled_kernels_from_the_cache_folder_the_first_wrote(workdir):
    """Two sweeps, two processes: the second's compile reads Inductor's FX graph cache under HARNESS_CACHE_DIR (with
    the saved steps off; with them on, it loads the step itself: tests/test_saved_steps.py)."""
    import json

    from tests.support import run_harness

    env = {"HARNESS_CACHE_DIR": str(workdir / "cache"), "HARNESS_SAVE_COMPILED_STEPS": "0"}
    for sweep in ("cold", "warm"):
        (workdir / sweep).mkdir()
        done = run_harness(*FAST, "mode=compiled-nograph", "device=cpu", "dtype=fp32", cwd=workdir / sweep, env=env)
        assert done.returncode == 0, done.stderr
    (cold,), (warm,) = ([json.loads(p.read_text())["metrics"] for p in (workdir / s).glob("outputs/**/result.json")]
                        for s in ("cold", "warm"))
    assert cold["compile_cache_hit"] == 0.0 and cold["compile_graphs_compiled"] >= 1
    assert warm["compile_cache_hit"] == 1.0 and warm["compile_graphs_from_cache"] >= 1
    assert warm["verified"] == 1.0 and any((workdir / "cache" / "compile" / "inductor").rglob("*"))
    # where each compile's time went: both traced the step; the warm one's backend read what the cold one built
    for m in (cold, warm):
        assert 0 < m["compile_trace_ms"] and 0 < m["compile_backend_ms"]
        assert m["compile_trace_ms"] + m["compile_backend_ms"] <= m["compile_dynamo_ms"] <= m["compile_ms"]
        assert m["compile_calls_ms"] == pytest.approx(m["compile_ms"] - m["compile_dynamo_ms"])
    assert warm["compile_backend_ms"] < cold["compile_backend_ms"]


def test_the_time_line_accounts_for_the_sweep_wall_phases_outside_them_and_between_jobs():
    """The summary's time line: phases summed, then what the jobs spent outside them (job wall less its phases) and
    what the sweep spent between jobs; where jobs ran side by side their walls exceed the sweep's, and no time between
    jobs is made up. A job with no end (killed unrecorded) counts in neither."""
    from harness.analysis.summary import time_breakdown
    from harness.record import JobRecord

    def job(started: str, ended: str, **phases_ms) -> JobRecord:
        return JobRecord(label="j", config={}, started=f"2026-12-04T13:{started}+00:00",
                         ended=ended and f"2026-12-04T13:{ended}+00:00", metrics=phases_ms)

    one_after_another = [job("00:00.000", "00:10.000", decode_wall_ms=6000.0, verify_ms=1500.0),
                         job("00:12.000", "00:20.500", prepare_ms=7000.0, release_ms=500.0),
                         job("00:21.000", "", decode_wall_ms=900.0)]  # no end: in the phase sums, not the walls
    assert one_after_another[0].wall_s == 10.0 and one_after_another[2].wall_s is None
    line = time_breakdown(one_after_another, wall_s=25.0)
    assert line == ("time: sweep wall 25.0 s; in jobs: build 0.0 s, prefill 0.0 s, prepare 7.0 s, warmup 0.0 s, "
                    "decode 6.9 s, verify 1.5 s, release 0.5 s, outside these phases 3.5 s; between jobs 6.5 s")
    side_by_side = [job("00:00.000", "00:10.000", decode_wall_ms=9000.0), job("00:01.000", "00:11.000")]
    assert time_breakdown(side_by_side, wall_s=12.0).endswith(
        "outside these phases 11.0 s; 20.0 s of job walls, side by side")
    assert time_breakdown(one_after_another).endswith("outside these phases 3.5 s")  # no sweep wall: no gap


def test_a_compile_phase_is_what_this_compile_added_and_a_timer_never_run_is_left_out():
    """Dynamo's timers are the process's running sums: a job logs what its own compile added. Bugs caught: the
    process's totals logged (a second job would show the first's compile), a timer this torch lacks logged as 0,
    the calls' share not what is left of compile_ms."""
    from harness.modes.compiled import phase_ms

    before = {"_compile.compile_inner": 9.0, "bytecode_tracing": 2.0, "OutputGraph.call_user_compiler": 6.0}
    after = {"_compile.compile_inner": 9.5, "bytecode_tracing": 2.25, "OutputGraph.call_user_compiler": 6.125,
             "PyCodeCache.load_by_key_path": 0.0625}  # first needed by this compile
    assert phase_ms(before, after, compile_ms=800.0) == {
        "compile_dynamo_ms": 500.0, "compile_trace_ms": 250.0, "compile_backend_ms": 125.0,
        "compile_code_load_ms": 62.5, "compile_calls_ms": 300.0}
    assert phase_ms(after, after, compile_ms=2.0)["compile_trace_ms"] == 0.0  # compiled earlier: nothing added
    assert phase_ms({}, {"bytecode_tracing": 1.0}, compile_ms=2000.0) == {"compile_trace_ms": 1000.0}
    # the ahead-of-time path (a step saved for later sweeps) runs its own timers, and torch.compile's backend timer
    # for a millisecond: a process that compiled both ways has all four, and each phase counts the larger move
    both = {**before, "fullgraph_capture": 4.0, "create_aot_dispatcher_function": 3.0}
    ahead = {**both, "fullgraph_capture": 4.75, "bytecode_tracing": 2.25, "create_aot_dispatcher_function": 3.5,
             "OutputGraph.call_user_compiler": 6.001}
    assert phase_ms(both, ahead, compile_ms=1000.0) == {
        "compile_dynamo_ms": 750.0, "compile_trace_ms": 250.0, "compile_backend_ms": 500.0, "compile_calls_ms": 250.0}


@pytest.mark.parametrize("staging_bytes, mask_elements, forward_tokens", [(4 << 30, 1 << 28, 1 << 16), (1, 1 << 12, 1)])
def test_a_prefill_of_the_valid_prefix_decodes_what_transformers_prefill_into_the_whole_cache_does(
        monkeypatch, staging_bytes, mask_elements, forward_tokens):
    """The fill that reads only the context (staged in a DynamicCache, rows in groups, the context in chunks: the
    second case forces one row a group and chunks of 128 tokens) against transformers' prefill into the static
    cache, each then decoding teacher-forced on the same tokens: the same first token, K/V, write position and
    greedy tokens, and logits equal within fp32 rounding."""
    import torch

    from harness import models
    from harness.measure.job import seeded_prompt
    from harness.modes import base
    from harness.modes.eager import EagerStepper

    monkeypatch.setattr(base, "PREFILL_STAGING_BYTES", staging_bytes)
    monkeypatch.setattr(base, "PREFILL_MASK_ELEMENTS", mask_elements)
    monkeypatch.setattr(base, "PREFILL_FORWARD_TOKENS", forward_tokens)
    cfg = run_config(*FAST, "device=cpu", "dtype=fp32", "model.tie_word_embeddings=false")
    model = models.get_model(cfg.model, "fp32", "sdpa", torch.device("cpu"), 0).model
    prompt = seeded_prompt(3, 300, model.config.vocab_size, 0, torch.device("cpu"))
    with torch.inference_mode():
        valid = EagerStepper(model, prompt, 512)
        whole = EagerStepper(model, prompt, 512, prefill=False)
        whole.first_ids = base.prefill_over_every_slot(model, whole.cache, prompt)
        whole.context_len = 300
        whole.rewind()
        assert torch.equal(valid.first_ids, whole.first_ids)
        for a, b in zip(valid.cache.layers, whole.cache.layers):
            assert int(a.cumulative_length) == int(b.cumulative_length) == 300
            assert torch.allclose(a.keys, b.keys, atol=1e-5) and torch.allclose(a.values, b.values, atol=1e-5)
        for _ in range(16):  # teacher-forced: both fed the valid-prefix run's greedy token
            x, y = valid.step(), whole.step()
            assert torch.equal(x.argmax(-1), y.argmax(-1)) and float((x - y).abs().max()) < 1e-4
            for stepper in (valid, whole):
                stepper.input_ids.copy_(x.argmax(-1, keepdim=True))


def _a_job_that_measured_eager_varying():
    """A job whose eager varies (noise on its logits, as SDPA over a long cache does on the H200) checked a clean run:
    the model, prompt, stepper, that run, and the job's metrics (eager's measured variation among them)."""
    import torch

    from harness.measure.context_check import VERIFY_TOKENS
    from harness.measure.lockstep import exact as _exact
    from harness.measure.traces import free_run as _free_run
    from harness.modes.eager import EagerStepper
    from tests.support import tiny_fp32

    _, model, prompt = tiny_fp32()
    with torch.inference_mode():
        stepper = EagerStepper(model, prompt, 64)
        stepper.rewind()
        clean = _free_run(stepper, VERIFY_TOKENS)
        noise = model.lm_head.register_forward_hook(lambda module, args, out: out + 0.5 * torch.rand_like(out))
        references.new_job()
        earlier = {}
        assert _exact(model, prompt, stepper, clean, earlier) is None and earlier["eager_self_max_logit_diff"] > 0.1
        noise.remove()
    return model, prompt, stepper, clean, earlier


def test_an_earlier_jobs_measured_variation_of_eager_serves_a_run_within_it_and_no_further():
    """Eager that varies (noise on its logits, as SDPA over a long cache does on the H200) in the job that computed
    the references: the next job's run within twice that variation passes on the kept passes alone, without an
    eager step; a run beyond it is judged again on eager decodes in its own cache (steady here), and fails."""
    import torch

    from harness.measure.lockstep import exact as _exact
    from harness.measure.traces import Trace

    model, prompt, stepper, clean, earlier = _a_job_that_measured_eager_varying()
    calls = []

    def count(module, args, out):
        calls.append(1)

    with torch.inference_mode():
        counter = model.lm_head.register_forward_hook(count)
        try:
            references.new_job()
            within = {}
            assert _exact(model, prompt, stepper, Trace(clean.logits + 0.01, clean.tokens), within) is None
            assert calls == [] and within["eager_self_max_logit_diff"] == earlier["eager_self_max_logit_diff"]
            references.new_job()
            beyond = {}
            why = _exact(model, prompt, stepper, Trace(clean.logits + 10.0, clean.tokens), beyond)
        finally:
            counter.remove()
    assert why.startswith("logits differ from eager's") and beyond["eager_self_max_logit_diff"] == 0.0 and calls


def test_a_variation_an_earlier_job_measured_serves_a_run_that_fed_other_tokens_within_it_and_no_further():
    """The graphed job after eager at a long context on the H200: eager varies, the run's tokens part from eager's at
    a near-tie, so no kept decode applies; eager's variation at this shape and prompt, measured by the earlier job,
    still does. A run within twice it passes on its one eager pass (no second, no rechecks); a run beyond is judged
    on variation measured again in its own cache (steady here), and fails."""
    import torch

    from harness.measure.context_check import VERIFY_TOKENS
    from harness.measure.lockstep import exact as _exact
    from harness.measure.traces import eager_in as _eager_in, forced as _forced

    model, prompt, stepper, clean, earlier = _a_job_that_measured_eager_varying()
    passes = []
    with torch.inference_mode():
        other_tokens = (clean.tokens + 1) % model.config.vocab_size  # another history: no kept decode is for it
        other = _forced(_eager_in(model, stepper), other_tokens)
        counter = model.lm_head.register_forward_hook(lambda module, args, out: passes.append(1))
        try:
            references.new_job()
            within = {}
            other.logits += 0.01
            assert _exact(model, prompt, stepper, other, within) is None
            assert len(passes) == VERIFY_TOKENS and within["eager_variation_reused"] == 1.0  # its one pass, no second
            assert within["eager_self_max_logit_diff"] == earlier["eager_self_max_logit_diff"]
            references.new_job()
            beyond = {}
            other.logits += 10.0
            why = _exact(model, prompt, stepper, other, beyond)
        finally:
            counter.remove()
    assert why.startswith("logits differ from eager's") and beyond["eager_self_max_logit_diff"] == 0.0
    assert "eager_variation_reused" not in beyond and len(passes) > 2 * VERIFY_TOKENS


def test_the_token_check_takes_the_variation_the_lockstep_measured_before_decoding_a_second_pass():
    """A loop token that ranks below eager's best by more than TIE_TOLERANCE but within twice the logit variation the
    lockstep measured passes as a tie without a second eager pass; with no variation measured, the second pass and
    the rechecks (steady here) find none, and the same token fails."""
    import torch

    from harness.measure.lockstep import RECHECKS, TIE_TOLERANCE, decoded_tokens as _decoded_tokens
    from harness.measure.traces import free_run as _free_run
    from harness.modes.eager import EagerStepper
    from tests.support import tiny_fp32

    _, model, prompt = tiny_fp32()
    passes = []
    with torch.inference_mode():
        stepper = EagerStepper(model, prompt, 64)
        stepper.rewind()
        run = _free_run(stepper, 24)
        top2 = run.logits[-1].topk(2, dim=-1)
        row = int((top2.values[:, 0] - top2.values[:, 1]).argmax())
        gap = float(top2.values[row, 0] - top2.values[row, 1])
        assert gap > TIE_TOLERANCE
        decoded = run.tokens.clone()
        decoded[-1, row] = top2.indices[row, 1]  # the last step's runner-up: the history before it is eager's own
        counter = model.lm_head.register_forward_hook(lambda module, args, out: passes.append(1))
        try:
            references.new_job()
            varied = {"eager_self_max_logit_diff": gap / 2 + 1e-3}
            assert _decoded_tokens(model, prompt, stepper, decoded, varied) is None
            assert len(passes) == 24 and varied["tie_tolerance"] == 2 * varied["eager_self_max_logit_diff"]
            references.new_job()
            references.forget()
            steady = {}
            why = _decoded_tokens(model, prompt, stepper, decoded, steady)
        finally:
            counter.remove()
    assert why.startswith("the decoded token at step 23 ") and len(passes) == 24 + (2 + RECHECKS) * 24


KEPT = [*FAST, "device=cpu", "dtype=fp32", "bs=2", "context_len=40", "cache_len=128", "model.tie_word_embeddings=false"]


def _fresh_context(cfg, attn: str) -> list[torch.Tensor]:
    """The context K/V [rows, kv_heads, context, head_dim] per layer that `attn`'s model prefills itself, in a cache
    no job kept (one kept stays kept)."""
    from harness import models
    from harness.measure.job import seeded_prompt
    from harness.modes import kept_context

    model = models.get_model(cfg.model, "fp32", attn, torch.device("cpu"), cfg.seed).model
    prompt = seeded_prompt(cfg.bs, cfg.context_len, model.config.vocab_size, cfg.seed, torch.device("cpu"))
    kept, kept_context._kept[:] = list(kept_context._kept), []
    try:
        with torch.inference_mode():
            stepper = EagerStepper(model, prompt, cfg.cache_len)
    finally:
        kept_context._kept[:] = kept
    return [t[:, :, :cfg.context_len].clone() for layer in stepper.cache.layers for t in (layer.keys, layer.values)]


def test_the_next_job_decodes_from_the_context_the_one_before_filled_where_its_own_prefill_would_fill_the_same():
    """A sweep's jobs of one batch and context (eager under sdpa, then sdpa-gqa and triton-decode, which prefill
    through SDPA too): the first prefills and keeps its cache; each next one decodes from that context, logs that it
    did and where its time to first token comes from, and passes its checks. The kept context is, bit for bit, what
    the next job's own prefill fills. Jobs whose prefill would differ prefill: another prompt (seed), another
    batch, and attn=eager, whose prefill runs eager attention. Bugs caught: a context served to a job of another
    prompt or batch (their checks run in the same cache and would pass), the key not naming the prefill's attention."""
    from harness.modes import kept_context

    first = measure(run_config(*KEPT, "attn=sdpa"))
    assert first.failure is None and first.metrics["prefill_reused"] == 0.0 and len(kept_context._kept) == 1
    kept = [t[:, :, :40].clone() for layer in kept_context._kept[0].cache.layers for t in (layer.keys, layer.values)]
    for attn in ("sdpa-gqa", "triton-decode"):
        assert all(torch.equal(a, b) for a, b in zip(kept, _fresh_context(run_config(*KEPT), attn)))
        follower = measure(run_config(*KEPT, f"attn={attn}"))
        assert follower.failure is None and follower.metrics["verified"] == 1.0
        assert follower.metrics["prefill_reused"] == 1.0
        assert follower.mode_tags["context_from"] == run_config(*KEPT, "attn=sdpa").label
        assert follower.metrics["prefill_tokens_per_s"] == first.metrics["prefill_tokens_per_s"]
    for other in ("attn=eager", "seed=1", "bs=3"):  # each after a job of the same batch, weights and prompt but one
        measure(run_config(*KEPT))
        result = measure(run_config(*KEPT, other))
        assert result.failure is None and result.metrics["prefill_reused"] == 0.0, other
        assert "context_from" not in result.mode_tags


def test_a_kept_context_serves_only_the_very_prompt_it_was_filled_from(tmp_path):
    """A checkpoint's weights are the same whatever the seed, and the seed still draws the prompt: a job of another
    seed, the same batch, context and capacity, finds a kept cache of its size, of its weights, and prefills. Bug
    caught: a kept context matched on the prompt's shape only (every check of the job runs in that same cache)."""
    from harness import models

    models._load(run_config(*KEPT).model, torch.float32, "sdpa", torch.device("cpu"), seed=0)[0].save_pretrained(
        tmp_path / "ckpt")
    checkpoint = [*KEPT, f"model.weights={tmp_path / 'ckpt'}"]
    assert measure(run_config(*checkpoint)).metrics["prefill_reused"] == 0.0
    assert measure(run_config(*checkpoint)).metrics["prefill_reused"] == 1.0
    other = measure(run_config(*checkpoint, "seed=1"))
    assert other.failure is None and other.metrics["prefill_reused"] == 0.0


def test_a_kept_context_that_changed_after_its_job_is_prefilled_again_and_a_failed_or_faulted_job_keeps_none(
        monkeypatch):
    """A kept context whose slots no longer sum as they did when its job kept it (a write between two jobs) is not
    decoded from: the next job prefills, and its context is then its own prefill's. A job that failed its checks,
    or carried a test's fault (which may act in its prefill), keeps nothing. Bugs caught: a kept context taken on
    its keys alone, a failed run's cache kept."""
    from harness.modes import kept_context

    assert measure(run_config(*KEPT)).failure is None
    with torch.inference_mode():  # one slot of the context, between two jobs
        kept_context._kept[0].cache.layers[1].values[1, 0, 7, 3] += 1.0
    again = measure(run_config(*KEPT))
    assert again.failure is None and again.metrics["prefill_reused"] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(
        [t[:, :, :40] for layer in kept_context._kept[0].cache.layers for t in (layer.keys, layer.values)],
        _fresh_context(run_config(*KEPT), "sdpa")))
    from harness.measure import lockstep

    with monkeypatch.context() as patch:  # a run that fails a check, with no fault in its stepper
        patch.setattr(lockstep, "exact", lambda *args: "a check's failure")
        failed = measure(run_config(*KEPT))
    assert failed.failure == "a check's failure" and failed.metrics["prefill_reused"] == 1.0 and not kept_context._kept
    assert measure(run_config(*KEPT)).metrics["prefill_reused"] == 0.0
    monkeypatch.setenv("HARNESS_INJECT_MUTATION", "kv_lost")
    faulted = measure(run_config(*KEPT))
    assert faulted.failure is not None and faulted.metrics["prefill_reused"] == 0.0 and not kept_context._kept
    monkeypatch.delenv("HARNESS_INJECT_MUTATION")
    assert measure(run_config(*KEPT)).metrics["prefill_reused"] == 0.0 and len(kept_context._kept) == 1


def test_a_job_asking_for_a_cache_of_another_size_frees_the_kept_one_first():
    """Only one context is kept, and never beside a cache of another size: a stepper of other rows or capacity
    frees it before allocating its own (on the H200 a kept bs=32 cache at context 32768 is 121 GB). Bug caught: a
    kept cache held until the next one is kept, beside the new job's."""
    from harness.modes import base, kept_context

    assert measure(run_config(*KEPT)).failure is None and kept_context.kept_bytes() > 0
    model = kept_context._kept[0].cache
    layer = model.layers[0]
    cache_bytes = 2 * 2 * layer.keys.numel() * 4  # 2 layers' K and V, fp32; beside them the prompt, digest, ...
    assert cache_bytes < kept_context.kept_bytes() < cache_bytes + (16 << 10)
    from harness import models

    tiny = models.get_model(run_config(*KEPT).model, "fp32", "sdpa", torch.device("cpu"), 0).model
    other = base.static_cache(tiny, 3, 64, torch.device("cpu"))
    assert other is not model and kept_context.kept_bytes() == 0 and not kept_context._kept
