"""No test asserts on wall-clock time: timings live in benchmarks/ (issue 9, item 7).

A timing assertion goes red when CI shares its two cores with other work, which is a
defect, not a finding. This scan fails on any ``assert`` that reads a clock directly or a
name assigned from one.
"""

from __future__ import annotations

import ast
from pathlib import Path

CLOCKS = {"perf_counter", "time", "monotonic", "perf_counter_ns", "monotonic_ns", "time_ns"}


def _is_clock_call(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in CLOCKS
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "time"
    )


def wall_clock_asserts(source: str) -> list[int]:
    """Line numbers of asserts that depend on a clock reading."""
    tree = ast.parse(source)
    timed: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(_is_clock_call(n) for n in ast.walk(node.value)):
            timed |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    # names computed from clock names (elapsed = perf_counter() - t0) are clock readings too
    changed = True
    while changed:
        changed = False
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                uses = {n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)}
                new = {t.id for t in node.targets if isinstance(t, ast.Name)} - timed
                if uses & timed and new:
                    timed |= new
                    changed = True
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert):
            names = {n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)}
            if names & timed or any(_is_clock_call(n) for n in ast.walk(node.test)):
                bad.append(node.lineno)
    return bad


def test_the_scan_finds_timing_asserts():
    src = "import time\nt0 = time.perf_counter()\nx = 1\ndt = time.perf_counter() - t0\n"
    src += "assert dt < 1.0\nassert x == 1\nassert time.monotonic() > 0\n"
    assert wall_clock_asserts(src) == [5, 7]


def test_no_test_asserts_on_wall_clock_time():
    root = Path(__file__).parent
    found = {
        str(p.relative_to(root)): lines
        for p in sorted(root.rglob("*.py"))
        if (lines := wall_clock_asserts(p.read_text()))
    }
    assert not found, f"wall-clock assertions (move them to benchmarks/): {found}"
