"""Checkpoints: exact resume, NaN stop keeps the last good one, foreign/corrupt refused,
half-written never latest, another run's never pruned, world size and base family checked."""

from __future__ import annotations

import shutil

import pytest
import torch

import training.sft as sft
from tests.training.helpers import tiny_recipe
from training.sft import CheckpointError, DivergedError, TrainingError, train_sft


def _recipe(base, **kw):
    # Constant lr would hide a scheduler that is not restored: use warmup + cosine.
    kw = {
        "max_steps": 4,
        "checkpoint_every": 2,
        "eval_every": 100,
        "warmup_steps": 2,
        "scheduler": "cosine",
        **kw,
    }
    return tiny_recipe("captioner", base, **kw)


@pytest.fixture(scope="module")
def straight(tiny_base, mini_set, tmp_path_factory):
    """4 uninterrupted steps."""
    out = tmp_path_factory.mktemp("straight")
    return train_sft(_recipe(tiny_base), mini_set, out, log_mlflow=False, progress=False)


@pytest.fixture(scope="module")
def cut(tiny_base, mini_set, tmp_path_factory):
    """The same run stopped after 3 steps (checkpoints at 2 and at the cut, 3)."""
    out = tmp_path_factory.mktemp("cut")
    res = train_sft(
        _recipe(tiny_base), mini_set, out, max_steps=3, log_mlflow=False, progress=False
    )
    return out, res


def test_resume_reproduces_the_next_loss_bit_for_bit(
    straight, cut, tiny_base, mini_set, tmp_path
) -> None:
    out, res = cut
    assert [h["loss"] for h in res.history] == [h["loss"] for h in straight.history[:3]]
    work = tmp_path / "resumed"
    shutil.copytree(out, work)
    resumed = train_sft(
        _recipe(tiny_base), mini_set, work, resume=True, log_mlflow=False, progress=False
    )
    assert resumed.steps == 4
    assert resumed.history[-1]["loss"] == straight.history[3]["loss"]  # exact, not approx
    # Distinct losses per step: the data order and the lr schedule moved on.
    assert len({h["loss"] for h in straight.history}) == 4


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(
    tiny_base, mini_set, tmp_path, monkeypatch
) -> None:
    calls = {"n": 0}
    real = sft.summed_ce

    def poisoned(model, batch):
        calls["n"] += 1
        ce = real(model, batch)
        return ce * float("nan") if calls["n"] > 5 else ce  # step 3, 1st micro-batch

    monkeypatch.setattr(sft, "summed_ce", poisoned)
    with pytest.raises(DivergedError, match="not finite at step 3.*step2"):
        train_sft(_recipe(tiny_base), mini_set, tmp_path, log_mlflow=False, progress=False)
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step*")) == ["step2"]
    sft.verify_checkpoint(
        tmp_path / "checkpoints" / "step2",
        model="captioner",
        recipe_digest=_recipe(tiny_base).digest(),
        base_id=_base_id(tmp_path),
    )
    assert not (tmp_path / "model").exists()  # nothing exported after a divergence


def _base_id(out):
    import json

    return json.loads((out / "checkpoints" / "step2" / sft.CHECKPOINT_MANIFEST).read_text())["base"]


def test_foreign_checkpoint_is_refused(cut, tiny_base, mini_set, tmp_path) -> None:
    out, _ = cut
    work = tmp_path / "w"
    shutil.copytree(out, work)
    foreign = work / "checkpoints" / "step9"
    foreign.mkdir()
    torch.save({"module": {}}, foreign / "mp_rank_00_model_states.pt")
    # Never the latest (a retry resumes from step3); resuming from it by name is refused.
    assert sft.latest_checkpoint(work / "checkpoints") == work / "checkpoints" / "step3"
    with pytest.raises(CheckpointError, match="no flora_checkpoint.json.*foreign"):
        train_sft(
            _recipe(tiny_base), mini_set, work, resume=foreign, log_mlflow=False, progress=False
        )


class _Killed(Exception):
    """Stands for the process dying."""


def test_a_checkpoint_cut_off_while_saving_leaves_the_last_complete_one_to_resume(
    tiny_base, mini_set, tmp_path, monkeypatch
) -> None:
    real = sft._files

    def dying(root):  # killed after DeepSpeed wrote step3, before its manifest
        if "step3" in root.name:
            raise _Killed
        return real(root)

    monkeypatch.setattr(sft, "_files", dying)
    r = _recipe(tiny_base, checkpoint_every=1)
    with pytest.raises(_Killed):
        train_sft(r, mini_set, tmp_path, log_mlflow=False, progress=False)
    monkeypatch.undo()
    ckpts = tmp_path / "checkpoints"
    assert sorted(p.name for p in ckpts.glob("step*")) == ["step1", "step2"]
    assert sft.latest_checkpoint(ckpts) == ckpts / "step2"
    # What training.pipeline.sft does on a retry: resume when there is a latest checkpoint.
    res = train_sft(r, mini_set, tmp_path, resume=True, log_mlflow=False, progress=False)
    assert res.steps == 4
    sft.verify_checkpoint(
        ckpts / "step3", model="captioner", recipe_digest=r.digest(), base_id=_base_id(tmp_path)
    )


