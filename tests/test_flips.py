"""The byte-identity helper: a repeated difference fails, a single flip only warns."""

from __future__ import annotations

import pytest

from tests.flips import repeated_difference


def test_a_difference_counts_only_when_a_fresh_pair_repeats_it():
    same, flipped = {"a.mp4": "1", "b.mp4": "2"}, {"a.mp4": "1", "b.mp4": "X"}
    calls = []

    def again(pair):
        def make():
            calls.append(1)
            return pair

        return make

    assert repeated_difference((same, same), again((same, flipped)), "x") == []
    assert calls == []  # a matching first pair generates nothing more
    with pytest.warns(UserWarning, match=r"differed in \['b.mp4'\]"):
        assert repeated_difference((same, flipped), again((same, same)), "x") == []
    assert repeated_difference((same, flipped), again((flipped, same)), "x") == ["b.mp4"]
    only_one = {"a.mp4": "1"}
    assert repeated_difference((same, only_one), again((same, only_one)), "x") == ["b.mp4"]
