"""The registered policy's MLflow pyfunc ``predict``: prefix and ``d`` per input row."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from flora.policy.configuration_dit import DiTConfig
from flora.policy.lerobot import TrainedPolicy
from flora.policy.modeling_dit import DiTActionExpert

pytest.importorskip("mlflow")

H, A = 8, 2
STATE = json.dumps([0.1, 0.2, 0.3])
PREFIX = [[5.0, -5.0], [5.0, -5.0]]  # far from anything the model outputs


@pytest.fixture(scope="module")
def model():
    from flora.policy.registry import _pyfunc_class

    torch.manual_seed(0)
    cfg = DiTConfig(
        action_dim=A, horizon=H, state_dim=3, lang_vocab=64, hidden=32, depth=1, heads=2
    )
    net = DiTActionExpert(cfg)
    for p in net.parameters():  # non-trivial outputs
        torch.nn.init.normal_(p, std=0.3)
    net.eval()
    stats = {"state_mean": [0.0] * 3, "state_std": [1.0] * 3}
    stats |= {"action_mean": [0.0] * A, "action_std": [1.0] * A}
    fp = _pyfunc_class()()
    fp.policy = TrainedPolicy(net, stats, {"train_config": {"denoise_steps": 2}})
    return fp


def _predict(fp, rows: list[dict], seed: int = 1) -> list[np.ndarray]:
    torch.manual_seed(seed)
    out = fp.predict(None, pd.DataFrame(rows))
    return [np.array(json.loads(c)) for c in out["chunk"]]


def _row(**kw) -> dict:
    return {"state": STATE, "text": "t", **kw}


def test_prefix_without_d_commits_every_given_action(model):
    """A prefix with no ``d`` is committed whole (d = len(prefix)), as with ``d`` given;
    it used to be silently ignored (d defaulted to 0: plain sampling)."""
    (given,) = _predict(model, [_row(prefix=json.dumps(PREFIX), d=2)])
    (implied,) = _predict(model, [_row(prefix=json.dumps(PREFIX))])
    (plain,) = _predict(model, [_row()])
    assert np.allclose(given[:2], PREFIX) and np.allclose(implied[:2], PREFIX)
    assert np.allclose(implied, given)
    assert not np.allclose(plain[:2], PREFIX)


def test_batch_with_and_without_prefix(model):
    """pandas fills NaN for the rows that lack ``prefix``/``d``: those rows sample plainly
    (it used to be a bare TypeError from json.loads)."""
    chunks = _predict(model, [_row(prefix=json.dumps(PREFIX), d=2), _row(), _row(d=None)])
    assert len(chunks) == 3 and all(c.shape == (H, A) for c in chunks)
    assert np.allclose(chunks[0][:2], PREFIX)
    assert not np.allclose(chunks[1][:2], PREFIX)
    # NaN d with a prefix: every given action committed.
    (c,) = _predict(model, [_row(prefix=json.dumps(PREFIX), d=float("nan"))])
    assert np.allclose(c[:2], PREFIX)


def test_d_without_prefix_is_an_error_naming_row_and_field(model):
    """``d > 0`` with no prefix used to be plain sampling, silently."""
    with pytest.raises(ValueError, match=r"row 1, field 'd'.*no 'prefix'"):
        _predict(model, [_row(), _row(d=2)])
    with pytest.raises(ValueError, match=r"row 0, field 'd'.*no 'prefix'"):
        _predict(model, [_row(prefix="[]", d=1)])
    (c,) = _predict(model, [_row(d=0)])  # d = 0 needs nothing
    assert c.shape == (H, A)


@pytest.mark.parametrize(
    ("row", "match"),
    [
        (_row(prefix="[[1.0, 2.0"), r"row 1, field 'prefix': not a JSON"),
        (_row(prefix=json.dumps([[1.0, 2.0, 3.0]])), r"row 1, field 'prefix': must be \(d, A=2\)"),
        (_row(prefix=json.dumps(PREFIX), d=3), r"row 1, field 'd': d=3 exceeds the 2 actions"),
        (_row(prefix=json.dumps(PREFIX), d=-1), r"row 1, field 'd': must be an integer >= 0"),
        (_row(prefix=json.dumps(PREFIX), d=1.5), r"row 1, field 'd': must be an integer >= 0"),
        # d = len(prefix) = 5 > H - max(d, 1) = 3: the prefix is what is too long.
        (_row(prefix=json.dumps([[0.0, 0.0]] * 5)), r"row 1, field 'prefix': d=5 .*at most 4"),
        (_row(prefix=json.dumps([[0.0, 0.0]] * 6), d=5), r"row 1, field 'd': d=5 .*at most 4"),
        (_row(state="[0.1, "), r"row 1, field 'state'"),
        # A state of another length than state_dim = 3: length 1 was broadcast silently,
        # others failed as a bare numpy error naming neither row nor field.
        (_row(state="[0.5]"), r"row 1, field 'state': expected 3 values .*got 1"),
        (_row(state=json.dumps([0.1] * 6)), r"row 1, field 'state': expected 3 values .*got 6"),
        (_row(state=json.dumps([[0.1, 0.2, 0.3]])), r"row 1, field 'state': must be a flat"),
    ],
)
def test_bad_rows_name_row_and_field(model, row, match):
    with pytest.raises(ValueError, match=match):
        _predict(model, [_row(), row])


def test_largest_committed_prefix_is_accepted(model):
    """d = H // 2 is the most ``d <= H - max(d, 1)`` allows."""
    prefix = [[float(i), -float(i)] for i in range(H // 2)]
    (c,) = _predict(model, [_row(prefix=json.dumps(prefix))])
    assert np.allclose(c[: H // 2], prefix)


def test_policy_eval_sets_tell_hub_revisions_apart(tmp_path, monkeypatch):
    """Two policies scored on the same episode numbers of two revisions of a Hub dataset
    were scored on other data: their eval-set fingerprints differ; the same local folder
    reached by two spellings is the same data."""
    from flora.policy.registry import policy_eval_set
    from model_registry.promotion import EVAL_SET_TAG

    rep = {"episodes": [3, 4], "chunks": 240, "seed": 0}

    def fp(dataset):
        return policy_eval_set(rep, dataset)[EVAL_SET_TAG]

    assert fp("lerobot/pusht@v1.0") != fp("lerobot/pusht@v2.0")
    assert fp("lerobot/pusht@v1.0") == fp("lerobot/pusht@v1.0")
    local = tmp_path / "pusht"
    local.mkdir()
    monkeypatch.chdir(tmp_path)
    assert fp(str(local)) == fp("pusht") == fp("./pusht")
    assert fp(str(local)) != fp("lerobot/pusht@v1.0")
    assert fp(str(local)) != policy_eval_set({**rep, "seed": 1}, str(local))[EVAL_SET_TAG]


def test_policy_eval_sets_tell_apart_evaluations_that_measured_other_things():
    """Same checkpoint, same episodes: evaluations with another horizon, other delays,
    other denoising steps, captions, other dataset content or the old metric definition
    shared one fingerprint while their postfix_mse measured other things."""
    from flora.policy.registry import policy_eval_set
    from model_registry.promotion import EVAL_SET_TAG

    rows = [{"d": d, "method": "training_time", "postfix_mse": 1.0} for d in (0, 1, 2)]
    rep = {"dataset": "toy_world", "episodes": [2, 3], "chunks": 64, "seed": 0, "rows": rows,
           "horizon": 8, "steps": 5, "metric_version": 2, "dataset_sha256": "a" * 64,
           "events_sha256": None}  # fmt: skip

    def fp(**kw):
        return policy_eval_set({**rep, **kw}, "toy_world")[EVAL_SET_TAG]

    base = fp()
    assert base == fp()
    other_delays = [{**r, "d": r["d"] + 2} for r in rows]
    for changed in (
        fp(horizon=16),
        fp(rows=other_delays),
        fp(steps=1),
        fp(events_sha256="e" * 64),
        fp(dataset_sha256="b" * 64),
        fp(metric_version=1),
    ):
        assert changed != base
    # A report from before these were recorded never pairs with a current one.
    new_keys = ("horizon", "metric_version", "dataset_sha256", "events_sha256")
    legacy = {k: v for k, v in rep.items() if k not in new_keys}
    assert policy_eval_set(legacy, "toy_world")[EVAL_SET_TAG] != base
