"""``flora`` command line: a thin layer over pure library functions.

Each area has a ``cli`` module whose ``register(app, eval_app)`` adds its commands, so that
this file only wires them together.
"""

from __future__ import annotations

import typer

app = typer.Typer(help="Flora robot data engine.", no_args_is_help=True, add_completion=False)
eval_app = typer.Typer(help="Score engine outputs against ground truth.", no_args_is_help=True)
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
    ):
        try:
            m = importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name == mod:  # area not built yet
                continue
            raise
        m.register(app, eval_app)


_register()

if __name__ == "__main__":
    app()
