"""`harness plan` (harness/cli/plan.py): a preset's jobs, their estimates from committed result files (tests/data),
their GPUs and what a CPU cannot run."""
from __future__ import annotations

import json

import pytest
import torch

from tests.support import REPO, run_config

COMPOSED = {}  # one job's composed config, by its overrides: the same for every test here


@pytest.fixture(autouse=True)
def each_job_composed_once(monkeypatch):
    """Hydra composes a job in a tenth of a second or more, and the context preset holds 72, planned by several tests
    here: each job is composed once for the module, and each plan gets a copy of its own."""
    import copy

    from harness.cli import plan

    composed = plan.composed

    def once(job: list[str]):
        key = tuple(job)
        if key not in COMPOSED:
            COMPOSED[key] = composed(job)
        return copy.deepcopy(COMPOSED[key])

    monkeypatch.setattr(plan, "composed", once)


@pytest.mark.slow  # composes a preset's dozens of jobs through Hydra
@pytest.mark.parametrize("leases, ran", [("every lease", 48), ("without the last lease", 46)])
def test_plan_estimates_a_preset_from_committed_result_files(workdir, capsys, leases, ran):
    """`harness plan --past DIR` with no store: each job's estimate is the median of its config's finished runs among
    the result files (the sum of their phases), the total is their sum, and a config that never finished says so
    (without the last lease's files, two: bs=32 at context 32768 under sdpa, one of them killed). Computed here by
    hand from the files. Bugs caught: a killed run counted, a config's runs not grouped by hash (the eager run at
    bs=32, context 4096 finished on two leases), the total summed over runs instead of configs."""
    import shutil
    import statistics

    from harness.cli import commands

    folder = REPO / "tests" / "data" / "h200-context"
    if leases != "every lease":
        folder = shutil.copytree(folder, workdir / "past", ignore=shutil.ignore_patterns("lease-c7c6099f-*"))
    phases = ("build_ms", "prepare_ms", "prefill_ms", "warmup_ms", "decode_wall_ms", "verify_ms")
    by_hash: dict[str, list[float]] = {}
    for path in folder.glob("**/result.json"):
        record = json.loads(path.read_text())
        if record["status"] == "FINISHED":
            by_hash.setdefault(record["config_hash"], []).append(sum(record["metrics"].get(p, 0.0) for p in phases) / 1e3)
    expected = sum(statistics.median(seconds) for seconds in by_hash.values())
    assert commands.main(["plan", "+experiment=context", "--past", str(folder)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "48 jobs (24 more excluded: mode=eager attn=sdpa-gqa; mode=eager attn=flex)"
    never = f"; {48 - ran} never ran here" if ran < 48 else ""
    total = next(line for line in out if line.startswith("total: "))
    assert len(by_hash) == ran and total == f"total: {expected:.1f} s for the {ran} jobs that ran before{never}"
    twice = [line for line in out if line.endswith("bs=32 ctx=4096 eager qwen3-0.6b cache=4352")]
    assert len(twice) == 1 and "(median of 2 past runs)" in twice[0]
    assert sum("no past run" in line for line in out) == 48 - ran


@pytest.mark.slow  # composes a preset's dozens of jobs through Hydra
def test_plan_on_several_gpus_gives_each_job_in_turn_the_first_gpu_free(workdir, capsys):
    """`harness plan --gpus N`: the sweep's wall where each job, in the sweep's order, takes the first GPU to come free
    (hydra/launcher=gpus's queue). Bugs caught: jobs dealt round-robin (20 s below), the total split evenly (11 s)."""
    from harness.cli import commands
    from harness.cli.plan import wall_on_gpus

    assert wall_on_gpus([10.0, 1.0, 1.0, 1.0, 9.0], 2) == 12.0  # 10 | 1+1+1, then 9 on the one free at 3
    assert wall_on_gpus([10.0, 1.0, 1.0, 1.0, 9.0], 1) == 22.0 and wall_on_gpus([3.0, 5.0], 8) == 5.0
    folder = str(REPO / "tests" / "data" / "h200-context-whole")
    assert commands.main(["plan", "+experiment=context", "--past", folder, "--gpus", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    total = float(out[-3].split()[1])
    assert out[-2].startswith(f"on 1 GPU, one job each at a time (hydra/launcher=gpus): about {total:.1f} s ")
    assert commands.main(["plan", "+experiment=context", "--past", folder, "--gpus", "8"]) == 0
    eight = float(capsys.readouterr().out.splitlines()[-2].split("about ")[1].split()[0])
    assert total / 8 <= eight < total / 4
    assert commands.main(["plan", "+experiment=context", "--gpus", "0"]) == 2
    assert "--gpus: '0' is not a count of GPUs: use a whole number of 1 or more" in capsys.readouterr().err


@pytest.mark.slow  # composes a preset's dozens of jobs through Hydra
def test_plan_numbers_the_jobs_as_the_sweep_ran_them(workdir, capsys):
    """`harness plan` lists a preset's jobs in the order the harness sweeper runs them (grouped by model, the grid's
    order within one), checked against the job numbers of the models preset's sweep on the H200, whose result files
    are committed. Bug caught: the plan listing Hydra's grid order (qwen3-0.6b first) while the sweep runs llama first."""
    from harness.cli import commands

    folder = REPO / "tests" / "data" / "h200-models-regional" / "lease-2cd8f179-preset"
    ran = {(r := json.loads(p.read_text()))["job_num"]: r["label"] for p in folder.glob("*/result.json")}
    assert commands.main(["plan", "+experiment=models"]) == 0
    # "  N   ESTIMATE  (WHERE FROM)  LABEL", marked where this machine cannot run the job
    lines = [line.split("  [cannot run here")[0] for line in capsys.readouterr().out.splitlines()
             if "(no past run" in line or "(median of" in line]
    # the preset's attention was plain sdpa then, which labels leave out; it is sdpa-nocudnn now
    listed = {int(line.split()[0]): line.rsplit(")", 1)[1].strip().removesuffix(" sdpa-nocudnn") for line in lines}
    assert len(listed) == 54 and len(ran) == 35
    # the committed runs were named before names led with the keys a sweep varies: the same words, in another order
    words = lambda label: sorted(label.split())  # noqa: E731
    assert {n: words(listed[n]) for n in ran} == {n: words(label) for n, label in ran.items()}


@pytest.mark.slow
def test_the_cpu_preset_holds_the_design_cards_batch_sizes_eager_on_the_cpu_only():
    """The CPU set-up command's sweep: the design card's batch sizes, each a job a CPU can run (eager on the CPU,
    the tiny model), so that it ends with exit 0 where the design card's graphed jobs fail by design."""
    from harness.cli.plan import jobs_of

    jobs, _ = jobs_of(["+experiment=cpu"])
    runs = [run_config(*job) for job in jobs]
    card = [run_config(*job) for job in jobs_of(["+experiment=design-card"])[0]]
    assert sorted(r.bs for r in runs) == sorted({r.bs for r in card})
    assert {(r.mode, r.device, r.model.name) for r in runs} == {("eager", "cpu", "tiny")}


@pytest.mark.skipif(torch.cuda.is_available(), reason="marks what a machine without a CUDA GPU cannot run")
def test_plan_on_a_cpu_marks_the_jobs_this_machine_cannot_run(capsys):
    from harness.cli import commands

    assert commands.main(["plan", "-m", "model=tiny", "mode=eager,graphed"]) == 0
    out = capsys.readouterr().out.splitlines()
    graphed = [line for line in out if "graphed" in line and "(no past run" in line]
    eager = [line for line in out if "eager" in line and "(no past run" in line]
    assert len(graphed) == len(eager) == 1
    assert graphed[0].endswith("[cannot run here: mode=graphed needs a CUDA GPU, and torch sees none]")
    assert "cannot run" not in eager[0]
    assert "1 of 2 jobs cannot run on this machine (marked below): here they would be recorded FAILED" in out
