"""Where Triton kernels run (harness/kernels/triton_runtime.py): on a CPU, Triton's interpreter, whose launches
find the language's builtins once (quicken_the_interpreter)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime import interpreter

from harness.kernels.triton_runtime import interpreted, quicken_the_interpreter


@triton.jit
def _scaled(x, scale):
    """A device function: the interpreter swaps the builtins in again for its call, inside the launch."""
    return tl.maximum(x * scale, 0.0)


@triton.jit
def _relu_scale(X, Y, scale, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(Y + offs, _scaled(tl.load(X + offs), scale) + tl.sum(tl.load(X + offs), axis=0))


def test_a_launch_with_a_device_function_computes_and_leaves_the_language_as_it_found_it():
    """The builtins are found once; a launch, and a device function's call inside it, still compute with the
    interpreter's own, and the launch gives the language its builtins back (a list found while they were swapped
    would hold none, and every later launch would run Triton's compiler-side builtins on numpy)."""
    assert interpreted()
    quicken_the_interpreter()
    quicken_the_interpreter()  # a second call keeps the one replacement
    assert interpreter._patch_builtin.scans_once
    before = {name: getattr(tl, name) for name in ("load", "store", "maximum", "sum", "arange")}
    x = torch.linspace(-1.0, 1.0, 16)
    for scale in (2.0, 3.0):  # the second launch runs from the list the first found
        y = torch.empty(16)
        _relu_scale[(1,)](x, y, scale, N=16)
        torch.testing.assert_close(y, torch.clamp(x * scale, min=0.0) + x.sum())
        assert {name: getattr(tl, name) for name in before} == before


@triton.jit
def _add_int32(X, Y, amount):
    tl.store(Y, tl.load(X) + amount)


def test_overflow_checks_that_only_debug_mode_reads_are_not_computed(monkeypatch):
    """Off without Triton's debug mode, where device_assert drops them; kept with it, where they fire. Results stay:
    an int32 add past 2**31 wraps either way without debug mode, as a compiled kernel's does."""
    import dataclasses

    from harness.kernels import triton_runtime

    builder = interpreter.interpreter_builder
    monkeypatch.setattr(builder, "options", dataclasses.replace(builder.options, sanitize_overflow=True, debug=True))
    triton_runtime._no_discarded_overflow_checks(interpreter)
    assert builder.options.sanitize_overflow  # debug mode reads them
    monkeypatch.setattr(builder, "options", dataclasses.replace(builder.options, debug=False))
    triton_runtime._no_discarded_overflow_checks(interpreter)
    assert not builder.options.sanitize_overflow
    x, y = torch.tensor([2**31 - 2], dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    _add_int32[(1,)](x, y, 5)
    assert int(y) == -(2**31) + 3
