"""Every ``--help`` is plain text: no RST backticks, no rich boxes; choices are listed."""

from __future__ import annotations

from typing import Annotated

import typer
from typer.main import get_command

from flora.cli import app
from flora.cli_common import make_plain, plain_typer


def _walk(cmd, path):
    yield path, cmd
    for name, sub in sorted(getattr(cmd, "commands", {}).items()):
        yield from _walk(sub, [*path, name])


def _help_texts() -> dict[str, str]:
    root = get_command(app)
    texts = {}
    for path, cmd in _walk(root, ["flora"]):
        ctx = None
        for i, name in enumerate(path):  # a parent chain so usage lines read "flora x y"
            c = root if i == 0 else ctx.command.commands[name]  # type: ignore[union-attr]
            ctx = c.make_context(name, ["--help"], parent=ctx, resilient_parsing=True)
        assert ctx is not None and ctx.command is cmd
        texts[" ".join(path)] = cmd.get_help(ctx)
    return texts


def test_every_help_is_plain_text():
    texts = _help_texts()
    # the areas the CLI is built from are all registered
    for name in ("flora segment", "flora caption", "flora reward outcome", "flora validate",
                 "flora eval segment", "flora synth", "flora policy train"):  # fmt: skip
        assert name in texts
    bad = {name: text for name, text in texts.items() if "`" in text}
    assert not bad, f"RST backticks in --help of {sorted(bad)}"
    boxed = sorted(name for name, text in texts.items() if "╭" in text or "│" in text)
    assert not boxed, f"rich boxes in --help of {boxed}"


def test_choices_and_exit_rule_shown():
    texts = _help_texts()
    assert "standard|long_horizon" in texts["flora segment"]
    assert "kinematic|transformers|openai" in texts["flora segment"]
    assert "kinematic|transformers|openai" in texts["flora reward dense"]
    assert "embedding|llm" in texts["flora eval caption"]
    assert "v3.0|v2.1|mp4" in texts["flora synth"]
    assert "exp|uniform" in texts["flora policy train"]
    assert "qwen3_vl|qwen2_5_vl|qwen3_5" in texts["flora tiny-model"]
    root = texts["flora"]
    for line in ("0  every item good", "3  some items failed", "2  usage error", "--strict"):
        assert line in root
    assert "--json PATH|-" in texts["flora segment"] and "--strict" in texts["flora caption"]


def test_help_through_the_script(flora):
    r = flora("reward", "rubric", "--help")
    assert r.code == 0 and "--rubric" in r.out and "`" not in r.out and r.err == ""


def test_make_plain_strips_rst_from_any_area():
    """An area that registers RST docstrings still gets plain --help (the safety net)."""
    root = plain_typer()
    sub = typer.Typer(help="Group of ``things``.")
    root.add_typer(sub, name="sub")

    @sub.command("run")
    def run(
        x: Annotated[int, typer.Option(help="Rows of ``events`` (:class:`Table`).")] = 1,
        y: str = typer.Option("a", help="See `docs`."),
    ) -> None:
        """Write the ``outcome`` table via :func:`flora.reward.run.outcome_dataset`."""

    @sub.command("other")
    def other() -> None:
        """Other."""

    make_plain(root)
    cmd = get_command(root)
    ctx = cmd.make_context("flora", ["--help"], resilient_parsing=True)
    sub_cmd = cmd.commands["sub"]
    sctx = sub_cmd.make_context("sub", ["--help"], parent=ctx, resilient_parsing=True)
    rctx = sub_cmd.commands["run"].make_context("run", ["--help"], parent=sctx,
                                                resilient_parsing=True)  # fmt: skip
    text = sub_cmd.get_help(sctx) + sub_cmd.commands["run"].get_help(rctx)
    assert "`" not in text
    assert "Group of things." in text and "Write the outcome table via flora.reward" in text
    assert "Rows of events (Table)." in text and "See docs." in text


def test_choice_enums_match_the_library():
    """The CLI's choices are the library's own sets (a new one must be added to both)."""
    from typing import get_args

    from flora.backends.cli import Family
    from flora.backends.tiny import FAMILIES
    from flora.cli_common import Backend, Profile, RewardMode
    from flora.data.cli import Layout
    from flora.data.synth import LAYOUTS
    from flora.policy.cli import Recipe
    from flora.policy.recipes import recipe_names
    from flora.reward.run import TABLES
    from flora.segment.plan import PROFILES
    from flora.settings import FloraSettings

    assert tuple(Family) == FAMILIES and tuple(Layout) == LAYOUTS
    assert sorted(Recipe) == recipe_names() and list(RewardMode) == list(TABLES)
    assert set(Profile) == set(PROFILES)
    assert set(Backend) == set(get_args(FloraSettings.model_fields["backend"].annotation))
