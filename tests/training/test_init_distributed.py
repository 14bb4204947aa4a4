"""The trainers' distributed init never waits on DeepSpeed's JIT-compiled shm op."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_init_ignores_a_stale_shm_op_build_lock(tmp_path):
    """A compile killed mid-way leaves ``<ext dir>/deepspeed_shm_comm/lock``; torch waits
    on that file forever. Init must not compile the op, so the stale lock is harmless."""
    ext = tmp_path / "torch_extensions"
    (ext / "deepspeed_shm_comm").mkdir(parents=True)
    (ext / "deepspeed_shm_comm" / "lock").touch()
    code = (
        "from training.sft import init_distributed\n"
        "import deepspeed.comm.comm as c\n"
        "print(init_distributed(), c.cdb.shm_comm_op)\n"
    )
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(ext), "PYTHONPATH": str(REPO)}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "(0, 1) None"  # one rank, no shm op
    assert (ext / "deepspeed_shm_comm" / "lock").exists()  # never touched, never built
