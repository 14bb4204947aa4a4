"""Async RTC runtime: action queue, inference thread, measured delay, committed prefix."""

from __future__ import annotations

import threading

import pytest
import torch

from flora.policy.configuration_dit import DiTConfig
from flora.policy.modeling_dit import DiTActionExpert
from flora.policy.runtime import RealClock, RTCRuntime, SimulatedClock, make_policy

H, A = 8, 2


class LabelledPolicy:
    """Chunk k has rows ``[k, i]`` (chunk id, index); records every call's arguments."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def __call__(self, obs, prefix, d, s):
        k = len(self.calls)
        self.calls.append({"obs": obs, "prefix": prefix.clone(), "d": d, "s": s})
        return torch.stack([torch.tensor([float(k), float(i)]) for i in range(H)])


def _serve(rt: RTCRuntime, n: int) -> list[tuple[int, int]]:
    out = []
    for t in range(n):
        a = rt.get_action(t)
        out.append((int(a[0]), int(a[1])))
    return out


def test_queue_and_delay_with_simulated_clock():
    pol = LabelledPolicy()
    rt = RTCRuntime(pol, H, s=3, clock=SimulatedClock(2), initial_delay=2)
    rt.start(obs=-1)
    try:
        served = _serve(rt, 14)
    finally:
        rt.stop()
    # Chunk 0 from index 0; then every chunk runs indices 2, 3, 4 (d = 2, s = 3): during
    # each inference the previous chunk's next two actions (the committed prefix) run.
    assert served == [
        (0, 0),
        (0, 1),
        (0, 2),
        (0, 3),
        (0, 4),
        (1, 2),
        (1, 3),
        (1, 4),
        (2, 2),
        (2, 3),
        (2, 4),
        (3, 2),
        (3, 3),
        (3, 4),
    ]
    assert rt.stats.delays[:3] == [2, 2, 2]
    # Each inference starts after s actions and gets the rest of the current chunk.
    first = pol.calls[1]
    assert first["s"] == 3 and first["d"] == 2
    assert torch.equal(first["prefix"], torch.tensor([[0.0, i] for i in range(3, H)]))
    # ...with the observation of the moment it started (after serving step index 2).
    assert first["obs"] == 2
    assert [c["obs"] for c in pol.calls[1:4]] == [2, 5, 8]


def test_zero_latency_is_closed_loop_and_loses_no_wake_up():
    """d = 0 (the closed-loop point): an instant policy publishes before the control loop
    wakes; the loop must still see that an inference was taken, not time out. Every step
    then serves the first action of a chunk computed from that step's observation."""
    for _ in range(3):  # the lost wake-up depended on thread timing: repeat it
        pol = LabelledPolicy()
        rt = RTCRuntime(pol, H, s=1, clock=SimulatedClock(0), initial_delay=0, timeout_s=5.0)
        rt.start(obs=None)
        try:
            served = _serve(rt, 40)
        finally:
            rt.stop()
        assert served == [(k, 0) for k in range(40)]
        # (the inference the 40th step started may or may not publish before stop())
        assert rt.stats.delays[:39] == [0] * 39 and set(rt.stats.delays) == {0}
        assert rt.stats.underruns == 0


def test_conservative_delay_estimate_is_max_of_recent():
    pol = LabelledPolicy()
    lat = [1, 3, 1, 1, 1, 1]
    rt = RTCRuntime(pol, H, s=3, clock=SimulatedClock(lat), delay_window=3, initial_delay=0)
    rt.start(obs=None)
    try:
        _serve(rt, 24)
    finally:
        rt.stop()
    assert rt.stats.delays[:6] == [1, 3, 1, 1, 1, 1]
    # estimate for call k = max over the last 3 measured delays (initial 0 counts first).
    assert rt.stats.estimates[:6] == [0, 1, 3, 3, 3, 1]
    assert [c["d"] for c in pol.calls[1:7]] == rt.stats.estimates[:6]
    assert rt.stats.underruns == 0


def test_underrun_holds_last_action_and_recovers():
    pol = LabelledPolicy()
    rt = RTCRuntime(pol, H, s=3, clock=SimulatedClock([7, 2]), initial_delay=2)
    rt.start(obs=None)
    try:
        served = _serve(rt, 12)
    finally:
        rt.stop()
    # 3 + 5 actions of chunk 0 exist; inference lasts 7 steps -> 2 held steps.
    assert served[:10] == [(0, i) for i in range(8)] + [(0, 7), (0, 7)]
    assert rt.stats.delays[0] == 7
    assert served[10] == (1, 7)  # chunk 1 takes over at index 7 (= measured delay)
    # The next inference starts at once (7 >= s) with the one remaining action as prefix:
    # the estimate 7 is clamped to d = H - s' = 1; it lasts 2 steps, so one more hold.
    assert pol.calls[2]["s"] == 7 and pol.calls[2]["d"] == 1
    assert torch.equal(pol.calls[2]["prefix"], torch.tensor([[1.0, 7.0]]))
    assert served[11] == (1, 7)
    assert rt.stats.underruns == 3


