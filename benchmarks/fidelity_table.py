"""The fidelity table of docs/checks.md from sweep folders: per run, the KL from fp32 (nats a token) of the run
and of native eager, their delta with its 95% interval, the worst step's delta, the NLL delta, and the verdict.
    python benchmarks/fidelity_table.py outputs/sweeps/DAY/TIME ..."""
from __future__ import annotations

import json
import sys
from pathlib import Path


def main(folders: list[str]) -> None:
    print("| run | status | KL run | KL eager | KL delta [95%] | worst step delta (tolerance) | NLL delta [95%] | fidelity |")
    print("|---|---|---:|---:|---|---|---|---|")
    for folder in folders:
        for path in sorted(Path(folder).glob("*/result.json"), key=lambda p: int(p.parent.name)):
            record = json.loads(path.read_text())
            m, tags = record["metrics"], record.get("mode_tags", {})
            if "kl_nats" not in m:
                print(f"| {record['label']} | {record['status']} | (exact: checked against eager, not fp32) |||||")
                continue
            print(f"| {record['label']} | {record['status']} | {m['kl_nats']:.3g} | {m['eager_kl_nats']:.3g} | "
                  f"{m['kl_delta_nats']:.2g} [{m['kl_delta_low_nats']:.2g}, {m['kl_delta_high_nats']:.2g}] | "
                  f"{m['kl_delta_max_step_nats']:.2g} ({m['kl_step_tolerance_nats']:.2g}) | "
                  f"{m['nll_delta_nats']:.2g} [{m['nll_delta_low_nats']:.2g}, {m['nll_delta_high_nats']:.2g}] | "
                  f"{tags.get('fidelity', '-')} |")


if __name__ == "__main__":
    main(sys.argv[1:])
