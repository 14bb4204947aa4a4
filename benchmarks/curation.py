"""Curation on the toy world with its ground-truth annotations -> docs/benchmarks.md.

Simulates N toy-world episodes (no video is rendered: curation reads only tables),
writes the engine tables straight from the ground truth (``flora.curate.oracle``), runs
``curate_dataset`` with the default rules and measures:

- episode level: the episodes filtering removes from the pretraining mixture (no row in
  the ``pretrain`` split) against the episodes with an injected failure the arm did not
  recover from (ground truth ``success == False``): precision and recall;
- segment level: ground-truth failed attempts (events with ``success == False``) kept
  out of ``pretrain``, and clean events wrongly kept out;
- rebalancing: the most frequent task family's share of the pretraining split before
  (row share) and after (weight share) against the cap.

Usage: ``python benchmarks/curation.py [--episodes 120] [--append docs/benchmarks.md]``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")


def run(episodes: int, seed: int) -> dict:
    import pandas as pd

    from flora.curate.oracle import write_oracle_tables
    from flora.curate.rules import load_rules
    from flora.curate.run import curate_dataset
    from flora.curate.sources import ground_truth_meta
    from flora.data.ground_truth import load_ground_truth, write_ground_truth
    from flora.data.synth import default_durations
    from flora.data.world import simulate_episode

    tmp = Path(tempfile.mkdtemp(prefix="flora-curation-bench-"))
    root = tmp / "toy_world_bench"
    durs = default_durations(episodes)
    t0 = time.perf_counter()
    write_ground_truth(root, {i: simulate_episode(seed, i, d) for i, d in enumerate(durs)})
    t_sim = time.perf_counter() - t0
    write_oracle_tables(root, tmp / "tables", "oracle-run")
    gt = load_ground_truth(root)
    meta = ground_truth_meta(root)
    # Instructions are nearly unique per episode (objects, colours): group by task family.
    fam = gt.tables["episodes"].set_index("episode_index")["family"]
    meta["task"] = [fam[i] for i in meta.episode_index]
    rules = load_rules()
    t0 = time.perf_counter()
    res = curate_dataset(root, tmp / "tables", tmp / "out", "bench", meta=meta, rules=rules)
    t_cur = time.perf_counter() - t0
    mix, dec = res.mixture, res.decisions
    pre = mix[mix.split == "pretrain"]
    oc = gt.tables["outcome"].set_index("episode_index")
    ids = {f"{root.name}/{i:06d}": i for i in oc.index}
    failed = {e for e, i in ids.items() if not bool(oc.loc[i, "success"])}
    removed = set(ids) - set(pre.episode_id)
    tp = len(removed & failed)
    ev = gt.tables["events"]
    key = [(f"{root.name}/{int(i):06d}", int(s)) for i, s in zip(ev.episode_index, ev.start_us,
                                                                 strict=True)]  # fmt: skip
    in_pre = set(zip(pre.episode_id, pre.start_us, strict=True))
    bad_ev = [k for k, ok in zip(key, ev.success, strict=True) if not ok]
    good_ev = [k for k, ok in zip(key, ev.success, strict=True) if ok]
    raw = pre.task.value_counts(normalize=True)
    weighted = pre.groupby("task")["weight"].sum()
    top = str(raw.index[0])
    # The same split re-weighted at other temperatures (same cap): where the cap binds.
    from flora.curate.rebalance import mixture_weights
    from flora.curate.rules import RebalanceRule

    by_t = {}
    for temp in (1.0, 2.0, float("inf")):
        w, _ = mixture_weights(
            pre, RebalanceRule(temperature=temp, max_share=rules.rebalance.max_share)
        )
        by_t[temp] = float(w.groupby(pre.task).sum()[top])
        if temp == 1.0:
            nocap, _ = mixture_weights(pre, RebalanceRule(temperature=1.0, max_share=1.0))
            by_t["T=1, no cap"] = float(nocap.groupby(pre.task).sum()[top])
    return {
        "by_temperature": by_t,
        "episodes": episodes,
        "failed_episodes": len(failed),
        "removed_episodes": len(removed),
        "precision": tp / len(removed) if removed else float("nan"),
        "recall": tp / len(failed) if failed else float("nan"),
        "failed_attempts": len(bad_ev),
        "failed_attempts_kept_out": sum(k not in in_pre for k in bad_ev) / max(1, len(bad_ev)),
        "clean_events_kept": sum(k in in_pre for k in good_ev) / max(1, len(good_ev)),
        "items": len(dec),
        "splits": {s: int((mix.split == s).sum()) for s in ("pretrain", "policy", "failures")},
        "top_task": top,
        "top_raw_share": float(raw.iloc[0]),
        "top_weighted_share": float(weighted[top]),
        "max_weighted_share": float(weighted.max()),
        "cap": rules.rebalance.max_share,
        "temperature": rules.rebalance.temperature,
        "tasks": int(pre.task.nunique()),
        "shares": {k: (float(raw[k]), float(weighted[k])) for k in raw.index},
        "t_simulate_s": t_sim,
        "t_curate_s": t_cur,
        "pd": pd.__version__,
    }


def markdown(r: dict) -> str:
    temps = ", ".join(f"{'T=' + str(k) if not isinstance(k, str) else k}: {v:.3f}"
                      for k, v in r["by_temperature"].items())  # fmt: skip
    shares = "\n".join(f"| {k} | {a:.3f} | {b:.3f} |" for k, (a, b) in r["shares"].items())
    return f"""
