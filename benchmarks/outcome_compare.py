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
    is closer to the truth). Intervals: :func:`training.evaluate.bootstrap_ci` over whole
    episodes, one set of draws for every source and pair.
    """
    from training.evaluate import bootstrap_ci

    errs = {name: outcome_errors(items) for name, items in sources.items()}
    models = [n for n in sources if n not in baselines]
    pairs = [(m, b) for m in models for b in baselines if b in sources]
    pairs += [(m, models[0]) for m in models[1:]]
    # one row per episode, a source's columns NaN where it did not parse
    wide = pd.concat({n: e for n, e in errs.items()}, axis=1)
    wide.columns = [f"{n}|{c}" for n, c in wide.columns]
    wide = wide.rename_axis("episode_id").reset_index()

    def metrics(df: pd.DataFrame) -> dict[str, float]:
        m: dict[str, float] = {}
        for n in errs:
            ok = df[df[f"{n}|abs_err"].notna()]
            m[f"{n}|mae"] = float(ok[f"{n}|abs_err"].mean()) if len(ok) else math.nan
            exp, ref = ok[f"{n}|expected_score"], ok[f"{n}|ref_score"]
            m[f"{n}|rho"] = _rho(exp.to_numpy(), ref.to_numpy())
        for a, b in pairs:
            d = (df[f"{a}|abs_err"] - df[f"{b}|abs_err"]).dropna()
            m[f"{a}|{b}"] = float(d.mean()) if len(d) else math.nan
        return m

    point = metrics(wide)
    ci = bootstrap_ci(wide, metrics, n_boot=n_boot, seed=seed) if len(wide) else {}
    nan2 = (math.nan, math.nan)
    per = {}
    for n, e in errs.items():
        total = int((sources[n]["task_kind"] == "outcome").sum())
        per[n] = {
            "episodes": len(e),
            "parse_rate": len(e) / total if total else math.nan,
            "mae": point[f"{n}|mae"],
            "mae_interval": list(ci.get(f"{n}|mae", nan2)),
            "rho": point[f"{n}|rho"],
            "rho_interval": list(ci.get(f"{n}|rho", nan2)),
        }
    paired = [
        {
            "a": a,
            "b": b,
            "episodes": len(set(errs[a].index) & set(errs[b].index)),
            "diff": point[f"{a}|{b}"],
            "interval": list(ci.get(f"{a}|{b}", nan2)),
        }
        for a, b in pairs
    ]
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
        if "example_id" not in answers[name] or "text" not in answers[name]:
            raise SystemExit(f"--outputs {name}: {path} has no example_id/text columns")
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
