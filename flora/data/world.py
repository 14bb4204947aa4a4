"""Toy world: a scripted single arm over a 2.5-D tabletop, with injected failures.

The world is simulated symbolically first (a plan of primitive steps with nominal
durations), the plan is scaled so the episode lasts exactly the requested number of
frames, and the plan is then executed frame by frame into numpy arrays (end-effector
pose, gripper opening, commanded motion, object poses). Rendering (``flora.data.render``)
and ground truth both read only the executed arrays, so the video, the proprioception and
the labels agree by construction.

Coordinates: table is the unit square, ``x`` to the right, ``y`` towards the robot
(image rows), ``z`` up (metres-ish, 0 = table). The robot base sits below the bottom
edge of the top camera's view.

Everything is a pure function of ``(seed, episode_index, n_frames)``: one
``numpy.random.Generator`` seeded with ``[seed, index]`` drives every choice, so an
episode can be re-simulated (and re-rendered) alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

FPS = 20
US_PER_FRAME = 1_000_000 // FPS

# Heights used by the scripted controller.
Z_HOVER = 0.12  # approach height above an object
Z_CARRY = 0.16  # transport height with an object in hand
Z_GRASP = 0.02  # ee height when the fingers surround a resting object
Z_LOW = 0.03  # "too low" approach height that causes collisions
GRIP_DZ = 0.015  # object centre hangs this far below the ee while held
HOME = (0.5, 0.86, 0.2)
OBJ_HALF = 0.032  # half size of every graspable object
OBJ_HEIGHT = 0.035  # stacking height

COLORS: dict[str, tuple[int, int, int]] = {
    "red": (205, 45, 40),
    "green": (45, 160, 70),
    "blue": (45, 85, 210),
    "yellow": (232, 200, 40),
    "orange": (235, 130, 30),
    "purple": (145, 60, 175),
}
KINDS = ("block", "cube", "ball")
# Gripper opening (0 closed .. 1 open) when closed on an object of each kind.
GRIP_WIDTH = {"block": 0.5, "cube": 0.5, "ball": 0.55}

# Nominal primitive durations in seconds (scaled per episode to hit the target length).
NOMINAL_S = {
    "reach": 1.6,
    "reach_collide": 1.5,
    "grasp": 1.2,
    "realign": 1.2,
    "lift": 0.9,
    "move": 2.0,
    "place": 1.0,
    "release": 0.7,
    "retract": 1.3,
    "push_reach": 1.6,
    "push": 2.6,
}
HESITATION_S = 1.5  # extra nominal time of a hesitating step


# --------------------------------------------------------------------------- scene


@dataclass
class SceneObject:
    """A graspable object resting on the table at ``pos`` (x, y, z)."""

    name: str  # "red block"
    kind: str  # block | cube | ball
    color: str
    pos: np.ndarray  # initial (x, y, z)

    @property
    def rgb(self) -> tuple[int, int, int]:
        return COLORS[self.color]


@dataclass
class Fixture:
    """A static target: bowl, plate, bin or colored zone, with placement slots."""

    kind: str  # bowl | plate | bin | zone
    name: str  # "the bowl", "the green zone"
    center: tuple[float, float]
    half: tuple[float, float]  # half extents (rect) or (radius, radius)
    rgb: tuple[int, int, int]
    slots: list[tuple[float, float]] = field(default_factory=list)

    def phrase(self, prep: str) -> str:
        """Spatial phrase such as "in the bowl" / "on the plate"."""
        return f"{prep} {self.name}"

    @property
    def prep(self) -> str:
        return "on" if self.kind == "plate" else "in"


@dataclass
class Scene:
    objects: list[SceneObject]
    fixtures: list[Fixture]


def _slots_grid(cx: float, cy: float, hw: float, hh: float, nx: int, ny: int) -> list:
    xs = np.linspace(cx - hw, cx + hw, nx + 2)[1:-1]
    ys = np.linspace(cy - hh, cy + hh, ny + 2)[1:-1]
    return [(float(x), float(y)) for y in ys for x in xs]


def _bowl() -> Fixture:
    c = (0.24, 0.19)
    slots = [(c[0] + 0.045 * math.cos(a), c[1] + 0.045 * math.sin(a)) for a in (0.4, 2.5, 4.4)]
    return Fixture("bowl", "the bowl", c, (0.13, 0.13), (236, 230, 214), [c, *slots])


def _plate() -> Fixture:
    c = (0.76, 0.19)
    return Fixture("plate", "the plate", c, (0.11, 0.11), (200, 204, 210), [c])


def _bin() -> Fixture:
    c, h = (0.73, 0.18), (0.24, 0.15)
    return Fixture("bin", "the bin", c, h, (95, 95, 105), _slots_grid(*c, 0.21, 0.12, 4, 3))


def _zone(color: str, cx: float, hw: float = 0.15) -> Fixture:
    base = np.array(COLORS[color], float)
    table = np.array((150, 110, 70), float)
    rgb = tuple(int(v) for v in 0.62 * base + 0.38 * table)
    return Fixture(
        "zone",
        f"the {color} zone",
        (cx, 0.17),
        (hw, 0.14),
        rgb,
        _slots_grid(cx, 0.17, hw - 0.03, 0.11, 2, 3),
    )


def _place_objects(rng: np.random.Generator, n: int, taken: list) -> list[np.ndarray]:
    """Rejection-sample ``n`` non-overlapping resting positions in the work area."""
    out: list[np.ndarray] = []
    pts = list(taken)
    for _ in range(n):
        for _try in range(400):
            p = np.array([rng.uniform(0.08, 0.92), rng.uniform(0.44, 0.9), OBJ_HALF])
            if all(math.hypot(p[0] - q[0], p[1] - q[1]) > 0.1 for q in pts):
                break
        out.append(p)
        pts.append(p)
    return out


def _names(rng: np.random.Generator, n: int, colors: list[str] | None = None) -> list[tuple]:
    """Distinct (color, kind) pairs, e.g. ("red", "block")."""
    pairs = [(c, k) for c in (colors or list(COLORS)) for k in KINDS]
    idx = rng.permutation(len(pairs))[:n]
    return [pairs[i] for i in idx]


# --------------------------------------------------------------------------- plan


@dataclass
class Step:
    """One primitive of the plan. ``fail`` injects a failure into this step."""

    kind: str
    obj: int | None = None
    dest: int | None = None  # fixture index (or -1 - object index when stacking)
    slot: int = 0
    fail: str | None = None  # missed_grasp | drop | collision | slip | hesitation
    nominal_s: float = 0.0
    subtask: int = 0
    frames: int = 0
    gap_before: int = 0  # idle frames before this step (not part of any event)


@dataclass
class Plan:
    family: str
    task: str
    scene: Scene
    steps: list[Step]
    subtasks: list[tuple[int, int | None]]  # (object, dest) per subtask
    unrecovered: bool


def _pick_place_steps(o: int, d: int, slot: int, fails: list[str], sub: int) -> list[Step]:
    """reach, grasp, lift, move, place, release with optional injected failures."""
    s: list[Step] = []
    if "collision" in fails:
        s.append(Step("reach_collide", o, fail="collision", subtask=sub))
    s.append(
        Step("reach", o, fail="hesitation" if "hesitation_reach" in fails else None, subtask=sub)
    )
    if "missed_grasp" in fails:
        s += [Step("grasp", o, fail="missed_grasp", subtask=sub), Step("realign", o, subtask=sub)]
    s += [Step("grasp", o, subtask=sub), Step("lift", o, subtask=sub)]
    if "drop" in fails:
        s += [
            Step("move", o, d, slot, fail="drop", subtask=sub),
            Step("reach", o, subtask=sub),
            Step("grasp", o, subtask=sub),
            Step("lift", o, subtask=sub),
        ]
    s.append(
        Step("move", o, d, slot, fail="hesitation" if "hesitation" in fails else None, subtask=sub)
    )
    s += [Step("place", o, d, slot, subtask=sub), Step("release", o, d, slot, subtask=sub)]
    return s


def _push_steps(o: int, d: int, slot: int, fails: list[str], sub: int) -> list[Step]:
    hes = "hesitation" in fails or "hesitation_reach" in fails
    s = [Step("push_reach", o, d, slot, subtask=sub, fail="hesitation" if hes else None)]
    if "slip" in fails:
        s += [
            Step("push", o, d, slot, fail="slip", subtask=sub),
            Step("push_reach", o, d, slot, subtask=sub),
        ]
    s.append(Step("push", o, d, slot, subtask=sub))
    return s


def _pick_up_steps(o: int, fails: list[str], sub: int) -> list[Step]:
    s: list[Step] = []
    if "collision" in fails:
        s.append(Step("reach_collide", o, fail="collision", subtask=sub))
    s.append(Step("reach", o, fail="hesitation" if "hesitation" in fails else None, subtask=sub))
    if "missed_grasp" in fails:
        s += [Step("grasp", o, fail="missed_grasp", subtask=sub), Step("realign", o, subtask=sub)]
    s.append(Step("grasp", o, subtask=sub))
    if "drop" in fails:
        s += [
            Step("lift", o, fail="drop", subtask=sub),
            Step("reach", o, subtask=sub),
            Step("grasp", o, subtask=sub),
        ]
    s.append(Step("lift", o, subtask=sub))
    return s


# Failure profile per episode index (cycled), so any dataset of >= 3 episodes shows
# a clean success, a recovered failure, hesitation + collision, and later drops and
# unrecovered failures. (kinds, last failure unrecovered?)
PROFILES: list[tuple[tuple[str, ...], bool]] = [
    ((), False),
    (("missed_grasp",), False),
    (("hesitation", "collision"), False),
    (("drop",), False),
    (("missed_grasp",), True),
    (("drop", "hesitation"), True),
]

# Default episode lengths (seconds): 5 s .. 3 min so that single-window, multi-window
# and long-horizon episodes all occur in a default dataset.
DEFAULT_DURATIONS_S = [8.0, 20.0, 45.0, 180.0, 12.0, 30.0, 90.0, 5.0, 60.0, 25.0, 120.0, 15.0]

# Version of the rules below that turn (seed, index, length) into an episode. 1: the
# failure profile was PROFILES[index % 6]; with the 12 default lengths cycling too, a
# length always came with the same profile, so the outcome could be read off the length
# every outcome prompt states (docs/dataset.md, "World versions"). 2: the profile shifts
# by one every 12 episodes; episodes 0-11 are unchanged.
WORLD_VERSION = 2
WORLD_VERSIONS = (1, 2)


def check_world(world: int) -> None:
    """Refuse a toy-world version these rules do not implement (``ValueError``)."""
    if world not in WORLD_VERSIONS:
        raise ValueError(f"unknown toy-world version {world!r}; known: {list(WORLD_VERSIONS)}")


def profile_for(index: int, world: int = WORLD_VERSION) -> tuple[tuple[str, ...], bool]:
    """Failure profile (kinds, last failure unrecovered?) of episode ``index``."""
    check_world(world)
    shift = index // len(DEFAULT_DURATIONS_S) if world >= 2 else 0
    return PROFILES[(index + shift) % len(PROFILES)]


def _family_for(target_s: float, index: int, rng: np.random.Generator) -> str:
    """Task family by length; cycled by episode index so small datasets cover them all."""
    if target_s < 7.5:
        return ("pick_up", "push")[index % 2]
    if target_s < 17:
        return ("pick_place", "stack", "push")[index % 3]
    if target_s < 40:
        return "multi_pick_place"
    return str(rng.choice(["clear", "sort"]))


def _join(names: list[str]) -> str:
    names = [f"the {n}" for n in names]
    if len(names) == 1:
        return names[0]
    return ", ".join(names[:-1]) + " and " + names[-1]


def _nominal_total(steps: list[Step]) -> float:
    return sum(NOMINAL_S[s.kind] + (HESITATION_S if s.fail == "hesitation" else 0) for s in steps)


def make_plan(
    rng: np.random.Generator, index: int, target_s: float, world: int = WORLD_VERSION
) -> Plan:
    """Choose the task, the scene and the primitive steps for one episode."""
    family = _family_for(target_s, index, rng)
    kinds, unrecovered = profile_for(index, world)
    kinds = list(kinds)
    # Long episodes get extra random failures (roughly one per 40 s).
    extra_pool = ["missed_grasp", "drop", "hesitation", "collision"]
    for _ in range(int(target_s // 40)):
        if rng.random() < 0.7:
            kinds.append(str(rng.choice(extra_pool)))
    if family == "push":
        kinds = ["slip" if k in ("missed_grasp", "drop", "collision") else k for k in kinds]

    budget = max(target_s - 1.5, 2.0)  # idle at the start and end
    fixtures: list[Fixture] = []
    if family == "pick_up":
        n_obj, n_sub = 1, 1
    elif family in ("pick_place", "stack", "push"):
        n_obj, n_sub = (2 if family == "stack" else 1), 1
    else:
        per = 8.3 * (1.25 if family == "multi_pick_place" else 1.45)
        n_sub = int(np.clip(round(budget / per), 2, 4 if family == "multi_pick_place" else 12))
        n_obj = n_sub

    # Objects, fixtures and the task sentence.
    if family == "sort":
        zone_colors = ["red", "green", "blue"]
        fixtures = [_zone(c, x) for c, x in zip(zone_colors, (0.18, 0.5, 0.82), strict=True)]
        pairs = [(zone_colors[i % 3], KINDS[(i // 3) % 3]) for i in range(n_obj)]
        pairs = [pairs[i] for i in rng.permutation(n_obj)]
        task = "sort the red, green and blue objects into the zones of their color"
    elif family == "clear":
        pairs = _names(rng, n_obj, ["red", "green", "blue", "yellow"])
    else:
        pairs = _names(rng, n_obj)
    if family not in ("sort", "clear"):
        if family == "push":
            zc = str(rng.choice([c for c in COLORS if c != pairs[0][0]]))
            fixtures = [_zone(zc, float(rng.choice([0.25, 0.75])), 0.17)]
            pairs[0] = (pairs[0][0], "ball")
        elif family in ("pick_place", "multi_pick_place"):
            fixtures = [_bowl(), _plate()]
        elif family == "pick_up":
            fixtures = [_plate()]
        else:  # stack: the base is a block of another color
            fixtures = [_bowl()]
            if pairs[0][1] == "ball":  # balls do not stack
                pairs[0] = (pairs[0][0], "cube")
            base = [c for c in COLORS if c != pairs[0][0]]
            pairs[1] = (str(base[int(rng.integers(0, len(base)))]), "block")
    if family == "clear":
        fixtures = [_bin(), _plate()]
    # Distractors (never part of the task; a collision knocks one of them away). Sort and
    # clear tasks name objects by color, so their distractors use other colors.
    n_distract = int(rng.integers(1, 3))
    used = set(pairs)
    pool = ["orange", "purple"] if family in ("sort", "clear") else None
    distract = [p for p in _names(rng, 18 if pool is None else 6, pool) if p not in used]
    distract = distract[:n_distract]
    all_pairs = pairs + distract
    positions = _place_objects(rng, len(all_pairs), [])
    objects = [
        SceneObject(f"{c} {k}", k, c, p) for (c, k), p in zip(all_pairs, positions, strict=True)
    ]
    names = [o.name for o in objects]

    subtasks: list[tuple[int, int | None]] = []
    if family == "pick_up":
        task = f"pick up the {names[0]}"
        subtasks = [(0, None)]
    elif family == "push":
        task = f"push the {names[0]} into {fixtures[0].name}"
        subtasks = [(0, 0)]
    elif family == "pick_place":
        d = int(rng.integers(0, 2))
        task = f"put the {names[0]} {fixtures[d].prep} {fixtures[d].name}"
        subtasks = [(0, d)]
    elif family == "stack":
        task = f"stack the {names[0]} on the {names[1]}"
        subtasks = [(0, -2)]  # -1 - object index 1
    elif family == "multi_pick_place":
        task = f"put {_join(names[:n_sub])} in the bowl"
        subtasks = [(i, 0) for i in range(n_sub)]
    elif family == "clear":
        task = f"put every object except {_join([o.name for o in objects[n_obj:]])} in the bin"
        subtasks = [(i, 0) for i in range(n_sub)]
    else:  # sort
        zone_of = {f.name.split()[1]: j for j, f in enumerate(fixtures)}
        subtasks = [(i, zone_of[objects[i].color]) for i in range(n_sub)]

    # Assign failures to subtasks (the unrecovered one, if any, to the last affected).
    per_sub: list[list[str]] = [[] for _ in subtasks]
    for j, k in enumerate(kinds):
        sub = int(rng.integers(0, len(subtasks))) if j else len(subtasks) // 2
        if family == "pick_up" and k == "hesitation":
            per_sub[sub].append("hesitation")
        elif k == "hesitation" and rng.random() < 0.5:
            per_sub[sub].append("hesitation_reach")
        else:
            per_sub[sub].append(k)
    slot_used: dict[int, int] = {}
    steps: list[Step] = []
    for sub, ((o, d), fails) in enumerate(zip(subtasks, per_sub, strict=True)):
        slot = 0
        if d is not None and d >= 0:
            slot = slot_used.get(d, 0)
            slot_used[d] = slot + 1
        if family == "pick_up":
            steps += _pick_up_steps(o, fails, sub)
        elif family == "push":
            steps += _push_steps(o, d, slot, fails, sub)
        else:
            steps += _pick_place_steps(o, d, slot, list(dict.fromkeys(fails)), sub)
    if family != "pick_up":
        steps.append(Step("retract", subtask=len(subtasks) - 1))

    if unrecovered:
        steps = _truncate_unrecovered(steps)
    return Plan(family, task, Scene(objects, fixtures), steps, subtasks, unrecovered)


def _truncate_unrecovered(steps: list[Step]) -> list[Step]:
    """End the episode right after its last hard failure (the arm gives up and retracts)."""
    hard = [i for i, s in enumerate(steps) if s.fail in ("missed_grasp", "drop", "slip")]
    if not hard:
        return steps
    cut = hard[-1]
    out = steps[: cut + 1]
    out.append(Step("retract", subtask=steps[cut].subtask))
    return out


def allocate_frames(plan: Plan, n_frames: int, rng: np.random.Generator) -> tuple[int, int]:
    """Scale nominal durations so the plan fills exactly ``n_frames``.

    Returns (idle frames at the start, idle frames at the end). The arm's speed scale is
    kept in a plausible range; leftover time becomes idle gaps between subtasks (not
    events), as with a human operator pausing.
    """
    for s in plan.steps:
        hes = HESITATION_S if s.fail == "hesitation" else 0.0
        s.nominal_s = (NOMINAL_S[s.kind] + hes) * float(rng.uniform(0.85, 1.15))
    idle = int(round(1.0 * FPS))  # 0.5 s at each end
    avail = n_frames - idle

    def total() -> float:
        return sum(s.nominal_s for s in plan.steps) * FPS

    # Drop optional hesitations while the arm would have to move implausibly fast.
    while avail / total() < 0.55 and any(s.fail == "hesitation" for s in plan.steps):
        s = next(s for s in plan.steps if s.fail == "hesitation")
        s.fail = None
        s.nominal_s -= HESITATION_S
    slack = 0
    if avail / total() > 1.8:
        slack = avail - int(round(1.8 * total()))
    work = avail - slack
    cum = np.round(np.cumsum([s.nominal_s for s in plan.steps]) / (total() / FPS) * work)
    frames = np.diff(np.concatenate([[0], cum])).astype(int)
    min_frames = 4
    while frames.min() < min_frames:  # steal from the longest step
        i, j = int(frames.argmin()), int(frames.argmax())
        if frames[j] <= min_frames:
            raise ValueError(f"episode of {n_frames} frames is too short for its plan")
        frames[i] += 1
        frames[j] -= 1
    for s, f in zip(plan.steps, frames, strict=True):
        s.frames = int(f)
    # Spread the slack as idle gaps before each new subtask.
    starts = [
        k for k in range(1, len(plan.steps)) if plan.steps[k].subtask != plan.steps[k - 1].subtask
    ]
    if slack and starts:
        per = slack // (len(starts) + 1)
        for k in starts:
            plan.steps[k].gap_before = per
        slack -= per * len(starts)
    start = idle // 2
    return start, n_frames - start - sum(s.frames + s.gap_before for s in plan.steps)


# --------------------------------------------------------------------------- execution


@dataclass
class EventRec:
    start_frame: int
    end_frame: int
    caption: str
    action: str
    object: str
    success: bool
    requirements: list[dict]


@dataclass
class Anomaly:
    start_frame: int
    end_frame: int
    level: int  # 1 failure, 2 suboptimal
    reason: str


@dataclass
class Rollout:
    """Executed episode: per-frame arrays plus the labels derived while executing."""

    plan: Plan
    n_frames: int
    ee: np.ndarray  # (N, 3) measured end-effector position
    planned: np.ndarray  # (N, 3) commanded position for each frame
    opening: np.ndarray  # (N,) gripper opening 0..1
    grip_cmd: np.ndarray  # (N,) 1 open / 0 close
    obj_pos: np.ndarray  # (N, n_obj, 3)
    held: np.ndarray  # (N,) index of held object or -1
    events: list[EventRec]
    anomalies: list[Anomaly]
    sub_done: list[bool]
    counts: dict[str, int]

    def state(self) -> np.ndarray:
        """observation.state: ee x, y, z and gripper opening (float32)."""
        return np.concatenate([self.ee, self.opening[:, None]], axis=1).astype(np.float32)

    def action(self) -> np.ndarray:
        """action: commanded ee delta for the next step (x, y, z) + gripper command."""
        nxt = np.concatenate([self.planned[1:], self.planned[-1:]], axis=0)
        delta = nxt - self.ee
        delta[-1] = 0.0
        return np.concatenate([delta, self.grip_cmd[:, None]], axis=1).astype(np.float32)


STATE_NAMES = ["ee_x", "ee_y", "ee_z", "gripper_opening"]
ACTION_NAMES = ["ee_dx", "ee_dy", "ee_dz", "gripper_cmd"]


def _smooth(n: int) -> np.ndarray:
    """Minimum-jerk progress at the n frames of a segment (ends exactly at 1)."""
    s = np.arange(1, n + 1, dtype=np.float64) / n
    return s * s * s * (10 - 15 * s + 6 * s * s)


class _Exec:
    """Frame-by-frame executor of a plan."""

    def __init__(self, plan: Plan, n: int, rng: np.random.Generator) -> None:
        self.p, self.n, self.rng = plan, n, rng
        k = len(plan.scene.objects)
        self.ee = np.zeros((n, 3))
        self.planned = np.zeros((n, 3))
        self.opening = np.zeros(n)
        self.grip_cmd = np.zeros(n)
        self.obj_pos = np.zeros((n, k, 3))
        self.held = np.full(n, -1, dtype=np.int64)
        self.f = 0
        self.cur_ee = np.array(HOME, float)
        self.cur_open = 1.0
        self.cur_cmd = 1.0
        self.cur_obj = np.stack([o.pos.copy() for o in plan.scene.objects])
        self.cur_held = -1
        self.events: list[EventRec] = []
        self.anoms: list[Anomaly] = []
        self.stack_h: dict[int, float] = {}
        self.moved: set[int] = set()

    # -- low level -------------------------------------------------------
    def hold(self, m: int, jitter: float = 0.0) -> None:
        """Stay still for m frames (optionally with small hesitation jitter)."""
        self.go(m, self.cur_ee, jitter=jitter)

    def go(
        self,
        m: int,
        target,
        open_to: float | None = None,
        *,
        jitter: float = 0.0,
        planned_target=None,
    ) -> None:
        """Move the ee to ``target`` over m frames (held object follows)."""
        if m <= 0:
            return
        a, b = self.f, self.f + m
        prog = _smooth(m)[:, None]
        tgt = np.asarray(target, float)
        path = self.cur_ee + (tgt - self.cur_ee) * prog
        if jitter:
            path = path + self.rng.normal(0, jitter, size=path.shape) * np.array([1, 1, 0.3])
            path[-1] = tgt
        self.ee[a:b] = path
        if planned_target is None:
            self.planned[a:b] = path
        else:
            pt = np.asarray(planned_target, float)
            self.planned[a:b] = self.cur_ee + (pt - self.cur_ee) * prog
        o_to = self.cur_open if open_to is None else open_to
        self.opening[a:b] = self.cur_open + (o_to - self.cur_open) * prog[:, 0]
        self.grip_cmd[a:b] = self.cur_cmd
        self.obj_pos[a:b] = self.cur_obj
        self.held[a:b] = self.cur_held
        if self.cur_held >= 0:
            hp = path.copy()
            hp[:, 2] = np.maximum(path[:, 2] - GRIP_DZ, OBJ_HALF)
            self.obj_pos[a:b, self.cur_held] = hp
            self.cur_obj[self.cur_held] = hp[-1]
        self.cur_ee = path[-1].copy()
        self.cur_open = float(o_to)
        self.f = b

    def move_obj(self, i: int, a: int, b: int, start, end) -> None:
        """Animate object i from start to end over frames [a, b) and keep it there."""
        start, end = np.asarray(start, float), np.asarray(end, float)
        m = b - a
        prog = _smooth(m)[:, None]
        self.obj_pos[a:b, i] = start + (end - start) * prog
        self.obj_pos[b:, i] = end
        self.cur_obj[i] = end
        self.moved.add(i)

    def event(self, a: int, caption: str, action: str, obj: str, success: bool, reqs) -> None:
        self.events.append(EventRec(a, self.f, caption, action, obj, success, reqs))

    # -- helpers ---------------------------------------------------------
    def obj(self, i: int | None) -> SceneObject | None:
        return None if i is None else self.p.scene.objects[i]

    def dest_xyz(self, st: Step) -> tuple[np.ndarray, str]:
        """Placement point and spatial phrase for a step's destination."""
        if st.dest is not None and st.dest < 0:
            base = -1 - st.dest
            bx, by, _ = self.cur_obj[base]
            z = self.cur_obj[base][2] + 2 * OBJ_HALF + 0.002
            return np.array([bx, by, z]), f"on the {self.p.scene.objects[base].name}"
        fx = self.p.scene.fixtures[st.dest]
        sx, sy = fx.slots[st.slot % len(fx.slots)]
        return np.array([sx, sy, OBJ_HALF]), fx.phrase(fx.prep)


