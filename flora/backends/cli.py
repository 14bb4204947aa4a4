"""``flora serve`` and ``flora tiny-model`` commands."""

from __future__ import annotations

import logging
from enum import StrEnum
from pathlib import Path

import typer

from flora.settings import get_settings


def serve_cmd(
    model: str = typer.Option(None, "--model", help="Checkpoint dir or hub id (FLORA_MODEL_PATH)."),
    adapter: str = typer.Option(None, "--adapter", help="PEFT adapter dir (FLORA_ADAPTER_PATH)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Bind address (loopback by default)."),
    port: int = typer.Option(8000, "--port", min=0, help="0: the OS picks (see --port-file)."),
    port_file: Path = typer.Option(
        None, "--port-file", help="Write the bound port here once listening (for --port 0)."
    ),
    token: str = typer.Option(
        None,
        "--token",
        help="Require 'Authorization: Bearer T' (visible in the process list: prefer "
        "FLORA_SERVE_TOKEN or --token-file).",
    ),
    token_file: Path = typer.Option(
        None, "--token-file", help="File whose first line is the bearer token."
    ),
    served_model: str = typer.Option(None, "--served-model", help="Model name clients send."),
    device: str = typer.Option(None, "--device", help="auto | cpu | cuda[:N] (FLORA_DEVICE)."),
    batch_size: int = typer.Option(8, "--batch-size", min=1),
    fail_first: int = typer.Option(0, "--fail-first", hidden=True),
    fail_marker: str = typer.Option(None, "--fail-marker", hidden=True),
    delay_first: int = typer.Option(0, "--delay-first", hidden=True),
    delay_s: float = typer.Option(0.0, "--delay-s", hidden=True),
    stall_marker: str = typer.Option(None, "--stall-marker", hidden=True),
    throttle_first: int = typer.Option(0, "--throttle-first", hidden=True),
    retry_after_s: int = typer.Option(1, "--retry-after-s", hidden=True),
) -> None:
    """Serve a VLM over an OpenAI-compatible HTTP API (chat completions with logprobs).

    Request limits come from FLORA_SERVE_* settings (docs/backends.md).
    """
    from flora.backends.server import NO_TOKEN_WARNING, Faults, resolve_token, serve

    s = get_settings()
    model = model or s.model_path
    if not model:
        raise typer.BadParameter("no model: pass --model or set FLORA_MODEL_PATH")
    # Before the token banner and the slow load: a wrong path is a usage error (exit 2), not
    # a warning banner followed by an internal error.
    check_model(model)
    try:
        token, warnings = resolve_token(token, token_file, s)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    if token is None:
        warnings.append(NO_TOKEN_WARNING.format(where=f"http://{host}:{port}"))
    for w in warnings:
        bar = "!" * 78
        typer.secho(f"{bar}\n{w}\n{bar}", err=True, fg=typer.colors.RED, bold=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    from flora.backends.base import BackendError

    try:
        serve(
            model,
            adapter=adapter or s.adapter_path,
            host=host,
            port=port,
            token=token,
            served_model=served_model or s.openai_model,
            device=device or s.device,
            batch_size=batch_size,
            faults=Faults(
                fail_first,
                fail_marker,
                delay_first,
                delay_s,
                stall_marker,
                throttle_first=throttle_first,
                retry_after_s=retry_after_s,
            ),
            settings=s,
            port_file=port_file,
        )
    except BackendError as e:  # an unknown hub id, weights that do not load: the option
        raise typer.BadParameter(str(e), param_hint="--model/--adapter") from None


def check_model(model: str) -> None:
    """Refuse (``typer.BadParameter``, exit 2) a ``--model`` written as a local path
    (``/…``, ``./…``, ``~/…``, or naming something that exists) that is no checkpoint
    directory (with a ``config.json``).

    Cheap and offline, so it runs before the token banner and the slow load. Anything else
    is a hub id, resolved when the model loads (an unknown one is a usage error there too).
    """
    p = Path(model).expanduser()
    if not (model.startswith(("/", "./", "../", "~")) or p.exists()):
        return
    if not p.is_dir():
        what = "is not a directory" if p.exists() else "does not exist"
        raise typer.BadParameter(f"model path {model!r} {what}", param_hint="--model")
    if not (p / "config.json").is_file():  # else transformers fails deep in the load
        raise typer.BadParameter(
            f"{model!r} has no config.json: not a Hugging Face checkpoint directory",
            param_hint="--model",
        )


class Family(StrEnum):
    """Qwen-VL architecture family of a tiny test checkpoint (flora.backends.tiny.FAMILIES)."""

    qwen3_vl = "qwen3_vl"
    qwen2_5_vl = "qwen2_5_vl"
    qwen3_5 = "qwen3_5"


def tiny_model_cmd(
    out: Path = typer.Option(..., "--out", help="Directory to write the checkpoint to."),
    family: Family = typer.Option(Family.qwen3_vl, "--family", help="Architecture family."),
    seed: int = typer.Option(0, "--seed"),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Replace --out even if Flora did not create it."
    ),
) -> None:
    """Build a tiny random-initialised Qwen-VL checkpoint (offline, seconds)."""
    from flora.backends.tiny import build_tiny_vlm
    from flora.safety import OutputDirError

    try:
        path = build_tiny_vlm(out, family=family.value, seed=seed, overwrite=overwrite)
    except OutputDirError as e:  # never delete what Flora did not write: say so, exit 2
        raise typer.BadParameter(str(e), param_hint="--out") from e
    typer.echo(str(path))


def register(app: typer.Typer, eval_app: typer.Typer) -> None:
    """Add the backend commands to the ``flora`` CLI."""
    app.command("serve")(serve_cmd)
    app.command("tiny-model")(tiny_model_cmd)
