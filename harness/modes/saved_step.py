"""A compiled decode step kept on disk, so that a later sweep loads it instead of having Dynamo trace the model again.

Inductor's FX graph cache keeps the kernels between sweeps, but not Dynamo's work: on torch 2.11 a warm compile
still reads every decoder layer's Python, 2 s for 16 layers to 15 s for 48 (docs/time-to-answer.md).
torch.compile's ahead-of-time path (`aot_compile`, then `save_compiled_function`) keeps the traced step and its
compiled code in one file, which `torch.compiler.load_compiled_function` reads back without tracing.

A saved step keeps only the guards that survive a process (tensor shapes, dtypes, strides and global grad state):
the ones on Python objects (the model's structure, its attention function, its config) cannot be saved. What they
guarded is therefore in the file's name instead, a digest of everything that decides the traced code: the model's
module tree and config, the rows, capacity and dtype of its cache, the compile options, the versions of torch,
transformers and Triton, the GPU, and the harness's own source. Any change to one of them compiles afresh.

Where a step cannot be compiled this way (a graph break: the ahead-of-time path needs one whole graph) or its file
cannot be saved or read, the step is compiled by torch.compile as before, the reason is logged with the run, and a
note beside the files keeps later sweeps from trying again.

Since a change of the harness's source or of a library names every step anew, the folder is kept within a budget
(HARNESS_SAVED_STEPS_MAX_MB): each time a step is saved, the steps least recently saved or loaded are deleted until
the rest fit it.
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import platform
import time
from pathlib import Path

import torch

FORMAT = 2  # of the files and their key: bump where what the key covers changes
HARNESS_ROOT = Path(__file__).resolve().parents[1]
# The saved steps' folder is kept within this many MB: every change of the harness's source, torch, transformers or
# Triton names each step anew, and a preset's steps take tens of MB (docs/time-to-answer.md), so without a bound the
# folder grows by that much each time.
BUDGET_VARIABLE = "HARNESS_SAVED_STEPS_MAX_MB"
DEFAULT_BUDGET_MB = 2048
# A file being written is saved as KEY.PID.part, then renamed; one this old was left by a process that died
STALE_PART_S = 3600


class StepNotSaved(Exception):
    """This step cannot go through the ahead-of-time path; the message says why, in one line."""


@functools.lru_cache(maxsize=1)
def harness_source_digest() -> str:
    """A digest of the harness's Python source: its attention kernels and decode step are traced into the step."""
    digest = hashlib.sha256()
    for path in sorted(HARNESS_ROOT.rglob("*.py")):
        digest.update(path.relative_to(HARNESS_ROOT).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def step_key(model: torch.nn.Module, cache_shape: tuple, cache_dtype: torch.dtype, device: torch.device,
             options: dict, regions: bool) -> str:
    """The name a step is kept under: a digest of all that decides its traced code (module docstring)."""
    import transformers

    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    what = {"format": FORMAT, "modules": repr(model), "config": model.config.to_json_string(use_diff=False),
            "attention": model.config._attn_implementation, "parameters": str(next(model.parameters()).dtype),
            # a model built under torch.inference_mode holds inference tensors, which a step traced over ordinary
            # ones rejects at its first call (its guards check the parameters' dispatch keys)
            "inference_parameters": next(model.parameters()).is_inference(),
            "cache": [list(cache_shape), str(cache_dtype)], "options": options, "regions": regions,
            "device": _device_name(device), "torch": torch.__version__, "transformers": transformers.__version__,
            "triton": triton_version, "python": platform.python_version(), "harness": harness_source_digest()}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _device_name(device: torch.device) -> str:
    if device.type != "cuda":
        return device.type
    return f"{torch.cuda.get_device_name(device)} sm{''.join(map(str, torch.cuda.get_device_capability(device)))}"


def load(path: Path, step_function, options: dict, args: tuple):
    """The step kept at `path`, ready to call with `args`; StepNotSaved where it cannot be read, or where its guards
    reject `args` (a call would raise, not retrace). `options`: the Inductor options it was compiled with, in force
    while it loads: loading wraps its code in CUDA graphs only where the global config says so at that moment (torch
    2.11 reads triton.cudagraphs then, not from the file). Without them, every step loaded on the H200 ran its kernels
    unrecorded, 4 to 5 times slower than the same step traced."""
    try:
        with torch._inductor.config.patch(options), path.open("rb") as file:
            step = torch.compiler.load_compiled_function(file, f_globals=step_function.__globals__)
    except Exception as error:  # a file of another torch, or cut short: compile afresh over it
        raise StepNotSaved(f"the saved step {path.name} could not be loaded: {one_line(error)}") from error
    if (rejected := guards_reject(step, args)) is not None:
        raise StepNotSaved(f"the saved step {path.name} does not fit this job: its guards fail on {rejected}")
    _mark_used(path)
    return step


def guards_reject(step, args: tuple) -> str | None:
    """What the loaded step's guards fail on for `args` (their first failing check, in one line), or None where they
    pass or this torch offers no check before the call."""
    check = getattr(step, "guard_check", None)
    try:
        if check is None or check(*args):
            return None
    except Exception as error:  # a check that cannot run on these arguments: a call could not either
        return f"their check, which raised {one_line(error)}"
    try:  # the reason, as the failing call would raise it (torch's own structures, read where they are as in 2.11-2.13)
        parts = step._artifacts.guard_manager.check_verbose(step.prepare_f_locals(*args)).verbose_code_parts
    except Exception:
        parts = None
    return " ".join(str((parts or ["(no reason given)"])[0]).split())[:300]


def compile_and_save(path: Path, step_function, options: dict, example_args: tuple):
    """Trace and compile `step_function` for `example_args` as one graph, keep it at `path`, and return it;
    StepNotSaved where the step has a graph break or cannot be saved (a note at `path` says so to later sweeps)."""
    try:  # a torch without the ahead-of-time path fails here too, and compiles as before
        # torch 2.11 gives the compiled function its aot_compile only under this switch (2.13 always does)
        with torch._dynamo.config.patch(enable_aot_compile=True):
            compiled = torch.compile(step_function, dynamic=False, fullgraph=True,
                                     options={**options, "guard_filter_fn": torch.compiler.keep_portable_guards_unsafe})
        step = compiled.aot_compile((example_args, {}))
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.part")  # another process may be writing the same step
        step.save_compiled_function(str(partial))
        partial.replace(path)
    except Exception as error:
        reason, note = f"the step cannot be kept on disk: {one_line(error)}", not_kept_note(path)
        note.parent.mkdir(parents=True, exist_ok=True)
        note.write_text(reason + "\n")
        raise StepNotSaved(reason) from error
    return step


def budget_bytes() -> int:
    """The saved steps' budget in bytes, from HARNESS_SAVED_STEPS_MAX_MB (DEFAULT_BUDGET_MB where unset; 0 keeps only
    the step saved last); ValueError, in one line, for a value that is not a number of MB."""
    text = os.environ.get(BUDGET_VARIABLE, "").strip()
    if not text:
        return DEFAULT_BUDGET_MB << 20
    try:
        megabytes = float(text)
    except ValueError:
        megabytes = math.nan
    if not (math.isfinite(megabytes) and megabytes >= 0):
        raise ValueError(f"{BUDGET_VARIABLE}={text!r} is not a size: give the MB the saved compiled steps may take, "
                         f"a number >= 0 (default {DEFAULT_BUDGET_MB}; 0 keeps only the step saved last)")
    return int(megabytes * (1 << 20))


def prune(folder: Path, budget: int, keep: Path) -> list[tuple[str, int]]:
    """Delete the saved steps (and notes) of `folder` least recently saved or loaded until the rest take `budget`
    bytes at most, and any part-written file older than STALE_PART_S; `keep`, the step just saved, stays whatever its
    size. Another process may prune or write the same folder at once: a file gone already is passed over. Returns
    each deleted step's (or note's) name and bytes, oldest first."""
    now, candidates, deleted = time.time(), [], []
    for path in folder.iterdir():
        try:
            stat = path.stat()
        except FileNotFoundError:
            continue
        if path.suffix == ".part":  # another process's write in flight, unless its writer died long ago
            if now - stat.st_mtime > STALE_PART_S:
                path.unlink(missing_ok=True)
        elif path.suffix in (".step", ".not-kept") and path != keep:
            candidates.append((stat.st_mtime, path.name, stat.st_size))
    total = sum(size for _, _, size in candidates) + (keep.stat().st_size if keep.exists() else 0)
    for _, name, size in sorted(candidates):
        if total <= budget:
            break
        (folder / name).unlink(missing_ok=True)
        total -= size
        deleted.append((name, size))
    return deleted


def _mark_used(path: Path) -> None:
    """The step's time of last use is its file's modification time (prune deletes the oldest first)."""
    try:
        os.utime(path)
    except OSError:  # a folder this process may read but not write: the step still runs
        pass


def not_kept_note(path: Path) -> Path:
    return path.with_suffix(".not-kept")


def one_line(error: Exception) -> str:
    text = f"{type(error).__name__}: {error}".strip().splitlines()[0]
    return text[:300]
