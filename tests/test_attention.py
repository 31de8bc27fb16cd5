"""The context axis on CPU: the attention backends, the valid-prefix kernels, the chunked prefill."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, _cur_sdpa_kernel_backends
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from harness.kernels import attention
from harness import models
from harness.errors import ConfigError
from harness.config.validate import check_overrides, to_run_config
from harness.measure.job import measure, seeded_prompt
from harness.modes import base
from harness.modes.eager import EagerStepper
from tests.support import FAST, compiled_for_the_gpu, run_config

CPU = torch.device("cpu")
pytestmark = pytest.mark.usefixtures("fresh_model_cache")


def _tiny(attn: str, bs: int = 2):
    cfg = run_config(*FAST, "device=cpu", "dtype=fp32", f"bs={bs}").model
    return models._load(cfg, torch.float32, attn, CPU, seed=0)[0]


def _forced_logits(stepper, tokens: list[torch.Tensor]) -> list[torch.Tensor]:
    out = []
    for token in tokens:
        out.append(stepper.step().clone())
        stepper.input_ids.copy_(token)
    return out


@pytest.mark.parametrize("attn, gqa_decode", [("sdpa-gqa", attention.packed_rows_attention),
                                              ("sdpa-gqa", attention.enable_gqa_attention), ("flex", None),
                                              ("triton-decode", None)])
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


@pytest.mark.parametrize("bs, heads, kv_heads, slots, position", [
    (1, 16, 8, 1280, 1033), (3, 4, 2, 256, 0), (3, 4, 2, 256, 63), (3, 4, 2, 256, 64), (2, 8, 1, 512, 300),
    (2, 4, 4, 128, 127),
    # one KV head, 512 slots, 8 chunks of 64 slots: each edge of a block and chunk (a chunk holding the newest
    # token alone at 128, 192, 448); from 448 on the 8th chunk is in use (448: the newest token alone in it), so
    # a merge that dropped its last chunk fails at 448, 449 and 511
    *((1, 4, 1, 512, p) for p in (1, 62, 63, 64, 65, 128, 129, 192, 193, 448, 449, 511))])
def test_triton_decode_reads_the_valid_prefix_only(bs, heads, kv_heads, slots, position):
    """Split-KV over the valid prefix, chunks merged: SDPA's answer over slots [0, position] alone, for
    groups of 1 to 8 query heads per KV head, a first slot, a chunk's edge, a whole cache."""
    attention.use_triton_decode(CPU)  # Triton's interpreter
    from harness.kernels.triton_decode import splits_for

    g = torch.Generator().manual_seed(position)
    q = torch.randn(bs, heads, 1, 16, generator=g)
    k, v = (torch.randn(bs, kv_heads, slots, 16, generator=g) for _ in range(2))
    k[:, :, position + 1:], v[:, :, position + 1:] = 1e4, -1e4
    expected = F.scaled_dot_product_attention(q, k[:, :, :position + 1], v[:, :, :position + 1], enable_gqa=True)
    got = attention.triton_decode_op(q, k, v, torch.tensor(position), 0.25)
    assert torch.allclose(got, expected, atol=1e-5), (got - expected).abs().max()
    assert splits_for(bs, kv_heads, slots) > 1 or bs * kv_heads >= 132  # the chunks are what is tested


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_triton_decode_in_half_precision_on_a_cpu_computes_in_fp32(dtype):
    """Triton's interpreter multiplies bf16 and fp16 wrongly (errors of ~1e10 seen): there the kernel widens to
    fp32, so a CPU run at the default dtype gets SDPA's answer to the dtype's rounding."""
    attention.use_triton_decode(CPU)
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 8, 1, 64, generator=g)
    k, v = (torch.randn(2, 2, 512, 64, generator=g) for _ in range(2))
    expected = F.scaled_dot_product_attention(q, k[:, :, :301], v[:, :, :301], enable_gqa=True)
    got = attention.triton_decode_op(q.to(dtype), k.to(dtype), v.to(dtype), torch.tensor(300), 0.125)
    assert got.dtype == dtype and (got.float() - expected).abs().max() < 0.02


