"""What a command line is refused for before Hydra creates a folder or a store, or a job builds a model: one line
naming the bad value and what would be valid, exit 2, nothing written.

A single run is composed and validated here in full (Hydra's own errors shortened to one line); a sweep's jobs
are each composed by the sweeper, which records a bad one FAILED and runs the rest. Every command's store URI
is checked here: a malformed one, or one carrying a token in its query string, would log nothing."""
from __future__ import annotations

import os
import shutil
import subprocess
from urllib.parse import parse_qsl, urlparse

from omegaconf import OmegaConf

from harness.config.schema import CONF_DIR, GROUPS, RunConfig
from harness.errors import ConfigError
from harness.store.redact import _SECRET_QUERY, redact

STORE_SCHEMES = ("sqlite", "file", "http", "https", "postgresql", "mysql", "mssql", "databricks")


def one_line(err: BaseException) -> str:
    """Hydra's or OmegaConf's message (and its cause, which names the valid options) on one line."""
    lines = str(err).strip().split("Config search path")[0].splitlines()
    if err.__cause__ is not None and str(err.__cause__).strip():
        lines.append(str(err.__cause__).strip().splitlines()[0])
    text = " ".join(line.strip() for line in lines if line.strip() and not line.startswith("    "))
    return text or type(err).__name__


def check_store_uri(uri: str | None) -> None:
    """A tracking URI MLflow can use, and none that would carry a secret where servers log it."""
    if not uri:
        return
    parsed = urlparse(uri)
    if parsed.scheme not in STORE_SCHEMES and not (os.sep in uri and parsed.scheme == ""):
        raise ConfigError(f"tracking.uri={redact(uri)} is not a store MLflow can use: give sqlite:///ABS/PATH.db, "
                          "http(s)://HOST:PORT (an `mlflow server`), postgresql://... or a folder path")
    if any(_SECRET_QUERY.search(f"?{k}=x") for k, _ in parse_qsl(parsed.query)):
        raise ConfigError(f"tracking.uri={redact(uri)} carries a secret in its query string, which MLflow sends on and "
                          "servers write to their logs: set MLFLOW_TRACKING_TOKEN (or MLFLOW_TRACKING_USERNAME and "
                          "MLFLOW_TRACKING_PASSWORD) instead")


def compose_single_run(overrides: list[str]) -> RunConfig:
    """The config a single run would run, composed and validated as the job will (without Hydra's folders)."""
    from hydra import compose, initialize_config_dir

    from harness.config.validate import to_run_config

    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            cfg = compose(config_name="config", overrides=overrides)
    except Exception as err:  # noqa: BLE001 - Hydra's errors span lines; one is enough
        raise ConfigError(one_line(err)) from err
    return to_run_config(cfg)


def memory_bytes(device: str) -> int | None:
    """What the job's device holds at most: the GPU's memory (nvidia-smi, no torch), or the host's."""
    if device.startswith("cuda") or (device == "auto" and shutil.which("nvidia-smi")):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=20).stdout.split()
            return int(out[0]) * 1024 * 1024 if out else None
        except (OSError, subprocess.SubprocessError, ValueError):
            return None
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None


def check_fits(run: RunConfig) -> None:
    """The KV cache alone (the job's largest allocation at large bs and cache) must fit the device."""
    total, need = memory_bytes(run.device), run.kv_cache_bytes()
    if total is not None and need > total:
        raise ConfigError(f"bs={run.bs} cache_len={run.cache_len} needs a {need / 2**30:.1f} GiB KV cache for "
                          f"model={run.model.name} in {run.dtype.value}, more than the {total / 2**30:.1f} GiB of "
                          "this device: lower bs or cache_len")


def check_saved_steps_budget() -> None:
    """HARNESS_SAVED_STEPS_MAX_MB, where set, is a size (every compiled job reads it)."""
    from harness.modes.saved_step import budget_bytes

    try:
        budget_bytes()
    except ValueError as err:
        raise ConfigError(str(err)) from err


