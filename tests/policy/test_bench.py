"""Simulated benchmark: environment, expert, execution strategies and the --quick run."""

from __future__ import annotations

import json
import os

import pytest
import torch
from typer.testing import CliRunner

from flora.policy import rtc
from flora.policy.bench import (
    EVAL_METHODS,
    PAPER,
    BenchConfig,
    collect_demos,
    cycle_actions,
    docs_block,
    rate_table,
    rollout,
    wilson,
    write_docs,
)
from flora.policy.sim import PursuitConfig, PursuitEnv, PursuitExpert

os.environ.setdefault("MPLBACKEND", "Agg")


def test_cycle_actions_follow_the_rtc_timeline():
    H = 8
    prev = torch.arange(H).float().view(1, H, 1) + 100  # previous chunk, indices 100..107
    new = torch.arange(H).float().view(1, H, 1)  # new chunk, indices 0..7
    # d=0, s=1: the new chunk's first action at once.
    assert cycle_actions(prev, new, 0, 1).flatten().tolist() == [0]
    # d=2, s=2: both steps run the committed prefix prev[2:4].
    assert cycle_actions(prev, new, 2, 2).flatten().tolist() == [102, 103]
    # d=1, s=3: prev[3] while inferring, then new[1:3].
    assert cycle_actions(prev, new, 1, 3).flatten().tolist() == [103, 1, 2]
    with pytest.raises(ValueError):
        cycle_actions(prev, new, 5, 4)


def test_wilson_interval():
    lo, hi = wilson(90, 100)
    assert lo < 0.9 < hi
    assert lo == pytest.approx(0.8256, abs=1e-3) and hi == pytest.approx(0.9448, abs=1e-3)
    assert wilson(0, 50)[0] == 0.0 and wilson(50, 50)[1] == pytest.approx(1.0)


def test_environment_and_expert():
    cfg = PursuitConfig()
    env = PursuitEnv(cfg)
    g = torch.Generator().manual_seed(0)
    st = env.reset(256, g)
    obs = env.observe(st)
    assert obs.shape == (256, cfg.state_dim) and torch.isfinite(obs).all()
    assert all(("red" in t) != ("blue" in t) for t in st.texts)
    # Nobody starts inside an obstacle.
    gap = (st.robot[:, None] - st.obstacles).norm(dim=-1) - st.radii - cfg.robot_radius
    assert (gap > 0).all()
    ex = PursuitExpert(cfg)
    ex.reset(256)
    seen_sides = set()
    while not st.done.all():
        a = ex.act(st, g)
        assert (a.norm(dim=-1) <= 1.0 + 1e-5).all()
        seen_sides |= set(ex.side.flatten().tolist())
        env.step(st, a, g)
    assert st.success.float().mean() > 0.9  # the expert solves the task
    assert {-1.0, 1.0} <= seen_sides  # ...going round obstacles both ways (multi-modal)
    # Standing still fails: the task needs acting.
    st = env.reset(256, torch.Generator().manual_seed(0))
    while not st.done.all():
        env.step(st, torch.zeros(256, 2), g)
    assert st.success.float().mean() < 0.2


def test_demos_are_chunks_of_expert_commands():
    env = PursuitEnv()
    data, stats = collect_demos(env, 20, 8, torch.Generator().manual_seed(0), lang_vocab=64)
    assert data.chunks.shape[1:] == (8, 2)
    assert data.obs["state"].shape == (len(data), env.cfg.state_dim)
    assert data.obs["lang_ids"].shape[0] == len(data)
    assert stats["demo_samples"] == len(data) and stats["expert_success"] > 0.8
    # Consecutive rows of an episode overlap: chunk t+1 is chunk t shifted by one.
    assert torch.allclose(data.chunks[1, :-1], data.chunks[0, 1:])


class ConstantPolicy:
    """Velocity field whose Euler integral is a fixed chunk ``target`` (the ideal denoiser
    of a point mass): v = (target - x) / (1 - tau)."""

    def __init__(self, target: torch.Tensor) -> None:
        self.target = target
        self.calls = 0

    def __call__(self, obs, x, tau):
        self.calls += 1
        t = tau[..., None].clamp(max=1 - 1e-6)
        return (self.target.expand_as(x) - x) / (1 - t)


@pytest.mark.parametrize("method", EVAL_METHODS)
def test_rollout_mechanics(method):
    env = PursuitEnv()
    pol = ConstantPolicy(torch.tensor([1.0, 0.0]).view(1, 1, 2))
    out = rollout(pol, env, method, 2, 32, horizon=8, steps=2, seed=0, lang_vocab=64)
    assert out["success"].shape == (32,) and out["steps"].max() <= env.cfg.max_steps
    assert pol.calls > 0
    # Same seed, same method -> identical outcome (deterministic evaluation).
    out2 = rollout(pol, env, method, 2, 32, horizon=8, steps=2, seed=0, lang_vocab=64)
    assert torch.equal(out["success"], out2["success"])
    with pytest.raises(ValueError):
        rollout(pol, env, method, 5, 4, horizon=8, steps=2, seed=0, lang_vocab=64)


