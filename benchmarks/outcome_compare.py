"""Outcome answers of rewarders and baselines, paired on the same held-out episodes.

    # answers written by benchmarks/guided_decoding.py (outputs_free.parquet in its --out)
    python benchmarks/outcome_compare.py --set SET --dataset DATASET \
        --outputs random=/tmp/gd-a/outputs_free.parquet \
        --outputs captioner-base=/tmp/gd-b/outputs_free.parquet --out /tmp/outcome

Scores every named set of answers and the two outcome baselines of
``benchmarks/learning.py`` (the training-set mean score; the score of the training episode
with the same task and nearest length, read from the prompt alone) on the set's held-out
outcome items that every named set answered, and prints per source: outcome MAE (of the
expected score, DESIGN §3.3), Spearman ρ with the true score, each with a 95 % bootstrap
interval over episodes; and per pair (each source against each baseline, and every later
source against the first) the mean paired difference of absolute errors with its interval,
over the episodes both parsed. A paired interval clear of 0 is what "beats the baseline"
means in ``docs/benchmarks.md``. Writes ``result.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd


def _interval(draws: list[float]) -> list[float]:
    a = np.array([d for d in draws if np.isfinite(d)], dtype=float)
    if not len(a):
        return [math.nan, math.nan]
    return [float(np.percentile(a, 2.5)), float(np.percentile(a, 97.5))]


def _rho(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's ρ (NaN where either side is constant: no ranking to correlate)."""
    from scipy.stats import spearmanr

    if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan
    return float(spearmanr(x, y).statistic)


def outcome_errors(items: pd.DataFrame) -> pd.DataFrame:
    """One row per parsed outcome item of scored rewarder items (``score_outputs(...).items``),
    indexed by episode: the expected and true score and the absolute error."""
    oc = items[(items["task_kind"] == "outcome") & items["parsed"].astype(bool)]
    if oc["episode_id"].duplicated().any():
        raise ValueError("more than one outcome item per episode: pairs would be ambiguous")
    out = oc.set_index("episode_id")[["expected_score", "ref_score"]].astype(float)
    out["abs_err"] = (out["expected_score"] - out["ref_score"]).abs()
    return out


def compare_outcomes(
    sources: dict[str, pd.DataFrame],
    baselines: tuple[str, ...] = (),
    n_boot: int = 2000,
    seed: int = 0,
) -> dict[str, Any]:
    """MAE and ρ per source, and paired differences of absolute errors.

    ``sources`` maps a name to its scored items (models first, in order; the names in
    ``baselines`` among them). Pairs: every non-baseline source against each baseline,
    and every later non-baseline source against the first one; a pair's difference is
    ``abs_err(a) - abs_err(b)`` averaged over the episodes both parsed (negative: ``a``
    is closer to the truth). Intervals resample episodes, the same draws for every source
    and pair.
    """
    errs = {name: outcome_errors(items) for name, items in sources.items()}
    outcome_items = {
        name: int((items["task_kind"] == "outcome").sum()) for name, items in sources.items()
    }
    episodes = np.array(sorted(set().union(*(e.index for e in errs.values()))), dtype=object)
    rng = np.random.default_rng(seed)
    draws = [episodes[rng.choice(len(episodes), size=len(episodes))] for _ in range(n_boot)]

    def boot(fn, eps: list[str]) -> list[float]:
        """An interval of ``fn`` over the draws, each draw kept to the episodes in ``eps``
        (with their multiplicity), so every source and pair sees the same resamples."""
        keep = set(eps)
        samples = [[x for x in d if x in keep] for d in draws]
        return _interval([fn(s) for s in samples if s])

    per: dict[str, dict[str, Any]] = {}
    for name, e in errs.items():
        eps = list(e.index)

        def mae(sample: list[str], e: pd.DataFrame = e) -> float:
            return float(e.loc[sample, "abs_err"].mean())

        def rho(sample: list[str], e: pd.DataFrame = e) -> float:
            s = e.loc[sample]
            return _rho(s["expected_score"].to_numpy(), s["ref_score"].to_numpy())

        per[name] = {
            "episodes": len(eps),
            "parse_rate": len(eps) / outcome_items[name] if outcome_items[name] else math.nan,
            "mae": mae(eps) if eps else math.nan,
            "mae_interval": boot(mae, eps),
            "rho": rho(eps) if eps else math.nan,
            "rho_interval": boot(rho, eps),
        }
    models = [n for n in sources if n not in baselines]
    pairs = [(m, b) for m in models for b in baselines if b in sources]
    pairs += [(m, models[0]) for m in models[1:]]
    paired = []
    for a, b in pairs:
        both = sorted(set(errs[a].index) & set(errs[b].index))
        d = errs[a].loc[both, "abs_err"] - errs[b].loc[both, "abs_err"]

        def diff(sample: list[str], d: pd.Series = d) -> float:
            return float(d.loc[sample].mean())

        paired.append({
            "a": a,
            "b": b,
            "episodes": len(both),
            "diff": diff(both) if both else math.nan,
            "interval": boot(diff, both),
        })  # fmt: skip
    return {"sources": per, "paired": paired}


