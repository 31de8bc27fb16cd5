"""Helpers the tests of mode=fused's kernels share: a tiny fp32 model's eager stepper beside a fused decoder over the
same prefilled context, teacher-forced decoding that compares their logits, and a GPU's plan of a model's products."""
from __future__ import annotations

import dataclasses
import json

import torch

from harness import models
from harness.config.fused import FusedConfig
from harness.kernels.fused.decoder import FusedDecoder, Layer
from harness.kernels.fused.knobs import KNOBS
from harness.kernels.fused.plan import Product, launch_point
from harness.measure.job import seeded_prompt
from harness.modes.base import Stepper
from tests.support import compiled_for_the_gpu
from tests.support import FAST, REPO, run_config


FUSED = (*FAST, "device=cpu", "dtype=fp32", "bs=2", "mode=fused")


LLAMA = ("model.model_type=llama", "+model.extra.rope_scaling={rope_type: llama3, factor: 8.0, high_freq_factor: 4.0, "
         "low_freq_factor: 1.0, original_max_position_embeddings: 16}")  # tiny's sizes, Llama-3's layer and RoPE


LARGE = {"gate_up", "down", "lm_head"}  # the large products' kinds (Knobs.tma_large_kinds)


# the attention's grid for the cache's capacity, not the longest prefix: no prefix short enough for one chunk
CAPACITY_GRID = dataclasses.replace(KNOBS, one_chunk_max_slots=0, one_chunk_max_slots_narrow=0)


def tiny_model_and_prompt(*overrides: str):
    """A fused run's config, its tiny fp32 model and a seeded prompt of two rows. The model's attention is sdpa's:
    its eager decode, each test's reference, runs no kernel in Triton's interpreter (a third of a step's time with
    triton-decode's); the fused decoder attends with its own kernels either way."""
    cfg = run_config(*FUSED, *overrides)
    model = models.get_model(cfg.model, "fp32", "sdpa", torch.device("cpu"), 0).model
    return cfg, model, seeded_prompt(2, cfg.context_len, model.config.vocab_size, 0, torch.device("cpu"))


def fused_and_eager(*overrides: str, options=FusedConfig(pdl=False), knobs=KNOBS):
    """A tiny fp32 model's eager stepper and a fused decoder (planned with `knobs`) over a second prefilled cache of
    the same prompt."""
    cfg, model, prompt = tiny_model_and_prompt(*overrides)
    eager, run = Stepper(model, prompt, cfg.cache_len), Stepper(model, prompt, cfg.cache_len)
    return eager, run, FusedDecoder(model, run.cache, run.static_ids, options, knobs)


def decode_like_eager(eager, run, decoder, steps: int, after_each=lambda: None) -> None:
    """Teacher-forced: both fed eager's choice; the fused logits are eager's at every step."""
    with torch.inference_mode():
        for step in range(steps):
            want, got = eager.step(), decoder.step()
            assert torch.allclose(got, want, atol=1e-4, rtol=0), f"step {step}: {(got - want).abs().max()}"
            after_each()
            token = want.argmax(-1, keepdim=True)
            eager.input_ids.copy_(token)
            run.input_ids.copy_(token)


def assert_same_cache(run, other, slots: int, length: int | None = None) -> None:
    """Every layer's K and V over the first `slots` slots as `other`'s (and both caches `length` long, where given)."""
    for ours, theirs in zip(run.cache.layers, other.cache.layers):
        if length is not None:
            assert int(ours.cumulative_length) == int(theirs.cumulative_length) == length
        assert torch.allclose(ours.keys[:, :, :slots], theirs.keys[:, :, :slots], atol=1e-5)
        assert torch.allclose(ours.values[:, :, :slots], theirs.values[:, :, :slots], atol=1e-5)


def _assert(condition) -> None:
    assert condition


def gpu_products(monkeypatch, model_cfg, knobs=KNOBS, rows: int = 1, options=None) -> dict[str, Product]:
    """`model_cfg`'s step products at `rows` batch rows as a GPU's rules plan them with `knobs` (fused.* at
    `options`, the defaults where None): benchmarks/fused_occupancy.py's step_products, which its table plans with."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import fused_occupancy

    return fused_occupancy.step_products(model_cfg, rows, options or FusedConfig(), knobs)


def o_launch(products: dict[str, Product]) -> int:
    """Where a step's O product lets the next kernel launch, as the decoder sets it beside its layer's gate/up."""
    layer = FusedDecoder._o_launch(Layer(None, products["qkv"], None, None, products["o"], None, products["gate_up"],
                                         products["down"]))
    return launch_point(layer.o)


class _Recording:
    """A kernel whose launches are recorded into `launched` (each its grid, warps and stages), then run."""

    def __init__(self, kernel, launched: list):
        self.kernel, self.launched = kernel, launched

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launched.append((grid, kwargs.get("num_warps"), kwargs.get("num_stages")))
            return self.kernel[grid](*args, **kwargs)
        return launch


def occupancy_on_sm90(model: str, kind: str, knobs: str) -> dict:
    """benchmarks/fused_occupancy.py's row for `model`'s `kind` product at bs=1, planned under KNOBS with `knobs`
    (dataclasses.replace's keyword arguments, as Python source), compiled for sm_90 in a process of its own (this
    one's kernels run in Triton's interpreter)."""
    script = ("import dataclasses, json, sys; sys.path.insert(0, 'benchmarks'); import fused_occupancy as o; "
              "from harness.cli.precheck import compose_single_run; from harness.config.fused import FusedConfig; "
              f"from harness.kernels.fused.knobs import KNOBS; k = dataclasses.replace(KNOBS, {knobs}); "
              f"cfg = compose_single_run(['mode=fused', 'model={model}']); "
              "p = o.step_products(cfg.model, 1, FusedConfig(), k); "
              f"print(json.dumps(o.occupancy_rows({{'{kind}': p['{kind}']}}, 1)))")
    (row,) = json.loads(compiled_for_the_gpu(script).splitlines()[-1])
    return row
