"""harness/kernels/fused/decoder.py: the fused step (in Triton's interpreter) against eager's logits and cache, and
the faults a fused kernel can hide changing what the step computes."""
from __future__ import annotations

import pytest
import torch

from harness.config.fused import FusedConfig
from tests.unit.kernels.fused.support import LLAMA, assert_same_cache, decode_like_eager, fused_and_eager


@pytest.mark.slow
@pytest.mark.parametrize("family", [(), LLAMA], ids=["qwen3", "llama"])
@pytest.mark.parametrize("options", [FusedConfig(pdl=False), FusedConfig(pdl=False, split_k=False, packed=False),
                                     FusedConfig(pdl=False, fold_attention=False)],
                         ids=["split-packed", "plain", "attention-unfolded"])
def test_the_fused_step_computes_eager_decode_logits_and_cache(family, options):
    eager, run, decoder = fused_and_eager(*family, options=options)
    assert eager.model.config.model_type == ("llama" if family else "qwen3")
    assert decoder.layers[0].down.splits > 1 if options.split_k else decoder.layers[0].down.splits == 1
    start = eager.context_len
    decode_like_eager(eager, run, decoder, 4)
    assert_same_cache(run, eager, start + 4, length=start + 4)  # the new tokens' K/V, appended where eager's are


@pytest.mark.slow
def test_a_fault_inside_a_fused_kernel_changes_what_it_computes():
    """The faults the run must catch do change the step (so the job tests above test the check, not a no-op)."""
    eager, run, decoder = fused_and_eager()
    with torch.inference_mode():
        want = eager.step()
        decoder.rope_shift = 1
        assert not torch.allclose(decoder.step(), want, atol=1e-3)
        run.rewind()
        for layer in run.cache.layers:
            layer.keys[:, :, eager.context_len] = 0  # what the shifted step appended
        decoder.rope_shift, decoder.append = 0, False
        decoder.step()
    assert all(layer.keys[:, :, eager.context_len].abs().max() == 0 for layer in run.cache.layers)  # never appended
