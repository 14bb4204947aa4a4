"""End to end with the real tiny random model (TransformersBackend, CPU).

A random model's output is mostly rejected by the strict grammars: what is asserted is the
mechanics — each episode either yields validated rows or a recorded failure with a reason,
retries are bounded, and nothing is filled in.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flora.reward.benchmark import gt_rubric_for
from flora.reward.outcome import score_probs_from_logits
from flora.reward.run import dense_dataset, outcome_dataset, rubric_dataset
from flora.tables import TableStore


@pytest.fixture(scope="module")
def tiny_backend(reward_tiny_vlm):
    from flora.backends.transformers_backend import TransformersBackend

    return TransformersBackend(reward_tiny_vlm, device="cpu", batch_size=4)


def _check_mechanics(res, store: TableStore, episode_ids: list[str], max_attempts: int):
    failed = {f.episode_id for f in res.failures}
    for eid in episode_ids:
        # Exactly one of: a validated part on disk, or a recorded failure (dense may have both
        # when only some windows failed).
        assert store.has(res.table, eid) or eid in failed, eid
    for f in res.failures:
        assert f.reason and f"after {max_attempts} attempts" in f.reason, f
    recorded = {(f.episode_id, f.item) for f in store.failures(res.table)}
    assert recorded == {(f.episode_id, f.item) for f in res.failures}
    df = store.read(res.table)
    if len(df):
        assert res.validation is not None and res.validation.success
        assert set(df.episode_id) == set(res.written)


def test_tiny_model_end_to_end(tiny_dataset, tiny_backend, tmp_path):
    store = TableStore(tmp_path)
    ids = [f"{tiny_dataset.name}/{i:06d}" for i in range(3)]
    res = outcome_dataset(tiny_dataset, tiny_backend, store, max_attempts=2, max_frames=8,
                          progress=False)  # fmt: skip
    _check_mechanics(res, store, ids, 2)
    assert res.written or res.failures
    res = dense_dataset(tiny_dataset, tiny_backend, store, episodes=[0], max_attempts=1,
                        max_new_tokens=24, progress=False)  # fmt: skip
    _check_mechanics(res, store, ids[:1], 1)
    # 24 new tokens cannot hold 33 lines: the window must be rejected, not padded.
    assert res.failures and not store.has("dense_labels", ids[0])
    res = rubric_dataset(tiny_dataset, tiny_backend, store, gt_rubric_for(tiny_dataset),
                         episodes=[0], max_attempts=1, max_frames=4, max_new_tokens=24,
                         progress=False)  # fmt: skip
    _check_mechanics(res, store, ids[:1], 1)


def test_score_probs_from_real_logits(tiny_backend):
    tok = tiny_backend.tokenizer
    ids = [tok.convert_tokens_to_ids(str(k)) for k in range(1, 6)]
    assert len(set(ids)) == 5 and all(isinstance(i, int) for i in ids)
    enc = tok("score:", return_tensors="pt")
    with torch.no_grad():
        logits = tiny_backend.model(**enc).logits[0, -1]
    p = score_probs_from_logits(logits, ids)
    ref = torch.softmax(logits[ids].double(), dim=-1).numpy()
    np.testing.assert_allclose(p, ref, atol=1e-9)
    assert p.sum() == pytest.approx(1.0)
