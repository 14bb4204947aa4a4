"""Caption evaluation headline: r_cap over every reference event, missing ones scoring 0."""

from __future__ import annotations

import pandas as pd
import pytest

from flora.caption.evaluate import evaluate_captions
from flora.caption.oracle import GroundTruthCaptionBackend
from flora.caption.run import caption_dataset


@pytest.fixture(scope="module")
def oracle_captions(tiny_dataset, tmp_path_factory) -> pd.DataFrame:
    out = tmp_path_factory.mktemp("oracle_caps")
    run = caption_dataset(
        tiny_dataset,
        tiny_dataset / "ground_truth" / "events.parquet",
        out,
        GroundTruthCaptionBackend(tiny_dataset),
        "o",
        progress=False,
    )
    return run.captions


def test_complete_table_all_events_equals_matched_mean(
    tiny_dataset, oracle_captions, embedding_judge
):
    full = evaluate_captions(oracle_captions, tiny_dataset, embedding_judge)
    n_ref = len(pd.read_parquet(tiny_dataset / "ground_truth" / "events.parquet"))
    assert full.metrics["n_reference_events"] == n_ref
    assert full.metrics["coverage"] == 1.0
    assert full.r_cap_all == pytest.approx(full.mean_r_cap)
    assert list(full.metrics)[0] == "r_cap_all"  # the headline comes first


def test_failed_and_missing_captions_count_zero(tiny_dataset, oracle_captions, embedding_judge):
    full = evaluate_captions(oracle_captions, tiny_dataset, embedding_judge)
    # the captioner "failed" every other event and a whole episode (2) never got written
    part = oracle_captions[oracle_captions.episode_index != 2]
    part = part[part.event_index % 2 == 0]
    res = evaluate_captions(part, tiny_dataset, embedding_judge)
    n_ref = full.metrics["n_reference_events"]
    assert res.metrics["coverage"] == pytest.approx(len(part) / n_ref)
    kept = full.scores.merge(part[["episode_id", "start_us", "end_us"]])
    assert res.r_cap_all == pytest.approx(kept["r_cap"].sum() / n_ref)
    assert res.r_cap_all < full.r_cap_all * 0.6
    # matched-only mean does not see the missing events: that is why it is not the headline
    assert res.mean_r_cap > res.r_cap_all + 0.3


def test_duplicate_rows_for_one_event_are_not_summed(
    tiny_dataset, oracle_captions, embedding_judge
):
    one = oracle_captions[oracle_captions.episode_index == 0]
    dup = pd.concat([one, one], ignore_index=True)
    a = evaluate_captions(one, tiny_dataset, embedding_judge, episodes=[0])
    b = evaluate_captions(dup, tiny_dataset, embedding_judge, episodes=[0])
    assert a.metrics["coverage"] == b.metrics["coverage"] == 1.0
    assert b.r_cap_all == pytest.approx(a.r_cap_all)
    assert a.r_cap_all <= 1.0


def test_captions_of_another_dataset_are_refused(
    tiny_dataset, oracle_captions, embedding_judge, tmp_path
):
    """Review finding: one dataset's captions were scored against another dataset's ground
    truth without a word."""
    import shutil

    from flora.data.episode import FloraDataError

    other = tmp_path / "other_toy"
    shutil.copytree(tiny_dataset / "ground_truth", other / "ground_truth")
    judge = embedding_judge
    with pytest.raises(FloraDataError, match="toy_tiny") as e:
        evaluate_captions(oracle_captions, other, judge)
    assert (e.value.dataset, e.value.field) == ("other_toy", "dataset")
    no_col = oracle_captions.drop(columns=["dataset"])
    with pytest.raises(FloraDataError) as e:
        evaluate_captions(no_col, other, judge)
    assert (e.value.dataset, e.value.field) == ("other_toy", "episode_id")
    # The same rows named after the dataset they are scored against are accepted.
    renamed = oracle_captions.assign(
        dataset="other_toy",
        episode_id=oracle_captions.episode_id.str.replace(tiny_dataset.name, "other_toy"),
    )
    assert evaluate_captions(renamed, other, judge).metrics["n_scored"] > 0
