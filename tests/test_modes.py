"""The decode modes on CPU: bucket choice and padding, config checks, fused projections, Inductor."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from harness import models
from harness.config.schema import config_hash
from harness.errors import ConfigError
from harness.measure.job import JobError, measure, seeded_prompt
from harness.modes import MODES, ModeSpec
from harness.modes.base import pad_rows
from harness.modes.bucketed import pick_bucket
from harness.modes.eager import EagerMode, EagerStepper
from harness.analysis.report import table_markdown
from harness.measure.timing import advance, run_steps
from harness.config.validate import check_overrides
from tests.support import FAST, run_config

CPU = torch.device("cpu")


pytestmark = pytest.mark.usefixtures("fresh_model_cache")


@pytest.mark.parametrize("bs, bucket", [(1, 1), (2, 2), (3, 4), (5, 8), (8, 8), (9, 16), (32, 32), (33, None)])
def test_a_batch_replays_the_smallest_bucket_that_holds_it(bs, bucket):
    assert pick_bucket([1, 2, 4, 8, 16, 32], bs) == bucket


def test_padding_rows_are_added_and_real_rows_kept():
    prompt = torch.arange(6).reshape(3, 2)
    padded = pad_rows(prompt, 4)
    assert padded.shape == (4, 2) and torch.equal(padded[:3], prompt) and padded[3].sum() == 0
    assert pad_rows(prompt, 3) is prompt


def test_padded_rows_do_not_change_the_real_rows_tokens():
    cfg = run_config(*FAST, "device=cpu", "dtype=fp32", "bs=3")
    model = models.get_model(cfg.model, "fp32", "sdpa", CPU, 0).model
    prompt = seeded_prompt(3, 8, model.config.vocab_size, 0, CPU)
    with torch.inference_mode():
        exact, padded = EagerStepper(model, prompt, 64), EagerStepper(model, prompt, 64, rows=4)
        assert padded.input_ids.shape == (3, 1) and padded.static_ids.shape == (4, 1)
        for stepper in (exact, padded):
            run_steps(stepper, 6)
        assert torch.equal(exact.input_ids, padded.input_ids)


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


def test_cache_len_counts_whole_replays_of_graph_steps():
    # 16 prompt + warmup 10 (its 3 replays of 4 end at 28, and the timed blocks start at 26: timing.to_the_window)
    # + decode 130 -> 33 replays (132) = 158
    ok = ["graph_steps=4", "mode=graphed", "context_len=16", "warmup=10", "decode_tokens=130"]
    assert run_config(*ok, "cache_len=158").cache_len == 158
    with pytest.raises(ConfigError, match="in whole replays of graph_steps=4, = 158 tokens must fit; use cache_len>=158"):
        run_config(*ok, "cache_len=157")


def test_a_capture_warm_up_writes_after_a_kept_context_and_inside_the_cache(monkeypatch):
    """A capture's warm-up calls its step SIDE_STREAM_WARMUP times, each from one position: a graph of several steps
    at a cache sized for the context and two replays, prefilled as the context a job keeps for the next, writes
    neither past the cache (three replays from the context would) nor over the context. The capture's own CUDA parts
    are stood in for on the CPU (the side stream's calls made here, a graph that runs nothing)."""
    from harness.measure.context_check import context_digest
    from harness.modes import graphed

    cfg = run_config(*FAST, "device=cpu", "dtype=fp32", "bs=1", "mode=graphed", "graph_steps=8", "cache_len=24")
    assert cfg.cache_len == cfg.context_len + 2 * 8 < cfg.context_len + graphed.SIDE_STREAM_WARMUP * 8
    model = models.get_model(cfg.model, "fp32", cfg.attn, CPU, 0).model
    prompt = seeded_prompt(1, cfg.context_len, model.config.vocab_size, 0, CPU)
    stepper = graphed.GraphedStepper(model, prompt, cfg.cache_len, cfg.graph_steps, prefill=True)
    context, after_each_call = context_digest(stepper), []

    def warm_up_here(fn, steps=graphed.SIDE_STREAM_WARMUP):
        for _ in range(steps):
            fn()
            after_each_call.append([int(layer.cumulative_length) for layer in stepper.cache.layers])

    monkeypatch.setattr(graphed, "warm_up_on_side_stream", warm_up_here)
    monkeypatch.setattr(graphed, "capture", lambda fn, pool=None: (None, None, 0))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    stepper.capture(prompt)
    assert after_each_call == [[cfg.context_len + 8] * 2] * graphed.SIDE_STREAM_WARMUP
    assert torch.equal(context_digest(stepper), context)


def test_every_registered_mode_names_a_mode_class_that_is_there():
    """Bug caught: a registry line whose target names a module or class that is not there (a rename, a typo). The
    schema reads names only, so it would accept `mode=NAME`, and every job of that mode would fail as it started."""
    from harness.modes.base import DecodeMode

    classes = {name: spec.mode_class() for name, spec in MODES.items()}
    assert all(issubclass(c, DecodeMode) and c is not DecodeMode for c in classes.values())
    assert len(set(classes.values())) == len(MODES)  # no two names for one class
    for name in MODES:
        assert run_config(f"mode={name}").mode == name


@pytest.mark.parametrize("mode", ["graphed", "bucketed", "compiled"])
def test_graph_modes_without_cuda_fail_on_their_own(mode):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(JobError, match=f"mode={mode} needs a CUDA GPU"):
        measure(run_config(*FAST, f"mode={mode}"))


def test_compiled_nograph_without_a_compiler_says_so(monkeypatch):
    monkeypatch.setattr("harness.modes.compiled.shutil.which", lambda name: None)
    with pytest.raises(JobError, match="need a C\\+\\+ compiler for Inductor"):
        measure(run_config(*FAST, "mode=compiled-nograph", "device=cpu"))


@pytest.mark.parametrize("dtype, tol", [("fp32", 1e-4), ("bf16", 0.1)])
def test_fused_projections_match_the_unfused_model(dtype, tol):
    plain_cfg = run_config(*FAST, "device=cpu", f"dtype={dtype}").model
    fused_cfg = run_config(*FAST, "device=cpu", f"dtype={dtype}", "model.fuse_projections=true").model
    plain = models._load(plain_cfg, models.DTYPES[dtype], "sdpa", CPU, seed=0)[0]
    fused = models._load(fused_cfg, models.DTYPES[dtype], "sdpa", CPU, seed=0)[0]
    assert models.fuse_projections(fused) == 2 * 2  # q/k/v and gate/up in each of 2 layers
    attn = fused.model.layers[0].self_attn
    assert attn.fused_q_k_v.fused.out_features == attn.config.num_attention_heads * 16 + 2 * 2 * 16
    prompt = seeded_prompt(2, 8, plain.config.vocab_size, 0, CPU)
    with torch.inference_mode():
        a, b = plain(prompt).logits.float(), fused(prompt).logits.float()
    assert torch.allclose(a, b, atol=tol, rtol=0), (a - b).abs().max()
    n_linear = lambda m: sum(isinstance(x, torch.nn.Linear) for x in m.modules())  # noqa: E731
    assert n_linear(fused) == n_linear(plain) - 3 * 2  # 5 linears became 2, in each layer


def test_fused_model_decodes_the_same_tokens():
    cfg = run_config(*FAST, "device=cpu", "dtype=fp32", "bs=2", "model.tie_word_embeddings=false").model
    plain = models._load(cfg, torch.float32, "sdpa", CPU, seed=0)[0]
    fused = models._load(cfg, torch.float32, "sdpa", CPU, seed=0)[0]
    models.fuse_projections(fused)
    prompt = seeded_prompt(2, 8, plain.config.vocab_size, 0, CPU)
    with torch.inference_mode():
        a_stepper, b_stepper = EagerStepper(plain, prompt, 64), EagerStepper(fused, prompt, 64)
        tokens = []
        for _ in range(12):  # free-running: each feeds its own argmax
            a, b = advance(a_stepper), advance(b_stepper)
            assert torch.allclose(a, b, atol=1e-4, rtol=0), (a - b).abs().max()
            tokens.append((a_stepper.input_ids.clone(), b_stepper.input_ids.clone()))
    assert all(torch.equal(x, y) for x, y in tokens) and len({int(x[0]) for x, _ in tokens}) > 1


def test_inductor_options_are_named_as_inductor_names_them_and_keep_old_hashes():
    cfg = run_config("mode=compiled", "+inductor.triton.unique_kernel_names=true", "+inductor.epilogue_fusion=false")
    assert cfg.inductor == {"triton.unique_kernel_names": True, "epilogue_fusion": False}
    assert cfg.label.endswith("compiled epilogue_fusion=False triton.unique_kernel_names=True")
    with pytest.raises(ConfigError, match=r"write \+inductor.epilogue_fusion=false$"):
        check_overrides(["inductor.epilogue_fusion=false"])
    stored = {"bs": 1, "mode": "compiled", "compile_mode": None}  # a config saved before the key existed
    assert config_hash({**stored, "inductor": {}}) == config_hash(stored)
    assert config_hash({**stored, "inductor": {"epilogue_fusion": False}}) != config_hash(stored)


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


def test_a_run_whose_step_replayed_no_cuda_graph_is_marked_so_beside_its_median_in_the_tables():
    from rich.console import Console

    from harness.analysis.rows import row_of
    from harness.analysis.summary import table
    from harness.record import JobRecord

    def record(graphs: str) -> JobRecord:
        return JobRecord(label=f"tiny bs=1 compiled {graphs[:4]}", config={"bs": 1, "mode": "compiled"},
                         status="FINISHED", metrics={"step_ms_median": 2.5}, mode_tags={"cuda_graphs": graphs})

    lost, replayed = record("NONE replayed: reduce-overhead records CUDA graphs, ..."), record("2 replayed a step")
    lines = table_markdown([row_of(lost), row_of(replayed)]).splitlines()
    assert "2.500 ms no CUDA graph replayed" in next(line for line in lines if "NONE" in line)
    assert "no CUDA graph" not in next(line for line in lines if "2 re" in line)
    console = Console(width=250, record=True)
    console.print(table([lost, replayed]))
    printed = console.export_text().splitlines()
    assert "2.500 no CUDA graph replayed" in next(line for line in printed if "NONE" in line)
    assert "no CUDA graph" not in next(line for line in printed if "2 re" in line)


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


def test_compile_regions_applies_to_the_compiled_modes_only():
    assert run_config(*FAST, "mode=compiled", "compile_regions=true").label.endswith("compiled regional")
    graphed = run_config(*FAST, "mode=graphed", "compile_regions=true")  # a preset sweeping modes sets it for all
    assert graphed.compile_regions is False and graphed.label.endswith(" graphed")
    stored = {"bs": 1, "mode": "compiled", "compile_mode": None}  # a config saved before the key existed
    assert config_hash({**stored, "compile_regions": False}) == config_hash(stored)


class ThrowawayStepper(EagerStepper):
    """A mode that exists only in this test: eager steps, reported under another name."""


class ThrowawayMode(EagerMode):
    name = "throwaway"

    def prepare(self, model, prompt, cfg):
        stepper = ThrowawayStepper(model, prompt, cfg.cache_len)
        stepper.tags["throwaway"] = "yes"
        return stepper


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
