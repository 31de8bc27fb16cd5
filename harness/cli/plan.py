"""`harness plan [-m] OVERRIDES... [--past DIR] [--gpus N]`: the jobs a command would run, each with the time it took
before (the store's finished runs of the same config, and those among the result files under each DIR, by their
recorded phases), and the total; with --gpus, the sweep's wall on N GPUs of one node, one job each at a time.
Reads only: it runs nothing and creates no store."""
from __future__ import annotations

import heapq
import statistics
from pathlib import Path

from omegaconf import OmegaConf

from harness.config.exclude import describe, excluding_rule
from harness.config.labels import in_run_order, run_label, varying_keys
from harness.config.schema import CONF_DIR, config_hash
from harness.config.validate import check_overrides, to_run_config
from harness.record import flatten

# the phases a job's time is made of (the metrics every finished run logs)
PHASES = ("build_ms", "prepare_ms", "prefill_ms", "warmup_ms", "decode_wall_ms", "verify_ms")


def jobs_of(overrides: list[str]) -> tuple[list[list[str]], list]:
    """Every job's overrides, as the harness sweeper would run them: a preset's axes (hydra.sweeper.params),
    then the command line's (a key on both: the command line's values); and the sweep's exclude rules."""
    from hydra import compose, initialize_config_dir
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    given = [o for o in overrides if "=" in o and not o.startswith("-")]
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        sweeper = compose(config_name="config", return_hydra_config=True,
                          overrides=[o for o in given if o.startswith(("+experiment=", "hydra.sweeper.exclude"))]
                          ).hydra.sweeper
    params, rules = sweeper.params or {}, list(sweeper.get("exclude") or [])
    given = [o for o in given if not o.startswith("hydra.sweeper.exclude")]
    keys = {o.split("=", 1)[0].lstrip("+~") for o in given}
    axes = [f"{k}={v}" for k, v in params.items() if k.lstrip("+~") not in keys] + given
    jobs = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(axes), None)[0]
    return in_run_order([list(job) for job in jobs]), rules


def composed(job: list[str]):
    """One job's config, as the sweeper composes it."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name="config", overrides=job)


def identity_of(cfg, varying=()) -> tuple[str, str]:
    """(label, config hash) of one composed job, as its run would record them (the label names the `varying` keys
    the sweep varies, as a run's does); a job the schema refuses says why."""
    config = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    run = to_run_config(cfg)  # a ConfigError here: the line names the bad value
    config.update(run.derived())
    label = run_label(flatten(config), varying) if varying else run.label
    return label, config_hash(config)


def not_here(cfg) -> str | None:
    """Why this machine cannot run a composed job (a mode that needs a CUDA GPU, or device=cuda, where torch sees
    none), or None."""
    import torch

    from harness.modes import spec

    run = to_run_config(cfg)
    if run.device.startswith("cuda") and not torch.cuda.is_available():
        return f"device={run.device}, and torch sees no CUDA GPU"
    if spec(run.mode).mode_class().needs_cuda and not torch.cuda.is_available() and run.device != "cuda":
        return f"mode={run.mode} needs a CUDA GPU, and torch sees none"
    return None


def past_seconds(uri: str, experiment: str, hashes: set[str]) -> dict[str, list[float]]:
    """config hash -> the wall seconds of each FINISHED run of it in the store (the sum of its phases)."""
    from harness.store import tracking

    found: dict[str, list[float]] = {}
    for h in hashes:
        for run in tracking.finished_runs(uri, experiment, h):
            found.setdefault(h, []).append(sum(run.data.metrics.get(p, 0.0) for p in PHASES) / 1e3)
    return found


def past_seconds_in_files(folders: list[Path], hashes: set[str]) -> dict[str, list[float]]:
    """config hash -> the wall seconds of each FINISHED run of it among the result files under `folders` (sweep
    folders, or committed results such as docs/results/...), the sum of its phases as in the store."""
    from harness.store import results

    found: dict[str, list[float]] = {}
    for folder in folders:
        for record in results.read_folder(folder):
            if record.status == "FINISHED" and record.config_hash in hashes:
                found.setdefault(record.config_hash, []).append(sum(record.metrics.get(p, 0.0) for p in PHASES) / 1e3)
    return found


def wall_on_gpus(seconds: list[float], gpus: int) -> float:
    """The wall of jobs taking `seconds` each, in this order, on `gpus` GPUs where each job takes the first GPU to
    come free (the queue of hydra/launcher=gpus): the last GPU's end."""
    free_at = [0.0] * gpus
    for s in seconds:
        heapq.heapreplace(free_at, free_at[0] + s)
    return max(free_at)


def plan(uri: str | None, experiment: str, overrides: list[str], past_folders: list[Path] = (),
         gpus: int | None = None) -> int:
    check_overrides(overrides)
    jobs, rules = jobs_of(overrides)
    kept = [(job, cfg) for job, cfg in ((job, composed(job)) for job in jobs) if excluding_rule(cfg, rules) is None]
    varying = varying_keys([job for job, _ in kept])  # over the jobs a sweep records, as the sweeper counts them
    rows = [(" ".join(job), *identity_of(cfg, varying)) for job, cfg in kept]
    cannot = [not_here(cfg) for _, cfg in kept]
    hashes = {h for *_, h in rows}
    past = past_seconds(uri, experiment, hashes) if uri else {}
    for h, seconds in past_seconds_in_files(list(past_folders), hashes).items():
        past.setdefault(h, []).extend(seconds)
    estimates = []  # the median of each job's past runs, for the jobs that ran before
    left_out = len(jobs) - len(rows)
    excluded = f" ({left_out} more excluded: {'; '.join(describe(r) for r in rules)})" if left_out else ""
    print(f"{len(rows)} jobs{excluded}" + ("" if uri or past_folders else " (no store here: no past runs to estimate from)"))
    if any(cannot):
        print(f"{sum(map(bool, cannot))} of {len(rows)} jobs cannot run on this machine (marked below): here they "
              "would be recorded FAILED")
    for i, (_, label, h) in enumerate(rows):
        seconds = past.get(h)
        if seconds:
            estimates.append(statistics.median(seconds))
            estimate = f"{estimates[-1]:8.1f} s  (median of {len(seconds)} past run{'s' * (len(seconds) > 1)})"
        else:
            estimate = "       ?    (no past run of this config)"
        print(f"{i:>3}  {estimate}  {label}" + (f"  [cannot run here: {cannot[i]}]" if cannot[i] else ""))
    unknown = len(rows) - len(estimates)
    print(f"total: {sum(estimates):.1f} s for the {len(estimates)} jobs that ran before"
          + (f"; {unknown} never ran here" if unknown else ""))
    if gpus:
        print(f"on {gpus} GPU{'s' * (gpus > 1)}, one job each at a time (hydra/launcher=gpus): about "
              f"{wall_on_gpus(estimates, gpus):.1f} s for those jobs in the order above, each to the first GPU free;\n"
              "  plus what each pays as a process of its own, where one sweep's jobs share one: the interpreter, the "
              "imports and the model's build (docs/time-to-answer.md), and the eager "
              "references a job takes from the one before it")
    return 0
