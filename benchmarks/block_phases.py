"""Where the persistent block's time goes (BLOCK_MAX_ROWS: each layer's QKV, attention and O as one kernel, a grid
barrier between them): each program records the GPU's global timer at its phases' edges (fused_decode.BLOCK_TIMES)
in the last layer's block of the captured step, over REPLAYS replays; this prints the median over programs and
replays of each phase, and how long each barrier held the grid after its last arrival. On a CUDA GPU:
    python benchmarks/block_phases.py model=llama-3.2-1b bs=1 context_len=32 cache_len=16384 [KEY=VALUE ...]
    python benchmarks/block_phases.py --set NAME VARIANT model=...   # a fused_prefetch.py set's variant's constants
Where each program waits only for what it reads (BLOCK_WAITS), "barrier 1 passed" is where an attention program is
past its wait (any other's is its arrival), "barrier 2 passed" where an O program is past its waits, and each wait's
row says how long after the last arrival before it the last program it held got past it.
The timer's ticks on an H100 or H200 are about 32 ns; a phase of under a microsecond reads as a few ticks.
"""
from __future__ import annotations

import statistics
import sys

import torch

from fused_kernels import fused_model_and_prompt, warm_fused_stepper
from fused_prefetch import SETS, set_constants
from harness.kernels import fused_decode

REPLAYS = 50
PLACES = ("start", "PDL wait", "QKV done", "barrier 1 passed", "attention done", "barrier 2 passed", "O done")


def phases(times: list[torch.Tensor], programs: int, attention_programs: int,
           waits: bool = False) -> list[tuple[str, float]]:
    """(what, µs): each phase's median over the programs that run it and the replays, and the grid's spans."""
    rows = []
    for i, (before, after) in enumerate(zip(PLACES, PLACES[1:])):
        who = slice(0, attention_programs) if after == "attention done" else slice(0, programs)
        spans = [float(d) / 1e3 for t in times for d in (t[who, i + 1] - t[who, i]).tolist()]
        rows.append((f"{before} -> {after} (median a program)", statistics.median(spans)))
    for name, arrive, passed in (("barrier 1", 2, 3), ("barrier 2", 4, 5)):
        if waits:  # the last arrival (any program's) to the last program past its wait
            held = [float(t[:programs, passed].max() - t[:programs, arrive].max()) / 1e3 for t in times]
            rows.append((f"{name}'s waits: the last arrival to the last program past them", statistics.median(held)))
        else:
            held = [float(t[:programs, passed].min() - t[:programs, arrive].max()) / 1e3 for t in times]
            rows.append((f"{name}: its last arrival to its first program past it", statistics.median(held)))
    rows.append(("first start to last end", statistics.median(
        float(t[:programs, 6].max() - t[:programs, 0].min()) / 1e3 for t in times)))
    rows.append(("first start to barrier 1's last arrival", statistics.median(
        float(t[:programs, 2].max() - t[:programs, 0].min()) / 1e3 for t in times)))
    return rows


def main(overrides: list[str], constants: dict) -> None:
    set_constants({"BLOCK_MAX_ROWS": 8, **constants})
    fused_decode.BLOCK_TIMES = torch.zeros(4 * fused_decode.SMS, 8, dtype=torch.int64, device="cuda")
    cfg, model, prompt = fused_model_and_prompt(overrides)
    times = []
    with torch.inference_mode():
        stepper = warm_fused_stepper(model, prompt, cfg)
        decoder = stepper.decoder
        assert decoder.block, "the persistent block does not apply to this run"
        layer = decoder.layers[0]
        programs = fused_decode.block_programs(layer.qkv, layer.o, decoder.rows, decoder.kv_heads)
        for _ in range(REPLAYS):  # a diagnostic: each replay's times read after it (no timing loop here)
            stepper.step()
            times.append(fused_decode.BLOCK_TIMES.cpu())
    print(f"{cfg.label}: the last layer's block, {programs} programs, {decoder.rows * decoder.kv_heads} of them "
          f"attending; median over {REPLAYS} replays")
    print("| span | µs |\n|---|---:|")
    for what, us in phases(times, programs, decoder.rows * decoder.kv_heads, fused_decode.BLOCK_WAITS):
        print(f"| {what} | {us:.2f} |")


if __name__ == "__main__":
    args, chosen = sys.argv[1:], {}
    if args[:1] == ["--set"]:
        chosen, args = SETS[args[1]][int(args[2])][2], args[3:]
    main(args, chosen)
