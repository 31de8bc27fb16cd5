"""Where Triton kernels run: on a CUDA GPU, or on a machine without an NVIDIA GPU in Triton's interpreter
(tests, a CPU user). Triton reads TRITON_INTERPRET when a kernel is defined, its own library's included (at
`import triton`, which transformers' and torch's imports trigger), so the choice is made once, at the start of
a process: by the command line (harness/cli/main.py) and by the tests' conftest, never by importing harness."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from harness.cache import cache_root

NVIDIA_DEVICE_FILES = ("/dev/nvidiactl", "/proc/driver/nvidia/version")


def has_nvidia_gpu() -> bool:
    return any(os.path.exists(p) for p in NVIDIA_DEVICE_FILES)


def interpret_without_gpu() -> None:
    """Without an NVIDIA GPU, Triton's interpreter for this process (a value the user set is kept): call it
    before anything imports triton."""
    if not has_nvidia_gpu():
        os.environ.setdefault("TRITON_INTERPRET", "1")


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def interpreter_ready() -> bool:
    """Whether Triton's own library was defined for its interpreter: false where triton was imported before
    TRITON_INTERPRET=1 was set (its kernels would then fail at their first call on a CPU)."""
    if not interpreted():
        return False
    if "triton" not in sys.modules:
        return True
    from triton.language import standard
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(standard.cdiv, InterpretedFunction)


def quicken_the_interpreter() -> None:
    """Triton's interpreter, made quicker at the same results: see _no_discarded_overflow_checks and
    _builtins_found_once. Where its interpreter lacks what these replace, it is left as it is."""
    if not interpreted():
        return
    from triton.runtime import interpreter

    _no_discarded_overflow_checks(interpreter)
    _builtins_found_once(interpreter)


def _no_discarded_overflow_checks(interpreter) -> None:
    """The interpreter alone turns sanitize_overflow on: every 32-bit add, sub and mul is computed again in 64 bits
    and compared against the type's range, and the result handed to device_assert, which drops it unless Triton's
    debug mode is on. A third of a tiny fused job's time, for nothing: off, unless debug mode is on."""
    import dataclasses

    options = getattr(interpreter.interpreter_builder, "options", None)
    if getattr(options, "sanitize_overflow", False) and not getattr(options, "debug", True):
        interpreter.interpreter_builder.options = dataclasses.replace(options, sanitize_overflow=False)


def _builtins_found_once(interpreter) -> None:
    """The interpreter, before every launch and every call of a device function, finds the language's builtins by
    scanning whole modules (inspect.getmembers over triton.language, its tensor class and math) to swap in its own:
    another third of the time. The builtins do not change, so each module's are found once, at its first scan, and
    swapped in from that list. A scan inside a launch, which finds the swaps already made, swaps nothing, as
    Triton's own does."""
    import inspect

    scan = getattr(interpreter, "_patch_builtin", None)
    if scan is None or getattr(scan, "scans_once", False) or not hasattr(interpreter, "_patch_attr"):
        return
    builtins: dict[object, list] = {}

    def patch_builtin(pkg, builder, scope):
        if pkg not in builtins:
            builtins[pkg] = [(n, m) for n, m in inspect.getmembers(pkg) if interpreter.tl.core.is_builtin(m)]
        found = builtins[pkg]
        if found and getattr(pkg, found[0][0]) is not found[0][1]:
            return  # swapped already, by the launch this device function runs in
        for name, member in found:
            interpreter._patch_attr(pkg, name, member, builder, scope)

    patch_builtin.scans_once = True
    interpreter._patch_builtin = patch_builtin


def compile_cache_dir() -> Path:
    """The one folder that keeps compiled kernels between jobs and sweeps: compile/ under the harness's cache folder
    (harness/cache.py)."""
    return cache_root() / "compile"


def persistent_compile_caches() -> Path:
    """Inductor's caches (FX graphs, autotuning results, its Triton kernels) and Triton's own, under
    compile_cache_dir(), for this process and the jobs it starts: a second sweep's compiles read what the first
    wrote (a folder the user set through TORCHINDUCTOR_CACHE_DIR or TRITON_CACHE_DIR is kept). Call it before a
    compile: both read their folder when they first write."""
    root = compile_cache_dir()
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(root / "inductor"))
    os.environ.setdefault("TRITON_CACHE_DIR", str(root / "triton"))
    return root
