"""requirements.lock installs from any index: public versions only, torch index optional."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import torch
from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]


def _pins() -> dict[str, str]:
    pins = {}
    for line in (REPO / "requirements.lock").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        req = Requirement(line)
        (spec,) = req.specifier  # exactly one "==" pin per line
        assert spec.operator == "==", line
        pins[req.name.lower()] = spec.version
    return pins


def test_lock_pins_only_public_versions():
    """A local version (``+cpu``) is served only by the PyTorch index: the lock must not
    name one, or a plain ``pip install -r requirements.lock`` fails elsewhere."""
    pins = _pins()
    assert len(pins) > 200
    local = {n: v for n, v in pins.items() if Version(v).local is not None}
    assert local == {}
    assert pins["torch"] == "2.13.0"


def test_torch_pin_matches_the_installed_local_build():
    """PEP 440: ``==2.13.0`` matches ``2.13.0+cpu``, so this machine's CPU wheel satisfies it."""
    assert Requirement(f"torch=={_pins()['torch']}").specifier.contains(
        torch.__version__, prereleases=True
    )


def _make_dry_run(*args: str) -> str:
    make = shutil.which("make")
    assert make, "make is needed for the Quickstart"
    proc = subprocess.run(
        [make, "-n", "-B", "-C", str(REPO), *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return proc.stdout


def test_make_passes_the_torch_index_to_pip():
    idx = "https://example.invalid/whl/cpu"
    with_index = _make_dry_run("venv", f"TORCH_INDEX={idx}")
    assert f"pip install -q --extra-index-url {idx} -r requirements.lock" in with_index
    without = _make_dry_run("venv")
    assert "pip install -q  -r requirements.lock" in without or (
        "pip install -q -r requirements.lock" in without
    )
    assert "--extra-index-url" not in without


def test_make_lock_writes_torch_without_its_local_label():
    script = _make_dry_run("lock")
    sed = next(ln for ln in script.splitlines() if "sed -E" in ln)
    expr = sed.split("sed -E", 1)[1].split(">", 1)[0].strip().strip("'")
    out = subprocess.run(
        ["sed", "-E", expr],
        input="numpy==2.4.6\ntorch==2.13.0+cpu\ntorchvision==0.28.0+cpu\n",
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out == "numpy==2.4.6\ntorch==2.13.0\ntorchvision==0.28.0\n"
