"""Pre-registered ablation: why training-time RTC does not pull ahead of inference-time RTC
in ``flora policy bench`` (see docs/benchmarks.md, "Policy / RTC").

Reduced protocol (time box on a shared 2-core CPU): same demos (3,000 expert episodes,
seed as the bench), same network and optimiser, but 16 epochs with the RTC branches
fine-tuned for the last 4 (the bench: 32 / 8); evaluation at d = 2, 3, 4 with ``--rollouts``
(2,048, as reported in docs/benchmarks.md) seeded episodes per point.

Arms (all branch from the same epoch-12 snapshot, equal compute):

* ``plain``    -- 4 more plain epochs; used by inference-time RTC (and naive async for H2).
* ``tt_exp``   -- training-time RTC, delay weights 2^-d on {0..4} (the bench's choice).
* ``tt_unif``  -- training-time RTC, uniform delays on {0..4}                      (H3).

H1: on held-out expert observations at d = s = 4, the previous chunk is a plain sample from
the observation s steps earlier; each method's new chunk is compared with the committed
prefix (RMS error over the prefix rows) and the executed action jump at the switch
``|new[d] - prefix[d-1]|``, next to the expert's own step-to-step action change.

H2 (optional): d = 4 with the balls slowed to half speed and half the turn probability.

Usage: ``nice -n 10 .venv/bin/python benchmarks/rtc_ablation.py --out /tmp/rtc_ablation``
(add ``--refs`` for the second run: d = 4 repeats of the control arms and naive async d = 0).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import multiprocessing as mp
import time
from pathlib import Path
from typing import Any

import torch

from flora.policy import rtc
from flora.policy.bench import BenchConfig, collect_demos, machine_description, rollout, wilson
from flora.policy.configuration_dit import DiTConfig
from flora.policy.modeling_dit import hash_tokens
from flora.policy.sim import PursuitEnv, PursuitExpert
from flora.policy.train import TrainConfig, new_state, train_epochs

G: dict[str, Any] = {}  # state shared with forked workers


def _train_branch(name: str) -> tuple[str, dict[str, torch.Tensor], float]:
    torch.set_num_threads(1)
    t = time.time()
    st = G["snap"].clone()
    delays = {
        "plain": None,
        "tt_exp": rtc.DelayDistribution.exponential(5, 0.5),
        "tt_unif": rtc.DelayDistribution.uniform(5),
    }[name]
    train_epochs(st, G["data"], G["rtc_epochs"], G["tc"], delays=delays, desc=name, progress=False)
    return name, st.model.state_dict(), time.time() - t


def _eval(job: tuple[str, str, int, str]) -> dict[str, Any]:
    """(label, model key, d, env key) -> success vector and summary."""
    torch.set_num_threads(1)
    label, key, d, env_key = job
    method = {"tt_exp": "training_time", "tt_unif": "training_time"}.get(key, label)
    cfg: BenchConfig = G["cfg"]
    t = time.time()
    with torch.no_grad() if method != "inference_time" else torch.enable_grad():
        out = rollout(
            G["models"][key],
            G["envs"][env_key],
            method,
            d,
            G["rollouts"],
            horizon=cfg.horizon,
            steps=cfg.denoise_steps,
            seed=cfg.seed + 1000 + d,
            lang_vocab=cfg.lang_vocab,
        )
    k = int(out["success"].sum())
    n = G["rollouts"]
    return {
        "arm": label if key == "plain" else key,
        "d": d,
        "env": env_key,
        "successes": k,
        "n": n,
        "rate": k / n,
        "ci95": list(wilson(k, n)),
        "collision_rate": float(out["collided"].float().mean()),
        "mean_steps": float(out["steps"].float().mean()),
        "success_vec": out["success"].int().tolist(),
        "seconds": time.time() - t,
    }


def prefix_match(models: dict[str, Any], cfg: BenchConfig, d: int, n_ep: int) -> dict[str, Any]:
    """H1 metrics on held-out expert observations (seed disjoint from demos and rollouts)."""
    H, s = cfg.horizon, max(d, 1)
    env = PursuitEnv(cfg.env)
    g = torch.Generator().manual_seed(424242)
    expert = PursuitExpert(env.cfg)
    st = env.reset(n_ep, g)
    expert.reset(n_ep)
    lang = hash_tokens(st.texts, cfg.lang_vocab, 16)
    states, acts, live = [], [], []
    while not st.done.all():
        live.append(~st.done)
        states.append(env.observe(st))
        a = expert.act(st, g)
        acts.append(a)
        env.step(st, a, g)
    S, A, L = torch.stack(states, 1), torch.stack(acts, 1), torch.stack(live, 1)
    # Pairs (t - s, t) with both steps live, t in {s, 2s, 3s, ...}.
    e_idx, t_idx = [], []
    for t in range(s, S.shape[1], s):
        ok = L[:, t].nonzero().flatten()
        e_idx.append(ok)
        t_idx.append(torch.full_like(ok, t))
    e, t = torch.cat(e_idx), torch.cat(t_idx)
    obs_old = {"state": S[e, t - s], "lang_ids": lang[e]}
    obs_new = {"state": S[e, t], "lang_ids": lang[e]}
    B = len(e)
    gp = torch.Generator().manual_seed(7)
    with torch.no_grad():
        prev = rtc.sample(
            models["plain"],
            obs_old,
            None,
            d,
            cfg.denoise_steps,
            "plain",
            s=s,
            shape=(B, H, 2),
            generator=gp,
        )
    prefix = prev[:, s:]
    both = L[:, 1:] & L[:, :-1]
    expert_step = float((A[:, 1:] - A[:, :-1]).norm(dim=-1)[both].mean())
    res: dict[str, Any] = {"d": d, "s": s, "pairs": B, "expert_mean_action_change": expert_step}
    arms = {
        "naive_async (plain)": ("plain", "plain"),
        "inference_time": ("plain", "inference_time"),
        "tt_exp": ("tt_exp", "training_time"),
        "tt_unif": ("tt_unif", "training_time"),
    }
    for label, (key, meth) in arms.items():
        g2 = torch.Generator().manual_seed(11)
        ctx = torch.enable_grad() if meth == "inference_time" else torch.no_grad()
        with ctx:
            new = rtc.sample(
                models[key],
                obs_new,
                prefix,
                d,
                cfg.denoise_steps,
                meth,
                s=s,
                shape=(B, H, 2),
                generator=g2,
            ).detach()
        pre_err = (new[:, :d] - prefix[:, :d]).norm(dim=-1)  # (B, d)
        jump = (new[:, d] - prefix[:, d - 1]).norm(dim=-1)  # executed discontinuity
        res[label] = {
            "prefix_rms": float(pre_err.pow(2).mean().sqrt()),
            "prefix_err_last_row": float(pre_err[:, -1].mean()),
            "jump_mean": float(jump.mean()),
            "jump_p90": float(jump.quantile(0.9)),
            "postfix_step_mean": float((new[:, d + 1 :] - new[:, d:-1]).norm(dim=-1).mean()),
        }
    return res


def paired_diff(a: list[int], b: list[int]) -> tuple[float, float, float]:
    """Mean of a - b over the same episodes with a normal 95% interval."""
    x = torch.tensor(a, dtype=torch.float64) - torch.tensor(b, dtype=torch.float64)
    m, sd = float(x.mean()), float(x.std())
    h = 1.959964 * sd / math.sqrt(len(x))
    return m, m - h, m + h


PREREG_PATH = Path(__file__).resolve().parents[1] / "docs" / "results" / "rtc_ablation_prereg.md"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs/results/rtc_ablation")
    ap.add_argument("--rollouts", type=int, default=2048)
    ap.add_argument("--epochs", type=int, default=16)
    ap.add_argument("--rtc-epochs", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--no-h2", action="store_true")
    ap.add_argument(
        "--refs",
        action="store_true",
        help="second run: only plain + tt_exp; d=4 repeats (determinism) + d=0",
    )
    ap.add_argument("--demos", type=int, default=3000, help="expert episodes (smoke tests)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    # The pre-registration travels with the outputs and is written before anything runs.
    (out / "prereg.md").write_text(PREREG_PATH.read_text())
    t0 = time.time()
    cfg = BenchConfig(
        epochs=a.epochs,
        rtc_epochs=a.rtc_epochs,
        rollouts=a.rollouts,
        threads=1,
        demo_episodes=a.demos,
    )
    env = PursuitEnv(cfg.env)
    data, demo_stats = collect_demos(
        env,
        cfg.demo_episodes,
        cfg.horizon,
        torch.Generator().manual_seed(cfg.seed + 1),
        cfg.lang_vocab,
    )
    print(f"demos {demo_stats} ({time.time() - t0:.0f}s)", flush=True)
    dit = DiTConfig(
        action_dim=2,
        horizon=cfg.horizon,
        state_dim=cfg.env.state_dim,
        lang_vocab=cfg.lang_vocab,
        hidden=cfg.hidden,
        depth=cfg.depth,
        heads=cfg.heads,
    )
    tc = TrainConfig(
        total_epochs=cfg.epochs,
        batch_size=cfg.batch_size,
        lr=cfg.lr,
        seed=cfg.seed,
        warmup_steps=min(200, max(1, len(data) // cfg.batch_size)),
    )
    st = new_state(dit, tc)
    train_epochs(st, data, cfg.epochs - cfg.rtc_epochs, tc, desc="bc", progress=False)
    print(f"base {cfg.epochs - cfg.rtc_epochs} epochs done ({time.time() - t0:.0f}s)", flush=True)
    G.update(snap=st, data=data, tc=tc, rtc_epochs=cfg.rtc_epochs, cfg=cfg, rollouts=a.rollouts)
    ctx = mp.get_context("fork")
    models: dict[str, Any] = {}
    branches = ["tt_exp", "plain"] if a.refs else ["tt_unif", "tt_exp", "plain"]
    with ctx.Pool(a.workers) as pool:
        for name, sd, sec in pool.imap_unordered(_train_branch, branches):
            m = st.clone().model
            m.load_state_dict(sd)
            m.eval()
            models[name] = m
            torch.save(sd, out / f"{name}.pt")
            print(f"branch {name} trained in {sec:.0f}s ({time.time() - t0:.0f}s)", flush=True)
    t_train = time.time() - t0
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine_description(),
        "demos": demo_stats,
        "protocol": {
            "epochs": cfg.epochs,
            "rtc_epochs": cfg.rtc_epochs,
            "rollouts": a.rollouts,
            "delays_eval": [2, 3, 4],
            "s": "max(d,1)",
            "tt_exp": "2^-d on {0..4}",
            "tt_unif": "uniform on {0..4}",
        },
        "train_seconds": t_train,
        "points": [],
    }
    for m in models.values():
        m.eval()
    if not a.refs:
        results["h1"] = prefix_match(models, cfg, d=4, n_ep=256)
        print(json.dumps(results["h1"], indent=1), flush=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    slow = dataclasses.replace(
        cfg.env, ball_speed=cfg.env.ball_speed / 2, turn_prob=cfg.env.turn_prob / 2
    )
    G.update(models=models, envs={"normal": PursuitEnv(cfg.env), "slow": PursuitEnv(slow)})
    jobs = [
        (lab, key, d, "normal")
        for d in (4, 3, 2)
        for lab, key in (
            ("inference_time", "plain"),
            ("training_time", "tt_unif"),
            ("training_time", "tt_exp"),
        )
    ]
    if not a.no_h2:
        jobs += [
            (lab, key, 4, "slow")
            for lab, key in (
                ("inference_time", "plain"),
                ("training_time", "tt_exp"),
                ("naive_async", "plain"),
            )
        ]
    if a.refs:  # d=4 repeats (same seeds: determinism check) and the d=0 reference
        jobs = [
            ("training_time", "tt_exp", 4, "normal"),
            ("naive_async", "plain", 0, "normal"),
            ("inference_time", "plain", 4, "normal"),
        ]
    with ctx.Pool(a.workers) as pool:
        for p in pool.imap_unordered(_eval, jobs):
            results["points"].append(p)
            print(
                f"{p['arm']:>15} d={p['d']} {p['env']:>6}: {p['rate']:.3f} "
                f"[{p['ci95'][0]:.3f}, {p['ci95'][1]:.3f}] coll {p['collision_rate']:.3f} "
                f"steps {p['mean_steps']:.1f} ({p['seconds']:.0f}s; {time.time() - t0:.0f}s)",
                flush=True,
            )
            (out / "results.json").write_text(json.dumps(results, indent=1))
    by = {(p["arm"], p["d"], p["env"]): p for p in results["points"]}
    diffs = {}
    for d, env_key in [(2, "normal"), (3, "normal"), (4, "normal"), (4, "slow")]:
        for x, y in [
            ("tt_unif", "tt_exp"),
            ("tt_unif", "inference_time"),
            ("tt_exp", "inference_time"),
            ("inference_time", "naive_async"),
        ]:
            if (x, d, env_key) in by and (y, d, env_key) in by:
                diffs[f"{x}-{y} d={d} {env_key}"] = paired_diff(
                    by[(x, d, env_key)]["success_vec"], by[(y, d, env_key)]["success_vec"]
                )
    results["paired_diffs"] = diffs
    results["total_seconds"] = time.time() - t0
    for k, v in diffs.items():
        print(f"{k}: {v[0]:+.3f} [{v[1]:+.3f}, {v[2]:+.3f}]")
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(f"total {time.time() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    main()
