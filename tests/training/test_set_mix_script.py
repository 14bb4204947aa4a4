"""``benchmarks/set_mix.py``: a task kind's share of items and of labelled target tokens."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.benchmark_scripts import load_benchmark


def _ex(kind: str, target: str) -> SimpleNamespace:
    return SimpleNamespace(task_kind=kind, target=target)


def test_kind_mix_weighs_kinds_by_target_tokens_not_items():
    sm = load_benchmark("set_mix")
    examples = [
        _ex("outcome", "score: 4"),
        _ex("dense", "a b c d e f g h"),
        _ex("outcome", "score: 2"),
        _ex("dense", "a b c d e f"),
    ]
    mix = sm.kind_mix(examples, lambda t: len(t.split()))  # words stand in for tokens
    assert list(mix) == ["outcome", "dense"]  # first-seen order
    assert mix["outcome"].items == 2 and mix["outcome"].item_share == 0.5
    assert mix["outcome"].target_tokens == 4 and mix["dense"].target_tokens == 14
    assert mix["outcome"].token_share == pytest.approx(4 / 18)
    assert mix["dense"].tokens_per_item == 7.0
    table = sm.mix_table(mix)
    assert "| outcome | 2 | 50.0% | 4 | 22.22% | 2.0 |" in table


def test_kind_mix_refuses_an_empty_set():
    sm = load_benchmark("set_mix")
    with pytest.raises(ValueError, match="no examples"):
        sm.kind_mix([], len)
