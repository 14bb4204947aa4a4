"""Filtering: one keep/drop decision per segment (event) of every episode, with reasons.

Seed figure 6: captions feed pretraining, dense labels feed RL post-training and failure
analysis, outcome rewards feed fleet monitoring. Every item (an event of the ``events``
table, or the whole episode when it has no events) gets a row in the ``curation`` table:

- ``failures``: the item belongs to the failure set — its episode's outcome reward is
  below ``outcome.min_reward``, or it overlaps dense failure spans (label 1; suboptimal
  spans too with ``dense.suboptimal: failures``) by more than ``dense.failure_overlap``
  of its length. Failures are a set of their own (RL post-training, failure analysis):
  they are never deleted, and no quality rule removes them.
- ``policy``: not a failure and passes the duration rules (and the suboptimal rule).
- ``pretrain``: in ``policy`` and its caption was accepted and has ``caption.min_words``
  ..``max_words`` words (a rejected caption always keeps the segment out of pretrain;
  ``caption.on_rejected: drop`` drops it from ``policy`` as well).

A table the rules need may be missing for an episode (its step failed or did not run):
the rule is then not applied, and the reason says which table is missing and, when the
step recorded one, why (``outcome.on_missing: drop`` drops such episodes instead). NaN
rewards count as missing. Reasons are ``"; "``-joined verdicts, one per rule.

The whole-episode item is judged by the outcome, dense and suboptimal rules like any
segment, but not by the segment duration rules (the segmenter did not cut it). Time the
dense labels do not cover (a failed dense window) is not judged by them; an item
overlapping it says so (``dense: no labels for [a, b) s``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from flora.contract import captions_by_event
from flora.curate.rules import CurationRules
from flora.curate.sources import Annotations

DENSE_GROUP_US = 500_000
CURATION_MODEL = "flora-curate"
#: A failure record's item naming an interval: ``event 3 [2000000, 3500000) µs`` (captions,
#: ``flora.caption.run``) or ``window 1 [6000000, 10000000) us`` (dense labels,
#: ``flora.reward.run``); the interval may be ``[?, ?)`` when the event had none.
_ITEM = re.compile(r"^(?P<kind>event|window) (?P<index>\d+)\b"
                   r"(?: \[(?P<start>\d+), (?P<end>\d+)\) (?:µs|us)\b)?")  # fmt: skip
_LEAD = re.compile(r"^(?:caption:\s*)?(?:(?:attempt|try|fail) to\s+)?", re.IGNORECASE)


@dataclass(frozen=True)
class Span:
    """A dense span: consecutive 0.5 s groups with the same non-normal label."""

    start_us: int
    end_us: int
    label: int  # 1 failure, 2 suboptimal
    reason: str


def item_interval(item: str) -> tuple[str, int, int | None, int | None] | None:
    """``(kind, index, start_us, end_us)`` of a failure record's item, or None.

    ``kind`` is ``event`` or ``window``; start/end are None when the item names no
    interval (old records, or ``[?, ?)``).
    """
    m = _ITEM.match(str(item))
    if m is None:
        return None
    s, e = m.group("start"), m.group("end")
    return (m.group("kind"), int(m.group("index")),
            int(s) if s is not None else None, int(e) if e is not None else None)  # fmt: skip


def caption_verb(caption: Any) -> str | None:
    """The action verb of a caption: its first word (after "attempt to"), lower case."""
    if not isinstance(caption, str) or not caption.strip():
        return None
    words = _LEAD.sub("", caption.strip()).split()
    if not words:
        return None
    return re.sub(r"[^a-z-]", "", words[0].lower()) or None


def dense_spans(rows: pd.DataFrame, duration_us: int, min_span_us: int = 0) -> list[Span]:
    """Merge one episode's dense labels into failure/suboptimal spans (clipped to T).

    ``min_span_us`` is compared with a span's uncut length (its groups × 0.5 s): the last
    group, clipped at T, still counts as one whole group.
    """
    if rows is None or len(rows) == 0:
        return []
    out: list[tuple[Span, int]] = []  # (span, uncut length)
    cur: list[Any] | None = None  # [start, end (clipped), label, reason, uncut end]
    for t, lab, rs in sorted(zip(rows.t_us, rows.label, rows.reason, strict=True)):
        t, lab = int(t), int(lab)
        end = min(t + DENSE_GROUP_US, int(duration_us)) if duration_us else t + DENSE_GROUP_US
        if lab in (1, 2) and cur is not None and cur[2] == lab and cur[1] >= t:
            cur[1], cur[4] = end, t + DENSE_GROUP_US
            continue
        if cur is not None:
            out.append((Span(*cur[:4]), cur[4] - cur[0]))
            cur = None
        if lab in (1, 2):
            cur = [t, end, lab, str(rs or ""), t + DENSE_GROUP_US]
    if cur is not None:
        out.append((Span(*cur[:4]), cur[4] - cur[0]))
    return [s for s, uncut in out if uncut >= min_span_us and s.end_us > s.start_us]


def unlabelled(rows: pd.DataFrame, duration_us: int) -> list[tuple[int, int]]:
    """``[a, b)`` µs intervals of ``[0, T)`` no dense row covers (a row covers its 0.5 s
    group): the times a failed dense window sourced (``flora.reward.run``)."""
    gaps: list[tuple[int, int]] = []
    at = 0
    for t in sorted({int(x) for x in rows.t_us}):
        if t > at:
            gaps.append((at, min(t, int(duration_us))))
        at = max(at, t + DENSE_GROUP_US)
    if at < duration_us:
        gaps.append((at, int(duration_us)))
    return [(a, b) for a, b in gaps if b > a]


def _overlap(a0: int, a1: int, spans: Sequence[Span]) -> tuple[int, Span | None]:
    tot, worst = 0, None
    for s in spans:
        o = min(a1, s.end_us) - max(a0, s.start_us)
        if o > 0:
            tot += o
            worst = worst or s
    return tot, worst


def _sec(us: float) -> str:
    return f"{us / 1e6:.2f} s"


def _missing(ann: Annotations, table: str, eid: str) -> str:
    fails = ann.failed(table, eid)
    if fails:
        return f"{table}: missing ({fails[0].item}: {fails[0].reason[:160]})"
    if not ann.present(table):
        return f"{table}: missing (table not produced)"
    return f"{table}: missing (episode not processed)"


def _gap_why(ann: Annotations, eid: str, a: int, b: int) -> str:
    """`` (window …: reason)`` of the recorded dense failure overlapping ``[a, b)``."""
    for f in ann.failed("dense_labels", eid):
        it = item_interval(f.item)
        if it is not None and it[2] is not None and min(b, it[3]) > max(a, it[2]):
            return f" ({f.item}: {f.reason[:160]})"
    return ""


def _by_episode(df: pd.DataFrame) -> dict[str, pd.DataFrame]:
    if df is None or len(df) == 0 or "episode_id" not in df.columns:
        return {}
    return {str(k): g for k, g in df.groupby("episode_id", sort=False)}


def _run_ids(*frames: pd.DataFrame | None) -> list[str]:
    ids: set[str] = set()
    for f in frames:
        if f is not None and len(f) and "run_id" in f.columns:
            ids |= {str(x) for x in f["run_id"].dropna()}
    return sorted(ids)


def decide(ann: Annotations, meta: pd.DataFrame, rules: CurationRules, run_id: str) -> pd.DataFrame:
    """The ``curation`` table: one decision row per item of every episode in ``meta``.

    ``meta`` has ``flora.curate.sources.META_COLUMNS`` (task, robot, duration, …).
    """
    by = {t: _by_episode(ann.table(t)) for t in ("events", "captions", "outcome",
                                                  "dense_labels", "rubric")}  # fmt: skip
    rows: list[dict[str, Any]] = []
    sha = rules.sha()
    for m in meta.to_dict("records"):
        rows += _decide_episode(ann, by, m, rules, run_id, sha)
    return pd.DataFrame(rows, columns=list(DECISION_DTYPES)).astype(DECISION_DTYPES)


DECISION_DTYPES: dict[str, str] = {
    "episode_id": "object", "dataset": "object", "model": "object", "model_version": "object",
    "run_id": "object", "episode_index": "int64", "event_index": "int64", "start_us": "int64",
    "end_us": "int64", "duration_us": "int64", "caption": "object", "caption_status": "object",
    "task": "object", "robot": "object", "policy_version": "object", "day": "object",
    "verb": "object", "reward": "float64", "rubric_total": "float64", "pretrain": "bool",
    "policy": "bool", "failures": "bool", "failure_reason": "object", "drop_reason": "object",
    "reason": "object", "source_tables": "object", "source_run_ids": "object",
    "rules_sha": "object",
}  # fmt: skip


def _decide_episode(
    ann: Annotations,
    by: dict[str, dict[str, pd.DataFrame]],
    m: dict[str, Any],
    rules: CurationRules,
    run_id: str,
    sha: str,
) -> list[dict[str, Any]]:
    eid = str(m["episode_id"])
    T = int(m["duration_us"])
    ev = by["events"].get(eid)
    cap = by["captions"].get(eid)
    oc = by["outcome"].get(eid)
    de = by["dense_labels"].get(eid)
    rb = by["rubric"].get(eid)
    notes: list[str] = []

    # Outcome (episode level).
    reward = math.nan
    if oc is not None and len(oc) and "reward" in oc.columns:
        reward = float(pd.to_numeric(oc["reward"], errors="coerce").iloc[0])
    ep_fail = None
    ep_drop = None
    if math.isfinite(reward):
        if reward < rules.outcome.min_reward:
            ep_fail = f"outcome: reward {reward:.3f} < {rules.outcome.min_reward}"
        else:
            notes.append(f"outcome: reward {reward:.3f} >= {rules.outcome.min_reward}")
    else:
        why = "outcome: reward is NaN" if oc is not None and len(oc) else _missing(
            ann, "outcome", eid)  # fmt: skip
        if rules.outcome.on_missing == "drop":
            ep_drop = f"{why}; on_missing=drop"
        else:
            notes.append(f"{why}; not judged by reward")
    if T < rules.duration.min_episode_s * 1e6:
        ep_drop = ep_drop or f"duration: episode {_sec(T)} < {rules.duration.min_episode_s} s"

    # Dense spans.
    spans: list[Span] = []
    gaps: list[tuple[int, int]] = []
    if de is not None and len(de):
        spans = dense_spans(de, T, int(rules.dense.min_span_s * 1e6))
        n_fail = sum(s.label == 1 for s in spans)
        notes.append(f"dense: {n_fail} failure / {len(spans) - n_fail} suboptimal spans")
        gaps = unlabelled(de, T)
    else:
        notes.append(_missing(ann, "dense_labels", eid) + "; spans not applied")
    fail_spans = [
        s for s in spans if s.label == 1 or (s.label == 2 and rules.dense.suboptimal == "failures")
    ]
    sub_spans = [s for s in spans if s.label == 2]

    rubric_total = math.nan
    if rb is not None and len(rb) and "total" in rb.columns:
        rubric_total = float(pd.to_numeric(rb["total"], errors="coerce").iloc[0])

    # Captions by event index; rejections from the captioner's recorded failures.
    # By index *and* interval (flora.contract.EVENT_KEY): a caption of the same index and
    # another interval is stale, not this event's.
    caps = captions_by_event(cap)
    written = {k: (s, e) for k, s, e in caps}  # the interval each index was captioned for
    # A rejection names the interval it was for, too: one of another interval is stale.
    rejected: dict[int, list[tuple[int | None, int | None, str, str]]] = {}
    for f in ann.failed("captions", eid):
        it = item_interval(f.item)
        if it is not None and it[0] == "event":
            rejected.setdefault(it[1], []).append((it[2], it[3], f.reason, f.item))
    episode_sources = [("outcome", oc), ("dense_labels", de), ("rubric", rb)]

    items: list[tuple[int, int, int, pd.DataFrame | None]] = []
    if ev is not None and len(ev):
        for r in ev.sort_values(["start_us", "end_us"]).itertuples(index=False):
            items.append((int(r.event_index), int(r.start_us), int(r.end_us), ev))
    else:
        notes.append(_missing(ann, "events", eid).replace("missing", "no events", 1)
                     if not (ev is not None) else "events: episode has no events")  # fmt: skip
        items.append((-1, 0, T, None))

    out = []
    for k, s, e, src in items:
        reasons = list(notes)
        fail_r = [ep_fail] if ep_fail else []
        drop_r = [ep_drop] if ep_drop else []
        dur = e - s
        # The whole-episode item (k < 0) meets the dense rules like a segment does.
        if fail_spans:
            ov, sp = _overlap(s, e, fail_spans)
            if ov > rules.dense.failure_overlap * dur and sp is not None:
                where = f"[{_sec(sp.start_us)}, {_sec(sp.end_us)})"
                what = "segment" if k >= 0 else "episode"
                fail_r.append(f"dense: overlaps label-{sp.label} span {where} '{sp.reason}' "
                              f"({ov / dur:.0%} of {what})")  # fmt: skip
        if sub_spans and rules.dense.suboptimal == "drop":
            ov, sp = _overlap(s, e, sub_spans)
            if ov > 0 and sp is not None:
                drop_r.append(f"dense: overlaps suboptimal span '{sp.reason}'")
        # Duration rules judge the segmenter's cuts; the whole episode is no such cut
        # (the episode rule, min_episode_s, judges it).
        if k >= 0 and dur < rules.duration.min_segment_s * 1e6:
            drop_r.append(f"duration: segment {_sec(dur)} < {rules.duration.min_segment_s} s")
        if k >= 0 and dur > rules.duration.max_segment_s * 1e6:
            drop_r.append(f"duration: segment {_sec(dur)} > {rules.duration.max_segment_s} s")
        for a, b in gaps:
            if min(e, b) > max(s, a):
                reasons.append(f"dense: no labels for [{max(s, a) / 1e6:.2f}, "
                               f"{min(e, b) / 1e6:.2f}) s{_gap_why(ann, eid, a, b)}")  # fmt: skip
        # Caption quality (pretraining only).
        got = written.get(k) if k >= 0 else None
        rej = rejected.get(k, []) if k >= 0 else []
        rej_now = [r for r in rej if (r[0], r[1]) == (s, e)]
        c = caps.get((k, s, e)) if k >= 0 else None
        caption = str(c) if c is not None else None
        if k < 0:
            status, cap_ok, cap_r = "none", False, "caption: no events, nothing to caption"
        elif caption is not None:
            n = len(caption.removeprefix("caption: ").split())
            status = "accepted"
            cap_ok = rules.caption.min_words <= n <= rules.caption.max_words
            cap_r = (f"caption: {n} words" if cap_ok else
                     f"caption: {n} words outside [{rules.caption.min_words}, "
                     f"{rules.caption.max_words}]")  # fmt: skip
        elif got is not None:
            status, cap_ok = "missing", False
            cap_r = (f"caption: stale, written for [{got[0]}, {got[1]}) µs (the episode was "
                     "segmented again since it was captioned)")  # fmt: skip
        elif rej_now:
            status, cap_ok = "rejected", False
            cap_r = f"caption: rejected ({rej_now[0][2][:160]})"
            if rules.caption.on_rejected == "drop":
                drop_r.append(f"{cap_r}; on_rejected=drop")
        elif rej:  # recorded for another interval (or none): not this segment's
            status, cap_ok = "missing", False
            cap_r = (f"caption: stale rejection, recorded for '{rej[0][3]}' (the episode "
                     "was segmented again since it was captioned)")  # fmt: skip
        else:
            status, cap_ok = "missing", False
            cap_r = _missing(ann, "captions", eid)
        reasons.append(cap_r)
        srcs = [(t, f) for t, f in [("events", src), ("captions", cap), *episode_sources]
                if f is not None and len(f)]  # fmt: skip
        if not srcs:  # every row of the mixture must trace to annotation rows
            drop_r.append("lineage: no annotation rows for this episode (every step failed)")
            fail_r = []
        is_fail = bool(fail_r)
        policy = not is_fail and not drop_r
        pretrain = policy and cap_ok
        verb = caption_verb(caption)
        if verb is None and src is not None:
            row_ev = src[src.event_index == k]
            verb = caption_verb(row_ev.caption.iloc[0]) if len(row_ev) else None
        out.append({
            "episode_id": eid, "dataset": eid.rsplit("/", 1)[0], "model": CURATION_MODEL,
            "model_version": sha, "run_id": run_id, "episode_index": int(m["episode_index"]),
            "event_index": k, "start_us": s, "end_us": e, "duration_us": T,
            "caption": caption, "caption_status": status, "task": str(m.get("task") or ""),
            "robot": str(m.get("robot") or "unknown"),
            "policy_version": str(m.get("policy_version") or "unknown"),
            "day": str(m.get("day") or "unknown"), "verb": verb or "unknown",
            "reward": reward, "rubric_total": rubric_total, "pretrain": pretrain,
            "policy": policy, "failures": is_fail,
            "failure_reason": "; ".join(fail_r) or None, "drop_reason": "; ".join(drop_r) or None,
            "reason": "; ".join(fail_r + drop_r + reasons),
            "source_tables": [t for t, _ in srcs],
            "source_run_ids": _run_ids(*[f for _, f in srcs]), "rules_sha": sha,
        })  # fmt: skip
    return out


def summarize(decisions: pd.DataFrame) -> dict[str, Any]:
    """Counts per split and the most common drop/failure reasons (for logs and reports)."""
    d = decisions
    first = lambda s: s.dropna().str.split(":").str[0].value_counts().to_dict()  # noqa: E731
    return {
        "items": int(len(d)),
        "episodes": int(d.episode_id.nunique()) if len(d) else 0,
        "pretrain": int(d.pretrain.sum()) if len(d) else 0,
        "policy": int(d.policy.sum()) if len(d) else 0,
        "failures": int(d.failures.sum()) if len(d) else 0,
        "dropped": int((~d.policy & ~d.failures).sum()) if len(d) else 0,
        "failure_rules": first(d.failure_reason) if len(d) else {},
        "drop_rules": first(d.drop_reason) if len(d) else {},
        "caption_status": d.caption_status.value_counts().to_dict() if len(d) else {},
    }


def episode_failed(decisions: pd.DataFrame) -> pd.Series:
    """Per episode: True when no item of it reached the pretraining split."""
    return ~decisions.groupby("episode_id")["pretrain"].any()


__all__ = [
    "CURATION_MODEL",
    "DECISION_DTYPES",
    "Span",
    "caption_verb",
    "decide",
    "dense_spans",
    "episode_failed",
    "item_interval",
    "summarize",
    "unlabelled",
]
