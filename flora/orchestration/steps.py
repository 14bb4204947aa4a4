"""The DAGs' heavy steps as plain functions of small JSON inputs.

Each function is what one Airflow task runs, whichever way it runs: in-process as an
``@task`` (embedded mode) or in a pod as ``python -m flora.orchestration.pod <step>``
(production mode, :mod:`flora.orchestration.tasks`). Inputs and outputs are the DAG's
XCom values: small dicts of paths on the shared volume, run ids and counts, never data.
Every function is a thin adapter over the one function implementing the step
(``flora.engine``, ``training.pipeline``, ``flora.policy.lerobot``); imports stay inside
the bodies so that parsing a DAG file does not import torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flora.orchestration.shards import Shard

State = dict[str, Any]


# ----------------------------------------------------------------- flora_data_engine
#
# Each engine step runs on one shard of the run's valid episodes (``shard``: a
# ``flora.orchestration.shards.Shard`` from ``plan_shards``; None = all of them), in its
# own MLflow child run, writes its full report next to the run's episode sets and hands
# on a reference: counts, the table's location and suite state, the report's path.

#: The keys of a step report that travel in XCom (``report``: the full report's path).
REFERENCE_KEYS = ("step", "table", "table_dir", "rows", "n_failures", "valid", "model",
                  "model_version")  # fmt: skip


def _hand_off(state: State, name: str, shard: Shard | None, rep: Any) -> State:
    from flora.engine import write_json
    from flora.orchestration.shards import report_path

    full = rep.to_dict(all_failures=True)
    path = write_json(full, report_path(state, name, shard))
    ref = {k: full[k] for k in REFERENCE_KEYS} | {
        "episodes": len(full["episodes_in"]),
        "report": str(path),
    }
    return {**state, "shard": shard, name: ref}


def segment(state: State, shard: Shard | None = None) -> State:
    """Segment the shard's valid episodes into the ``events`` table (scored by ``summary``)."""
    from flora.engine import run_segment, tracked
    from flora.orchestration.shards import episode_set, shard_episodes, shard_tags

    eps = shard_episodes(episode_set(state, "valid"), shard)
    rep = tracked("segment", state["mlflow_run_id"], run_segment, state["dataset_path"],
                  state["outputs_dir"], eps, state["mlflow_run_id"], evaluate=False,
                  run_tags=shard_tags(shard))  # fmt: skip
    return _hand_off(state, "segment", shard, rep)


def _vlm_episodes(state: State, shard: Shard | None, opt: Any) -> list[int]:
    from flora.orchestration.shards import episode_set, vlm_shard_episodes

    return vlm_shard_episodes(episode_set(state, "valid"), shard, opt)


def caption(
    state: State, shard: Shard | None = None, params: dict[str, Any] | None = None
) -> State:
    """Caption the events of the shard's valid episodes into the ``captions`` table."""
    from flora.engine import StepOptions, run_caption, tracked
    from flora.orchestration.shards import shard_tags

    opt = StepOptions.from_mapping(params)
    rep = tracked("caption", state["mlflow_run_id"], run_caption, state["dataset_path"],
                  state["segment"]["table_dir"], state["outputs_dir"],
                  _vlm_episodes(state, shard, opt), state["mlflow_run_id"], options=opt,
                  run_tags=shard_tags(shard))  # fmt: skip
    return _hand_off(state, "caption", shard, rep)


def reward(
    state: State, mode: str, shard: Shard | None = None, params: dict[str, Any] | None = None
) -> State:
    """One rewarder mode (outcome | dense | rubric) on the shard's episodes into its table."""
    from flora.engine import StepOptions, run_reward, tracked
    from flora.orchestration.shards import shard_tags

    opt = StepOptions.from_mapping(params)
    rep = tracked(mode, state["mlflow_run_id"], run_reward, mode, state["dataset_path"],
                  state["outputs_dir"], _vlm_episodes(state, shard, opt),
                  state["mlflow_run_id"], options=opt,
                  run_tags=shard_tags(shard))  # fmt: skip
    return _hand_off(state, mode, shard, rep)


# ----------------------------------------------------------------- flora_train_models


def sft(state: State, built: State, model: str) -> State:
    """Supervised fine-tuning (resumes from its checkpoint on a retry)."""
    from training import pipeline

    return pipeline.sft(model, state["recipe"], built["set"], f"{state['work']}/{model}/sft",
                        max_steps=state["sft_max_steps"] or None,
                        run_id=state["mlflow_run_id"])  # fmt: skip


def grpo(state: State, built: State, trained: State, model: str) -> State:
    """GRPO from the SFT model."""
    from training import pipeline

    return pipeline.grpo(model, state["recipe"], built["set"], trained,
                         f"{state['work']}/{model}/grpo",
                         max_steps=state["grpo_max_steps"] or None,
                         run_id=state["mlflow_run_id"])  # fmt: skip


def evaluate(state: State, built: State, trained: State, model: str) -> State:
    """Held-out metrics of the trained model and of its untrained base."""
    from training import pipeline

    return pipeline.evaluate(model, state["recipe"], built["set"], trained,
                             f"{state['work']}/{model}/eval.json",
                             max_episodes=state["eval_episodes"] or None,
                             n_boot=state["n_boot"], run_id=state["mlflow_run_id"])  # fmt: skip


# ----------------------------------------------------------------- flora_policy_rtc


def policy_train(state: State) -> State:
    """Fit the expert with training-time RTC (``flora.policy.lerobot.train_policy``)."""
    from flora.policy.lerobot import PolicyTrainConfig, train_policy

    cfg = PolicyTrainConfig(
        dataset=state["dataset_path"],
        out=state["policy_dir"],
        events=state["events"],
        run_id=state["mlflow_run_id"],
        progress=False,
        **state["train"],
    )
    summary = train_policy(cfg)
    return {
        **state,
        "checkpoint": summary["checkpoint"],
        "train_summary": {
            k: summary[k]
            for k in ("episodes", "train_chunks", "final_loss", "caption_steps", "failures")
        },
    }


#: Step name (the pod command's argument) -> function.
STEPS: dict[str, Callable[..., State]] = {
    f.__name__: f for f in (segment, caption, reward, sft, grpo, evaluate, policy_train)
}


def run_step(name: str, inputs: dict[str, Any]) -> State:
    """Run step ``name`` on ``inputs`` (its keyword arguments); unknown names are refused."""
    if name not in STEPS:
        raise ValueError(f"unknown step {name!r}; known steps: {', '.join(sorted(STEPS))}")
    return STEPS[name](**inputs)


__all__ = ["REFERENCE_KEYS", "STEPS", "run_step", *STEPS]