def _fmt(v: float, ci: list[float], spec: str) -> str:
    """``v [lo, hi]``, or a dash where undefined (ρ of a constant answer)."""
    if not np.isfinite(v):
        return "–"
    return f"{v:{spec}} [{ci[0]:{spec}}, {ci[1]:{spec}}]"


def markdown(res: dict[str, Any]) -> str:
    """The comparison as two markdown tables."""
    rows = ["| source | episodes | parse | outcome MAE | ρ with the truth |",
            "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for name, r in res["sources"].items():
        rows.append(
            f"| {name} | {r['episodes']} | {r['parse_rate']:.3f} | "
            f"{_fmt(r['mae'], r['mae_interval'], '.3f')} | "
            f"{_fmt(r['rho'], r['rho_interval'], '+.2f')} |"
        )
    rows += ["", "| paired (a − b, absolute error) | episodes | difference |",
             "| --- | --- | --- |"]  # fmt: skip
    for p in res["paired"]:
        rows.append(f"| {p['a']} − {p['b']} | {p['episodes']} | "
                    f"{_fmt(p['diff'], p['interval'], '+.3f')} |")  # fmt: skip
    return "\n".join(rows)


def _named(spec: str) -> tuple[str, Path]:
    name, sep, path = spec.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"--outputs {spec!r}: expected NAME=PATH")
    return name, Path(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", type=Path, required=True, help="the rewarder set (held-out split)")
    ap.add_argument("--dataset", type=Path, required=True, help="the toy world it was built from")
    ap.add_argument("--outputs", type=_named, action="append", required=True,
                    help="NAME=PATH of a parquet of answers; repeat")  # fmt: skip
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--boot", type=int, default=2000)
    args = ap.parse_args()

    from learning import rewarder_baseline, rewarder_prompt_baseline

    from training.evaluate import heldout_examples, score_outputs
    from training.sets import load_set

    answers = {}
    for name, path in args.outputs:
        if not path.is_file():
            raise SystemExit(f"--outputs {name}: {path} does not exist")
        answers[name] = pd.read_parquet(path)
    answered = set.intersection(*(set(a["example_id"]) for a in answers.values()))
    held = [e for e in heldout_examples("rewarder", args.set)
            if e.task_kind == "outcome" and e.example_id in answered]  # fmt: skip
    if not held:
        raise SystemExit(f"{args.set}: no held-out outcome item answered by every --outputs")
    train = [e for e in load_set(args.set, split="train") if e.model == "rewarder"]
    base = {"training-set mean": next(iter(rewarder_baseline(train, held).values()))}
    prompt = rewarder_prompt_baseline(args.dataset, train, held)
    if prompt:
        base["task and length"] = next(iter(prompt.values()))
    items = {name: score_outputs("rewarder", held, a, n_boot=0).items
             for name, a in {**answers, **base}.items()}  # fmt: skip
    res = compare_outcomes(items, baselines=tuple(base), n_boot=args.boot)
    print(markdown(res))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "result.json").write_text(
        json.dumps(
            {"set": str(args.set), "outputs": {n: str(p) for n, p in args.outputs}, **res}, indent=2
        )  # fmt: skip
    )


if __name__ == "__main__":
    main()
