"""Set builders: episode splits, no ground-truth caption in any prompt, strict round trips,
the inference steps' exact requests, GX suite, mixtures."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from flora.data.dataset import open_dataset
from flora.data.ground_truth import load_ground_truth
from flora.parsing import Rejection
from flora.segment.grammar import segments_regex
from training.sets import (
    SetError,
    build_grpo_set,
    build_sft_set,
    load_set,
    read_manifest,
    split_of,
    target_problem,
)

FRACTION = 0.34


@pytest.fixture(scope="module")
def sets(tiny_dataset, tmp_path_factory):
    root = tmp_path_factory.mktemp("sets")
    kw = {"split_fraction": FRACTION, "progress": False}
    return {
        "segmenter": build_sft_set("segmenter", tiny_dataset, root / "seg", **kw),
        "captioner": build_sft_set("captioner", tiny_dataset, root / "cap", **kw),
        "rewarder": build_sft_set(
            "rewarder", tiny_dataset, root / "rew", outcome_frames=8, rubric_frames=4, **kw
        ),
        "grpo-segmenter": build_grpo_set(
            "segmenter", tiny_dataset, root / "gseg", profiles=("standard",), **kw
        ),
        "grpo-captioner": build_grpo_set("captioner", tiny_dataset, root / "gcap", **kw),
    }


def test_split_is_by_episode_hash(sets) -> None:
    splits_seen = set()
    for path in sets.values():
        exs = load_set(path)
        per: dict[str, set[str]] = {}
        for e in exs:
            per.setdefault(e.episode_id, set()).add(e.split)
        for eid, s in per.items():
            assert s == {split_of(eid, FRACTION)}, eid  # one split, from the id alone
        splits_seen |= {e.split for e in exs}
        man = read_manifest(path)
        assert not set(man["episodes"]["train"]) & set(man["episodes"]["heldout"])
    assert splits_seen == {"train", "heldout"}  # this fraction puts episodes on both sides
    assert split_of("toy/000001", 0.0) == "train"


def test_no_ground_truth_caption_reaches_a_caption_prompt(sets, tiny_dataset) -> None:
    gt = load_ground_truth(tiny_dataset)
    captions = {e.caption for i in gt.episode_indices() for e in gt.events(i)}
    assert captions
    for key in ("captioner", "grpo-captioner"):
        exs = load_set(sets[key])
        assert len(exs) == sum(len(gt.events(i)) for i in gt.episode_indices())
        for e in exs:
            text = (e.system or "") + "\n" + e.prompt
            for c in captions:
                assert c not in text and c.rstrip(".") not in text, (e.example_id, c)
            # ... while the target and reference do carry the event's own caption.
            assert e.reference_obj()["caption"].rstrip(".") in e.target


def test_targets_round_trip_through_the_strict_parsers(sets) -> None:
    from flora.caption.grammar import parse_caption
    from flora.segment.grammar import parse_segments

    kinds = set()
    for path in sets.values():
        for e in load_set(path):
            kinds.add(e.task_kind)
            assert target_problem(e.model, e.task_kind, e.target, e.reference) is None
            if e.task_kind == "segment":
                ref = e.reference_obj()
                segs = parse_segments(e.target, ref["n_ticks"])
                assert [[s.u, s.v, int(s.left_open), int(s.right_open)] for s in segs] == ref[
                    "segments"
                ]
            if e.task_kind == "caption":
                assert isinstance(parse_caption(e.target), str)
    assert kinds == {"segment", "caption", "outcome", "dense", "rubric"}
    # A wrong target is caught by the same check (the suite's derived column).
    assert target_problem("rewarder", "outcome", "score: 9", '{"score": 4}') is not None


def test_examples_are_the_inference_steps_requests(sets, tiny_dataset) -> None:
    from flora.caption.run import CaptionConfig, build_caption_requests
    from flora.reward.run import outcome_request

    ds = open_dataset(tiny_dataset)
    gt = load_ground_truth(tiny_dataset)
    ep = ds.episode(1)
    cap = {e.request_id: e for e in load_set(sets["captioner"])}
    built = build_caption_requests(
        ep, [e for e in gt.events(1)], config=CaptionConfig(neighbour_captions=False)
    )
    assert built.requests
    for req in built.requests:
        got = cap[req.request_id].to_request()
        assert (got.prompt, got.system, got.frame_times_us, got.guided_regex) == (
            req.prompt,
            req.system,
            req.frame_times_us,
            req.guided_regex,
        )
        assert all((a == b).all() for a, b in zip(got.images, req.images, strict=True))
    rew = {e.request_id: e for e in load_set(sets["rewarder"])}
    want = outcome_request(ep, 8)
    got = rew[want.request_id].to_request()
    assert got.prompt == want.prompt and got.top_logprobs == want.top_logprobs
    assert got.guided_regex == want.guided_regex is not None
    # The segmenter's windows carry their own tick count's grammar, as the engine sends it.
    for e in load_set(sets["segmenter"]):
        assert e.to_request().guided_regex == segments_regex(e.reference_obj()["n_ticks"])
    # The rewarder's three kinds are all there, unweighted.
    exs = load_set(sets["rewarder"])
    assert {e.task_kind for e in exs} == {"outcome", "dense", "rubric"}
    assert {e.weight for e in exs} == {1.0}
    rub = [e for e in exs if e.task_kind == "rubric"][0]
    assert rub.target.startswith("<think>")


def test_segmenter_covers_profiles_and_passes(sets) -> None:
    exs = load_set(sets["segmenter"])
    refs = [e.reference_obj() for e in exs]
    assert {(r["profile"], r["pass"]) for r in refs} >= {
        ("standard", "primary"),
        ("standard", "shifted"),
        ("long_horizon", "primary"),
    }
    assert len(
        {(r["window"][0], r["window"][1], e.episode_id) for r, e in zip(refs, exs, strict=True)}
    ) == len(exs)
    g = load_set(sets["grpo-segmenter"])
    assert all(e.purpose == "grpo" and "segments" in e.reference_obj() for e in g)


def test_clipped_windows_are_added_to_training_episodes_only(sets, tiny_dataset, tmp_path) -> None:
    import inspect

    from flora.segment.grammar import parse_segments
    from training.recipe import SetRecipe

    kw = {"split_fraction": FRACTION, "progress": False, "clipped": 3}
    a = build_sft_set("segmenter", tiny_dataset, tmp_path / "a", **kw)
    b = build_sft_set("segmenter", tiny_dataset, tmp_path / "b", **kw)
    assert read_manifest(a)["params"]["clipped"] == 3
    plain = {e.example_id: e for e in load_set(sets["segmenter"])}
    got = load_set(a)
    # seeded by the episode id: a rebuild is the same set
    assert [(e.example_id, e.target) for e in got] == [
        (e.example_id, e.target) for e in load_set(b)
    ]
    extra = [e for e in got if e.example_id not in plain]
    # the planned windows are all still there, unchanged
    assert {e.example_id: e.target for e in got if e.example_id in plain} == {
        k: e.target for k, e in plain.items()
    }
    assert extra and {e.split for e in extra} == {"train"}  # held-out keeps the engine's windows
    per_ep: dict[str, int] = {}
    for e in extra:
        per_ep[e.episode_id] = per_ep.get(e.episode_id, 0) + 1
        ref = e.reference_obj()
        start, end = ref["window"][:2]
        assert ref["profile"] == "standard" and end < ref["duration_us"] and end % 250_000 == 0
        assert ref["n_ticks"] == -(-(end - start) // 50_000)
        assert e.to_request().guided_regex == segments_regex(ref["n_ticks"])
        assert not isinstance(parse_segments(e.target, ref["n_ticks"]), Rejection)
    assert max(per_ep.values()) <= 3
    planned = {e.reference_obj()["n_ticks"] for e in plain.values()}
    assert {e.reference_obj()["n_ticks"] for e in extra} - planned  # clip lengths never planned
    # every field the recipe hands the builder is one of its parameters
    assert set(SetRecipe().sft_kwargs()) <= set(inspect.signature(build_sft_set).parameters)


def test_an_unreadable_window_is_a_recorded_failure_naming_its_span(tiny_dataset, tmp_path) -> None:
    import shutil

    root = tmp_path / "toy_damaged"
    shutil.copytree(tiny_dataset, root)
    for video in (root / "videos").rglob("file-001.mp4"):  # holds episode 2 only
        data = video.read_bytes()
        video.write_bytes(data[: int(len(data) * 0.95)])
    path = build_sft_set(
        "segmenter", root, tmp_path / "s", split_fraction=0.0, clipped=2, progress=False
    )
    fails = pd.read_parquet(path / "failures.parquet")
    assert set(fails["episode_id"]) == {"toy_damaged/000002"}
    assert fails["reason"].str.contains("unreadable video").all()
    # planned and clipped windows of one pass and index are told apart by their span
    assert fails["item"].is_unique and fails["item"].str.endswith(") µs").all()
    assert len(fails) > 10  # the 10 planned windows of the 26 s episode, and its clipped ones
    got = load_set(path)
    assert {e.episode_id for e in got} == {"toy_damaged/000000", "toy_damaged/000001"}


def test_a_set_of_only_failures_is_refused_with_their_reasons(tiny_dataset, tmp_path) -> None:
    """Every window unreadable: no empty set is written, the error names episodes and why."""
    import shutil

    root = tmp_path / "toy_dead"
    shutil.copytree(tiny_dataset, root)
    for video in (root / "videos").rglob("*.mp4"):
        video.write_bytes(video.read_bytes()[:64])
    for build in (build_sft_set, build_grpo_set):
        out = tmp_path / build.__name__
        with pytest.raises(
            SetError, match=r"no examples built for segmenter \(\d+ failures: "
        ) as e:
            build("segmenter", root, out, split_fraction=0.0, progress=False)
        assert "toy_dead/00000" in str(e.value) and "unreadable video" in str(e.value)
        assert not out.exists() and not list(tmp_path.glob(f".{out.name}*"))


def test_mixture_sets_events_and_splits(tiny_dataset, tmp_path) -> None:
    gt = load_ground_truth(tiny_dataset)
    ds = open_dataset(tiny_dataset)
    from flora.data.episode import make_episode_id

    rows = []
    for i, split in ((0, "train"), (2, "val")):
        for e in gt.events(i):
            rows.append(
                {
                    "episode_id": make_episode_id(ds.name, i),
                    "start_us": e.start_us,
                    "end_us": e.end_us,
                    "caption": e.caption,
                    "weight": 0.1,
                    "split": split,
                }
            )
    mix = tmp_path / "mix.parquet"
    pd.DataFrame(rows).to_parquet(mix)
    p = build_sft_set("captioner", tiny_dataset, tmp_path / "s", mixture=mix, progress=False)
    exs = load_set(p)
    assert {e.episode_id: e.split for e in exs} == {
        make_episode_id(ds.name, 0): "train",
        make_episode_id(ds.name, 2): "heldout",
    }
    bad = pd.DataFrame(rows)
    bad.loc[0, "split"] = "heldout"
    bad.to_parquet(mix)
    with pytest.raises(SetError, match="two splits"):
        build_sft_set("captioner", tiny_dataset, tmp_path / "s2", mixture=mix, progress=False)


def test_bad_requests_for_sets(tiny_dataset, tmp_path) -> None:
    with pytest.raises(SetError, match="no RL"):
        build_grpo_set("rewarder", tiny_dataset, tmp_path / "x", progress=False)
    with pytest.raises(SetError, match="unknown model"):
        build_sft_set("policy", tiny_dataset, tmp_path / "y", progress=False)
    with pytest.raises(SetError, match="not found"):
        load_set(tmp_path / "nothing")
    (tmp_path / "z").mkdir()
    pd.DataFrame({"a": [1]}).to_parquet(tmp_path / "z" / "examples.parquet")
    with pytest.raises(SetError, match="missing column"):
        load_set(tmp_path / "z")


def test_sets_are_logged_as_mlflow_datasets(sets, isolated_home) -> None:
    import mlflow

    from training.sets import log_set

    run_id = log_set(sets["rewarder"])
    run = mlflow.get_run(run_id)
    contexts = sorted(i.tags[0].value for i in run.inputs.dataset_inputs)
    assert contexts == ["heldout", "train"]
    assert read_manifest(sets["rewarder"])["mlflow_run_id"] == run_id
    assert json.loads(json.dumps(run.data.params))["set.outcome_frames"] == "8"


def test_a_set_written_before_guided_regex_still_loads(sets, tmp_path) -> None:
    import shutil

    old = tmp_path / "old"
    shutil.copytree(sets["segmenter"], old)
    f = old / "examples.parquet"
    pd.read_parquet(f).drop(columns=["guided_regex"]).to_parquet(f)
    exs = load_set(old)
    assert exs and all(e.guided_regex is None and e.to_request().guided_regex is None for e in exs)


def test_load_set_streams_row_groups_and_filters_like_the_whole_table(sets) -> None:
    """Sets are written in small row groups and read a batch at a time; what is returned
    (order, split and kind filters, every field) is what the whole table holds."""
    import pyarrow.parquet as pq

    from training.sets import EXAMPLES_FILE, SET_ROW_GROUP

    path = sets["rewarder"]
    meta = pq.ParquetFile(path / EXAMPLES_FILE).metadata
    assert all(meta.row_group(i).num_rows <= SET_ROW_GROUP for i in range(meta.num_row_groups))
    df = pd.read_parquet(path / EXAMPLES_FILE)
    every = load_set(path)
    assert [e.example_id for e in every] == list(df.example_id)
    assert [bytes(b) for b in df.images.iloc[-1]] == every[-1].images
    held = load_set(path, split="heldout", kinds=["dense", "rubric"])
    want = df[(df.split == "heldout") & df.task_kind.isin(["dense", "rubric"])]
    assert [e.example_id for e in held] == list(want.example_id) and len(held) > 0
    with pytest.raises(SetError, match="split must be one of"):
        load_set(path, split="val")


def test_grpo_prompts_decode_frames_only_when_a_step_uses_them(sets) -> None:
    from training.grpo import prompts_from_examples

    exs = load_set(sets["grpo-segmenter"])
    prompts = prompts_from_examples(exs)
    assert all(e._decoded is None for e in exs)  # nothing decoded up front
    req = prompts[0].request
    assert len(req.images) == len(exs[0].images) and req.images[0].ndim == 3
    assert exs[0]._decoded is None  # built per use, not kept on the example
    assert prompts[0].guided_regex == exs[0].guided_regex
    assert req.guided_regex == exs[0].guided_regex


@pytest.fixture(scope="module")
def curated_mixture(tiny_dataset, tmp_path_factory):
    """The mixture ``flora curate`` writes for the tiny world (oracle tables)."""
    from flora.curate.oracle import write_oracle_tables
    from flora.curate.run import curate_dataset

    root = tmp_path_factory.mktemp("curated")
    write_oracle_tables(tiny_dataset, root / "tables", "run-gt")
    curate_dataset(tiny_dataset, root / "tables", root / "out", "run-cur")
    mix = root / "out" / "curated" / tiny_dataset.name / "mixture.parquet"
    assert set(pd.read_parquet(mix).split) == {"pretrain", "policy", "failures"}
    return mix


def test_captioner_sets_from_a_curated_mixture(tiny_dataset, curated_mixture, tmp_path) -> None:
    """A curated mixture's splits say what a row is for: the captioner's targets are its
    ``pretrain`` rows, split train / held-out by episode hash, each with the reference
    requirements of the ground-truth event of the same interval (so r_cap can score them)."""
    from flora.data.episode import make_episode_id
    from flora.metrics.caption import score_caption
    from training.grpo import prompts_from_examples, score_completions
    from training.rewards import make_judge
    from training.sets import NO_REQUIREMENTS, set_failures

    mix = pd.read_parquet(curated_mixture)
    pre = mix[mix.split == "pretrain"]
    want = {(r.episode_id, int(r.start_us), int(r.end_us)) for r in pre.itertuples()}
    gt = load_ground_truth(tiny_dataset)
    name = open_dataset(tiny_dataset).name
    truth = {(make_episode_id(name, i), e.start_us, e.end_us): e
             for i in gt.episode_indices() for e in gt.events(i)}  # fmt: skip
    kw = {"split_fraction": FRACTION, "mixture": curated_mixture, "progress": False}
    sft = build_sft_set("captioner", tiny_dataset, tmp_path / "sft", **kw)
    grpo = build_grpo_set("captioner", tiny_dataset, tmp_path / "grpo", **kw)
    judge = make_judge("embedding")
    for path in (sft, grpo):
        exs = load_set(path)
        got = {(e.episode_id, *(e.reference_obj()[k] for k in ("start_us", "end_us"))) for e in exs}
        assert got == want  # the pretrain rows, each once
        assert all(e.split == split_of(e.episode_id, FRACTION) for e in exs)
        for e in exs:
            t = truth[(e.episode_id, e.reference_obj()["start_us"], e.reference_obj()["end_us"])]
            assert len(e.reference_obj()["requirements"]) == len(t.requirements) > 0
    # The reference caption scores what it should, as a GRPO reward and in evaluation.
    ex = load_set(grpo, split="train")[0]
    (p,) = prompts_from_examples([ex])
    assert score_completions(p, [ex.target], judge)[0].value > 0.9
    ref = ex.reference_obj()
    assert score_caption(judge, ref["caption"], ref["requirements"]).reward > 0.9

    # No ground truth (a fleet): SFT needs no requirements; a GRPO set cannot score any event.
    import shutil

    fleet = tmp_path / tiny_dataset.name
    shutil.copytree(tiny_dataset, fleet)
    shutil.rmtree(fleet / "ground_truth")
    kw["mixture"] = curated_mixture
    bare = load_set(build_sft_set("captioner", fleet, tmp_path / "fleet_sft", **kw))
    assert len(bare) == len(want) and not any(e.reference_obj()["requirements"] for e in bare)
    with pytest.raises(SetError, match=r"no examples built for captioner.*r_cap needs them"):
        build_grpo_set("captioner", fleet, tmp_path / "fleet_grpo", **kw)
    with pytest.raises(ValueError, match="no reference requirements"):
        prompts_from_examples(bare[:1])
    assert set_failures(grpo).empty or NO_REQUIREMENTS not in set(set_failures(grpo).reason)
