"""Bad option values are usage errors (exit 2, one line naming the option) and change
nothing: ``flora export lerobot`` (``--out`` with ``--in-place``, a missing ``--tables``)
and ``flora policy train`` (chunk horizon and delays)."""

from __future__ import annotations

import pytest


def _tree(root):
    """Every file under ``root`` with its size and mtime (to see that nothing changed)."""
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
    }


def test_export_out_with_in_place_is_refused_and_writes_nothing(run_flora, tmp_path):
    from flora.data.synth import generate

    # A dataset of its own: the old behaviour modified the source in place.
    src = generate(tmp_path / "src", episodes=1, seed=1, durations_s=[2.0], image_size=32,
                   wrist_size=32, progress=False)  # fmt: skip
    before = _tree(src)
    out = tmp_path / "wanted_out"
    code, _, err = run_flora("export", "lerobot", src, "--out", out, "--in-place")
    assert code == 2, err
    assert "--out" in err and "--in-place" in err and "exclusive" in err
    assert _tree(src) == before and not out.exists()


def test_export_missing_tables_is_a_usage_error(run_flora, tiny_dataset, tmp_path):
    out = tmp_path / "exp"
    code, _, err = run_flora("export", "lerobot", tiny_dataset, "--out", out,
                             "--tables", tmp_path / "no" / "such" / "tables")  # fmt: skip
    assert code == 2, err
    assert "'--tables'" in err and "does not exist" in err
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--horizon", "0"], "--horizon"),
        (["--max-delay", "0"], "--max-delay"),
        (["--horizon", "4", "--max-delay", "4"], "--max-delay"),
        (["--recipe", "toy", "--max-delay", "16"], "--max-delay"),  # the recipe's horizon 16
        (["--hidden", "6"], "--hidden"),  # 4 attention heads
    ],
)
def test_policy_train_bad_chunk_options_are_usage_errors(
    run_flora, tiny_dataset, tmp_path, args, names
):
    out = tmp_path / "pol"
    # --max-steps 1: should an option slip through, the run stays short.
    code, _, err = run_flora("policy", "train", "--dataset", tiny_dataset, "--out", out,
                             "--no-mlflow", "--max-steps", "1", *args)  # fmt: skip
    assert code == 2, err
    assert names in err and "internal error" not in err
    assert not out.exists()


def test_policy_bench_levels_without_kinetix_is_a_usage_error(run_flora, tmp_path):
    """``--levels`` belongs to ``--env kinetix``: without it the option was ignored and a
    full pursuit benchmark started."""
    out = tmp_path / "bench"
    code, _, err = run_flora("policy", "bench", "--quick", "--levels", "l/grasp_easy",
                             "--out", out)  # fmt: skip
    assert code == 2, err
    assert "--levels" in err and "--env kinetix" in err
    assert not out.exists()
