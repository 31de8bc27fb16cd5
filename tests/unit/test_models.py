"""The models (harness/models.py): seeded weights, checkpoints, fused projections."""
from __future__ import annotations

import copy as copy_module

import pytest
import torch

from harness import models
from harness.errors import ConfigError
from harness.measure.job import measure, seeded_prompt
from harness.measure.timing import advance
from harness.modes.eager import EagerStepper
from tests.support import FAMILIES, FAST, run_config


@pytest.mark.usefixtures("fresh_model_cache")
def test_seeded_random_weights_are_reproducible():
    cfg = run_config(*FAST, "device=cpu")
    a = models._load(cfg.model, torch.float32, "sdpa", torch.device("cpu"), seed=3)[0]
    b = models._load(cfg.model, torch.float32, "sdpa", torch.device("cpu"), seed=3)[0]
    c = models._load(cfg.model, torch.float32, "sdpa", torch.device("cpu"), seed=4)[0]
    wa, wb, wc = (m.model.layers[0].mlp.up_proj.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)


@pytest.mark.usefixtures("fresh_model_cache")
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.slow
def test_a_local_checkpoint_loads_as_safetensors(tmp_path, family):
    cfg = run_config(*FAST, "device=cpu", "dtype=fp32", *FAMILIES[family])
    assert cfg.model.model_type == family
    reference = models._load(cfg.model, torch.float32, "sdpa", torch.device("cpu"), seed=11)[0]
    reference.save_pretrained(tmp_path / "ckpt", safe_serialization=True)
    assert list((tmp_path / "ckpt").glob("*.safetensors"))

    loaded = run_config(*FAST, "device=cpu", "dtype=fp32", *FAMILIES[family], f"model.weights={tmp_path / 'ckpt'}")
    result = measure(loaded)
    assert result.weights == "checkpoint" and result.failure is None
    assert result.weights_source == str((tmp_path / "ckpt").resolve())

    model = models.get_model(loaded.model, "fp32", "sdpa", torch.device("cpu"), 0).model
    prompt = seeded_prompt(2, 8, model.config.vocab_size, 0, torch.device("cpu"))
    with torch.inference_mode():
        assert torch.equal(model(prompt).logits, reference(prompt).logits)


@pytest.mark.usefixtures("fresh_model_cache")
def test_building_a_model_leaves_its_preset_as_composed():
    # transformers writes rope_theta into the rope_scaling dict its config is given: a preset that shared the dict
    # changed under the run (an A/B's arms then "differed" in a key that neither arm set)
    cfg = run_config(*FAST, "device=cpu", "dtype=fp32", *FAMILIES["llama"])
    before = copy_module.deepcopy(cfg.model.extra)
    assert "rope_scaling" in before
    models._load(cfg.model, torch.float32, "sdpa", torch.device("cpu"), seed=0)
    assert cfg.model.extra == before


@pytest.mark.usefixtures("fresh_model_cache")
def test_a_checkpoint_of_another_architecture_is_refused_not_mislabelled(tmp_path):
    tiny = run_config(*FAST, "device=cpu", "dtype=fp32")
    models._load(tiny.model, torch.float32, "sdpa", torch.device("cpu"), seed=0)[0].save_pretrained(tmp_path / "ckpt")
    as_qwen = run_config("device=cpu", f"model.weights={tmp_path / 'ckpt'}")  # model=qwen3-0.6b, 28 layers
    with pytest.raises(ConfigError, match=r"is not a qwen3-0.6b: vocab_size=1024 \(model=qwen3-0.6b has 151936\)"
                                          r".*num_hidden_layers=2 \(model=qwen3-0.6b has 28\)"):
        measure(as_qwen)


@pytest.mark.usefixtures("fresh_model_cache")
def test_a_checkpoint_without_safetensors_is_refused(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "pytorch_model.bin").write_bytes(b"pickle data is never loaded")
    cfg = run_config(*FAST, "device=cpu", f"model.weights={tmp_path / 'ckpt'}")
    with pytest.raises(ConfigError, match="holds no \\*.safetensors file"):
        measure(cfg)


CPU = torch.device("cpu")


@pytest.mark.usefixtures("fresh_model_cache")
@pytest.mark.parametrize("dtype, tol", [("fp32", 1e-4), ("bf16", 0.1)])
def test_fused_projections_match_the_unfused_model(dtype, tol):
    plain_cfg = run_config(*FAST, "device=cpu", f"dtype={dtype}").model
    fused_cfg = run_config(*FAST, "device=cpu", f"dtype={dtype}", "model.fuse_projections=true").model
    plain = models._load(plain_cfg, models.DTYPES[dtype], "sdpa", CPU, seed=0)[0]
    fused = models._load(fused_cfg, models.DTYPES[dtype], "sdpa", CPU, seed=0)[0]
    assert models.fuse_projections(fused) == 2 * 2  # q/k/v and gate/up in each of 2 layers
    attn = fused.model.layers[0].self_attn
    assert attn.fused_q_k_v.fused.out_features == attn.config.num_attention_heads * 16 + 2 * 2 * 16
    prompt = seeded_prompt(2, 8, plain.config.vocab_size, 0, CPU)
    with torch.inference_mode():
        a, b = plain(prompt).logits.float(), fused(prompt).logits.float()
    assert torch.allclose(a, b, atol=tol, rtol=0), (a - b).abs().max()
    n_linear = lambda m: sum(isinstance(x, torch.nn.Linear) for x in m.modules())  # noqa: E731
    assert n_linear(fused) == n_linear(plain) - 3 * 2  # 5 linears became 2, in each layer


@pytest.mark.usefixtures("fresh_model_cache")
def test_fused_model_decodes_the_same_tokens():
    cfg = run_config(*FAST, "device=cpu", "dtype=fp32", "bs=2", "model.tie_word_embeddings=false").model
    plain = models._load(cfg, torch.float32, "sdpa", CPU, seed=0)[0]
    fused = models._load(cfg, torch.float32, "sdpa", CPU, seed=0)[0]
    models.fuse_projections(fused)
    prompt = seeded_prompt(2, 8, plain.config.vocab_size, 0, CPU)
    with torch.inference_mode():
        a_stepper, b_stepper = EagerStepper(plain, prompt, 64), EagerStepper(fused, prompt, 64)
        tokens = []
        for _ in range(12):  # free-running: each feeds its own argmax
            a, b = advance(a_stepper), advance(b_stepper)
            assert torch.allclose(a, b, atol=1e-4, rtol=0), (a - b).abs().max()
            tokens.append((a_stepper.input_ids.clone(), b_stepper.input_ids.clone()))
    assert all(torch.equal(x, y) for x, y in tokens) and len({int(x[0]) for x, _ in tokens}) > 1


@pytest.mark.usefixtures("fresh_model_cache")
@pytest.mark.slow
def test_a_random_tiny_model_decodes_a_varied_sequence():
    """Seeded random weights at 2/sqrt(hidden): greedy decode moves on (at std 0.02 it repeated every token)."""
    result = measure(run_config(*FAST, "device=cpu", "dtype=fp32", "bs=2", "decode_tokens=32"))
    assert result.metrics["token_repeat_fraction"] <= 0.1
    assert result.weights_source == "seed=0 std=0.25"
