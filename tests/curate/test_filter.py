"""Filtering rules on hand-built tables: every rule, missing tables, NaN, no events."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from tests.curate.builders import SPANS, Tables, eid, meta


def _decide(tmp_path, m, **overrides):
    """The decisions alone (no GX, no mixture): the rules are what is under test."""
    from flora.curate.filter import decide
    from flora.curate.rules import load_rules
    from flora.curate.sources import load_annotations

    return decide(load_annotations(tmp_path / "t"), m, load_rules(**overrides), "cur-run")


def _curate(tmp_path, m, **overrides):
    from flora.curate.rules import load_rules
    from flora.curate.run import curate_dataset

    return curate_dataset("toy", tmp_path / "t", tmp_path / "out", "cur-run", meta=m,
                          rules=load_rules(**overrides))  # fmt: skip


def _row(res, i, k):
    d = res if isinstance(res, pd.DataFrame) else res.decisions
    return d[(d.episode_id == eid(i)) & (d.event_index == k)].iloc[0]


def test_outcome_rule_sends_low_reward_episodes_to_failures(tmp_path):
    t = Tables(tmp_path / "t")
    t.full(0, SPANS, reward=0.9)
    t.full(1, SPANS, reward=0.5)
    res = _curate(tmp_path, meta({0: "a", 1: "a"}))
    ok, bad = _row(res, 0, 0), _row(res, 1, 0)
    assert ok.pretrain and ok.policy and not ok.failures
    assert bad.failures and not bad.policy and not bad.pretrain
    assert "outcome: reward 0.500 < 0.6" in bad.failure_reason
    mix = res.mixture
    assert set(mix[mix.split == "failures"].episode_id) == {eid(1)}  # kept, never deleted
    assert eid(1) not in set(mix[mix.split == "pretrain"].episode_id)
    # A looser threshold keeps it.
    res2 = _decide(tmp_path, meta({0: "a", 1: "a"}), outcome={"min_reward": 0.4})
    assert _row(res2, 1, 0).pretrain


def test_dense_failure_spans_and_suboptimal_rule(tmp_path):
    t = Tables(tmp_path / "t")
    labels = [3] * 20
    labels[4] = 1  # [2.0, 2.5) s: inside event 1 [2.0, 3.5)
    labels[14] = labels[15] = 2  # [7.0, 8.0) s: suboptimal inside event 3 [6.0, 9.0)
    t.full(0, SPANS, labels=labels)
    res = _decide(tmp_path, meta({0: "a"}))
    assert _row(res, 0, 1).failures and "label-1 span [2.00 s, 2.50 s)" in _row(
        res, 0, 1).failure_reason  # fmt: skip
    assert _row(res, 0, 0).pretrain and _row(res, 0, 2).pretrain
    assert _row(res, 0, 3).pretrain  # suboptimal: keep (default)
    # Overlap threshold: 0.5 s of a 1.5 s segment is 33 %; a 50 % threshold keeps it.
    assert _row(_decide(tmp_path, meta({0: "a"}), dense={"failure_overlap": 0.5}), 0, 1).pretrain
    dropped = _row(_decide(tmp_path, meta({0: "a"}), dense={"suboptimal": "drop"}), 0, 3)
    assert not dropped.policy and not dropped.failures and "suboptimal" in dropped.drop_reason
    failed = _row(_decide(tmp_path, meta({0: "a"}), dense={"suboptimal": "failures"}), 0, 3)
    assert failed.failures and "label-2" in failed.failure_reason
    # min_span_s: a 0.5 s failure span is ignored when spans must last 1 s.
    assert _row(_decide(tmp_path, meta({0: "a"}), dense={"min_span_s": 1.0}), 0, 1).pretrain


def test_rejected_captions_and_caption_quality(tmp_path):
    t = Tables(tmp_path / "t")
    spans = [*SPANS[:3], (6.0, 9.0, "move")]  # one-word caption
    t.full(0, spans, reject=(1,))
    res = _curate(tmp_path, meta({0: "a"}))  # the mixture suite accepts these decisions
    rej, short = _row(res, 0, 1), _row(res, 0, 3)
    assert rej.caption_status == "rejected" and not rej.pretrain and rej.policy
    assert "caption: rejected (grammar rejection" in rej.reason
    assert short.caption_status == "accepted" and not short.pretrain and short.policy
    assert "1 words outside [2, 40]" in short.reason
    loose = _decide(tmp_path, meta({0: "a"}), caption={"min_words": 1})
    assert _row(loose, 0, 3).pretrain and not _row(loose, 0, 1).pretrain
    strict = _row(_decide(tmp_path, meta({0: "a"}), caption={"on_rejected": "drop"}), 0, 1)
    assert not strict.policy and "on_rejected=drop" in strict.drop_reason


def test_a_caption_of_another_interval_is_stale_not_this_events(tmp_path):
    """Events written again after captioning (segments 1 and 2 merged): each caption is
    tied to its event by index *and* interval, so the old captions are not pinned on the
    new segments with the same indices (they would go to pretraining mislabelled)."""
    t = Tables(tmp_path / "t")
    t.full(0, SPANS)
    merged = [SPANS[0], (2.0, 6.0, ""), SPANS[3]]
    t.events(0, merged)
    res = _decide(tmp_path, meta({0: "a"}))
    assert _row(res, 0, 0).caption == SPANS[0][2] and _row(res, 0, 0).pretrain
    for k in (1, 2):
        row = _row(res, 0, k)
        assert row.caption_status == "missing" and not row.pretrain and row.policy
        assert "caption: stale, written for [" in row.reason
    assert len(res[res.episode_id == eid(0)]) == 3


def test_duration_rules(tmp_path):
    t = Tables(tmp_path / "t")
    spans = [(0.5, 0.6, "reach toward the red block"), (1.0, 9.0, "move the red block away")]
    t.full(0, spans)
    t.full(1, SPANS, T=0.5, labels=[3])
    m = pd.concat([meta({0: "a"}), meta({1: "b"}, duration_s=0.5)], ignore_index=True)
    res = _decide(tmp_path, m, duration={"max_segment_s": 5.0})
    assert "segment 0.10 s < 0.25 s" in _row(res, 0, 0).drop_reason
    assert "segment 8.00 s > 5.0 s" in _row(res, 0, 1).drop_reason
    assert all("episode 0.50 s < 1.0 s" in r for r in res[res.episode_id == eid(1)].drop_reason)


def test_missing_tables_nan_rewards_and_episodes_without_events(tmp_path):
    t = Tables(tmp_path / "t")
    t.full(0, SPANS)
    t.events(1, SPANS)
    t.outcome(1, None, reason="grammar: no score token")  # the rewarder failed
    t.full(2, SPANS, reward=float("nan"))
    t.outcome(3, 0.9)  # no events at all (segment step wrote nothing)
    res = _curate(tmp_path, meta({0: "a", 1: "a", 2: "b", 3: "c"}))  # valid mixture
    r1 = _row(res, 1, 0)
    assert r1.policy and not r1.pretrain and math.isnan(r1.reward)
    assert "outcome: missing (episode: grammar: no score token); not judged" in r1.reason
    assert "captions: missing" in r1.reason and "dense_labels: missing" in r1.reason
    r2 = _row(res, 2, 0)
    assert "outcome: reward is NaN" in r2.reason and r2.pretrain
    r3 = _row(res, 3, -1)  # the whole episode is one item
    assert (r3.start_us, r3.end_us) == (0, 10_000_000) and r3.policy and not r3.pretrain
    assert "no events" in r3.reason
    # outcome.on_missing: drop removes unjudged episodes.
    res_d = _decide(tmp_path, meta({0: "a", 1: "a", 2: "b", 3: "c"}),
                    outcome={"on_missing": "drop"})  # fmt: skip
    assert not _row(res_d, 1, 0).policy and "on_missing=drop" in _row(res_d, 1, 0).drop_reason
    assert not _row(res_d, 2, 0).policy


def test_all_filtered_out_is_an_error_not_an_empty_file(tmp_path):
    from flora.curate.rebalance import EmptyMixtureError

    t = Tables(tmp_path / "t")
    t.full(0, SPANS, reward=0.9)
    with pytest.raises(EmptyMixtureError, match="curated mixture is empty.*duration"):
        _curate(tmp_path, meta({0: "a"}), splits=["pretrain"], duration={"min_episode_s": 60})
    assert not (tmp_path / "out" / "curated").exists()


def test_rules_file_errors_name_the_field(tmp_path):
    from flora.curate.rules import RulesError, load_rules

    p = tmp_path / "r.yaml"
    p.write_text("outcome:\n  min_reward: 2\n")
    with pytest.raises(RulesError, match=r"outcome.min_reward"):
        load_rules(p)
    p.write_text("rebalance:\n  strata: [task, colour]\n")
    with pytest.raises(RulesError, match="strata"):
        load_rules(p)
    assert load_rules().outcome.min_reward == 0.6  # the packaged default.yaml


def test_resume_rewrites_only_changed_episodes_and_lineage(tmp_path):
    from flora.curate.run import read_mixture

    t = Tables(tmp_path / "t")
    t.full(0, SPANS)
    t.full(1, SPANS)
    res = _curate(tmp_path, meta({0: "a", 1: "b"}))
    assert sorted(res.processed) == [eid(0), eid(1)] and res.skipped == []
    t.outcome(1, 0.1)
    res2 = _curate(tmp_path, meta({0: "a", 1: "b"}))
    assert res2.processed == [eid(1)] and res2.skipped == [eid(0)]
    mix = read_mixture(res2.mixture_path)
    assert set(mix.split) == {"pretrain", "policy", "failures"}
    for r in mix.itertuples():
        assert set(r.source_run_ids) <= {"seg-run", "cap-run", "rw-run"}
        assert "events" in r.source_tables


def test_per_table_artifact_roots_and_episodes_without_any_annotation(tmp_path):
    """KFP hands each table as its own artifact root (``<artifact>/<table>/``)."""
    import shutil

    from flora.curate.filter import decide
    from flora.curate.rules import load_rules
    from flora.curate.sources import load_annotations

    t = Tables(tmp_path / "t")
    t.full(0, SPANS)
    roots = {}
    for table in ("events", "captions", "outcome", "dense_labels"):
        art = tmp_path / "kfp" / table  # artifact named like its table
        shutil.copytree(tmp_path / "t" / table, art / table)
        roots[table] = art
    ann = load_annotations(roots)
    assert len(ann.table("events")) == 4 and len(ann.table("rubric")) == 0
    d = decide(ann, meta({0: "a", 5: "b"}), load_rules(), "r")
    assert d[d.episode_id == eid(0)].pretrain.all()
    (lost,) = d[d.episode_id == eid(5)].itertuples()  # nothing was written for episode 5
    assert not lost.policy and not lost.failures and "lineage" in lost.drop_reason


def test_a_hub_dataset_with_a_revision_is_curated_under_its_name(tmp_path):
    """`flora curate org/toy@v1` keys the curation by `toy`, the name the readers give the
    dataset's episodes (it was `toy@v1`: a mixture no step found)."""
    from flora.curate.run import mixture_path
    from flora.data.dataset import dataset_name

    t = Tables(tmp_path / "t")
    t.full(0, SPANS, reward=0.9)
    from flora.curate.rules import load_rules
    from flora.curate.run import curate_dataset

    res = curate_dataset("org/toy@v1", tmp_path / "t", tmp_path / "out", "cur-run",
                         meta=meta({0: "a"}), rules=load_rules())  # fmt: skip
    assert res.dataset == "toy" == dataset_name("org/toy") == dataset_name("org/toy@main")
    assert res.mixture_path == mixture_path(tmp_path / "out", "toy")
    assert dataset_name(tmp_path / "t") == "t"  # a local folder, even one named org/x


