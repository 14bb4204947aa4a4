"""The policy checkpoint as an MLflow model, registered as ``flora-policy``.

``train_policy`` writes ``policy.pt`` (model, optimiser, normalisation, train config);
:func:`log_policy_model` logs it as an MLflow **pyfunc** model (the checkpoint is the
model's artifact, not a loose file) whose ``predict`` returns action chunks through
:func:`flora.policy.lerobot.load_policy`, and :func:`register_policy` registers that model
with lineage and held-out metrics as version tags and the ``challenger`` alias, ready for
the promotion gates (``model_registry.promotion``, gate ``postfix_mse``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

NAME = "flora-policy"
ARTIFACT = "policy_model"
CHECKPOINT_KEY = "checkpoint"


def _signature():
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema

    inputs = Schema(
        [
            ColSpec("string", "state"),  # JSON list of floats (dataset units)
            ColSpec("string", "text"),  # task or caption
            # JSON (d, A) committed actions, in dataset units (the previous chunk's actions
            # that run while this one is computed); missing/null: plain sampling.
            ColSpec("string", "prefix", required=False),
            # How many leading prefix rows are committed; missing/null: all of them.
            ColSpec("long", "d", required=False),
        ]
    )
    return ModelSignature(inputs=inputs, outputs=Schema([ColSpec("string", "chunk")]))


def _pyfunc_class():
    import mlflow.pyfunc

    class FloraPolicy(mlflow.pyfunc.PythonModel):
        """Training-time-RTC sampling of the DiT action expert from the logged checkpoint."""

        def load_context(self, context) -> None:  # noqa: ANN001 - MLflow's signature
            from flora.policy.lerobot import load_policy

            self.policy = load_policy(context.artifacts[CHECKPOINT_KEY])

        def predict(self, context, model_input, params=None):  # noqa: ANN001
            """One chunk per row (see :func:`predict_args` for ``prefix`` and ``d``)."""
            import numpy as np
            import pandas as pd

            steps = int(self.policy.extra.get("train_config", {}).get("denoise_steps", 5))
            cfg = self.policy.model.config
            out = []
            for i, r in enumerate(model_input.to_dict("records")):
                state, text, prefix, d = predict_args(
                    i, r, cfg.horizon, cfg.action_dim, state_dim=cfg.state_dim
                )
                chunk = self.policy.chunk(state, text, prefix=prefix, d=d, steps=steps)
                out.append(json.dumps(np.asarray(chunk).tolist()))
            return pd.DataFrame({"chunk": out})

    return FloraPolicy


def _missing(v: Any) -> bool:
    """An absent optional input: None, NaN/NA (what pandas fills in for a row of a batch
    that lacks the column) or an empty string."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return True
    if isinstance(v, str):
        return not v.strip()
    return type(v).__name__ == "NAType"  # pandas.NA, without importing pandas here


