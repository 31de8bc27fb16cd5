from __future__ import annotations

import json
import shutil
import time
import weakref

import torch

from harness.clock import device_index
from harness.modes import spec
from harness.modes.base import DecodeMode, Stepper, forward_step

# a compiled step's `compile_cache` tag where its process compiled nothing for it: Dynamo served code compiled before
COMPILED_EARLIER = "in process: compiled by an earlier job"
COMPILE_WARMUP = 3  # calls before timing: the first compiles, the next record CUDA graphs
# Where a compile's time goes, from Dynamo's own timers (torch._dynamo.utils.compile_times: seconds, summed over the
# process), each logged as what this job's compile added to it. A warm compile still traces and loads: only these
# tell whether its seconds are Dynamo's trace, the backend (AOTAutograd and Inductor, compiling or reading their
# caches), or the calls themselves (compile_calls_ms: running the steps, and recording their CUDA graphs).
COMPILE_PHASES = {"compile_dynamo_ms": "_compile.compile_inner",  # the whole of Dynamo's compile, backend included
                  "compile_trace_ms": "bytecode_tracing",  # Dynamo reading the step's Python into a graph
                  "compile_backend_ms": "OutputGraph.call_user_compiler",  # AOTAutograd and Inductor
                  "compile_code_load_ms": "PyCodeCache.load_by_key_path"}  # importing Inductor's generated modules
_compiled: "weakref.WeakKeyDictionary[torch.nn.Module, dict]" = weakref.WeakKeyDictionary()


def inductor_options(compile_mode: str, inductor: dict) -> dict:
    """The Inductor options a compile runs with: compile_mode's own, then the run's `inductor.*` over them."""
    from torch._inductor import list_mode_options  # imported with Inductor, by the compiled modes only

    return {**list_mode_options(compile_mode, dynamic=False), **inductor}


class _Regions:
    """Whether the step being traced compiles each decoder layer as one nested region. Every compiled call sets it
    (CompiledStepper.step) and resets it after, so that an eager decode between compiled steps runs the layers' own
    forward. What keeps a process's regional and whole-model steps apart is their code objects (_regional_step):
    a guard on this switch did not, on torch 2.11."""

    on = False


def _compile_layers_once(model: torch.nn.Module) -> None:
    """Route each decoder layer class of `model` through torch.compiler.nested_compile_region while _Regions.on,
    and through its own forward otherwise: Dynamo then traces one layer, Inductor compiles it once, and every other
    layer of the same structure calls that code (a layer of another structure gets its own). Outside a compile the
    region is a plain call. The class is patched for the process: eager and graphed runs go through one more call."""
    for layer_class in {type(layer) for layer in decoder_layers(model)}:
        if getattr(layer_class, "_harness_region", None) is not None:
            continue
        own, region = layer_class.forward, torch.compiler.nested_compile_region(layer_class.forward)

        def forward(self, *args, _own=own, _region=region, **kwargs):
            return (_region if _Regions.on else _own)(self, *args, **kwargs)

        layer_class._harness_region, layer_class.forward = region, forward


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """A transformers causal LM's decoder layers (`model.model.layers`); none for another module."""
    return list(getattr(getattr(model, "model", None), "layers", None) or [])


def _regional_step(model: torch.nn.Module, cache, input_ids: torch.Tensor) -> torch.Tensor:
    """forward_step under a code object of its own: Dynamo keeps compiled code per code object, so a regional step
    and a whole-model step of one model never serve each other. On the H200 (torch 2.11), a guard on the switch
    alone did not keep them apart: an A/B's regional arm compiled nothing and ran the whole-model arm's code."""
    return forward_step(model, cache, input_ids)


def compiled_step(model: torch.nn.Module, compile_mode: str, inductor: dict, regions: bool = False):
    """One compiled decode step per (model, compile mode, Inductor options, regions) for the whole process, so that
    later jobs of a sweep reuse Dynamo's compiled code (and Inductor's on-disk caches) instead of recompiling."""
    per_model = _compiled.setdefault(model, {})
    key = (compile_mode, json.dumps(inductor, sort_keys=True, default=str), regions)
    if regions and not decoder_layers(model):
        raise TypeError(f"{type(model).__name__} has no model.layers: compile_regions=true needs a transformers "
                        f"decoder-only model")
    # either way, so that every step of the model is traced through one layer forward: a whole-model step traced
    # before a regional one patched the class would be traced again after it (seen on torch 2.13 on a CPU)
    _compile_layers_once(model)
    if key not in per_model:
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        # dynamic=False: each batch size gets kernels specialised to it, as a captured graph does; torch.compile
        # takes a mode or options, not both, so options carry the mode's own
        how = dict(options=inductor_options(compile_mode, inductor)) if inductor else dict(mode=compile_mode)
        per_model[key] = torch.compile(_regional_step if regions else forward_step, dynamic=False, **how)
    return per_model[key]


