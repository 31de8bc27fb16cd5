"""This code's FusedDecoder against f561a71's (gpu/old_fused_decode.py) on the GPU, launched directly (PDL on, the
GPU's plan), fed the same tokens from one prefilled context: the largest logit difference between the two, beside
the largest between two decoders of this code (split-K's atomic adds make neither bitwise), and the greedy tokens."""
import importlib.util
import sys

import torch

sys.path.insert(0, "benchmarks")
from fused_kernels import fused_model_and_prompt  # noqa: E402
from harness.kernels import fused_decode as new  # noqa: E402
from harness.modes.base import Stepper  # noqa: E402

spec = importlib.util.spec_from_file_location("old_fused_decode", "gpu/old_fused_decode.py")
old = importlib.util.module_from_spec(spec)
sys.modules["old_fused_decode"] = old
spec.loader.exec_module(old)
cfg, model, prompt = fused_model_and_prompt(sys.argv[1:])
runs = [Stepper(model, prompt, cfg.cache_len) for _ in range(3)]
decoders = [module.FusedDecoder(model, run.cache, run.static_ids, module.FusedOptions())
            for module, run in zip((new, new, old), runs)]
apart_new = apart_old = 0.0
same_tokens = True
with torch.inference_mode():
    for step in range(8):
        a, a2, b = (d.step().clone() for d in decoders)
        apart_new, apart_old = max(apart_new, (a - a2).abs().max().item()), max(apart_old, (a - b).abs().max().item())
        same_tokens &= bool(torch.equal(a.argmax(-1), b.argmax(-1)))
        for run in runs:
            run.static_ids.copy_(a.argmax(-1, keepdim=True))
    torch.cuda.synchronize()
plans = ["; ".join([*(f"{k}: {p}" for k, p in d.products().items()), d.attention_plan()]) for d in decoders]
print(f"{cfg.label} | 8 steps: max |logit diff| this code vs this code {apart_new:.3g}, vs f561a71 {apart_old:.3g}; "
      f"greedy tokens the same: {same_tokens}; kernels {decoders[0].kernels_per_step()} vs "
      f"{decoders[2].kernels_per_step()}; plans the same: {plans[0] == plans[2]}")
