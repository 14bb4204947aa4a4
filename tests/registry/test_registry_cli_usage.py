"""``flora registry`` usage errors (exit 2): an ``--overlay`` that is not one of
``infra/overlays``, and a bad ``FLORA_*`` setting (not swallowed as a registry error)."""

from __future__ import annotations

import pytest


@pytest.fixture
def run_registry(isolated_home, monkeypatch, capsys):
    """``run_registry(*args) -> (code, stderr)`` through ``run_app``, as the script runs."""
    from flora.cli import app
    from flora.cli_common import run_app

    monkeypatch.delenv("FLORA_DEBUG", raising=False)

    def run(*args: str) -> tuple[int, str]:
        capsys.readouterr()
        code = run_app(app, ["registry", *args])
        return code, capsys.readouterr().err

    return run


def test_deploy_unknown_overlay_is_a_usage_error_listing_the_overlays(run_registry, tmp_path):
    from model_registry.manifests import INFRA

    overlays = sorted(p.name for p in (INFRA / "overlays").iterdir() if p.is_dir())
    assert {"dev", "prod"} <= set(overlays)
    out = tmp_path / "isvc.yaml"
    code, err = run_registry("deploy", "segmenter", "champion", "--overlay", "staging",
                             "--no-apply", "--out", str(out))  # fmt: skip
    assert code == 2, err
    assert "'--overlay'" in err and "'staging'" in err
    assert all(f"'{o}'" in err for o in overlays)
    assert not out.exists()


def test_bad_setting_is_not_reported_as_a_registry_error(run_registry, monkeypatch):
    from flora.settings import get_settings

    monkeypatch.setenv("FLORA_POD_SECRETS", "flora-object-store,flora-hf")  # not JSON
    get_settings.cache_clear()
    code, err = run_registry("list", "segmenter")
    assert code == 2, err
    assert "FLORA_POD_SECRETS" in err


def test_an_infra_tree_without_a_dev_overlay_still_imports(tmp_path, monkeypatch):
    """The overlay choice is built from infra/overlays at import and defaulted to ``dev``:
    a tree with only ``prod`` made ``import model_registry.cli`` (so every ``flora``
    command) fail with ValueError."""
    import importlib
    import sys

    import model_registry.manifests as manifests

    (tmp_path / "overlays" / "prod").mkdir(parents=True)
    (tmp_path / "overlays" / "prod" / "kustomization.yaml").write_text("{}")
    monkeypatch.setattr(manifests, "INFRA", tmp_path)
    monkeypatch.delitem(sys.modules, "model_registry.cli")
    cli = importlib.import_module("model_registry.cli")
    assert [o.value for o in cli.Overlay] == ["prod"] and cli.DEFAULT_OVERLAY == "prod"
    monkeypatch.delitem(sys.modules, "model_registry.cli")  # the real tree's, next import
