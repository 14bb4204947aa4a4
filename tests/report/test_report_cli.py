"""``flora report`` names the dataset as ``flora curate`` does (``dataset_name``)."""

from __future__ import annotations

from typer.testing import CliRunner


def test_report_finds_the_mixture_of_a_hub_dataset(tmp_path, monkeypatch):
    """`flora curate org/toy@v1` writes curated/toy/; the report looked in curated/toy@v1/
    and reported no mixture without a word."""
    import flora.report.html as html
    from flora.cli import app
    from flora.curate.run import mixture_path

    # Where `flora curate org/toy@v1` puts it (test_filter's hub-dataset test checks that).
    mix = mixture_path(tmp_path / "t", "toy")
    mix.parent.mkdir(parents=True)
    mix.touch()
    seen = {}

    def fake_build(dataset, tables, out, **kw):  # the CLI's hand-off is under test
        seen.update(kw, out=out)
        return type("R", (), {"index": "stub"})()

    monkeypatch.setattr(html, "build_reports", fake_build)
    r = CliRunner().invoke(app, ["report", "org/toy@v1", "--tables", str(tmp_path / "t")])
    assert r.exit_code == 0, r.output
    assert seen["mixture"] == mix
    assert seen["out"] == tmp_path / "t" / "reports" / "toy"


def test_run_page_title_names_the_dataset_as_curate_does(tiny_dataset, tmp_path, monkeypatch):
    """`flora report .` from inside the dataset: the title had no name (`Path('.').name`)."""
    from flora.report.html import build_reports

    monkeypatch.chdir(tiny_dataset)
    res = build_reports(".", tmp_path / "empty", tmp_path / "r", thumbnails=False,
                        max_episode_pages=0)  # fmt: skip
    assert "<title>Flora run report toy_tiny</title>" in res.index.read_text()


def test_a_missing_tables_root_is_a_usage_error(tmp_path):
    """`--tables` that does not exist made an empty report (exit 0) and an empty-mixture
    error from curate that blamed the rules: it is an input path, checked like the others."""
    from flora.cli import app
    from flora.cli_common import run_app

    missing = str(tmp_path / "no-such-tables")
    for cmd in (["report", "ds", "--tables", missing], ["curate", "ds", "--tables", missing]):
        assert run_app(app, cmd) == 2, cmd
    assert not (tmp_path / "no-such-tables").exists()
