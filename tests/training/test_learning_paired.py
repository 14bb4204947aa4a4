"""``benchmarks/learning.py``'s GRPO-vs-SFT comparison on held-out episodes, paired by episode."""

from __future__ import annotations

import pandas as pd
import pytest

from tests.benchmark_scripts import load_benchmark

learning = load_benchmark("learning")


def _items(rows: list[tuple[str, str, float, bool]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["example_id", "episode_id", "r_seg", "parsed"])


def test_paired_by_episode_weighs_episodes_alike_and_pairs_them():
    # e1 has two windows, e2 one: per-episode means, not pooled windows
    sft = _items([("w1", "e1", 0.2, True), ("w2", "e1", 0.4, False), ("w3", "e2", 0.5, True)])
    grpo = _items([("w1", "e1", 0.4, True), ("w2", "e1", 0.6, True), ("w3", "e2", 0.5, True)])
    p = learning.paired_by_episode(sft, grpo, ("r_seg", "parsed"), n_boot=500)
    r = p["r_seg"]
    assert r["episodes"] == 2
    assert r["a"] == pytest.approx((0.3 + 0.5) / 2)  # pooled windows would give 0.367
    assert r["b"] == pytest.approx((0.5 + 0.5) / 2)
    assert r["gain"] == pytest.approx(0.1)  # episode gains 0.2 and 0.0
    lo, hi = r["interval"]
    assert 0.0 <= lo <= 0.1 <= hi <= 0.2 + 1e-12
    # parse: e1 0.5 -> 1.0, e2 1.0 -> 1.0
    assert p["parsed"]["a"] == pytest.approx(0.75)
    assert p["parsed"]["gain"] == pytest.approx(0.25)


def test_paired_by_episode_refuses_answers_to_different_items():
    sft = _items([("w1", "e1", 0.2, True), ("w2", "e2", 0.4, True)])
    grpo = _items([("w1", "e1", 0.4, True), ("w9", "e2", 0.6, True)])
    with pytest.raises(ValueError, match="cover different items .*2 differ"):
        learning.paired_by_episode(sft, grpo, ("r_seg",), n_boot=100)


def test_the_verdict_names_a_paired_held_out_loss():
    sft = {"metrics": {"parse_rate": 0.97, "r_seg": 0.48}, "intervals": {"r_seg": [0.44, 0.52]}}
    grpo = {"metrics": {"parse_rate": 0.95, "r_seg": 0.45}, "intervals": {"r_seg": [0.41, 0.49]}}
    lowered = {"a": 0.48, "b": 0.45, "gain": -0.03, "interval": [-0.05, -0.01], "episodes": 26}
    level = {"a": 0.97, "b": 0.95, "gain": -0.02, "interval": [-0.06, 0.02], "episodes": 26}
    res = {
        "model": "segmenter",
        "variants": {"SFT": sft, "SFT+GRPO": grpo},
        "own_prompts": {"SFT": 0.45, "SFT+GRPO": 0.46},
        "paired_heldout": {"SFT+GRPO": {"r_seg": lowered, "parsed": level}},
    }
    text = "\n".join(learning.verdicts([res]))
    # inside the unpaired SFT interval, yet lowered when paired by episode
    assert "(SFT interval [0.44, 0.52]: within)" in text
    assert "SFT+GRPO paired with the SFT model over 26 held-out episodes" in text
    assert "r_seg -0.030 [-0.050, -0.010] (lowered)" in text
    assert "parse -0.020 [-0.060, +0.020] (no change shown)" in text
