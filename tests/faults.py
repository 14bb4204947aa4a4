"""Faults the orchestration tests plant in the engine's steps, and a scripted backend."""

from __future__ import annotations

from typing import Any


def break_segment_on_episode(monkeypatch: Any, episode: int) -> None:
    """Make ``flora.engine.run_segment`` raise ``FloraDataError`` (bad input, which a retry
    cannot fix) for any shard holding ``episode``; other shards segment as usual."""
    import flora.engine
    from flora.data.episode import FloraDataError

    real = flora.engine.run_segment

    def breaks(dataset_path, out_dir, episodes, *args, **kwargs):
        if episode in episodes:
            raise FloraDataError(
                "video unreadable", dataset="toy_tiny", episode=episode, field="video"
            )
        return real(dataset_path, out_dir, episodes, *args, **kwargs)

    monkeypatch.setattr(flora.engine, "run_segment", breaks)


class ScriptedBackend:
    """Answers each request with ``answer(request)`` (an in-process test double)."""

    name = "scripted"
    model_version = "scripted-1"

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.calls = 0

    def generate(self, requests: Any) -> list[Any]:
        from flora.backends.base import VLMResponse

        self.calls += 1
        return [VLMResponse(self.answer(r), model=self.name) for r in requests]
