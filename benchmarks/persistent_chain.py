"""Would one persistent kernel a step beat a launch a product? mode=fused launches five kernels a layer, and each
costs microseconds of ramp and drain whatever it reads (docs/fused.md). A
persistent kernel (the megakernel's design) keeps its programs resident for the whole step and puts a barrier where a
kernel boundary was. This times the two on the same programs, weights and arithmetic: a chain of dependent bs=1
products the size of one of Qwen3-0.6B's (1024 -> 4096 -> 1024, four products and 33.6 MB a layer, LAYERS layers),
each program multiplying a block of whole rows, loaded before it waits for the product before (as fused.slices do):
- "launches, PDL": one kernel a product, captured in one CUDA graph, each letting the next launch once its sums are
  done and waiting for the one before at PDL's wait (mode=fused's boundary);
- "launches": the same without PDL; and with PDL, four times the programs on four warps (several an SM, as the
  step's slices: the next kernel's programs can start beside them);
- "persistent": one kernel, whose programs wait at a grid barrier (an atomic count, acquire and release at the
  GPU's scope) where a kernel would end; with its weights loaded before the barrier, or after it.
Every program of the persistent kernel must be resident at once, or the barrier would never open: PROGRAMS is one an
SM at most, and a barrier that spins past its limit marks the run as failed rather than hanging the GPU. On a CUDA GPU:
    python benchmarks/persistent_chain.py [LAYERS]
Prints each variant's µs a chain and a product, its rate on the weights, its ratio to the first with a 95% interval
(rounds paired), and its error against the chain in fp32.
"""
from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from harness.clock import block_ms
from harness.measure.stats import paired_ratio_interval

HIDDEN, WIDE = 1024, 4096  # Qwen3-0.6B's width; a product of 8.4 MB each way, as its QKV (8.4) and gate/up (12.6)
LAYERS = 28
PROGRAMS = 128  # fewer than an H200's (and H100's) 132 SMs: all resident at once, whatever a program holds
WARPS = 8
SPIN_LIMIT = 1 << 20  # polls of the count before a barrier gives up: about a second, where a product takes µs
ROUNDS, REPLAYS = 12, 20


@triton.jit
def _rows_load(W, block, K: tl.constexpr, R: tl.constexpr):
    """The R whole rows of W [n, K] of this program's block (bf16, 16-byte loads along K)."""
    rows = block * R + tl.arange(0, R)
    return tl.load(W + rows[:, None] * K + tl.arange(0, K)[None, :])


@triton.jit
def _rows_times(w, X, K: tl.constexpr):
    """w [R, K] times the fp32 vector X [K], read from L2 (another program wrote it: never a stale L1 line)."""
    x = tl.load(X + tl.arange(0, K), cache_modifier=".cg")
    return tl.sum(w.to(tl.float32) * x[None, :], axis=1)


@triton.jit
def _product_launch(W, X, Y, K: tl.constexpr, R: tl.constexpr, PDL: tl.constexpr):
    """One product as its own kernel: its rows loaded, then PDL's wait for the kernel before; the next kernel let
    launch once the sums are done, before they are stored."""
    block = tl.program_id(0)
    w = _rows_load(W, block, K, R)
    if PDL:
        tl.extra.cuda.gdc_wait()
    y = _rows_times(w, X, K)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    tl.store(Y + block * R + tl.arange(0, R), y)


@triton.jit
def _barrier(Count, target, spin_limit, Failed):
    """Wait until `target` arrivals are counted (acquire: what they stored before arriving is visible after), polling
    at most spin_limit times; past that, mark Failed and go on (wrong sums, never a GPU hung)."""
    seen = tl.atomic_add(Count, 0, sem="acquire", scope="gpu")
    spins = 0
    while (seen < target) & (spins < spin_limit):
        seen = tl.atomic_add(Count, 0, sem="acquire", scope="gpu")
        spins += 1
    if seen < target:
        tl.store(Failed, 1)
    tl.debug_barrier()  # every thread of the program past the wait before any reads the input


@triton.jit
def _arrive(Count):
    """Count this program in, once all its threads have stored (release: those stores visible to who acquires)."""
    tl.debug_barrier()
    tl.atomic_add(Count, 1, sem="release", scope="gpu")


