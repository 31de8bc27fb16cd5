"""mode=fused's switches: the one place each is declared. A switch turns one technique of the fused kernels on or
off (`fused.pdl=false` for an ablation); the run's labels, `--help`, the run's params and the kernels' options all
derive from these fields. Adding a switch is one field here plus its use in harness/kernels/fused/.

A field's `needs` says what hardware the technique needs: the mode turns it off elsewhere, and the run's `fused` tag
says so. Where each technique applies, and what it measured, is docs/fused-knobs.md.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

HOPPER, GPU = "hopper", "gpu"  # `needs`: an sm_90 GPU or newer; any CUDA GPU (harness/modes/fused.py, as_run)


def switch(default: bool, help: str, needs: str | None = None) -> bool:
    return field(default=default, metadata=dict(help=help, needs=needs))


@dataclass
class FusedConfig:
    """mode=fused's techniques; off for an ablation (`fused.pdl=false`)."""

    pdl: bool = switch(True, "programmatic dependent launch on every kernel", HOPPER)
    split_k: bool = switch(True, "split a product's K where its column blocks alone cannot fill the GPU")
    packed: bool = switch(True, "weights in tile-major order, each program's tiles contiguous (off: row-major)")
    prefetch: bool = switch(False, "each product's programs ask L2 for their first weights before the PDL wait, "
                                   "and for tiles ahead in their loop", HOPPER)
    fold_attention: bool = switch(True, "RoPE, the K/V append and the chunks' merge inside the attention kernel: "
                                        "one launch a layer where its rule says (off: three everywhere)")
    tune: bool = switch(False, "each kind of product's plan chosen at prepare by timing the captured step on the "
                               "GPU at hand (off: the rules' plan)")
    slices: bool = switch(True, "at bs=1 in a narrow model, the large products as whole rows of the weight on CUDA "
                                "cores", GPU)
    weights_ahead: bool = switch(True, "the attention asks L2 for the layer's MLP weights once its K/V are read",
                                 HOPPER)
    tma: bool = switch(True, "weight tiles through the tensor memory accelerator where the rules stream them",
                       HOPPER)


FUSED_SWITCHES = {f"fused.{f.name}": f.default for f in dataclasses.fields(FusedConfig)}  # key: default


def switches_help() -> list[str]:
    """One line a switch, for `--help`: its key, default and what it does."""
    return [f"  fused.{f.name} (default {str(f.default).lower()}): {f.metadata['help']}"
            + (f" [{f.metadata['needs']}]" if f.metadata["needs"] else "") for f in dataclasses.fields(FusedConfig)]