def test_an_episode_without_events_meets_the_dense_rules(tmp_path):
    """The whole-episode item (no events written) is judged by the dense failure and
    suboptimal rules like a segment (it went to `policy` despite a labelled failure), but
    not by the segment duration rules."""
    t = Tables(tmp_path / "t")
    t.outcome(0, 0.9)
    labels = [3] * 20
    labels[4:10] = [1] * 6  # [2.0, 5.0) s: failure
    t.dense(0, labels)
    t.outcome(1, 0.9)
    t.dense(1, [3] * 14 + [2] * 2 + [3] * 4)  # [7.0, 8.0) s: suboptimal
    m = meta({0: "a", 1: "b"})
    res = _decide(tmp_path, m, duration={"max_segment_s": 5.0})
    r0 = _row(res, 0, -1)
    assert r0.failures and not r0.policy and "label-1 span [2.00 s, 5.00 s)" in r0.failure_reason
    assert "30% of episode" in r0.failure_reason
    r1 = _row(res, 1, -1)
    assert r1.policy and r1.drop_reason is None  # 10 s > max_segment_s: not a segment rule
    dropped = _row(_decide(tmp_path, m, dense={"suboptimal": "drop"}), 1, -1)
    assert not dropped.policy and "suboptimal" in dropped.drop_reason