def test_a_new_run_refuses_a_folder_with_another_runs_checkpoints(
    cut, tiny_base, mini_set, tmp_path
) -> None:
    out, _ = cut
    work = tmp_path / "w"
    shutil.copytree(out, work)
    ckpts = work / "checkpoints"
    before = {p.name: sft._files(p) for p in ckpts.glob("step*")}
    with pytest.raises(TrainingError, match=r"already holds checkpoints .*\(step2, step3\)"):
        train_sft(
            _recipe(tiny_base, lr=2e-3),
            mini_set,
            work,
            max_steps=2,
            log_mlflow=False,
            progress=False,
        )
    assert {p.name: sft._files(p) for p in ckpts.glob("step*")} == before


def test_pruning_removes_only_this_runs_older_checkpoints(tiny_base, mini_set, tmp_path) -> None:
    r = _recipe(tiny_base, checkpoint_every=1, keep_checkpoints=1)
    train_sft(r, mini_set, tmp_path, max_steps=1, log_mlflow=False, progress=False)
    ckpts = tmp_path / "checkpoints"
    shutil.copytree(ckpts / "step1", ckpts / "step7")  # a later step: not this run's past
    train_sft(
        r, mini_set, tmp_path, resume=ckpts / "step1", max_steps=2, log_mlflow=False, progress=False
    )
    assert sorted(p.name for p in ckpts.glob("step*")) == ["step2", "step7"]


def test_a_non_finite_held_out_loss_stops_before_saving_or_exporting(
    tiny_base, mini_set, tmp_path, monkeypatch
) -> None:
    real, calls = sft.evaluate_loss, {"n": 0}

    def nan_at_step_2(*args, **kw):
        calls["n"] += 1
        ev = real(*args, **kw)
        return float("nan") if calls["n"] == 2 else ev

    monkeypatch.setattr(sft, "evaluate_loss", nan_at_step_2)
    r = _recipe(tiny_base, eval_every=1, checkpoint_every=1)
    with pytest.raises(DivergedError, match="held-out loss is not finite at step 2.*step1"):
        train_sft(r, mini_set, tmp_path, log_mlflow=False, progress=False)
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step*")) == ["step1"]
    assert not (tmp_path / "model").exists()


def test_resume_under_another_world_size_is_refused(cut, tiny_base, mini_set, tmp_path) -> None:
    import json

    out, _ = cut
    work = tmp_path / "w"
    shutil.copytree(out, work)
    man_path = work / "checkpoints" / "step3" / sft.CHECKPOINT_MANIFEST
    man = json.loads(man_path.read_text())
    assert man["world_size"] == 1
    man_path.write_text(json.dumps({**man, "world_size": 2}))  # as if two ranks wrote it
    with pytest.raises(CheckpointError, match="world size 2, this run has world size 1"):
        train_sft(_recipe(tiny_base), mini_set, work, resume=True, log_mlflow=False, progress=False)


def test_a_base_of_another_family_than_the_recipes_is_refused(
    tiny_base, mini_set, tmp_path
) -> None:
    with pytest.raises(TrainingError, match="family 'qwen2_5_vl' needs .*'qwen2_5_vl'.*'qwen3_vl'"):
        r = _recipe(tiny_base, family="qwen2_5_vl")
        train_sft(r, mini_set, tmp_path, log_mlflow=False, progress=False)
    assert not (tmp_path / "checkpoints").exists()


def test_corrupt_checkpoint_is_refused(cut, tiny_base, mini_set, tmp_path) -> None:
    out, _ = cut
    work = tmp_path / "w"
    shutil.copytree(out, work)
    f = work / "checkpoints" / "step3" / "mp_rank_00_model_states.pt"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0xFF
    f.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupt: mp_rank_00_model_states.pt"):
        train_sft(_recipe(tiny_base), mini_set, work, resume=True, log_mlflow=False, progress=False)


def test_checkpoint_of_another_recipe_is_refused(cut, tiny_base, mini_set, tmp_path) -> None:
    out, _ = cut
    work = tmp_path / "w"
    shutil.copytree(out, work)
    with pytest.raises(CheckpointError, match="another recipe"):
        train_sft(
            _recipe(tiny_base, lr=5e-4),
            mini_set,
            work,
            resume=True,
            log_mlflow=False,
            progress=False,
        )


