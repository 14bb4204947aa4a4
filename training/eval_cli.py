"""``flora eval model``: held-out metrics of a trained or registered Flora model (thin CLI)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import typer


def register(app: typer.Typer, eval_app: typer.Typer) -> None:
    """Add ``flora eval model`` to the root CLI."""

    @eval_app.command("model")
    def eval_model(
        model: str = typer.Option(..., "--model", help="segmenter | captioner | rewarder"),
        version: str | None = typer.Option(
            None, "--version", help="Registered flora-<model> version (or alias)."
        ),
        path: Path | None = typer.Option(None, "--path", help="Exported model directory."),
        set_path: Path | None = typer.Option(
            None, "--set", help="Training set whose held-out split is evaluated."
        ),
        dataset: Path | None = typer.Option(
            None, "--dataset", help="Toy-world dataset: build the set here first (if no --set)."
        ),
        split_fraction: float = typer.Option(
            0.2, "--split-fraction", help="Held-out share when building from --dataset."
        ),
        episodes: int | None = typer.Option(
            None, "--episodes", min=1, help="Evaluate at most this many held-out episodes."
        ),
        also_unseen_by: list[str] | None = typer.Option(
            None,
            "--also-unseen-by",
            help="Also leave out what this model's lineage trained on: a registered "
            "flora-<model> version / alias, or an exported model directory (repeatable). "
            "Two versions evaluated with one --set, the same --episodes and each other here "
            "score the same episodes (the promotion gates compare only such pairs).",
        ),
        judge: str = typer.Option("embedding", "--judge", help="Captioner judge: embedding|llm."),
        attempts: int = typer.Option(
            1,
            "--attempts",
            min=1,
            help="Answers per item: 1 scores the greedy answer (what the model learnt); "
            "the engine's default 3 re-asks an answer that does not parse, sampled.",
        ),
        device: str = typer.Option("cpu", "--device", help="cpu | cuda | auto"),
        n_boot: int = typer.Option(1000, "--bootstrap", min=0, help="Bootstrap resamples."),
        mlflow: bool = typer.Option(True, "--mlflow/--no-mlflow", help="Log to MLflow."),
        json_out: Path | None = typer.Option(None, "--json", help="Also write results here."),
        allow_unknown_lineage: bool = typer.Option(
            False,
            "--allow-unknown-lineage",
            help="Score on the set's split alone when the model's lineage cannot be read.",
        ),
    ) -> None:
        """Score a model on held-out episodes; log eval.* metrics (comparable across versions)."""
        from flora.cli_common import print_metrics
        from training.evaluate import (
            EVAL_MODELS,
            backend_for,
            evaluate_model,
            log_eval,
            registered_model_dir,
            unseen_heldout,
        )

        if model not in EVAL_MODELS:
            raise typer.BadParameter(f"--model must be one of {EVAL_MODELS}")
        if (version is None) == (path is None):
            raise typer.BadParameter("give exactly one of --version and --path")
        if set_path is None:
            if dataset is None:
                raise typer.BadParameter("give --set or --dataset")
            from training.sets import build_sft_set

            set_path = build_sft_set(model, dataset, Path(tempfile.mkdtemp()) / "set",
                                     split_fraction=split_fraction)  # fmt: skip
            # kept (the MLflow tags name it): say where, so a rerun can pass --set
            typer.echo(f"built the set at {set_path} (pass --set to reuse it)")
        model_dir = registered_model_dir(model, version) if version is not None else path
        others = [Path(o) if Path(o).exists() else registered_model_dir(model, o)
                  for o in also_unseen_by or ()]  # fmt: skip
        # Never scored on an episode the model, or one it was continued from, trained on.
        held = unseen_heldout(model, set_path, model_dir, limit=episodes,
                              allow_unknown_lineage=allow_unknown_lineage,
                              also_unseen_by=others)  # fmt: skip
        examples = held.examples
        if held.left_out or held.lineage != "known":
            typer.echo(f"lineage {held.lineage}; {len(held.left_out)} held-out episodes left "
                       "out (the model's lineage trained on them)")  # fmt: skip
        j = None
        if model == "captioner":
            from training.rewards import make_judge

            j = make_judge(judge)
        res = evaluate_model(model, examples, backend_for(model_dir, device=device), judge=j,
                             n_boot=n_boot, attempts=attempts)  # fmt: skip
        res.info.update(model_dir=str(model_dir), set=str(set_path), version=version,
                        lineage=held.lineage, left_out_seen=held.left_out)  # fmt: skip
        print_metrics(f"eval {model} ({len(examples)} held-out items)", res.metrics)
        es = res.info.get("eval_set") or {}
        typer.echo(f"eval set {es.get('flora.eval_set.sha256', '?')[:12]}: "
                   f"{es.get('flora.eval_set.episodes', '?')} episodes, "
                   f"{es.get('flora.eval_set.items', '?')} items")  # fmt: skip
        if mlflow:
            tags = {"flora.eval.set": str(set_path), "flora.eval.model_dir": str(model_dir),
                    "flora.eval.version": str(version or ""),
                    "flora.eval.lineage": held.lineage[:500],
                    "flora.eval.left_out_seen": str(len(held.left_out)),
                    "flora.eval.also_unseen_by": ",".join(also_unseen_by or ())[:500],
                    "flora.eval.attempts": str(attempts)}  # fmt: skip
            num = version if version is not None and version.isdigit() else None
            if attempts > 1 and num is not None:
                # The promotion gates read the version's eval.* tags as greedy figures:
                # retried parse rates go to the run only.
                typer.echo(f"--attempts {attempts}: version {num}'s eval.* tags left as they were")
                num = None
            rid = log_eval(res, tags=tags, registered_version=num)
            typer.echo(f"logged to MLflow run {rid}")
        if json_out is not None:
            json_out.write_text(json.dumps(res.to_dict(), indent=2, default=str))
