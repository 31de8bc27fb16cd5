"""The fidelity table of docs/checks.md from sweep folders: per run, the KL from fp32 (nats a token) of the run
and of native eager, their delta with its 95% interval, the worst step's delta, the NLL delta, the verdict, and the
layer gate's margin (harness/measure/layer_gate.py: the worst stage's deviation from fp32 over its bound, and that
stage; at most 1 passes), or why it did not apply.
    python benchmarks/fidelity_table.py outputs/sweeps/DAY/TIME ..."""
from __future__ import annotations

import json
import sys
from pathlib import Path


def main(folders: list[str]) -> None:
    print("| run | status | KL run | KL eager | KL delta [95%] | worst step delta (tolerance) | NLL delta [95%] | fidelity "
          "| layer gate (worst / bound) |")
    print("|---|---|---:|---:|---|---|---|---|---|")
    for folder in folders:
        for path in sorted(Path(folder).glob("*/result.json"), key=lambda p: int(p.parent.name)):
            record = json.loads(path.read_text())
            m, tags = record["metrics"], record.get("mode_tags", {})
            if "kl_nats" not in m:
                print(f"| {record['label']} | {record['status']} | (exact: checked against eager, not fp32) |||||| "
                      f"{layer_gate(m, tags)} |")
                continue
            print(f"| {record['label']} | {record['status']} | {m['kl_nats']:.3g} | {m['eager_kl_nats']:.3g} | "
                  f"{m['kl_delta_nats']:.2g} [{m['kl_delta_low_nats']:.2g}, {m['kl_delta_high_nats']:.2g}] | "
                  f"{m['kl_delta_max_step_nats']:.2g} ({m['kl_step_tolerance_nats']:.2g}) | "
                  f"{m['nll_delta_nats']:.2g} [{m['nll_delta_low_nats']:.2g}, {m['nll_delta_high_nats']:.2g}] | "
                  f"{tags.get('fidelity', '-')} | {layer_gate(m, tags)} |")


def layer_gate(m: dict, tags: dict) -> str:
    """The layer gate's worst ratio and its stage (a layer's index; the layer count: the logits), or its tag where it
    logged none (not applied, and why; a run from before the gate: -)."""
    if "layer_gate_ratio" not in m:
        return tags.get("layer_gate", "-")
    stages = int(m["layer_gate_stages"])
    worst = int(m["layer_gate_worst_layer"])
    return f"{m['layer_gate_ratio']:.2g} ({'logits' if worst == stages - 1 else f'layer {worst}'})"


if __name__ == "__main__":
    main(sys.argv[1:])
