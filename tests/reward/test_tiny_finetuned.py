"""End to end: the tiny VLM, fine-tuned on the rewarder's own prompts, through the real backend.

Acceptance of the rewarder issue: on the toy world, with the tiny model behind the real
in-process ``TransformersBackend``, all three tables (``outcome``, ``dense_labels``,
``rubric``) are produced and validated. A random checkpoint's output is always rejected
(``test_tiny_model.py``), so here the shared random tiny Qwen3-VL is first fine-tuned for a
few seconds (:func:`tests.tiny_finetune.finetune_tiny`) to answer episode 1's exact
outcome, dense and rubric requests — built by ``flora.reward.run``'s request builders
with the same parameters the steps get — with the ground truth rendered by the rewarder's
own renderers. The steps then run on the model's genuine greedy output and genuine
logprobs; a transparent recorder keeps each request/response pair and never changes one.
What is checked is that every value in the tables is exactly what the model's parsed
output implies (and, since the model learnt it, what the ground truth says).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import pytest

from flora.data.dataset import open_dataset
from flora.data.ground_truth import load_ground_truth
from flora.reward.benchmark import gt_rubric_for
from flora.reward.dense import group_times, parse_dense, plan_windows, render_dense, window_targets
from flora.reward.outcome import (
    SCORES,
    expected_score,
    render_outcome,
    score_position,
    score_probs_from_top_logprobs,
)
from flora.reward.rubric import parse_rubric, render_rubric, score
from flora.reward.run import (
    dense_dataset,
    dense_requests,
    outcome_dataset,
    outcome_request,
    rubric_dataset,
    rubric_request,
)
from flora.tables import TableStore
from flora.validation.core import validate_table
from tests.tiny_finetune import Recording, finetune_stats, finetune_tiny, single_torch_thread

EPISODE = 1  # 14 s, missed grasp: outcome 4, one dense window with failure labels, partial rubric
OUTCOME_FRAMES = 8
RUBRIC_FRAMES = 4
THINKING = "Scoring each step from the clips."


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    with single_torch_thread():
        yield


@pytest.fixture(scope="module")
def truth(tiny_dataset):
    """Episode ``EPISODE``, its ground truth and its requests paired with the rendered targets."""
    ep = open_dataset(tiny_dataset).episode(EPISODE)
    gt = load_ground_truth(tiny_dataset)
    rubric = gt_rubric_for(tiny_dataset)(ep)
    assert rubric is not None
    _, rubric_scores = gt.rubric(EPISODE)
    windows = plan_windows(ep.duration_us)
    dense = [window_targets(w, ep.duration_us, gt.dense(EPISODE)) for w in windows]
    pairs = [(outcome_request(ep, OUTCOME_FRAMES), render_outcome(gt.outcome(EPISODE)))]
    pairs += [
        (req, render_dense(labels, reasons))
        for req, (labels, reasons) in zip(dense_requests(ep, windows), dense, strict=True)
    ]
    pairs.append(
        (rubric_request(ep, rubric, RUBRIC_FRAMES), render_rubric(rubric, rubric_scores, THINKING))
    )
    return {
        "episode": ep,
        "outcome": gt.outcome(EPISODE),
        "windows": windows,
        "dense": dense,
        "gt_dense": gt.dense(EPISODE),
        "rubric": rubric,
        "rubric_scores": rubric_scores,
        "pairs": pairs,
    }


@pytest.fixture(scope="module")
def recorder(truth, tiny_vlm_dir, tmp_path_factory) -> Recording:
    from flora.backends.transformers_backend import TransformersBackend

    out = tmp_path_factory.mktemp("reward_tuned") / "model"
    # ~330 answer tokens (the dense window's reasons): more steps than one short target.
    tuned = finetune_tiny(tiny_vlm_dir("qwen3_vl"), truth["pairs"], out, max_steps=800)
    stats = finetune_stats(tuned)
    assert stats["loss"] < 5e-3, stats
    backend = TransformersBackend(tuned, device="cpu", vision_input="images")
    return Recording(backend)


@pytest.fixture(scope="module")
def runs(truth, recorder, tiny_dataset, tmp_path_factory):
    """The three real steps on episode ``EPISODE``, one store."""
    store = TableStore(tmp_path_factory.mktemp("reward_tables"))
    kw = {"episodes": [EPISODE], "run_id": "tuned-1", "progress": False}
    return store, {
        "outcome": outcome_dataset(tiny_dataset, recorder, store, max_frames=OUTCOME_FRAMES, **kw),
        "dense_labels": dense_dataset(tiny_dataset, recorder, store, **kw),
        "rubric": rubric_dataset(
            tiny_dataset, recorder, store, truth["rubric"], max_frames=RUBRIC_FRAMES, **kw
        ),
    }


def test_model_answers_its_targets_to_the_exact_requests(truth, recorder, runs) -> None:
    """The steps sent exactly the fine-tuned requests, once each, and got the targets back."""
    want = {req.request_id: (req, target) for req, target in truth["pairs"]}
    assert sorted(req.request_id for req, _ in recorder.calls) == sorted(want)
    for req, resp in recorder.calls:
        sent, target = want[req.request_id]
        assert req.prompt == sent.prompt and len(req.images) == len(sent.images)
        assert req.frame_times_us == sent.frame_times_us
        assert resp.ok and resp.text == target, (req.request_id, resp.text)


def test_all_three_tables_validated(truth, recorder, runs) -> None:
    store, res = runs
    eid = truth["episode"].episode_id
    for table, r in res.items():
        assert r.ok and not r.failures, (table, r.failures)
        assert r.written == [eid] and r.validation is not None and r.validation.success
        df = store.read(table)
        assert len(df) == r.rows > 0
        assert validate_table(table, df).success
        assert set(df.episode_id) == {eid} and set(df.run_id) == {"tuned-1"}
        assert set(df.model) == {"transformers"}
        assert set(df.model_version) == {recorder.model_version}
        assert not store.failures(table)


def test_outcome_from_real_score_logprobs(truth, recorder, runs) -> None:
    store, _ = runs
    row = store.read("outcome").iloc[0]
    (resp,) = [resp for req, resp in recorder.calls if req.request_id.endswith("|outcome|episode")]
    k = truth["outcome"]
    # The score token's alternatives are the model's real top-20 logprobs: not one-hot.
    at = resp.logprobs[score_position(resp.logprobs, resp.text)]
    raw = {}
    for tok, lp in at.top.items():
        s = tok.strip().lstrip("Ġ▁")
        if s in {str(x) for x in SCORES}:
            raw[int(s)] = raw.get(int(s), 0.0) + math.exp(lp)
    assert max(raw, key=raw.get) == k and 0.0 < sum(raw.values()) <= 1.0 + 1e-6
    assert 0.0 < raw[k] < 1.0  # exp of a real logprob, not a synthesised one-hot
    probs, missing = score_probs_from_top_logprobs(resp.logprobs, resp.text)
    assert probs.sum() == pytest.approx(1.0, abs=1e-9)
    np.testing.assert_allclose(row.score_probs, probs, atol=1e-12)
    assert row.score_probs.sum() == pytest.approx(1.0, abs=1e-9)
    assert list(row.missing_scores) == list(missing)
    assert sorted(set(SCORES) - set(missing)) == sorted(raw)
    assert row.expected_score == pytest.approx(expected_score(probs), abs=1e-12)
    assert 1.0 <= row.expected_score <= 5.0
    assert row.argmax_score == row.answer_score == k == int(np.argmax(probs)) + 1
    assert row.attempts == 1


def test_dense_labels_equal_ground_truth(truth, runs) -> None:
    store, _ = runs
    df = store.read("dense_labels").sort_values("t_us").reset_index(drop=True)
    ep = truth["episode"]
    assert list(df.t_us) == group_times(ep.duration_us)
    gt_labels = {int(t): int(lab) for t, lab, _ in truth["gt_dense"]}
    for r in df.itertuples():
        labels, reasons = truth["dense"][r.source_window]
        parsed = parse_dense(render_dense(labels, reasons))
        g = r.source_group - 1  # groups are numbered 1..32
        assert (
            (r.label, r.reason) == (labels[g], reasons[g]) == (parsed.labels[g], parsed.reasons[g])
        )
        assert r.label == gt_labels[r.t_us]  # the ground truth at that 0.5 s instant
    # Not a trivial all-normal episode: failure labels and their reasons came through.
    assert df.label.min() == 1 and df.label.max() == 3
    assert (df.reason[df.label < 3] != "").all() and (df.reason[df.label == 3] == "").all()


def test_rubric_scores_equal_ground_truth(truth, runs) -> None:
    store, _ = runs
    row = store.read("rubric").iloc[0]
    rub = truth["rubric"]
    want = parse_rubric(rub, render_rubric(rub, truth["rubric_scores"], THINKING))
    assert list(row.step_names) == rub.step_names == list(want)
    assert list(row.step_scores) == pytest.approx(list(want.values()), abs=1e-12)
    assert row.total == pytest.approx(score(rub, want), abs=1e-12)
    assert row.attempts == 1
