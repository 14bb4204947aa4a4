"""Self-contained HTML reports: one per run (dataset) and one per episode.

Everything is inline — CSS in a ``<style>`` block, images as base64 ``data:`` URIs
(matplotlib PNG charts, keyframe thumbnails), no scripts, no CDN — so a report opens from
an MLflow artifact, an e-mail or a laptop without network. Pages:

- ``index.html`` (the run): tables summary, curated mixture (splits, task shares, top
  rows), failure clusters with example thumbnails, fleet charts (reward by robot, by day,
  policy ranking with 95 % intervals) and drift checks, links to the episode pages.
- ``episodes/<key>.html``: a timeline of the events (bars at their [start, end) with
  captions and a keyframe thumbnail at each event's midpoint), the dense labels as a
  coloured band (green normal, amber suboptimal, red failure, grey unlabelled), outcome
  score distribution and reward, rubric step scores, and this episode's curation
  decisions.

``build_reports`` writes them under ``<out>/`` and returns the paths;
``log_reports`` logs the folder to the active MLflow run as artifacts (``report/``).
"""

from __future__ import annotations

import base64
import html
import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

LABEL_COLOURS = {1: "#d62728", 2: "#ff9f1c", 3: "#2ca02c"}
MAX_THUMBS = 24

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;
color:#1d1d1f;background:#fafafa}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid
#ddd;padding-bottom:4px}.muted{color:#666;font-size:13px}
table{border-collapse:collapse;font-size:13px;margin:6px 0}td,th{border:1px solid #ddd;
padding:3px 7px;text-align:left;vertical-align:top}th{background:#f0f0f0}
.timeline{position:relative;height:64px;background:#fff;border:1px solid #ccc;margin:8px 0}
.ev{position:absolute;top:6px;height:52px;background:#cfe3ff;border:1px solid #4a7cc9;
box-sizing:border-box;overflow:hidden;font-size:11px;padding:2px}
.band{position:relative;height:14px;border:1px solid #ccc;background:#ddd}
.band span{position:absolute;top:0;height:14px}
.cards{display:flex;flex-wrap:wrap;gap:8px}.card{background:#fff;border:1px solid #ddd;
padding:6px;width:180px;font-size:12px}.card img{width:96px;height:96px;image-rendering:pixelated}
.chart{max-width:640px;display:block;margin:6px 0}.ok{color:#2ca02c}.bad{color:#d62728}
"""


def _e(x: Any) -> str:
    return html.escape("" if x is None else str(x))


def png_uri(fig: Any) -> str:
    """A matplotlib figure as a base64 PNG ``data:`` URI (the figure is closed)."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def image_uri(img: np.ndarray, size: int = 96) -> str:
    """An RGB uint8 array as a base64 PNG ``data:`` URI (thumbnailed to ``size``)."""
    from PIL import Image

    im = Image.fromarray(np.asarray(img, dtype=np.uint8))
    im.thumbnail((size, size))
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def file_uri(path: str | Path) -> str | None:
    """A PNG file as a ``data:`` URI (None when it does not exist)."""
    p = Path(path) if path else None
    if p is None or not p.exists():
        return None
    return "data:image/png;base64," + base64.b64encode(p.read_bytes()).decode()


def _table(df: pd.DataFrame, max_rows: int = 50, floatfmt: str = "{:.3f}") -> str:
    if df is None or len(df) == 0:
        return '<p class="muted">none</p>'
    d = df.head(max_rows)
    head = "".join(f"<th>{_e(c)}</th>" for c in d.columns)

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return "" if math.isnan(v) else floatfmt.format(v)
        if isinstance(v, list | tuple | np.ndarray):
            return _e(", ".join(map(str, v)))
        return _e(v)

    body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in r) + "</tr>"
                   for r in d.itertuples(index=False))  # fmt: skip
    more = f'<p class="muted">… {len(df) - max_rows} more rows</p>' if len(df) > max_rows else ""
    return f"<table><tr>{head}</tr>{body}</table>{more}"


def _page(title: str, body: str) -> str:
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{_e(title)}'
            f'</title><meta name="viewport" content="width=device-width,initial-scale=1">'
            f"<style>{CSS}</style></head><body>{body}</body></html>")  # fmt: skip


# --------------------------------------------------------------------------- episode page


def timeline_html(events: pd.DataFrame, duration_us: int, thumbs: dict[int, str]) -> str:
    """The events as positioned bars (caption inside) plus a row of keyframe cards."""
    T = max(int(duration_us), 1)
    bars, cards = [], []
    for r in events.sort_values(["start_us", "end_us"]).itertuples(index=False):
        left, width = 100 * r.start_us / T, max(0.3, 100 * (r.end_us - r.start_us) / T)
        cap = r.caption if isinstance(r.caption, str) and r.caption else "(no caption)"
        tip = f"[{r.start_us / 1e6:.2f}, {r.end_us / 1e6:.2f}) s: {cap}"
        bars.append(f'<div class="ev" style="left:{left:.3f}%;width:{width:.3f}%" '
                    f'title="{_e(tip)}">{_e(cap)}</div>')  # fmt: skip
        img = thumbs.get(int(r.event_index))
        pic = f'<img alt="keyframe" src="{img}">' if img else '<p class="muted">no frame</p>'
        cards.append(f'<div class="card">{pic}<div><b>{r.start_us / 1e6:.2f}–'
                     f"{r.end_us / 1e6:.2f} s</b></div><div>{_e(cap)}</div></div>")  # fmt: skip
    if not bars:
        bars.append('<p class="muted" style="padding:8px">no events</p>')
    return (f'<div id="timeline" class="timeline">{"".join(bars)}</div>'
            f'<div class="cards">{"".join(cards)}</div>')  # fmt: skip


def dense_band_html(dense: pd.DataFrame, duration_us: int) -> str:
    """The dense labels as a coloured band over the episode (grey where unlabelled)."""
    T = max(int(duration_us), 1)
    spans = []
    for r in dense.sort_values("t_us").itertuples(index=False) if len(dense) else []:
        end = min(int(r.t_us) + 500_000, T)
        col = LABEL_COLOURS.get(int(r.label), "#999")
        tip = f"{r.t_us / 1e6:.1f} s: label {r.label} {r.reason or ''}"
        spans.append(f'<span style="left:{100 * r.t_us / T:.3f}%;'
                     f'width:{100 * (end - r.t_us) / T:.3f}%;background:{col}" '
                     f'title="{_e(tip)}"></span>')  # fmt: skip
    return f'<div id="dense-band" class="band">{"".join(spans)}</div>'


def _thumbs(dataset: Any, episode_index: int, events: pd.DataFrame) -> dict[int, str]:
    if dataset is None or not len(events):
        return {}
    from flora.data.episode import FloraDataError
    from flora.data.frames import sample_frames

    try:
        ep = dataset.episode(int(episode_index))
        cam = ep.camera_by_role("main") or next(iter(ep.cameras.values()))
        ev = events.sort_values("start_us").head(MAX_THUMBS)
        mids = [int((s + e) // 2) for s, e in zip(ev.start_us, ev.end_us, strict=True)]
        frames = sample_frames(cam, mids, clamp_end=True, dataset=ep.dataset, episode=ep.index)
    except (FloraDataError, StopIteration, OSError, ValueError):
        return {}
    return {int(k): image_uri(f.image) for k, f in zip(ev.event_index, frames, strict=True)}


def episode_page(
    episode_id: str,
    meta: dict[str, Any],
    tables: dict[str, pd.DataFrame],
    *,
    dataset: Any = None,
    decisions: pd.DataFrame | None = None,
) -> str:
    """One episode's report page (HTML string)."""
    T = int(meta["duration_us"])
    sel = {k: (v[v.episode_id == episode_id] if len(v) and "episode_id" in v.columns else v)
           for k, v in tables.items()}  # fmt: skip
    caps, evs = sel.get("captions", pd.DataFrame()), sel.get("events", pd.DataFrame())
    events = evs.copy() if len(evs) else pd.DataFrame(
        columns=["event_index", "start_us", "end_us", "caption"])  # fmt: skip
    if len(caps) and len(events):
        # By index *and* interval (flora.contract.EVENT_KEY): a stale caption shows as none.
        from flora.contract import EVENT_KEY, captions_by_event

        cmap = captions_by_event(caps)
        keys = events[list(EVENT_KEY)].itertuples(index=False)
        events["caption"] = [cmap.get((int(k), int(s), int(e))) for k, s, e in keys]
    elif len(caps):
        events = caps.copy()
    thumbs = _thumbs(dataset, int(meta["episode_index"]), events)
    oc = sel.get("outcome", pd.DataFrame())
    outcome = '<p class="muted">no outcome (step failed or not run)</p>'
    if len(oc):
        r = oc.iloc[0]
        sp = r.get("score_probs")
        probs = [] if sp is None else list(sp)
        pr = " ".join(f"{k + 1}: {float(p):.2f}" for k, p in enumerate(probs))
        es = float(r.get("expected_score", math.nan))
        outcome = (f"<p>reward <b>{float(r['reward']):.3f}</b> · E[score] "
                   f"{es:.2f} · P(score) {pr}</p>")  # fmt: skip
    rb = sel.get("rubric", pd.DataFrame())
    rubric = '<p class="muted">no rubric scores</p>'
    if len(rb):
        r = rb.iloc[0]
        rubric = _table(
            pd.DataFrame(
                {"step": list(r["step_names"]), "score": [float(x) for x in r["step_scores"]]}
            )
        )
        rubric += f"<p>total <b>{float(r['total']):.3f}</b></p>"
    dec = decisions[decisions.episode_id == episode_id] if decisions is not None else None
    dec_html = _table(dec[["event_index", "start_us", "end_us", "pretrain", "policy",
                           "failures", "reason"]]) if dec is not None and len(dec) else (
        '<p class="muted">not curated</p>')  # fmt: skip
    dense = sel.get("dense_labels", pd.DataFrame())
    body = (
        f"<h1>Episode {_e(episode_id)}</h1><p class='muted'>task: {_e(meta.get('task'))} · "
        f"robot: {_e(meta.get('robot'))} · duration {T / 1e6:.2f} s · "
        f"{len(events)} events</p>"
        f"<h2>Timeline</h2>{timeline_html(events, T, thumbs)}"
        f"<h2>Dense labels</h2>{dense_band_html(dense, T)}"
        f"<p class='muted'>green normal · amber suboptimal · red failure · grey unlabelled</p>"
        f"<h2>Outcome</h2>{outcome}<h2>Rubric</h2>{rubric}"
        f"<h2>Curation</h2>{dec_html}"
    )  # fmt: skip
    return _page(f"Flora episode {episode_id}", body)


# --------------------------------------------------------------------------- run page


def fleet_charts(fleet: Any) -> list[tuple[str, str]]:
    """(title, data URI) PNG charts of a ``FleetReport``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = []
    for title, df, key in (("Outcome reward by robot", fleet.by_robot, "robot"),
                           ("Policies ranked by expected reward", fleet.ranking,
                            "policy_version")):  # fmt: skip
        if df is None or not len(df):
            continue
        fig, ax = plt.subplots(figsize=(6, 2.6))
        m = df.mean_reward.to_numpy(float)
        lo = np.nan_to_num(m - df.ci_low.to_numpy(float))
        hi = np.nan_to_num(df.ci_high.to_numpy(float) - m)
        ax.bar(df[key].astype(str), m, yerr=[lo, hi], capsize=4, color="#4a7cc9")
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("reward (95 % CI)")
        ax.set_title(title, fontsize=10)
        out.append((title, png_uri(fig)))
    if fleet.by_day is not None and len(fleet.by_day) and (fleet.by_day.day != "unknown").any():
        fig, ax = plt.subplots(figsize=(6, 2.6))
        d = fleet.by_day[fleet.by_day.day != "unknown"]
        ax.plot(d.day.astype(str), d.mean_reward, marker="o")
        ax.set_ylim(0, 1.05)
        ax.set_title("Outcome reward by day", fontsize=10)
        ax.tick_params(axis="x", labelrotation=45)
        out.append(("Outcome reward by day", png_uri(fig)))
    return out


def run_page(
    dataset_name: str,
    tables: dict[str, pd.DataFrame],
    *,
    mixture: pd.DataFrame | None,
    curate_summary: dict[str, Any] | None,
    failures: Any,
    fleet: Any,
    episode_links: list[tuple[str, str]],
    run_id: str | None = None,
) -> str:
    """The run's report page (HTML string)."""
    tsum = pd.DataFrame([{"table": t, "rows": len(df),
                          "episodes": int(df.episode_id.nunique()) if len(df) else 0}
                         for t, df in tables.items()])  # fmt: skip
    mix_html = '<p class="bad">no curated mixture</p>'
    if mixture is not None and len(mixture):
        per = mixture.groupby("split").agg(rows=("weight", "size"),
                                           episodes=("episode_id", "nunique"),
                                           weight=("weight", "sum")).reset_index()  # fmt: skip
        shares = (mixture.groupby(["split", "task"])["weight"].sum().reset_index()
                  .sort_values(["split", "weight"], ascending=[True, False]))  # fmt: skip
        top = mixture.sort_values("weight", ascending=False)[
            ["split", "episode_id", "start_us", "end_us", "caption", "weight", "reason"]
        ]
        mix_html = (f"{_table(per)}<h3>Task shares</h3>{_table(shares)}"
                    f"<h3>Heaviest rows</h3>{_table(top, 15)}")  # fmt: skip
    if curate_summary:
        dec = curate_summary.get("decisions", {})
        mix_html = (f"<p>{dec.get('items', 0)} items: pretrain {dec.get('pretrain', 0)}, "
                    f"policy {dec.get('policy', 0)}, failures {dec.get('failures', 0)}, "
                    f"dropped {dec.get('dropped', 0)}</p>") + mix_html  # fmt: skip
    fail_html = '<p class="muted">no failure analysis</p>'
    if failures is not None:
        cards = []
        for r in failures.examples.itertuples(index=False):
            img = file_uri(r.thumbnail) if isinstance(r.thumbnail, str) else None
            pic = f'<img alt="clip keyframe" src="{img}">' if img else ""
            cards.append(f'<div class="card">{pic}<div><b>{_e(r.cluster)}</b></div>'
                         f"<div>{_e(r.clip)}</div><div class='muted'>{_e(r.reason)}</div>"
                         "</div>")  # fmt: skip
        miss = (f"<p class='muted'>no dense labels for {len(failures.missing)} episodes</p>"
                if failures.missing else "")  # fmt: skip
        fail_html = f"{_table(failures.clusters)}{miss}<div class='cards'>{''.join(cards)}</div>"
    fleet_html = '<p class="muted">no outcome rewards</p>'
    if fleet is not None and len(fleet.table):
        charts = "".join(f'<img class="chart" alt="{_e(t)}" src="{u}">'
                         for t, u in fleet_charts(fleet))  # fmt: skip
        drift = pd.DataFrame([{"group": d.group, "fired": d.fired, "p_value": d.p_value,
                               "drop": d.drop, "reason": d.reason}
                              for d in fleet.drift])  # fmt: skip
        fleet_html = (f"{charts}<h3>Policy ranking</h3>{_table(fleet.ranking)}"
                      f"<h3>Drift checks</h3>{_table(drift)}"
                      f"<p class='muted'>{fleet.missing_rewards} episodes without a usable "
                      f"reward</p>")  # fmt: skip
    links = "".join(f'<li><a href="{_e(href)}">{_e(eid)}</a></li>' for eid, href in episode_links)
    body = (
        f"<h1>Flora run report — {_e(dataset_name)}</h1>"
        f"<p class='muted'>MLflow run {_e(run_id or '-')}</p>"
        f"<h2>Engine tables</h2>{_table(tsum)}"
        f"<h2>Curated mixture</h2>{mix_html}"
        f"<h2>Failure clusters</h2>{fail_html}"
        f"<h2>Fleet</h2>{fleet_html}"
        f"<h2>Episodes</h2><ul>{links}</ul>"
    )  # fmt: skip
    return _page(f"Flora run report {dataset_name}", body)


@dataclass
class ReportResult:
    """Paths of the written report."""

    root: Path
    index: Path
    episodes: dict[str, Path] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"root": str(self.root), "index": str(self.index),
                "episodes": {k: str(v) for k, v in self.episodes.items()}}  # fmt: skip


def build_reports(
    dataset: str | Path,
    tables: Any,
    out: str | Path,
    *,
    mixture: str | Path | None = None,
    run_id: str | None = None,
    episodes: list[int] | None = None,
    max_episode_pages: int = 50,
    thumbnails: bool = True,
) -> ReportResult:
    """Write the run page and up to ``max_episode_pages`` episode pages under ``out``."""
    import json

    from flora.curate.failures import analyze_spans, failure_spans
    from flora.curate.fleet import fleet_from_tables
    from flora.curate.sources import episode_meta, load_annotations
    from flora.data import open_dataset
    from flora.data.dataset import dataset_name
    from flora.tables import part_key

    root = Path(dataset)
    ds = open_dataset(root) if thumbnails else None
    meta = episode_meta(root, episodes)
    ann = load_annotations(tables, ("events", "captions", "outcome", "dense_labels", "rubric",
                                    "curation"))  # fmt: skip
    ids = set(meta.episode_id)
    tabs = {t: (df[df.episode_id.isin(ids)] if len(df) else df) for t, df in ann.tables.items()}
    out = Path(out)
    (out / "episodes").mkdir(parents=True, exist_ok=True)
    mix = pd.read_parquet(mixture) if mixture and Path(mixture).exists() else None
    summ = None
    if mixture and Path(mixture).with_suffix(".json").exists():
        summ = json.loads(Path(mixture).with_suffix(".json").read_text())
    spans, missing = failure_spans(tabs["dense_labels"], meta)
    fails = analyze_spans(spans, missing, out / "failures", dataset=ds)
    fleet = fleet_from_tables(tabs["outcome"], meta)
    dec = tabs.get("curation") if len(tabs.get("curation", [])) else None
    pages: dict[str, Path] = {}
    for m in meta.head(max_episode_pages).to_dict("records"):
        p = out / "episodes" / f"{part_key(m['episode_id'])}.html"
        p.write_text(episode_page(m["episode_id"], m, tabs, dataset=ds, decisions=dec))
        pages[m["episode_id"]] = p
    index = out / "index.html"
    links = [(k, f"episodes/{v.name}") for k, v in pages.items()]
    index.write_text(run_page(dataset_name(dataset), tabs, mixture=mix, curate_summary=summ,
                              failures=fails, fleet=fleet, episode_links=links,
                              run_id=run_id))  # fmt: skip
    return ReportResult(out, index, pages)


def log_reports(result: ReportResult) -> None:
    """Log the report folder to the active MLflow run (artifact path ``report``)."""
    import mlflow

    mlflow.log_artifacts(str(result.root), artifact_path="report")
    mlflow.set_tag("report.index", str(result.index))


__all__ = [
    "ReportResult",
    "build_reports",
    "dense_band_html",
    "episode_page",
    "fleet_charts",
    "log_reports",
    "run_page",
    "timeline_html",
]