def test_a_refused_recuration_changes_nothing_on_disk(tmp_path):
    """Run 2's rules empty the mixture: it raises before committing any decision, so the
    decisions and the mixture on disk are still run 1's (they used to be run 2's decisions
    beside run 1's mixture)."""
    from flora.curate.rebalance import EmptyMixtureError
    from flora.curate.rules import load_rules
    from flora.curate.run import curate_dataset, read_mixture
    from flora.tables import TableStore

    t = Tables(tmp_path / "t")
    t.full(0, SPANS)
    t.full(1, SPANS)
    m = meta({0: "a", 1: "b"})
    r1 = curate_dataset("toy", tmp_path / "t", tmp_path / "out", "run1", meta=m,
                        rules=load_rules())  # fmt: skip
    summary = r1.mixture_path.with_suffix(".json").read_text()
    strict = load_rules(splits=["pretrain"], duration={"min_episode_s": 60})
    with pytest.raises(EmptyMixtureError, match="nothing was changed"):
        curate_dataset("toy", tmp_path / "t", tmp_path / "out", "run2", meta=m, rules=strict)
    dec = TableStore(tmp_path / "out").read("curation")
    assert set(dec.run_id) == {"run1"} and dec.pretrain.sum() == r1.decisions.pretrain.sum()
    mix = read_mixture(r1.mixture_path)
    assert set(mix.run_id) == {"run1"} and len(mix) == len(r1.mixture)
    assert r1.mixture_path.with_suffix(".json").read_text() == summary
    assert sorted(p.name for p in r1.mixture_path.parent.iterdir()) == [
        "mixture.json", "mixture.parquet"]  # no staged file left  # fmt: skip


