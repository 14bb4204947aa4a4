"""The training pipeline's steps, one function each, shared by Airflow and KFP.

``dags/flora_train_models.py`` (one TaskGroup per Flora model) and the KFP components in
``components/training_pipeline.py`` are thin adapters over these functions, so the logic
exists once. Every step takes and returns small JSON-able references (paths, run ids,
versions): what an Airflow XCom or a KFP output parameter can carry.

    build_set -> sft -> grpo (segmenter, captioner) -> evaluate -> register
              -> record_suites -> promote -> deploy

The steps call the training and registry functions (``training.sets``, ``training.sft``,
``training.grpo``, ``training.evaluate``, ``model_registry.*``); nothing here trains,
scores or gates by itself. ``run_id`` arguments are the pipeline's parent MLflow run
(:func:`flora.tracking.start_pipeline_run`): each step then logs a nested child run
named ``<step>_<model>`` with what it produced; the training runs themselves live in the
per-model experiment ``flora-train-<model>`` (params, curves, logged model).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

MODELS = ("segmenter", "captioner", "rewarder")
#: Gate policies a run may ask for: ``project`` is ``model_registry.promotion``'s per-model
#: default; ``mechanics`` keeps only the table-suites gate, for tiny-model runs that test
#: the pipeline's mechanics (random weights never pass a quality floor). The choice is
#: recorded in the promotion's audit tag (its actor) and in the step's result.
GATE_POLICIES = ("project", "mechanics")


def recipe_for(model: str, recipe: str) -> Any:
    """The recipe of ``model``: a size (``small``), a name (``captioner-demo``) or a path."""
    from training.recipe import load_recipe

    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; expected one of {list(MODELS)}")
    name = recipe if (recipe.endswith(".yaml") or "-" in recipe) else f"{model}-{recipe}"
    r = load_recipe(name)
    if r.model != model:
        raise ValueError(f"recipe {recipe!r} is for {r.model}, not {model}")
    return r


def recipe_name(model: str, recipe: str) -> str:
    """The recipe's name as recorded in lineage tags (``captioner-small``)."""
    return Path(recipe).stem if recipe.endswith(".yaml") else (
        recipe if "-" in recipe else f"{model}-{recipe}"
    )  # fmt: skip


class _StepFailed(Exception):
    pass


@contextmanager
def _child(step: str, model: str, run_id: str | None) -> Iterator[dict[str, dict[str, Any]]]:
    """Record a step as a nested child run of the pipeline's parent run (if there is one).

    The body runs with no active MLflow run (the training functions open their own runs
    in ``flora-train-<model>``); what it puts in the yielded ``params`` / ``tags`` /
    ``metrics`` is logged afterwards, and a body that raised leaves the child FAILED with
    the error as a tag.
    """
    rec: dict[str, dict[str, Any]] = {"params": {}, "tags": {}, "metrics": {}}
    err: BaseException | None = None
    try:
        yield rec
    except BaseException as e:
        err = e
        raise
    finally:
        if run_id:
            _record(step, model, run_id, rec, err)


def _record(step: str, model: str, run_id: str, rec: dict[str, dict[str, Any]],
            err: BaseException | None) -> None:  # fmt: skip
    import mlflow

    from flora.tracking import mlflow_run

    try:
        with mlflow_run(f"{step}_{model}", {"flora.model": model}, run_id=run_id):
            if rec["params"]:
                mlflow.log_params({k: str(v)[:500] for k, v in rec["params"].items()})
            if rec["tags"]:
                mlflow.set_tags({k: str(v) for k, v in rec["tags"].items()})
            good = {k: float(v) for k, v in rec["metrics"].items()
                    if isinstance(v, int | float) and math.isfinite(float(v))}  # fmt: skip
            if good:
                mlflow.log_metrics(good)
            if err is not None:
                mlflow.set_tag("flora.error", f"{type(err).__name__}: {err}"[:5000])
                raise _StepFailed
    except _StepFailed:
        pass


