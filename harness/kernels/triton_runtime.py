"""Where Triton kernels run: on a CUDA GPU, or on a machine without an NVIDIA GPU in Triton's interpreter
(tests, a CPU user). Triton reads TRITON_INTERPRET when a kernel is defined, its own library's included (at
`import triton`, which transformers' and torch's imports trigger), so the choice is made once, at the start of
a process: by the command line (harness/cli/main.py) and by the tests' conftest, never by importing harness."""
from __future__ import annotations

import os
import sys
from pathlib import Path

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


def compile_cache_dir() -> Path:
    """The one folder that keeps compiled kernels between jobs and sweeps: $HARNESS_CACHE_DIR/compile, by default
    ~/.cache/harness/compile (beside the error logs)."""
    return Path(os.environ.get("HARNESS_CACHE_DIR") or Path.home() / ".cache" / "harness") / "compile"


def persistent_compile_caches() -> Path:
    """Inductor's caches (FX graphs, autotuning results, its Triton kernels) and Triton's own, under
    compile_cache_dir(), for this process and the jobs it starts: a second sweep's compiles read what the first
    wrote (a folder the user set through TORCHINDUCTOR_CACHE_DIR or TRITON_CACHE_DIR is kept). Call it before a
    compile: both read their folder when they first write."""
    root = compile_cache_dir()
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(root / "inductor"))
    os.environ.setdefault("TRITON_CACHE_DIR", str(root / "triton"))
    return root