@triton.jit
def _persistent_product(W, X, Y, Count, target, spin_limit, Failed, block, K: tl.constexpr, R: tl.constexpr,
                        EARLY: tl.constexpr):
    """One product of the chain inside the persistent kernel: its rows loaded before the barrier (EARLY) or after."""
    if EARLY:
        w = _rows_load(W, block, K, R)
    _barrier(Count, target, spin_limit, Failed)
    if not EARLY:
        w = _rows_load(W, block, K, R)
    tl.store(Y + block * R + tl.arange(0, R), _rows_times(w, X, K))
    _arrive(Count)


@triton.jit
def _chain_persistent(Ups, Downs, Up, Down, Count, Failed, layers, programs, spin_limit, HIDDEN: tl.constexpr,
                      WIDE: tl.constexpr, R_UP: tl.constexpr, R_DOWN: tl.constexpr, EARLY: tl.constexpr):
    """The whole chain in one kernel: layer after layer, two pairs of products (Down -> Up -> Down), a barrier
    between each product and the next where `programs` programs (this grid's) have all arrived."""
    block = tl.program_id(0)
    for pair in range(2 * layers):
        up, down = Ups + pair * (WIDE * HIDDEN), Downs + pair * (HIDDEN * WIDE)  # (int32: 500 layers of 1024 x 4096)
        _persistent_product(up, Down, Up, Count, 2 * pair * programs, spin_limit, Failed, block, HIDDEN, R_UP, EARLY)
        _persistent_product(down, Up, Down, Count, (2 * pair + 1) * programs, spin_limit, Failed, block, WIDE, R_DOWN,
                            EARLY)


@dataclass
class Chain:
    """A chain's weights (each pair's [WIDE, HIDDEN] and [HIDDEN, WIDE] products, bf16), its input, and the buffers
    every variant uses: Down holds the input at the start and the chain's output at the end."""

    ups: torch.Tensor
    downs: torch.Tensor
    x: torch.Tensor
    up: torch.Tensor
    down: torch.Tensor
    count: torch.Tensor
    failed: torch.Tensor

    @classmethod
    def random(cls, layers: int, hidden: int, wide: int, device: str) -> Chain:
        g = torch.Generator(device).manual_seed(0)
        ups = torch.randn(2 * layers, wide, hidden, generator=g, device=device) / hidden ** 0.5
        downs = torch.randn(2 * layers, hidden, wide, generator=g, device=device) / wide ** 0.5
        zeros = lambda n, dtype=torch.float32: torch.zeros(n, device=device, dtype=dtype)
        return cls(ups.bfloat16(), downs.bfloat16(), torch.randn(hidden, generator=g, device=device), zeros(wide),
                   zeros(hidden), zeros(1, torch.int32), zeros(1, torch.int32))

    def fp32(self) -> torch.Tensor:
        """The chain's output computed in fp32 from the same bf16 weights."""
        y = self.x
        for up, down in zip(self.ups.float(), self.downs.float()):
            y = down @ (up @ y)
        return y

    def start(self) -> None:
        """The input into Down, the barrier's count to zero (inside a captured graph too)."""
        self.down.copy_(self.x)
        self.count.zero_()


def run_launches(chain: Chain, programs: int, pdl: bool, warps: int = WARPS) -> None:
    """The chain as a launch a product."""
    hidden, wide = chain.down.numel(), chain.up.numel()
    options = dict(PDL=True, launch_pdl=True) if pdl else dict(PDL=False)
    chain.start()
    for up, down in zip(chain.ups, chain.downs):
        _product_launch[(programs,)](up, chain.down, chain.up, K=hidden, R=wide // programs, num_warps=warps,
                                     **options)
        _product_launch[(programs,)](down, chain.up, chain.down, K=wide, R=hidden // programs, num_warps=warps,
                                     **options)


