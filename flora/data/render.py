"""Numpy rasteriser for the toy world: a top ("main") camera and a wrist camera.

Pure numpy, no antialiasing, deterministic. Every shape is drawn inside its own pixel
bounding box, so a frame costs a few dozen small array operations.

Top camera: straight down over the unit-square table, with a mild pinhole perspective
(things higher up are drawn larger and pushed away from the image centre) and a shadow
offset that grows with height — the 2.5-D cue for lifting and placing. The arm is a grey
link from the robot base (below the bottom edge) to the gripper; the two gripper fingers
open and close visibly.

Wrist camera: looks down from the gripper; its field of view shrinks as the gripper
descends, the two fingers are fixed dark bars at the bottom of the image that move
apart/together with the opening; the point right under the gripper appears between the
fingers, so a grasped (or held) object fills that space and a missed one does not.
"""

from __future__ import annotations

import math

import numpy as np

from flora.data.world import OBJ_HALF, Fixture, Rollout

TABLE_RGB = np.array((150, 110, 70), np.float32)
CAM_H = 1.2  # top camera height above the table (perspective strength)
BASE_XY = (0.5, 1.16)  # robot base, just below the visible table
ARM_RGB = (118, 118, 128)
FINGER_RGB = (38, 38, 44)
PALM_RGB = (70, 70, 78)


class Raster:
    """Draws world-space shapes into ``img`` with pixel = (world - origin) * k."""

    def __init__(self, img: np.ndarray, x0: float, y0: float, k: float) -> None:
        self.img, self.x0, self.y0, self.k = img, x0, y0, k
        self.h, self.w = img.shape[:2]

    def _px(self, x: float, y: float) -> tuple[float, float]:
        return (x - self.x0) * self.k, (y - self.y0) * self.k

    def _span(self, c: float, r: float, n: int) -> tuple[int, int]:
        a = max(0, math.ceil(c - r - 0.5))
        b = min(n, math.floor(c + r - 0.5) + 1)
        if b <= a and 0 <= c < n:  # keep sub-pixel shapes visible
            a, b = int(c), int(c) + 1
        return a, b

    def rect(self, cx: float, cy: float, hx: float, hy: float, rgb) -> None:
        px, py = self._px(cx, cy)
        c0, c1 = self._span(px, hx * self.k, self.w)
        r0, r1 = self._span(py, hy * self.k, self.h)
        if c1 > c0 and r1 > r0:
            self.img[r0:r1, c0:c1] = rgb

    def _grid(self, px: float, py: float, rx: float, ry: float):
        c0, c1 = self._span(px, rx, self.w)
        r0, r1 = self._span(py, ry, self.h)
        if c1 <= c0 or r1 <= r0:
            return None
        xs = np.arange(c0, c1, dtype=np.float32) + 0.5 - px
        ys = np.arange(r0, r1, dtype=np.float32)[:, None] + 0.5 - py
        return (slice(r0, r1), slice(c0, c1)), xs, ys

    def ellipse(self, cx: float, cy: float, rx: float, ry: float, rgb=None, *, mul=None) -> None:
        """Filled ellipse; with ``mul`` the pixels are darkened instead (shadows)."""
        px, py = self._px(cx, cy)
        rxp, ryp = max(rx * self.k, 0.5), max(ry * self.k, 0.5)
        g = self._grid(px, py, rxp, ryp)
        if g is None:
            return
        sl, xs, ys = g
        mask = (xs / rxp) ** 2 + (ys / ryp) ** 2 <= 1.0
        view = self.img[sl]
        if mul is not None:
            view[mask] = (view[mask] * mul).astype(np.uint8)
        else:
            view[mask] = rgb

    def disk(self, cx: float, cy: float, r: float, rgb) -> None:
        self.ellipse(cx, cy, r, r, rgb)

    def ring(self, cx: float, cy: float, r_out: float, r_in: float, rgb) -> None:
        px, py = self._px(cx, cy)
        ro, ri = r_out * self.k, r_in * self.k
        g = self._grid(px, py, ro, ro)
        if g is None:
            return
        sl, xs, ys = g
        d2 = xs**2 + ys**2
        self.img[sl][(d2 <= ro * ro) & (d2 >= ri * ri)] = rgb

    def capsule(self, xa: float, ya: float, xb: float, yb: float, r: float, rgb) -> None:
        """Thick line segment with round caps."""
        pa, pb = self._px(xa, ya), self._px(xb, yb)
        rp = r * self.k
        cx, cy = (pa[0] + pb[0]) / 2, (pa[1] + pb[1]) / 2
        hx, hy = abs(pb[0] - pa[0]) / 2 + rp, abs(pb[1] - pa[1]) / 2 + rp
        g = self._grid(cx, cy, hx, hy)
        if g is None:
            return
        sl, xs, ys = g
        # Vector from a to each pixel (grid is centred on the midpoint).
        ax, ay = xs + (cx - pa[0]), ys + (cy - pa[1])
        dx, dy = pb[0] - pa[0], pb[1] - pa[1]
        ll = dx * dx + dy * dy or 1.0
        t = np.clip((ax * dx + ay * dy) / ll, 0.0, 1.0)
        d2 = (ax - t * dx) ** 2 + (ay - t * dy) ** 2
        self.img[sl][d2 <= rp * rp] = rgb