## Curation on the toy world (2026-11-30, this machine: 2 shared CPU cores)

`python benchmarks/curation.py --episodes {r["episodes"]}`: {r["episodes"]} simulated
toy-world episodes (seed 0, default durations 5 s – 3 min), engine tables written from
the ground truth (`flora.curate.oracle`), default rules (`flora/curate/rules/default.yaml`:
outcome reward >= 0.6, any overlap with a dense failure span -> failures, captions of
2–40 words, T = {r["temperature"]}, cap {r["cap"]}).

| filtering (episode level) | value |
| --- | --- |
| episodes with an unrecovered injected failure (ground truth) | {r["failed_episodes"]} |
| episodes removed from the pretraining mixture | {r["removed_episodes"]} |
| precision (removed that had failed) | {r["precision"]:.3f} |
| recall (failed that were removed) | {r["recall"]:.3f} |
| failed attempts (ground-truth events with success = False) | {r["failed_attempts"]} |
| failed attempts kept out of pretrain | {r["failed_attempts_kept_out"]:.3f} |
| clean events kept in pretrain | {r["clean_events_kept"]:.3f} |
| items (events) decided / mixture rows pretrain, policy, failures | {r["items"]} / \
{r["splits"]["pretrain"]}, {r["splits"]["policy"]}, {r["splits"]["failures"]} |

Rebalancing the pretraining split over task families (row share before, weight share
after; the cap is {r["cap"]} of the split):

| task family | row share | weight share |
| --- | --- | --- |
{shares}

The most frequent family, `{r["top_task"]}`, goes from {r["top_raw_share"]:.3f} of the rows
to {r["top_weighted_share"]:.3f} of the weight (largest family weight
{r["max_weighted_share"]:.3f} <= cap {r["cap"]}). The same split at other temperatures
(same cap): `{r["top_task"]}` share {temps}. Simulation {r["t_simulate_s"]:.1f} s, curation
(decisions, two GX suites, mixture) {r["t_curate_s"]:.1f} s.
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=120)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--append", type=Path, default=None)
    a = ap.parse_args()
    r = run(a.episodes, a.seed)
    md = markdown(r)
    print(md)
    if a.append:
        with open(a.append, "a") as fh:
            fh.write(md)


if __name__ == "__main__":
    main()
