"""Pieces shared by the areas' ``cli`` modules: exit statuses, error mapping, reports.

The exit-status rule (docs/cli.md, ``flora --help``) for every step command:

- 0: every item good;
- 3: some items failed but others were written (``--strict`` makes this 1);
- 1: nothing usable (every item failed, no rows, a table that failed its suite) or a
  data error (bad dataset, bad table);
- 2: usage error (missing path, unknown choice, bad option).

``run_app`` runs a typer app with click's standalone mode off and turns every error into
one line on stderr with that status; tracebacks only with ``FLORA_DEBUG=1`` / ``--debug``.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import math
import os
import re
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum, StrEnum
from pathlib import Path
from typing import IO, Annotated, Any

import typer

# typer >= 0.24 vendors the click it runs on; its exceptions are not ``click``'s.
from typer._click import exceptions as _click_exc

EXIT_OK = 0
EXIT_FAILED = 1  # nothing usable, a data error, or an internal error
EXIT_USAGE = 2
EXIT_PARTIAL = 3  # some items failed, the others were written

EXIT_STATUS_HELP = (
    "\b\nExit status of step commands (segment, caption, reward, validate, eval, synth, "
    "policy):\n"
    "  0  every item good\n"
    "  3  some items failed, the others were written (--strict: 1)\n"
    "  1  nothing usable (every item failed, no rows, invalid table) or a data error\n"
    "  2  usage error (missing path, unknown choice, bad option)\n"
    "\b\n"
    "--json - writes a command's report to stdout (human text goes to stderr);\n"
    "--json PATH writes it to a file. FLORA_DEBUG=1 or --debug shows tracebacks.\n"
    "See docs/cli.md."
)


# --------------------------------------------------------------------------- choices


class Backend(StrEnum):
    """VLM backend (overrides FLORA_BACKEND for one command)."""

    kinematic = "kinematic"
    transformers = "transformers"
    openai = "openai"


class Profile(StrEnum):
    """Segmentation window profile (DESIGN 3.1)."""

    standard = "standard"
    long_horizon = "long_horizon"


class RewardMode(StrEnum):
    """Rewarder task."""

    outcome = "outcome"
    dense = "dense"
    rubric = "rubric"


class ModelRole(StrEnum):
    """Which Flora model (registered as flora-<role>)."""

    segmenter = "segmenter"
    captioner = "captioner"
    rewarder = "rewarder"


class Judge(StrEnum):
    """Caption judge for r_cap."""

    embedding = "embedding"
    llm = "llm"


class Device(StrEnum):
    """Torch device choice for in-process models (cuda:N is not offered here)."""

    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


# --------------------------------------------------------------------------- options

JsonOpt = Annotated[
    str | None,
    typer.Option(
        "--json",
        metavar="PATH|-",
        help="Write the machine-readable report to PATH, or to stdout with '-' "
        "(human text then goes to stderr).",
    ),
]
StrictOpt = Annotated[
    bool, typer.Option("--strict", help="Exit 1 instead of 3 when any item failed.")
]
# An input path (docs/cli.md): a mistyped --tables would otherwise make an empty product.
TablesOpt = Annotated[
    Path | None,
    typer.Option(
        help="Engine tables root (default: FLORA_HOME/outputs).", exists=True, file_okay=False
    ),
]


def parse_episodes(spec: str | None) -> list[int] | None:
    """``"0,2,5"`` -> ``[0, 2, 5]``; empty or None -> None (every episode).

    Anything but comma-separated non-negative integers is a usage error.
    """
    out: list[int] = []
    for x in (spec or "").split(","):
        if not x.strip():
            continue
        try:
            i = int(x)
        except ValueError:
            i = -1
        if i < 0:
            raise typer.BadParameter(
                f"expected comma-separated episode indices, got {spec!r}", param_hint="--episodes"
            )
        out.append(i)
    return out or None


def settings_with_backend(backend: Backend | None) -> Any:
    """The process settings, with ``backend`` overriding FLORA_BACKEND when given."""
    from flora.settings import get_settings

    s = get_settings()
    return s if backend is None else s.model_copy(update={"backend": backend.value})


def make_backend_or_usage_error(settings: Any) -> Any:
    """``flora.backends.make_backend`` with a configuration error turned into exit 2."""
    from flora.backends import BackendError, make_backend

    try:
        return make_backend(settings)
    except BackendError as e:
        raise typer.BadParameter(str(e), param_hint="FLORA_BACKEND/--backend") from None


# --------------------------------------------------------------------------- output


def _json_default(o: Any) -> Any:
    if isinstance(o, Path):
        return str(o)
    if isinstance(o, Enum):
        return o.value
    if hasattr(o, "to_dict"):
        return o.to_dict()
    if hasattr(o, "item"):  # numpy scalars
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    if hasattr(o, "__dict__"):
        return vars(o)
    return str(o)


def _finite(o: Any) -> Any:
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, list):
        return [_finite(v) for v in o]
    return o


def dumps(payload: Any) -> str:
    """Strict JSON text of a report: paths, enums, numpy values and dataclass-likes are
    converted, and NaN/inf become null (``jq`` and most parsers refuse NaN)."""
    plain = json.loads(json.dumps(payload, default=_json_default, allow_nan=True))
    return json.dumps(_finite(plain), indent=1, allow_nan=False)


@dataclass
class Report:
    """Where a command's report goes: ``dest`` is None, ``"-"`` (stdout) or a path."""

    dest: str | None
    stdout: IO[str]

    @property
    def to_stdout(self) -> bool:
        return self.dest == "-"

    def emit(self, payload: Any) -> None:
        """Write the report to stdout (``-``) or to the file; nothing when no ``--json``."""
        if self.dest is None:
            return
        text = dumps(payload)
        if self.to_stdout:
            self.stdout.write(text + "\n")
            self.stdout.flush()
        else:
            p = Path(self.dest)
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text + "\n")


