"""harness/kernels/fused/plan.py, the TMA rules: which products stream through TMA, on how many stages."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from harness.cli.precheck import compose_single_run
from harness.config.fused import FusedConfig
from harness.kernels.fused import plan as fused_plan
from harness.kernels.fused.knobs import KNOBS
from harness.kernels.fused.plan import plan, plan_swiglu
from tests.support import REPO
from tests.unit.kernels.fused.support import LARGE, gpu_products, occupancy_on_sm90


def test_tma_keeps_two_tiles_in_flight_where_that_brings_a_product_into_one_wave_and_three_elsewhere(monkeypatch):
    """An 8B model's products as the rule plans them on a Hopper GPU (132 SMs) from two rows: three stages for
    Qwen3-8B's QKV and gate/up (384 programs: one wave at three an SM), two for its O and down (512) and for
    Llama-3.1-8B's gate/up (448), which two bring into one wave, and three again for lm_head (thousands: several waves
    either way); Qwen3-4B (2560 wide) streams too; fused.tma off, or a model narrower than tma_from_hidden (2048
    wide), streams nothing. At one row the copies-first rule takes the 8B model's products (QKV and O too)."""
    monkeypatch.setattr(fused_plan, "interpreted", lambda: False)  # the GPU's plan: 64 x 128 tiles, tensor cores
    options, wide = FusedConfig(), KNOBS.tma_from_hidden
    weight = lambda n, k: torch.empty(n, k, dtype=torch.bfloat16, device="meta")  # noqa: E731 (shapes only)

    def planned(n, k, kind, hidden=wide, options=options, rows=2):  # (at one row the copies-first rule reaches them)
        return plan(weight(n, k), options, KNOBS, kind in ("qkv", "o", "down"), rows, hidden, kind=kind)

    gate_up = plan_swiglu(weight(12288, 4096), weight(12288, 4096), options, KNOBS, 2, wide)
    assert (gate_up.grid, gate_up.stages) == ((384, 1), 3)
    assert [(p.grid[0] * p.grid[1], p.stages) for p in (planned(6144, 4096, "qkv"), planned(4096, 4096, "o"),
                                                       planned(4096, 12288, "down"), planned(151936, 4096, "lm_head"))
            ] == [(384, 3), (512, 2), (512, 2), (2374, 3)]
    llama_gate_up = plan_swiglu(weight(14336, 4096), weight(14336, 4096), options, KNOBS, 2, wide)
    assert (llama_gate_up.grid[0], llama_gate_up.stages) == (448, 2)
    assert planned(4096, 4096, "o", options=FusedConfig(tma=False)).descriptor is None
    assert planned(4096, 4096, "o", hidden=wide // 2).descriptor is None
    # Qwen3-4B (2560 wide: every product tiles) streams; Qwen3-1.7B and Llama-3.2-1B (2048) keep the registers for
    # QKV from two rows (at one, QKV copies its tiles first: copies_first.py's kernel, copies_first_small_kinds)
    qwen3_4b = plan_swiglu(weight(9728, 2560), weight(9728, 2560), options, KNOBS, 2, 2560)
    assert (qwen3_4b.grid, qwen3_4b.stages, qwen3_4b.descriptor is not None) == ((304, 1), 3, True)
    assert plan(weight(4096, 2048), options, KNOBS, True, 2, 2048, kind="qkv").descriptor is None
    assert planned(4096, 2048, "qkv", hidden=2048, rows=1).copies_first
    assert all(planned(*shape, rows=1).copies_first for shape in ((6144, 4096, "qkv"), (4096, 4096, "o")))
    fp32 = plan(torch.empty(4096, 4096, device="meta"), options, KNOBS, True, 1, wide, kind="o")
    assert fp32.descriptor is None  # an fp32 run's weights keep the registers on a GPU


@pytest.mark.slow
def test_the_large_products_stream_through_tma_at_every_batch_and_the_occupancy_table_compiles_their_tma_kernel(
        monkeypatch):
    """In a model 2048 wide the rules stream the large products (gate/up, down, lm_head) through TMA from two rows
    too, on tma_large_stages, as tiles (not sliced), and leave QKV and O as tiles through registers;
    benchmarks/fused_occupancy.py compiles a product whose tiles stream through TMA as `_matvec_tma`, whose stages'
    tiles are its shared memory, and which asks for no weight before its wait."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import fused_occupancy as occupancy

    llama = compose_single_run(["mode=fused", "model=llama-3.2-1b"]).model
    eight = gpu_products(monkeypatch, llama, rows=8)
    assert {kind: p.stages for kind, p in eight.items() if p.descriptor is not None} == dict.fromkeys(
        LARGE, KNOBS.tma_large_stages)
    assert not any(p.choice.slices or p.copies_first for p in eight.values())
    # Qwen3-0.6B's gate/up as `_matvec_tma`: TMA from its width, neither sliced nor copied first
    streamed = dataclasses.replace(KNOBS, tma_from_hidden=1024, copies_first_from_hidden=1 << 30, sliced_kinds=())
    qwen3 = compose_single_run(["mode=fused", "model=qwen3-0.6b"]).model
    planned = gpu_products(monkeypatch, qwen3, streamed)["gate_up"]
    assert planned.descriptor is not None and not planned.copies_first and planned.stages == 3
    gate_up = occupancy_on_sm90("qwen3-0.6b", "gate_up",
                                "tma_from_hidden=1024, copies_first_from_hidden=1 << 30, sliced_kinds=()")
    assert "TMA 3 stages" in gate_up["plan"] and gate_up["programs"] == 6144 // 64  # never split: 96 column blocks
    assert gate_up["shared"] >= 3 * 64 * 128 * 2  # three bf16 64 x 128 tiles in flight (`_matvec` holds none there)
    assert gate_up["wide_loads"] == 0 and gate_up["wave_mb"] == 0  # its copies come after the wait
    assert gate_up["per_sm"] == occupancy.programs_an_sm(gate_up["registers"], 8, gate_up["shared"])
