"""Helpers for the command-line tests: run the real ``flora`` CLI in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

FLORA = Path(sys.executable).with_name("flora")


@dataclass
class Ran:
    """Exit status and the two output streams of one CLI run."""

    code: int
    out: str
    err: str


@pytest.fixture
def cli_env(tmp_path):
    """Environment for a subprocess run: scratch FLORA_HOME, kinematic backend, 1 thread."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLORA_")}
    env.update(
        FLORA_HOME=str(tmp_path / "home"),
        FLORA_BACKEND="kinematic",
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        GX_ANALYTICS_ENABLED="false",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        COLUMNS="100",
    )
    return env


@pytest.fixture
def flora(cli_env):
    """``flora(*args, module=False) -> Ran``: the installed script (or ``python -m flora.cli``)."""

    def run(*args: str, module: bool = False, env: dict[str, str] | None = None) -> Ran:
        cmd = [sys.executable, "-m", "flora.cli"] if module else [str(FLORA)]
        p = subprocess.run(
            [*cmd, *map(str, args)],
            capture_output=True,
            text=True,
            env={**cli_env, **(env or {})},
            timeout=300,
        )
        return Ran(p.returncode, p.stdout, p.stderr)

    return run


@pytest.fixture
def run_flora(isolated_home, monkeypatch, capsys):
    """In-process ``flora`` through ``run_app`` (what the script runs): (code, out, err)."""
    from flora.cli import app
    from flora.cli_common import run_app
    from flora.settings import get_settings

    monkeypatch.setenv("FLORA_BACKEND", "kinematic")
    monkeypatch.delenv("FLORA_DEBUG", raising=False)
    get_settings.cache_clear()

    def run(*args):
        capsys.readouterr()
        code = run_app(app, [str(a) for a in args])
        got = capsys.readouterr()
        return code, got.out, got.err

    return run
