"""SIGINT and SIGTERM end the sweep, and are remembered. Python raises KeyboardInterrupt wherever the main thread
is when a signal comes; a library may catch it there and raise something else in its place (torch.compile does:
an interrupt inside Dynamo's trace comes out as BackendCompilerFailed, with the tracer's dispatch modes left
half popped). Without a record of the signal the runner would count that as one job's failure and go on to the
next jobs, in a process whose torch state the interrupted compile broke, failing each of them."""
from __future__ import annotations

import signal

_RECEIVED: list[str] = []  # the names of the signals this process has received, in order


def on_signal(signum, frame) -> None:
    name = signal.Signals(signum).name
    _RECEIVED.append(name)
    raise KeyboardInterrupt(name)


def install() -> None:
    """Ctrl-C and a scheduler's SIGTERM both end the runs KILLED (main thread only, where Python handles signals)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)


def received() -> int:
    """How many interrupts this process has received: a job compares it before and after it runs."""
    return len(_RECEIVED)


def last() -> str:
    return _RECEIVED[-1] if _RECEIVED else "no signal"
