"""``benchmarks/guided_decoding.py``: the segmenter's parse rate per clip length."""

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