def _put(
    rec: dict[str, dict[str, Any]],
    params: dict[str, Any] | None = None,
    tags: dict[str, Any] | None = None,
    metrics: dict[str, Any] | None = None,
) -> None:
    rec["params"].update(params or {})
    rec["tags"].update(tags or {})
    rec["metrics"].update(metrics or {})


# --------------------------------------------------------------------------- steps


def build_set(
    model: str,
    recipe: str,
    dataset: str | Path,
    out: str | Path,
    *,
    mixture: str | Path | None = None,
    max_episodes: int | None = None,
    run_id: str | None = None,
) -> dict[str, Any]:
    """Build ``model``'s SFT set (train + held-out by episode) with the recipe's settings.

    The set's GX suite runs inside :func:`training.sets.build_sft_set` (a failing suite
    raises); the set is logged as MLflow datasets. Returns ``set`` (path), ``examples``,
    ``failures``, ``splits``, ``set_run_id``, ``dataset_md5`` and ``suite`` (``passed``).
    """
    from training.sets import build_sft_set, read_manifest

    r = recipe_for(model, recipe)
    s = r.sets
    with _child("build_set", model, run_id) as rec:
        path = build_sft_set(model, dataset, out, split_fraction=s.split_fraction,
                             mixture=mixture, max_episodes=max_episodes or s.max_episodes,
                             **s.sft_kwargs(), log_mlflow=True,
                             progress=False)  # fmt: skip
        man = read_manifest(path)
        out_ = {
            "model": model,
            "recipe": recipe_name(model, recipe),
            "set": str(Path(path).resolve()),
            "examples": int(man["examples"]),
            "failures": int(man["failures"]),
            "splits": man["splits"],
            "set_run_id": man.get("mlflow_run_id") or "",
            "dataset": str(Path(dataset).resolve()),
            "dataset_md5": str(man.get("dataset_md5", "")),
            "mixture": str(mixture) if mixture else None,
            "suite": "passed",  # build_sft_set raised otherwise
        }
        _put(rec, params={"recipe": out_["recipe"], "mixture": mixture or "ground truth"},
             tags={"flora.set.run_id": out_["set_run_id"], "flora.dvc_md5": out_["dataset_md5"]},
             metrics={"set.examples": out_["examples"], "set.failures": out_["failures"],
                      **{f"set.{k}": v for k, v in man["splits"].items()}})  # fmt: skip
    return out_


def sft(
    model: str,
    recipe: str,
    set_path: str | Path,
    out: str | Path,
    *,
    max_steps: int | None = None,
    run_id: str | None = None,
) -> dict[str, Any]:
    """SFT (:func:`training.sft.train_sft`; logs and logs-as-model its own training run).

    Resumes from the latest checkpoint under ``out`` when one is there (a retried task
    continues instead of starting over). Returns ``model_dir``, ``training_run_id``,
    ``steps``, ``last_loss``.
    """
    from training.sft import latest_checkpoint, train_sft

    r = recipe_for(model, recipe)
    resume = latest_checkpoint(Path(out) / "checkpoints") is not None
    with _child("sft", model, run_id) as rec:
        res = train_sft(r, set_path, out, resume=resume, max_steps=max_steps or None,
                        log_mlflow=True, register=False, system_metrics=False,
                        progress=False)  # fmt: skip
        _put(rec, params={"max_steps": max_steps or r.max_steps, "resumed": resume},
             tags={"flora.training_run_id": res.run_id or ""},
             metrics={"sft.steps": res.steps, "sft.last_loss": res.last_loss})  # fmt: skip
    return {
        "model_dir": str(res.model_dir),
        "training_run_id": res.run_id or "",
        "steps": int(res.steps),
        "last_loss": float(res.last_loss),
        "stage": "sft",
    }


