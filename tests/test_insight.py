"""Where the time goes, on CPU: byte and FLOP counts by hand, the report on a real tiny sweep, a real mlflow server."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from harness.config.labels import run_variant
from harness.analysis import report
from harness.analysis.report import table_markdown
from harness.measure.roofline import floor, implementation_bytes, kv_read_factor, slots_read, step_cost
from harness.analysis.summary import speedups
from tests.support import run_config

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=1024, tie_word_embeddings=True)
QWEN = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
            num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True)


def parameters(model_name: str) -> int:
    """The real parameter count, from the architecture built on the meta device (no memory)."""
    m = run_config(f"model={model_name}").model
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(m.model_type, **m.architecture()))
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name, arch", [("tiny", TINY), ("qwen3-0.6b", QWEN)])
def test_weight_bytes_are_the_parameters_read_once(name, arch):
    # every parameter once (the tied table once, by lm_head) plus the bs embedding rows looked up
    for bs in (1, 8):
        assert step_cost(arch, bs, 256, 2)["weight_bytes"] == 2 * (parameters(name) + bs * arch["hidden_size"])


def test_tiny_counts_by_hand():
    c = step_cost(TINY, bs=2, valid_slots=64, dtype_bytes=2)
    matmul = 2 * (64 * (64 + 2 * 32) + 64 * 64 + 3 * 64 * 128) + 1024 * 64  # 2 layers + lm_head
    assert c["step_flops"] == 2 * 2 * matmul + 2 * 4 * 2 * 4 * 16 * 64
    kv = 2 * 2 * 2 * 2 * 16 * (64 + 1) * 2  # K and V x layers x bs x kv_heads x head_dim x (valid + new) x bytes
    assert c["kv_bytes"] == kv
    assert c["activation_bytes"] == 2 * (2 * 2 * (10 * 64 + 3 * 128 + 2 * (64 + 64)) + 2 * 2 * 1024)
    assert c["step_bytes"] == c["weight_bytes"] + c["kv_bytes"] + c["activation_bytes"]


def test_qwen3_useful_bytes_by_hand_at_bs1_context_256():
    """qwen3-0.6b: hidden 1024, MLP 3072, 28 layers, 16 q heads and 8 KV heads of 128, vocab 151936, tied."""
    c = step_cost(QWEN, bs=1, valid_slots=256, dtype_bytes=2)
    per_layer = 1024 * 2048 + 2 * 1024 * 1024 + 2048 * 1024 + 3 * 1024 * 3072  # q, k and v, o, gate/up/down
    matmul = 28 * per_layer + 151936 * 1024  # + lm_head (the tied table, read once)
    assert matmul == 595_984_384
    weights = matmul + 28 * (2 * 1024 + 2 * 128) + 1024 + 1024  # norms, final norm, one embedding row
    assert c["weight_bytes"] == 2 * weights == 1_192_101_888
    assert c["kv_bytes"] == 2 * 28 * 8 * 128 * (256 + 1) * 2 == 29_474_816  # 256 read, the new token written
    assert c["activation_bytes"] == 2 * (28 * (10 * 1024 + 3 * 3072 + 2 * (2048 + 2048)) + 2 * 151936) == 2_156_032
    assert c["step_bytes"] == 1_223_732_736
    f = floor(c, {"copy_bytes_per_s": 4.25e12, "bf16_flops_per_s": 990e12})
    assert f["floor_ms"] == f["floor_memory_ms"] == pytest.approx(1_223_732_736 / 4.25e12 * 1e3)


def test_the_issue_floor_at_bs8_context_16384_is_3_8_ms():
    f = floor(step_cost(QWEN, bs=8, valid_slots=16384, dtype_bytes=2), {"copy_bytes_per_s": 4.25e12,
                                                                      "bf16_flops_per_s": 990e12})
    assert 3.7 < f["floor_ms"] < 3.9  # 1.19 GB of weights + 15 GB of K/V


def test_what_an_implementation_reads_against_what_is_useful():
    steps = range(1034, 1034 + 128)  # context 1024 + warm-up 10, then 128 timed steps
    useful = step_cost(QWEN, 8, 1034 + 64.5, 2)["step_bytes"]
    sdpa, gqa, flex = (implementation_bytes(QWEN, 8, attn, 16384, steps, 2) for attn in ("sdpa", "sdpa-gqa", "flex"))
    per_slot = 2 * 28 * 8 * 128 * 8 * 2  # K and V of 8 rows, bf16
    assert sdpa - gqa == per_slot * 16384 * 4  # repeat_kv: 1 + 2 x 2 reads of every slot instead of 1
    assert slots_read("flex", 16384, steps) == sum(-(-(p + 1) // 128) * 128 for p in steps) / 128
    assert 1152 <= slots_read("flex", 16384, steps) <= 1280  # whole 128-slot blocks of the valid prefix
    assert useful < flex < gqa < sdpa
    assert kv_read_factor(1, "sdpa") == 1 and kv_read_factor(2, "eager") == 5 and kv_read_factor(2, "flex") == 1
    assert slots_read("triton-decode", 16384, steps) == 1034 + 64.5 and kv_read_factor(2, "triton-decode") == 1
    triton = implementation_bytes(QWEN, 8, "triton-decode", 16384, steps, 2)
    assert triton < flex and triton == pytest.approx(useful, rel=1e-3)  # the valid slots, each read once


def test_variants_get_their_own_columns_against_the_plain_eager_baseline():
    params = {"mode": "compiled", "graph_steps": "1", "model.fuse_projections": "True", "attn": "sdpa-gqa",
              "compile_mode": "max-autotune"}  # as MLflow logs them
    assert run_variant(params) == "compiled max-autotune fused sdpa-gqa"
    assert run_variant({"mode": "graphed", "graph_steps": 4, "model.fuse_projections": False}) == "graphed steps=4"
    runs = [("eager", "eager fused", 8.0), ("eager", "eager", 10.0), ("compiled", "compiled fused", 2.0),
            ("compiled", "compiled max-autotune fused", 1.0)]
    rows = [dict(id=i, name=f"run {i}", status="FINISHED", model="tiny", cache_len=64, bs=1, context_len=8, dtype="bf16", mode=mode,
                 variant=variant, median_ms=ms, efficiency=None, floor_ms=None, reason="")
            for i, (mode, variant, ms) in enumerate(runs)]
    assert speedups(rows) == {0: 1.25, 1: 1.0, 2: 5.0, 3: 10.0}
    header, _, cells = table_markdown(rows).splitlines()
    assert header == "| model | context_len | cache_len | bs | eager | eager fused | compiled fused | compiled max-autotune fused |"
    assert cells.startswith("| tiny | 8 | 64 | 1 | 10.000 ms, 1.00x | 8.000 ms, 1.25x | 2.000 ms, 5.00x |")


def test_the_context_plot_has_a_line_per_mode_and_attn_and_the_floor(monkeypatch, tmp_path):
    drawn = {}
    monkeypatch.setattr(report, "_draw", lambda series, floors, x, *a: drawn.setdefault(x, (series, floors)))
    rows = [dict(id=f"{attn}{ctx}", name=f"{attn}{ctx}", status="FINISHED", model="qwen3-0.6b", cache_len=ctx + 256, bs=8, context_len=ctx,
                 dtype="bf16", mode="graphed", variant=run_variant({"mode": "graphed", "attn": attn}),
                 median_ms=ms * ctx / 1024, efficiency=0.5, floor_ms=ctx / 4096, reason="", ci_low=None, ci_high=None)
            for attn, ms in (("sdpa", 7.0), ("flex", 2.0)) for ctx in (1024, 4096, 16384)]
    report.plots(rows, tmp_path)
    series, floors = drawn["context_len"]
    assert sorted(series) == [("qwen3-0.6b", "graphed"), ("qwen3-0.6b", "graphed flex")]
    assert series[("qwen3-0.6b", "graphed flex")] == [(1024, 2.0), (4096, 8.0), (16384, 32.0)]
    assert floors == {("qwen3-0.6b", "floor"): {(1024, 0.25), (4096, 1.0), (16384, 4.0)}}


@pytest.mark.parametrize("name, count", [("llama-3.2-1b", 1_235_814_400), ("llama-3.1-8b", 8_030_261_248),
                                         ("qwen3-30b-a3b", 30_532_122_624)])
def test_presets_are_the_published_architectures(name, count):
    assert parameters(name) == count  # the parameter counts the model cards publish


def test_a_mixture_of_experts_reads_the_experts_its_rows_touch():
    arch = run_config("model=qwen3-30b-a3b").model.architecture()
    active = step_cost(arch, 1, 256, 2)["weight_bytes"] / 2  # one row: its 8 experts of 128 in each layer
    assert 2.9e9 < active < 3.2e9  # "A3B": 3.3 B active, of which the 0.31 B embedding table is one row here
    rows = 4096  # so many rows touch every expert: the whole model but the embedding table, once
    every = step_cost(arch, rows, 256, 2)["weight_bytes"] / 2 - rows * 2048
    assert every == pytest.approx(30_532_122_624 - 151936 * 2048, rel=1e-6)


def test_a_model_sweep_plots_speedup_and_latency_against_model_size(monkeypatch, tmp_path):
    drawn = {}
    monkeypatch.setattr(report, "_draw", lambda series, floors, x, ylabel, path: drawn.setdefault(path.stem, (series, floors)))
    sizes = {"qwen3-0.6b": 0.75e9, "qwen3-8b": 8.2e9}
    rows = [dict(id=f"{m}{mode}{bs}", name=f"{m}{mode}{bs}", status="FINISHED", model=m, cache_len=256, bs=bs, context_len=16, dtype="bf16",
                 mode=mode, variant=mode, median_ms=ms * size / 1e9, efficiency=0.5, floor_ms=size / 4e9,
                 parameters=size, reason="", ci_low=None, ci_high=None)
            for m, size in sizes.items() for bs in (1, 8) for mode, ms in (("eager", 20.0), ("graphed", 5.0))]
    report.plots(rows, tmp_path)
    series, floors = drawn["speedup_vs_model_size"]
    assert series[("graphed", "bs=8")] == [(0.75e9, 4.0), (8.2e9, 4.0)]  # one line per mode and bs, across models
    series, floors = drawn["latency_vs_model_size"]
    assert floors[("floor", "bs=1")] == {(0.75e9, 0.1875), (8.2e9, 2.05)}
    drawn.clear()
    report.plots([r for r in rows if r["model"] == "qwen3-8b"], tmp_path)  # one model, one context: no such axes
    assert sorted(drawn) == ["latency_vs_bs", "speedup_vs_bs"]

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"


def _rows(folder: Path) -> list[dict]:
    from harness.analysis.report import latest_of_each_config
    from harness.analysis.rows import row_of

    return [row_of(r) for r in latest_of_each_config(folder)[1]]


def _drawn(monkeypatch) -> list:
    figures = []
    monkeypatch.setattr(report, "_save", lambda fig, path: figures.append(fig) or path)
    return figures


def test_the_ladder_chart_is_each_runs_median_by_mode_with_the_floor(monkeypatch, tmp_path):
    """Bugs caught: a bar put in another model's or bs's group, a mode's bars swapped with another's, the floor of
    the wrong group, an axis without its unit, a legend without the floor."""
    figures = _drawn(monkeypatch)
    rows = _rows(RESULTS / "h100-ladder")
    assert report.ladder_chart(rows, tmp_path / "ladder.png") == [tmp_path / "ladder.png"]
    ax = figures[0].axes[0]
    groups = [tuple(t.get_text().split("\nbs ")) for t in ax.get_xticklabels()]
    assert groups[0] == ("llama-3.2-1b", "1") and len(groups) == 9
    medians = {(r["model"], str(r["bs"]), r["variant"]): r["median_ms"] for r in rows}
    for bars in ax.containers:
        assert [b.get_height() for b in bars] == [medians[(*g, bars.get_label())] for g in groups]
    floors = {(r["model"], str(r["bs"])): r["floor_ms"] for r in rows}
    segments = [segment for c in ax.collections for segment in c.get_segments()]  # a line across each group
    assert [s[0][1] for s in segments] == [floors[g] for g in groups]
    assert all(g - 0.5 < s[0][0] < s[1][0] < g + 0.5 for g, s in enumerate(segments))
    assert "ms" in ax.get_ylabel() and [t.get_text() for t in ax.get_legend().get_texts()][-4:] == \
        ["eager", "graphed", "compiled", "fused"] and "floor" in ax.get_legend().get_texts()[0].get_text()
    # one context and one mode: no ladder to draw
    assert report.ladder_chart([r for r in rows if r["variant"] == "fused"], tmp_path / "x.png") == []


def test_the_context_chart_is_a_panel_per_bs_with_a_line_per_backend_and_the_floor(monkeypatch, tmp_path):
    figures = _drawn(monkeypatch)
    rows = _rows(RESULTS / "h200-context-kept")
    assert report.context_chart(rows, tmp_path / "context.png") == [tmp_path / "context.png"]
    axes = figures[0].axes
    assert [ax.get_title() for ax in axes] == [f"qwen3-0.6b, bs {bs}" for bs in (1, 8, 32)]
    lines = {line.get_label(): line for line in axes[2].get_lines()}
    flex = sorted((r["context_len"], r["median_ms"]) for r in rows if r["bs"] == 32 and r["variant"] == "graphed flex")
    assert list(zip(lines["graphed flex"].get_xdata(), lines["graphed flex"].get_ydata())) == flex
    assert lines["floor"].get_linestyle() == "--" and "ms" in axes[0].get_ylabel() and "context" in axes[0].get_xlabel()
    assert report.context_chart(_rows(RESULTS / "h100-ladder"), tmp_path / "x.png") == []  # one context
