"""DESIGN §3.5: the SFT loss is summed token CE over the global batch / its token count,
identical for micro-batch x accumulation 1x4, 2x2, 4x1 and over two gloo ranks."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from tests.training.helpers import dp_worker, tiny_recipe
from training.sets import load_set
from training.sft import apply_trainable, collate, encode_items, summed_ce, train_sft

GEOMETRIES = [(1, 4), (2, 2), (4, 1)]
# Parameters after one AdamW step (lr 1e-3): the first update is lr * g / (|g| + eps), so
# float noise in a gradient element near eps moves it by a fraction of lr; 1 % of lr is
# far below any real difference (a changed batch or a skipped step moves elements by ~lr).
# The gradient's scale, which Adam hides, is checked through the global gradient norm.
PARAM_ATOL = 1e-5


def _weights(out):
    return load_file(str(out / "model" / "model" / "model.safetensors"))


@pytest.fixture(scope="module")
def reference(tiny_base, mini_set):
    """Loss and gradient norm of the whole batch in plain torch (no DeepSpeed)."""
    from transformers import AutoModelForImageTextToText

    from flora.backends.processing import load_processor

    recipe = tiny_recipe("captioner", tiny_base)
    proc = load_processor(tiny_base, "images")
    model = AutoModelForImageTextToText.from_pretrained(str(tiny_base), dtype=torch.float32)
    model, groups = apply_trainable(model, recipe)
    items = encode_items(load_set(mini_set, split="train"), proc)
    count = sum(it.n_target for it in items)
    # Per-example summed CE (each alone, no padding) -> the token-level mean.
    with torch.no_grad():
        per = [float(summed_ce(model, collate([it], proc))) for it in items]
    loss = sum(per) / count
    model.zero_grad()
    total = sum(summed_ce(model, collate([it], proc)) for it in items) / count
    total.backward()
    params = [p for g in groups for p in g["params"]]
    gnorm = float(torch.sqrt(sum((p.grad.double() ** 2).sum() for p in params)))
    mean_of_means = sum(c / it.n_target for c, it in zip(per, items, strict=True)) / len(items)
    return {"loss": loss, "grad_norm": gnorm, "mean_of_means": mean_of_means}


@pytest.fixture(scope="module")
def single_rank_runs(tiny_base, mini_set, tmp_path_factory):
    runs = {}
    for mb, gas in GEOMETRIES:
        out = tmp_path_factory.mktemp(f"mb{mb}x{gas}")
        recipe = tiny_recipe(
            "captioner", tiny_base, micro_batch=mb, grad_accum=gas, max_steps=1, eval_every=100
        )
        res = train_sft(recipe, mini_set, out, log_mlflow=False, progress=False)
        runs[(mb, gas)] = (res, _weights(out))
    return runs


def test_loss_is_the_global_token_mean(reference, single_rank_runs) -> None:
    # The test data makes the two definitions differ, so this can fail.
    assert abs(reference["mean_of_means"] - reference["loss"]) > 1e-3
    for (mb, gas), (res, _) in single_rank_runs.items():
        assert res.steps == 1
        got = res.history[0]
        assert got["loss"] == pytest.approx(reference["loss"], rel=1e-5), (mb, gas)
        assert got["grad_norm"] == pytest.approx(reference["grad_norm"], rel=1e-4), (mb, gas)


def test_same_loss_and_parameters_for_every_micro_batch_split(single_rank_runs) -> None:
    (res0, w0), *rest = single_rank_runs.values()
    for res, w in rest:
        assert res.history[0]["loss"] == pytest.approx(res0.history[0]["loss"], rel=1e-6)
        assert res.history[0]["grad_norm"] == pytest.approx(res0.history[0]["grad_norm"], rel=1e-5)
        assert w.keys() == w0.keys()
        for k in w0:
            torch.testing.assert_close(w[k], w0[k], rtol=0, atol=PARAM_ATOL)


def test_two_gloo_ranks_match_one(tiny_base, mini_set, single_rank_runs, tmp_path) -> None:
    import torch.multiprocessing as mp

    from flora.ports import free_port

    recipe = tiny_recipe(
        "captioner", tiny_base, micro_batch=1, grad_accum=2, max_steps=1, eval_every=100
    )
    out = tmp_path / "dp2"
    mp.spawn(
        dp_worker,
        args=(2, free_port(), recipe.model_dump(mode="json"), str(mini_set), str(out)),
        nprocs=2,
        join=True,
    )
    hist = json.loads((out / "result.json").read_text())
    res0, w0 = single_rank_runs[(1, 4)]
    assert hist[0]["loss"] == pytest.approx(res0.history[0]["loss"], rel=1e-6)
    assert hist[0]["grad_norm"] == pytest.approx(res0.history[0]["grad_norm"], rel=1e-5)
    w = _weights(out)
    for k in w0:
        torch.testing.assert_close(w[k], w0[k], rtol=0, atol=PARAM_ATOL)
