"""The mode registry: every decode mode by name, with what the rest of the harness must know of it.

Importing this module imports no torch: config validation, labels and reports ask it about modes
without loading a mode's code. A job imports the mode's class (`target`) when it runs. Adding a
mode is one module under harness/modes/ plus one `register(ModeSpec(...))` line below.
"""
from __future__ import annotations

from dataclasses import dataclass

from harness.registry import Registry, load


@dataclass(frozen=True)
class ModeSpec:
    name: str
    target: str  # "module:Class" of its DecodeMode, imported only when a job runs it
    graph_steps: bool = False  # its own graphs can hold several decode steps (graph_steps > 1)
    compile_modes: tuple[str, ...] = ()  # torch.compile modes it takes; the first is its default
    attention: str | None = None  # the attention backend its own kernels compute decode attention as, if any

    def mode_class(self) -> type:
        return load(self.target)


MODES = Registry("mode")
register, spec = MODES.register, MODES.spec


register(ModeSpec("eager", "harness.modes.eager:EagerMode"))
register(ModeSpec("graphed", "harness.modes.graphed:GraphedMode", graph_steps=True))
register(ModeSpec("bucketed", "harness.modes.bucketed:BucketedMode", graph_steps=True))
register(ModeSpec("compiled-nograph", "harness.modes.compiled:CompiledNoGraphMode",
                  compile_modes=("default", "max-autotune-no-cudagraphs")))
register(ModeSpec("compiled", "harness.modes.compiled:CompiledMode",
                  compile_modes=("reduce-overhead", "max-autotune")))
register(ModeSpec("fused", "harness.modes.fused:FusedMode", graph_steps=True, attention="triton-decode"))
