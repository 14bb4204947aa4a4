"""benchmarks/vlm_throughput.py executes end to end on CPU with the tiny config."""

from __future__ import annotations

import json

from tests.benchmark_scripts import load_benchmark


def test_throughput_benchmark_runs_on_cpu(tmp_path):
    bench = load_benchmark("vlm_throughput")
    out = tmp_path / "bench.json"
    report = bench.main(
        [
            "--config", "tiny", "--device", "cpu", "--frames", "4", "--size", "64",
            "--batch-sizes", "1,2", "--windows", "1", "--gen-tokens", "2", "--reps", "1",
            "--out", str(out),
        ]
    )  # fmt: skip
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    w = report["window"]
    # 4 frames -> 2 temporal groups of (64/16/2)^2 = 4 merged tokens each.
    assert (w["grid_t"], w["tokens_per_group"]) == (2, 4)
    assert w["total_tokens"] == w["prompt_tokens"] + 2 * (5 + 2 + 4)
    assert [r["batch"] for r in report["batched"]] == [1, 2]
    for r in report["batched"]:
        assert r["prefill_windows_per_s"] > 0 and r["generate_windows_per_s"] > 0
        assert 0 < r["prefill_roofline_frac"] < 1
    s = report["summary"]
    assert s["gpu_s_per_video_hour_two_passes"] == 2 * s["gpu_s_per_video_hour_one_pass"]
    assert report["tflop_per_window_generate"] > report["tflop_per_window_prefill"] > 0


def test_flop_model_of_the_qwen3_5_9b_window():
    """The 9B config at 64 frames x 448^2: ~6.6k tokens and ~120 TFLOP per window."""
    import torch
    from transformers import AutoModelForImageTextToText

    bench = load_benchmark("vlm_throughput")
    cfg = bench.build_config("qwen3_5_9b")
    with torch.device("meta"):  # shapes only: no memory, no init cost
        model = AutoModelForImageTextToText.from_config(cfg, dtype=torch.bfloat16)
    vis, lm, emb = bench.count_params(model)
    assert 8.5e9 < vis + lm + emb < 10e9
    shape = bench.window_shape(cfg, 64, 448)
    assert (shape.grid_t, shape.grid_hw, shape.tokens_per_group) == (32, 28, 196)
    tflop = bench.window_flops(cfg, shape, (vis, lm, emb)) / 1e12
    assert 100 < tflop < 140
