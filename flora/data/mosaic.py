"""Multi-camera mosaics: one fixed layout for every sampled instant (DESIGN §3.2).

Layout: tiles side by side, left to right in ``MOSAIC_ROLES`` order ("main" left,
"wrist" right), all the same size — the size of the first present frame (the main
camera's when present); other frames are resized (bilinear) to it. A camera that belongs
to the layout but has no frame at an instant becomes a black tile of the same size, and
the ``Mosaic`` reports which roles were present. A dataset with only one of the roles
uses a one-tile layout: the mosaic is that camera's frame, unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image

from flora.data.episode import Episode, FloraDataError
from flora.data.frames import sample_frames

MOSAIC_ROLES: tuple[str, ...] = ("main", "wrist")


@dataclass(frozen=True)
class Mosaic:
    """One instant: the tiled image, its time and the roles that had a frame."""

    t_us: int
    image: np.ndarray  # (H, len(roles) * W, 3) uint8
    roles: tuple[str, ...]  # layout, left to right
    present: tuple[str, ...]  # roles that had a frame (others are black tiles)
    frame_t_us: dict[str, int]  # exact timestamp of each present tile's frame


def _resize(img: np.ndarray, h: int, w: int) -> np.ndarray:
    if img.shape[0] == h and img.shape[1] == w:
        return img
    return np.asarray(Image.fromarray(img).resize((w, h), Image.BILINEAR))


def make_mosaic(
    frames_by_role: Mapping[str, np.ndarray | None],
    roles: Sequence[str] = MOSAIC_ROLES,
    tile_hw: tuple[int, int] | None = None,
) -> np.ndarray:
    """Tile frames left to right in ``roles`` order; absent/None roles become black.

    Tile size is ``tile_hw`` or the size of the first present frame in ``roles`` order.
    Frames given for roles outside ``roles`` are ignored.
    """
    present = [r for r in roles if frames_by_role.get(r) is not None]
    if tile_hw is None:
        if not present:
            raise ValueError("make_mosaic needs at least one frame or an explicit tile_hw")
        h, w = frames_by_role[present[0]].shape[:2]
    else:
        h, w = tile_hw
    tiles = []
    for r in roles:
        f = frames_by_role.get(r)
        if f is None:
            tiles.append(np.zeros((h, w, 3), np.uint8))
        else:
            if f.ndim != 3 or f.shape[2] != 3 or f.dtype != np.uint8:
                raise ValueError(
                    f"frame for role {r!r} must be (H, W, 3) uint8, got {f.shape} {f.dtype}"
                )
            tiles.append(_resize(f, h, w))
    return np.concatenate(tiles, axis=1)


def episode_roles(episode: Episode) -> tuple[str, ...]:
    """The mosaic layout of an episode: the ``MOSAIC_ROLES`` its cameras have."""
    have = {c.role for c in episode.cameras.values()}
    roles = tuple(r for r in MOSAIC_ROLES if r in have)
    if not roles and episode.cameras:
        # No main/wrist naming at all: use the first camera as the main view.
        roles = ("main",)
    return roles


def sample_mosaics(episode: Episode, times_us: Sequence[int], **kw) -> list[Mosaic]:
    """One ``Mosaic`` per requested time (episode-relative µs).

    A time at which a camera has no frame gives a black tile for that camera; a time at
    which no camera has a frame raises FloraDataError. ``kw`` goes to ``sample_frames``
    (e.g. ``clamp_end=True``).
    """
    roles = episode_roles(episode)
    if not roles:
        raise FloraDataError(
            "episode has no cameras",
            dataset=episode.dataset,
            episode=episode.index,
            field="cameras",
        )
    streams = {}
    for r in roles:
        cam = episode.camera_by_role(r)
        if cam is None:  # fallback layout for unnamed single cameras
            cam = next(iter(episode.cameras.values()))
        streams[r] = cam
    per_role = {
        r: sample_frames(
            s, times_us, missing="none", dataset=episode.dataset, episode=episode.index, **kw
        )
        for r, s in streams.items()
    }
    # Fixed tile size per episode: the main stream's declared size (else the first role's).
    first = streams[roles[0]]
    tile = (first.height, first.width)
    out = []
    for j, t in enumerate(times_us):
        frames = {r: (per_role[r][j].image if per_role[r][j] is not None else None) for r in roles}
        present = tuple(r for r in roles if frames[r] is not None)
        if not present:
            raise FloraDataError(
                f"no camera has a frame at {t} µs",
                dataset=episode.dataset,
                episode=episode.index,
                field="times_us",
            )
        img = make_mosaic(frames, roles, tile_hw=tile)
        ft = {r: per_role[r][j].t_us for r in present}
        out.append(Mosaic(int(t), img, roles, present, ft))
    return out
