"""Oracle check (docs/benchmarks.md "Rewarder"): ground-truth dense labels rendered through
the grammar, parsed and stitched by eq. (22) reproduce the ground truth exactly."""

from __future__ import annotations

import random

from flora.data.ground_truth import load_ground_truth
from flora.reward.dense import group_times, roundtrip_ground_truth

S = 1_000_000


def test_toy_world_dense_ground_truth_round_trips_exactly(tiny_dataset):
    gt = load_ground_truth(tiny_dataset)
    durations = dict(zip(gt.tables["episodes"].episode_index, gt.tables["episodes"].duration_us,
                         strict=True))  # fmt: skip
    for i in gt.episode_indices():
        ref = gt.dense(i)
        assert [t for t, _, _ in ref] == group_times(int(durations[i]))
        got = roundtrip_ground_truth(int(durations[i]), ref)
        assert [(r.t_us, r.label, r.reason) for r in got] == ref


def test_random_dense_ground_truth_round_trips_exactly():
    rng = random.Random(5)
    durations = [S, 16 * S, 16 * S + 1, 26 * S, 600 * S] + [
        rng.randrange(S, 600 * S) for _ in range(25)
    ]
    for T in durations:
        ref = []
        for t in group_times(T):
            lab = rng.choice([1, 2, 3, 3, 3, 3])
            ref.append((t, lab, "" if lab == 3 else f"event near {t} us"))
        got = roundtrip_ground_truth(T, ref)
        assert [(r.t_us, r.label, r.reason) for r in got] == ref, T


def test_ground_truth_outside_the_grammar_is_a_failed_window_not_a_crash(tiny_dataset):
    """A ground-truth reason the dense grammar cannot carry (non-ASCII here) makes the
    oracle's answer for that window an error response, which the step records as that
    window's failure; the other windows are answered."""
    from flora.backends.base import VLMRequest
    from flora.data.dataset import open_dataset
    from flora.reward.oracle import GroundTruthRewardBackend

    backend = GroundTruthRewardBackend(tiny_dataset)
    eid = f"{open_dataset(tiny_dataset).name}/000000"
    real = backend.gt.dense
    bad = [(t, 1, "gripper slips \u2014 cube drops") if k == 0 else (t, lab, why)
           for k, (t, lab, why) in enumerate(real(0))]  # fmt: skip
    backend.gt.dense = lambda i: bad if i == 0 else real(i)
    (broken,) = backend.generate([VLMRequest(prompt="", request_id=f"{eid}|dense|w0")])
    assert not broken.ok and "printable ASCII" in (broken.error or "")
    backend.gt.dense = real
    (fine,) = backend.generate([VLMRequest(prompt="", request_id=f"{eid}|dense|w0")])
    assert fine.ok and fine.text.startswith("worst: ")
