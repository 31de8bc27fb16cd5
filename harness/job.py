"""One job, start to finish: build → prefill → capture → warm up → timed decode → check → result.

Pure measurement: no Hydra, no MLflow. The result is a plain dict; the caller stores it.
"""
from __future__ import annotations

import gc
import os
import signal
from pathlib import Path
from typing import Callable

import torch

from harness.attribution import nvtx_range, profile_steps
from harness.config import RunConfig
from harness.environment import environment_tags, resolve_device
from harness.models import LoadedModel, get_model
from harness.modes import MODES, DecodeMode, Stepper
from harness.modes.eager import EagerStepper
from harness.roofline import ceilings, floor, step_cost
from harness.timing import advance, decode_metrics, run_steps, stopwatch, timed_decode

VERIFY_TOKENS = 32  # graph modes must reproduce eager's first 32 greedy tokens
VERIFY_LOGIT_ROWS = 8  # rows whose logits are kept for the max |difference| (rows are independent)
INEXACT_LOGIT_TOLERANCE = 0.05  # an inexact mode's logits may differ by this fraction of their scale
MiB = 1024 * 1024
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


class JobError(RuntimeError):
    """A job that cannot run or whose output is wrong; the message is the recorded reason."""


def measure(cfg: RunConfig, on_phase: Callable[[str], None] = lambda phase: None,
            artifacts_dir: Path | None = None) -> dict:
    """Measure one job. `artifacts_dir` receives the profiler's files when cfg.profile is set."""
    device = resolve_device(cfg.device)
    mode = MODES[cfg.mode.value]()
    if device.type == "cuda" and not torch.cuda.is_available():
        raise JobError(f"device={device} asked for, but no CUDA GPU is visible; use device=auto or device=cpu")
    if (why := mode.check(device)) is not None:
        raise JobError(why)
    on_phase("build")
    with nvtx_range("build", device.type == "cuda"):
        loaded = get_model(cfg.model, cfg.dtype.value, cfg.attn.value, device, cfg.seed)
    memory = MemoryProbe(device)
    oom = None
    try:
        inject_fault(cfg)
        with torch.inference_mode():
            result = _decode(cfg, loaded, mode, device, on_phase, artifacts_dir)
    except torch.OutOfMemoryError as err:
        oom = str(err).splitlines()[0]  # keep the text only: the traceback would pin the job's tensors
    released = memory.after_release()
    if oom is not None:
        back = "yes" if released.get("mem_returned_to_baseline", 1.0) == 1.0 else "NO"
        raise JobError(f"out of memory at bs={cfg.bs} cache_len={cfg.cache_len} mode={cfg.mode.value} "
                       f"({oom}); memory back at the post-load baseline: {back}")
    result["metrics"].update(released)
    return result


def inject_fault(cfg: RunConfig) -> None:
    """Test hook: HARNESS_INJECT_FAULT=oom:LABEL or sigkill:LABEL hits the job whose label contains LABEL."""
    kind, _, where = os.environ.get("HARNESS_INJECT_FAULT", "").partition(":")
    if not kind or where not in cfg.label:
        return
    if kind == "oom":
        raise torch.OutOfMemoryError(f"injected by HARNESS_INJECT_FAULT for {cfg.label}")
    if kind == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)


def _decode(cfg: RunConfig, loaded: LoadedModel, mode: DecodeMode, device: torch.device, on_phase,
            artifacts_dir: Path | None) -> dict:
    model = loaded.model
    prompt = seeded_prompt(cfg.bs, cfg.prompt_len, model.config.vocab_size, cfg.seed, device)
    phases = {"build_ms": loaded.build_ms}
    cuda = device.type == "cuda"

    on_phase(mode.prepare_phase)
    with nvtx_range(mode.prepare_phase, cuda), stopwatch(device, phases, "prepare_ms"):
        stepper = mode.prepare(model, prompt, cfg)  # prefills first: the cache lives outside any graph pool
    phases["graph_mem_mb"] = stepper.graph_bytes / MiB
    on_phase("prefill")
    with nvtx_range("prefill", cuda), stopwatch(device, phases, "prefill_ms"):
        stepper.restart(prompt)
    on_phase("warmup")
    with nvtx_range("warmup", cuda), stopwatch(device, phases, "warmup_ms"):
        run_steps(stepper, cfg.warmup)
    on_phase("decode")
    with nvtx_range("decode", cuda):
        timing = timed_decode(stepper, cfg.decode_tokens, device)

    metrics = {**decode_metrics(timing, cfg.bs), **phases, **_peaks(device), **stepper.metrics}
    arch = _architecture(model)
    metrics.update(_speed_of_light(arch, cfg, mode, device, metrics["step_ms_median"], stepper.tags))
    if cfg.profile and cuda:
        on_phase("profile")
        metrics.update(profile_steps(stepper, cfg.profile_steps, artifacts_dir))
    result = {
        "metrics": metrics,
        "step_ms": timing.step_ms,
        "step_clock": timing.clock,
        "weights": loaded.weights,
        "weights_source": loaded.source,
        "model_reused": loaded.reused,
        "mode_tags": stepper.tags,
        "architecture": arch,
        "environment": environment_tags(device),
    }
    if mode.verify_against_eager:
        on_phase("verify")
        with stopwatch(device, metrics, "verify_ms"):
            check = verify_tokens(model, prompt, stepper, cfg.cache_len, min(VERIFY_TOKENS, cfg.decode_tokens),
                                  exact=mode.exact)
        metrics.update(tokens_match=float(check["match"]), token_agreement=check["token_agreement"],
                       max_logit_diff=check["max_logit_diff"])
        if not check["match"]:
            how = "" if mode.exact else " beyond rounding (eager's tokens fed)"
            result["failure"] = (f"{mode.name} tokens differ from eager's{how} at step {check['first_mismatch']} "
                                 f"(max |logit diff| {check['max_logit_diff']:.4g})")
    return result


