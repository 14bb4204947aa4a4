"""Through a real backend: the tiny random Qwen3-VL model (content poor, mechanics right).

A random model almost never follows the caption grammar: what is checked is that every
event ends as a validated row or a recorded failure with its reason after the bounded
number of attempts, and that the table that is produced passes its GX suite.
"""

from __future__ import annotations

import pandas as pd
import pytest

from flora.caption.judges import LLMJudge
from flora.caption.run import CaptionConfig, caption_dataset
from flora.metrics.caption import Requirement, score_captions
from flora.parsing import Rejection
from flora.tables import TableStore


@pytest.fixture(scope="module")
def tiny_backend(tiny_vlm_dir):
    from flora.backends.transformers_backend import TransformersBackend

    return TransformersBackend(tiny_vlm_dir(), device="cpu", batch_size=4)


def test_captions_through_the_tiny_model(tiny_dataset, tiny_backend, tmp_path):
    ev = pd.read_parquet(tiny_dataset / "ground_truth" / "events.parquet")
    ev = ev[ev.episode_index == 0]
    cfg = CaptionConfig(
        max_target_frames=2, max_context_frames=1, max_new_tokens=12, max_attempts=2
    )
    res = caption_dataset(
        tiny_dataset, ev, tmp_path, tiny_backend, "tiny", config=cfg, progress=False
    )
    eid = f"{tiny_dataset.name}/000000"
    assert res.processed == [eid] and res.report.success
    written = set(res.captions.event_index)
    failed = {int(f.item.split()[1]) for f in res.failures}
    assert written | failed == set(range(len(ev))) and not written & failed
    for f in res.failures:
        assert "rejection after 2 attempts" in f.reason and "last output" in f.reason
    assert TableStore(tmp_path).failures("captions") == res.failures
    if len(res.captions):
        assert set(res.captions.model_version) == {tiny_backend.model_version}


def test_llm_judge_through_the_tiny_model(tiny_backend):
    judge = LLMJudge(tiny_backend, max_attempts=2, max_new_tokens=12)
    reqs = [Requirement("action", "grasp"), Requirement("object", "red block")]
    out = score_captions(judge, [("grasp the red block.", reqs), ("", reqs)])
    assert out[1].reward == 0.0  # empty caption: scored without asking the judge
    # a random model does not answer the JSON grammar: a typed rejection, not a score
    assert isinstance(out[0], Rejection) and out[0].reason