def output_dir(overrides: list[str], multirun: bool) -> tuple[str, str]:
    """The key that names the folder Hydra will create for this command (hydra.sweep.dir for a sweep, else
    hydra.run.dir) and its value: the command line's, else conf/config.yaml's."""
    from pathlib import Path

    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    given = [o.split("=", 1)[1] for o in overrides if o.lstrip("+").split("=", 1)[0] == key]
    if given:
        return key, given[-1]
    hydra = OmegaConf.to_container(OmegaConf.load(Path(CONF_DIR) / "config.yaml"), resolve=False)["hydra"]
    return key, str(hydra[key.split(".")[1]]["dir"])  # as written: Hydra fills its interpolations in


def check_output_dir(overrides: list[str], multirun: bool) -> None:
    """The folder Hydra will create must be one this user can create: its nearest existing parent (up to the first
    interpolation, `${now:...}`, which Hydra fills in) must be a folder it may write in."""
    from pathlib import Path

    key, value = output_dir(overrides, multirun)
    fixed = Path(value.split("${", 1)[0] or ".").expanduser()
    existing = fixed.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"{key}={value} cannot be created: {existing} is a file, not a folder; "
                          "give a folder path under a folder you can write")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{key}={value} cannot be created: {existing} is not writable by this user; "
                          "give a folder path under a folder you can write")


def precheck(argv: list[str], multirun: bool) -> None:
    """Refuse what cannot run, before anything is created (ConfigError: one line)."""
    overrides = [a for a in argv if "=" in a and not a.startswith("-")]
    uri = next((o.split("=", 1)[1] for o in overrides if o.lstrip("+").startswith("tracking.uri=")), None)
    check_store_uri(uri or os.environ.get("MLFLOW_TRACKING_URI"))
    check_saved_steps_budget()
    check_output_dir(overrides, multirun)
    if multirun:
        check_sweep(overrides)
        return
    check_fits(compose_single_run(overrides))


def check_sweep(overrides: list[str]) -> None:
    """Every job of a sweep (its preset's axes and the command line's, less those its exclude rules leave out),
    composed and validated as the job will be: a value Hydra cannot parse or compose (`+experiment=nosuch`, a group
    without its `+`), or one the schema refuses in a job (`bs=1,0`), refuses the sweep before it starts, as it
    refuses a single run."""
    from hydra import initialize_config_dir

    from harness.cli.plan import jobs_of
    from harness.config.exclude import excluding_rule
    from harness.config.validate import to_run_config

    bases: dict = {}
    try:
        jobs, rules = jobs_of(overrides)
    except ConfigError:
        raise
    except Exception as err:  # noqa: BLE001 - Hydra's errors span lines; one is enough
        raise ConfigError(one_line(err)) from err
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        for job in jobs:
            try:
                cfg = _composed(job, bases)
            except Exception as err:  # noqa: BLE001
                raise ConfigError(f"{one_line(err)} (in the sweep's job {' '.join(job)}; nothing ran)") from err
            if excluding_rule(cfg, rules) is None:
                try:
                    to_run_config(cfg)
                except ConfigError as err:
                    raise ConfigError(f"{err} (in the sweep's job {' '.join(job)}; nothing ran)") from err


def _composed(job: list[str], bases: dict):
    """A job's config as Hydra would compose it, faster: Hydra composes the config groups it selects (and any
    deletion) once per set of them, kept in `bases`, and each plain `key=value` is merged into a copy, typed and
    checked by the schema as Hydra's own merge would (a sweep of many jobs would otherwise compose each anew)."""
    from hydra import compose
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(job)
    plain = [o for o in parsed if not o.is_delete() and o.key_or_group.split(".")[0] not in GROUPS
             and not o.key_or_group.startswith("hydra")]
    selects = tuple(o.input_line for o in parsed if o not in plain)
    if selects not in bases:
        bases[selects] = compose(config_name="config", overrides=list(selects))
    cfg = bases[selects].copy()
    for o in plain:
        OmegaConf.update(cfg, o.key_or_group, o.value(), merge=True, force_add=o.is_add() or o.is_force_add())
    return cfg
