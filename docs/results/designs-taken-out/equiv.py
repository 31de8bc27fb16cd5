"""This code's FusedDecoder against f561a71's in Triton's interpreter on tiny models, both families, the attention
folded and not: logits and caches bit for bit, three steps at bs=2. From the repository root:
    TRITON_INTERPRET=1 PYTHONPATH=. python docs/results/designs-taken-out/equiv.py"""
import importlib.util, subprocess, sys, tempfile
from pathlib import Path

import torch
from harness.kernels import fused_decode as new
OLD = Path(tempfile.mkdtemp()) / "old_fused_decode.py"  # f561a71's, the commit before the designs went
OLD.write_text(subprocess.run(["git", "show", "f561a71:harness/kernels/fused_decode.py"], capture_output=True,
                              text=True, check=True).stdout)
spec = importlib.util.spec_from_file_location("old_fused_decode", OLD)
old = importlib.util.module_from_spec(spec); sys.modules["old_fused_decode"] = old; spec.loader.exec_module(old)
from tests.test_fused import tiny_model_and_prompt, LLAMA
from harness.modes.base import Stepper
for family in [(), LLAMA]:
    for fold in (True, False):
        cfg, model, prompt = tiny_model_and_prompt(*family, "bs=2")
        a, b = Stepper(model, prompt, cfg.cache_len), Stepper(model, prompt, cfg.cache_len)
        da = new.FusedDecoder(model, a.cache, a.static_ids, new.FusedOptions(pdl=False, fold_attention=fold))
        db = old.FusedDecoder(model, b.cache, b.static_ids, old.FusedOptions(pdl=False, fold_attention=fold))
        with torch.inference_mode():
            for s in range(3):
                x, y = da.step(), db.step()
                assert torch.equal(x, y), (family, fold, s)
                nxt = x.argmax(-1, keepdim=True)
                a.static_ids.copy_(nxt); b.static_ids.copy_(nxt)
        for la, lb in zip(a.cache.layers, b.cache.layers):
            assert torch.equal(la.keys, lb.keys) and torch.equal(la.values, lb.values)
        print(family and "llama" or "qwen3", "fold" if fold else "unfolded", "identical logits and caches, 3 steps, bs=2",
              da.kernels_per_step(), db.kernels_per_step(), da.products().keys() == db.products().keys())
