"""The HTML reports in a real headless Chromium: they load with no console errors, are
self-contained (every image a data: URI, no external URL) and show the timeline."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--enable-logging=stderr", "--v=0", "--window-size=1280,1600"]  # fmt: skip
CONSOLE = re.compile(r":CONSOLE[:(]")


def chromium(page: Path, tmp: Path, *, screenshot: Path | None = None) -> tuple[str, list[str]]:
    """Load ``page``: (dumped DOM, console lines). Fails clearly when Chromium is missing."""
    assert CHROMIUM, "Debian chromium is not installed: run tools/ensure_chromium.sh (make test)"
    args = [CHROMIUM, *FLAGS, f"--user-data-dir={tmp / 'chromium-profile'}"]
    if screenshot is not None:
        shot = subprocess.run([*args, f"--screenshot={screenshot}", page.as_uri()],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert shot.returncode == 0, shot.stderr[-2000:]
    p = subprocess.run([*args, "--dump-dom", page.as_uri()], capture_output=True, text=True,
                       timeout=120)  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout, [ln for ln in p.stderr.splitlines() if CONSOLE.search(ln)]


def report_events(report) -> int:
    """Events of episode 2 in the tables the report was built from."""
    import pandas as pd

    root = report.root.parent / "t" / "events"
    df = pd.concat(pd.read_parquet(p) for p in root.glob("*.parquet"))
    return int((df.episode_id == "toy_tiny/000002").sum())


def test_console_capture_sees_errors(tmp_path):
    """Control: the harness does report a page's console error (so silence means none)."""
    page = tmp_path / "bad.html"
    page.write_text('<html><body><div id="timeline"></div><script>console.error("flora-x");'
                    "undefinedFn();</script></body></html>")  # fmt: skip
    _, console = chromium(page, tmp_path)
    assert any("flora-x" in c for c in console) and any("undefinedFn" in c for c in console)


def test_episode_page_hides_a_stale_caption():
    """A caption is an event's by index *and* interval (as in curation): after the episode
    was segmented again, the old caption of event 0 is not shown on the new event 0."""
    import pandas as pd

    from flora.report.html import episode_page

    eid = "toy/000000"
    meta = {"episode_id": eid, "episode_index": 0, "task": "t", "robot": "arm",
            "duration_us": 10_000_000}  # fmt: skip
    spans = [(0, 2_000_000), (2_000_000, 9_000_000)]  # after re-segmentation
    events = pd.DataFrame([{"episode_id": eid, "event_index": i, "start_us": a, "end_us": b,
                            "caption": ""} for i, (a, b) in enumerate(spans)])  # fmt: skip
    caps = pd.DataFrame([
        {"episode_id": eid, "event_index": 0, "start_us": 5_000_000, "end_us": 9_000_000,
         "caption": "stale pour water"},
        {"episode_id": eid, "event_index": 1, "start_us": 2_000_000, "end_us": 9_000_000,
         "caption": "fresh place cup"},
    ])  # fmt: skip
    html = episode_page(eid, meta, {"events": events, "captions": caps})
    assert "stale pour water" not in html and "(no caption)" in html
    assert "fresh place cup" in html


@pytest.fixture(scope="module")
def report(tiny_dataset, tmp_path_factory):
    from flora.curate.oracle import write_oracle_tables
    from flora.curate.run import curate_dataset
    from flora.report.html import build_reports

    tmp = tmp_path_factory.mktemp("report")
    write_oracle_tables(tiny_dataset, tmp / "t", "run-gt")
    cur = curate_dataset(tiny_dataset, tmp / "t", tmp / "t", "run-cur")
    return build_reports(tiny_dataset, tmp / "t", tmp / "report", mixture=cur.mixture_path,
                         run_id="run-cur")  # fmt: skip


def test_run_and_episode_pages_load_cleanly_in_chromium(report, tmp_path):
    shot = tmp_path / "report.png"
    ep = report.episodes["toy_tiny/000002"]
    dom, console = chromium(ep, tmp_path, screenshot=shot)
    assert console == [], console
    assert 'id="timeline"' in dom
    assert dom.count('class="ev"') == dom.count('alt="keyframe"') == report_events(report)
    assert "data:image/png;base64," in dom and 'id="dense-band"' in dom
    assert not re.search(r'(src|href)="(https?:|//)', dom)  # self-contained
    assert shot.exists() and shot.stat().st_size > 10_000
    from PIL import Image

    img = Image.open(shot).convert("RGB")
    colours = img.getcolors(maxcolors=1 << 20) or []
    assert len(colours) > 50  # a rendered page, not a blank screenshot
    # The docs screenshot is refreshed on request only: a test run must leave the clone's
    # tracked files as they were (a re-rendered PNG differs byte for byte under load).
    if os.environ.get("FLORA_UPDATE_DOC_IMAGES") == "1":
        shutil.copyfile(shot, REPO / "docs" / "img" / "report.png")

    dom, console = chromium(report.index, tmp_path)
    assert console == [], console
    for section in ("Curated mixture", "Failure clusters", "Fleet", "Episodes"):
        assert section in dom
    assert "missed grasp" in dom  # a failure cluster of the tiny dataset
    assert dom.count('href="episodes/') == 3
    assert not re.search(r'(src|href)="(https?:|//)', dom)