def test_a_caption_rejection_of_another_interval_is_stale(tmp_path):
    """A rejection names its interval (`event 1 [2000000, 3500000) µs`): after the episode
    was segmented again it is not the new event 1's (it used to drop it under
    `caption.on_rejected: drop`)."""
    from flora.curate.filter import item_interval

    assert item_interval("event 1 [2000000, 3500000) µs") == ("event", 1, 2_000_000, 3_500_000)
    window = item_interval("window 1 [6000000, 10000000) us")
    assert window == ("window", 1, 6_000_000, 10_000_000)
    no_interval = ("event", 2, None, None)
    assert item_interval("event 2 [?, ?) µs") == item_interval("event 2") == no_interval
    assert item_interval("episode") is None
    t = Tables(tmp_path / "t")
    t.full(0, SPANS, reject=(1,))  # event 1 [2.0, 3.5) s rejected
    t.events(0, [SPANS[0], (2.0, 6.0, ""), SPANS[3]])  # new event 1 [2.0, 6.0) s
    res = _decide(tmp_path, meta({0: "a"}), caption={"on_rejected": "drop"})
    row = _row(res, 0, 1)
    assert row.policy and row.drop_reason is None and row.caption_status == "missing"
    assert "caption: stale rejection, recorded for 'event 1 [2000000, 3500000) µs'" in row.reason


