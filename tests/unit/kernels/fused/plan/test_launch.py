"""harness/kernels/fused/plan.py, the launch point: where a product lets the next kernel launch."""
from __future__ import annotations

import dataclasses
from unittest import mock

import torch

from harness.config.fused import FusedConfig
from harness.kernels.fused import products as fused_products
from harness.kernels.fused.knobs import KNOBS
from harness.kernels.fused.plan import AFTER_LOOP, AT_END, AT_WAIT, PRODUCT_KINDS, PlanChoice, launch_point, plan_swiglu
from tests.unit.kernels.fused.support import fused_and_eager


def test_a_gate_up_sliced_on_eight_warps_lets_the_next_kernel_launch_after_its_stores(monkeypatch):
    """launch_point's rule (a gate/up sliced on eight warps lets the next kernel launch only after its stores, so that
    the next kernel's programs take none of its slots while its own run; a gate/up sliced on four warps or tiled, and
    the other products, after their weight loop), the point a step sets over it, the point passed to the kernel, and
    each of a step's products knowing its kind."""
    gate, up = torch.randn(64, 2048, dtype=torch.bfloat16), torch.randn(64, 2048, dtype=torch.bfloat16)

    def gate_up(warps: int, slices: bool = True, kind: str = "gate_up"):
        choice = PlanChoice(2, warps=warps, slices=slices)
        product = plan_swiglu(gate, up, FusedConfig(pdl=False), KNOBS, 1, 2048, choice=choice)
        return dataclasses.replace(product, kind=kind)

    assert launch_point(gate_up(8)) == AT_END
    assert launch_point(gate_up(4)) == launch_point(gate_up(8, slices=False)) == launch_point(
        gate_up(8, kind="down")) == AFTER_LOOP
    launched = {}
    monkeypatch.setattr(fused_products, "_matvec", mock.MagicMock(**{"__getitem__.return_value": (
        lambda *args, **kwargs: launched.update(kwargs))}))
    fused_products.launch_product(gate_up(8), torch.zeros(1, 2048), torch.zeros(1, 64), 1,
                                  output=fused_products.SWIGLU)
    assert launched["LAUNCH"] == AT_END and launched["num_warps"] == 8
    fused_products.launch_product(dataclasses.replace(gate_up(8), launch=AT_WAIT), torch.zeros(1, 2048),
                                  torch.zeros(1, 64), 1, output=fused_products.SWIGLU)
    assert launched["LAUNCH"] == AT_WAIT
    _, _, decoder = fused_and_eager()
    assert {kind: product.kind for kind, product in decoder.products().items()} == {
        kind: kind for kind in PRODUCT_KINDS}
