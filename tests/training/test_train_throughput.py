"""benchmarks/train_throughput.py runs the trainer's own step on CPU with the tiny config,
in the recipe's training form, and counts model FLOPs by what trains."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.benchmark_scripts import load_benchmark


def _run(bench, tmp_path: Path, *extra: str) -> dict:
    out = tmp_path / "report.json"
    args = ["--config", "tiny", "--device", "cpu", "--frames", "4", "--size", "64",
            "--answer-tokens", "16", "--warmup", "1", "--steps", "2"]  # fmt: skip
    args += ["--out", str(out), *extra]
    report = bench.main(args)
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    return report


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("train_throughput")


def test_full_fine_tune_trains_the_recipes_parts_and_counts_three_forwards(bench, tmp_path):
    import torch
    from transformers import AutoModelForImageTextToText

    from training.sft import module_key

    r = _run(bench, tmp_path, "--recipe", "rewarder-tiny")
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(bench.vt.build_config("tiny"))
    expected = sum(
        p.numel()
        for n, p in model.named_parameters()
        if module_key(n) in {"language_model", "merger", "vision"}
    )
    assert r["trainable_params"] == expected
    assert (r["lora_rank"], r["zero_stage"]) == (None, 2)
    # 4 frames -> 2 groups of 4 merged tokens (+ a stamp and two markers each), 160 prompt
    # tokens, 16 answer tokens.
    assert r["window"]["total_tokens"] == 160 + 2 * (5 + 2 + 4) + 16
    f = r["tflop_per_window"]
    assert f["train"] == pytest.approx(3 * f["forward"])  # vision trains too: 3x everywhere
    assert r["tokens_per_s"] == pytest.approx(r["window"]["total_tokens"] / r["step_s"])
    assert r["target_tokens_per_s"] == pytest.approx(16 / r["step_s"])
    assert 0 < r["mfu"] == pytest.approx(r["model_tflops"] / r["peak_tflops"])
    # The same batch twice: the optimizer step really updated the weights.
    assert all(math.isfinite(x) for x in r["loss"]) and r["loss"][1] < r["loss"][0]


def test_lora_counts_no_vision_backward_and_runs_under_zero3(bench, tmp_path):
    r = _run(
        bench, tmp_path, "--recipe", "segmenter-tiny", "--zero", "3",
        "--gradient-checkpointing", "on", "--grad-accum", "2",
    )  # fmt: skip
    assert (r["lora_rank"], r["zero_stage"], r["gradient_checkpointing"]) == (32, 3, True)
    assert 0 < r["trainable_params"] < r["params"]["language"] + r["params"]["embeddings"]
    f = r["tflop_per_window"]
    # Frozen vision tower: its forward only; the decoder: forward + activation gradients.
    assert f["train"] == pytest.approx(f["vision"] + f["text"])
    assert f["text"] == pytest.approx(2 * (f["forward"] - f["vision"]))
    assert r["windows_per_s"] == pytest.approx(2 / r["step_s"])  # 1 x 2 accumulation
    assert all(math.isfinite(x) for x in r["loss"])