AOT_COMPILE = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from harness.kernels.triton_decode import _merge, split_kv_chunk

ints = ["q_row", "q_head", "k_row", "k_head", "k_slot", "v_row", "v_head", "v_slot"]
for group in (2, 4):  # qwen3-0.6b/1.7b, qwen3-4b/8b and llama
    sig = dict(Q="*bf16", K="*bf16", V="*bf16", Pos="*i64", Acc="*fp32", M="*fp32", L="*fp32", scale="fp32",
               **dict.fromkeys(ints, "i32"), **dict.fromkeys(["GROUP", "GROUP_PAD", "D", "BLOCK_N", "SPLITS", "IEEE"], "constexpr"))
    consts = dict(GROUP=group, GROUP_PAD=16, D=128, BLOCK_N=64, SPLITS=32, IEEE=False)
    print("split_kv", len(triton.compile(ASTSource(split_kv_chunk, sig, consts), target=GPUTarget("cuda", 90, 32)).asm["ptx"]))
sig = dict(Acc="*fp32", M="*fp32", L="*fp32", Out="*bf16", o_row="i32", o_head="i32", HEADS="constexpr", D="constexpr",
           SPLITS="constexpr")
print("merge", len(triton.compile(ASTSource(_merge, sig, dict(HEADS=16, D=128, SPLITS=32)), target=GPUTarget("cuda", 90, 32)).asm["ptx"]))
"""


def test_triton_decode_compiles_for_the_h200():
    """The interpreter checks the arithmetic; Triton's own compiler, run ahead of time for sm_90 (no GPU
    needed), checks that the kernels build as a GPU runs them (bf16, head_dim 128)."""
    printed = compiled_for_the_gpu(AOT_COMPILE).split()
    assert printed[0::2] == ["split_kv", "split_kv", "merge"] and all(int(n) > 10_000 for n in printed[1::2])


def test_a_long_context_is_prefilled_in_chunks_to_the_same_cache(monkeypatch):
    model = _tiny("sdpa", bs=1)
    prompt = seeded_prompt(1, 300, model.config.vocab_size, 0, CPU)
    tokens = [prompt[:, i:i + 1] for i in range(4)]
    with torch.inference_mode():
        whole = _forced_logits(EagerStepper(model, prompt, 512), tokens)
        monkeypatch.setattr(base, "PREFILL_MASK_ELEMENTS", 512 * 128)  # 128-token chunks: 128 + 128 + 44
        monkeypatch.setattr(base, "PREFILL_FORWARD_TOKENS", 256)  # the whole context is past one forward's tokens
        assert base.prefill_chunk(1, 300, 512) == 128 and base.staged_prefill_chunk(1, 300) == 128
        chunked = _forced_logits(EagerStepper(model, prompt, 512), tokens)
    for a, b in zip(whole, chunked):
        assert torch.allclose(a, b, atol=1e-5, rtol=0), (a - b).abs().max()


def test_a_context_that_fits_one_forward_is_prefilled_in_one(monkeypatch):
    """One causal forward needs no mask (SDPA's flash kernel on a GPU); a chunk after the first attends through one.
    The model is called once per group of rows where the group's context fits PREFILL_FORWARD_TOKENS, and in chunks
    past it (a rule that chunked by the mask alone, or always, would call it more often)."""
    assert base.staged_prefill_chunk(1, 32768) == 32768  # the context preset's longest, one row a group: one forward
    model = _tiny("sdpa", bs=2)
    prompt = seeded_prompt(2, 300, model.config.vocab_size, 0, CPU)
    calls = []
    hook = model.model.register_forward_pre_hook(lambda module, args, kwargs: calls.append(kwargs["input_ids"].shape),
                                                 with_kwargs=True)
    try:
        with torch.inference_mode():
            monkeypatch.setattr(base, "PREFILL_MASK_ELEMENTS", 2 * 300 * 128)  # the mask rule alone: 128-token chunks
            EagerStepper(model, prompt, 512)
            assert calls == [(2, 300)]
            calls.clear()
            monkeypatch.setattr(base, "PREFILL_FORWARD_TOKENS", 2 * 299)
            EagerStepper(model, prompt, 512)
            assert calls == [(2, 128), (2, 128), (2, 44)]
    finally:
        hook.remove()


def test_cache_len_follows_from_the_context_unless_given():
    assert run_config("context_len=1000").cache_len == 1280  # 1000 + 10 + 128, rounded up to 256
    assert run_config("context_len=16").cache_len == 256
    assert run_config("context_len=1000", "cache_len=4096").cache_len == 4096
    with pytest.raises(ConfigError, match=r"cache_len=1100 is too short: context_len \(1000\) .* use cache_len>=1138"):
        run_config("context_len=1000", "cache_len=1100")
    with pytest.raises(ConfigError, match=r"cache_len=1100 is invalid with attn=flex: .* \(e.g. 1152\)"):
        run_config("attn=flex", "cache_len=1100")
    with pytest.raises(ConfigError, match="prompt_len is now called context_len: use context_len=N"):
        check_overrides(["prompt_len=16"])


def test_a_config_saved_with_prompt_len_reruns_as_context_len():
    saved = {"model": dict(run_config("model=tiny").model.__dict__), "bs": 2, "prompt_len": 8, "cache_len": 256}
    cfg = to_run_config(saved)
    assert (cfg.context_len, cfg.cache_len) == (8, 256)


@pytest.mark.parametrize("attn", ["flex", pytest.param("triton-decode", marks=pytest.mark.slow)])
def test_a_valid_prefix_backend_runs_verified_against_fp32_on_cpu(attn):
    result = measure(run_config(*FAST, "device=cpu", "dtype=fp32", f"attn={attn}", "cache_len=128", "bs=2"))
    m = result.metrics
    assert result.failure is None and m["verified"] == 1.0
    assert m["max_logit_diff"] == 0.0 and m["fp32_token_agreement"] == 1.0 and m["fp32_rows_checked"] == 2


def test_verification_decodes_across_a_block_edge_of_the_backend_in_use():
    from harness.measure.context_check import VERIFY_TOKENS, verified_steps

    assert verified_steps("sdpa", 16, 256) == VERIFY_TOKENS  # reads every slot: no edge to cross
    assert verified_steps("flex", 16, 256) == 128 - 16 + 3  # up to two past position 128, where flex's 2nd block starts
    assert verified_steps("flex", 1024, 1280) == VERIFY_TOKENS  # position 1024 starts a block: the first step crosses
    assert verified_steps("triton-decode", 40, 256) == VERIFY_TOKENS  # 40..71 crosses 64
    assert verified_steps("triton-decode", 8, 64) == 56  # as far as the cache holds


def _newest_slot_dropped_at_block_edges(monkeypatch):
    """attn=triton-decode with a fault at its block edges only: where the new token starts a block of 64 slots, the
    kernel attends to the slots before it and not to the token itself."""
    attention.use_triton_decode(CPU)
    kernel = attention.triton_decode_op

    def faulty(query, key, value, position, scale):
        return kernel(query, key, value, position - 1 if int(position) % 64 == 0 else position, scale)

    monkeypatch.setattr(attention, "triton_decode_op", faulty)


@pytest.mark.slow
def test_a_fault_at_a_block_edge_fails_the_run_that_32_steps_from_the_context_would_pass(monkeypatch):
    from harness.measure import context_check

    _newest_slot_dropped_at_block_edges(monkeypatch)
    cfg = run_config(*FAST, "device=cpu", "dtype=fp32", "bs=1", "attn=triton-decode", "model.tie_word_embeddings=false",
                     "cache_len=128")
    faulty = measure(cfg)  # verification decodes positions 8..66: position 64 starts a block
    assert faulty.metrics["verified_steps"] == 64 - 8 + 3 and faulty.failure is not None
    monkeypatch.setattr(context_check, "verified_steps", lambda *a: context_check.VERIFY_TOKENS)
    assert measure(cfg).failure is None  # the old window, positions 8..39, decodes at no edge: the fault passed
