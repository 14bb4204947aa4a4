"""Plumbing shared by the ground-truth oracle backends (captioner and rewarder oracles).

An oracle is not a model: it answers each request from a toy-world dataset's ground truth
(``flora.data.ground_truth``), so a step's parser, table, validation and evaluation can be
checked end to end. What every oracle shares lives here once: loading the ground truth,
recording the request ids it was asked, and ``faults`` — chosen request ids answer
``fault_text`` (garbage for the step's grammar) that many times first, to exercise bounded
retries and failure recording. A subclass answers one request in :meth:`respond`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from flora.backends.base import VLMRequest, VLMResponse


class GroundTruthOracle:
    """Base ``VLMBackend`` answering from ground truth; subclasses implement ``respond``."""

    name = "ground-truth-oracle"
    model_version = "gt"
    #: What a faulted request answers (must be rejected by the step's parser).
    fault_text = "I am not sure what happened."

    def __init__(self, root: str | Path, faults: Mapping[str, int] | None = None) -> None:
        from flora.data.ground_truth import load_ground_truth

        self.gt = load_ground_truth(root)
        self.faults = dict(faults or {})
        self.calls: list[str] = []

    def respond(self, req: VLMRequest) -> VLMResponse:
        """The ground-truth answer to one (unfaulted) request."""
        raise NotImplementedError

    def _answer(self, req: VLMRequest) -> VLMResponse:
        self.calls.append(req.request_id)
        left = self.faults.get(req.request_id, 0)
        if left > 0:
            self.faults[req.request_id] = left - 1
            return VLMResponse(text=self.fault_text, model=self.name)
        return self.respond(req)

    def generate(self, requests: Sequence[VLMRequest]) -> list[VLMResponse]:
        """One ground-truth answer per request, in order."""
        return [self._answer(r) for r in requests]


__all__ = ["GroundTruthOracle"]
