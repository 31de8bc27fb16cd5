"""harness/kernels/fused/plan.py, the copies-first rule: which products run as the Gluon kernel."""
from __future__ import annotations

import dataclasses

import pytest

from harness.cli.precheck import compose_single_run
from harness.config.fused import FusedConfig
from harness.kernels.fused import copies_first
from harness.kernels.fused.knobs import KNOBS
from harness.kernels.fused.plan import AFTER_LOOP, AT_WAIT, PRODUCT_KINDS
from tests.unit.kernels.fused.support import LARGE, fused_and_eager, gpu_products, o_launch


@pytest.mark.slow
def test_the_copies_first_rule_takes_one_packed_row_of_the_large_products_and_qkv_on_a_gpu(monkeypatch):
    """The copies-first rule plans Llama-3.2-1B's gate/up, down and lm_head, and QKV (copies_first_small_kinds), and
    no other product, as the Gluon kernel (its own descriptor) at one row with packed weights, on a GPU's plan only:
    at two rows (the kernel computes one), with row-major weights (its tiles are packed ones), or in Triton's
    interpreter (which runs no Gluon) the large products stay `_matvec_tma`'s; every kind where the rule is widened to
    them (tma_large_kinds); O lets such a gate/up launch at O's PDL wait, and another at O's rule (after its loop)."""
    llama = compose_single_run(["mode=fused", "model=llama-3.2-1b"]).model
    rules = gpu_products(monkeypatch, llama)
    assert {kind for kind, p in rules.items() if p.copies_first} == LARGE | {"qkv"}
    assert all(isinstance(p.descriptor, copies_first.TensorDescriptor) == p.copies_first for p in rules.values())
    assert o_launch(rules) == AT_WAIT
    every_kind = gpu_products(monkeypatch, llama, dataclasses.replace(KNOBS, tma_large_kinds=PRODUCT_KINDS))
    assert {kind for kind, p in every_kind.items() if p.copies_first} == set(PRODUCT_KINDS)
    two_rows = gpu_products(monkeypatch, llama, rows=2)
    assert not any(p.copies_first for p in two_rows.values()) and o_launch(two_rows) == AFTER_LOOP
    row_major = gpu_products(monkeypatch, llama, options=FusedConfig(packed=False))
    assert not any(p.copies_first for p in row_major.values()) and row_major["gate_up"].descriptor is not None
    assert not any(isinstance(p.descriptor, copies_first.TensorDescriptor) for p in row_major.values())
    assert o_launch(row_major) == AFTER_LOOP
    # the tiny model's width, planned interpreted
    _, _, decoder = fused_and_eager(knobs=dataclasses.replace(KNOBS, tma_large_from_hidden=64))
    assert decoder.layers[0].down.descriptor is not None and not decoder.layers[0].down.copies_first


@pytest.mark.slow
def test_qkv_copies_its_split_s_tiles_first_at_bs1_and_o_keeps_the_registers_in_a_2048_wide_model(monkeypatch):
    """The rules at one row in Llama-3.2-1B: QKV runs as the Gluon kernel (copies_first_small_kinds) on
    copies_first_small_stages, at most its split's tiles (QKV 4 of 16 in 4 splits; O, where a variant names it, 2 of
    16 in 8), the large products' copies on copies_first_stages, and O stays `_matvec`'s tiles through registers
    (the model is under copies_first_o_from_hidden), letting gate/up launch at its wait; at two rows QKV and O stay
    `_matvec`'s tiles through registers (no descriptor)."""
    llama = compose_single_run(["mode=fused", "model=llama-3.2-1b"]).model
    rule = gpu_products(monkeypatch, llama)
    assert {kind: p.stages for kind, p in rule.items() if p.copies_first} == dict(qkv=2, gate_up=2, down=2, lm_head=2)
    assert rule["qkv"].splits == 4 and rule["o"].descriptor is None and o_launch(rule) == AT_WAIT
    every_tile = gpu_products(monkeypatch, llama, dataclasses.replace(KNOBS, copies_first_small_kinds=("qkv", "o"),
                                                                      copies_first_small_stages=8))
    assert {kind: p.stages for kind, p in every_tile.items() if kind in ("qkv", "o")} == dict(qkv=4, o=2)
    assert every_tile["o"].copies_first and every_tile["o"].splits == 8
    two_rows = gpu_products(monkeypatch, llama, rows=2)
    assert not any(p.copies_first for p in two_rows.values())
    assert two_rows["qkv"].descriptor is None and two_rows["o"].descriptor is None


@pytest.mark.slow
def test_the_copies_first_rule_reaches_each_width_as_its_knobs_say(monkeypatch):
    """The copies-first rule's width (copies_first_from_hidden) at one row: it plans Qwen3-0.6B's large products
    (which the slice rule would take) and QKV as the Gluon kernel, gate/up in 32-column blocks (gate/up cannot split:
    narrower blocks are its one way to more programs), QKV split for one program an SM; every product of Qwen3-8B
    (O too, from copies_first_o_from_hidden); Llama-3.2-1B's large products and QKV; each on copies_first_warps, the
    large ones on copies_first_stages; O lets such a gate/up launch at its wait. A width past a model plans it as the
    rules before it did (Qwen3-0.6B sliced, its QKV split for programs_per_sm), and Qwen3-0.6B at 8 rows is planned
    as before it."""
    models = {name: compose_single_run(["mode=fused", f"model={name}"]).model
              for name in ("qwen3-0.6b", "llama-3.2-1b", "qwen3-8b")}
    narrow, llama, wide = (gpu_products(monkeypatch, models[name]) for name in models)
    assert {kind for kind, p in narrow.items() if p.copies_first} == LARGE | {"qkv"}
    assert narrow["gate_up"].bn == 32 and narrow["qkv"].splits == 4
    assert {kind: narrow[kind].stages for kind in LARGE} == dict.fromkeys(LARGE, KNOBS.copies_first_stages)
    assert all(p.copies_first for p in wide.values()) and wide["qkv"].splits == 2
    assert {p.stages for kind, p in wide.items() if kind != "qkv"} == {2}
    assert {kind for kind, p in llama.items() if p.copies_first} == LARGE | {"qkv"}
    for products in (narrow, llama, wide):
        assert {p.warps for p in products.values() if p.copies_first} == {KNOBS.copies_first_warps}
        assert o_launch(products) == AT_WAIT
    before = dataclasses.replace(KNOBS, copies_first_from_hidden=2048)
    narrow_before = gpu_products(monkeypatch, models["qwen3-0.6b"], before)
    assert not any(p.copies_first for p in narrow_before.values())
    assert {kind for kind, p in narrow_before.items() if p.choice.slices} == LARGE
    assert narrow_before["qkv"].splits == 8 and o_launch(narrow_before) == AFTER_LOOP
    assert ({k: str(p) for k, p in gpu_products(monkeypatch, models["llama-3.2-1b"], before).items()}
            == {k: str(p) for k, p in llama.items()})  # 2048 wide: still reached
    eight_rows = [{k: str(p) for k, p in gpu_products(monkeypatch, models["qwen3-0.6b"], knobs, 8).items()}
                  for knobs in (before, KNOBS)]
    assert eight_rows[0] == eight_rows[1]