def predict_args(
    row: int,
    r: Mapping[str, Any],
    horizon: int,
    action_dim: int,
    *,
    state_dim: int | None = None,
) -> tuple[Any, str, Any, int]:
    """``(state, text, prefix, d)`` for :meth:`TrainedPolicy.chunk` from one input row.

    ``state``: a JSON list of ``state_dim`` floats (the model's state width; None skips the
    length check). ``prefix``: JSON (L, A) actions in dataset units; missing (None/NaN/empty)
    means plain sampling. ``d``: how many leading prefix rows are committed; missing means
    all of them (``d = L``). ``d <= H - s`` with ``s = max(d, 1)`` (``rtc.sample``'s
    default), so at most ``H // 2`` committed actions. ``d > 0`` without a prefix, ``d > L``,
    a malformed prefix, a malformed state or one of another length are a ValueError naming
    the row (0-based position) and the field.
    """
    import numpy as np

    def bad(field: str, why: str) -> ValueError:
        return ValueError(f"predict: row {row}, field {field!r}: {why}")

    if _missing(r.get("state")):
        raise bad("state", "missing (a JSON list of floats)")
    try:
        state = np.asarray(json.loads(r["state"]), dtype=np.float32)
    except (TypeError, ValueError) as e:
        raise bad("state", f"not a JSON list of floats ({e})") from e
    # A state of another length would be broadcast against the normalisation (length 1:
    # silently) or fail as a bare numpy error.
    if state.ndim != 1:
        raise bad("state", f"must be a flat JSON list of floats, got shape {state.shape}")
    if state_dim is not None and len(state) != state_dim:
        raise bad("state", f"expected {state_dim} values (the model's state_dim), got {len(state)}")
    text = str(r["text"])

    raw_d, d = r.get("d"), None
    if not _missing(raw_d):
        try:
            fd = float(raw_d)
        except (TypeError, ValueError):
            fd = math.nan
        if isinstance(raw_d, bool) or not fd.is_integer() or fd < 0:
            raise bad("d", f"must be an integer >= 0, got {raw_d!r}")
        d = int(fd)

    prefix = None
    raw_p = r.get("prefix")
    if not _missing(raw_p):
        try:
            prefix = np.asarray(json.loads(raw_p), dtype=np.float32)
        except (TypeError, ValueError) as e:
            raise bad("prefix", f"not a JSON (d, A) array of numbers ({e})") from e
        if prefix.size == 0:
            prefix = None
        elif prefix.ndim != 2 or prefix.shape[1] != action_dim:
            raise bad("prefix", f"must be (d, A={action_dim}), got shape {prefix.shape}")
    if prefix is None:
        if d:
            raise bad("d", f"d={d} committed actions but no 'prefix' gives them")
        return state, text, None, 0

    field = "d"
    if d is None:  # every given action is committed
        d, field = len(prefix), "prefix"
    if d > len(prefix):
        raise bad("d", f"d={d} exceeds the {len(prefix)} actions in 'prefix'")
    s = max(d, 1)
    if d > horizon - s:
        raise bad(
            field,
            f"d={d} committed actions exceed H - s = {horizon} - {s} (s = max(d, 1)): at "
            f"most {horizon // 2} fit a chunk of H={horizon}",
        )
    return state, text, prefix, d


def log_policy_model(checkpoint: str | Path) -> str:
    """Log ``policy.pt`` as an MLflow model into the active run; returns its model URI."""
    import mlflow

    from flora.policy.lerobot import load_policy
    from flora.tracking import pinned_requirements

    load_policy(checkpoint)  # refuse anything that is not a complete Flora policy checkpoint
    info = mlflow.pyfunc.log_model(
        name=ARTIFACT,
        python_model=_pyfunc_class()(),
        artifacts={CHECKPOINT_KEY: str(Path(checkpoint).resolve())},
        signature=_signature(),
        pip_requirements=pinned_requirements("torch", "numpy", "pandas"),
        metadata={"flora_model": "policy", "kind": "flora.policy.dit"},
    )
    return info.model_uri


def policy_metrics(evaluation: Mapping[str, Any]) -> dict[str, float]:
    """Held-out figures of ``evaluate_policy``'s report that the gates read.

    ``postfix_mse``: training-time RTC's postfix error averaged over the evaluated delays;
    ``latency_ratio``: training-time over plain sampling latency.
    """
    rows = [r for r in evaluation.get("rows", []) if r.get("method") == "training_time"]
    vals = [float(r["postfix_mse"]) for r in rows if math.isfinite(float(r["postfix_mse"]))]
    out = {"postfix_mse": float(sum(vals) / len(vals))} if vals else {}
    ratio = evaluation.get("latency_ratio_training_time_over_plain")
    if ratio is not None and math.isfinite(float(ratio)):
        out["latency_ratio"] = float(ratio)
    return out


def register_policy(
    model_uri: str,
    run_id: str,
    metrics: Mapping[str, float],
    *,
    tags: Mapping[str, Any] | None = None,
) -> str:
    """Register the policy model at ``model_uri`` (logged by training run ``run_id``).

    Held-out ``metrics`` become ``eval.*`` version tags, ``tags`` the lineage; the
    version gets the ``challenger`` alias. Returns the version.
    """
    import mlflow
    from mlflow import MlflowClient

    from flora.tracking import configure

    configure()
    client = MlflowClient()
    all_tags = {str(k): str(v) for k, v in (tags or {}).items()}
    all_tags["flora.training_run_id"] = run_id
    all_tags |= {f"eval.{k}": repr(float(v)) for k, v in metrics.items()}
    mv = mlflow.register_model(model_uri, NAME, tags=all_tags)
    client.set_registered_model_alias(NAME, "challenger", mv.version)
    return str(mv.version)