def _req(family: str, text: str, mass: float = 1.0) -> dict:
    return {"family": family, "text": text, "mass": float(mass)}


def execute(plan: Plan, n_frames: int, idle: tuple[int, int], rng: np.random.Generator) -> Rollout:
    """Run the plan into per-frame arrays, recording events and anomalies."""
    ex = _Exec(plan, n_frames, rng)
    ex.hold(idle[0])
    counts = {"missed_grasp": 0, "drop": 0, "collision": 0, "slip": 0, "hesitation": 0}
    sub_done = [False] * len(plan.subtasks)
    objs = plan.scene.objects
    for st in plan.steps:
        ex.hold(st.gap_before)
        a = ex.f
        m = st.frames
        o = ex.obj(st.obj)
        name = o.name if o else ""
        p = ex.cur_obj[st.obj] if st.obj is not None else None
        hes = st.fail == "hesitation"
        if hes:
            counts["hesitation"] += 1

        def with_pause(target, open_to=None, frac=0.45, m=m, a=a, hes=hes):
            """Go to target; a hesitating step pauses (jittering) midway."""
            if not hes:
                ex.go(m, target, open_to)
                return
            pause = max(2, int(round(m * HESITATION_S / (HESITATION_S + 1.6))))
            m1 = max(1, int((m - pause) * frac))
            mid = ex.cur_ee + (np.asarray(target, float) - ex.cur_ee) * 0.5
            ex.go(m1, mid, None if open_to is None else (ex.cur_open + open_to) / 2)
            p0 = ex.f
            ex.hold(pause, jitter=0.003)
            ex.anoms.append(
                Anomaly(
                    p0,
                    ex.f,
                    2,
                    f"hesitation: the arm paused for {pause / FPS:.1f} s without progress",
                )
            )
            ex.go(a + m - ex.f, target, open_to)

        pause_txt = ", pausing midway" if hes else ""
        pause_req = [_req("outcome", "pause midway", 0.5)] if hes else []

        if st.kind == "reach":
            ex.cur_cmd = 1.0
            with_pause([p[0], p[1], Z_HOVER], 1.0)
            again = any(e.action in ("reach", "grasp") and e.object == name for e in ex.events)
            cap = f"reach toward the {name}{' again' if again else ''}{pause_txt}"
            ex.event(
                a,
                cap,
                "reach",
                name,
                True,
                [_req("action", "reach"), _req("object", name), *pause_req],
            )
        elif st.kind == "reach_collide":
            ex.cur_cmd = 1.0
            # An untouched distractor sits on the (too low) path and gets knocked away.
            cands = [
                i
                for i in range(len(objs))
                if i not in ex.moved and i != st.obj and all(i != s for s, _ in plan.subtasks)
            ]
            start = ex.cur_ee.copy()
            goal = np.array([p[0], p[1], Z_LOW])
            d = goal[:2] - start[:2]
            dist = float(np.linalg.norm(d)) or 1.0
            u = d / dist
            m1 = max(2, int(m * 0.55))
            contact = start[:2] + d * 0.6
            ob = cands[0] if cands else None
            if ob is not None:
                obs_xy = contact + u * (OBJ_HALF + 0.012)
                # Relocate the untouched distractor onto the path (history rewritten).
                ex.obj_pos[:, ob, 0:2] = obs_xy
                ex.cur_obj[ob, 0:2] = obs_xy
                ob_name = objs[ob].name
            else:
                ob_name = "the table edge"
            ex.go(m1, [contact[0], contact[1], Z_LOW], 1.0)
            c0 = ex.f
            hit_pos = ex.cur_ee.copy()
            rest = a + m - ex.f
            recoil = hit_pos.copy()
            recoil[0:2] -= u * 0.012
            recoil[2] = Z_HOVER * 0.5
            # Controller still commands motion toward the goal: action vs state mismatch.
            ex.go(rest, recoil, planned_target=[goal[0], goal[1], Z_LOW])
            if ob is not None:  # knocked away (animated after the arm rewrote the rows)
                knocked = ex.cur_obj[ob].copy()
                knocked[0:2] += u * 0.08 + np.array([-u[1], u[0]]) * 0.03
                knocked[0:2] = np.clip(knocked[0:2], 0.04, 0.96)
                ex.move_obj(ob, c0, c0 + max(2, rest // 2), ex.cur_obj[ob].copy(), knocked)
            counts["collision"] += 1
            ex.anoms.append(Anomaly(c0, ex.f, 1, f"collision: the gripper hit the {ob_name}"))
            ex.event(
                a,
                f"reach toward the {name} but bump into the {ob_name}",
                "reach",
                name,
                False,
                [
                    _req("action", "reach"),
                    _req("object", name),
                    _req("outcome", f"collide with the {ob_name}"),
                ],
            )
        elif st.kind == "grasp":
            ex.cur_cmd = 1.0
            m1 = max(1, int(m * 0.55))
            if st.fail == "missed_grasp":
                off = rng.choice([-1.0, 1.0]) * np.array([0.055, 0.0])
                ex.go(m1, [p[0] + off[0], p[1] + off[1], Z_GRASP], 1.0)
                ex.cur_cmd = 0.0
                c0 = ex.f
                ex.go(m - m1, ex.cur_ee, 0.0)
                counts["missed_grasp"] += 1
                ex.anoms.append(
                    Anomaly(
                        c0,
                        ex.f,
                        1,
                        f"missed grasp: the gripper closed on nothing next to the {name}",
                    )
                )
                ex.event(
                    a,
                    f"attempt to grasp the {name} but miss it",
                    "grasp",
                    name,
                    False,
                    [
                        _req("action", "grasp"),
                        _req("object", name),
                        _req("outcome", "miss the object"),
                    ],
                )
            else:
                ex.go(m1, [p[0], p[1], Z_GRASP + (p[2] - OBJ_HALF)], 1.0)
                ex.cur_cmd = 0.0
                ex.go(m - m1, ex.cur_ee, GRIP_WIDTH[o.kind])
                ex.cur_held = st.obj
                ex.moved.add(st.obj)
                ex.event(
                    a,
                    f"grasp the {name}",
                    "grasp",
                    name,
                    True,
                    [_req("action", "grasp"), _req("object", name)],
                )
        elif st.kind == "realign":
            ex.cur_cmd = 1.0
            m1 = max(1, m // 2)
            ex.go(m1, [ex.cur_ee[0], ex.cur_ee[1], 0.07], 1.0)
            ex.go(m - m1, [p[0], p[1], 0.07], 1.0)
            ex.event(
                a,
                f"reopen the gripper and re-align above the {name}",
                "realign",
                name,
                True,
                [
                    _req("action", "re-align"),
                    _req("object", name),
                    _req("spatial", "above the object", 0.5),
                ],
            )
        elif st.kind == "lift":
            if st.fail == "drop":
                m1 = max(1, int(m * 0.5))
                ex.go(m1, [ex.cur_ee[0], ex.cur_ee[1], Z_CARRY * 0.6])
                _drop(ex, st, m, a, counts, rng)
                ex.event(
                    a,
                    f"lift the {name} but drop it",
                    "lift",
                    name,
                    False,
                    [
                        _req("action", "lift"),
                        _req("object", name),
                        _req("outcome", "drop the object"),
                    ],
                )
            else:
                ex.go(m, [ex.cur_ee[0], ex.cur_ee[1], Z_CARRY])
                ex.event(
                    a,
                    f"lift the {name}",
                    "lift",
                    name,
                    True,
                    [_req("action", "lift"), _req("object", name)],
                )
                if plan.family == "pick_up":
                    sub_done[st.subtask] = True
        elif st.kind == "move":
            dxyz, phrase = ex.dest_xyz(st)
            tgt = [dxyz[0], dxyz[1], Z_CARRY]
            where = phrase.split(" ", 1)[1]
            if st.fail == "drop":
                m1 = max(1, int(m * rng.uniform(0.35, 0.6)))
                part = ex.cur_ee + (np.asarray(tgt) - ex.cur_ee) * 0.5
                ex.go(m1, part)
                _drop(ex, st, m, a, counts, rng)
                ex.event(
                    a,
                    f"carry the {name} toward {where} but drop it",
                    "move",
                    name,
                    False,
                    [
                        _req("action", "carry"),
                        _req("object", name),
                        _req("spatial", f"toward {where}", 0.5),
                        _req("outcome", "drop the object"),
                    ],
                )
            else:
                with_pause(tgt)
                ex.event(
                    a,
                    f"move the {name} over {where}{pause_txt}",
                    "move",
                    name,
                    True,
                    [
                        _req("action", "move"),
                        _req("object", name),
                        _req("spatial", f"over {where}", 0.5),
                        _req("coordination", "while holding it", 0.5),
                        *pause_req,
                    ],
                )
        elif st.kind == "place":
            dxyz, phrase = ex.dest_xyz(st)
            ex.go(m, [dxyz[0], dxyz[1], dxyz[2] + GRIP_DZ])
            into = phrase.replace("in ", "into ", 1).replace("on ", "onto ", 1)
            ex.event(
                a,
                f"lower the {name} {into}",
                "place",
                name,
                True,
                [_req("action", "place"), _req("object", name), _req("spatial", phrase, 0.5)],
            )
        elif st.kind == "release":
            dxyz, phrase = ex.dest_xyz(st)
            ex.cur_cmd = 1.0
            m1 = max(1, m // 2)
            ex.go(m1, ex.cur_ee, 1.0)
            ex.cur_obj[st.obj] = dxyz
            ex.cur_held = -1
            ex.go(m - m1, [ex.cur_ee[0], ex.cur_ee[1], ex.cur_ee[2] + 0.06])
            sub_done[st.subtask] = True
            ex.event(
                a,
                f"release the {name} {phrase}",
                "release",
                name,
                True,
                [_req("action", "release"), _req("object", name), _req("spatial", phrase, 0.5)],
            )
        elif st.kind == "push_reach":
            dxyz, phrase = ex.dest_xyz(st)
            u = dxyz[:2] - p[:2]
            u = u / (np.linalg.norm(u) or 1.0)
            behind = p[:2] - u * (OBJ_HALF + 0.03)
            ex.cur_cmd = 0.0
            if hes:
                with_pause([behind[0], behind[1], Z_GRASP], 0.25)
            else:
                m1 = max(1, int(m * 0.65))
                ex.go(m1, [behind[0], behind[1], Z_HOVER * 0.6], 0.25)
                ex.go(m - m1, [behind[0], behind[1], Z_GRASP], 0.25)
            again = any(e.action == "push" for e in ex.events)
            ex.event(
                a,
                f"move the gripper behind the {name}{' again' if again else ''}{pause_txt}",
                "reach",
                name,
                True,
                [
                    _req("action", "reach"),
                    _req("object", name),
                    _req("spatial", "behind the object", 0.5),
                    *pause_req,
                ],
            )
        elif st.kind == "push":
            dxyz, phrase = ex.dest_xyz(st)
            where = phrase.split(" ", 1)[1]
            u = dxyz[:2] - p[:2]
            ee_goal = ex.cur_ee[:2] + u
            start_obj = p.copy()
            if st.fail == "slip":
                m1 = max(2, int(m * 0.45))
                frac = 0.45
                ex.go(m, [ee_goal[0], ee_goal[1], Z_GRASP])
                # Object follows for the first part, then rolls off sideways.
                a_end = a + m1
                mid = start_obj.copy()
                mid[0:2] += u * frac
                ex.move_obj(st.obj, a, a_end, start_obj, mid)
                off = mid.copy()
                side = np.array([-u[1], u[0]]) / (np.linalg.norm(u) or 1.0)
                off[0:2] = np.clip(mid[0:2] + side * 0.09 + u * 0.05, 0.05, 0.95)
                ex.move_obj(st.obj, a_end, a + m, mid, off)
                counts["slip"] += 1
                ex.anoms.append(
                    Anomaly(a_end, a + m, 1, f"slip: the {name} rolled away from the gripper")
                )
                ex.event(
                    a,
                    f"push the {name} toward {where} but lose contact with it",
                    "push",
                    name,
                    False,
                    [
                        _req("action", "push"),
                        _req("object", name),
                        _req("spatial", f"toward {where}", 0.5),
                        _req("outcome", "lose contact"),
                    ],
                )
            else:
                ex.go(m, [ee_goal[0], ee_goal[1], Z_GRASP])
                ex.move_obj(st.obj, a, a + m, start_obj, dxyz)
                sub_done[st.subtask] = True
                ex.event(
                    a,
                    f"push the {name} into {where}",
                    "push",
                    name,
                    True,
                    [
                        _req("action", "push"),
                        _req("object", name),
                        _req("spatial", f"into {where}", 0.5),
                    ],
                )
        elif st.kind == "retract":
            ex.cur_cmd = 1.0
            if ex.cur_held >= 0:  # never carry an object home
                ex.cur_held = -1
            ex.go(m, HOME, 1.0)
            ex.event(
                a,
                "move the arm back to its start position",
                "retract",
                "",
                True,
                [_req("action", "retract"), _req("spatial", "back to the start position", 0.5)],
            )
        else:  # pragma: no cover - plan kinds are closed
            raise ValueError(st.kind)
        if ex.f != a + m:
            raise AssertionError(f"step {st.kind} used {ex.f - a} of {m} frames")
    ex.hold(n_frames - ex.f)
    return Rollout(
        plan,
        n_frames,
        ex.ee,
        ex.planned,
        ex.opening,
        ex.grip_cmd,
        ex.obj_pos,
        ex.held,
        ex.events,
        ex.anoms,
        sub_done,
        counts,
    )


def _drop(ex: _Exec, st: Step, m: int, a: int, counts: dict, rng: np.random.Generator) -> None:
    """The held object slips out: it falls to the table; the arm stops shortly after."""
    o = st.obj
    d0 = ex.f
    start = ex.cur_obj[o].copy()
    ex.cur_held = -1
    land = start.copy()
    land[0:2] = np.clip(land[0:2] + rng.normal(0, 0.025, 2), 0.05, 0.95)
    land[2] = OBJ_HALF
    # Keep moving briefly, then stop: the controller notices the loss of load.
    coast = ex.cur_ee + (ex.cur_ee - ex.ee[max(d0 - 2, 0)]) * 1.5
    rest = a + m - d0
    m1 = max(1, rest // 3)
    ex.go(m1, coast)
    ex.hold(rest - m1)
    # Animate the fall after the arm motion (which rewrites object rows).
    ex.move_obj(o, d0, d0 + max(2, min(6, rest)), start, land)
    counts["drop"] += 1
    ex.anoms.append(
        Anomaly(d0, ex.f, 1, f"drop: the {ex.p.scene.objects[o].name} fell out of the gripper")
    )


def simulate_episode(
    seed: int, index: int, duration_s: float, world: int = WORLD_VERSION
) -> Rollout:
    """Plan and execute one episode deterministically from (seed, index, duration) under
    the rules of toy-world version ``world``."""
    rng = np.random.default_rng([int(seed), int(index)])
    n = int(round(duration_s * FPS))
    if n < 2 * FPS:
        raise ValueError(f"episode duration {duration_s} s is below the 2 s minimum")
    plan = make_plan(rng, index, duration_s, world)
    idle = allocate_frames(plan, n, rng)
    return execute(plan, n, idle, rng)


# --------------------------------------------------------------------------- labels

RUBRICS: dict[str, dict] = {
    "pick_up": {
        "task": "pick up the named object",
        "steps": [
            {
                "name": "reach",
                "description": "the gripper reaches the object without hitting anything",
                "allowed": [0.0, 0.1, 0.25],
            },
            {
                "name": "grasp",
                "description": "the object is grasped (full marks on the first attempt)",
                "allowed": [0.0, 0.2, 0.4],
            },
            {
                "name": "lift",
                "description": "the object is lifted and held",
                "allowed": [0.0, 0.35],
            },
        ],
    },
    "push": {
        "task": "push the named object into the target zone",
        "steps": [
            {
                "name": "approach",
                "description": "the gripper gets behind the object",
                "allowed": [0.0, 0.2],
            },
            {
                "name": "contact",
                "description": "the object is pushed without losing contact",
                "allowed": [0.0, 0.2, 0.4],
            },
            {
                "name": "in_zone",
                "description": "the object ends inside the zone",
                "allowed": [0.0, 0.4],
            },
        ],
    },
    "pick_place": {
        "task": "pick up the named object and place it at the target",
        "steps": [
            {
                "name": "reach",
                "description": "reach the object without collisions",
                "allowed": [0.0, 0.05, 0.1],
            },
            {
                "name": "grasp",
                "description": "grasp the object (full marks on the first attempt)",
                "allowed": [0.0, 0.1, 0.2],
            },
            {
                "name": "transport",
                "description": "carry it without dropping it",
                "allowed": [0.0, 0.1, 0.2],
            },
            {
                "name": "place",
                "description": "the object rests at the target",
                "allowed": [0.0, 0.5],
            },
        ],
    },
    "long_horizon": {
        "task": "move every listed object to its target",
        "steps": [
            {
                "name": "progress",
                "description": "fraction of objects at their targets",
                "allowed": [0.0, 0.15, 0.3, 0.45, 0.6],
            },
            {
                "name": "grasp_reliability",
                "description": "few missed grasps",
                "allowed": [0.0, 0.1, 0.2],
            },
            {"name": "no_drops", "description": "no object dropped", "allowed": [0.0, 0.1]},
            {"name": "no_collisions", "description": "no collisions", "allowed": [0.0, 0.1]},
        ],
    },
}

RUBRIC_OF_FAMILY = {
    "pick_up": "pick_up",
    "push": "push",
    "pick_place": "pick_place",
    "stack": "pick_place",
    "multi_pick_place": "long_horizon",
    "clear": "long_horizon",
    "sort": "long_horizon",
}


def rubric_scores(r: Rollout) -> tuple[str, dict[str, float]]:
    """Ground-truth rubric step scores for a rollout (each in its allowed set)."""
    c = r.counts
    fam = RUBRIC_OF_FAMILY[r.plan.family]
    done = sum(r.sub_done)
    n_sub = len(r.sub_done)
    grasped = any(e.action == "grasp" and e.success for e in r.events)
    if fam == "pick_up":
        s = {
            "reach": 0.25 if c["collision"] == 0 else (0.1 if grasped else 0.0),
            "grasp": 0.4 if grasped and c["missed_grasp"] == 0 else (0.2 if grasped else 0.0),
            "lift": 0.35 if done else 0.0,
        }
    elif fam == "push":
        s = {
            "approach": 0.2,
            "contact": 0.4 if c["slip"] == 0 else (0.2 if done else 0.0),
            "in_zone": 0.4 if done else 0.0,
        }
    elif fam == "pick_place":
        s = {
            "reach": 0.1 if c["collision"] == 0 else 0.05,
            "grasp": 0.2 if grasped and c["missed_grasp"] == 0 else (0.1 if grasped else 0.0),
            "transport": 0.2 if c["drop"] == 0 and grasped else (0.1 if done else 0.0),
            "place": 0.5 if done else 0.0,
        }
    else:
        q = int(math.floor(4 * done / n_sub + 1e-9))
        per = c["missed_grasp"] / max(n_sub, 1)
        s = {
            "progress": [0.0, 0.15, 0.3, 0.45, 0.6][q],
            "grasp_reliability": 0.2 if per == 0 else (0.1 if per <= 0.25 else 0.0),
            "no_drops": 0.1 if c["drop"] == 0 else 0.0,
            "no_collisions": 0.1 if c["collision"] == 0 else 0.0,
        }
    return fam, s


def outcome_of(r: Rollout) -> tuple[int, bool, str]:
    """Outcome score 1..5, success flag and comma-joined failure modes."""
    done = sum(r.sub_done)
    n_sub = len(r.sub_done)
    modes = [k for k in ("missed_grasp", "drop", "collision", "slip", "hesitation") if r.counts[k]]
    success = done == n_sub
    if success:
        score = 5 if not modes else 4
    elif done == 0:
        score = 2 if any(e.success and e.action in ("grasp", "push") for e in r.events) else 1
    else:
        score = 3
    return score, success, ",".join(modes)


def dense_labels(r: Rollout) -> list[tuple[int, int, str]]:
    """(t_us, label, reason) for every 0.5 s group starting before T."""
    out = []
    group = FPS // 2
    for g0 in range(0, r.n_frames, group):
        g1 = g0 + group
        hits = [a for a in r.anomalies if a.start_frame < g1 and a.end_frame > g0]
        if hits:
            worst = min(hits, key=lambda a: (a.level, a.start_frame))
            out.append((g0 * US_PER_FRAME, worst.level, worst.reason))
        else:
            out.append((g0 * US_PER_FRAME, 3, ""))
    return out
