"""The launcher entry point takes the deepspeed launcher's --local_rank out of argv."""

from __future__ import annotations

from training.launch import strip_local_rank


def test_strip_local_rank_anywhere() -> None:
    assert strip_local_rank(["--local_rank=1", "sft", "--model", "x"]) == (
        ["sft", "--model", "x"],
        1,
    )
    assert strip_local_rank(["sft", "--local-rank", "3"]) == (["sft"], 3)
    assert strip_local_rank(["sft"]) == (["sft"], None)
