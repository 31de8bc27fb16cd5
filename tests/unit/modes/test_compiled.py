"""The compiled modes on CPU (harness/modes/compiled.py): Inductor's options, regions, graph replays, compile phases."""
from __future__ import annotations

import pytest
import torch

from harness import models
from harness.config.schema import config_hash
from harness.errors import ConfigError
from harness.config.validate import check_overrides
from harness.measure.job import JobError, measure, seeded_prompt
from tests.support import FAST, run_config


@pytest.mark.usefixtures("fresh_model_cache")
def test_compiled_nograph_without_a_compiler_says_so(monkeypatch):
    monkeypatch.setattr("harness.modes.compiled.shutil.which", lambda name: None)
    with pytest.raises(JobError, match="need a C\\+\\+ compiler for Inductor"):
        measure(run_config(*FAST, "mode=compiled-nograph", "device=cpu"))


@pytest.mark.usefixtures("fresh_model_cache")
def test_inductor_options_are_named_as_inductor_names_them_and_keep_old_hashes():
    cfg = run_config("mode=compiled", "+inductor.triton.unique_kernel_names=true", "+inductor.epilogue_fusion=false")
    assert cfg.inductor == {"triton.unique_kernel_names": True, "epilogue_fusion": False}
    assert cfg.label.endswith("compiled epilogue_fusion=False triton.unique_kernel_names=True")
    with pytest.raises(ConfigError, match=r"write \+inductor.epilogue_fusion=false$"):
        check_overrides(["inductor.epilogue_fusion=false"])
    stored = {"bs": 1, "mode": "compiled", "compile_mode": None}  # a config saved before the key existed
    assert config_hash({**stored, "inductor": {}}) == config_hash(stored)
    assert config_hash({**stored, "inductor": {"epilogue_fusion": False}}) != config_hash(stored)


@pytest.mark.usefixtures("fresh_model_cache")
@pytest.mark.slow
def test_inductor_options_are_in_force_while_the_step_compiles(monkeypatch):
    from torch._inductor import config as inductor_config
    from torch._inductor.graph import GraphLowering

    seen, lower = [], GraphLowering.__init__

    def spy(self, *args, **kwargs):  # Inductor lowers each captured graph into one of these
        seen.append((inductor_config.epilogue_fusion, inductor_config.max_autotune))
        lower(self, *args, **kwargs)

    monkeypatch.setattr(GraphLowering, "__init__", spy)
    with inductor_config.patch(force_disable_caches=True):  # lower again, not from an earlier run's cache
        result = measure(run_config(*FAST, "mode=compiled-nograph", "compile_mode=max-autotune-no-cudagraphs",
                                    "device=cpu", "dtype=fp32", "+inductor.epilogue_fusion=false"))
    assert result.failure is None and result.metrics["verified"] == 1.0
    assert seen and set(seen) == {(False, True)}  # the run's option over the mode's own (max_autotune kept)


@pytest.mark.usefixtures("fresh_model_cache")
def test_a_compiled_step_decodes_at_the_caches_own_position():
    """The fast loop's one compiled case (mode=compiled-nograph, Inductor on the CPU, a one-layer tiny model, fp32):
    the compiled step must decode at the position the cache holds, from the prefill and again after a rewind (two
    timed blocks), as eager does. A position bug in the compiled path (RoPE a position off, K/V written at another
    slot, a position fixed when the step was traced) moves the logits by far more than fp32's rounding, and the
    check against the fp32 reference fails the run."""
    result = measure(run_config(*FAST, "mode=compiled-nograph", "device=cpu", "dtype=fp32", "bs=2", "warmup=1",
                                "decode_tokens=4", "repeats=2", "stop=repeats", "model.num_hidden_layers=1",
                                "model.tie_word_embeddings=false"))
    m = result.metrics
    assert result.failure is None and m["verified"] == 1.0 and m["repeats"] == 2.0
    assert m["fp32_token_agreement"] == 1.0 and m["fp32_max_logit_err"] <= m["fp32_err_bound"]
    assert m["verified_steps"] == 32 and m["fp32_rows_checked"] == 2  # every verified step of both rows


@pytest.mark.usefixtures("fresh_model_cache")
@pytest.mark.slow
def test_compiled_nograph_runs_on_cpu_and_matches_eager():
    result = measure(run_config(*FAST, "mode=compiled-nograph", "device=cpu", "dtype=fp32"))
    assert result.failure is None
    m = result.metrics
    assert m["verified"] == 1.0 and m["compile_ms"] > 0
    assert m["fp32_max_logit_err"] <= m["fp32_err_bound"] and m["fp32_token_agreement"] == 1.0
    assert len(result.step_ms) == 8
    # its compile mode records no CUDA graphs: the check of what a step replays does not apply, and says so
    assert result.mode_tags["cuda_graphs"].startswith("not applied") and m["cuda_graph_replays_per_step"] == 0.0


