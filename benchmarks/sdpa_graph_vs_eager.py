"""Does SDPA with `enable_gqa` and a boolean mask (attn=sdpa-gqa's decode call) give the same output replayed
from a CUDA graph as in eager, per SDPA backend, at long caches? Prints the kernels each backend launches.
    python benchmarks/sdpa_graph_vs_eager.py        (a GPU; results in docs/checks.md)"""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

BACKENDS = {"default": None, "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH,
            "cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}
SHAPES = [(1, 33024, 32800), (1, 16640, 16400), (1, 4352, 4200), (8, 33024, 32800), (1, 1280, 1100)]


def attend(q, k, v, mask, backend):
    if backend is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def replayed(fn):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up off the capture stream, as PyTorch's capture wants
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    graph.replay()
    torch.cuda.synchronize()
    return out


def kernels(fn) -> list[str]:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sorted({e.name[:60] for e in prof.events() if e.device_type.name == "CUDA"})


torch.manual_seed(0)
for bs, slots, valid in SHAPES:
    q = torch.randn(bs, 16, 1, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(bs, 8, slots, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    mask = torch.zeros(bs, 1, 1, slots, dtype=torch.bool, device="cuda")
    mask[..., :valid] = True
    for name, backend in BACKENDS.items():
        fn = lambda: attend(q, k, v, mask, backend)  # noqa: E731
        try:
            first, second = fn(), fn()
            graph_out = replayed(fn)
        except RuntimeError as err:
            print(f"bs={bs} slots={slots} {name:9s} refused: {str(err)[:80]}")
            continue
        print(f"bs={bs} slots={slots} {name:9s} eager-eager {float((first - second).abs().max()):.3g} "
              f"graph-eager {float((graph_out - first).abs().max()):.3g} kernels {kernels(fn)}")
