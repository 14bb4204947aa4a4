"""``flora eval model``: held-out quality of a trained segmenter, captioner or rewarder.

The evaluation runs on the held-out split of a training set (:mod:`training.sets`, split
by episode hash), so its requests are exactly the ones the engine sends. It has two
halves, so that any prediction source — a model through a backend, a baseline, a
hand-made table in a test — is scored by the same code:

* :func:`generate_outputs`: one greedy answer per example through any ``VLMBackend``,
  as an *output table* (``example_id``, ``text``, and for outcome examples the
  ``expected_score`` read from the score-token log-probabilities);
* :func:`score_outputs`: the output table against the examples' references, with the
  project's metrics (:mod:`flora.metrics`) and strict parsers — nothing re-implemented.

Metrics (``docs/training.md``, "Evaluation"):

* segmenter, per window then averaged over windows: ``f1@0.5``, ``f1@0.75``,
  ``precision@0.5``, ``B`` (boundary score), ``r_seg``; a window whose output does not
  parse scores 0 on all of them (the GRPO reward's floor) and lowers ``parse_rate``;
* captioner: ``r_cap`` averaged over **all** reference events of the held-out split that
  carry requirements (``r_cap_items``; an event without any, from a fleet's mixture, has
  nothing to score against and is left out) — an event whose caption did not parse or
  that the judge could not score counts 0 —
  ``coverage`` (the share of events that got a judged caption), ``r_cap_judged`` (mean
  over judged captions only) and ``parse_rate``;
* rewarder: ``outcome.mae`` (E[s] from the score-token distribution, or the parsed score
  when the table has no distribution) and ``outcome.mae_argmax``; ``dense.accuracy`` and
  ``dense.failure_recall`` over the retained groups of every parsed dense window;
  ``rubric.l1``; a parse rate and coverage per task. A rewarder answer that does not
  parse has no value to put in an MAE: it is counted in the parse rate, never filled.

Every metric also gets a 95 % bootstrap interval over *episodes* (:func:`bootstrap_ci`),
because windows and events of one episode are not independent.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from flora.backends.base import VLMBackend, VLMResponse
from flora.parsing import Rejection

EVAL_MODELS = ("segmenter", "captioner", "rewarder")
OUTPUT_COLUMNS = ("example_id", "text", "expected_score", "error", "attempts")


@dataclass
class ModelEval:
    """Metrics (with intervals), the per-item score table and what was evaluated."""

    model: str
    metrics: dict[str, float]
    items: pd.DataFrame
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "metrics": self.metrics,
            "intervals": {k: list(v) for k, v in self.intervals.items()},
            "info": self.info,
        }


# --------------------------------------------------------------------------- generation


def answer_parser(ex: Any) -> Callable[[str], Any]:
    """The strict parser of ``ex``'s answer text: a typed value or a ``Rejection``.

    The one place the evaluation picks a grammar per example (segment ticks within the
    window's ``n_ticks``, caption, outcome / dense / rubric with the example's rubric):
    scoring and :func:`generate_outputs`' retries both use it.
    """
    from flora.caption.grammar import parse_caption
    from flora.reward.dense import parse_dense
    from flora.reward.outcome import parse_outcome
    from flora.reward.rubric import Rubric, parse_rubric
    from flora.segment.grammar import parse_segments

    if ex.model == "segmenter":
        n_ticks = int(ex.reference_obj()["n_ticks"])
        return lambda text: parse_segments(text, n_ticks)
    if ex.model == "captioner":
        return parse_caption
    if ex.task_kind == "outcome":
        return parse_outcome
    if ex.task_kind == "dense":
        return parse_dense
    if ex.task_kind == "rubric":
        rub = Rubric.model_validate(ex.reference_obj()["rubric"])
        return lambda text: parse_rubric(rub, text)
    raise ValueError(f"example {ex.example_id}: unknown {ex.model} task {ex.task_kind!r}")


def generate_outputs(
    backend: VLMBackend, examples: Sequence[Any], *, batch_size: int = 64, attempts: int = 1
) -> pd.DataFrame:
    """Greedy answers of ``backend`` to every example's request, as an output table.

    Outcome examples ask for top log-probabilities (as the outcome step does) and get
    ``expected_score`` from :func:`flora.reward.outcome.parse_outcome_response`; a
    backend error is kept in ``error`` with an empty text (it then fails to parse).
    ``attempts`` > 1 answers as the engine's steps do (:func:`flora.parsing.generate_parsed`):
    an answer that does not parse is asked again, sampled and seeded, up to ``attempts``
    times, and the last answer is kept; the ``attempts`` column says how many were sent.
    The default (1) measures the greedy answer alone — what the model learnt.
    """
    from flora.parsing import generate_parsed
    from flora.reward.outcome import parse_outcome_response

    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts}")
    rows: list[dict[str, Any]] = []
    for lo in range(0, len(examples), batch_size):
        chunk = examples[lo : lo + batch_size]
        reqs = []
        for ex in chunk:
            r = ex.to_request()
            r.temperature = 0.0
            reqs.append(r)
        parsers = [_on_text(answer_parser(ex)) for ex in chunk]
        results = generate_parsed(backend, reqs, parsers, max_attempts=attempts)
        for ex, res in zip(chunk, results, strict=True):
            resp: VLMResponse = res.response  # type: ignore[assignment]
            e = math.nan
            if ex.task_kind == "outcome" and resp.ok:
                o = parse_outcome_response(resp)
                if not isinstance(o, Rejection):
                    e = float(o.expected_score)
            rows.append(
                {
                    "example_id": ex.example_id,
                    "text": resp.text if resp.ok else "",
                    "expected_score": e,
                    "error": resp.error or "",
                    "attempts": len(res.attempts) + res.ok,
                }
            )
    return pd.DataFrame(rows, columns=list(OUTPUT_COLUMNS))


def _on_text(parse: Callable[[str], Any]) -> Callable[[VLMResponse], Any]:
    return lambda resp: parse(resp.text)


# --------------------------------------------------------------------------- scoring


def _outputs_by_id(outputs: pd.DataFrame) -> dict[str, dict[str, Any]]:
    if "example_id" not in outputs.columns or "text" not in outputs.columns:
        raise ValueError("output table needs columns example_id and text")
    dup = outputs["example_id"][outputs["example_id"].duplicated()].tolist()
    if dup:
        raise ValueError(f"output table repeats example_id {dup[:3]}")
    return {str(r["example_id"]): r for r in outputs.to_dict(orient="records")}


def _text(row: dict[str, Any] | None) -> str:
    if row is None:
        return ""
    t = row.get("text")
    return "" if t is None or (isinstance(t, float) and math.isnan(t)) else str(t)


def _segment_items(examples: Sequence[Any], out: dict[str, dict[str, Any]]) -> pd.DataFrame:
    from flora.metrics.segment import boundary_score, match, r_seg
    from training.rewards import as_local_segments

    rows = []
    for ex in examples:
        ref_obj = ex.reference_obj()
        ref = as_local_segments(ref_obj["segments"])
        parsed = answer_parser(ex)(_text(out.get(ex.example_id)))
        row: dict[str, Any] = {"example_id": ex.example_id, "episode_id": ex.episode_id}
        if isinstance(parsed, Rejection):
            row.update(parsed=False, reason=parsed.reason, n_pred=0, n_ref=len(ref))
            row.update({"f1@0.5": 0.0, "f1@0.75": 0.0, "precision@0.5": 0.0, "B": 0.0,
                        "r_seg": 0.0})  # fmt: skip
        else:
            m50, m75 = match(parsed, ref, 0.5), match(parsed, ref, 0.75)
            row.update(parsed=True, reason="", n_pred=len(parsed), n_ref=len(ref))
            row.update({"f1@0.5": m50.f1, "f1@0.75": m75.f1, "precision@0.5": m50.precision,
                        "B": boundary_score(parsed, ref), "r_seg": r_seg(parsed, ref)})  # fmt: skip
        rows.append(row)
    return pd.DataFrame(rows)


def _caption_items(
    examples: Sequence[Any], out: dict[str, dict[str, Any]], judge: Any
) -> pd.DataFrame:
    from flora.metrics.caption import score_captions

    rows: list[dict[str, Any]] = []
    todo: list[tuple[int, str, Any]] = []
    for ex in examples:
        ref = ex.reference_obj()
        p = answer_parser(ex)(_text(out.get(ex.example_id)))
        row = {"example_id": ex.example_id, "episode_id": ex.episode_id,
               "reference": ref.get("caption", ""), "r_cap": 0.0, "judged": False}  # fmt: skip
        reqs = ref.get("requirements") or []
        # No requirements (an event of a fleet's mixture): r_cap has nothing to measure
        # against, so the item is left out of it rather than counted 0 (or 1).
        row["has_requirements"] = bool(reqs)
        if isinstance(p, Rejection):
            row.update(parsed=False, reason=p.reason, caption="")
        else:
            row.update(parsed=True, reason="", caption=p)
            if reqs:
                todo.append((len(rows), p, reqs))
        if not reqs:
            row.update(r_cap=math.nan, reason=row["reason"] or "no reference requirements")
        rows.append(row)
    if todo:
        scores = score_captions(judge, [(c, r) for _, c, r in todo])
        for (i, _, _), s in zip(todo, scores, strict=True):
            if isinstance(s, Rejection):
                rows[i]["reason"] = f"judge: {s.reason}"  # counts 0: unscored, not filled
            else:
                rows[i].update(r_cap=float(s.reward), judged=True, R=s.R, M=s.M, F=s.F)
    return pd.DataFrame(rows)


def _rewarder_items(examples: Sequence[Any], out: dict[str, dict[str, Any]]) -> pd.DataFrame:
    from flora.metrics.reward import rubric_l1

    rows = []
    for ex in examples:
        ref = ex.reference_obj()
        o = out.get(ex.example_id)
        parsed = answer_parser(ex)(_text(o))  # an unknown task kind raises here
        row: dict[str, Any] = {"example_id": ex.example_id, "episode_id": ex.episode_id,
                               "task_kind": ex.task_kind}  # fmt: skip
        if ex.task_kind == "outcome":
            row["ref_score"] = float(ref["score"])
        elif ex.task_kind == "dense":
            groups = [int(g) for g in ref["groups"]]
            row["ref_labels"] = [int(ref["labels"][g - 1]) for g in groups]
        if isinstance(parsed, Rejection):
            row.update(parsed=False, reason=parsed.reason)
        elif ex.task_kind == "outcome":
            e = o.get("expected_score") if o is not None else None
            e = float(e) if e is not None and np.isfinite(float(e)) else float(parsed)
            row.update(parsed=True, reason="", expected_score=e, argmax_score=float(parsed))
        elif ex.task_kind == "dense":
            row.update(parsed=True, reason="", labels=[int(parsed.labels[g - 1]) for g in groups])
        else:  # rubric
            row.update(parsed=True, reason="", rubric_l1=rubric_l1(parsed, ref["scores"]))
        rows.append(row)
    return pd.DataFrame(rows)


def _segment_metrics(df: pd.DataFrame) -> dict[str, float]:
    if not len(df):
        return {"items": 0.0}
    m = {k: float(df[k].mean()) for k in ("f1@0.5", "f1@0.75", "precision@0.5", "B", "r_seg")}
    m.update(parse_rate=float(df["parsed"].mean()), items=float(len(df)))
    return m


def _caption_metrics(df: pd.DataFrame) -> dict[str, float]:
    if not len(df):
        return {"items": 0.0}
    scored = df[df["has_requirements"]] if "has_requirements" in df else df
    judged = scored[scored["judged"]]
    return {
        # over ALL reference events that have requirements: failures count 0
        "r_cap": float(scored["r_cap"].mean()) if len(scored) else math.nan,
        "r_cap_judged": float(judged["r_cap"].mean()) if len(judged) else math.nan,
        "r_cap_items": float(len(scored)),
        "coverage": float(scored["judged"].mean()) if len(scored) else math.nan,
        "parse_rate": float(df["parsed"].mean()),
        "items": float(len(df)),
    }


def _rewarder_metrics(df: pd.DataFrame) -> dict[str, float]:
    from flora.metrics.reward import dense_group_accuracy, failure_recall, outcome_mae

    m: dict[str, float] = {"items": float(len(df))}
    if not len(df):
        return m
    for kind in ("outcome", "dense", "rubric"):
        part = df[df["task_kind"] == kind]
        if len(part):
            m[f"{kind}.parse_rate"] = float(part["parsed"].mean())
            m[f"{kind}.items"] = float(len(part))
    m["parse_rate"] = float(df["parsed"].mean())
    oc = df[(df["task_kind"] == "outcome") & df["parsed"]]
    if len(oc):
        m["outcome.mae"] = outcome_mae(oc["expected_score"], oc["ref_score"])
        m["outcome.mae_argmax"] = outcome_mae(oc["argmax_score"], oc["ref_score"])
    de = df[(df["task_kind"] == "dense") & df["parsed"]]
    if len(de):
        pred = [x for ls in de["labels"] for x in ls]
        ref = [x for ls in de["ref_labels"] for x in ls]
        m["dense.accuracy"] = dense_group_accuracy(pred, ref)
        m["dense.failure_recall"] = failure_recall(pred, ref)
    rb = df[(df["task_kind"] == "rubric") & df["parsed"]]
    if len(rb):
        m["rubric.l1"] = float(rb["rubric_l1"].mean())
    return m


_SCORERS: dict[str, Callable[[pd.DataFrame], dict[str, float]]] = {
    "segmenter": _segment_metrics,
    "captioner": _caption_metrics,
    "rewarder": _rewarder_metrics,
}


def score_outputs(
    model: str,
    examples: Sequence[Any],
    outputs: pd.DataFrame,
    *,
    judge: Any | None = None,
    n_boot: int = 1000,
    seed: int = 0,
) -> ModelEval:
    """Score an output table against the examples' references (see the module docstring).

    An example with no row in ``outputs`` counts as an unparseable answer. ``judge``
    (captioner only) defaults to the embedding judge. ``n_boot`` bootstrap resamples of
    the episodes give the 95 % intervals (0 disables them).
    """
    if model not in EVAL_MODELS:
        raise ValueError(f"model must be one of {EVAL_MODELS}, got {model!r}")
    bad = [ex.example_id for ex in examples if ex.model != model]
    if bad:
        raise ValueError(f"examples {bad[:3]} are not {model} examples")
    out = _outputs_by_id(outputs)
    if model == "segmenter":
        items = _segment_items(examples, out)
    elif model == "captioner":
        if judge is None:
            from flora.caption.judges import EmbeddingJudge

            judge = EmbeddingJudge()
        items = _caption_items(examples, out, judge)
    else:
        items = _rewarder_items(examples, out)
    metrics = _SCORERS[model](items)
    metrics["episodes"] = float(items["episode_id"].nunique()) if len(items) else 0.0
    intervals = bootstrap_ci(items, _SCORERS[model], n_boot=n_boot, seed=seed) if n_boot else {}
    info: dict[str, Any] = {"judge": getattr(judge, "name", None)} if judge is not None else {}
    info["eval_set"] = eval_set_of(examples)
    return ModelEval(model, metrics, items, intervals, info)


def eval_set_of(examples: Sequence[Any]) -> dict[str, str]:
    """The ``flora.eval_set.*`` tags of scoring ``examples`` (what the gates pair on).

    Episodes as ``<dataset>/<episode_id>``; the data as one digest per example of its id and
    reference (the ground truth it is scored against), so the same episodes of changed data,
    or another windowing of them, do not count as the same evaluation set.
    """
    import hashlib

    from model_registry.promotion import eval_set_tags

    eps = [f"{getattr(e, 'dataset', '')}/{e.episode_id}" for e in examples]
    data = [
        hashlib.sha256(f"{e.example_id}\0{getattr(e, 'reference', '')}".encode()).hexdigest()
        for e in examples
    ]
    return eval_set_tags(eps, data)


def bootstrap_ci(
    items: pd.DataFrame,
    metric_fn: Callable[[pd.DataFrame], dict[str, float]],
    *,
    n_boot: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> dict[str, tuple[float, float]]:
    """Percentile bootstrap intervals of every metric, resampling whole episodes."""
    if not len(items):
        return {}
    eps = items["episode_id"].unique()
    by_ep = {e: g for e, g in items.groupby("episode_id", sort=False)}
    rng = np.random.default_rng(seed)
    draws: dict[str, list[float]] = {}
    for _ in range(n_boot):
        pick = rng.choice(len(eps), size=len(eps), replace=True)
        sample = pd.concat([by_ep[eps[i]] for i in pick], ignore_index=True)
        for k, v in metric_fn(sample).items():
            draws.setdefault(k, []).append(v)
    lo, hi = (1 - level) / 2 * 100, (1 + level) / 2 * 100
    out = {}
    for k, vs in draws.items():
        a = np.array([v for v in vs if np.isfinite(v)], dtype=float)
        if len(a) and not k.endswith("items"):
            out[k] = (float(np.percentile(a, lo)), float(np.percentile(a, hi)))
    return out


# --------------------------------------------------------------------------- models and sets


def heldout_examples(
    model: str,
    set_path: str | Path,
    *,
    limit: int | None = None,
    exclude: Collection[str] = (),
) -> list[Any]:
    """The held-out examples of ``model`` in a set (first ``limit`` episodes' worth, if given).

    ``limit`` keeps whole episodes (the bootstrap resamples episodes). ``exclude``: episode
    ids left out before the limit (those a continued model's starting point trained on).
    """
    from training.sets import load_set

    skip = set(exclude)
    ex = [
        e
        for e in load_set(set_path, split="heldout")
        if e.model == model and e.episode_id not in skip
    ]
    if not ex:
        raise ValueError(f"set {set_path} has no held-out {model} examples")
    return _first_episodes(ex, limit)


def _first_episodes(ex: list[Any], limit: int | None) -> list[Any]:
    """The examples of the first ``limit`` episodes (all when ``limit`` is None)."""
    if limit is None:
        return ex
    keep: list[str] = []
    for e in ex:
        if e.episode_id not in keep:
            keep.append(e.episode_id)
    keep = keep[:limit]
    return [e for e in ex if e.episode_id in keep]


@dataclass
class HeldOut:
    """The held-out examples a model is scored on, and what its lineage left out."""

    examples: list[Any]
    left_out: list[str]  # held-out episodes of the set that the model's lineage trained on
    lineage: str  # "known", or "unknown: <why>" (scored on the set's split alone)


def lineages_seen(examples: Sequence[Any], model_dirs: Sequence[str | Path]) -> set[str]:
    """Episodes of ``examples`` that any of ``model_dirs`` (or a model one was continued
    from, or its base) trained on, read per dataset of the examples. Raises
    :class:`~training.sft.TrainingError` when a lineage cannot be read."""
    from training.lineage import seen_in

    seen: set[str] = set()
    for dataset in sorted({e.dataset for e in examples}):
        for d in model_dirs:
            seen |= seen_in(d, dataset)
    return seen & {e.episode_id for e in examples}


def unseen_heldout(
    model: str,
    set_path: str | Path,
    model_dir: str | Path,
    *,
    limit: int | None = None,
    allow_unknown_lineage: bool = False,
    also_unseen_by: Sequence[str | Path] = (),
) -> HeldOut:
    """The set's held-out ``model`` examples, less every episode the model at ``model_dir``
    or a model it was continued from trained on (:func:`training.lineage.seen_in`, per
    dataset of the examples).

    ``also_unseen_by``: other exported models whose lineage is left out too, so that
    models with different lineages (one over a trained base, one from scratch) are scored
    on the same items.

    When that lineage cannot be read (an ancestor not on this machine, a set that listed
    no episodes) it raises :class:`~training.sft.TrainingError`, unless
    ``allow_unknown_lineage``: then the set's split alone is used and ``lineage`` says why.
    """
    from training.sft import TrainingError

    every = heldout_examples(model, set_path)
    seen: set[str] = set()
    lineage = "known"
    try:
        seen = lineages_seen(every, (model_dir, *also_unseen_by))
    except TrainingError as e:
        if not allow_unknown_lineage:
            raise TrainingError(
                f"{e}; the held-out episodes it never saw cannot be told apart (pass "
                "--allow-unknown-lineage to score on the set's split alone)"
            ) from e
        seen, lineage = set(), f"unknown: {e}"
    unseen = [e for e in every if e.episode_id not in seen]
    if not unseen:
        others = f" and {', '.join(map(str, also_unseen_by))}" if also_unseen_by else ""
        raise ValueError(
            f"set {set_path}: the model at {model_dir}{others} (or one continued from) "
            f"trained on every held-out {model} episode"
        )
    left_out = sorted({e.episode_id for e in every} & seen)
    return HeldOut(_first_episodes(unseen, limit), left_out, lineage)


def backend_for(
    path: str | Path, *, device: str = "cpu", batch_size: int = 8, guided: bool = False
) -> VLMBackend:
    """A transformers backend over an exported Flora model directory (SFT or GRPO export).

    :func:`training.sft.model_paths` resolves full weights or a PEFT adapter over its base;
    the manifest's checksums are verified first, so a half-written model is refused.
    ``guided``: decode within each request's grammar regex (as a served model with
    structured outputs does); off, the model's free answers are measured.
    """
    from flora.backends.transformers_backend import TransformersBackend
    from training.sft import model_paths

    model_path, adapter = model_paths(path)
    # No vision_input: the export's manifest says how it was trained (trained_vision_input).
    return TransformersBackend(model_path, adapter_path=adapter, device=device,
                               batch_size=batch_size, guided=guided)  # fmt: skip


def registered_model_dir(model: str, version: int | str) -> Path:
    """The exported model directory of registered ``flora-<model>`` version (or alias)."""
    from model_registry.register import download_model

    return download_model(model, str(version))


def evaluate_model(
    model: str,
    examples: Sequence[Any],
    backend: VLMBackend,
    *,
    judge: Any | None = None,
    n_boot: int = 1000,
    seed: int = 0,
    attempts: int = 1,
) -> ModelEval:
    """Generate with ``backend`` on ``examples`` and score the answers.

    ``attempts`` > 1 scores the answers the engine would keep after its bounded retries
    (:func:`generate_outputs`); ``info`` then also counts the answers sent and the items
    whose first (greedy) answer parsed.
    """
    outputs = generate_outputs(backend, examples, attempts=attempts)
    res = score_outputs(model, examples, outputs, judge=judge, n_boot=n_boot, seed=seed)
    res.info.update(
        backend=getattr(backend, "name", ""),
        model_version=str(getattr(backend, "model_version", "")),
        backend_errors=int((outputs["error"] != "").sum()),
        attempts=attempts,  # the setting; the counts below say what was used
        **attempt_counts(outputs, res.items),
    )
    return res


def attempt_counts(outputs: pd.DataFrame, items: pd.DataFrame) -> dict[str, int]:
    """How many answers were sent, and how many items parsed at their first (greedy) one."""
    parsed = dict(zip(items["example_id"], items["parsed"], strict=True))
    first = [n == 1 and bool(parsed.get(e)) for e, n in zip(outputs["example_id"],
             outputs["attempts"], strict=True)]  # fmt: skip
    return {"answers_sent": int(outputs["attempts"].sum()), "first_answer_parsed": int(sum(first))}


def metric_key(name: str) -> str:
    """MLflow-safe metric key (``@`` is not allowed): ``eval.f1_at_0.5``."""
    return "eval." + name.replace("@", "_at_")


def log_eval(
    res: ModelEval,
    *,
    tags: dict[str, Any] | None = None,
    run_id: str | None = None,
    registered_version: int | str | None = None,
) -> str:
    """Log metrics (``eval.*`` and ``eval.*.ci_low/high``), intervals and items to MLflow.

    A new run in the ``flora-train-<model>`` experiment (or ``run_id`` reopened), so versions are
    compared side by side on the same keys; with ``registered_version`` the metrics are
    also set as ``eval.*`` tags of that registry version (DESIGN §3.9), replacing its
    earlier evaluation. The evaluation set's fingerprint (``res.info["eval_set"]``) is a
    tag of the run and of the version.
    """
    import mlflow

    from flora.tracking import mlflow_run

    flat = flat_metrics(res)
    eval_set = dict(res.info.get("eval_set") or {})
    t = {"flora.model": res.model, **eval_set,
         **{str(k): str(v) for k, v in (tags or {}).items()}}  # fmt: skip
    with mlflow_run(f"eval_{res.model}", tags=t, experiment=f"flora-train-{res.model}",
                    run_id=run_id) as run:  # fmt: skip
        mlflow.log_metrics(flat)
        mlflow.log_dict(res.to_dict(), f"eval/{res.model}.json")
        items = res.items.copy()
        for c in items.columns:  # lists -> JSON text, so the table logs as-is
            if items[c].map(lambda x: isinstance(x, list)).any():
                items[c] = items[c].map(json.dumps)
        mlflow.log_table(items, artifact_file=f"eval/{res.model}_items.json")
        rid = run.info.run_id
    if registered_version is not None:
        tag_version(res.model, registered_version, flat, rid, eval_set=eval_set)
    return rid


def flat_metrics(res: ModelEval) -> dict[str, float]:
    """``eval.*`` metric keys with their interval bounds (what is logged and tagged)."""
    flat = {metric_key(k): float(v) for k, v in res.metrics.items() if math.isfinite(v)}
    for k, (lo, hi) in res.intervals.items():
        flat[metric_key(k) + ".ci_low"] = lo
        flat[metric_key(k) + ".ci_high"] = hi
    return flat


def tag_version(
    model: str,
    version: int | str,
    flat: dict[str, float],
    eval_run_id: str,
    *,
    eval_set: dict[str, str] | None = None,
) -> None:
    """Make ``flat`` the evaluation of registered ``flora-<model>`` ``version`` (DESIGN §3.9).

    Replaces every earlier eval tag of the version
    (:func:`model_registry.promotion.write_evaluation`): the gates read exactly this
    evaluation. ``eval_set`` (:func:`eval_set_of`) defaults to the ``flora.eval_set.*``
    tags of run ``eval_run_id`` (:func:`log_eval` writes them); without one the gates
    refuse to compare the version with a champion.
    """
    from model_registry.promotion import EVAL_SET_PREFIX, write_evaluation

    if eval_set is None:
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        from flora.tracking import configure

        configure()
        try:
            run_tags = MlflowClient().get_run(eval_run_id).data.tags
        except MlflowException:
            run_tags = {}
        eval_set = {k: v for k, v in run_tags.items() if k.startswith(EVAL_SET_PREFIX)}
    tags = {k: f"{v:.6g}" for k, v in flat.items()}
    tags["eval.run_id"] = eval_run_id
    write_evaluation(f"flora-{model}", version, tags, eval_set)


def logged_model_uri(run_id: str) -> str:
    """URI of the Flora model a training run logged (:func:`log_flora_model`), the newest."""
    import mlflow

    from flora.tracking import configure

    configure()
    run = mlflow.get_run(run_id)
    found = mlflow.search_logged_models(
        experiment_ids=[run.info.experiment_id],
        filter_string=f"source_run_id = '{run_id}'",
        order_by=[{"field_name": "creation_time", "ascending": False}],
        output_format="list",
    )
    if not found:
        raise ValueError(f"run {run_id} logged no model")
    return found[0].model_uri


HEADLINE = {"segmenter": "r_seg", "captioner": "r_cap", "rewarder": "outcome.mae"}


__all__ = [
    "EVAL_MODELS",
    "HEADLINE",
    "eval_set_of",
    "flat_metrics",
    "logged_model_uri",
    "tag_version",
    "ModelEval",
    "backend_for",
    "bootstrap_ci",
    "evaluate_model",
    "answer_parser",
    "attempt_counts",
    "generate_outputs",
    "heldout_examples",
    "unseen_heldout",
    "lineages_seen",
    "HeldOut",
    "log_eval",
    "metric_key",
    "registered_model_dir",
    "score_outputs",
]
