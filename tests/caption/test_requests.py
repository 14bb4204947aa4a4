"""Model input of the captioner: mosaics, explicit roles, camera names, missing views."""

from __future__ import annotations

import copy
import dataclasses
import json

import numpy as np
import pytest

from flora.caption.context import select_contexts
from flora.caption.oracle import GroundTruthCaptionBackend
from flora.caption.run import CaptionConfig, build_caption_requests, caption_episode
from flora.data.dataset import open_dataset
from flora.data.frames import sample_frames
from flora.data.ground_truth import load_ground_truth


@pytest.fixture(scope="module")
def ep1(tiny_dataset):
    ds = open_dataset(tiny_dataset)
    ep = ds.episode(1)
    return ep, load_ground_truth(tiny_dataset).events(1)


def _ranges(prompt: str, role: str) -> tuple[int, int]:
    line = next(x for x in prompt.splitlines() if x.startswith(f"- {role} "))
    span = line.split(": ", 1)[1].split(",")[0].removeprefix("images ").removeprefix("image ")
    a, _, b = span.partition("-")
    return int(a), int(b or a)


def test_mosaic_layout_and_roles_in_the_prompt(ep1):
    ep, events = ep1
    built = build_caption_requests(ep, events)
    assert not built.failures and len(built.requests) == len(events)
    main, wrist = ep.camera_by_role("main"), ep.camera_by_role("wrist")
    ctxs = select_contexts(events, ep.duration_us)
    for req, meta, ctx in zip(built.requests, built.meta, ctxs, strict=True):
        p = req.prompt
        assert "left to right: main (third-person camera over the workspace) | wrist" in p
        assert "one description that is consistent with all of them" in p
        assert "never write a failed attempt as a success" in p
        assert p.rstrip().endswith("caption: <one sentence ending with a period>")
        assert meta["views"] == ("main", "wrist")
        # roles explicit, image numbers contiguous and covering every image in order
        seen = 0
        for c in ctx.clips:
            a, b = _ranges(p, c.role)
            assert a == seen + 1 and b >= a
            ts = req.frame_times_us[a - 1 : b]
            assert all(c.start_us <= t < c.end_us for t in ts) and ts == sorted(ts)
            seen = b
        assert seen == len(req.images) == len(req.frame_times_us) == meta["n"]
        for role in ("BEFORE", "AFTER"):
            if role not in ctx.roles:
                assert f"There is no {role} context" in p
        for img in req.images:
            assert img.shape == (main.height, main.width + wrist.width, 3)
    # the left tile is the main camera's frame, the right tile the wrist camera's
    req = built.requests[1]
    t = req.frame_times_us[0]
    (fm,), (fw,) = sample_frames(main, [t]), sample_frames(wrist, [t])
    np.testing.assert_array_equal(req.images[0][:, : main.width], fm.image)
    np.testing.assert_array_equal(req.images[0][:, main.width :], fw.image)


def test_long_target_is_thinned_and_context_is_4_frames(ep1):
    ep, events = ep1
    cfg = CaptionConfig(max_target_frames=3)
    built = build_caption_requests(ep, events, config=cfg)
    for req, meta in zip(built.requests, built.meta, strict=True):
        ctx = meta["ctx"]
        a, b = _ranges(req.prompt, "TARGET")
        assert b - a + 1 <= 3
        if "BEFORE" in ctx.roles:
            a, b = _ranges(req.prompt, "BEFORE")
            assert b - a + 1 == min(4, -(-ctx.clip("BEFORE").duration_us // 500_000))


def test_single_camera_dataset_works_unchanged(tmp_path):
    from flora.data.synth import generate

    root = generate(
        tmp_path / "one_cam",
        episodes=1,
        seed=3,
        durations_s=(6.0,),
        cameras=("top",),
        progress=False,
    )
    ep = open_dataset(root).episode(0)
    events = load_ground_truth(root).events(0)
    built = build_caption_requests(ep, events)
    assert built.requests and not built.failures
    cam = ep.camera_by_role("main")
    for req in built.requests:
        assert "Each image is a single view: main" in req.prompt and "wrist" not in req.prompt
        assert all(img.shape == (cam.height, cam.width, 3) for img in req.images)
    out = caption_episode(ep, events, GroundTruthCaptionBackend(root))
    assert set(out.rows.views) == {"main"} and not out.failures


def test_camera_missing_for_part_of_the_episode(ep1, tiny_dataset):
    ep, events = ep1
    cut = 3_000_000  # the wrist camera stops after 3 s
    ep2 = copy.copy(ep)
    ep2.cameras = {
        k: dataclasses.replace(c, file_end_us=c.file_start_us + cut) if c.role == "wrist" else c
        for k, c in ep.cameras.items()
    }
    built = build_caption_requests(ep2, events)
    assert not built.failures
    w = ep.camera_by_role("main").width
    for req, meta in zip(built.requests, built.meta, strict=True):
        for k, (img, t) in enumerate(zip(req.images, req.frame_times_us, strict=True), 1):
            black = not img[:, w:].any()
            assert black == (t >= cut), (t, k)
        late = [r for r, views in meta["missing"].items() if "wrist" in views]
        if any(t >= cut for t in req.frame_times_us):
            assert late and "Missing views: wrist view missing (black tile) in" in req.prompt
            for role in late:
                assert f"in {role} image(s)" in req.prompt
        else:
            assert not late and "Missing views" not in req.prompt
    out = caption_episode(ep2, events, GroundTruthCaptionBackend(tiny_dataset))
    row = out.rows.iloc[-1]
    assert json.loads(row.missing_views)["TARGET"] == ["wrist"]
