"""`harness rerun RUN_ID [key=value ...]`: a logged run, or every job of a sweep, run again from its saved
config under a new parent, with the old and new medians side by side."""
from __future__ import annotations

from datetime import datetime
from pathlib import Path

from omegaconf import OmegaConf

from harness.cli import interrupt
from harness.store import tracking
from harness.errors import ConfigError
from harness.record import JobRecord, exit_code, failure_summary
from harness.analysis.summary import print_summary
from harness.config.validate import check_overrides, model_preset, to_run_config


def rerun(uri: str, run_id: str, overrides: list[str]) -> int:
    from harness.cli.runner import JobContext, execute  # torch and transformers: only when it runs

    interrupt.install()  # a scheduler's SIGTERM ends the job running KILLED, and the rerun there, as in a sweep
    if malformed := [o for o in overrides if "=" not in o.lstrip("=")]:
        raise ConfigError(f"{malformed[0]!r} is not KEY=VALUE (e.g. decode_tokens=512)")
    check_overrides(overrides)
    source = tracking.get_run(uri, run_id)
    experiment = tracking.experiment_name(uri, source)
    runs = tracking.children(uri, source) if source.data.tags.get("harness.kind") != "job" else [source]
    if not runs:
        raise ConfigError(f"run {run_id} is a sweep with no job runs to rerun")
    configs = [(run, rerun_config(tracking.load_config(uri, run.info.run_id), overrides)) for run in runs]
    parent = tracking.start_parent(uri, experiment, f"rerun of {source.info.run_name}", "rerun",
                                   {"rerun_of": run_id, "overrides": " ".join(overrides)})
    out_dir = Path("outputs") / "reruns" / f"{datetime.now():%Y-%m-%d/%H-%M-%S}-{parent[:6]}"
    outcomes, varying = [], varying_in([cfg for _, cfg in configs])
    for i, (run, cfg) in enumerate(configs):
        ctx = JobContext(out_dir / str(i), uri, experiment, parent, i, overrides, progress=f"rerun {i + 1}/{len(configs)}",
                         tags={"rerun_of": run.info.run_id}, varying=varying)
        outcomes.append(execute(cfg, ctx))
    failed = exit_code(outcomes)
    tracking.end_run(uri, parent, "FAILED" if failed else "FINISHED", failure_summary(outcomes))
    print_summary(outcomes, f"rerun of {run_id} in {out_dir}", tracking.ui_command(uri))
    print_side_by_side(runs, outcomes)
    return failed


def varying_in(configs: list) -> list[str]:
    """The dotted keys whose values differ between the configs rerun (a sweep's jobs), which their names lead with
    as the sweep's did; a model's architecture keys go with its name."""
    from harness.config.schema import identity

    flat = [identity(OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)) for cfg in configs]
    keys = sorted({k for f in flat for k in f if k == "model.name" or not k.startswith("model.")})
    return [k for k in keys if len({str(f.get(k)) for f in flat}) > 1]


def rerun_config(logged: dict, overrides: list[str]):
    """A logged config is data: it must pass the schema (no unknown keys, so no `_target_`),
    before and after the overrides; nothing in it is imported or instantiated. `model=NAME` swaps in
    that preset. A rerun measures again: resume is off, or the run would find itself as its own twin."""
    base = OmegaConf.structured(to_run_config(OmegaConf.create(logged)))
    changes = [o for o in overrides if not o.startswith("model=")]
    try:
        for preset in (o.split("=", 1)[1] for o in overrides if o.startswith("model=")):
            base.model = model_preset(preset)
        changed = OmegaConf.merge(base, OmegaConf.from_dotlist([*changes, "resume=false"]))
    except ConfigError:
        raise
    except Exception as err:  # noqa: BLE001 - OmegaConf's own message names the key and the value
        raise ConfigError(str(err).splitlines()[0]) from err
    return OmegaConf.structured(to_run_config(changed))


WALL = "wall_ms_per_step"  # runs stored by early versions named it wall_ms_per_token (it was per step)


def print_side_by_side(old_runs, new_records: list[JobRecord]) -> None:
    """Old and new medians; a new median outside the old run's 95% interval is flagged (another GPU, driver
    or host moves a run by more than its own blocks vary)."""
    print("old run → rerun: median step ms [old 95% interval], wall ms/step")
    for old, new in zip(old_runs, new_records):
        env = {k[len("env."):]: v for k, v in old.data.tags.items() if k.startswith("env.")}
        differ = sorted(k for k in env.keys() | new.environment.keys() if env.get(k) != new.environment.get(k))
        if differ:
            print("  environment differs: " + "; ".join(f"{k}: {env.get(k, '-')} → {new.environment.get(k, '-')}"
                                                      for k in differ))
        o, n = old.data.metrics, new.metrics
        fmt = lambda m, k: f"{m[k]:.3f}" if k in m else "-"  # noqa: E731
        print(f"  {old.info.run_name}: {fmt(o, 'step_ms_median')} → {fmt(n, 'step_ms_median')}{_against(o, n)}, "
              f"{fmt(o, WALL if WALL in o else 'wall_ms_per_token')} → {fmt(n, WALL)}  ({old.info.run_id} → "
              f"{new.mlflow_run_id or 'not logged'})")


def _against(old: dict, new: dict) -> str:
    if not {"step_ms_ci_low", "step_ms_ci_high"} <= old.keys() or "step_ms_median" not in new:
        return ""
    low, high, median = old["step_ms_ci_low"], old["step_ms_ci_high"], new["step_ms_median"]
    verdict = "inside" if low <= median <= high else f"OUTSIDE ({100 * (median / old['step_ms_median'] - 1):+.1f}%)"
    return f" [{low:.3f}-{high:.3f}: {verdict}]"
