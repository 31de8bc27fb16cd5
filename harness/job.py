"""One job, start to finish: build → prefill → capture → warm up → timed decode → check → result.

Pure measurement: no Hydra, no MLflow. The result is a plain dict; the caller stores it.
"""
from __future__ import annotations

import gc
from typing import Callable

import torch
from harness.config import RunConfig
from harness.environment import environment_tags, resolve_device
from harness.models import LoadedModel, get_model
from harness.modes import MODES, DecodeMode, Stepper
from harness.modes.eager import EagerStepper
from harness.timing import advance, decode_metrics, run_steps, stopwatch, timed_decode

VERIFY_TOKENS = 32  # graph modes must reproduce eager's first 32 greedy tokens
VERIFY_LOGIT_ROWS = 8  # rows whose logits are kept for the max |difference| (rows are independent)
MiB = 1024 * 1024


class JobError(RuntimeError):
    """A job that cannot run or whose output is wrong; the message is the recorded reason."""


def measure(cfg: RunConfig, on_phase: Callable[[str], None] = lambda phase: None) -> dict:
    device = resolve_device(cfg.device)
    mode = MODES[cfg.mode.value]()
    if device.type == "cuda" and not torch.cuda.is_available():
        raise JobError(f"device={device} asked for, but no CUDA GPU is visible; use device=auto or device=cpu")
    if (why := mode.check(device)) is not None:
        raise JobError(why)
    on_phase("build")
    loaded = get_model(cfg.model, cfg.dtype.value, cfg.attn.value, device, cfg.seed)
    memory = MemoryProbe(device)
    with torch.inference_mode():
        result = _decode(cfg, loaded, mode, device, on_phase)
    result["metrics"].update(memory.after_release())
    return result


def _decode(cfg: RunConfig, loaded: LoadedModel, mode: DecodeMode, device: torch.device, on_phase) -> dict:
    model = loaded.model
    prompt = seeded_prompt(cfg.bs, cfg.prompt_len, model.config.vocab_size, cfg.seed, device)
    phases = {"build_ms": loaded.build_ms}

    on_phase(mode.prepare_phase)
    with stopwatch(device, phases, "capture_ms"):
        stepper = mode.prepare(model, prompt, cfg)  # prefills first: the cache lives outside any graph pool
    phases["graph_mem_mb"] = stepper.graph_bytes / MiB
    on_phase("prefill")
    with stopwatch(device, phases, "prefill_ms"):
        stepper.restart(prompt)
    on_phase("warmup")
    with stopwatch(device, phases, "warmup_ms"):
        run_steps(stepper, cfg.warmup)
    on_phase("decode")
    timing = timed_decode(stepper, cfg.decode_tokens, device)

    metrics = {**decode_metrics(timing, cfg.bs), **phases, **_peaks(device), **stepper.metrics}
    result = {
        "metrics": metrics,
        "step_ms": timing.step_ms,
        "step_clock": timing.clock,
        "weights": loaded.weights,
        "weights_source": loaded.source,
        "model_reused": loaded.reused,
        "mode_tags": stepper.tags,
        "architecture": _architecture(model),
        "environment": environment_tags(device),
    }
    if mode.verify_against_eager:
        on_phase("verify")
        with stopwatch(device, metrics, "verify_ms"):
            check = verify_tokens(model, prompt, stepper, cfg.cache_len, min(VERIFY_TOKENS, cfg.decode_tokens))
        metrics.update(tokens_match=float(check["match"]), max_logit_diff=check["max_logit_diff"])
        if not check["match"]:
            result["failure"] = (f"{mode.name} tokens differ from eager's at step {check['first_mismatch']} "
                                 f"(max |logit diff| {check['max_logit_diff']:.4g})")
    return result


def seeded_prompt(bs: int, prompt_len: int, vocab: int, seed: int, device: torch.device) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (bs, prompt_len), generator=generator).to(device)


def verify_tokens(model, prompt: torch.Tensor, stepper: Stepper, cache_len: int, n: int) -> dict:
    """Decode n greedy tokens with the mode's stepper, then with plain eager calls, and compare."""
    stepper.restart(prompt)
    tokens, logits = _greedy(stepper, n)
    reference = EagerStepper(model, prompt, cache_len)
    eager_tokens, eager_logits = _greedy(reference, n)
    del reference  # its cache
    mismatch = (tokens != eager_tokens).any(dim=1).nonzero()
    diffs = [(logits[i].float() - eager_logits[i].float()).abs().max() for i in logits]
    return {
        "match": mismatch.numel() == 0,
        "first_mismatch": int(mismatch[0]) if mismatch.numel() else None,
        "max_logit_diff": float(torch.stack(diffs).max()),
    }


def _greedy(stepper: Stepper, n: int) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """n greedy tokens [n, bs], and the logits of the first rows at every step that exposes them."""
    tokens = torch.empty(n, stepper.bs, dtype=torch.long, device=stepper.input_ids.device)
    logits, done = {}, 0
    while done < n:
        out = advance(stepper)
        k = min(stepper.tokens_per_step, n - done)
        tokens[done:done + k].copy_(stepper.tokens[:k])
        if k == stepper.tokens_per_step:
            logits[done + k - 1] = out[:VERIFY_LOGIT_ROWS].clone()
        done += k
    return tokens, logits


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
