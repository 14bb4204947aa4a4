"""``benchmarks/guided_decoding.py``: the segmenter's parse rate per clip length, the
rewarder's dense parse rate in final and other windows."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pandas as pd

from tests.benchmark_scripts import load_benchmark


def _ex(eid: str, ticks: int) -> SimpleNamespace:
    ref = json.dumps({"n_ticks": ticks})
    return SimpleNamespace(example_id=eid, reference_obj=lambda: json.loads(ref))


def test_parse_by_clip_counts_parsed_windows_per_stated_length():
    gd = load_benchmark("guided_decoding")
    held = [_ex("a", 320), _ex("b", 100), _ex("c", 320), _ex("d", 100), _ex("e", 280)]
    items = pd.DataFrame(
        {"example_id": ["c", "a", "b", "d", "e"], "parsed": [True, True, False, True, False]}
    )
    assert gd.parse_by_clip(held, items) == {"100": [1, 2], "280": [0, 1], "320": [2, 2]}
    assert list(gd.parse_by_clip(held, items)) == ["100", "280", "320"]  # shortest first


def _dense(eid: str, episode: str, window: int, kind: str = "dense") -> SimpleNamespace:
    ref = json.dumps({"window": window})
    return SimpleNamespace(
        example_id=eid, episode_id=episode, task_kind=kind, reference_obj=lambda: json.loads(ref)
    )


def test_dense_parse_by_window_splits_each_episodes_last_window():
    gd = load_benchmark("guided_decoding")
    held = [
        _dense("a0", "a", 0),
        _dense("a1", "a", 1),
        _dense("a2", "a", 2),  # a's final window
        _dense("b0", "b", 0),  # b's only window is its final one
        _dense("ao", "a", 5, kind="outcome"),  # not a dense window: ignored
    ]
    items = pd.DataFrame(
        {
            "example_id": ["a0", "a1", "a2", "b0", "ao"],
            "parsed": [True, False, False, True, False],
        }
    )
    assert gd.dense_parse_by_window(held, items) == {"final": [1, 2], "non_final": [1, 2]}