@pytest.mark.usefixtures("fresh_model_cache")
def test_graph_replays_are_counted_inside_the_block_alone_and_replay_is_put_back(monkeypatch):
    from harness.modes.compiled import counted_graph_replays

    calls = []
    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", lambda graph: calls.append(graph))  # no GPU here to replay on
    # No graph can be made without a GPU (torch 2.15's CUDA build refuses object.__new__, a CPU build's base class
    # refuses its own): a stand-in replayed through the class, which is what graph.replay() looks up
    plain, graph = torch.cuda.CUDAGraph.replay, object()
    torch.cuda.CUDAGraph.replay(graph)
    with counted_graph_replays() as replays:
        torch.cuda.CUDAGraph.replay(graph)
        torch.cuda.CUDAGraph.replay(graph)
    torch.cuda.CUDAGraph.replay(graph)
    assert len(replays) == 2 and len(calls) == 4 and torch.cuda.CUDAGraph.replay is plain
    with pytest.raises(RuntimeError), counted_graph_replays():
        raise RuntimeError("a step that failed")
    assert torch.cuda.CUDAGraph.replay is plain


@pytest.mark.usefixtures("fresh_model_cache")
@pytest.mark.slow
def test_a_compiled_step_that_replays_no_cuda_graph_where_its_mode_records_them_says_so():
    """reduce-overhead records CUDA graphs; on a CPU cudagraph trees skip them, as they do on a GPU for a step they
    cannot graph: its warm-up step replays none, and the run is tagged as kernels launched one by one, not a graphed
    step (the bug this guards: a saved step loaded without its Inductor options, timed as a graphed one)."""
    from harness.modes.compiled import CompiledStepper

    cfg = run_config(*FAST, "device=cpu", "dtype=fp32")
    model = models.get_model(cfg.model, "fp32", "sdpa", torch.device("cpu"), 0).model
    prompt = seeded_prompt(2, 8, model.config.vocab_size, 0, torch.device("cpu"))
    with torch.inference_mode():
        stepper = CompiledStepper(model, prompt, 64, "reduce-overhead", {}).compile(prompt)
    assert stepper.mark_steps and stepper.metrics["cuda_graph_replays_per_step"] == 0.0
    assert stepper.tags["cuda_graphs"].startswith("NONE replayed: reduce-overhead records CUDA graphs, but this step")


@pytest.mark.usefixtures("fresh_model_cache")
@pytest.mark.slow
def test_compile_regions_traces_one_layer_for_all_and_decodes_as_the_whole_model():
    """Bugs this catches: the layers' region not in force while the step is traced (Dynamo traces all four layers,
    as a whole-model compile does); a whole-model step of the same process served to the regional one, as Dynamo
    does where the whole-model trace never read the switch (the second run then traces nothing); one layer's code
    reused with another's cache (the run then fails its checks)."""
    from torch._dynamo.utils import counters

    captured = {}
    torch._dynamo.reset()  # this process's earlier compiles of the tiny model would serve the first run
    for regions in ("false", "true"):  # in one process, the model built once, as an A/B's arms
        before = counters["stats"]["calls_captured"]
        result = measure(run_config(*FAST, "mode=compiled-nograph", "device=cpu", "dtype=fp32",
                                    "model.num_hidden_layers=4", f"compile_regions={regions}"))
        assert result.failure is None and result.metrics["verified"] == 1.0
        assert result.metrics["fp32_max_logit_err"] <= result.metrics["fp32_err_bound"]
        captured[regions] = counters["stats"]["calls_captured"] - before
    # a whole-model trace records each layer's calls; the regional one, one layer's and the model's own
    assert 0 < captured["true"] < captured["false"] / 2, captured
    from harness.modes.compiled import _Regions
    assert _Regions.on is False  # an eager decode after a regional step runs the layers' own forward


@pytest.mark.usefixtures("fresh_model_cache")
@pytest.mark.slow
def test_a_whole_model_step_is_traced_through_the_regions_switch_too():
    """On the H200 (torch 2.11) an A/B of whole against regional in one process served the whole-model step to the
    regional arm, which compiled nothing. Every compiled step routes its model's layer classes through the switch
    (so a trace reads it), and the regional step is compiled from a code object of its own (so Dynamo keeps the two
    steps' compiled code apart whatever it guards): a bug in either shows here."""
    from harness.modes.compiled import compiled_step

    class Layer(torch.nn.Module):
        def forward(self, x):
            return 2 * x

    class Decoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([Layer(), Layer()])

    class CausalLM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = Decoder()

    model = CausalLM()
    whole = compiled_step(model, "default", {}, regions=False)  # lazy: nothing compiles until a call
    assert getattr(Layer, "_harness_region", None) is not None
    # and the two steps are compiled from two code objects, whose compiled code Dynamo keeps apart
    regional = compiled_step(model, "default", {}, regions=True)
    codes = {step._torchdynamo_orig_callable.__code__ for step in (whole, regional)}
    assert len(codes) == 2
    assert torch.equal(Layer()(torch.ones(2)), torch.full((2,), 2.0))  # outside a compile, the layer's own forward
    with pytest.raises(TypeError, match="compile_regions=true needs a transformers decoder-only model"):
        compiled_step(torch.nn.Linear(2, 2), "default", {}, regions=True)


@pytest.mark.usefixtures("fresh_model_cache")
def test_compile_regions_applies_to_the_compiled_modes_only():
    assert run_config(*FAST, "mode=compiled", "compile_regions=true").label.endswith("compiled regional")
    graphed = run_config(*FAST, "mode=graphed", "compile_regions=true")  # a preset sweeping modes sets it for all
    assert graphed.compile_regions is False and graphed.label.endswith(" graphed")
    stored = {"bs": 1, "mode": "compiled", "compile_mode": None}  # a config saved before the key existed
    assert config_hash({**stored, "compile_regions": False}) == config_hash(stored)


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