def test_time_without_dense_labels_is_noted_not_cleared(tmp_path):
    """A failed dense window leaves [6, 10) s unlabelled: the event inside it says so (it
    read as if the dense labels had cleared it); its split does not change."""
    from flora.tables import Failure

    t = Tables(tmp_path / "t")
    t.full(0, SPANS)
    t.dense(0, [3] * 12)  # labels for [0, 6) s only
    fail = Failure("dense_labels", eid(0), "window 1 [6000000, 10000000) us", "grammar: bad group")
    t.store.record_failures("dense_labels", eid(0), [fail])
    res = _decide(tmp_path, meta({0: "a"}))
    r3 = _row(res, 0, 3)  # [6.0, 9.0) s
    assert r3.pretrain and not r3.failures
    assert ("dense: no labels for [6.00, 9.00) s (window 1 [6000000, 10000000) us: "
            "grammar: bad group)") in r3.reason  # fmt: skip
    assert "no labels" not in _row(res, 0, 2).reason  # [3.5, 6.0) s is labelled


def test_a_failure_in_the_last_group_cut_at_t_counts(tmp_path):
    """T = 9.8 s: the last 0.5 s group is cut to [9.5, 9.8) s. min_span_s (0.5) is judged
    on the uncut group, so its failure is not ignored (it was: 0.3 s < 0.5 s)."""
    from flora.curate.filter import Span, dense_spans

    T = 9.8
    t = Tables(tmp_path / "t")
    spans = [(0.5, 5.0, "reach toward the red block"), (5.0, 9.8, "lift the red block")]
    labels = [3] * 20
    labels[19] = 1
    t.full(0, spans, labels=labels, T=T)
    assert dense_spans(t.store.read("dense_labels"), 9_800_000, 500_000) == [
        Span(9_500_000, 9_800_000, 1, "drop: object fell")]  # fmt: skip
    res = _decide(tmp_path, meta({0: "a"}, duration_s=T))
    assert _row(res, 0, 1).failures and "[9.50 s, 9.80 s)" in _row(res, 0, 1).failure_reason
    assert _row(res, 0, 0).pretrain
    # Two groups are needed for 1 s: the single (cut) group is still ignored then.
    assert _row(_decide(tmp_path, meta({0: "a"}, duration_s=T), dense={"min_span_s": 1.0}),
                0, 1).pretrain  # fmt: skip


def test_contradictory_rule_ranges_are_refused(tmp_path):
    """min > max emptied a split without a word; now the rules are refused, naming it."""
    from flora.curate.rules import RulesError, load_rules

    with pytest.raises(RulesError, match=r"field caption: min_words \(12\) > max_words \(8\)"):
        load_rules(caption={"min_words": 12, "max_words": 8})
    p = tmp_path / "r.yaml"
    p.write_text("duration:\n  min_segment_s: 10\n  max_segment_s: 5\n")
    with pytest.raises(RulesError, match=r"r.yaml: field duration: min_segment_s .*max_segment_s"):
        load_rules(p)
    ok = load_rules(caption={"min_words": 5, "max_words": 5})  # equal bounds are a range
    assert ok.caption.min_words == ok.caption.max_words == 5
