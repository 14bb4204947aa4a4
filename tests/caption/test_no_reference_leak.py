"""Ground-truth captions never reach a captioner prompt (DESIGN §3.2, issue 16).

The context of an event is its neighbouring *clips*. In the toy world a neighbour's
caption predicts the target's almost completely, so a prompt that quotes reference
captions would train and score the model on copying its neighbours' answers.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from flora.caption.run import (
    CaptionConfig,
    build_caption_requests,
    is_reference_table,
    load_events_table,
)
from flora.data.dataset import open_dataset
from flora.data.episode import FloraDataError


def _gt_events(root: Path) -> Path:
    return root / "ground_truth" / "events.parquet"


def _prompts(root: Path, table: pd.DataFrame, cfg: CaptionConfig) -> list[str]:
    """Every prompt the captioner would send for ``table`` (one request per event)."""
    ds = open_dataset(root)
    prompts: list[str] = []
    for eid, g in table.groupby("episode_id"):
        ep = ds.episode(int(str(eid).rpartition("/")[2]))
        g = g.sort_values("event_index", kind="stable")
        built = build_caption_requests(
            ep,
            list(g.itertuples(index=False)),
            config=cfg,
            event_indices=[int(i) for i in g["event_index"]],
        )
        prompts += [r.prompt for r in built.requests]
    return prompts


def _reference_captions(root: Path) -> list[str]:
    caps = pd.read_parquet(_gt_events(root))["caption"].astype(str).str.strip()
    return sorted({c.rstrip(".") for c in caps if c})


def test_ground_truth_table_puts_no_reference_caption_in_any_prompt(tiny_dataset):
    name = open_dataset(tiny_dataset).name
    table = load_events_table(_gt_events(tiny_dataset), name)
    assert (table["caption"] == "").all()  # dropped at the boundary, not just unused
    prompts = _prompts(tiny_dataset, table, CaptionConfig())
    refs = _reference_captions(tiny_dataset)
    assert prompts and refs
    leaks = [(c, i) for c in refs for i, p in enumerate(prompts) if c in p]
    assert not leaks


def test_events_passed_directly_keep_their_captions_out_by_default(tiny_dataset):
    """Set builders hand ground-truth Event objects (captions included) to the builder."""
    from flora.data.ground_truth import load_ground_truth

    ds = open_dataset(tiny_dataset)
    gt = load_ground_truth(tiny_dataset)
    refs = _reference_captions(tiny_dataset)
    for i in range(len(ds)):
        events = gt.events(i)
        assert any(e.caption for e in events)
        for req in build_caption_requests(ds.episode(i), events).requests:
            assert not [c for c in refs if c in req.prompt]


def test_a_previous_model_pass_can_be_quoted_and_the_check_sees_it(tiny_dataset):
    """Positive control: the option works for a model pass, so the leak check can fire."""
    name = open_dataset(tiny_dataset).name
    gt = load_events_table(_gt_events(tiny_dataset), name)
    raw = pd.read_parquet(_gt_events(tiny_dataset))
    gt["caption"] = raw["caption"].to_numpy()  # same order: episode_index, start
    gt["model"] = "flora-captioner"
    gt["model_version"] = "3"
    assert not is_reference_table(gt)
    table = load_events_table(gt, name, neighbour_captions=True)
    prompts = _prompts(tiny_dataset, table, CaptionConfig(neighbour_captions=True))
    refs = _reference_captions(tiny_dataset)
    assert any(c in p for c in refs for p in prompts)


@pytest.mark.parametrize("model", [None, "ground-truth-oracle", "gt", ""])
def test_neighbour_captions_from_a_reference_table_are_refused(tiny_dataset, model):
    name = open_dataset(tiny_dataset).name
    df = pd.read_parquet(_gt_events(tiny_dataset))
    if model is not None:
        df["model"] = model
    with pytest.raises(FloraDataError, match="ground-truth") as e:
        load_events_table(df, name, neighbour_captions=True)
    assert e.value.field == "caption"


def test_builder_refuses_ground_truth_events_with_neighbour_captions(tiny_dataset):
    from flora.data.ground_truth import load_ground_truth

    ds = open_dataset(tiny_dataset)
    events = load_ground_truth(tiny_dataset).events(2)
    with pytest.raises(FloraDataError, match="previous model pass"):
        build_caption_requests(ds.episode(2), events, config=CaptionConfig(neighbour_captions=True))


def test_cli_refuses_the_combination_with_one_clear_line(tiny_dataset, tmp_path):
    env = {**os.environ, "FLORA_HOME": str(tmp_path / "home")}
    cmd = [sys.executable, "-m", "flora.cli", "caption", str(tiny_dataset)]
    cmd += ["--events", str(_gt_events(tiny_dataset)), "--oracle", "--neighbour-captions"]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 2
    assert "ground-truth" in res.stderr and "--neighbour-captions" in res.stderr
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "home" / "outputs" / "captions").exists()


@pytest.mark.parametrize("null", ["absent", None, float("nan"), pd.NA])
def test_a_null_model_counts_as_reference(tiny_dataset, null):
    """Review finding: a model pass concatenated with ground-truth rows gives those rows a
    null ``model`` (NaN/None), which ``astype(str)`` turned into the model "nan"/"None":
    the ground-truth captions reached the prompts as neighbour captions."""
    from collections import namedtuple

    ds = open_dataset(tiny_dataset)
    raw = pd.read_parquet(_gt_events(tiny_dataset))
    raw = raw[raw.episode_index == 0].reset_index(drop=True)
    absent = isinstance(null, str)  # no model column on the ground-truth rows at all
    gt_rows = raw.iloc[1:] if absent else raw.iloc[1:].assign(model=null)
    model_rows = raw.iloc[:1].assign(model="flora-segmenter", caption="reach the ball.")
    mixed = pd.concat([model_rows, gt_rows], ignore_index=True)
    assert is_reference_table(mixed)
    with pytest.raises(FloraDataError, match="ground-truth") as e:
        load_events_table(mixed, ds.name, neighbour_captions=True)
    assert e.value.field == "caption"
    # The same rows handed to the request builder as objects (set builders do this).
    Ev = namedtuple("Ev", "start_us end_us caption model")
    model = None if absent else null
    events = [
        Ev(int(r.start_us), int(r.end_us), str(r.caption), model) for r in raw.iloc[:3].itertuples()
    ]
    with pytest.raises(FloraDataError, match="previous model pass"):
        build_caption_requests(ds.episode(0), events, config=CaptionConfig(neighbour_captions=True))