def test_synchronous_waits_d_steps_per_chunk():
    env = PursuitEnv(PursuitConfig(max_steps=24))
    pol = ConstantPolicy(torch.zeros(1, 1, 2))
    # d=2, s=2: a 4-step cycle -> 6 inference calls of 2 steps in 24 steps.
    out = rollout(pol, env, "synchronous", 2, 8, horizon=8, steps=2, seed=0, lang_vocab=64)
    assert int(out["cycles"]) == 6
    pol2 = ConstantPolicy(torch.zeros(1, 1, 2))
    out = rollout(pol2, env, "naive_async", 2, 8, horizon=8, steps=2, seed=0, lang_vocab=64)
    assert int(out["cycles"]) == 12  # one inference every s=2 steps


def test_quick_bench_cli(tmp_path):
    from flora.cli import app

    out = tmp_path / "bench"
    res = CliRunner().invoke(app, ["policy", "bench", "--quick", "--out", str(out)])
    assert res.exit_code == 0, res.output
    results = json.loads((out / "results.json").read_text())
    cfg = BenchConfig.quick()
    pts = results["points"]
    assert len(pts) == len(EVAL_METHODS) * len(cfg.delays)
    assert {(p["method"], p["d"]) for p in pts} == {
        (m, d) for m in EVAL_METHODS for d in cfg.delays
    }
    for p in pts:
        assert p["n"] == cfg.rollouts and p["s"] == max(p["d"], 1)
        assert 0 <= p["ci95"][0] <= p["rate"] <= p["ci95"][1] <= 1
        assert p["rate"] == pytest.approx(p["successes"] / p["n"])
    # Equal compute: RTC branches resumed from epoch (epochs - rtc_epochs) of the plain run.
    hist = results["train_history"]
    assert [h["epoch"] for h in hist["plain"]] == list(range(1, cfg.epochs + 1))
    for k in ("training_time", "training_time_soft"):
        assert [h["epoch"] for h in hist[k]] == list(range(1, cfg.epochs + 1))
        base = cfg.epochs - cfg.rtc_epochs
        assert hist[k][:base] == hist["plain"][:base]
        assert hist[k][base:] != hist["plain"][base:]
    assert (out / "policy_rtc.png").stat().st_size > 1000
    table = (out / "table.md").read_text()
    assert "training-time RTC" in table and "paper (Kinetix)" in table
    assert "0.72" in table  # the paper's training-time RTC at d=4


def test_docs_section_is_replaced_in_place(tmp_path):
    md = tmp_path / "benchmarks.md"
    md.write_text("# Benchmarks\n\n## Other area\n\nkeep me\n")
    results = {
        "config": {
            "horizon": 8,
            "denoise_steps": 5,
            "hidden": 64,
            "depth": 4,
            "epochs": 32,
            "rtc_epochs": 8,
            "rollouts": 10,
        },
        "demos": {"demo_episodes": 3, "demo_samples": 60, "expert_success": 1.0},
        "points": [
            {
                "method": "training_time",
                "d": 0,
                "s": 1,
                "n": 10,
                "successes": 9,
                "rate": 0.9,
                "ci95": [0.6, 0.98],
            }
        ],
        "date": "2026-11-30",
        "machine": "test",
        "total_seconds": 60,
        "train_seconds": 30,
        "paper": {},
    }
    write_docs(results, md, tmp_path / "img" / "p.png")
    first = md.read_text()
    assert "keep me" in first and "## Policy / RTC" in first and "img/p.png" in first
    results["points"][0]["rate"] = 0.8
    write_docs(results, md, tmp_path / "img" / "p.png")
    second = md.read_text()
    assert second.count("## Policy / RTC") == 1 and "0.800" in second and "0.900 " not in second
    assert docs_block(results, "x.png").startswith("<!-- policy-rtc:begin")
    assert "| training-time RTC | 0.800" in rate_table(results)


def test_bench_config_validation():
    with pytest.raises(ValueError):
        BenchConfig(epochs=4, rtc_epochs=4)
    with pytest.raises(ValueError):
        BenchConfig(delays=(0, 5))
    with pytest.raises(ValueError):
        BenchConfig(methods=("magic",))
    assert rtc.DelayDistribution.exponential(5, BenchConfig().delay_ratio).probs[0] > 0.5


def test_strategies_coincide_at_zero_delay():
    """At d = 0, s = 1 synchronous and naive async are the same procedure: with common
    random numbers they must give identical outcomes."""
    env = PursuitEnv()
    torch.manual_seed(0)
    from flora.policy.configuration_dit import DiTConfig
    from flora.policy.modeling_dit import DiTActionExpert

    model = DiTActionExpert(
        DiTConfig(
            action_dim=2,
            horizon=8,
            state_dim=env.cfg.state_dim,
            lang_vocab=64,
            hidden=16,
            depth=1,
            heads=2,
        )
    )
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    kw = dict(horizon=8, steps=2, seed=3, lang_vocab=64)
    a = rollout(model, env, "synchronous", 0, 48, **kw)
    b = rollout(model, env, "naive_async", 0, 48, **kw)
    assert torch.equal(a["success"], b["success"]) and torch.equal(a["steps"], b["steps"])


def test_rate_table_puts_the_papers_numbers_under_their_own_delay():
    """The paper's reference numbers were taken positionally: with delays (0, 2, 4) the
    table showed the paper's d = 0, 1, 2 under them."""
    pts = [
        {"method": "training_time", "d": d, "rate": 0.5, "ci95": [0.4, 0.6]} for d in (0, 2, 4, 5)
    ]
    table = rate_table({"points": pts})
    t = PAPER["training_time"]
    assert (
        f"| paper (Kinetix): training-time RTC | {t[0]:.2f} | {t[2]:.2f} | {t[4]:.2f} | — |"
        in table
    )