@contextlib.contextmanager
def report_output(dest: str | Path | None) -> Iterator[Report]:
    """Run a command body; with ``dest == "-"`` everything it prints goes to stderr.

    Redirecting ``sys.stdout`` (not only our own echo calls) keeps stdout clean of
    whatever libraries print, so ``flora … --json - | jq`` always parses.
    """
    d = None if dest is None else str(dest)
    real = sys.stdout
    if d == "-":
        with contextlib.redirect_stdout(sys.stderr):
            yield Report(d, real)
    else:
        yield Report(d, real)


def echo_failures(failures: Iterable[Any], limit: int = 20) -> None:
    """One ``failed: <episode> <item>: <reason>`` line per recorded failure, on stderr."""
    fs = list(failures)
    for f in fs[:limit]:
        typer.echo(f"failed: {f.episode_id} {f.item}: {one_line(str(f.reason))}", err=True)
    if len(fs) > limit:
        typer.echo(f"failed: … {len(fs) - limit} more (see the table's _failures/)", err=True)


def print_metrics(
    title: str, metrics: Mapping[str, Any], fmt: Callable[[Any], str] = "{:.4f}".format
) -> None:
    """A two-column ``metric | value`` table on the console (stdout, or stderr under
    ``--json -``)."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    t.add_column("metric")
    t.add_column("value", justify="right")
    for k, v in metrics.items():
        try:
            t.add_row(k, fmt(v))
        except (TypeError, ValueError):
            t.add_row(k, str(v))
    Console(file=sys.stdout).print(t)


# --------------------------------------------------------------------------- exit status


def step_exit_code(*, rows: int, failed: int, strict: bool = False, valid: bool = True) -> int:
    """The documented exit status of a step that writes rows and records item failures.

    ``rows``: items written (rows of the table after the run); ``failed``: recorded item
    failures; ``valid``: whether the table passed its suite.
    """
    if not valid or rows <= 0:
        return EXIT_FAILED
    if failed == 0:
        return EXIT_OK
    return EXIT_FAILED if strict else EXIT_PARTIAL


def failure_dicts(failures: Iterable[Any]) -> list[dict[str, Any]]:
    """Recorded failures (``flora.tables.Failure``) as JSON-ready dicts."""
    return [
        {k: getattr(f, k, None) for k in ("table", "episode_id", "item", "reason")}
        for f in failures
    ]


def step_payload(
    *,
    table: str,
    table_dir: Path | str,
    run_id: str,
    rows: int,
    processed: Sequence[str],
    skipped: Sequence[str],
    failures: Sequence[Any],
    validation: Any = None,
) -> dict[str, Any]:
    """The common JSON report of a step command (what ``--json`` writes)."""
    return {
        "table": table,
        "table_dir": str(table_dir),
        "run_id": run_id,
        "rows": int(rows),
        "processed": list(processed),
        "skipped": list(skipped),
        "failures": failure_dicts(failures),
        "validation": validation.to_dict() if hasattr(validation, "to_dict") else None,
    }


def status_line(code: int, *, rows: int, failed: int, valid: bool = True) -> str:
    """A human sentence that explains ``code`` (printed on stderr by ``finish_step``)."""
    if not valid:
        why = "the table failed its suite"
    elif rows <= 0:
        why = f"nothing usable: no rows written, {failed} item(s) failed"
    elif failed:
        why = f"{failed} item(s) failed, {rows} row(s) written"
    else:
        why = f"{rows} row(s) written, no failures"
    hint = " (--strict makes this 1)" if code == EXIT_PARTIAL else ""
    return f"exit {code}: {why}{hint}"


def finish_step(
    report: Report,
    payload: Mapping[str, Any],
    *,
    rows: int,
    failed: int,
    strict: bool = False,
    valid: bool = True,
) -> None:
    """Emit the report (with ``exit_code``) and leave with the documented status."""
    code = step_exit_code(rows=rows, failed=failed, strict=strict, valid=valid)
    report.emit({**payload, "exit_code": code})
    if code != EXIT_OK:  # say why the status is not 0 (0 needs no explanation)
        typer.echo(status_line(code, rows=rows, failed=failed, valid=valid), err=True)
    raise typer.Exit(code)


# --------------------------------------------------------------------------- errors


def one_line(text: str, limit: int = 600) -> str:
    """Collapse whitespace/newlines so an error is one grep-able line."""
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[: limit - 1] + "…"


def _data_error_types() -> tuple[type[BaseException], ...]:
    """Exceptions that mean "bad input data" (exit 1), imported lazily."""
    types: list[type[BaseException]] = []
    for mod, name in (
        ("flora.data.episode", "FloraDataError"),
        ("flora.contract", "ContractError"),
        ("flora.reward.rubric", "RubricError"),
        ("flora.reward.outcome", "ScoreProbsError"),
        ("flora.reward.dense", "DenseError"),
    ):
        with contextlib.suppress(Exception):
            types.append(getattr(__import__(mod, fromlist=[name]), name))
    return tuple(types)


def _training_error_types() -> tuple[type[BaseException], ...]:
    """Refusals of the trainers (bad set, base, checkpoint, init weights; divergence)."""
    import sys

    types: list[type[BaseException]] = []
    for mod, name in (("training.sft", "TrainingError"), ("training.sets", "SetError")):
        if mod in sys.modules:  # raised only after the module was imported
            types.append(getattr(sys.modules[mod], name))
    return tuple(types)


def _command_path(cmd: Any, args: Sequence[str], prog_name: str) -> str:
    """``flora reward outcome`` from the argv (best effort, for error lines)."""
    parts = [prog_name]
    cur = cmd
    for a in args:
        commands = getattr(cur, "commands", None)
        if a.startswith("-") or not isinstance(commands, dict):
            break
        nxt = commands.get(a)
        if nxt is None:
            break
        parts.append(a)
        cur = nxt
    return " ".join(parts)


def _setting_var(field: object) -> str:
    """The environment variable of settings field ``field`` (``gpu_count`` ->
    ``FLORA_GPU_COUNT``)."""
    from flora.settings import FloraSettings

    return f"{FloraSettings.model_config.get('env_prefix', '')}{field}".upper()


def settings_error_message(e: BaseException) -> str | None:
    """A one-line message naming the ``FLORA_*`` variable(s) at fault when ``e`` is an error
    reading :class:`~flora.settings.FloraSettings`, else None.

    Two kinds: pydantic's ``ValidationError`` (a value of the wrong type or out of range)
    and pydantic-settings' ``SettingsError`` (a list or dict setting whose value is not
    JSON, raised before validation). Both name the field, which the user never typed.
    """
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    if isinstance(e, ValidationError) and e.title == "FloraSettings":
        parts = []
        for err in e.errors(include_url=False):
            loc = err.get("loc") or ("?",)
            var = _setting_var(loc[0])
            sub = "".join(f"[{x!r}]" for x in loc[1:])
            # never echo a credential (FLORA_SERVE_TOKEN, FLORA_OPENAI_API_KEY) to a log
            shown = (
                "<hidden>"
                if re.search(r"token|key|password", str(loc[0]))
                else repr(err.get("input"))
            )
            parts.append(f"{var}{sub}={shown}: {err.get('msg')}")
        return "bad FLORA_* setting: " + "; ".join(parts)
    if isinstance(e, SettingsError):
        m = re.search(r'field "(\w+)"', str(e))
        if m is None:
            return f"bad FLORA_* setting: {e}"
        why = f": {e.__cause__}" if e.__cause__ is not None else ""
        return (f"bad FLORA_* setting: {_setting_var(m.group(1))} could not be parsed{why} "
                "(list and dict settings take JSON, e.g. '[\"a\", \"b\"]' or "
                "'{\"key\": \"value\"}')")  # fmt: skip
    return None


def debug_enabled() -> bool:
    """True when ``FLORA_DEBUG`` is set to a true value."""
    return os.environ.get("FLORA_DEBUG", "").strip().lower() in {"1", "true", "yes", "on"}


def run_app(app: typer.Typer, args: Sequence[str] | None = None, prog_name: str = "flora") -> int:
    """Run ``app`` and return the process exit status (see the module docstring).

    ``--debug`` anywhere in ``args`` is removed and enables tracebacks like FLORA_DEBUG=1.
    """
    argv = list(sys.argv[1:] if args is None else args)
    debug = debug_enabled() or "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    cmd = typer.main.get_command(app)
    where = _command_path(cmd, argv, prog_name)

    def say(msg: str) -> None:
        sys.stdout.flush()
        print(one_line(msg), file=sys.stderr, flush=True)

    try:
        rv = cmd.main(args=argv, prog_name=prog_name, standalone_mode=False)
    except _click_exc.NoArgsIsHelpError as e:
        # A bare group: its help, as click prints it, then the usage status.
        print(e.ctx.get_help() if e.ctx else e.format_message(), file=sys.stderr)
        return EXIT_USAGE
    except _click_exc.UsageError as e:  # BadParameter, NoSuchOption, MissingParameter, ...
        path = e.ctx.command_path if e.ctx is not None else where
        msg = e.format_message().replace("Value error, ", "")  # pydantic-style prefix
        say(f"{path}: error: {msg} (see '{path} --help')")
        return EXIT_USAGE
    except _click_exc.ClickException as e:  # FileError and friends
        say(f"{where}: error: {e.format_message()}")
        return e.exit_code
    except typer.Abort:
        say(f"{where}: aborted")
        return 130
    except KeyboardInterrupt:
        say(f"{where}: interrupted")
        return 130
    except BrokenPipeError:
        # The reader of stdout went away (``flora … --json - | head``): stop quietly.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILED
    except Exception as e:
        if debug:
            traceback.print_exc()
        if isinstance(e, _data_error_types()):
            say(f"{where}: data error: {e}")
            return EXIT_FAILED
        if isinstance(e, _training_error_types()):  # a refused run: its reason, no traceback
            say(f"{where}: error: {e}")
            return EXIT_FAILED
        if (msg := settings_error_message(e)) is not None:
            say(f"{where}: error: {msg}")
            return EXIT_USAGE
        from flora.safety import OutputDirError

        if isinstance(e, OutputDirError):  # an output path Flora may not replace: usage
            say(f"{where}: error: {e}")
            return EXIT_USAGE
        if isinstance(e, OSError):
            say(f"{where}: error: {e}")
            return EXIT_FAILED
        hint = "" if debug else " (FLORA_DEBUG=1 or --debug shows the traceback)"
        say(f"{where}: internal error: {type(e).__name__}: {e}{hint}")
        return EXIT_FAILED
    if isinstance(rv, int) and not isinstance(rv, bool):
        return rv
    return EXIT_OK


def plain_typer(typer_cls: type[typer.Typer] = typer.Typer, **kwargs: Any) -> typer.Typer:
    """A ``typer.Typer`` with plain help and errors (no rich boxes, no pretty tracebacks)."""
    kwargs.setdefault("rich_markup_mode", None)
    kwargs.setdefault("pretty_exceptions_enable", False)
    kwargs.setdefault("add_completion", False)
    return typer_cls(**kwargs)


class FloraTyper(typer.Typer):
    """The root app: calling it runs ``run_app`` (so an installed ``flora.cli:app`` script
    gets the same one-line errors and exit statuses as ``flora.cli:main``)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return run_app(self, prog_name="flora")


