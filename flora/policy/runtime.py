"""Asynchronous real-time-chunking runtime: action queue + inference thread (RTC Alg. 1).

The robot's control loop calls :meth:`RTCRuntime.get_action` once per control period. It
serves the next action of the current chunk. A background inference thread waits until
``s`` actions of the current chunk have been executed, then snapshots the latest
observation and the rest of the current chunk (``prefix = chunk[s':]``, whose first ``d``
rows are committed because they will run while the new chunk is being computed) and calls
the policy with a conservative delay estimate ``d = max(last N measured delays)``. When the
new chunk arrives, the number of actions served meanwhile is the measured delay; the new
chunk takes over from that index. Works with any policy function (training-time RTC,
inference-time RTC, plain), so it is the drop-in the paper describes.

Two clocks:

* :class:`RealClock` — wall time; inference takes as long as it takes and the delay is
  measured in control steps actually served; :meth:`RTCRuntime.run` paces the loop.
* :class:`SimulatedClock` — deterministic tests/simulation: each inference "takes" a given
  number of control steps (an int, a sequence or a function of the call index); the control
  loop and the thread hand over in lock-step, so results do not depend on thread timing.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from flora.policy import rtc

PolicyFn = Callable[[Any, torch.Tensor, int, int], torch.Tensor]
"""``policy(obs, prefix (H - s', A), d, s') -> chunk (H, A)``."""


class RealClock:
    """Wall-clock pacing at ``period_s`` per control step."""

    simulated = False

    def __init__(self, period_s: float) -> None:
        if period_s <= 0:
            raise ValueError(f"RealClock: period_s must be > 0, got {period_s}")
        self.period_s = period_s
        self._next: float | None = None

    def tick(self) -> None:
        """Sleep until the next control period boundary."""
        now = time.monotonic()
        if self._next is None:
            self._next = now
        self._next += self.period_s
        if self._next > now:
            time.sleep(self._next - now)
        else:  # overrun: re-anchor instead of bursting to catch up
            self._next = now


class SimulatedClock:
    """Inference ``k`` (0-based) takes ``latency(k)`` control steps; no sleeping."""

    simulated = True

    def __init__(self, latency: int | Sequence[int] | Callable[[int], int]) -> None:
        if isinstance(latency, int):
            self._f: Callable[[int], int] = lambda k: latency
        elif callable(latency):
            self._f = latency
        else:
            seq = list(latency)
            self._f = lambda k: seq[min(k, len(seq) - 1)]

    def latency(self, k: int) -> int:
        """Control steps that inference ``k`` lasts."""
        v = int(self._f(k))
        if v < 0:
            raise ValueError(f"SimulatedClock: negative latency {v}")
        return v

    def tick(self) -> None:
        """Nothing to wait for in simulation."""


@dataclass
class RuntimeStats:
    """What the runtime measured."""

    delays: list[int] = field(default_factory=list)  # measured, in control steps
    estimates: list[int] = field(default_factory=list)  # d passed to the policy
    starts: list[int] = field(default_factory=list)  # s' at each inference start (capped at H)
    served: int = 0
    underruns: int = 0  # control steps with no fresh action (held the last one)


class RTCRuntime:
    """Action queue served at the control rate plus a background inference thread.

    ``policy(obs, prefix, d, s)`` must return a chunk (H, A). ``s`` is the minimum number
    of actions executed between inference starts; ``delay_window`` the number of recent
    measured delays whose maximum is the estimate; ``initial_delay`` the estimate before any
    measurement.
    """

    def __init__(
        self,
        policy: PolicyFn,
        horizon: int,
        s: int,
        *,
        clock: RealClock | SimulatedClock,
        delay_window: int = 5,
        initial_delay: int = 0,
        timeout_s: float = 30.0,
    ) -> None:
        rtc.check_delay(initial_delay, s, horizon)
        self.policy = policy
        self.H = horizon
        self.s = s
        self.clock = clock
        self.timeout_s = timeout_s
        self._recent: deque[int] = deque([initial_delay], maxlen=max(1, delay_window))
        self.stats = RuntimeStats()
        self._cv = threading.Condition()
        self._chunk: torch.Tensor | None = None
        self._t = 0  # actions of the current chunk already served
        self._obs: Any = None
        self._inflight: dict[str, int] | None = None  # {"start": t_snap, "k": call index}
        self._calls = 0
        self._stop = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self, obs: Any) -> None:
        """Compute the first chunk synchronously and start the inference thread."""
        chunk = self.policy(obs, torch.zeros(0), 0, self.s)
        self._check_chunk(chunk)
        with self._cv:
            self._chunk, self._t, self._obs = chunk, 0, obs
        self._thread = threading.Thread(target=self._loop, name="rtc-inference", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the inference thread (waits for a running inference to finish)."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s)

    def __enter__(self) -> RTCRuntime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --------------------------------------------------------------- control loop
    def get_action(self, obs: Any) -> torch.Tensor:
        """Serve one action (call once per control period with the latest observation)."""
        with self._cv:
            if self._chunk is None:
                raise RuntimeError("RTCRuntime.get_action before start()")
            if self.clock.simulated:
                # Lock-step hand-over: a due inference must publish before this tick, and a
                # requested one must have taken its snapshot.
                self._wait(lambda: self._error is not None or not self._due())
            self._raise()
            self._t += 1
            self._obs = obs
            self.stats.served += 1
            if self._t - 1 < self.H:
                action = self._chunk[self._t - 1]
            else:  # the queue ran dry: hold the last action
                self.stats.underruns += 1
                action = self._chunk[self.H - 1]
            self._cv.notify_all()
            if self.clock.simulated and self._t >= self.s:
                # The inference due now must take its snapshot before the next tick. At zero
                # latency it may also publish (clearing ``_inflight``) before this thread
                # wakes, so a call begun since counts too: else the wake-up is lost.
                calls = self._calls
                self._wait(
                    lambda: (
                        self._error is not None
                        or self._inflight is not None
                        or self._calls > calls
                        or self._stop
                    )
                )
            return action

    def run(self, step: Callable[[torch.Tensor], Any], obs: Any, n_steps: int) -> list[Any]:
        """Drive ``n_steps`` control steps: ``obs = step(get_action(obs))``, paced by the
        clock. Returns the observations seen. Starts the runtime if needed."""
        if self._chunk is None:
            self.start(obs)
        seen = []
        for _ in range(n_steps):
            obs = step(self.get_action(obs))
            seen.append(obs)
            self.clock.tick()
        return seen

    # ----------------------------------------------------------- inference thread
    def _loop(self) -> None:
        try:
            while True:
                with self._cv:
                    self._wait(lambda: self._stop or self._t >= self.s, forever=True)
                    if self._stop:
                        return
                    # t_snap = actions of this chunk served so far: the delay is measured
                    # from it (RTC Alg. 1: actions served since inference started). s' is
                    # t_snap capped at H (after an underrun the whole chunk has been used
                    # up); it only selects the prefix and is the policy's ``s``.
                    t_snap = self._t
                    start = min(t_snap, self.H)
                    assert self._chunk is not None
                    prefix = self._chunk[start:].clone()
                    obs = self._obs
                    # Conservative estimate, clamped so the prefix exists (d <= H - s').
                    d = max(0, min(max(self._recent), self.H - start))
                    k = self._calls
                    self._calls += 1
                    self._inflight = {"start": t_snap, "k": k}
                    self.stats.starts.append(start)
                    self.stats.estimates.append(d)
                    self._cv.notify_all()
                chunk = self.policy(obs, prefix, d, start)
                self._check_chunk(chunk)
                with self._cv:
                    if self.clock.simulated:
                        lat = self.clock.latency(k)
                        self._wait(
                            lambda t0=t_snap, la=lat: self._stop or self._t - t0 >= la,
                            forever=True,
                        )
                    if self._stop:  # nobody is served any more: the chunk is moot
                        return
                    measured = self._t - t_snap
                    self._chunk = chunk
                    self._t = measured  # the new chunk continues where time is now
                    self._recent.append(measured)
                    self.stats.delays.append(measured)
                    self._inflight = None
                    self._cv.notify_all()
        except BaseException as e:  # surfaced in the control loop
            with self._cv:
                self._error = e
                self._cv.notify_all()

    # -------------------------------------------------------------------- helpers
    def _due(self) -> bool:
        """Simulated clock: the in-flight inference must publish before the next tick."""
        if self._inflight is None:
            return False
        assert isinstance(self.clock, SimulatedClock)
        return self._t - self._inflight["start"] >= self.clock.latency(self._inflight["k"])

    def _wait(self, pred: Callable[[], bool], forever: bool = False) -> None:
        deadline = None if forever else time.monotonic() + self.timeout_s
        while not pred():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise RuntimeError("RTCRuntime: inference thread did not respond in time")
            self._cv.wait(timeout=left if left is not None else 0.5)

    def _raise(self) -> None:
        if self._error is not None:
            raise RuntimeError("RTCRuntime: the inference thread failed") from self._error

    def _check_chunk(self, chunk: torch.Tensor) -> None:
        if chunk.dim() != 2 or chunk.shape[0] != self.H:
            raise ValueError(
                f"policy must return a chunk (H={self.H}, A), got {tuple(chunk.shape)}"
            )


def make_policy(
    model: Any,
    method: str = "training_time",
    steps: int = 5,
    *,
    horizon: int,
    action_dim: int,
    **sample_kwargs: Any,
) -> PolicyFn:
    """Wrap :func:`flora.policy.rtc.sample` for one observation (batch 1) as a PolicyFn."""

    def policy(obs: Any, prefix: torch.Tensor, d: int, s: int) -> torch.Tensor:
        p = prefix[None] if prefix.numel() else None
        meth = method if p is not None else "plain"
        out = rtc.sample(
            model,
            obs,
            p,
            d if p is not None else 0,
            steps,
            meth,
            s=min(s, horizon),
            shape=(1, horizon, action_dim),
            **sample_kwargs,
        )
        return out[0]

    return policy