def test_bad_inputs_are_clear_errors(tiny_base, mini_set, tmp_path) -> None:
    from tests.training.helpers import mini_examples, write_set

    held_only = write_set(tmp_path / "held", [e for e in mini_examples() if e.split == "heldout"])
    with pytest.raises(TrainingError, match="no train examples"):
        train_sft(_recipe(tiny_base), held_only, tmp_path / "a", log_mlflow=False)
    with pytest.raises(TrainingError, match="missing base"):
        train_sft(
            _recipe(tmp_path / "nope"),
            mini_set,
            tmp_path / "b",
            log_mlflow=False,
        )
    with pytest.raises(TrainingError, match="not only 'segmenter'"):
        train_sft(tiny_recipe("segmenter", tiny_base), mini_set, tmp_path / "c", log_mlflow=False)
    # A processor from another model: the qwen2.5-vl tiny checkpoint's processor files.
    from flora.backends.tiny import build_tiny_vlm

    other = build_tiny_vlm(tmp_path / "q25", family="qwen2_5_vl", overwrite=True)
    mixed = tmp_path / "mixed"
    shutil.copytree(tiny_base, mixed)
    for name in ("processor_config.json",):
        shutil.copy(other / name, mixed / name)
    with pytest.raises(TrainingError, match="processor does not match the model"):
        train_sft(_recipe(mixed), mini_set, tmp_path / "d", log_mlflow=False)


def _set_with_manifest(path, n_heldout):
    import json

    from tests.training.helpers import mini_examples, write_set

    exs = mini_examples(n_heldout=n_heldout)
    s = write_set(path, exs)
    eps = {sp: sorted({e.episode_id for e in exs if e.split == sp}) for sp in ("train", "heldout")}
    (s / "manifest.json").write_text(json.dumps({"episodes": eps}))
    return s


def test_the_held_out_examples_that_chose_the_export_are_recorded(tiny_base, tmp_path) -> None:
    """SFT keeps its best held-out state: the episodes whose loss chose it are recorded in
    the export (``selected_on``, GRPO's format) and evaluation leaves them out."""
    import json

    from training.evaluate import unseen_heldout
    from training.lineage import trained_episodes

    s = _set_with_manifest(tmp_path / "set", n_heldout=3)  # held out: mini/000004..000006
    r = _recipe(tiny_base, max_steps=2, eval_every=1, eval_examples=1, scheduler="constant",
                warmup_steps=0)  # fmt: skip
    res = train_sft(r, s, tmp_path / "out", log_mlflow=False, progress=False)
    man = json.loads((res.model_dir / "flora_model.json").read_text())
    sel = man["selected_on"]
    assert sel["episodes"] == ["mini/000006"]  # the last eval_examples held-out examples
    assert sel["metric"] == "eval_loss" and sel["kept_step"] in (1, 2)
    assert sel["value"] == pytest.approx(res.best_eval_loss)
    assert "mini/000006" in trained_episodes(res.model_dir)
    unseen = {e.episode_id for e in unseen_heldout("captioner", s, res.model_dir).examples}
    assert unseen == {"mini/000004", "mini/000005"}

    # One evaluation (at the last step) chose nothing: the export is the last state.
    once = _recipe(tiny_base, max_steps=2, eval_every=100, eval_examples=1,
                   scheduler="constant", warmup_steps=0)  # fmt: skip
    res1 = train_sft(once, s, tmp_path / "once", log_mlflow=False, progress=False)
    assert res1.best_eval_loss is not None
    assert "selected_on" not in json.loads((res1.model_dir / "flora_model.json").read_text())
    assert len(unseen_heldout("captioner", s, res1.model_dir).examples) == 3


def test_sft_eval_pool_leaves_the_first_held_out_episode_to_evaluation():
    """The examples that choose SFT's export are recorded as seen, so evaluation (whole
    episodes from the front) would have nothing left if the pool covered every held-out
    episode, as the demo's rewarder set (two held-out episodes, 14 examples) did."""
    from types import SimpleNamespace

    from training.sft import sft_eval_pool

    held = [SimpleNamespace(episode_id=f"w/{i // 7:06d}", k=i) for i in range(14)]
    pool = sft_eval_pool(held, SimpleNamespace(eval_examples=32))
    assert {e.episode_id for e in pool} == {"w/000001"} and len(pool) == 7
    assert [e.k for e in sft_eval_pool(held, SimpleNamespace(eval_examples=3))] == [11, 12, 13]
    one = held[:7]  # one held-out episode: nothing can be kept apart
    assert sft_eval_pool(one, SimpleNamespace(eval_examples=None)) == one


def test_rng_state_carries_the_gpu_generator_and_reads_older_checkpoints(monkeypatch) -> None:
    """A checkpoint holds the device generator where there is one (dropout on a GPU draws
    from it, so a resume without it takes other masks); checkpoints written on CPU or before
    it was saved carry none and still restore."""
    import torch

    from training import sft

    device_state = {"state": torch.tensor([1, 2, 3], dtype=torch.uint8)}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda: device_state["state"].clone())
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda s: device_state.update(state=s))
    saved = sft._rng_state()
    assert torch.equal(saved["cuda"], torch.tensor([1, 2, 3], dtype=torch.uint8))
    device_state["state"] = torch.tensor([9], dtype=torch.uint8)
    sft._set_rng_state(saved)
    assert torch.equal(device_state["state"], torch.tensor([1, 2, 3], dtype=torch.uint8))
    older = {k: v for k, v in saved.items() if k != "cuda"}
    device_state["state"] = torch.tensor([9], dtype=torch.uint8)
    sft._set_rng_state(older)  # nothing to restore on the device: left as it is
    assert torch.equal(device_state["state"], torch.tensor([9], dtype=torch.uint8))
