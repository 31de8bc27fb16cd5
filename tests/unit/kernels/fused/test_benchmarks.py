"""The fused kernels' benchmarks (benchmarks/fused_occupancy.py, fused_kernels.py, persistent_chain.py)."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from harness.cli.precheck import compose_single_run
from harness.config.fused import FusedConfig
from harness.kernels.fused.knobs import KNOBS
from tests.support import REPO, compiled_for_the_gpu
from tests.unit.kernels.fused.support import fused_and_eager, occupancy_on_sm90


@pytest.mark.slow
def test_the_occupancy_table_plans_as_a_gpu_does_and_counts_the_programs_an_sm_holds(monkeypatch):
    """benchmarks/fused_occupancy.py: a product's programs an SM are bounded by its registers (allocated a warp at a
    time, in units of 256), its threads and its shared memory; the plans are a GPU's (fused.slices for gate/up, down
    and lm_head at bs=1), not the interpreter's tiles; a kernel is compiled with its arguments specialised as the JIT
    specialises the step's launch; and a product compiled for sm_90 reports what ptxas gave it."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import fused_occupancy as occupancy

    assert occupancy.programs_an_sm(125, 8, 36864) == 2  # 16 registers' units a warp: 16 warps, two programs
    assert occupancy.programs_an_sm(100, 1, 0) == 19  # 3200 registers a warp take 3328: 19 warps, not 20
    assert occupancy.programs_an_sm(80, 4, 32) == 6 and occupancy.programs_an_sm(48, 4, 32) == 10
    assert occupancy.programs_an_sm(32, 4, 0) == 16  # threads: 2048 an SM
    assert occupancy.programs_an_sm(16, 1, 0) == 32  # programs: 32 an SM
    assert occupancy.programs_an_sm(32, 4, 100 * 1024) == 2  # shared memory: 228 KB an SM
    # compiled as the JIT specialises the step's launch: a batch of one compiled in, multiples of 16 marked so (without
    # them Triton cannot prove a 16-byte load aligned and reads the weights two bytes at a time)
    ones, aligned = occupancy.specialised({"rows": 1, "k_total": 2048, "n_total": 3, "prefetch_bytes": 0})
    assert ones == {"rows": 1} and aligned == [*occupancy.POINTERS, "k_total", "prefetch_bytes"]
    # Llama-3.2-1B as the rules plan it where neither the large products' TMA rule nor the copies-first rule reaches
    # it: sliced
    sliced = dataclasses.replace(KNOBS, tma_large_from_hidden=1 << 30, copies_first_from_hidden=1 << 30)
    cfg = compose_single_run(["mode=fused", "model=llama-3.2-1b"])
    products = occupancy.step_products(cfg.model, 1, FusedConfig(), sliced)
    assert occupancy.launch_sizes("gate_up", products["gate_up"], 1) == dict(
        x_row=2048, rows=1, k_total=2048, n_total=16384, out_cols=8192, k_per_split=2048, k_tiles=1, prefetch_bytes=0,
        prefetch_ahead=0)
    assert [p.choice.slices for p in products.values()] == [False, False, True, True, True]
    assert products["gate_up"].grid == (2048, 1) and products["qkv"].grid == (48, 8)
    down = occupancy_on_sm90("llama-3.2-1b", "down", "tma_large_from_hidden=1 << 30, copies_first_from_hidden=1 << 30")
    assert down["kind"] == "down" and down["programs"] == 2048 and 32 <= down["registers"] <= 255
    assert down["wide_loads"] == 8  # a thread's 64 weights (4 rows x 2048 / 128 threads) as 16-byte loads, all before
    # the wait (unspecialised, the same kernel compiled none: a weight at a time)
    assert down["per_sm"] == occupancy.programs_an_sm(down["registers"], 4, down["shared"])
    assert down["waves"] == pytest.approx(2048 / (down["per_sm"] * 132))


