"""GRPO's held-out probe: greedy answers scored by the reward, the best state exported, the
episodes that chose it recorded and never scored."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import torch
from safetensors.torch import load_file

from flora.backends.base import VLMRequest, VLMResponse
from flora.segment.plan import LocalSegment
from tests.training.helpers import tiny_recipe
from training.grpo import GRPOConfig, GRPOPrompt, train_grpo
from training.grpo_probe import BestState, ProbeResult, probe_episode_ids, probe_policy
from training.sets import load_set


class Answers:
    """A rollout backend: each request answered by ``answer(base id, suffix, probe count)``."""

    name = "answers"
    model_version = "answers"

    def __init__(self, answer: Callable[[str, str, int], str | None]):
        self.answer = answer
        self.requests: list[VLMRequest] = []
        self.probes = 0

    def generate(self, requests):
        self.requests.extend(requests)
        probe = any(r.request_id.endswith("#probe") for r in requests)
        out = []
        for r in requests:
            base, suffix = r.request_id.rsplit("#", 1)
            text = self.answer(base, suffix, self.probes)
            out.append(VLMResponse("", error="pod down") if text is None else VLMResponse(text))
        self.probes += probe
        return out


def _prompt(i: int, regex: str | None = "[0-9 \\n]+") -> GRPOPrompt:
    req = VLMRequest(prompt=f"w{i}", images=[], frame_times_us=[], request_id=f"w{i}",
                     temperature=1.0, seed=7, guided_regex=regex)  # fmt: skip
    return GRPOPrompt("segmenter", req, f"w{i}", n_ticks=40,
                      reference=[LocalSegment(0, 40, True, True)])  # fmt: skip


def test_probe_episodes_are_the_last_held_out_ids():
    ids = ["toy/000007", "toy/000002", "toy/000009", "toy/000002", "toy/000004"]
    assert probe_episode_ids(ids, 2) == ["toy/000007", "toy/000009"]
    assert probe_episode_ids(ids, 10) == ["toy/000002", "toy/000004", "toy/000007", "toy/000009"]
    with pytest.raises(ValueError, match="probe_episodes"):
        probe_episode_ids(ids, 0)


@pytest.mark.parametrize("guided", [False, True])
def test_probe_answers_greedily_and_scores_with_the_reward(guided):
    # w0 right (1), w1 unparseable (0), w2 a transport failure (left out), w3 a half match.
    texts = {"w0": "0 40 1 1", "w1": "forty", "w2": None, "w3": "0 20 1 0"}
    backend = Answers(lambda base, suffix, n: texts[base])
    res = probe_policy(3, backend, [_prompt(i) for i in range(4)], max_new_tokens=12,
                       guided=guided)  # fmt: skip
    assert [r.temperature for r in backend.requests] == [0.0] * 4
    assert {r.seed for r in backend.requests} == {None}
    assert {r.max_new_tokens for r in backend.requests} == {12}
    assert {r.guided_regex for r in backend.requests} == {"[0-9 \\n]+" if guided else None}
    assert res.step == 3 and res.answers == 3
    assert res.parse_rate == pytest.approx(2 / 3)
    half = probe_policy(0, Answers(lambda *_: "0 20 1 0"), [_prompt(3)], max_new_tokens=12,
                        guided=False).reward  # fmt: skip
    assert 0.0 < half < 1.0
    assert res.reward == pytest.approx((1.0 + 0.0 + half) / 3)
    # Two ranks' shares summed: the same result on both.
    totals = iter([2.0, 2.0, 3.0])
    split = probe_policy(3, Answers(lambda *_: "0 40 1 1"), [_prompt(0)], max_new_tokens=12,
                         guided=False, all_sum=lambda v: next(totals))  # fmt: skip
    assert (split.reward, split.parse_rate, split.answers) == (pytest.approx(2 / 3),) * 2 + (3,)
    with pytest.raises(RuntimeError, match="no probe answer"):
        probe_policy(5, Answers(lambda *_: None), [_prompt(0)], max_new_tokens=4, guided=False)


def test_best_state_keeps_the_earliest_of_equal_probes_and_restores_it():
    lin = torch.nn.Linear(2, 1)
    frozen = torch.nn.Linear(2, 1).requires_grad_(False)
    lin.frozen = frozen
    best = BestState(lin)
    first = lin.weight.detach().clone()
    assert best.offer(ProbeResult(0, 0.5, 1.0, 4))
    with torch.no_grad():
        lin.weight.add_(1.0)
    assert not best.offer(ProbeResult(2, 0.5, 1.0, 4))  # a tie keeps the less-trained state
    assert best.since_best == 1 and best.best.step == 0
    best.restore()
    assert torch.equal(lin.weight, first)
    assert best.offer(ProbeResult(4, 0.75, 1.0, 4)) and best.since_best == 0


def test_config_refuses_a_probe_it_cannot_run():
    with pytest.raises(ValueError, match="needs guided rollouts"):
        GRPOConfig(probe_every=2, probe_decoding="guided")
    with pytest.raises(ValueError, match="ZeRO-2"):
        GRPOConfig(probe_every=2, zero_stage=3)
    GRPOConfig(probe_every=0, zero_stage=3)  # no probe, no constraint


def _adapter(model_dir):
    return load_file(str(model_dir / "adapter" / "adapter_model.safetensors"))


@pytest.fixture(scope="module")
def targets(seg_set):
    return {e.request_id: e.target for e in load_set(seg_set)}


def _grpo(seg_export, seg_set, tiny_base, out, backend, **kw):
    r = tiny_recipe("segmenter", tiny_base)
    return train_grpo(r, seg_export, seg_set, out, backend=backend, log_mlflow=False,
                      progress=False, group_size=2, prompts_per_step=1, lr=5e-2, beta=0.0,
                      max_new_tokens=64, **kw)  # fmt: skip


def test_grpo_exports_the_state_its_held_out_probe_chose(seg_export, seg_set, tiny_base,
                                                         targets, tmp_path):  # fmt: skip
    from training.evaluate import unseen_heldout
    from training.lineage import trained_episodes

    # Rollouts: one right, one wrong per group (a signal every step). The probe answers
    # right at the start only: every trained state probes worse than the SFT start.
    def answer(base, suffix, probes):
        if suffix == "probe":
            return targets[base] if probes == 0 else "garbage"
        return targets[base] if suffix == "g0" else "garbage"

    res = _grpo(seg_export, seg_set, tiny_base, tmp_path / "kept", Answers(answer),
                max_steps=2, probe_every=1)  # fmt: skip
    assert res.kept_step == 0 and res.steps == 2 and not res.stopped_early
    history = json.loads((tmp_path / "kept" / "log" / "history.json").read_text())
    assert [h["step"] for h in history] == [0, 1, 2]
    assert [h["grpo.probe_reward"] for h in history] == [1.0, 0.0, 0.0]
    assert history[1]["grpo.valid_groups"] == 1.0  # it did update
    # The exported adapter is the start's, bit for bit; without a probe it is not.
    start = _adapter(seg_export)
    assert all(torch.equal(start[k], v) for k, v in _adapter(res.model_dir).items())
    plain = _grpo(seg_export, seg_set, tiny_base, tmp_path / "plain", Answers(answer),
                  max_steps=2)  # fmt: skip
    assert plain.kept_step is None
    assert any(not torch.equal(start[k], v) for k, v in _adapter(plain.model_dir).items())

    # The probe's episode is recorded and counts as seen: evaluation never scores it.
    man = json.loads((res.model_dir / "flora_model.json").read_text())
    held = sorted({e.episode_id for e in load_set(seg_set, split="heldout")})
    assert man["selected_on"]["episodes"] == held[-3:]
    assert man["selected_on"]["kept_step"] == 0
    assert set(held) <= trained_episodes(res.model_dir)
    assert not set(held) & trained_episodes(plain.model_dir)
    with pytest.raises(ValueError, match="trained on every held-out"):
        unseen_heldout("segmenter", seg_set, res.model_dir)
    # A probe never chooses on what the starting model saw: from this model there is none.
    with pytest.raises(ValueError, match="needs unseen held-out episodes"):
        _grpo(res.model_dir, seg_set, tiny_base, tmp_path / "again", Answers(answer),
              max_steps=1, probe_every=1)  # fmt: skip


def test_grpo_probe_patience_ends_the_run(seg_export, seg_set, tiny_base, targets, tmp_path):
    def answer(base, suffix, probes):
        if suffix == "probe":  # improves once (step 1), then never again
            return targets[base] if probes == 1 else "garbage"
        return targets[base] if suffix == "g0" else "garbage"

    res = _grpo(seg_export, seg_set, tiny_base, tmp_path / "g", Answers(answer),
                max_steps=6, probe_every=1, probe_patience=2)  # fmt: skip
    assert res.stopped_early and res.steps == 3 and res.kept_step == 1
    history = json.loads((tmp_path / "g" / "log" / "history.json").read_text())
    assert [h.get("grpo.probe_reward") for h in history] == [0.0, 1.0, 0.0, 0.0]


def test_grpo_refuses_a_recipe_of_another_family_than_its_sft_base(
    seg_export, seg_set, tiny_base, tmp_path
):
    # The same check as SFT's (training.sizes.check_family), before any weights load.
    r = tiny_recipe("segmenter", tiny_base, family="qwen3_5")
    with pytest.raises(ValueError, match="family 'qwen3_5' needs .*'qwen3_5'.*'qwen3_vl'"):
        train_grpo(r, seg_export, seg_set, tmp_path, backend=Answers(lambda *_: "0 40 1 1"),
                   log_mlflow=False, progress=False)  # fmt: skip
    assert not (tmp_path / "model").exists()
