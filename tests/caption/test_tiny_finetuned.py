"""End to end: the tiny VLM, fine-tuned on the captioner's own prompts, through the real backend.

The random tiny Qwen3-VL never follows the caption grammar (``test_tiny_backend.py``), so
here it is first fine-tuned for a few seconds (:func:`tests.tiny_finetune.finetune_tiny`)
to answer each of episode 0's exact caption requests — built by
``flora.caption.run.build_caption_requests`` with the same config the step gets — with
that event's ground-truth caption rendered by ``render_caption``. ``caption_dataset`` then
runs on the model's genuine greedy output: every event gets a validated row whose caption
is exactly what the model said (the ground truth), with no failures.
"""

from __future__ import annotations

from collections.abc import Iterator

import pandas as pd
import pytest

from flora.backends.base import VLMRequest
from flora.caption.grammar import parse_caption, render_caption
from flora.caption.run import (
    CaptionConfig,
    build_caption_requests,
    caption_dataset,
    load_events_table,
)
from flora.data.dataset import open_dataset
from flora.tables import TableStore
from flora.validation.core import validate_table
from tests.tiny_finetune import Recording, finetune_stats, finetune_tiny, single_torch_thread

EPISODE = 0
CONFIG = CaptionConfig(max_target_frames=4, max_context_frames=2, max_new_tokens=48)


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    with single_torch_thread():
        yield


@pytest.fixture(scope="module")
def events(tiny_dataset) -> pd.DataFrame:
    """Episode 0's ground-truth events (with their captions), as the step reads them."""
    ev = pd.read_parquet(tiny_dataset / "ground_truth" / "events.parquet")
    return ev[ev.episode_index == EPISODE].reset_index(drop=True)


@pytest.fixture(scope="module")
def pairs(tiny_dataset, events) -> list[tuple[VLMRequest, str]]:
    ds = open_dataset(tiny_dataset)
    g = load_events_table(events, ds.name).sort_values("event_index", kind="stable")
    built = build_caption_requests(
        ds.episode(EPISODE),
        list(g.itertuples(index=False)),
        config=CONFIG,
        event_indices=[int(i) for i in g["event_index"]],
    )
    assert not built.failures and len(built.requests) == len(g) >= 2
    # Targets from the reference table itself: load_events_table blanks captions so they
    # can never reach a prompt; its event_index is the (start, end) order within the episode.
    ref = events.sort_values(["start_us", "end_us"], kind="stable")["caption"].tolist()
    caps = dict(enumerate(ref))
    return [
        (req, render_caption(caps[k]))
        for req, k in zip(built.requests, built.event_indices, strict=True)
    ]


@pytest.fixture(scope="module")
def done(pairs, events, tiny_dataset, tiny_vlm_dir, tmp_path_factory):
    from flora.backends.transformers_backend import TransformersBackend

    out = tmp_path_factory.mktemp("caption_tuned") / "model"
    tuned = finetune_tiny(tiny_vlm_dir("qwen3_vl"), pairs, out)
    stats = finetune_stats(tuned)
    assert stats["loss"] < 5e-3, stats
    rec = Recording(TransformersBackend(tuned, device="cpu", vision_input="images"))
    tables = tmp_path_factory.mktemp("caption_tables")
    run = caption_dataset(
        tiny_dataset, events, tables, rec, "tuned-1", config=CONFIG, progress=False
    )
    return rec, run, tables


def test_model_answers_the_exact_requests(pairs, done) -> None:
    rec, _, _ = done
    want = {req.request_id: (req, target) for req, target in pairs}
    assert sorted(req.request_id for req, _ in rec.calls) == sorted(want)
    for req, resp in rec.calls:
        sent, target = want[req.request_id]
        assert req.prompt == sent.prompt and len(req.images) == len(sent.images)
        assert resp.ok and resp.text == target, (req.request_id, resp.text)


def test_captions_table_validated_and_equal_to_model_output(
    pairs, events, done, tiny_dataset
) -> None:
    rec, run, tables = done
    assert not run.failures and run.report.success
    df = run.captions.sort_values("event_index").reset_index(drop=True)
    assert len(df) == len(events) > 0
    assert validate_table("captions", df).success
    on_disk = TableStore(tables).read("captions").sort_values("event_index")
    assert list(on_disk.caption) == list(df.caption)
    said = {req.request_id: resp.text for req, resp in rec.calls}
    for r in df.itertuples():
        (rid,) = [k for k in said if k.split("#event")[1].split("@")[0] == str(r.event_index)]
        assert r.caption == parse_caption(said[rid])  # what the model said, parsed
    gt = events.sort_values(["start_us", "end_us"], kind="stable").reset_index(drop=True)
    assert list(df.caption) == [parse_caption(render_caption(c)) for c in gt.caption]
    assert list(zip(df.start_us, df.end_us, strict=True)) == list(
        zip(gt.start_us, gt.end_us, strict=True)
    )
    assert (df.attempts == 1).all() and set(df.run_id) == {"tuned-1"}
    assert set(df.model_version) == {rec.model_version}