def test_underrun_longer_than_chunk_measures_delay_from_snapshot():
    """An inference that outlasts the whole chunk (10 steps, only 7 actions left) leaves
    the next chunk past its end (index 10 > H): the next inference then starts with s' = H
    and an empty prefix, but its delay is measured from the 10 actions served at its start
    (RTC Alg. 1: actions served since the inference started), not from the capped s' = 8,
    which would count two steps that ran before it began and publish it at once."""
    pol = LabelledPolicy()
    rt = RTCRuntime(pol, H, s=1, clock=SimulatedClock([10, 1]), initial_delay=0)
    rt.start(obs=-1)
    try:
        served = _serve(rt, 16)
    finally:
        rt.stop()
    # Chunk 0 runs out after 8 actions; 3 holds until chunk 1 arrives at index 10 (> H):
    # one more hold of its last action while inference 2 (1 step) runs; then every chunk
    # is entered at index 1.
    assert served == [(0, i) for i in range(8)] + [(0, 7)] * 3 + [(1, 7)] + [
        (k, 1) for k in range(2, 6)
    ]
    assert rt.stats.delays[:4] == [10, 1, 1, 1]
    assert rt.stats.underruns == 4
    # Inference 2 began at the step chunk 1 arrived (obs 10) with s' capped at H.
    assert pol.calls[2]["obs"] == 10 and pol.calls[2]["s"] == H and pol.calls[2]["d"] == 0
    assert pol.calls[2]["prefix"].numel() == 0
    assert rt.stats.starts[:3] == [1, H, 1]
    # The estimate is max of the true delays (10 clamped to H - s' = 7), never inflated.
    assert rt.stats.estimates[:4] == [0, 0, 7, 7]


def test_real_clock_measures_delay_in_control_steps():
    # Each inference returns once the control loop has served 3 more actions, so it spans
    # control steps on any machine: a fixed sleep could pass with the loop descheduled
    # (four test workers on two cores measured 0 that way), which is the load, not the
    # runtime. What is checked is the runtime's count of the steps served meanwhile.
    pol = LabelledPolicy()
    done = threading.Event()
    served_during: list[int] = []

    def paced(obs, prefix, d, s):
        if pol.calls:  # not chunk 0, which start() computes before the loop runs
            s0 = rt.stats.served
            while rt.stats.served - s0 < 3 and not done.wait(0.002):
                pass
            served_during.append(rt.stats.served - s0)
        return pol(obs, prefix, d, s)

    rt = RTCRuntime(paced, H, s=2, clock=RealClock(0.01), initial_delay=1)
    seen = []
    try:
        rt.run(lambda a: seen.append(a) or len(seen), obs=0, n_steps=60)
    finally:
        done.set()
        rt.stop()
    assert len(seen) == 60 and rt.stats.served == 60
    # Every inference that ran its course is measured at no fewer control steps than were
    # served while it ran (more pass between its return and the hand-over); the last one
    # may be cut by the loop's end.
    full = [(n, m) for n, m in zip(served_during, rt.stats.delays, strict=False) if n >= 3]
    assert len(full) >= 3
    assert all(m >= n for n, m in full)
    # The estimate each call got is the max of the last 5 measured delays (the initial one
    # first), clamped so its prefix exists.
    assert [c["d"] for c in pol.calls[1:]] == rt.stats.estimates
    recent = [1]
    for k, (st, est) in enumerate(zip(rt.stats.starts, rt.stats.estimates, strict=True)):
        assert est == max(0, min(max(recent[-5:]), H - st))
        recent += rt.stats.delays[k : k + 1]
    # Chunks served in order, each continuing from its measured delay.
    ids = [int(a[0]) for a in seen]
    assert ids == sorted(ids)


def test_inference_errors_surface_in_control_loop():
    def bad(obs, prefix, d, s):
        if prefix.numel():
            raise RuntimeError("boom")
        return torch.zeros(H, A)

    rt = RTCRuntime(bad, H, s=1, clock=SimulatedClock(1))
    rt.start(None)
    with pytest.raises(RuntimeError, match="inference thread failed"):
        _serve(rt, 5)
    rt.stop()


def test_constructor_validates_delay():
    with pytest.raises(ValueError):
        RTCRuntime(LabelledPolicy(), H, s=5, clock=SimulatedClock(1), initial_delay=4)
    with pytest.raises(ValueError):
        RealClock(0)


def test_runtime_with_dit_training_time_policy_commits_prefix():
    cfg = DiTConfig(action_dim=A, horizon=H, state_dim=3, hidden=16, depth=1, heads=2)
    torch.manual_seed(0)
    model = DiTActionExpert(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    inner = make_policy(model, "training_time", steps=3, horizon=H, action_dim=A)
    calls = []

    def policy(obs, prefix, d, s):
        out = inner(obs, prefix, d, s)
        calls.append((prefix.clone(), d, out.clone()))
        return out

    rt = RTCRuntime(policy, H, s=2, clock=SimulatedClock(2), initial_delay=2)
    obs = {"state": torch.zeros(1, 3)}
    rt.start(obs)
    try:
        for _ in range(10):
            rt.get_action(obs)
    finally:
        rt.stop()
    for prefix, d, out in calls[1:]:
        assert d == 2
        assert torch.equal(out[:d], prefix[:d])  # committed actions kept exactly