@pytest.mark.slow
def test_the_persistent_chain_computes_the_fp32_chain_each_way_and_loads_its_weights_where_it_says(monkeypatch):
    """benchmarks/persistent_chain.py: the chain of products as a launch a product and as one persistent kernel
    (here one program, whose barriers each wait for its own arrivals) computes the chain in fp32; each product counts
    one arrival a program; a barrier that counts a program that never arrives gives up and says so; and compiled for
    sm_90, the persistent kernel loads the next product's weights between its arrival and its wait only where it
    says so (the rotated loop's order in the PTX)."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import persistent_chain as chained

    chain = chained.Chain.random(2, 32, 64, "cpu")
    reference = chain.fp32()
    runs = {"launches": lambda: chained.run_launches(chain, 2, False),
            "persistent, loaded early": lambda: chained.run_persistent(chain, 1, True, spin_limit=4),
            "persistent, loaded late": lambda: chained.run_persistent(chain, 1, False, spin_limit=4)}
    for name, run in runs.items():
        chain.down.zero_()
        run()
        torch.testing.assert_close(chain.down, reference, rtol=1e-4, atol=1e-5, msg=name)
        assert int(chain.failed) == 0, name  # no barrier waited for an arrival that never came
    assert int(chain.count) == 2 * 4  # two layers of four products, one program
    chained.run_persistent(chain, 1, True, spin_limit=4, counted=2)
    assert int(chain.failed) == 1
    script = ("import sys, json; sys.path.insert(0, 'benchmarks'); import persistent_chain as c; "
              "print(json.dumps([c.persistent_ptx(True), c.persistent_ptx(False)]))")
    printed = compiled_for_the_gpu(script)
    for early, ptx in zip((True, False), json.loads(printed.splitlines()[-1])):
        release = ptx.index("gpu.release.add")  # a product's arrival, then (the loop rotated) the next one's wait
        between = ptx[release:ptx.index("gpu.acquire", release)]
        assert ("ld.global.v4" in between) == early  # the next product's rows, 16 bytes a load (x's are .cg, later)


@pytest.mark.parametrize("fold_attention", [True, False], ids=["folded", "three-launches"])
def test_the_per_kernel_profile_names_each_launch_of_the_step_as_the_decoder_plans_it(fold_attention, monkeypatch):
    """benchmarks/fused_kernels.py names a step's kernels by their place in it: a layer's names must be as many as the
    decoder launches a layer, the attention folded or not, and each product is charged its own weights' bytes."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import fused_kernels

    _, _, decoder = fused_and_eager("model.num_hidden_layers=3", options=FusedConfig(pdl=False,
                                                                                     fold_attention=fold_attention))
    names = fused_kernels.layer_kernels(decoder)
    assert len(names) * len(decoder.layers) + 1 == decoder.kernels_per_step() and len(set(names)) == len(names)
    layer, fp32 = decoder.layers[0], 4
    assert fused_kernels.weight_bytes(decoder)[fused_kernels.O] == 3 * fp32 * layer.o.n * layer.o.k


def test_the_per_kernel_profile_charges_each_kernel_only_the_time_it_adds_to_the_steps_path(monkeypatch):
    """Under PDL a kernel starts inside the one before: benchmarks/fused_kernels.py charges each kernel how far its end
    lies past the latest end before it (an idle gap before it included), so that the shares sum to the span, and says
    how long it ran beside the kernel before. Charging whole durations would count the overlap twice; charging from
    its own start would lose the gap."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import fused_kernels

    # a kernel alone; one starting 2 µs inside it; one ending inside that one; one after a 1 µs gap
    ranges = [(0.0, 10.0), (8.0, 15.0), (12.0, 14.0), (16.0, 20.0)]
    shares, head_starts = fused_kernels.path_times(ranges)
    assert shares == [10.0, 5.0, 0.0, 5.0] and sum(shares) == ranges[-1][1] - ranges[0][0]
    assert head_starts == [0.0, 2.0, 2.0, 0.0]
    assert fused_kernels.path_times([(0.0, 4.0), (4.0, 9.0)]) == ([4.0, 5.0], [0.0, 0.0])  # no PDL: whole durations