def run_persistent(chain: Chain, programs: int, early: bool, spin_limit: int = SPIN_LIMIT,
                   counted: int | None = None) -> None:
    """The chain as one persistent kernel of `programs` programs, whose barriers wait for `counted` (those programs
    unless told: a test tells more, to see a barrier give up)."""
    hidden, wide = chain.down.numel(), chain.up.numel()
    chain.start()
    _chain_persistent[(programs,)](chain.ups, chain.downs, chain.up, chain.down, chain.count, chain.failed,
                                   chain.ups.shape[0] // 2, counted or programs, spin_limit, HIDDEN=hidden, WIDE=wide,
                                   R_UP=wide // programs, R_DOWN=hidden // programs, EARLY=early, num_warps=WARPS)


VARIANTS = [("launches, PDL (mode=fused's boundary)", lambda c: run_launches(c, PROGRAMS, True)),
            ("launches, no PDL", lambda c: run_launches(c, PROGRAMS, False)),
            # a quarter of the rows a program, as mode=fused's slices (several programs an SM, the next kernel's beside)
            ("launches, PDL, 4x the programs on 4 warps", lambda c: run_launches(c, 4 * PROGRAMS, True, 4)),
            ("persistent, rows loaded before each barrier", lambda c: run_persistent(c, PROGRAMS, True)),
            ("persistent, rows loaded after each barrier", lambda c: run_persistent(c, PROGRAMS, False))]


def persistent_ptx(early: bool, hidden: int = HIDDEN, wide: int = WIDE, programs: int = PROGRAMS) -> str:
    """The persistent kernel's PTX for sm_90 (Triton's ahead-of-time compiler: no GPU needed), its pointers aligned
    as a torch allocation is: where its weight loads fall against the barrier's release and acquire."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    pointers = dict(Ups="*bf16", Downs="*bf16", Up="*fp32", Down="*fp32", Count="*i32", Failed="*i32")
    constants = dict(HIDDEN=hidden, WIDE=wide, R_UP=wide // programs, R_DOWN=hidden // programs, EARLY=early)
    signature = {**pointers, **dict.fromkeys(("layers", "programs", "spin_limit"), "i32"),
                 **dict.fromkeys(constants, "constexpr")}
    names = _chain_persistent.arg_names
    attrs = {(names.index(name),): [["tt.divisibility", 16]] for name in pointers}
    source = ASTSource(_chain_persistent, signature, constants, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=WARPS)).asm["ptx"]


def captured(chain: Chain, run) -> torch.cuda.CUDAGraph:
    """`run` warmed up on a side stream, then captured in one CUDA graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run(chain)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run(chain)
    return graph


def main(layers: int) -> None:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if sms < PROGRAMS:  # (a MIG slice, a smaller GPU): the persistent kernel's programs would not all be resident
        sys.exit(f"persistent_chain: this GPU has {sms} SMs; the persistent kernel needs {PROGRAMS}, one an SM")
    chain = Chain.random(layers, HIDDEN, WIDE, "cuda")
    reference, weight_bytes = chain.fp32(), (chain.ups.numel() + chain.downs.numel()) * 2
    graphs, errors = [], []
    for _, run in VARIANTS:
        graphs.append(captured(chain, run))
        chain.down.zero_()
        graphs[-1].replay()
        errors.append(float((chain.down - reference).abs().max() / reference.abs().max()))
        if int(chain.failed.item()):
            sys.exit("persistent_chain: a barrier gave up: the programs were not all resident at once")
    times: list[list[float]] = [[] for _ in VARIANTS]
    for round_ in range(ROUNDS):
        for i in (range(len(VARIANTS)) if round_ % 2 == 0 else reversed(range(len(VARIANTS)))):
            times[i].append(block_ms(graphs[i].replay, REPLAYS))
    if int(chain.failed.item()):
        sys.exit("persistent_chain: a barrier gave up while timed: these times are not valid")
    print(f"{layers} layers, {4 * layers} products, {weight_bytes / 1e6:.0f} MB; {PROGRAMS} programs of {WARPS} warps;"
          f" {ROUNDS} rounds of {REPLAYS} chains a variant, alternating")
    print("| variant | µs a chain | µs a product | TB/s on the weights | vs first (95% interval) | max error / max |")
    print("|---|---:|---:|---:|---:|---:|")
    for (name, _), spans, error in zip(VARIANTS, times, errors):
        ms = statistics.median(spans)
        ratio, low, high = paired_ratio_interval([[t] for t in times[0]], [[t] for t in spans])
        print(f"| {name} | {ms * 1e3:.1f} | {ms * 1e3 / (4 * layers):.2f} | {weight_bytes / ms / 1e9:.2f} | "
              f"{ratio:.4f} ({low:.4f}–{high:.4f}) | {error:.1e} |")


if __name__ == "__main__":
    main(int(sys.argv[1]) if sys.argv[1:] else LAYERS)
