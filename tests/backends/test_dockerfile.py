"""The Dockerfile, checked by parsing it (no Docker engine exists here: it is not built).

Asserts the image rules of docs/deployment.md: multi-stage with builder stages; the
runtime targets (``cpu``, ``cuda``) run as a non-root USER, carry no compilers, copy the
virtualenv from a builder; base images come from digest-pinned build args; no ENV/ARG
with a secret-looking name has a value. Each check is also run on a bad Dockerfile to show
that it can fail. The entrypoint's dispatch is run with stub commands.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RUNTIME_TARGETS = ("cpu", "cuda")
COMPILERS = re.compile(r"\b(gcc|g\+\+|clang|build-essential|cmake|python3(\.\d+)?-dev|libc6-dev)\b")
SECRET_NAME = re.compile(
    r"(TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_KEY|CREDENTIAL|PRIVATE)", re.I
)
DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)


def parse(text: str) -> tuple[dict[str, str], list[Stage]]:
    """(global ARG defaults, stages) of a Dockerfile; continuation lines joined."""
    lines: list[str] = []
    buf = ""
    for raw in text.splitlines():
        s = raw.strip()
        if not s or s.startswith("#"):
            continue
        if s.endswith("\\"):
            buf += s[:-1] + " "
            continue
        lines.append(buf + s)
        buf = ""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in lines:
        op, _, rest = line.partition(" ")
        op = op.upper()
        if op == "FROM":
            m = re.match(r"(\S+)(?:\s+AS\s+(\S+))?", rest, re.I)
            assert m, line
            stages.append(Stage(m.group(2) or str(len(stages)), m.group(1)))
        elif not stages:
            if op == "ARG":
                k, _, v = rest.partition("=")
                args[k.strip()] = v.strip()
        else:
            stages[-1].instructions.append((op, rest))
    return args, stages


def problems(text: str) -> list[str]:
    """Every rule the Dockerfile breaks (empty when it is fine)."""
    args, stages = parse(text)
    out: list[str] = []
    by_name = {s.name: s for s in stages}
    if len(stages) < 2:
        out.append("not multi-stage")
    for target in RUNTIME_TARGETS:
        st = by_name.get(target)
        if st is None:
            out.append(f"no {target} stage")
            continue
        users = [v.strip() for op, v in st.instructions if op == "USER"]
        if not users or users[-1].split(":")[0] in ("root", "0"):
            out.append(f"{target}: does not end as a non-root USER")
        for op, v in st.instructions:
            if op == "RUN" and COMPILERS.search(v):
                out.append(f"{target}: compiler/dev package in RUN: {v[:80]}")
        # The pipeline pods run this image as another uid in group 0 (Airflow's 50000:0,
        # flora.settings pod_run_as_user / pod_fs_group): home and /data must be theirs too.
        env = " ".join(v for op, v in st.instructions if op == "ENV")
        home = re.search(r"\bHOME=(\S+)", env)
        runs = " ".join(v for op, v in st.instructions if op == "RUN")
        for place in [home.group(1) if home else "$HOME", "/data"]:
            if not re.search(
                rf"(chgrp -R 0|chown -R \S*:0)\b[^&]*\s{re.escape(place)}\b", runs
            ) or not re.search(rf"chmod -R g=u\b[^&]*\s{re.escape(place)}\b", runs):
                out.append(f"{target}: {place} is not group 0's with the owner's permissions")
        if users and users[-1].split(":")[-1] != "0":
            out.append(f"{target}: USER {users[-1]} is not in group 0")
        if not re.search(r"\bLOGNAME=\S+", env):
            out.append(f"{target}: no LOGNAME for a uid without a passwd entry")
        if not any(
            op == "COPY" and "--from=" in v and "/opt/flora/venv" in v for op, v in st.instructions
        ):
            out.append(f"{target}: does not copy the venv from a builder stage")
    for st in stages:
        ref = re.fullmatch(r"\$\{?(\w+)\}?", st.base)
        if ref is None:
            if st.base not in by_name:
                out.append(f"{st.name}: base {st.base} is not a build arg")
            continue
        default = args.get(ref.group(1), "")
        if not DIGEST.search(default):
            out.append(f"{st.name}: build arg {ref.group(1)}={default!r} is not pinned by digest")
    every = [("ARG", f"{k}={v}") for k, v in args.items()]
    every += [(op, v) for st in stages for op, v in st.instructions]
    for op, v in every:
        if op not in ("ENV", "ARG"):
            continue
        for m in re.finditer(r"(\w+)(=|\s+)(\S*)", v):
            name, value = m.group(1), m.group(3)
            if SECRET_NAME.search(name) and value:
                out.append(f"{op} {name} has a baked-in value")
    return out


def test_dockerfile_follows_the_image_rules():
    text = (REPO / "Dockerfile").read_text()
    assert problems(text) == []
    _, stages = parse(text)
    names = [s.name for s in stages]
    assert {"cpu-builder", "cpu", "cuda-builder", "cuda"} <= set(names)
    # The GPU runtime is a CUDA *runtime* image (no nvcc), the builder may be devel.
    args, _ = parse(text)
    assert "-runtime-" in args["CUDA_BASE"] and "devel" not in args["CUDA_BASE"]
    # Builders do have the compilers (that is where wheels get built).
    builder = next(s for s in stages if s.name == "cuda-builder")
    assert any(op == "RUN" and "build-essential" in v for op, v in builder.instructions)


BAD = """\
ARG BASE=python:3.11-slim
ARG HF_TOKEN=hf_abc123
FROM ${BASE} AS cpu
ENV MLFLOW_TRACKING_PASSWORD=hunter2 OTHER=1
RUN apt-get update && apt-get install -y gcc \\
    python3.11-dev
USER root
"""


def test_the_checks_catch_a_bad_dockerfile():
    found = "\n".join(problems(BAD))
    assert "not multi-stage" in found
    assert "no cuda stage" in found
    assert "cpu: does not end as a non-root USER" in found
    assert "cpu: compiler/dev package in RUN" in found
    assert "cpu: /data is not group 0's with the owner's permissions" in found
    assert "cpu: no LOGNAME for a uid without a passwd entry" in found
    assert "not pinned by digest" in found
    assert "ARG HF_TOKEN has a baked-in value" in found
    assert "ENV MLFLOW_TRACKING_PASSWORD has a baked-in value" in found
    assert "does not copy the venv" in found
    # An ARG naming a secret without a value (supplied at build time) is fine.
    assert not [p for p in problems("ARG HF_TOKEN\nFROM x AS y\n") if "baked-in" in p]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], "flora --help"),
        (["airflow", "tasks", "run", "d", "t"], "airflow tasks run d t"),
        (["kfp", "--executor_input", "{}"], "python -m kfp.dsl.executor_main --executor_input {}"),
        (["flora", "segment", "run"], "flora segment run"),
        (["serve", "--model", "/m"], "flora serve --model /m"),
        (["python", "-c", "x"], "python -c x"),
    ],
)
def test_entrypoint_dispatches_on_the_first_argument(tmp_path, args, expected):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in ("flora", "airflow", "python"):
        stub = bindir / name
        stub.write_text(f'#!/bin/sh\necho {name} "$@"\n')
        stub.chmod(0o755)
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "HOME": str(tmp_path)}
    script = REPO / "tools" / "docker-entrypoint.sh"
    assert os.access(script, os.X_OK)
    out = subprocess.run(
        ["sh", str(script), *args], env=env, capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == expected