def _table(size: int, y0: float, span: float, x0: float = 0.0) -> np.ndarray:
    """Wood-grain table background for world rows y0 .. y0+span (cheap: per-row shade)."""
    # math.sin, not np.sin: numpy's SIMD transcendentals take different code paths
    # depending on array alignment, which flipped pixels between otherwise identical runs.
    ys = [y0 + (i + 0.5) * span / size for i in range(size)]
    xs = [x0 + (i + 0.5) * span / size for i in range(size)]
    tau = 2 * math.pi
    shade = np.array(
        [7.0 * math.sin(tau * y * 13.0) + 3.0 * math.sin(tau * y * 37.0 + 1.0) for y in ys]
    )
    cols = np.array([2.0 * math.sin(tau * x * 5.0) for x in xs])
    img = TABLE_RGB[None, None, :] + (shade[:, None] + cols[None, :])[:, :, None]
    return np.clip(img, 0, 255).astype(np.uint8)


def _draw_fixture(r: Raster, f: Fixture) -> None:
    cx, cy = f.center
    rgb = np.array(f.rgb)
    if f.kind == "zone":
        r.rect(cx, cy, f.half[0], f.half[1], (rgb * 0.75).astype(np.uint8))
        r.rect(cx, cy, f.half[0] - 0.012, f.half[1] - 0.012, f.rgb)
    elif f.kind == "bin":
        r.rect(cx, cy, f.half[0], f.half[1], (45, 45, 52))
        r.rect(cx, cy, f.half[0] - 0.018, f.half[1] - 0.018, f.rgb)
    elif f.kind == "bowl":
        r.disk(cx + 0.012, cy + 0.012, f.half[0], (95, 70, 45))  # rim shadow
        r.disk(cx, cy, f.half[0], f.rgb)
        r.disk(cx, cy, f.half[0] * 0.78, (rgb * 0.82).astype(np.uint8))
    elif f.kind == "plate":
        r.disk(cx, cy, f.half[0], f.rgb)
        r.ring(cx, cy, f.half[0] * 0.8, f.half[0] * 0.72, (rgb * 0.88).astype(np.uint8))


def _persp(x: float, y: float, z: float) -> tuple[float, float, float]:
    """Top-camera projection of a point at height z: (x, y, scale)."""
    s = CAM_H / (CAM_H - z)
    return 0.5 + (x - 0.5) * s, 0.5 + (y - 0.5) * s, s


def _draw_object(r: Raster, kind: str, rgb, x: float, y: float, s: float) -> None:
    h = OBJ_HALF * s
    dark = tuple(int(c * 0.55) for c in rgb)
    if kind == "ball":
        r.disk(x, y + 0.006 * s, h, dark)
        r.disk(x, y, h * 0.95, rgb)
        light = tuple(min(255, int(c * 1.3 + 40)) for c in rgb)
        r.disk(x - h * 0.35, y - h * 0.35, h * 0.28, light)
    else:
        r.rect(x, y + 0.01 * s, h, h, dark)  # visible side face (2.5-D)
        r.rect(x, y, h, h, rgb)
        if kind == "cube":
            light = tuple(min(255, int(c * 1.25 + 30)) for c in rgb)
            r.rect(x, y, h * 0.45, h * 0.45, light)