def policy_eval_set(report: Mapping[str, Any], dataset: str) -> dict[str, str]:
    """The eval-set tags of an ``evaluate_policy`` report: the promotion gate compares
    postfix_mse only between versions whose figures measured the same thing.

    The fingerprint covers the episodes, the evaluation's seed and chunk count, the chunk
    length H, the delays scored, the denoising steps, the metric's definition
    (``metric_version``; a report without one is version 1, the checkpoint-unit figures),
    the dataset's content (``dataset_sha256``: two folders of one name are other data) and
    the events table's content when captions conditioned the evaluation. A Hub dataset's id
    with its revision is part of the data (another revision is other data); a local folder
    is named as the readers name it. Items a report lacks (one written before they were
    recorded) enter as ``unrecorded``, so such a report never pairs with a current one.
    """
    from flora.data.dataset import HUB_DATASET, dataset_name
    from model_registry.promotion import eval_set_tags

    def rec(key: str) -> str:
        return str(report[key]) if key in report else "unrecorded"

    src = str(report.get("dataset", dataset))
    delays = sorted({int(r["d"]) for r in report.get("rows", [])})
    data = [
        f"chunks={report.get('chunks')}",
        f"seed={report.get('seed')}",
        f"metric=postfix_mse.v{report.get('metric_version', 1)}",
        f"horizon={rec('horizon')}",
        f"delays={','.join(map(str, delays))}",
        f"steps={rec('steps')}",
        f"dataset_sha256={rec('dataset_sha256')}",
        f"events_sha256={rec('events_sha256')}",  # None: evaluated on task texts
    ]
    if HUB_DATASET.match(src) and not Path(src).exists():
        data.append(f"hub={src}")
    name = dataset_name(src)
    return eval_set_tags([f"{name}/{int(i):06d}" for i in report["episodes"]], data)


def eval_episode_tags(report: Mapping[str, Any]) -> dict[str, str]:
    """The ``flora.eval_episode*`` lineage tags of an ``evaluate_policy`` report."""
    from flora.policy.steps import episode_ids_tag

    return {
        "flora.eval_episodes": str(len(report["episodes"])),
        "flora.eval_episode_ids": episode_ids_tag(report["episodes"]),
        "flora.eval_episode_source": str(report.get("episode_source", "unknown")),
    }


def _version_checkpoint(version: str, dest: Path) -> Path:
    """The ``policy.pt`` logged with registered version ``version``, downloaded under
    ``dest``."""
    import mlflow

    local = Path(mlflow.artifacts.download_artifacts(f"models:/{NAME}/{version}",
                                                     dst_path=str(dest)))  # fmt: skip
    found = sorted(local.rglob("*.pt"))
    if not found:
        raise FileNotFoundError(f"{NAME} v{version}: no checkpoint (*.pt) among its artifacts")
    return found[0]


