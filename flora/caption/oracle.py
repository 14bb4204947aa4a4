"""An oracle ``VLMBackend`` that answers caption requests from toy-world ground truth.

It is not a model: it looks up the ground-truth event named by the request id
(``<episode_id>#event<k>@<start_us>-<end_us>``, see ``flora.caption.run.request_id``) and
answers its caption rendered through the caption grammar, so the captioner step, parser,
table, validation and ``flora eval caption`` can be checked end to end — the upper bound
of what the pipeline can reproduce. The event is matched by exact boundaries, else by the
highest tIoU (>= ``min_tiou``) in the same episode; no match is a transport error.
``faults`` makes chosen request ids answer garbage a number of times first (bounded
retries); ``shuffle_seed`` answers with a caption taken from another event (control).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from flora.backends.base import VLMRequest, VLMResponse
from flora.backends.oracle import GroundTruthOracle
from flora.caption.grammar import render_caption


class GroundTruthCaptionBackend(GroundTruthOracle):
    """Answers captioner requests with the ground-truth caption of the requested event."""

    fault_text = "The robot is doing something.\nNot sure."

    def __init__(
        self,
        root: str | Path,
        *,
        faults: Mapping[str, int] | None = None,
        min_tiou: float = 0.5,
        shuffle_seed: int | None = None,
    ) -> None:
        super().__init__(root, faults)
        self.min_tiou = min_tiou
        self._shuffled: dict[tuple[int, int, int], str] | None = None
        if shuffle_seed is not None:
            keys = [
                (i, e.start_us, e.end_us)
                for i in self.gt.episode_indices()
                for e in self.gt.events(i)
            ]
            caps = [c for i in self.gt.episode_indices() for c in self._caps(i)]
            perm = np.random.default_rng(shuffle_seed).permutation(len(caps))
            self._shuffled = {k: caps[p] for k, p in zip(keys, perm, strict=True)}

    def _caps(self, i: int) -> list[str]:
        return [e.caption for e in self.gt.events(i)]

    def caption_for(self, episode_index: int, start_us: int, end_us: int) -> str | None:
        """Ground-truth caption of the event best matching ``[start_us, end_us)``."""
        best, best_iou = None, self.min_tiou
        for e in self.gt.events(episode_index):
            if (e.start_us, e.end_us) == (start_us, end_us):
                best = e
                break
            inter = max(0, min(e.end_us, end_us) - max(e.start_us, start_us))
            union = max(e.end_us, end_us) - min(e.start_us, start_us)
            iou = inter / union if union else 0.0
            if iou >= best_iou:
                best, best_iou = e, iou
        if best is None:
            return None
        if self._shuffled is not None:
            return self._shuffled[(episode_index, best.start_us, best.end_us)]
        return best.caption

    def respond(self, req: VLMRequest) -> VLMResponse:
        """The caption of the event named by the request id (an error if there is none)."""
        from flora.caption.run import parse_request_id

        try:
            eid, _, s, e = parse_request_id(req.request_id)
            i = int(eid.rsplit("/", 1)[1])
        except ValueError:
            return VLMResponse("", error=f"oracle: bad request id {req.request_id!r}")
        cap = self.caption_for(i, s, e)
        if cap is None:
            return VLMResponse("", error=f"oracle: no ground-truth event for {req.request_id}")
        return VLMResponse(text=render_caption(cap), model=self.name)


__all__ = ["GroundTruthCaptionBackend"]
