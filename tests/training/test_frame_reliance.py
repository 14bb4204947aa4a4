"""The frame-swap measure (training.frame_reliance): donors, the swap itself, the table."""

from __future__ import annotations

import dataclasses

import numpy as np

from training.frame_reliance import donors, frame_swap_table, reliance_metrics, with_frames
from training.sets import load_set


def _with_twins(seg_set) -> list:
    """The set's windows plus, per window, a twin from another episode: same kind and
    frame count, its frames in reverse order (the tiny set's episodes differ in length,
    so none of its own windows share a frame count across episodes)."""
    ex = load_set(seg_set)
    twins = [
        dataclasses.replace(e, example_id=e.example_id + "~", episode_id=e.episode_id + "~",
                            images=e.images[::-1], _decoded=None)
        for e in ex
    ]  # fmt: skip
    return ex + twins


def test_donor_is_another_episodes_item_of_the_same_kind_and_frame_count(seg_set) -> None:
    ex = _with_twins(seg_set)
    # A lone group: one item of a kind nobody else has gets no donor.
    ex.append(dataclasses.replace(ex[0], task_kind="odd", example_id="odd"))
    pick = donors(ex)
    assert len(ex) - 1 not in pick
    assert pick
    for i, d in pick.items():
        assert ex[d].episode_id != ex[i].episode_id
        assert (ex[d].task_kind, len(ex[d].images)) == (ex[i].task_kind, len(ex[i].images))
    # Every item whose group spans two episodes gets one.
    eps = {}
    for e in ex:
        eps.setdefault((e.task_kind, len(e.images)), set()).add(e.episode_id)
    want = {i for i, e in enumerate(ex) if len(eps[(e.task_kind, len(e.images))]) > 1}
    assert set(pick) == want


def test_swapped_item_carries_the_donors_frames_even_once_decoded(seg_set) -> None:
    ex = _with_twins(seg_set)
    i, d = next(iter(donors(ex).items()))
    ex[i].image_arrays()  # fill the decoded cache: a swap must not reuse it
    swapped = with_frames(ex[i], ex[d])
    got, want = swapped.image_arrays(), ex[d].image_arrays()
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
    assert (swapped.prompt, swapped.target) == (ex[i].prompt, ex[i].target)


def test_table_scores_own_and_donor_frames_through_the_model(tiny_base, seg_set) -> None:
    from transformers import AutoModelForImageTextToText

    from flora.backends.processing import load_processor
    from training.sft import encode_items

    ex = _with_twins(seg_set)
    ex = [ex[0], ex[len(ex) // 2]]  # a window and its twin: each the other's donor
    model = AutoModelForImageTextToText.from_pretrained(str(tiny_base)).eval()
    processor = load_processor(tiny_base, "images")
    table = frame_swap_table(model, processor, ex)
    assert len(table) == len(donors(ex)) > 0
    n = {it.example_id: it.n_target for it in encode_items(ex, processor)}
    assert table["tokens"].tolist() == [n[i] for i in table["example_id"]]
    assert (table["own"] > 0).all() and (table["swapped"] > 0).all()
    # Even a random model's target loss moves with its frames: the donor's reach it.
    assert (table["own"] != table["swapped"]).any()
    m = reliance_metrics(table)
    assert np.isclose(m["delta"], m["swapped_nll"] - m["own_nll"])
    assert np.isclose(m["own_nll"], table["own"].sum() / table["tokens"].sum())
