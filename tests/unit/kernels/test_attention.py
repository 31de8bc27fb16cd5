"""harness/kernels/attention.py, the context axis on CPU: the attention backends, flex's valid prefix."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, _cur_sdpa_kernel_backends
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from harness.kernels import attention
from harness.measure import context_check
from harness.measure.job import measure, seeded_prompt
from harness.modes.eager import EagerStepper
from tests.support import FAST, run_config
from tests.unit.kernels.support import CPU, _forced_logits, _tiny


pytestmark = pytest.mark.usefixtures("fresh_model_cache")


@pytest.mark.parametrize("attn, gqa_decode", [("sdpa-gqa", attention.packed_rows_attention),
                                              ("sdpa-gqa", attention.enable_gqa_attention),
                                              pytest.param("flex", None, marks=pytest.mark.slow),
                                              pytest.param("triton-decode", None, marks=pytest.mark.slow)])
def test_each_backend_decodes_as_transformers_sdpa_does(attn, gqa_decode, monkeypatch):
    """Six decode steps from a context of 200 in a cache of 256, fp32: triton-decode cuts each KV head's valid prefix
    (201 to 206 slots) into 4 chunks of 64, all in use, the last partial, so that a merge that drops a chunk (the last
    one), or a chunk's end off by a block, moves the logits; flex reads its second block."""
    if gqa_decode is not None:
        monkeypatch.setattr(attention, "GQA_DECODE", gqa_decode)
    plain, ours = _tiny("sdpa"), _tiny(attn)
    context, cache = 200, 256
    if attn == "triton-decode":
        from harness.kernels.triton_decode import BLOCK_N, splits_for

        def up(a: int, b: int) -> int:  # ceil(a / b), as the kernel's chunk_of computes it
            return -(-a // b)

        splits = splits_for(2, plain.config.num_key_value_heads, cache)
        for valid in range(context + 1, context + 7):  # every chunk in use, the last one partial
            chunk = up(up(valid, splits), BLOCK_N) * BLOCK_N
            assert splits == 4 and up(valid, chunk) == splits and valid % chunk
    prompt = seeded_prompt(2, context, plain.config.vocab_size, 0, CPU)
    tokens = [torch.randint(0, plain.config.vocab_size, (2, 1), generator=torch.Generator().manual_seed(i))
              for i in range(6)]
    key_heads, sdpa = [], F.scaled_dot_product_attention
    with torch.inference_mode():
        expected = _forced_logits(EagerStepper(plain, prompt, cache), tokens)
        stepper = EagerStepper(ours, prompt, cache)  # prefilled: from here on, what each decode step's SDPA reads
        monkeypatch.setattr(F, "scaled_dot_product_attention",
                            lambda q, k, *a, **kw: key_heads.append(k.shape[1]) or sdpa(q, k, *a, **kw))
        got = _forced_logits(stepper, tokens)
    for a, b in zip(expected, got):
        assert torch.allclose(a, b, atol=1e-5, rtol=0), (a - b).abs().max()
    # sdpa-gqa's decode steps read the 2 KV heads as they are: never expanded to the 4 query heads
    assert key_heads == ([2] * 6 * plain.config.num_hidden_layers if attn == "sdpa-gqa" else [])


def test_sdpa_nocudnn_holds_its_decode_steps_off_cudnn_and_computes_what_sdpa_does(monkeypatch):
    """Its decode steps' SDPA may dispatch anywhere but to cuDNN's attention (whose results vary between calls
    on the H200); its prefill is transformers' as dispatched, so that its context is sdpa's; and each decode
    step's logits are sdpa's."""
    plain, ours = _tiny("sdpa"), _tiny("sdpa-nocudnn")
    prompt = seeded_prompt(2, 8, plain.config.vocab_size, 0, CPU)
    tokens = [torch.randint(0, plain.config.vocab_size, (2, 1), generator=torch.Generator().manual_seed(i))
              for i in range(6)]
    allowed, sdpa = [], attention.sdpa_attention_forward  # (query tokens, the kernels torch may pick) a call

    def spy(module, query, *args, **kwargs):
        allowed.append((query.shape[2], set(_cur_sdpa_kernel_backends())))
        return sdpa(module, query, *args, **kwargs)

    with torch.inference_mode():
        expected = _forced_logits(EagerStepper(plain, prompt, 128), tokens)
        monkeypatch.setattr(attention, "sdpa_attention_forward", spy)
        got = _forced_logits(EagerStepper(ours, prompt, 128), tokens)
    for a, b in zip(expected, got):
        assert torch.allclose(a, b, atol=1e-5, rtol=0), (a - b).abs().max()
    layers = plain.config.num_hidden_layers
    decode = [kernels for query_tokens, kernels in allowed if query_tokens == 1]
    prefill = [kernels for query_tokens, kernels in allowed if query_tokens > 1]
    assert len(decode) == 6 * layers and len(prefill) == layers
    assert all(SDPBackend.CUDNN_ATTENTION not in k and SDPBackend.EFFICIENT_ATTENTION in k for k in decode)
    assert all(SDPBackend.CUDNN_ATTENTION in k for k in prefill)


@pytest.mark.parametrize("position", [0, 5, 127, 128, 200, 255])
@pytest.mark.slow
def test_flex_decode_reads_the_valid_prefix_only(position):
    """Slots after the position hold garbage: flex must give SDPA's answer over the valid prefix alone."""
    g = torch.Generator().manual_seed(position)
    q = torch.randn(2, 4, 1, 16, generator=g)
    k, v = (torch.randn(2, 2, 256, 16, generator=g) for _ in range(2))
    k[:, :, position + 1:], v[:, :, position + 1:] = 1e4, -1e4
    attention.use_flex(CPU)
    pos = torch.tensor(position)
    expected = F.scaled_dot_product_attention(q, k[:, :, :position + 1], v[:, :, :position + 1], enable_gqa=True)
    got = attention.flex_decode(q, k, v, pos, None)
    assert torch.allclose(got, expected, atol=1e-5), (got - expected).abs().max()
    # the offset matters (gpt-fast's warning): a causal mask_mod at the query's own index 0 is wrong
    unshifted = create_block_mask(lambda b, h, qi, kv: kv <= qi, None, None, 1, 256, device="cpu")
    if position:
        assert not torch.allclose(flex_attention(q, k, v, block_mask=unshifted, enable_gqa=True), expected, atol=1e-3)


@pytest.mark.parametrize("position", [0, 126, 127, 128, 129, 255, 256, 383])
def test_flex_reads_the_block_of_the_new_token(position):
    """The block count is position // 128 + 1: the block holding the new token is read even where the position is
    a multiple of 128 (one short there, flex would drop the newest token's own K/V; on a CPU flex's unfused path
    ignores the count, so the mask itself is checked)."""
    attention.use_flex(CPU)
    mask = attention.decode_block_mask(torch.tensor(position), 512, CPU)
    assert int(mask.kv_num_blocks.flatten()[0]) == position // 128 + 1
    assert mask.kv_indices.flatten()[: position // 128 + 1].tolist() == list(range(position // 128 + 1))


@pytest.mark.parametrize("attn", ["flex", pytest.param("triton-decode", marks=pytest.mark.slow)])
def test_a_valid_prefix_backend_runs_verified_against_fp32_on_cpu(attn, monkeypatch):
    # triton-decode runs in Triton's interpreter: from a context 4 slots short of its block edge of 64, 8 verified
    # steps still decode across the edge (verified_steps), where FAST's context of 8 took 59 (and eager's check 59 more)
    shorter = ("context_len=60",) if attn == "triton-decode" else ()
    if shorter:
        monkeypatch.setattr(context_check, "VERIFY_TOKENS", 8)
    result = measure(run_config(*FAST, "device=cpu", "dtype=fp32", f"attn={attn}", "cache_len=128", "bs=2", *shorter))
    m = result.metrics
    assert result.failure is None and m["verified"] == 1.0
    assert m["max_logit_diff"] == 0.0 and m["fp32_token_agreement"] == 1.0 and m["fp32_rows_checked"] == 2
