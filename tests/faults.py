"""Faults the orchestration tests plant in the engine's steps."""

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
