"""An oracle ``VLMBackend`` that answers rewarder requests from toy-world ground truth.

It is not a model: it renders the ground truth through the same grammars (outcome with a
near-one-hot score distribution in ``top_logprobs``, dense window targets, rubric scores
with a short think block), so the step functions, parsers, stitching, validation and the
benchmark harness can be checked end to end — an upper bound on what the pipeline can
reproduce. Requests are identified by their ``request_id`` (``<dataset>/<index>|<mode>|<item>``,
see ``flora.reward.run``). ``faults`` makes chosen requests answer garbage a number of times
first, to exercise bounded retries and failure recording.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

from flora.backends.base import TokenLogprob, VLMRequest, VLMResponse
from flora.backends.oracle import GroundTruthOracle
from flora.reward.dense import (
    DenseError,
    DenseWindow,
    plan_windows,
    render_dense,
    window_targets,
)
from flora.reward.outcome import SCORES, render_outcome
from flora.reward.rubric import Rubric, render_rubric

ORACLE_EPS = 1e-6  # probability given to each non-ground-truth score token


class GroundTruthRewardBackend(GroundTruthOracle):
    """Answers outcome / dense / rubric requests exactly as the ground truth says."""

    fault_text = "I am not sure what happened."

    def __init__(
        self,
        root: str | Path,
        faults: Mapping[str, int] | None = None,
        durations_us: Mapping[int, int] | None = None,
    ) -> None:
        super().__init__(root, faults)
        self._durations = dict(durations_us or {})
        eps = self.gt.tables.get("episodes")
        if eps is not None:
            for i, d in zip(eps.episode_index, eps.duration_us, strict=True):
                self._durations.setdefault(int(i), int(d))

    def respond(self, req: VLMRequest) -> VLMResponse:
        """The ground truth of the request's episode, rendered in the mode's grammar."""
        eid, mode, item = req.request_id.split("|")
        i = int(eid.rsplit("/", 1)[1])
        if mode == "outcome":
            k = self.gt.outcome(i)
            return VLMResponse(text=render_outcome(k), logprobs=_score_logprobs(k),
                               model=self.name)  # fmt: skip
        if mode == "dense":
            T = self._durations[i]
            w = _window(T, int(item.removeprefix("w")))
            labels, reasons = window_targets(w, T, self.gt.dense(i))
            try:
                text = render_dense(labels, reasons)
            except DenseError as e:  # ground truth outside the grammar: that window's failure
                return VLMResponse(text="", error=f"oracle: {e}", model=self.name)
            return VLMResponse(text=text, model=self.name)
        if mode == "rubric":
            rub, scores = self.gt.rubric(i)
            r = Rubric.model_validate(rub)
            return VLMResponse(
                text=render_rubric(r, scores, thinking="Scoring each step from the clips."),
                model=self.name,
            )
        return VLMResponse(text="", error=f"oracle: unknown mode {mode!r}", model=self.name)


def _window(duration_us: int, k: int) -> DenseWindow:
    return plan_windows(duration_us)[k]


def _score_logprobs(k: int) -> list[TokenLogprob]:
    """Tokens of ``score: K`` with top alternatives: K near 1, every other score ε."""
    top = {str(s): math.log(1 - 4 * ORACLE_EPS) if s == k else math.log(ORACLE_EPS)
           for s in SCORES}  # fmt: skip
    return [
        TokenLogprob("score", 0.0, {"score": 0.0}),
        TokenLogprob(":", 0.0, {":": 0.0}),
        TokenLogprob(" ", 0.0, {" ": 0.0}),
        TokenLogprob(str(k), top[str(k)], top),
    ]
