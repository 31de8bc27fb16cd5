"""harness/kernels/fused/products.py: the products' kernels (tiles through TMA, row slices split over K) computing
eager's logits in Triton's interpreter."""
from __future__ import annotations

import dataclasses
from dataclasses import replace

import pytest

from harness.config.fused import FusedConfig
from harness.kernels.fused import products as fused_products
from harness.kernels.fused.knobs import KNOBS
from harness.kernels.fused.plan import PRODUCT_KINDS, PlanChoice
from tests.unit.kernels.fused.support import _Recording, assert_same_cache, decode_like_eager, fused_and_eager


@pytest.mark.slow
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "row-major"])
def test_products_whose_tiles_stream_through_tma_compute_eager_logits(packed, monkeypatch):
    """Every kind of product through `_matvec_tma` (in the interpreter a descriptor reads the same boxes the copy
    engine would), over splits of several tiles each, packed tiles or row-major rows whose last block passes the
    weight's edge: the same logits and cache as eager's, step after step."""
    # tiny's hidden size 64: the rule applies; 4 tiles of K, 2 a split
    knobs = dataclasses.replace(KNOBS, tma_from_hidden=64, interpreted_k=16, max_splits=2)
    launched = []
    monkeypatch.setattr(fused_products, "_matvec_tma", _Recording(fused_products._matvec_tma, launched))
    eager, run, decoder = fused_and_eager("model.vocab_size=1000", options=FusedConfig(pdl=False, packed=packed),
                                          knobs=knobs)
    products = decoder.products()
    assert all(p.descriptor is not None and p.stages == knobs.tma_stages for p in products.values())  # few programs
    assert products["qkv"].k // products["qkv"].bk // products["qkv"].splits >= 2
    assert products["lm_head"].n % products["lm_head"].bn  # its last block passes the edge (zeros: packed or TMA's)
    assert products["gate_up"].bn == knobs.interpreted_columns
    start = eager.context_len
    decode_like_eager(eager, run, decoder, 3)
    assert_same_cache(run, eager, start + 3, length=start + 3)
    assert len(launched) == 3 * (4 * len(decoder.layers) + 1)  # every product of every step


@pytest.mark.slow
@pytest.mark.parametrize("hidden", [64, 96], ids=["splits-whole", "splits-ragged"])
def test_row_slices_split_over_k_compute_eager_logits(monkeypatch, hidden):
    """fused.slices with K split (narrow splits here, so that a tiny model's products split): each split's input,
    squares and sums only its own columns, where the splits are whole BK (64 = 2 x 32) or ragged (96 = 4 x 24 in
    BK of 32: the loads past a split's end masked), and gate/up (never split) takes whole rows in halves."""
    knobs = replace(KNOBS, slice_columns=32, slice_values_a_thread_narrow=2)  # (a tiny model is narrow: slice_values)
    # a vocabulary of 128: lm_head's slices of 2 or 4 rows are 32 or 64 programs in Triton's interpreter, not 256 or 512
    eager, run, decoder = fused_and_eager(f"model.hidden_size={hidden}", "model.vocab_size=128", knobs=knobs)
    for kind in PRODUCT_KINDS:
        decoder = decoder.replanned(kind, PlanChoice(2, True, 4, slices=True))
    products = decoder.products()
    assert all(p.one_tile and not p.packed and "row slices" in str(p) for p in products.values())
    assert products["qkv"].splits == {64: 2, 96: 4}[hidden] and products["o"].splits == 2  # O's K: 4 heads x 16
    assert products["down"].splits == 4
    assert products["gate_up"].splits == products["lm_head"].splits == 1 and products["gate_up"].bn == {64: 4, 96: 2}[hidden]
    decode_like_eager(eager, run, decoder, 2)  # the second reads the first step's K/V
