"""harness/kernels/fused/pdl.py: the MLP's weights asked of L2 in shares, and the fused kernels compiled ahead of time
for sm_90 with programmatic dependent launch."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import triton
import triton.language as tl

from harness.config.fused import FusedConfig
from harness.kernels.fused import pdl, decoder as fused_decoder, plan as fused_plan
from harness.kernels.fused.decoder import FusedDecoder
from harness.kernels.fused.knobs import KNOBS
from harness.modes.base import Stepper
from tests.support import compiled_for_the_gpu
from tests.unit.kernels.fused.support import tiny_model_and_prompt


@triton.jit
def _parts_of_each_program(Out, bytes1, bytes2, share):
    """What _weights_to_l2 asks L2 for in each program, written out: (first, length) in each of the two weights."""
    program = tl.program_id(0)
    start = program * share
    first, length = pdl._range_part(start, start + share, 0, bytes1)
    tl.store(Out + program * 4 + tl.arange(0, 2), tl.where(tl.arange(0, 2) == 0, first, length))
    first, length = pdl._range_part(start, start + share, bytes1, bytes1 + bytes2)
    tl.store(Out + program * 4 + 2 + tl.arange(0, 2), tl.where(tl.arange(0, 2) == 0, first, length))


@pytest.mark.parametrize("budget_from_down, asker", [(0.5, "folded"), (4.0, "folded"), (4.0, "merge")])
def test_the_attention_asks_l2_for_the_mlp_weights_once_each_within_the_budget(monkeypatch, budget_from_down, asker):
    """fused.weights_ahead: the programs' shares of gate/up's then down's weights cover the budget's bytes once each
    (none twice, none past a weight's end), each a whole number of the bulk prefetch's 16 bytes, in the folded
    attention's grid or in the three launches' merge's (one program a head); a context whose K/V alone passes the
    budget, or falls short of the floor, asks for none. (The prefetch itself is inline PTX: the sm_90 compile test
    below.)"""
    cfg, model, prompt = tiny_model_and_prompt("context_len=40", "cache_len=64")
    run = Stepper(model, prompt, cfg.cache_len)
    for module in (fused_plan, fused_decoder):  # the plan as a GPU's, computed here
        monkeypatch.setattr(module, "interpreted", lambda: False)
    options = FusedConfig(pdl=False, fold_attention=asker == "folded")

    def planned(options=options, **knobs) -> FusedDecoder:
        return FusedDecoder(model, run.cache, run.static_ids, options, dataclasses.replace(KNOBS, **knobs),
                            longest_prefix=48)

    decoder = planned()
    assert decoder.folded == (asker == "folded")
    layer = decoder.layers[0]
    gate_up_bytes, down_bytes = (w.numel() * w.element_size() for w in (layer.gate_up.weight, layer.down.weight))
    budget = gate_up_bytes + int(down_bytes * budget_from_down) // 16 * 16
    kv_bytes = 2 * decoder.rows * decoder.kv_heads * 48 * decoder.head_dim * 4  # K and V at the longest prefix, fp32
    shorter = planned(weights_ahead_from_kv_bytes=kv_bytes + 16)  # a shorter chain than the floor
    assert shorter.weights_ahead(shorter.layers[0]) is None
    decoder = planned(weights_ahead_from_kv_bytes=kv_bytes, weights_ahead_bytes=budget)
    layer = decoder.layers[0]
    first, bytes1, second, bytes2, share = decoder.weights_ahead(layer)
    assert (first, second) == (layer.gate_up.weight, layer.down.weight)
    assert (bytes1, bytes2) == (gate_up_bytes, min(down_bytes, budget - gate_up_bytes)) and share % 16 == 0
    if asker != "folded":
        assert decoder.attention_plan().endswith(f"{(bytes1 + bytes2) / 2**20:.1f} MiB of the MLP's weights asked of L2 "
                                                 f"by its {asker})")
    programs = decoder.rows * (decoder.heads if asker == "merge" else decoder.kv_heads * decoder.attn_acc.shape[2])
    parts = torch.zeros(programs, 4, dtype=torch.int64)
    _parts_of_each_program[(programs,)](parts, bytes1, bytes2, share)
    for column, size in ((0, bytes1), (2, bytes2)):
        asked = torch.zeros(size, dtype=torch.int32)
        for start, length in parts[:, column:column + 2].tolist():
            if length > 0:
                assert start % 16 == 0 and length % 16 == 0 and start + length <= size
                asked[start:start + length] += 1
        assert asked.eq(1).all()  # every byte asked for once
    off = planned(dataclasses.replace(options, weights_ahead=False), weights_ahead_from_kv_bytes=kv_bytes,
                  weights_ahead_bytes=budget)
    assert off.weights_ahead(off.layers[0]) is None
    past = planned(weights_ahead_from_kv_bytes=kv_bytes, weights_ahead_bytes=kv_bytes - 16)  # its own reads pass it
    assert past.weights_ahead(past.layers[0]) is None
    monkeypatch.undo()
    assert decoder.weights_ahead(layer) is None  # in the interpreter: no bulk prefetch to ask with


AOT_COMPILE = """
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from harness.kernels.fused.attention import _attention, _merge_ahead, _rope_append, _split_kv
from harness.kernels.fused.products import _matvec, _matvec_tma


def aligned_attrs(kernel, sig, aligned):
    # the argument indices Triton's JIT marks as multiples of 16 (`aligned`: the names), in the kernel's own order
    return {(kernel.arg_names.index(name),): [["tt.divisibility", 16]] for name in sig if name in aligned}


ptrs = dict(X="*bf16", ResOut="*fp32", Ids="*i64", Gain="*bf16", W="*bf16", Out="*fp32", SquaresOut="*fp32", Bump="*i64")
ints = dict.fromkeys(["x_row", "rows", "k_total", "n_total", "out_cols", "k_per_split", "k_tiles", "prefetch_bytes",
                     "prefetch_ahead"], "i32")
names = ["INPUT", "NORM", "OUTPUT", "SPLITS", "BUMP", "ROWS", "BN", "BK", "PACKED", "DOT", "PDL", "PREFETCH", "ONE_TILE",
         "LAUNCH"]
products = [  # qkv of layer 0 (embedding rows, split), gate/up (SwiGLU, bf16 out), down (atomic adds), lm_head (bump)
    dict(INPUT=1, NORM=True, OUTPUT=0, SPLITS=8, BUMP=False, PACKED=True),
    dict(INPUT=0, NORM=True, OUTPUT=1, SPLITS=1, BUMP=False, PACKED=True, X="*fp32", Out="*bf16", BN=32,
         PREFETCH=True),  # its first weights asked of L2 before the wait
    dict(INPUT=0, NORM=False, OUTPUT=3, SPLITS=8, BUMP=False, PACKED=False),
    dict(INPUT=0, NORM=True, OUTPUT=2, SPLITS=1, BUMP=True, PACKED=True, X="*fp32"),
    dict(INPUT=0, NORM=True, OUTPUT=3, SPLITS=2, BUMP=False, PACKED=True, X="*fp32", W="*fp32", Gain="*fp32"),  # dtype=fp32
    # fused.slices at bs=1: gate/up's whole rows, and down's rows in splits of K added atomically, on CUDA cores
    dict(INPUT=0, NORM=True, OUTPUT=1, SPLITS=1, BUMP=False, PACKED=False, X="*fp32", Out="*bf16", ROWS=1, BN=4,
         BK=2048, DOT=False, ONE_TILE=True),
    dict(INPUT=0, NORM=False, OUTPUT=3, SPLITS=4, BUMP=False, PACKED=False, ROWS=1, BN=4, BK=2048, DOT=False,
         ONE_TILE=True),
    # the next kernel let launch at the wait (AT_WAIT: 0, O's before a gate/up that copies first), a slice and tiles
    # in a loop; or at the end (AT_END: 2)
    dict(INPUT=0, NORM=True, OUTPUT=1, SPLITS=1, BUMP=False, PACKED=False, X="*fp32", Out="*bf16", ROWS=1, BN=4,
         BK=2048, DOT=False, ONE_TILE=True, LAUNCH=0),
    dict(INPUT=0, NORM=False, OUTPUT=3, SPLITS=8, BUMP=False, PACKED=True, LAUNCH=0),
    dict(INPUT=0, NORM=False, OUTPUT=3, SPLITS=4, BUMP=False, PACKED=False, ROWS=1, BN=4, BK=2048, DOT=False,
         ONE_TILE=True, LAUNCH=2),
    dict(INPUT=0, NORM=True, OUTPUT=2, SPLITS=1, BUMP=True, PACKED=True, X="*fp32", LAUNCH=2),
]
for product in products:
    sig = {**ptrs, **ints, "eps": "fp32", **dict.fromkeys(names, "constexpr"), **{k: v for k, v in product.items() if isinstance(v, str)}}
    sig = {name: sig[name] for name in _matvec.arg_names}
    consts = {**dict(ROWS=16, BN=64, BK=128, DOT=True, PDL=True, PREFETCH=False, ONE_TILE=False, LAUNCH=1),
              **{k: v for k, v in product.items() if not isinstance(v, str)}}
    # as Triton's JIT specialises them on the GPU: pointers and the sizes that are multiples of 16 marked so
    aligned = [name for name, kind in sig.items() if kind.startswith("*") or name in (
        "x_row", "k_total", "n_total", "out_cols", "k_per_split", "prefetch_bytes", "prefetch_ahead")]
    ptx = triton.compile(ASTSource(_matvec, sig, consts, attrs=aligned_attrs(_matvec, sig, aligned)),
                         target=GPUTarget("cuda", 90, 32)).asm["ptx"]
    # PDL's wait and early launch in every product, and no TF32 (an fp32 run's products are exact)
    print("matvec", "griddepcontrol.wait" in ptx and "griddepcontrol.launch_dependents" in ptx and "tf32" not in ptx)
    # the bulk prefetch before the wait where asked (by one thread), and the next kernel launched after the wait and
    # the weights' first loads, after the loop's loads and before the stores; or where asked at the wait, before any
    # load that follows it, or after the stores
    launch, prefetch, wait = (ptx.find(op) for op in ("griddepcontrol.launch_dependents", "cp.async.bulk.prefetch.L2",
                                                       "griddepcontrol.wait"))
    print("order", (prefetch != -1) == consts["PREFETCH"] and prefetch < wait and wait < launch
          and ptx.count("griddepcontrol.launch_dependents") == 1
          and (launch < ptx.find("ld.global", wait)) == (consts["LAUNCH"] == 0)
          and ptx.find("ld.global") < launch
          and any(op in ptx[launch:] for op in ("st.global", "atom.global", "red.global")) == (consts["LAUNCH"] != 2)
          and (not consts["PREFETCH"] or "setp.eq.u32 first_thread, tid, 0" in ptx))
sig = dict(Parts="*fp32", Squares="*fp32", Pos="*i64", Cos="*fp32", Sin="*fp32", QNorm="*bf16", KNorm="*bf16",
           Keys="*bf16", Values="*bf16", Acc="*fp32", M="*fp32", L="*fp32", Count="*i32", Out="*bf16",
           **dict.fromkeys(["rows", "n_total", "hidden", "k_row", "k_head", "k_slot", "v_row", "v_head", "v_slot",
                            "o_row"], "i32"), eps="fp32", scale="fp32", Ahead1="*bf16", ahead1_bytes="i32",
           Ahead2="*bf16", ahead2_bytes="i32", ahead_share="i32",
           **dict.fromkeys(["HEADS", "KV_HEADS", "GROUP_PAD", "D", "QKV_SPLITS", "SPLITS", "BLOCK_N", "QK_NORM",
                            "ROPE_SHIFT", "APPEND", "IEEE", "MERGE_BLOCK", "PDL", "AHEAD"], "constexpr"))
sig = {name: sig[name] for name in _attention.arg_names}
for ahead in (False, True):
    consts = dict(HEADS=16, KV_HEADS=8, GROUP_PAD=16, D=128, QKV_SPLITS=8, SPLITS=32, BLOCK_N=64, QK_NORM=True,
                  ROPE_SHIFT=0, APPEND=True, IEEE=False, MERGE_BLOCK=16, PDL=True, AHEAD=ahead)
    ptx = triton.compile(ASTSource(_attention, sig, consts), target=GPUTarget("cuda", 90, 32)).asm["ptx"]
    # the position from L2 and its RoPE rows after the wait, and no K/V read before it (here one 2-byte load a value:
    # the strides are not marked aligned)
    wait = ptx.find("griddepcontrol.wait")
    print("reads", not (-1 < ptx.find("ld.global.cg.b64") < wait) and ptx.count("ld.global", 0, wait) < 3
          and ptx.count("ld.global.b16", 0, wait) < 64
          # the queries' partial sums read after the wait ahead of the chunk's first K/V block (136 4-byte loads
          # here; RoPE's rows may come first: 2 such loads under Triton 3.9, 20 under 3.6)
          and ptx.count("ld.global.b32", wait, ptx.find("ld.global.b16", wait)) >= 64
          # the O product let launch once, at the kernel's start
          and ptx.count("griddepcontrol.launch_dependents") == 1
          and ptx.find("griddepcontrol.launch_dependents") < wait)
    # the chunk's partials written by all threads (a barrier), then counted by one atomic released and acquired at
    # the GPU's scope; the merge reads the other programs' partials from L2, past this SM's L1
    count = ptx.find("atom.global.gpu.acq_rel.add")
    asked = ptx.find("cp.async.bulk.prefetch.L2", ptx.rfind("mma"))  # the MLP's weights, once the chunk's K/V are read
    print("attention", "griddepcontrol.wait" in ptx and count > -1 and "ld.global.cg" in ptx[count:]
          and ptx.rfind("st.global", 0, count) < ptx.rfind("bar.sync", 0, count) and "mma" in ptx
          # the MLP's weights in two parts, where a chunk is read (before its count) and in the programs past the
          # chunks
          and ptx.count("cp.async.bulk.prefetch.L2") == 4 * ahead and (not ahead or -1 < asked < count))
sig = dict(Parts="*fp32", Squares="*fp32", Pos="*i64", Cos="*fp32", Sin="*fp32", QNorm="*bf16", KNorm="*bf16", Q="*bf16",
           Keys="*bf16", Values="*bf16", rows="i32", n_total="i32", hidden="i32", eps="fp32",
           **dict.fromkeys(["k_row", "k_head", "k_slot", "v_row", "v_head", "v_slot"], "i32"),
           **dict.fromkeys(["HEADS", "KV_HEADS", "D", "SPLITS", "QK_NORM", "ROPE_SHIFT", "APPEND", "PDL"], "constexpr"))
consts = dict(HEADS=16, KV_HEADS=8, D=128, SPLITS=8, QK_NORM=True, ROPE_SHIFT=0, APPEND=True, PDL=True)
ptx = triton.compile(ASTSource(_rope_append, sig, consts), target=GPUTarget("cuda", 90, 32)).asm["ptx"]
print("rope_append", "griddepcontrol.wait" in ptx)
# the three launches: the split-KV programs ask L2 for nothing; the merge asks for the MLP's weights right after its
# wait, before its loads, where AHEAD (or for nothing)
sig = dict(Q="*bf16", K="*bf16", V="*bf16", Pos="*i64", Acc="*fp32", M="*fp32", L="*fp32", scale="fp32",
           **dict.fromkeys(["q_row", "q_head", "k_row", "k_head", "k_slot", "v_row", "v_head", "v_slot"], "i32"),
           **dict.fromkeys(["GROUP", "GROUP_PAD", "D", "BLOCK_N", "SPLITS", "IEEE", "PDL"], "constexpr"))
consts = dict(GROUP=2, GROUP_PAD=16, D=128, BLOCK_N=64, SPLITS=32, IEEE=False, PDL=True)
ptx = triton.compile(ASTSource(_split_kv, sig, consts), target=GPUTarget("cuda", 90, 32)).asm["ptx"]
print("split_kv", "cp.async.bulk.prefetch.L2" not in ptx and "griddepcontrol.wait" in ptx)
ahead = dict(Ahead1="*bf16", ahead1_bytes="i32", Ahead2="*bf16", ahead2_bytes="i32", ahead_share="i32")
for asks in (True, False):
    sig = dict(Acc="*fp32", M="*fp32", L="*fp32", Out="*bf16", o_row="i32", o_head="i32", **ahead,
               **dict.fromkeys(["HEADS", "D", "SPLITS", "AHEAD", "PDL"], "constexpr"))
    consts = dict(HEADS=16, D=128, SPLITS=32, AHEAD=asks, PDL=True)
    ptx = triton.compile(ASTSource(_merge_ahead, sig, consts), target=GPUTarget("cuda", 90, 32)).asm["ptx"]
    asked, wait = ptx.find("cp.async.bulk.prefetch.L2"), ptx.find("griddepcontrol.wait")
    print("merge", ptx.count("cp.async.bulk.prefetch.L2") == 2 * asks and -1 < wait
          and (not asks or wait < asked < ptx.find("ld.global", wait)))
# fused.tma: the weight tiles copied by the tensor memory accelerator into shared memory after the PDL wait (with the
# input the kernel before wrote), read there by Hopper's wgmma (`_matvec`'s pass through registers and ldmatrix);
# the first tiles asked of L2 before the wait where PREFETCH; packed (gate/up: SwiGLU) and row-major (down: adds)
for product in (dict(NORM=True, OUTPUT=1, SPLITS=1, PACKED=True, PREFETCH=True, Out="*bf16"),
                dict(NORM=False, OUTPUT=3, SPLITS=8, PACKED=False, PREFETCH=False, Out="*fp32")):
    sig = {**ptrs, "X": "*fp32", "Out": product.pop("Out"), "Wdesc": "tensordesc<bf16[64, 128]>",
           **{k: v for k, v in ints.items() if k != "prefetch_ahead"}, "eps": "fp32",
           **dict.fromkeys(["INPUT", "NORM", "OUTPUT", "SPLITS", "BUMP", "ROWS", "BN", "BK", "PACKED", "DOT", "PDL",
                            "STAGES", "PREFETCH", "LAUNCH"], "constexpr")}
    sig = {name: sig[name] for name in _matvec_tma.arg_names}
    consts = dict(INPUT=0, BUMP=False, ROWS=16, BN=64, BK=128, DOT=True, PDL=True, STAGES=3, LAUNCH=1, **product)
    ptx = triton.compile(ASTSource(_matvec_tma, sig, consts), target=GPUTarget("cuda", 90, 32),
                         options=dict(num_warps=8)).asm["ptx"]
    wait, copy, launch = (ptx.find(op) for op in ("griddepcontrol.wait", "cp.async.bulk.tensor",
                                                  "griddepcontrol.launch_dependents"))
    print("tma", wait < copy < launch and "wgmma.mma_async" in ptx[copy:launch]
          and (-1 < ptx.find("cp.async.bulk.prefetch.L2") < wait) == product["PREFETCH"])
"""


@pytest.mark.slow
def test_the_fused_kernels_compile_for_the_h200_with_programmatic_dependent_launch():
    """The interpreter checks the arithmetic on CUDA cores; Triton's compiler, run ahead of time for sm_90 (no GPU
    needed), checks that each kernel builds as a Hopper GPU runs it: bf16 tensor-core products, atomics, PDL's
    waits."""
    printed = compiled_for_the_gpu("import triton\n" + AOT_COMPILE, timeout=900).split()
    assert printed == (["matvec", "True", "order", "True"] * 11 + ["reads", "True", "attention", "True"] * 2
                       + ["rope_append", "True", "split_kv", "True"] + ["merge", "True"] * 2 + ["tma", "True"] * 2)