def evaluate_versions(
    versions: list[str | int],
    dataset: str,
    *,
    episodes: list[int] | None = None,
    events: str | Path | None = None,
    max_delay: int = 5,
    work_dir: str | Path | None = None,
) -> dict[str, dict[str, Any]]:
    """Re-evaluate registered ``flora-policy`` versions on the same episodes, so the
    promotion gate can compare them (what a refusal for different eval sets asks for).

    ``episodes=None`` takes the episodes of ``dataset`` that none of the versions trained on
    (their checkpoints' ``train_episodes``); each checkpoint must have been trained on
    ``dataset`` (name and content, :func:`flora.policy.lerobot.check_trained_on`). Each
    version is scored by :func:`flora.policy.lerobot.evaluate_policy` with the same delays
    (:func:`flora.policy.steps.eval_delays`), seed and denoising steps, and the evaluation
    replaces the version's earlier one (:func:`model_registry.promotion.record_evaluation`:
    metrics and eval-set fingerprint; the ``flora.eval_episode*`` lineage tags too).
    Versions of different horizons H still do not compare (H is part of the fingerprint).
    Returns ``{version: {"metrics", "episodes", "eval_set"}}``.
    """
    import tempfile

    from mlflow import MlflowClient

    from flora.data import open_dataset
    from flora.data.episode import FloraDataError
    from flora.policy.lerobot import (
        check_trained_on,
        dataset_sha256,
        evaluate_policy,
        load_policy,
    )
    from flora.policy.steps import eval_delays
    from flora.tracking import configure
    from model_registry.promotion import EVAL_SET_TAG, record_evaluation

    configure()
    tmp = Path(work_dir) if work_dir is not None else Path(tempfile.mkdtemp(prefix="flora-eval-"))
    ckpts = {str(v): _version_checkpoint(str(v), tmp / f"v{v}") for v in versions}
    pols = {v: load_policy(c) for v, c in ckpts.items()}
    ds = open_dataset(dataset)
    identity = dataset_sha256(ds.source.root if ds.source else ds.root)  # once, not per version
    if episodes is None:
        trained: set[int] = set()
        for v, pol in pols.items():
            check_trained_on(pol, ckpts[v], dataset, identity)
            if pol.extra.get("train_episodes") is None:
                raise FloraDataError(
                    f"{NAME} v{v} records no training episodes (an older checkpoint): "
                    "pass episodes= that it did not train on",
                    file=ckpts[v],
                    field="train_episodes",
                )
            trained |= {int(i) for i in pol.extra["train_episodes"]}
        episodes = [i for i in ds.episode_indices() if i not in trained]
        if not episodes:
            raise FloraDataError(
                f"every episode of {dataset} trained one of versions {sorted(pols)}: there is "
                "no episode unseen by all of them; pass episodes= (or hold out more)",
                field="train_episodes",
            )
    client = MlflowClient()
    out: dict[str, dict[str, Any]] = {}
    for v, c in ckpts.items():
        delays = eval_delays(pols[v].model.config.horizon, max_delay)
        report = evaluate_policy(c, dataset, episodes=list(episodes), events=events,
                                 delays=delays, identity=identity)  # fmt: skip
        metrics = policy_metrics(report)
        eval_set = policy_eval_set(report, dataset)
        record_evaluation("policy", v, metrics, eval_set=eval_set)
        for k, val in eval_episode_tags(report).items():
            client.set_model_version_tag(NAME, v, k, val)
        out[v] = {"metrics": metrics, "episodes": report["episodes"],
                  "eval_set": eval_set[EVAL_SET_TAG]}  # fmt: skip
    return out


def register_step(
    checkpoint: str | Path,
    evaluation: str | Path,
    *,
    pipeline_run_id: str,
    dataset: str,
    recipe: Mapping[str, Any],
) -> dict[str, Any]:
    """Pipeline step (Airflow task and KFP component): log, then register with lineage.

    Logs the checkpoint as an MLflow model in a child run of ``pipeline_run_id``, reads the
    held-out figures from ``evaluation`` (``evaluate_policy``'s JSON) and registers the
    model as ``flora-policy`` (alias ``challenger``); the episodes the figures come from
    are lineage tags (``flora.eval_episodes``: count, ``flora.eval_episode_ids``,
    ``flora.eval_episode_source``). Returns model URI, version, metrics.
    """
    from flora.tracking import git_commit, mlflow_run

    report = json.loads(Path(evaluation).read_text())
    metrics = policy_metrics(report)
    with mlflow_run("policy_register", run_id=pipeline_run_id) as run:
        uri = log_policy_model(checkpoint)
        child = run.info.run_id
    lineage = {
        "flora.git_commit": git_commit(),
        "flora.dataset": dataset,
        "flora.recipe": json.dumps(dict(recipe), sort_keys=True),
        "flora.base": "random-init DiT action expert",
        "flora.pipeline_run_id": pipeline_run_id,
    }
    if report.get("episodes") is not None:
        lineage |= eval_episode_tags(report) | policy_eval_set(report, dataset)
    version = register_policy(uri, child, metrics, tags=lineage)
    return {"model_uri": uri, "version": version, "metrics": metrics}


__all__ = [
    "NAME",
    "evaluate_versions",
    "log_policy_model",
    "policy_eval_set",
    "policy_metrics",
    "register_policy",
    "register_step",
]