def grpo(
    model: str,
    recipe: str,
    set_path: str | Path,
    sft_out: dict[str, Any],
    out: str | Path,
    *,
    max_steps: int | None = None,
    run_id: str | None = None,
) -> dict[str, Any]:
    """GRPO from the SFT model (:func:`training.grpo.train_grpo`) for the segmenter and
    captioner; the rewarder has no RL (DESIGN §3.5): its SFT result passes on, marked so.

    The prompts are the train split of the SFT set (its references carry what the rewards
    need). Returns the same keys as :func:`sft` (``stage`` ``grpo`` or ``sft``).
    """
    from training.grpo import GRPO_MODELS, train_grpo

    r = recipe_for(model, recipe)
    if model not in GRPO_MODELS or r.grpo is None:
        return {**sft_out, "grpo": "skipped: no RL for this model"}
    with _child("grpo", model, run_id) as rec:
        res = train_grpo(r, sft_out["model_dir"], set_path, out, max_steps=max_steps or None,
                         log_mlflow=True, register=False, progress=False)  # fmt: skip
        last = res.history[-1] if res.history else {}
        kept = {} if res.kept_step is None else {"kept_step": res.kept_step}
        _put(rec, params={"max_steps": res.steps, **kept},
             tags={"flora.training_run_id": res.run_id or ""},
             metrics={f"grpo.{k}": v for k, v in last.items()
                      if isinstance(v, int | float) and k != "step"})  # fmt: skip
    return {
        "model_dir": str(res.model_dir),
        "training_run_id": res.run_id or "",
        "sft_training_run_id": sft_out["training_run_id"],
        "steps": int(res.steps),
        "stage": "grpo",
    }


def _judge(model: str, r: Any) -> Any:
    if model != "captioner":
        return None
    from training.rewards import make_judge

    return make_judge(r.grpo.judge if r.grpo is not None else "embedding")


def evaluate(
    model: str,
    recipe: str,
    set_path: str | Path,
    trained: dict[str, Any],
    out: str | Path,
    *,
    max_episodes: int | None = None,
    n_boot: int = 200,
    baseline: bool = True,
    run_id: str | None = None,
) -> dict[str, Any]:
    """Held-out evaluation of the trained model (and, with ``baseline``, its untrained base).

    :func:`training.evaluate.evaluate_model` on the set's held-out episodes, logged by
    :func:`training.evaluate.log_eval` (experiment ``flora-train-<model>``). Writes
    ``out`` (JSON: metrics, intervals, the flat ``eval.*`` keys the gates read, the
    baseline's) and returns ``report`` (path), ``headline``, ``eval_run_id``, ``items``,
    ``backend_errors``.
    """
    from training.evaluate import (
        HEADLINE,
        backend_for,
        evaluate_model,
        flat_metrics,
        log_eval,
        unseen_heldout,
    )

    r = recipe_for(model, recipe)
    # A model continued from another (init_from) is not scored on what that one trained on.
    held = unseen_heldout(model, set_path, trained["model_dir"], limit=max_episodes or None)
    examples = held.examples
    judge = _judge(model, r)
    with _child("evaluate", model, run_id) as rec:
        res = evaluate_model(model, examples, backend_for(trained["model_dir"], device="auto"),
                             judge=judge, n_boot=n_boot)  # fmt: skip
        rid = log_eval(
            res,
            tags={
                "flora.eval.stage": trained.get("stage", ""),
                "flora.training_run_id": trained.get("training_run_id", ""),
            },
        )
        flat = flat_metrics(res)
        base_flat: dict[str, float] = {}
        if baseline:
            from flora.backends.processing import TRAINING_VISION_INPUT
            from flora.backends.transformers_backend import TransformersBackend
            from training.sizes import resolve_base

            base_dir = resolve_base(r.base, seed=r.base_seed, max_pixels=r.max_pixels)
            base = TransformersBackend(base_dir, device="auto", vision_input=TRAINING_VISION_INPUT)
            base_res = evaluate_model(model, examples, base, judge=judge, n_boot=n_boot)
            base_flat = flat_metrics(base_res)
        report = {
            **res.to_dict(),
            "flat": flat,
            "baseline": base_flat,
            "eval_run_id": rid,
            "items": len(res.items),
            "heldout_examples": len(examples),
            "left_out_seen": held.left_out,
        }
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(report, indent=2, default=str))
        _put(rec, tags={"flora.eval_run_id": rid}, metrics={
            **flat, **{f"untrained.{k}": v for k, v in base_flat.items()}})  # fmt: skip
    head = float(res.metrics.get(HEADLINE[model], math.nan))
    return {
        "report": str(Path(out).resolve()),
        "headline": head if math.isfinite(head) else None,
        "eval_run_id": rid,
        "items": len(res.items),
        "backend_errors": int(res.info.get("backend_errors", 0)),
    }


