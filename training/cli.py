"""``flora train sets|sft|grpo``: thin typer layer over :mod:`training`.

One process runs in-process (a one-rank gloo/nccl group on a free port). Several run
through a launcher that sets the torch.distributed env, e.g.::

    deepspeed --num_gpus 8 --module flora.cli train sft --model captioner --recipe ...
    torchrun --nproc-per-node 2 -m flora.cli train sft --model captioner --recipe ...

``--local_rank`` (what the ``deepspeed`` launcher passes) is accepted and also read from
``LOCAL_RANK``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer

MODELS = ("segmenter", "captioner", "rewarder")


def _model(value: str) -> str:
    if value not in MODELS:
        raise typer.BadParameter(f"--model must be one of {', '.join(MODELS)}, got {value!r}")
    return value


def _default_out(kind: str, model: str) -> Path:
    from flora.settings import get_settings

    return get_settings().home / "training" / kind / model


def _recipe(model: str, recipe: str, max_steps: int | None = None):
    from training.recipe import RecipeError, load_recipe

    try:
        r = load_recipe(
            recipe if (recipe.endswith(".yaml") or "-" in recipe) else f"{model}-{recipe}"
        )
    except RecipeError as e:
        raise typer.BadParameter(str(e)) from None
    if r.model != model:
        raise typer.BadParameter(f"recipe {recipe!r} is for {r.model}, not {model}")
    return r


def register(app: typer.Typer, eval_app: typer.Typer) -> None:
    """Add ``flora train …`` to the root CLI."""
    from flora.cli_common import plain_typer

    train_app = plain_typer(
        help="Build training sets and train Flora models.", no_args_is_help=True
    )
    app.add_typer(train_app, name="train")

    @train_app.command("sets")
    def sets_cmd(
        model: str = typer.Option(
            ..., "--model", callback=_model, help="segmenter|captioner|rewarder"
        ),
        dataset: Path = typer.Option(..., "--dataset", exists=True, help="Toy-world dataset root."),
        out: Path | None = typer.Option(None, "--out", help="Set directory to write."),
        recipe: str | None = typer.Option(
            None, "--recipe", help="Take set settings from a recipe."
        ),
        grpo: bool = typer.Option(False, "--grpo", help="Build a GRPO prompt set instead of SFT."),
        split_fraction: float | None = typer.Option(None, "--split-fraction", min=0.0, max=0.99),
        mixture: Path | None = typer.Option(
            None, "--mixture", exists=True, help="Curated mixture parquet."
        ),
        max_episodes: int | None = typer.Option(None, "--max-episodes", min=1),
        mlflow: bool = typer.Option(True, "--mlflow/--no-mlflow", help="Log as MLflow datasets."),
    ) -> None:
        """Build an SFT (or GRPO) set from ground truth or a curated mixture."""
        from training.recipe import SetRecipe
        from training.sets import build_grpo_set, build_sft_set, read_manifest

        s = _recipe(model, recipe).sets if recipe else SetRecipe()
        frac = s.split_fraction if split_fraction is None else split_fraction
        dest = out or _default_out("sets", f"{model}-{'grpo' if grpo else 'sft'}")
        common = dict(
            split_fraction=frac,
            mixture=mixture,
            log_mlflow=mlflow,
            max_episodes=max_episodes or s.max_episodes,
        )
        if grpo:
            path = build_grpo_set(
                model, dataset, dest, profiles=s.profiles, shifted=s.shifted, **common
            )
        else:
            path = build_sft_set(
                model,
                dataset,
                dest,
                **s.sft_kwargs(),
                **common,
            )
        man = read_manifest(path)
        typer.echo(
            json.dumps(
                {
                    "set": str(path),
                    "examples": man["examples"],
                    "failures": man["failures"],
                    "splits": man["splits"],
                    "mlflow_run_id": man.get("mlflow_run_id"),
                }
            )
        )

    @train_app.command("sft")
    def sft_cmd(
        model: str = typer.Option(
            ..., "--model", callback=_model, help="segmenter|captioner|rewarder"
        ),
        recipe: str = typer.Option(
            ..., "--recipe", help="YAML path, name (captioner-small) or size (small)."
        ),
        set_path: Path = typer.Option(..., "--set", exists=True, help="SFT set directory."),
        out: Path | None = typer.Option(None, "--out", help="Run directory (checkpoints, model)."),
        resume: bool = typer.Option(False, "--resume", help="Resume from the latest checkpoint."),
        resume_from: Path | None = typer.Option(
            None, "--resume-from", help="Resume from this checkpoint."
        ),
        max_steps: int | None = typer.Option(
            None, "--max-steps", min=1, help="Stop early (resumable)."
        ),
        register_: bool = typer.Option(
            True, "--register/--no-register", help="Register as flora-<model>@challenger."
        ),
        mlflow: bool = typer.Option(True, "--mlflow/--no-mlflow"),
        local_rank: int | None = typer.Option(
            None, "--local_rank", "--local-rank", help="Set by the deepspeed launcher."
        ),
    ) -> None:
        """Supervised fine-tuning on DeepSpeed (ZeRO-2/3; gloo on CPU)."""
        from training.sft import train_sft

        if local_rank is None and "LOCAL_RANK" in os.environ:
            local_rank = int(os.environ["LOCAL_RANK"])
        r = _recipe(model, recipe)
        res = train_sft(
            r,
            set_path,
            out or _default_out("sft", model),
            resume=resume_from or resume,
            max_steps=max_steps,
            local_rank=local_rank,
            log_mlflow=mlflow,
            register=register_ and mlflow,
        )
        if int(os.environ.get("RANK", "0")) == 0:
            d = res.to_dict()
            d.pop("history")
            typer.echo(json.dumps(d))

    @train_app.command("grpo")
    def grpo_cmd(
        model: str = typer.Option(..., "--model", callback=_model, help="segmenter|captioner"),
        recipe: str = typer.Option(..., "--recipe", help="YAML path, name or size."),
        sft_model: Path = typer.Option(
            ..., "--sft-model", exists=True, help="Exported SFT model dir."
        ),
        set_path: Path = typer.Option(..., "--set", exists=True, help="GRPO prompt set directory."),
        out: Path | None = typer.Option(None, "--out", help="Run directory."),
        max_steps: int | None = typer.Option(None, "--max-steps", min=1),
        register_: bool = typer.Option(True, "--register/--no-register"),
        mlflow: bool = typer.Option(True, "--mlflow/--no-mlflow"),
        local_rank: int | None = typer.Option(None, "--local_rank", "--local-rank"),
    ) -> None:
        """GRPO from an SFT model (segmenter: r_seg, captioner: r_cap); see training.grpo."""
        from training.grpo import train_grpo

        if model == "rewarder":
            raise typer.BadParameter("no RL for the rewarder (DESIGN §3.5)")
        if local_rank is None and "LOCAL_RANK" in os.environ:
            local_rank = int(os.environ["LOCAL_RANK"])
        res = train_grpo(
            _recipe(model, recipe),
            sft_model,
            set_path,
            out or _default_out("grpo", model),
            max_steps=max_steps,
            local_rank=local_rank,
            log_mlflow=mlflow,
            register=register_ and mlflow,
        )
        if int(os.environ.get("RANK", "0")) == 0:
            d = res.to_dict() if hasattr(res, "to_dict") else {"result": str(res)}
            d.pop("history", None)
            typer.echo(json.dumps(d, default=str))
