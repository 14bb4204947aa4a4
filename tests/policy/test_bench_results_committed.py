"""The RTC benchmark table in docs/benchmarks.md is backed by its committed raw results.

`flora policy bench --docs` writes both the table and ``docs/results/policy_rtc.json``; this
checks that the committed table is exactly what those results render to (issue 9, item 9),
so neither can be edited or regenerated without the other.
"""

from __future__ import annotations

import json
from pathlib import Path

from flora.policy.bench import docs_block

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_docs_table_is_rendered_from_committed_results():
    results = json.loads((DOCS / "results" / "policy_rtc.json").read_text())
    assert results["config"]["rollouts"] == 2048
    block = docs_block(results, "img/policy_rtc.png")
    assert block in (DOCS / "benchmarks.md").read_text()