def register(
    model: str,
    built: dict[str, Any],
    trained: dict[str, Any],
    evaluated: dict[str, Any],
    *,
    run_id: str | None = None,
) -> dict[str, Any]:
    """Register the trained model as ``flora-<model>`` (alias ``challenger``) with lineage.

    The model the last training run logged (:func:`training.evaluate.logged_model_uri`) is
    registered by :func:`model_registry.register.register_model` with the git commit,
    DVC md5 of the data, set / training / pipeline run ids, recipe and base; the held-out
    metrics become its ``eval.*`` tags (:func:`training.evaluate.tag_version`). Returns
    ``version``.
    """
    from flora.tracking import git_commit
    from model_registry.register import register_model
    from training.evaluate import logged_model_uri, tag_version

    r = recipe_for(model, built["recipe"])
    rid = trained["training_run_id"]
    report = json.loads(Path(evaluated["report"]).read_text())
    tags = {
        "flora.git_commit": git_commit(),
        "flora.dvc_md5": built["dataset_md5"],
        "flora.data.md5": built["dataset_md5"],
        "flora.dataset": built["dataset"],
        "flora.set.run_id": built["set_run_id"],
        "flora.training_stage": trained.get("stage", ""),
        "flora.sft_run_id": trained.get("sft_training_run_id", rid),
        "flora.recipe": built["recipe"],
        "flora.base": r.base,
        "flora.pipeline_run_id": run_id or "",
    }
    with _child("register", model, run_id) as rec:
        version = register_model(model, logged_model_uri(rid), rid, tags=tags)
        tag_version(model, version, report["flat"], evaluated["eval_run_id"])
        _put(rec, tags={"flora.registered_version": f"flora-{model}/{version}"})
    return {"version": version}


def record_suites(
    model: str,
    version: str,
    built: dict[str, Any],
    evaluated: dict[str, Any],
    *,
    run_id: str | None = None,
) -> dict[str, Any]:
    """Record the table-suites verdict on the version (the gates require ``passed``).

    Passed when the set's GX suite passed and the evaluation table is whole: one scored
    row per held-out item and no backend errors. Returns ``suites_passed`` and ``reasons``.
    """
    from model_registry.promotion import record_evaluation

    reasons = []
    if built.get("suite") != "passed":
        reasons.append(f"training set suite: {built.get('suite')}")
    if not evaluated.get("items"):
        reasons.append("evaluation table is empty")
    if evaluated.get("backend_errors"):
        reasons.append(f"{evaluated['backend_errors']} backend errors during evaluation")
    ok = not reasons
    with _child("record_suites", model, run_id) as rec:
        record_evaluation(model, version, {}, suites_passed=ok,
                          eval_run_id=evaluated.get("eval_run_id"))  # fmt: skip
        _put(rec, tags={"flora.suites": "passed" if ok else "failed",
                        "flora.suites.reasons": "; ".join(reasons)})  # fmt: skip
    return {"suites_passed": ok, "reasons": reasons}


def gate_policy(model: str, gates: str) -> Any | None:
    """The :class:`model_registry.promotion.GatePolicy` for ``gates`` (None = the default)."""
    from model_registry.promotion import GatePolicy

    if gates not in GATE_POLICIES:
        raise ValueError(f"unknown gates {gates!r}; expected one of {list(GATE_POLICIES)}")
    if gates == "project":
        return None
    return GatePolicy(gates=(), min_parse_rate=None, require_suites=True)


