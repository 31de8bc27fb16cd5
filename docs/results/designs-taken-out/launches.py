"""Every launch of one fused step, as the GPU's plan makes it (Triton's interpreter flag off for planning, kernels not
run): this code's decoder against f561a71's, on real model shapes (two layers). From the repository root:
    TRITON_INTERPRET=1 PYTHONPATH=. python docs/results/designs-taken-out/launches.py"""
import importlib.util, subprocess, sys, tempfile
from pathlib import Path

import torch
from harness.cli.precheck import compose_single_run
from harness.measure.job import seeded_prompt
from harness.models import get_model
from harness.modes.base import Stepper
from harness.kernels import fused_decode as new
from triton.tools.tensor_descriptor import TensorDescriptor
OLD = Path(tempfile.mkdtemp()) / "old_fused_decode.py"  # f561a71's, the commit before the designs went
OLD.write_text(subprocess.run(["git", "show", "f561a71:harness/kernels/fused_decode.py"], capture_output=True,
                              text=True, check=True).stdout)
spec = importlib.util.spec_from_file_location("old_fused_decode", OLD)
old = importlib.util.module_from_spec(spec); sys.modules["old_fused_decode"] = old; spec.loader.exec_module(old)
KERNELS = ["_matvec", "_matvec_tma", "_attention", "_rope_append", "_split_kv", "_merge"]

def describe(x, names):
    if isinstance(x, torch.Tensor):
        return ("tensor", names.get(x.data_ptr(), "?"), tuple(x.shape), x.stride(), str(x.dtype))
    if isinstance(x, TensorDescriptor):
        return ("desc", tuple(x.shape), tuple(x.strides), tuple(x.block_shape))
    return x

class Recorder:
    def __init__(self, name, log): self.name, self.log = name, log
    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.log.append((self.name, grid, args, kwargs))
        return launch

def record(module, model, prompt, cfg, options):
    run = Stepper(model, prompt, cfg.cache_len)
    decoder = module.FusedDecoder(model, run.cache, run.static_ids, module.FusedOptions(**options))
    log = []
    for k in KERNELS:
        setattr(module, k, Recorder(k, log))
    decoder.step()
    # name each buffer by the decoder attribute, layer weight or cache tensor that holds it, so that two decoders compare
    names = {}
    for attr, value in vars(decoder).items():
        if isinstance(value, torch.Tensor):
            names[value.data_ptr()] = attr
    for i, (layer, kv) in enumerate(zip(decoder.layers, run.cache.layers)):
        for field in ("attn_norm", "q_norm", "k_norm", "mlp_norm"):
            t = getattr(layer, field)
            if t is not None: names.setdefault(t.data_ptr(), f"L{i}.{field}")
        for kind in ("qkv", "o", "gate_up", "down"):
            names[getattr(layer, kind).weight.data_ptr()] = f"L{i}.{kind}"
        names[kv.keys.data_ptr()], names[kv.values.data_ptr()] = f"L{i}.keys", f"L{i}.values"
        names[kv.cumulative_length.data_ptr()] = f"L{i}.position"
    names[decoder.lm_head.weight.data_ptr()] = "lm_head"
    return [(n, g, tuple(describe(a, names) for a in args), {k: describe(v, names) for k, v in kw.items()})
            for n, g, args, kw in log], decoder.kernels_per_step()

for overrides in (["model=llama-3.2-1b", "bs=1", "context_len=32", "cache_len=16384"],
                  ["model=qwen3-0.6b", "bs=1", "context_len=1024", "cache_len=1280"],
                  ["model=qwen3-0.6b", "bs=8", "context_len=64", "cache_len=512"],
                  ["model=qwen3-4b", "bs=1", "context_len=32", "cache_len=256"],
                  ["model=llama-3.2-1b", "bs=32", "context_len=32", "cache_len=256"]):
    cfg = compose_single_run(["mode=fused", *overrides, "model.num_hidden_layers=2"])
    model = get_model(cfg.model, cfg.dtype.value, cfg.attn, torch.device("cpu"), cfg.seed).model
    prompt = seeded_prompt(cfg.bs, cfg.context_len, model.config.vocab_size, cfg.seed, torch.device("cpu"))
    for m in (new, old):
        m.interpreted = lambda: False  # the GPU's plan
    for options in ({}, {"fold_attention": False}, {"split_k": False, "packed": False, "tma": False},
                    {"prefetch": True}, {"weights_ahead": False, "slices": False}):
        with torch.inference_mode():
            a, ka = record(new, model, prompt, cfg, options)
            b, kb = record(old, model, prompt, cfg, options)
        assert ka == kb == len(a), (ka, kb, len(a))
        assert a == b, next((i, x, y) for i, (x, y) in enumerate(zip(a, b)) if x != y)
        print(" ".join(overrides), options, f"{len(a)} launches, identical")
