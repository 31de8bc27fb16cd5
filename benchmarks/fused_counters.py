"""What the hardware counters say about each kernel of a fused decode step: one replay of mode=fused's captured step
inside a profiler range, for Nsight Compute to profile kernel by kernel (serialised, caches flushed before each: no
PDL overlap, the L2 as cold as a weight read a step apart finds it); then its CSV as a table. On an H200:
    ncu --profile-from-start off --clock-control none --launch-skip 5 --launch-count 5 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
        --section WarpStateStats --csv --page details \
        python benchmarks/fused_counters.py model=qwen3-8b bs=1 context_len=32 > counters.csv   # layer 1's kernels
    python benchmarks/fused_counters.py --table counters.csv
(--launch-skip 5 skips layer 0, whose QKV product reads the embedding rows; the step's last kernel is lm_head.)
"""
from __future__ import annotations

import csv
import gzip
import io
import sys

# the columns of the table, as Nsight Compute names its metrics (the sections above)
COLUMNS = ("Duration", "DRAM Throughput", "L1/TEX Cache Throughput", "L2 Cache Throughput", "Achieved Occupancy",
           "Theoretical Occupancy", "Registers Per Thread", "Dynamic Shared Memory Per Block", "Grid Size",
           "Waves Per SM", "SM Frequency")


def replay_in_profiler_range(overrides: list[str]) -> None:
    import torch

    from common import fused_model_and_prompt, warm_fused_stepper  # this folder's (run as a script)

    cfg, model, prompt = fused_model_and_prompt(overrides)
    with torch.inference_mode():
        stepper = warm_fused_stepper(model, prompt, cfg, steps=5)
        torch.cuda.synchronize()
        print("plan:", stepper.tags["fused_plan"], "| kernels a step:", stepper.decoder.kernels_per_step(), flush=True)
        torch.cuda.cudart().cudaProfilerStart()
        stepper.step()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()


def table(path: str) -> str:
    """Nsight Compute's `--csv --page details` output (gzipped or not; other lines are the program's own) as a
    markdown table, a row a kernel in launch order."""
    text = (gzip.open if path.endswith(".gz") else open)(path, "rt").read()
    rows = csv.DictReader(io.StringIO("\n".join(line for line in text.splitlines() if line.startswith('"'))))
    kernels: dict[tuple[str, str], dict[str, str]] = {}
    for row in rows:
        kernels.setdefault((row["ID"], row["Kernel Name"]), {})[row["Metric Name"]] = (
            f"{row['Metric Value']} {row['Metric Unit']}".strip())
    lines = ["| kernel | " + " | ".join(COLUMNS) + " |", "|---|" + "---:|" * len(COLUMNS)]
    lines += [f"| {name} | " + " | ".join(metrics.get(c, "-") for c in COLUMNS) + " |"
              for (_, name), metrics in kernels.items()]
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--table"]:
        print(table(sys.argv[2]))
    else:
        replay_in_profiler_range(sys.argv[1:])