class WorldRenderer:
    """Renders the frames of one rollout for each camera (static background cached)."""

    def __init__(self, rollout: Rollout, size: int = 96, wrist_size: int | None = None) -> None:
        self.r = rollout
        self.size = size
        self.wrist_size = wrist_size or size
        objs = rollout.plan.scene.objects
        self.kinds = [o.kind for o in objs]
        self.rgbs = [o.rgb for o in objs]
        bg = _table(size, 0.0, 1.0)
        rb = Raster(bg, 0.0, 0.0, float(size))
        for f in rollout.plan.scene.fixtures:
            _draw_fixture(rb, f)
        self.top_bg = bg

    def top(self, f: int) -> np.ndarray:
        """Top ("main") camera frame f as (H, W, 3) uint8 RGB."""
        r = self.r
        img = self.top_bg.copy()
        ras = Raster(img, 0.0, 0.0, float(self.size))
        ee = r.ee[f]
        held = int(r.held[f])
        pos = r.obj_pos[f]
        # Shadows of everything above the table (offset grows with height).
        for i in range(len(pos)):
            z = float(pos[i, 2]) - OBJ_HALF
            if z > 0.004:
                ras.ellipse(
                    pos[i, 0] + 0.5 * z, pos[i, 1] + 0.5 * z, OBJ_HALF * 1.1, OBJ_HALF, mul=0.6
                )
        ras.ellipse(ee[0] + 0.5 * ee[2], ee[1] + 0.5 * ee[2], 0.04, 0.03, mul=0.65)
        # Resting / moving objects, lower ones first; the held one is drawn with the gripper.
        order = sorted(range(len(pos)), key=lambda i: float(pos[i, 2]))
        for i in order:
            if i == held:
                continue
            x, y, s = _persp(pos[i, 0], pos[i, 1], float(pos[i, 2]) - OBJ_HALF)
            _draw_object(ras, self.kinds[i], self.rgbs[i], x, y, s)
        gx, gy, gs = _persp(ee[0], ee[1], float(ee[2]))
        ras.capsule(BASE_XY[0], BASE_XY[1], gx, gy + 0.03 * gs, 0.028, ARM_RGB)
        ras.disk(BASE_XY[0], BASE_XY[1], 0.09, (90, 90, 100))
        if held >= 0:
            x, y, s = _persp(pos[held, 0], pos[held, 1], float(pos[held, 2]) - OBJ_HALF)
            _draw_object(ras, self.kinds[held], self.rgbs[held], x, y, s)
        ras.disk(gx, gy + 0.028 * gs, 0.02 * gs, PALM_RGB)
        op = float(r.opening[f])
        off = (0.014 + 0.034 * op) * gs
        for sx in (-1.0, 1.0):
            ras.rect(gx + sx * off, gy, 0.0075 * gs, 0.022 * gs, FINGER_RGB)
        return img

    def wrist(self, f: int) -> np.ndarray:
        """Wrist camera frame f as (H, W, 3) uint8 RGB."""
        r = self.r
        n = self.wrist_size
        ee = r.ee[f]
        half = 0.055 + 0.55 * float(ee[2])
        # The point under the gripper appears between the fingers (80 % down the image);
        # the camera looks ahead (away from the robot) over the rest of the view.
        x0, y0 = float(ee[0]) - half, float(ee[1]) - half * 1.6
        img = _table(n, y0, 2 * half, x0)
        ras = Raster(img, x0, y0, n / (2 * half))
        for fx in r.plan.scene.fixtures:
            cx, cy = fx.center
            if abs(cx - ee[0]) < half + fx.half[0] and abs(cy - ee[1]) < 2 * half + fx.half[1]:
                _draw_fixture(ras, fx)
        held = int(r.held[f])
        pos = r.obj_pos[f]
        for i in sorted(range(len(pos)), key=lambda i: float(pos[i, 2])):
            if i == held:
                continue
            if abs(pos[i, 0] - ee[0]) < half + 0.05 and abs(pos[i, 1] - ee[1]) < 2 * half:
                # Closer to the camera -> larger.
                s = 1.0 + 1.5 * max(0.0, float(pos[i, 2]) - OBJ_HALF) / max(float(ee[2]), 0.02)
                _draw_object(ras, self.kinds[i], self.rgbs[i], pos[i, 0], pos[i, 1], min(s, 2))
        # Image-space overlays: held object between the fingers, then the fingers.
        ov = Raster(img, 0.0, 0.0, float(n))
        if held >= 0:
            rgb = self.rgbs[held]
            kind = self.kinds[held]
            if kind == "ball":
                ov.disk(0.5, 0.84, 0.2, rgb)
            else:
                ov.rect(0.5, 0.86, 0.19, 0.17, tuple(int(c * 0.7) for c in rgb))
                ov.rect(0.5, 0.82, 0.19, 0.15, rgb)
        op = float(r.opening[f])
        off = 0.11 + 0.29 * op
        for sx in (-1.0, 1.0):
            ov.rect(0.5 + sx * off, 0.82, 0.075, 0.2, FINGER_RGB)
        return img
