"""Smoke test of benchmarks/rtc_latency.py (the numbers themselves live in docs)."""

from __future__ import annotations

from tests.benchmark_scripts import load_benchmark


def test_latency_script_times_all_three_samplers(tmp_path):
    mod = load_benchmark("rtc_latency")
    out = tmp_path / "lat.json"
    res = mod.main(
        [
            "--preset",
            "tiny",
            "--horizon",
            "8",
            "--delay",
            "2",
            "--s",
            "2",
            "--repeats",
            "2",
            "--warmup",
            "0",
            "--json",
            str(out),
        ]
    )
    assert set(res["median_ms"]) == {"plain", "training_time", "inference_time"}
    assert all(v > 0 for v in res["median_ms"].values())
    assert res["ratio_training_time_over_plain"] > 0
    assert out.exists() and res["parameters"] > 0