_RST_ROLE = re.compile(r":[\w.]+:`([^`]*)`")


def plain_help(text: str | None) -> str | None:
    """Help text without RST markup: ``:func:`x```, double and single backticks -> ``x``."""
    if not text:
        return text
    return _RST_ROLE.sub(r"\1", text).replace("``", "").replace("`", "")


def _plain_params(func: Callable[..., Any] | None) -> None:
    """Strip RST markup from the help of every typer Option/Argument of ``func``."""
    from typer.models import ParameterInfo

    if func is None:
        return
    try:
        sig = inspect.signature(func, eval_str=True)
    except Exception:  # an annotation that does not evaluate: leave the help as written
        return
    for p in sig.parameters.values():
        infos = [
            m for m in getattr(p.annotation, "__metadata__", ()) if isinstance(m, ParameterInfo)
        ]
        if infos:
            # String annotations (``from __future__ import annotations``) are evaluated
            # afresh by every reader: pin the evaluated object so typer sees this one.
            func.__annotations__[p.name] = p.annotation
        if isinstance(p.default, ParameterInfo):
            infos.append(p.default)
        for info in infos:
            info.help = plain_help(info.help)


def make_plain(app: typer.Typer) -> None:
    """Make ``app`` and every sub-app registered on it plain (see ``plain_typer``).

    Help comes from docstrings written for the API docs; their RST markup (double
    backticks, roles) is removed here so that no area's ``--help`` shows it.
    """
    app.rich_markup_mode = None
    app.pretty_exceptions_enable = False
    for c in app.registered_commands:
        c.help = plain_help(c.help or inspect.getdoc(c.callback) or None)
        _plain_params(c.callback)
    if app.registered_callback is not None:
        _plain_params(app.registered_callback.callback)
    if isinstance(app.info.help, str):
        app.info.help = plain_help(app.info.help)
    for g in app.registered_groups:
        if isinstance(g.help, str):
            g.help = plain_help(g.help)
        if g.typer_instance is not None:
            make_plain(g.typer_instance)


__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_PARTIAL",
    "EXIT_STATUS_HELP",
    "EXIT_USAGE",
    "Backend",
    "Device",
    "FloraTyper",
    "JsonOpt",
    "Judge",
    "ModelRole",
    "Profile",
    "Report",
    "RewardMode",
    "StrictOpt",
    "debug_enabled",
    "dumps",
    "echo_failures",
    "failure_dicts",
    "finish_step",
    "make_backend_or_usage_error",
    "make_plain",
    "one_line",
    "parse_episodes",
    "plain_help",
    "plain_typer",
    "print_metrics",
    "report_output",
    "run_app",
    "settings_error_message",
    "settings_with_backend",
    "status_line",
    "step_exit_code",
    "step_payload",
]
