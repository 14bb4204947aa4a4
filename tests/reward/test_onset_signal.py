"""benchmarks/onset_signal.py: which groups are scored, what a group's reader sees, scores."""

from __future__ import annotations

import numpy as np
import pytest

from tests.benchmark_scripts import load_benchmark


def _ref(labels: list[int], groups: range, window: int = 0) -> dict:
    return {"window": window, "groups": list(groups), "labels": labels}


def test_onsets_are_first_failure_groups_and_groups_after_a_failure_are_not_scored() -> None:
    osig = load_benchmark("onset_signal")
    labels = [3, 1, 1, 3, 2, 1, 3] + [3] * 25
    rows = osig.group_rows(_ref(labels, range(1, 25), window=2))
    assert [r["group"] for r in rows] == list(range(1, 25))
    assert [r["group"] for r in rows if r["onset"]] == [2, 6]
    assert [r["group"] for r in rows if not r["fresh"]] == [3, 4, 7]  # each follows a 1
    assert rows[4]["label"] == 2 and not rows[4]["onset"]  # suboptimal is not a failure
    assert {r["window"] for r in rows} == {2}
    # a failure in group 1 is an onset: nothing above it to copy
    first = osig.group_rows(_ref([1, 3] + [3] * 30, range(1, 3)))
    assert first[0]["onset"] and first[0]["fresh"]


def test_a_group_reads_its_two_frames_and_the_changes_into_them() -> None:
    osig = load_benchmark("onset_signal")
    frames = np.arange(64, dtype=np.float32)[:, None] ** 2  # frame i holds i²
    x = osig.group_features(frames, [1, 3])
    # group 1: frames 0, 1; change from frame 0 (clamped at the start) and from 0 to 1
    assert x[0].tolist() == [0.0, 1.0, 0.0, 1.0]
    # group 3: frames 4, 5; change from frame 2 (group 2's first frame) and from 4 to 5
    assert x[1].tolist() == [16.0, 25.0, 16.0 - 4.0, 25.0 - 16.0]


def test_position_features_mark_the_group_and_the_first_and_final_window() -> None:
    osig = load_benchmark("onset_signal")
    x = osig.position_features(_ref([3] * 32, range(1, 11), window=3), n_windows=4)
    assert x.shape == (10, 34)
    assert x[4, 4] == 1.0 and x[4, :32].sum() == 1.0
    assert (x[:, 32] == 0).all() and (x[:, 33] == 1).all()  # window 3 of 4: final only
    x0 = osig.position_features(_ref([3] * 32, range(1, 25), window=0), n_windows=4)
    assert (x0[:, 32] == 1).all() and (x0[:, 33] == 0).all()


def test_block_mean_averages_k_by_k_blocks_and_drops_a_ragged_edge() -> None:
    osig = load_benchmark("onset_signal")
    img = np.zeros((9, 8, 3), np.uint8)  # the ninth row is dropped
    img[:4, :4] = 8
    img[8] = 255
    out = osig.block_mean([img], k=4)
    assert out.shape == (1, 2 * 2 * 3)
    assert out.reshape(2, 2, 3)[:, :, 0].tolist() == [[8.0, 0.0], [0.0, 0.0]]


def test_ranked_scores_a_perfect_and_a_reversed_ranking_with_intervals() -> None:
    osig = load_benchmark("onset_signal")
    y = np.array([0, 1, 0, 0, 1, 0, 0, 0, 1, 0], bool)
    eps = np.array(["a", "a", "b", "b", "c", "c", "d", "d", "e", "e"])
    good = osig.ranked(y, y.astype(float), eps, n_boot=200)
    assert good["auc"] == 1.0 and good["ap"] == 1.0 and good["auc_ci"] == [1.0, 1.0]
    assert good["positives"] == 3 and good["groups"] == 10
    assert good["precision_at_recall_0.5"] == 1.0
    # one positive ranked first, the other two 8th and 9th of ten: recalling half of them
    # is best done by taking all three, at precision 3 / 9 (2 / 8 at the second)
    mixed = np.array([0, 1, 0.9, 0.8, 0.1, 0.7, 0.6, 0.5, 0.05, 0.4])
    r = osig.ranked(y, mixed, eps, n_boot=50)
    assert r["precision_at_recall_0.25"] == 1.0
    assert r["precision_at_recall_0.5"] == pytest.approx(3 / 9)
    bad = osig.ranked(y, -y.astype(float), eps, n_boot=200)
    assert bad["auc"] == 0.0 and bad["ap"] < 0.5
    assert 0.0 <= bad["ap_ci"][0] <= bad["ap"] <= bad["ap_ci"][1] <= 1.0


def test_ranking_without_both_classes_is_a_clear_error() -> None:
    osig = load_benchmark("onset_signal")
    eps = np.array(["a", "b", "c"])
    with pytest.raises(ValueError, match="got 0 onsets in 3 groups"):
        osig.ranked(np.zeros(3, bool), np.arange(3.0), eps, n_boot=10)
    # no resamples at all: no interval to give
    with pytest.raises(ValueError, match="no bootstrap resample"):
        osig.ranked(np.array([1, 0, 0], bool), np.arange(3.0), np.array(["a", "b", "c"]),
                    n_boot=0)  # fmt: skip


class _Dense:
    def __init__(self, episode_id: str, window: int, groups: range) -> None:
        self.episode_id = episode_id
        self._ref = _ref([3] * 32, groups, window)

    def reference_obj(self) -> dict:
        return self._ref


def test_the_final_window_flag_comes_from_the_whole_split_not_a_subset() -> None:
    osig = load_benchmark("onset_signal")
    split = [_Dense("e1", 0, range(1, 25)), _Dense("e1", 1, range(1, 25)),
             _Dense("e1", 2, range(1, 9)), _Dense("e2", 0, range(1, 13))]  # fmt: skip
    n = osig.windows_per_episode(split)
    assert n == {"e1": 3, "e2": 1}
    rows, pos = osig._windows(split[1:2], n)  # a subset without e1's last window
    assert len(rows) == 24 and rows[0]["episode"] == "e1"
    assert (pos[0][:, 33] == 0).all()  # window 1 of 3 is not final, though last in the subset


@pytest.mark.parametrize("kind", ["linear", "mlp"])
def test_a_reader_finds_a_rare_class_that_one_feature_separates(kind: str) -> None:
    osig = load_benchmark("onset_signal")
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(0)

    def data(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = rng.random(n) < 0.05  # rare, like failure onsets
        x = rng.normal(size=(n, 8))
        x[:, 3] += 4.0 * y
        return x, y

    (xa, ya), (xb, yb) = data(800), data(400)
    assert roc_auc_score(yb, osig.readout(xa, ya, xb, kind)) > 0.95
    # the same reader on shuffled labels finds nothing to rank with
    assert roc_auc_score(yb, osig.readout(xa, rng.permutation(ya), xb, kind)) < 0.8


def test_an_unknown_reader_is_refused() -> None:
    osig = load_benchmark("onset_signal")
    with pytest.raises(ValueError, match="unknown reader 'tree'"):
        osig.readout(np.zeros((4, 2)), np.array([0, 1, 0, 1], bool), np.zeros((2, 2)), "tree")