def _speed_of_light(arch: dict, cfg: RunConfig, mode: DecodeMode, device: torch.device, median_ms: float,
                    tags: dict) -> dict[str, float]:
    """Bytes and FLOPs per step; on a GPU also the floor they set and how close the run came to it."""
    cost = step_cost(arch, cfg.bs, cfg.cache_len, DTYPE_BYTES[cfg.dtype.value],
                     compiled=mode.name.startswith("compiled"), attn=cfg.attn.value)
    if device.type != "cuda":
        return cost
    ceil = ceilings(device)
    tags.update(ceiling_copy_gb_per_s=f"{ceil['copy_bytes_per_s'] / 1e9:.0f}",
                ceiling_bf16_tflop_per_s=f"{ceil['bf16_flops_per_s'] / 1e12:.0f}", ceiling_key=ceil["key"])
    lowest = floor(cost, ceil)
    return {**cost, **lowest, "efficiency": lowest["floor_ms"] / median_ms}


def seeded_prompt(bs: int, prompt_len: int, vocab: int, seed: int, device: torch.device) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (bs, prompt_len), generator=generator).to(device)


def verify_tokens(model, prompt: torch.Tensor, stepper: Stepper, cache_len: int, n: int, exact: bool = True) -> dict:
    """Compare n greedy tokens of the mode's stepper with those of plain eager calls.

    Exact modes decode freely and must reproduce eager's tokens. Inexact ones (compiled: other
    kernels, other rounding) are fed eager's tokens at every step, so that one near-tie flip does not
    derail the rest; a differing token is tolerated only where eager's top-2 logits are closer than
    twice the largest logit difference measured (a tie that rounding can flip).
    """
    reference = EagerStepper(model, prompt, cache_len)
    eager_tokens, eager_logits, eager_gaps = _greedy(reference, n)
    del reference  # its cache
    stepper.restart(prompt)
    tokens, logits, _ = _greedy(stepper, n, forced=None if exact else eager_tokens)
    differs = tokens != eager_tokens
    steps = sorted(set(logits) & set(eager_logits))
    delta = float(torch.stack([(logits[i].float() - eager_logits[i].float()).abs().max() for i in steps]).max())
    scale = float(torch.stack([eager_logits[i].float().abs().max() for i in steps]).max())
    if exact:
        ok = not bool(differs.any())
    else:
        ok = bool((eager_gaps[differs] <= 2 * delta).all()) and delta <= INEXACT_LOGIT_TOLERANCE * scale
    mismatch = differs.any(dim=1).nonzero()
    return {
        "match": ok,
        "token_agreement": float((~differs).float().mean()),
        "first_mismatch": int(mismatch[0]) if mismatch.numel() else None,
        "max_logit_diff": delta,
    }


def _greedy(stepper: Stepper, n: int, forced: torch.Tensor | None = None):
    """n greedy tokens [n, bs]; the logits of the first rows at every step that exposes them; and the
    gap between the top-2 logits of every row [n, bs]. With `forced`, those tokens are fed instead."""
    tokens = torch.empty(n, stepper.bs, dtype=torch.long, device=stepper.input_ids.device)
    gaps = torch.empty(n, stepper.bs, device=stepper.input_ids.device)
    logits, done = {}, 0
    while done < n:
        out = advance(stepper)
        k = min(stepper.tokens_per_step, n - done)
        tokens[done:done + k].copy_(stepper.tokens[:k])
        if k == stepper.tokens_per_step:
            logits[done + k - 1] = out[:VERIFY_LOGIT_ROWS].clone()
            top2 = out.float().topk(2, dim=-1).values
            gaps[done + k - 1].copy_(top2[:, 0] - top2[:, 1])
        if forced is not None:
            stepper.input_ids.copy_(forced[done][:, None])
        done += k
    return tokens, logits, gaps


def _architecture(model: torch.nn.Module) -> dict:
    c = model.config
    keys = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "head_dim", "tie_word_embeddings")
    arch = {k: getattr(c, k, None) for k in keys}
    arch["parameters"] = sum(p.numel() for p in model.parameters())
    return arch


def _peaks(device: torch.device) -> dict[str, float]:
    if device.type != "cuda":
        return {}
    return {"peak_mem_allocated_mb": torch.cuda.max_memory_allocated(device) / MiB,
            "peak_mem_reserved_mb": torch.cuda.max_memory_reserved(device) / MiB}


class MemoryProbe:
    """The post-load baseline of allocated GPU memory, and whether a job gave it all back."""

    def __init__(self, device: torch.device):
        self.device = device
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            self.baseline = torch.cuda.memory_allocated(device)

    def after_release(self) -> dict[str, float]:
        if self.device.type != "cuda":
            return {}
        gc.collect()
        torch.cuda.synchronize(self.device)
        # cuBLAS keeps a workspace per stream in the caching allocator and never gives it back itself
        getattr(torch._C, "_cuda_clearCublasWorkspaces", lambda: None)()
        torch.cuda.empty_cache()
        leaked = torch.cuda.memory_allocated(self.device) - self.baseline
        return {"mem_baseline_mb": self.baseline / MiB, "mem_leaked_mb": leaked / MiB,
                "mem_returned_to_baseline": float(leaked <= 0)}
