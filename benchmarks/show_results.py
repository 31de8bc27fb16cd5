"""Print chosen metrics of every result.json under a folder, one line a run (for logs of remote runs).
    python benchmarks/show_results.py outputs step_ms_median step_ms_ci_low step_ms_ci_high"""
import json
import sys
from pathlib import Path

folder, keys = Path(sys.argv[1]), sys.argv[2:]
for path in sorted(folder.glob("**/result.json")):
    record = json.loads(path.read_text())
    metrics = record.get("metrics", {})
    values = " ".join(f"{k}={metrics[k]:.5g}" for k in keys if k in metrics)
    print(f"{record['label']} {record['status']} {values} {record.get('environment', {}).get('gpu_uuid', '')}")
