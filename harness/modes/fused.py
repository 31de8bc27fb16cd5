"""mode=fused: the decode step as the harness's own fused kernels (harness/kernels/fused/decoder.py), captured in
one CUDA graph and replayed once per token (or per `graph_steps` tokens, each step's argmax fed to the next inside
the graph by a kernel of its own, harness/kernels/fused/greedy.py), each launch overlapping the last through
programmatic dependent launch.

The model is transformers' own, used for prefill and for the references; its weights are packed once, at prepare
(not timed). Decode reads and writes the same StaticCache as every other mode, so prefill, rewind and verification
are the shared ones. On a machine without a GPU the kernels run in Triton's interpreter, launched one by one (no
graph): the tests check them there, on tiny models, against eager and fp32.
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from typing import TYPE_CHECKING

import torch

from harness.clock import block_ms
from harness.modes import kept_context
from harness.modes.base import CaptureError, DecodeMode, kv_heads_and_dim
from harness.modes.graphed import SIDE_STREAM_WARMUP, GraphedStepper, capture, warm_up_on_side_stream

# a test's fault (harness/measure/mutations.py): each step's argmax kept as the run's token, not fed to the next step
NOT_FED = "fused_greedy_not_fed"

if TYPE_CHECKING:  # Triton's: imported by the jobs that run this mode
    from harness.kernels.fused.decoder import FusedDecoder
    from harness.kernels.fused.knobs import Knobs


class FusedStepper(GraphedStepper):
    """`options`: the run's fused.* switches as they apply on its device (as_run); `knobs`: the plan's numbers (the
    rules' where not given: a benchmark hands in a variant)."""

    def __init__(self, model, prompt, cache_len, options, fault: str | None = None, graph_steps: int = 1,
                 steps_after_prompt: int | None = None, knobs: Knobs | None = None):
        super().__init__(model, prompt, cache_len, graph_steps)
        from harness.kernels.fused.decoder import FusedDecoder  # Triton: imported by the jobs that run this mode
        from harness.kernels.fused.greedy import GreedyFeed
        from harness.kernels.fused.knobs import KNOBS

        start = time.perf_counter()
        # the longest prefix a timed step attends to: the context, the steps decoded after it, the new token
        longest = None if steps_after_prompt is None else prompt.shape[1] + steps_after_prompt + 1
        self.decoder = FusedDecoder(model, self.cache, self.static_ids, options, knobs or KNOBS, fault, longest)
        self.metrics.update(pack_ms=(time.perf_counter() - start) * 1e3,
                            kernel_launches_per_step=float(self.decoder.kernels_per_step()),
                            attention_chunks_per_kv_head=float(self.decoder.attn_acc.shape[2]))
        self.tags["fused"] = " ".join(f"{field.name}={'on' if getattr(options, field.name) else 'off'}"
                                      for field in dataclasses.fields(options))  # each technique, as it ran
        if options.tune:
            self._tune(prompt)
        if fault == NOT_FED and not self.feeds_itself:
            raise ValueError(f"HARNESS_INJECT_MUTATION={NOT_FED} acts in the greedy choice of a graph that feeds "
                             f"itself, and this run has graph_steps={graph_steps}; use graph_steps > 1")
        # the decoder's logits as tuned (a replanned decoder has buffers of its own)
        self.greedy = (GreedyFeed(self.decoder.logits, self.static_ids, options.pdl, feed=fault != NOT_FED,
                                  knobs=self.decoder.knobs) if self.feeds_itself else None)
        # (the MLP's part, one way since the MLP in one kernel was taken out, kept so that runs before compare alike)
        self.tags["fused_plan"] = "; ".join([*(f"{kind}: {product}" for kind, product in self.decoder.products().items()),
                                             self.decoder.attention_plan(), "mlp: gate/up, then down"])

    def _tune(self, prompt: torch.Tensor) -> None:
        """fused.tune: each kind of product's plan timed in the captured step (harness/kernels/fused/tune.py), from
        the context's position, or kept from an earlier job of the same shape on this kind of GPU; where no GPU times
        it, the rules' plan, and the tag says so."""
        if not prompt.is_cuda:
            self.tags["tune"] = "not applied: no GPU to time the step on (Triton's interpreter); the rules' plan"
            return
        from harness.kernels.fused.tune import tuned
        from harness.kernels.triton_runtime import compile_cache_dir

        knobs, capacity = self.decoder.knobs, self.cache.layers[0].max_cache_len
        position = max(0, min(prompt.shape[1], capacity - knobs.tune_replays - SIDE_STREAM_WARMUP - 1))
        gpu = torch.cuda.get_device_properties(prompt.device)
        gpu_id = "GPU-" + str(getattr(gpu, "uuid", "") or "?").removeprefix("GPU-")
        timer = StepTimer(position, knobs.tune_replays, knobs.tune_rounds)
        self.decoder, tuning = tuned(self.decoder, timer.ratio, on_hopper(prompt.device),
                                     compile_cache_dir() / "fused-plans", gpu.name, gpu_id)
        self.metrics.update(tune_ms=tuning.seconds * 1e3, tune_candidates=float(len(tuning.tried)),
                            tune_taken=float(len(tuning.taken)), tune_kept=float(tuning.kept_from is not None))
        self.tags["tune"] = tuning.summary()

    def forward(self) -> torch.Tensor:
        return self.decoder.step()

    def forward_by_layer(self, after_layer) -> torch.Tensor:
        """One step as forward() launches it, `after_layer(index, residual)` called after each layer: the layer
        gate's probe (harness/measure/layer_gate.py), off the timed path."""
        return self.decoder.step(after_layer=after_layer)

    def _feed(self, k: int, logits: torch.Tensor) -> None:
        """graph_steps > 1: each step's argmax fed to the next by a kernel of its own (harness/kernels/fused/
        greedy.py), launched with PDL like the step's, where graphed's are torch's argmax and two copies."""
        self.greedy(self.tokens[k])

    def prepare(self, prompt: torch.Tensor) -> FusedStepper:
        """Capture on a GPU (warm-up first: Triton compiles each kernel at its first launch); on a CPU, launch."""
        if prompt.is_cuda:
            return self.capture(prompt)
        self.tags["captured"] = "no: Triton's interpreter on a CPU launches the kernels one by one"
        return self

    def step(self) -> torch.Tensor:
        if self.graph is None:
            return self._k_steps() if self.feeds_itself else self.forward()[: self.bs]
        self.graph.replay()
        return self.logits


class StepTimer:
    """Two decoders' steps, each captured in a CUDA graph of its own, timed in alternating blocks of graph replays
    from one cache position (each block starts there again: the replays append K/V after it, as decode would)."""

    def __init__(self, position: int, replays: int, rounds: int):
        self.position, self.replays, self.rounds = position, replays, rounds
        self._graphs: dict[int, tuple] = {}

    def ratio(self, trial: FusedDecoder, best: FusedDecoder) -> float:
        self._graphs = {id(d): self._graphs.get(id(d)) or (d, self._capture(d)) for d in (trial, best)}
        ratios = []
        for index in range(self.rounds):
            order = (best, trial) if index % 2 == 0 else (trial, best)
            ms = {id(d): self._block(d) for d in order}
            ratios.append(ms[id(trial)] / ms[id(best)])
        return statistics.median(ratios)

    def _capture(self, decoder: FusedDecoder) -> torch.cuda.CUDAGraph:
        self._rewind(decoder)
        warm_up_on_side_stream(decoder.step)  # Triton compiles each kernel at its first launch
        graph = capture(decoder.step)[0]
        graph.replay()  # a graph's first launch uploads it: not a cost of the step
        return graph

    def _block(self, decoder: FusedDecoder) -> float:
        self._rewind(decoder)
        return block_ms(self._graphs[id(decoder)][1].replay, self.replays)

    def _rewind(self, decoder: FusedDecoder) -> None:
        kept_context.set_write_position(decoder.cache, self.position)


class FusedMode(DecodeMode):
    """Hand-fused Triton kernels (5 a layer), captured in a CUDA graph with programmatic dependent launch."""

    name = "fused"
    exact = False  # its own kernels and fp32 accumulation: judged against fp32, as the compiled modes
    # (where Triton cannot run, attn=triton-decode's setup refuses the job as the model is built: fused's attention)

    def prepare(self, model, prompt, cfg, knobs: Knobs | None = None):
        """The captured stepper; `knobs`: the plan's numbers where not the rules' (a benchmark's variant)."""
        if (problem := family_problem(model)) is not None:
            raise CaptureError(f"mode=fused cannot compute this model's decode step: {problem}")
        options = as_run(cfg.fused, prompt.is_cuda, on_hopper(prompt.device))  # so tagged (FusedStepper)
        # a test's fault inside the kernels (harness/measure/mutations.py sets it on the model while it prepares)
        fault = getattr(model, "harness_fused_fault", None)
        return FusedStepper(model, prompt, cfg.cache_len, options, fault, cfg.graph_steps, cfg.timed_slots(),
                            knobs).prepare(prompt)


def as_run(switches, cuda: bool, hopper: bool):
    """The run's fused.* switches (the schema's FusedConfig) as they run on a device: each whose hardware the device
    lacks (its field's `needs`: "hopper", an sm_90 GPU or newer, for PDL, the bulk L2 prefetches and TMA; "gpu" for
    the slices) turned off."""
    has = {"hopper": hopper, "gpu": cuda, None: True}
    return dataclasses.replace(switches, **{f.name: getattr(switches, f.name) and has[f.metadata.get("needs")]
                                            for f in dataclasses.fields(switches)})


def on_hopper(device: torch.device) -> bool:
    """Whether the device is an sm_90 GPU or newer, whose are PDL and the bulk L2 prefetch."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def family_problem(model: torch.nn.Module) -> str | None:
    """Why the fused kernels cannot compute this model's decode step, or None: no biases, a power-of-two head size,
    SiLU. (The model type and `fuse_projections` are the config's to refuse, before the model is built.)"""
    config = model.config
    head_dim = kv_heads_and_dim(config)[1]
    if head_dim & (head_dim - 1):
        return f"head_dim={head_dim} (the fused kernels need a power of two)"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act={config.hidden_act} (the fused MLP computes SiLU)"
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and module.bias is not None:
            return f"{name} has a bias (the fused products have none)"
    return None
