"""``flora`` command line: a thin layer over pure library functions.

Each area has a ``cli`` module whose ``register(app, eval_app)`` adds its commands, so that
this file only wires them together.
"""

from __future__ import annotations

import sys

from flora.cli_common import EXIT_STATUS_HELP, FloraTyper, make_plain, plain_typer, run_app

app = plain_typer(
    typer_cls=FloraTyper,
    help="Flora robot data engine.",
    no_args_is_help=True,
    epilog=EXIT_STATUS_HELP,
)
eval_app = plain_typer(help="Score engine outputs against ground truth.", no_args_is_help=True)
app.add_typer(eval_app, name="eval")


def _register() -> None:
    # Imported lazily so `flora --help` stays fast and one broken area can't hide the rest.
    import importlib

    for mod in (
        "flora.data.cli",
        "flora.validation.cli",
        "flora.segment.cli",
        "flora.caption.cli",
        "flora.reward.cli",
        "flora.policy.cli",
        "flora.backends.cli",
        "training.cli",
        "training.eval_cli",
        "flora.curate.cli",
        "flora.export.cli",
        "flora.report.cli",
        "model_registry.cli",
    ):
        try:
            m = importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name == mod:  # area not built yet
                continue
            raise
        m.register(app, eval_app)


_register()
# Plain help and one-line errors for every area's sub-app, whoever created it.
make_plain(app)


def main() -> None:
    """The ``flora`` entry point: one-line errors and the documented exit statuses."""
    sys.exit(run_app(app, prog_name="flora"))


if __name__ == "__main__":
    main()