class CompiledStepper(Stepper):
    def __init__(self, model, prompt, cache_len, compile_mode: str, inductor: dict, regions: bool = False):
        super().__init__(model, prompt, cache_len, prefill=False)
        torch._dynamo.mark_static_address(self.static_ids)  # no copy into the graph's input each step
        self.fn, self.regions = compiled_step(model, compile_mode, inductor, regions), regions
        # with CUDA graphs, a step's outputs may be overwritten by the next: each step is marked as new
        self.mark_steps = bool(inductor_options(compile_mode, inductor).get("triton.cudagraphs"))

    def compile(self, prompt: torch.Tensor) -> CompiledStepper:
        """Compile (or reuse this process's compiled step) and record its graphs; the caller prefills."""
        before = _graph_pool_bytes(prompt.device)
        lookups, phases_before = _fx_graph_cache_counts(), compile_phase_seconds()
        start = time.perf_counter()
        for _ in range(COMPILE_WARMUP):
            self.step()
        torch.cuda.synchronize() if prompt.is_cuda else None
        self.metrics["compile_ms"] = (time.perf_counter() - start) * 1e3
        self._record_cache_use(lookups)
        self.metrics.update(phase_ms(phases_before, compile_phase_seconds(), self.metrics["compile_ms"]))
        # the growth of the one pool that cudagraph trees share across the process's compiled graphs
        self.graph_bytes = _graph_pool_bytes(prompt.device) - before
        return self

    def _record_cache_use(self, before: dict[str, int]) -> None:
        """How the compile went: `compile_cache_hit` 1 where every graph Inductor lowered came from its FX graph
        cache (on disk: an earlier job or sweep compiled it), 0 where one was compiled cold; with no lookup at
        all, this process had compiled this very step already (Dynamo's code reused) and nothing is logged."""
        hits, misses = (_fx_graph_cache_counts()[k] - before[k] for k in ("fxgraph_cache_hit", "fxgraph_cache_miss"))
        self.metrics.update(compile_graphs_from_cache=float(hits), compile_graphs_compiled=float(misses))
        if hits + misses:
            self.metrics["compile_cache_hit"] = float(misses == 0)
        self.tags["compile_cache"] = (COMPILED_EARLIER if not hits + misses else
                                      f"{hits} of {hits + misses} graphs from the FX graph cache, {misses} compiled")

    def step(self):
        if self.mark_steps:  # the last step's outputs may be overwritten: we took its argmax already
            torch.compiler.cudagraph_mark_step_begin()
        _Regions.on = self.regions
        try:
            return self.fn(self.model, self.cache, self.static_ids)
        finally:
            _Regions.on = False


class CompiledMode(DecodeMode):
    """torch.compile(mode="reduce-overhead"): Inductor's fused kernels replayed from CUDA graphs,
    the route Hugging Face recommends for static-cache decode."""

    name = "compiled"
    needs_cuda = True
    prepare_phase = "compile"
    exact = False  # Inductor's fused kernels round differently from eager's: compared teacher-forced

    def check(self, device):
        return super().check(device) or _compiler_missing(device)

    def prepare(self, model, prompt, cfg):
        compile_mode = cfg.compile_mode or spec(self.name).compile_modes[0]
        stepper = CompiledStepper(model, prompt, cfg.cache_len, compile_mode, cfg.inductor,
                                  cfg.compile_regions).compile(prompt)
        stepper.tags["compile_mode"] = compile_mode
        return stepper


class CompiledNoGraphMode(CompiledMode):
    """Inductor's fused kernels launched one by one: fusion without CUDA graphs."""

    name = "compiled-nograph"
    needs_cuda = False


def _fx_graph_cache_counts() -> dict[str, int]:
    """Inductor's running counts of FX graph cache lookups in this process (hits, misses)."""
    from torch._dynamo.utils import counters

    return {k: int(counters["inductor"][k]) for k in ("fxgraph_cache_hit", "fxgraph_cache_miss")}


def compile_phase_seconds() -> dict[str, float]:
    """Dynamo's running totals, in seconds, of the timers COMPILE_PHASES names (those this process has run)."""
    from torch._dynamo.utils import compile_times

    timers, totals = compile_times(repr="csv", aggregate=True)
    return {timer: float(total) for timer, total in zip(timers, totals) if timer in COMPILE_PHASES.values()}


def phase_ms(before: dict[str, float], after: dict[str, float], compile_ms: float) -> dict[str, float]:
    """What a compile added to each phase's timer, in ms (0 where it did not need the phase: the step compiled
    earlier in this process, or a cache served it), and compile_calls_ms, the rest of compile_ms. A timer that
    this process has never run is left out, not logged as 0: this torch may not keep it at all."""
    phases = {metric: (after[timer] - before.get(timer, 0.0)) * 1e3
              for metric, timer in COMPILE_PHASES.items() if timer in after}
    if "compile_dynamo_ms" in phases:
        phases["compile_calls_ms"] = max(compile_ms - phases["compile_dynamo_ms"], 0.0)
    return phases


def _graph_pool_bytes(device: torch.device) -> int:
    """Bytes reserved by the private pool into which cudagraph trees record every compiled graph."""
    if device.type != "cuda":
        return 0
    from torch._inductor import cudagraph_trees  # the pool has no public handle

    index = device_index(device)
    manager = cudagraph_trees.get_manager(index, create_if_none_exists=False)
    if manager is None:  # no graph recorded yet (or compiled-nograph)
        return 0
    pool = tuple(manager.cuda_graphs_thread_pool)
    return sum(seg["total_size"] for seg in torch.cuda.memory_snapshot()
               if seg["device"] == index and tuple(seg["segment_pool_id"]) == pool)


def _compiler_missing(device: torch.device) -> str | None:
    """Inductor needs Triton on a GPU, a C++ compiler on a CPU."""
    if device.type == "cuda":
        try:
            import triton  # noqa: F401
        except ImportError:
            return "compiled modes need Triton for Inductor's GPU kernels, and it is not installed"
        return None
    if not any(shutil.which(cc) for cc in ("g++", "c++", "clang++")):
        return "compiled modes on CPU need a C++ compiler for Inductor (none of g++, c++, clang++ is on PATH)"
    return None
