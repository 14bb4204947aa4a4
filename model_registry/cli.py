"""``flora registry list|show|promote|rollback|deploy`` (thin layer over the registry).

Exit status: 0 done; 1 a refused promotion (the reasons are printed), a registry error
(unknown version, nothing to roll back) or a failed deployment; 2 usage errors.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from flora.cli_common import report_output, settings_error_message

registry_app = typer.Typer(
    help="Model registry: versions, promotion gates, rollback, deployment.",
    no_args_is_help=True,
)


class Model(StrEnum):
    """Registered Flora models."""

    segmenter = "segmenter"
    captioner = "captioner"
    rewarder = "rewarder"
    policy = "policy"


def _overlay_names() -> list[str]:
    """The kustomize overlays of ``infra/overlays`` (those with a kustomization.yaml)."""
    from model_registry.manifests import INFRA

    root = INFRA / "overlays"
    found = sorted(p.name for p in root.glob("*") if (p / "kustomization.yaml").is_file())
    return found or ["dev", "prod"]  # no infra/ beside the code: the documented pair


#: ``--overlay`` choices: the overlays that exist, so a typo (``staging``) is a usage error
#: listing them instead of an internal error from kustomize.
_OVERLAYS = _overlay_names()
Overlay = StrEnum("Overlay", {n: n for n in _OVERLAYS})  # type: ignore[misc]
Overlay.__doc__ = "An infra/overlays/<name> kustomize overlay."
#: ``dev`` where the tree has it; else the first overlay (an infra tree without ``dev``
#: must not stop every ``flora`` command at import).
DEFAULT_OVERLAY = Overlay("dev" if "dev" in _OVERLAYS else _OVERLAYS[0])

JsonOpt = Annotated[
    str | None, typer.Option("--json", help="Write the report as JSON to PATH, or - for stdout.")
]


def _fail(msg: str) -> None:
    typer.echo(f"flora registry: error: {msg}", err=True)
    raise typer.Exit(1)


@registry_app.command("list")
def list_cmd(model: Model, json_out: JsonOpt = None) -> None:
    """Versions of a model with aliases, training run and held-out metrics."""
    from model_registry.promotion import list_versions
    from model_registry.register import RegistryError

    with report_output(json_out) as rep:
        try:
            rows = list_versions(model.value)
        except RegistryError as e:
            _fail(str(e))
        except Exception as e:  # noqa: BLE001 - MLflow: the model was never registered
            if settings_error_message(e) is not None:  # a bad FLORA_* value: usage, exit 2
                raise
            _fail(f"{model.value}: {e}")
        for r in rows:
            metrics = " ".join(f"{k}={v:.4g}" for k, v in sorted(r["metrics"].items()))
            aliases = ",".join(r["aliases"]) or "-"
            typer.echo(f"v{r['version']}\t{aliases}\t{r['run_id']}\t{metrics}")
        rep.emit({"model": model.value, "versions": rows})


@registry_app.command("show")
def show_cmd(
    model: Model,
    ref: Annotated[str, typer.Argument(help="Version number or alias.")] = "champion",
    json_out: JsonOpt = None,
) -> None:
    """One version: metrics, lineage tags, audit trail, and its gate decision."""
    from model_registry.promotion import (
        audit_trail,
        decision_dict,
        evaluate_gates,
        list_versions,
    )
    from model_registry.register import RegistryError

    with report_output(json_out) as rep:
        try:
            d = evaluate_gates(model.value, ref)
            row = next(r for r in list_versions(model.value) if r["version"] == d.version)
            trail = audit_trail(model.value, d.version)
        except RegistryError as e:
            _fail(str(e))
        typer.echo(f"{d.model} v{d.version} aliases={','.join(row['aliases']) or '-'}")
        for k, v in sorted(row["lineage"].items()):
            typer.echo(f"  {k} = {v}")
        for k, v in sorted(row["metrics"].items()):
            typer.echo(f"  eval {k} = {v:.4g}")
        verdict = "passes" if d.passed else "fails"
        typer.echo(f"  gates vs champion v{d.champion}: {verdict}")
        for r in d.reasons:
            typer.echo(f"    - {r}")
        for e in trail:
            typer.echo(f"  audit {e['time']} {e['event']} by {e.get('by')}")
        rep.emit({"version": row, "gates": decision_dict(d), "audit": trail})


@registry_app.command("promote")
def promote_cmd(
    model: Model,
    version: Annotated[str, typer.Argument(help="Version or alias (default challenger).")] = (
        "challenger"
    ),
    force: Annotated[
        bool, typer.Option("--force", help="Promote despite failed gates (audited).")
    ] = False,
    json_out: JsonOpt = None,
) -> None:
    """Move champion to a version that passes the gates; refuse with reasons otherwise."""
    from model_registry.promotion import decision_dict, promote
    from model_registry.register import RegistryError

    with report_output(json_out) as rep:
        try:
            res = promote(model.value, version, force=force)
        except RegistryError as e:
            _fail(str(e))
        d = res.decision
        rep.emit({"promoted": res.promoted, "champion": res.champion,
                  "previous": res.previous, "gates": decision_dict(d)})  # fmt: skip
        if res.promoted:
            typer.echo(f"{d.model}: champion v{res.previous or '-'} -> v{res.champion}")
            return
        if res.champion == d.version:
            typer.echo(f"{d.model}: v{d.version} is already the champion")
            return
        typer.echo(f"{d.model}: v{d.version} refused; champion stays v{res.champion}", err=True)
        for r in d.reasons:
            typer.echo(f"  - {r}", err=True)
        raise typer.Exit(1)


@registry_app.command("rollback")
def rollback_cmd(model: Model, json_out: JsonOpt = None) -> None:
    """Move champion back to the version it replaced."""
    from model_registry.promotion import rollback
    from model_registry.register import RegistryError

    with report_output(json_out) as rep:
        try:
            cur, prev = rollback(model.value)
        except RegistryError as e:
            _fail(str(e))
        typer.echo(f"{model.value}: champion v{cur} -> v{prev}")
        rep.emit({"from": cur, "to": prev})


@registry_app.command("deploy")
def deploy_cmd(
    model: Model,
    ref: Annotated[str, typer.Argument(help="Version or alias to deploy.")] = "champion",
    overlay: Annotated[
        Overlay, typer.Option("--overlay", help="infra/overlays overlay to render.")
    ] = DEFAULT_OVERLAY,
    out: Annotated[
        Path | None, typer.Option("--out", help="Where to write the rendered manifest.")
    ] = None,
    apply: Annotated[
        bool,
        typer.Option("--apply/--no-apply", help="Dry-run then apply when a cluster is set."),
    ] = True,
    json_out: JsonOpt = None,
) -> None:
    """Render the inference-pod manifest of a version (default: champion) and apply it."""
    from model_registry.deploy import deploy
    from model_registry.manifests import ManifestError
    from model_registry.register import RegistryError

    with report_output(json_out) as rep:
        try:
            res = deploy(model.value, ref, overlay=overlay.value, out=out, apply=apply)
        except (RegistryError, ManifestError) as e:  # no kubectl, an overlay that fails
            _fail(str(e))
        typer.echo(f"{model.value} v{res.version}: manifest {res.manifest} ({res.action})")
        rep.emit(res.to_dict())


def register(app: typer.Typer, eval_app: typer.Typer) -> None:
    """Add ``flora registry`` to the root CLI."""
    app.add_typer(registry_app, name="registry")
