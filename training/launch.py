"""Launcher entry point: ``python -m training.launch sft …`` runs ``flora train sft …``.

The ``deepspeed`` launcher inserts ``--local_rank=N`` right after the module name, where
the root ``flora`` command has no such option; this module takes it out (wherever it is),
exports it as ``LOCAL_RANK`` and runs ``flora train`` with the remaining arguments::

    deepspeed --num_gpus 2 --module training.launch sft --model captioner --recipe small ...

``torchrun -m training.launch sft …`` works the same (it only sets the env).
"""

from __future__ import annotations

import os
import sys


def strip_local_rank(argv: list[str]) -> tuple[list[str], int | None]:
    """``argv`` without ``--local_rank[=]N`` / ``--local-rank[=]N`` and the rank found."""
    out: list[str] = []
    rank: int | None = None
    it = iter(argv)
    for a in it:
        for flag in ("--local_rank", "--local-rank"):
            if a == flag:
                rank = int(next(it))
                break
            if a.startswith(flag + "="):
                rank = int(a.split("=", 1)[1])
                break
        else:
            out.append(a)
    return out, rank


def main(argv: list[str] | None = None) -> None:
    """Run ``flora train <argv>`` with the launcher's local rank in ``LOCAL_RANK``."""
    args, rank = strip_local_rank(list(sys.argv[1:] if argv is None else argv))
    if rank is not None:
        os.environ["LOCAL_RANK"] = str(rank)
    from flora.cli import app
    from flora.cli_common import run_app

    sys.exit(run_app(app, ["train", *args], prog_name="flora"))


if __name__ == "__main__":
    main()