def promote(
    model: str,
    version: str,
    *,
    gates: str = "project",
    actor: str = "pipeline",
    run_id: str | None = None,
) -> dict[str, Any]:
    """Promote ``version`` to ``champion`` if it passes the gates; a refusal is a result.

    Returns ``promoted``, ``champion`` (after), ``previous`` and the gate ``reasons``.
    """
    from model_registry.promotion import promote as promote_version

    who = actor if gates == "project" else f"{actor} (gates={gates})"
    with _child("promote", model, run_id) as rec:
        res = promote_version(model, version, policy=gate_policy(model, gates), actor=who)
        out = {
            "promoted": res.promoted,
            "champion": res.champion,
            "previous": res.previous,
            "reasons": list(res.decision.reasons),
            "gates": gates,
        }
        _put(
            rec,
            tags={
                "flora.promoted": res.promoted,
                "flora.champion": res.champion or "",
                "flora.gate_reasons": "; ".join(res.decision.reasons)[:5000],
            },
        )
    return out


def deploy(model: str, *, overlay: str = "dev", run_id: str | None = None) -> dict[str, Any]:
    """Render the champion's inference-pod manifest (never applied from a pipeline).

    Returns ``manifest`` (path), ``version`` and ``storage_uri``; ``{"deployed": False}``
    when the model has no champion yet (every challenger so far was refused).
    """
    from model_registry.deploy import deploy as deploy_model
    from model_registry.promotion import CHAMPION, _alias_version, _client, registered_name

    name = registered_name(model)
    if _alias_version(_client(), name, CHAMPION) is None:
        return {"deployed": False, "reason": f"{name} has no champion"}
    with _child("deploy", model, run_id) as rec:
        d = deploy_model(model, CHAMPION, overlay=overlay, apply=False)
        _put(rec, tags={"flora.manifest": d.manifest, "flora.champion": d.version})
    return {"deployed": True, "manifest": d.manifest, "version": d.version,
            "storage_uri": d.storage_uri}  # fmt: skip


def run_model(
    model: str,
    recipe: str,
    dataset: str | Path,
    work: str | Path,
    *,
    mixture: str | Path | None = None,
    max_episodes: int | None = None,
    sft_steps: int | None = None,
    grpo_steps: int | None = None,
    eval_episodes: int | None = None,
    n_boot: int = 200,
    gates: str = "project",
    actor: str = "pipeline",
    run_id: str | None = None,
) -> dict[str, Any]:
    """Every step for one model in order, in this process (tests, scripts).

    The DAG runs the same functions as separate tasks. Returns each step's result.
    """
    w = Path(work) / model
    b = build_set(model, recipe, dataset, w / "set", mixture=mixture, max_episodes=max_episodes,
                  run_id=run_id)  # fmt: skip
    s = sft(model, recipe, b["set"], w / "sft", max_steps=sft_steps, run_id=run_id)
    g = grpo(model, recipe, b["set"], s, w / "grpo", max_steps=grpo_steps, run_id=run_id)
    e = evaluate(model, recipe, b["set"], g, w / "eval.json", max_episodes=eval_episodes,
                 n_boot=n_boot, run_id=run_id)  # fmt: skip
    reg = register(model, b, g, e, run_id=run_id)
    su = record_suites(model, reg["version"], b, e, run_id=run_id)
    p = promote(model, reg["version"], gates=gates, actor=actor, run_id=run_id)
    d = deploy(model, run_id=run_id)
    return {"build_set": b, "sft": s, "grpo": g, "evaluate": e, "register": reg,
            "suites": su, "promote": p, "deploy": d}  # fmt: skip


__all__ = [
    "GATE_POLICIES",
    "MODELS",
    "build_set",
    "deploy",
    "evaluate",
    "gate_policy",
    "grpo",
    "promote",
    "record_suites",
    "recipe_for",
    "register",
    "run_model",
    "sft",
]
