"""mode=fused's kernels, as a library: a dense Llama or Qwen3 decode step in the harness's own Triton (and Gluon)
kernels, captured in one CUDA graph by harness/modes/fused.py.

One part a module (none imported here, so that importing the package imports no Triton):
- `decoder.py`: `FusedDecoder`, the weights packed, the buffers and `step()`, read top to bottom.
- `products.py`: the matrix-vector products' kernels (`_matvec`, `_matvec_tma`) and their launch.
- `copies_first.py`: the Gluon kernel of a bs=1 product whose TMA copies start before its PDL wait.
- `attention.py`: the attention's kernels (folded, or three launches) and the rules that size its grid.
- `greedy.py`: the argmax fed to the next step inside a graph of several steps.
- `pdl.py`: the device functions every kernel shares (programmatic dependent launch, L2 bulk prefetch).
- `plan.py`: `Product`, `PlanChoice` and the rules that choose a product's tiles, splits, warps, slices and TMA.
- `knobs.py`: `Knobs`, every number the plan and launches use, one frozen dataclass handed to the planner.
- `tune.py`: fused.tune, each kind of product's plan chosen by timing the captured step.

The run's switches (`fused.*`) are declared once, in the run schema's FusedConfig (harness/config/fused.py); the
mode hands them to the decoder as they apply on the device. docs/fused-knobs.md has each knob's evidence.
"""
