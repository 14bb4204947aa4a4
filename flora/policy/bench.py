"""Simulated real-time-chunking benchmark (``flora policy bench``), after seed 002 §5.1.

Protocol (mirrors the paper's Kinetix experiment on our :mod:`flora.policy.sim` task):

1. Demonstrations from the scripted multi-modal expert (successful episodes only).
2. Behaviour cloning of a flow policy, H = 8, for ``epochs`` (32) epochs. The plain run is
   snapshotted at 3/4 of the budget (epoch 24); from the snapshot, training-time RTC
   fine-tunes for the last quarter (8 epochs, delays {0..4} with weights 2^-d), and so does
   the beyond-the-paper soft-overlap variant. All checkpoints get equal compute.
3. Evaluation for d = 0..4, s = max(d, 1), ``rollouts`` (2,048) episodes per point, on
   the same seeded initial states and noise for every method:
   ``synchronous`` (stop and wait d steps), ``naive_async`` (switch to independently
   sampled chunks), ``inference_time`` (RTC guidance, plain checkpoint), ``training_time``
   (RTC checkpoint) and ``training_time_soft`` (soft-overlap checkpoint).
4. Success rates with 95% Wilson intervals -> JSON, a plot and a markdown table.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from flora.policy import rtc
from flora.policy.configuration_dit import DiTConfig
from flora.policy.modeling_dit import DiTActionExpert, hash_tokens
from flora.policy.sim import PursuitConfig, PursuitEnv, PursuitExpert
from flora.policy.train import ChunkDataset, TrainConfig, TrainState, new_state, train_epochs

EVAL_METHODS: tuple[str, ...] = (
    "synchronous",
    "naive_async",
    "inference_time",
    "training_time",
    "training_time_soft",
)
LABELS = {
    "synchronous": "synchronous",
    "naive_async": "naive async",
    "inference_time": "inference-time RTC",
    "training_time": "training-time RTC",
    "training_time_soft": "training-time RTC + soft overlap (ours)",
}
# Seed 002 Fig. 3 (Kinetix, read off the figure), d = 0..4.
PAPER = {
    "training_time": (0.91, 0.89, 0.86, 0.81, 0.72),
    "inference_time": (0.92, 0.90, 0.85, 0.74, 0.61),
    "naive_async": (0.91, 0.75, 0.71, 0.59, 0.49),
}


@dataclass
class BenchConfig:
    """Sizes of one benchmark run (defaults: the full run; :meth:`quick` for CI)."""

    horizon: int = 8
    delays: tuple[int, ...] = (0, 1, 2, 3, 4)
    rollouts: int = 2048
    demo_episodes: int = 3000
    epochs: int = 32
    rtc_epochs: int = 8  # last quarter of the budget
    denoise_steps: int = 5
    hidden: int = 64
    depth: int = 4
    heads: int = 4
    lang_vocab: int = 512
    batch_size: int = 256
    lr: float = 1e-3
    delay_ratio: float = 0.5  # training delay weights ratio**d on {0..max(delays)}
    soft_strength: float = rtc.DEFAULT_SOFT_STRENGTH
    beta: float = rtc.DEFAULT_BETA
    schedule: str = "exp"
    seed: int = 0
    threads: int = 0  # torch CPU threads; 0 keeps torch's default (use 1 on a busy machine)
    methods: tuple[str, ...] = EVAL_METHODS
    env: PursuitConfig = field(default_factory=PursuitConfig)

    @classmethod
    def quick(cls) -> BenchConfig:
        """Tiny settings that exercise every code path in seconds (mechanics, not numbers)."""
        return cls(
            rollouts=64,
            demo_episodes=120,
            epochs=4,
            rtc_epochs=1,
            denoise_steps=2,
            hidden=32,
            depth=2,
            batch_size=128,
            lr=2e-3,
        )

    def __post_init__(self) -> None:
        if not 0 < self.rtc_epochs < self.epochs:
            raise ValueError("BenchConfig: need 0 < rtc_epochs < epochs")
        for d in self.delays:
            rtc.check_delay(d, max(d, 1), self.horizon)
        unknown = set(self.methods) - set(EVAL_METHODS)
        if unknown:
            raise ValueError(f"BenchConfig: unknown methods {sorted(unknown)}")


# ----------------------------------------------------------------------- demonstrations
def collect_demos(
    env: PursuitEnv,
    episodes: int,
    horizon: int,
    generator: torch.Generator,
    lang_vocab: int,
    lang_tokens: int = 16,
) -> tuple[ChunkDataset, dict[str, float]]:
    """Roll the expert out (with action noise) and cut every step of every *successful*
    episode into an H-step chunk of the expert's commands (padded with the last command)."""
    expert = PursuitExpert(env.cfg)
    st = env.reset(episodes, generator)
    expert.reset(episodes)
    states, acts, live = [], [], []
    while not st.done.all():
        live.append(~st.done)
        states.append(env.observe(st))
        a = expert.act(st, generator)
        acts.append(a)
        env.step(st, a, generator)
    S = torch.stack(states, 1)  # (E, T, Ds)
    Aseq = torch.stack(acts, 1)  # (E, T, 2)
    L = torch.stack(live, 1)  # (E, T)
    ok = st.success
    lengths = L.sum(1)
    ids = hash_tokens(st.texts, lang_vocab, lang_tokens)
    T = S.shape[1]
    t_idx = torch.arange(T)
    # Chunk indices clipped to the episode's last live step: padding repeats the last action.
    win = t_idx[:, None] + torch.arange(horizon)[None, :]  # (T, H)
    rows_s, rows_c, rows_l = [], [], []
    for e in ok.nonzero().flatten().tolist():
        n = int(lengths[e])
        w = win[:n].clamp(max=n - 1)
        rows_s.append(S[e, :n])
        rows_c.append(Aseq[e][w])
        rows_l.append(ids[e].expand(n, -1))
    data = ChunkDataset(
        {"state": torch.cat(rows_s), "lang_ids": torch.cat(rows_l)}, torch.cat(rows_c)
    )
    stats = {
        "expert_success": float(ok.float().mean()),
        "expert_collision": float(st.collided.float().mean()),
        "expert_mean_steps": float(lengths[ok].float().mean()) if ok.any() else float("nan"),
        "demo_episodes": float(ok.sum()),
        "demo_samples": float(len(data)),
    }
    return data, stats


# ---------------------------------------------------------------------------- rollouts
def rollout(
    model: Callable[..., torch.Tensor],
    env: PursuitEnv,
    method: str,
    d: int,
    n: int,
    *,
    horizon: int,
    steps: int,
    seed: int,
    lang_vocab: int,
    lang_tokens: int = 16,
    beta: float = rtc.DEFAULT_BETA,
    schedule: str = "exp",
    soft_strength: float = rtc.DEFAULT_SOFT_STRENGTH,
) -> dict[str, torch.Tensor]:
    """Run ``n`` episodes with execution strategy ``method`` at delay ``d``, s = max(d, 1).

    Asynchronous methods (seed 002 Fig. 1): an inference starts every s steps from the
    current observation; during the next d steps the robot executes the previous chunk's
    actions ``prev[s : s+d]`` (the committed prefix), then the new chunk from index d on.
    ``synchronous`` instead holds still (zero velocity) for d steps and then executes the
    new chunk's first s actions. Episode randomness depends only on ``seed``, so every
    method meets the same initial states and the same noise at each time step, and the
    policy's sampling noise is one seeded stream per (method, d) point.
    """
    if method not in EVAL_METHODS:
        raise ValueError(f"unknown execution method {method!r}; expected {EVAL_METHODS}")
    H, A = horizon, 2
    s = max(d, 1)
    rtc.check_delay(d, s, H)
    g_env = torch.Generator().manual_seed(seed)
    g_pol = torch.Generator().manual_seed(seed + 7919)
    g_first = torch.Generator().manual_seed(seed + 104729)  # only for the chunk in flight
    st = env.reset(n, g_env)
    lang = hash_tokens(st.texts, lang_vocab, lang_tokens)
    sample_method = {"synchronous": "plain", "naive_async": "plain"}.get(method, method)

    def chunks(
        idx: torch.Tensor, meth: str, prefix: torch.Tensor | None, gen: torch.Generator = g_pol
    ) -> torch.Tensor:
        obs = {"state": env.observe(st)[idx], "lang_ids": lang[idx]}
        return rtc.sample(
            model,
            obs,
            prefix,
            d,
            steps,
            meth,
            s=s,
            shape=(len(idx), H, A),
            schedule=schedule,
            beta=beta,
            soft_strength=soft_strength,
            generator=gen,
        )

    zeros = torch.zeros(n, A)
    n_chunks = 0
    if method == "synchronous":
        while not st.done.all():
            idx = (~st.done).nonzero().flatten()
            C = torch.zeros(n, H, A)
            C[idx] = chunks(idx, "plain", None)
            n_chunks += 1
            for _ in range(d):  # stop and wait for the inference
                env.step(st, zeros, g_env)
            for j in range(s):
                env.step(st, C[:, j], g_env)
    else:
        everyone = torch.arange(n)
        # Own generator: the policy noise stream then matches the synchronous run's, so
        # at d = 0 (where the strategies coincide) naive async and synchronous agree exactly.
        first = chunks(everyone, "plain", None, g_first)
        # The chunk "in flight" before t=0 executes first[0:d] while chunk 1 is computed.
        prev = torch.cat([first[:, :1].expand(n, s, A), first], dim=1)[:, :H]
        while not st.done.all():
            idx = (~st.done).nonzero().flatten()
            C = prev.clone()
            C[idx] = chunks(idx, sample_method, prev[idx, s:])
            n_chunks += 1
            for a in cycle_actions(prev, C, d, s).unbind(1):
                env.step(st, a, g_env)
            prev = C
    return {
        "success": st.success.clone(),
        "collided": st.collided.clone(),
        "steps": st.t.clone(),
        "cycles": torch.tensor(n_chunks),
    }


def cycle_actions(prev: torch.Tensor, new: torch.Tensor, d: int, s: int) -> torch.Tensor:
    """Actions (B, s, A) executed during one asynchronous inference cycle of s steps:
    the committed prefix ``prev[:, s:s+d]`` while the new chunk is being computed, then
    ``new[:, d:s]`` once it has arrived (seed 002 Fig. 1)."""
    rtc.check_delay(d, s, prev.shape[1])
    return torch.cat([prev[:, s : s + d], new[:, d:s]], dim=1)


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval for k successes out of n (95% by default)."""
    if n <= 0:
        return (float("nan"), float("nan"))
    p = k / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (max(0.0, centre - half), min(1.0, centre + half))


def machine_description() -> str:
    """CPU model, core count, torch version and threads (recorded with every run)."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{os.cpu_count()}-core CPU ({model}), torch {torch.__version__}, "
        f"{torch.get_num_threads()} torch thread(s)"
    )


# ------------------------------------------------------------------------------- runner
def _models(
    cfg: BenchConfig, data: ChunkDataset, progress: bool, log: Callable[[str], None]
) -> tuple[dict[str, DiTActionExpert], dict[str, list[dict[str, float]]]]:
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
    base_epochs = cfg.epochs - cfg.rtc_epochs
    st: TrainState = new_state(dit, tc)
    log(f"BC: {base_epochs} epochs on {len(data)} chunks")
    train_epochs(st, data, base_epochs, tc, desc="bc", progress=progress)
    snap = st.clone()
    log(f"BC: last {cfg.rtc_epochs} epochs (plain)")
    train_epochs(st, data, cfg.rtc_epochs, tc, desc="bc", progress=progress)
    delays = rtc.DelayDistribution.exponential(max(cfg.delays) + 1, cfg.delay_ratio)
    models = {"plain": st.model}
    hist = {"plain": st.history}
    need_tt = "training_time" in cfg.methods
    need_soft = "training_time_soft" in cfg.methods
    if need_tt:
        tt = snap.clone()
        log(f"training-time RTC: {cfg.rtc_epochs} epochs from epoch {base_epochs}")
        train_epochs(tt, data, cfg.rtc_epochs, tc, delays=delays, desc="rtc", progress=progress)
        models["training_time"] = tt.model
        hist["training_time"] = tt.history
    if need_soft:
        so = snap.clone()
        log(f"soft-overlap RTC: {cfg.rtc_epochs} epochs from epoch {base_epochs}")
        soft = rtc.SoftOverlap(strength=cfg.soft_strength, schedule=cfg.schedule)
        train_epochs(
            so,
            data,
            cfg.rtc_epochs,
            tc,
            delays=delays,
            soft_overlap=soft,
            desc="soft",
            progress=progress,
        )
        models["training_time_soft"] = so.model
        hist["training_time_soft"] = so.history
    return models, hist


def run_bench(
    cfg: BenchConfig,
    *,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Train and evaluate everything; returns a JSON-serialisable results dict."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    t0 = time.time()
    cpu0 = time.process_time()
    env = PursuitEnv(cfg.env)
    data, demo_stats = collect_demos(
        env,
        cfg.demo_episodes,
        cfg.horizon,
        torch.Generator().manual_seed(cfg.seed + 1),
        cfg.lang_vocab,
    )
    log(f"demos: {demo_stats}")
    models, hist = _models(cfg, data, progress, log)
    t_train = time.time() - t0
    checkpoint_for = {
        "synchronous": "plain",
        "naive_async": "plain",
        "inference_time": "plain",
        "training_time": "training_time",
        "training_time_soft": "training_time_soft",
    }
    points: list[dict[str, Any]] = []
    jobs = [(m, d) for m in cfg.methods for d in cfg.delays]
    bar = tqdm(jobs, desc="eval", disable=not progress)
    for method, d in bar:
        bar.set_postfix(method=method, d=d)
        t1 = time.time()
        out = rollout(
            models[checkpoint_for[method]],
            env,
            method,
            d,
            cfg.rollouts,
            horizon=cfg.horizon,
            steps=cfg.denoise_steps,
            seed=cfg.seed + 1000 + d,
            lang_vocab=cfg.lang_vocab,
            beta=cfg.beta,
            schedule=cfg.schedule,
            soft_strength=cfg.soft_strength,
        )
        k = int(out["success"].sum())
        lo, hi = wilson(k, cfg.rollouts)
        points.append(
            {
                "method": method,
                "d": d,
                "s": max(d, 1),
                "successes": k,
                "n": cfg.rollouts,
                "rate": k / cfg.rollouts,
                "ci95": [lo, hi],
                "collision_rate": float(out["collided"].float().mean()),
                "mean_steps": float(out["steps"].float().mean()),
                "seconds": time.time() - t1,
            }
        )
    env_cfg = asdict(cfg.env)
    return {
        "config": {**{k: v for k, v in asdict(cfg).items() if k != "env"}, "env": env_cfg},
        "demos": demo_stats,
        "train_history": hist,
        "points": points,
        "paper": {k: list(v) for k, v in PAPER.items()},
        "train_seconds": t_train,
        "total_seconds": time.time() - t0,
        "cpu_seconds": time.process_time() - cpu0,
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "machine": machine_description(),
    }


# ------------------------------------------------------------------------------ reports
def rate_table(results: dict[str, Any]) -> str:
    """Markdown table: one row per method, success rate [95% CI] per delay."""
    delays = sorted({p["d"] for p in results["points"]})
    head = "| method | " + " | ".join(f"d={d}" for d in delays) + " |"
    sep = "| --- | " + " | ".join("---" for _ in delays) + " |"
    rows = [head, sep]
    by = {(p["method"], p["d"]): p for p in results["points"]}
    for m in EVAL_METHODS:
        if not any((m, d) in by for d in delays):
            continue
        cells = []
        for d in delays:
            p = by.get((m, d))
            cells.append(
                "—" if p is None else f"{p['rate']:.3f} [{p['ci95'][0]:.3f}, {p['ci95'][1]:.3f}]"
            )
        rows.append(f"| {LABELS[m]} | " + " | ".join(cells) + " |")
    for m, vals in PAPER.items():
        # The paper's numbers are per d = 0..4: look each column's d up (a run over delays
        # (0, 2, 4) showed the paper's d = 0, 1, 2 under them).
        rows.append(
            f"| paper (Kinetix): {LABELS[m]} | "
            + " | ".join(f"{vals[d]:.2f}" if 0 <= d < len(vals) else "—" for d in delays)
            + " |"
        )
    return "\n".join(rows)


def plot(results: dict[str, Any], path: str | Path) -> Path:
    """Success rate vs delay with 95% Wilson bands, next to the paper's Fig. 3 numbers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {
        "synchronous": "tab:gray",
        "naive_async": "tab:red",
        "inference_time": "tab:green",
        "training_time": "tab:blue",
        "training_time_soft": "tab:purple",
    }
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    ax = axes[0]
    for m in EVAL_METHODS:
        pts = sorted((p for p in results["points"] if p["method"] == m), key=lambda p: p["d"])
        if not pts:
            continue
        ds = [p["d"] for p in pts]
        ax.plot(ds, [p["rate"] for p in pts], "o-", color=colors[m], label=LABELS[m])
        ax.fill_between(
            ds, [p["ci95"][0] for p in pts], [p["ci95"][1] for p in pts], color=colors[m], alpha=0.2
        )
    n = results["points"][0]["n"] if results["points"] else 0
    ax.set_title(f"Flora pursuit benchmark ({n} rollouts/point, 95% Wilson)")
    ax.set_xticks(sorted({p["d"] for p in results["points"]}))
    ax.set_xlabel("inference delay d (control steps), s = max(d, 1)")
    ax.set_ylabel("success rate")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    ax = axes[1]
    for m, vals in PAPER.items():
        ax.plot(range(len(vals)), vals, "s--", color=colors[m], label=LABELS[m])
    ax.set_title("Paper, seed 002 Fig. 3 (Kinetix, read off the figure)")
    ax.set_xticks(range(5))
    ax.set_xlabel("inference delay d")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_outputs(results: dict[str, Any], out_dir: str | Path) -> dict[str, Path]:
    """results.json, table.md and policy_rtc.png under ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": out / "results.json",
        "table": out / "table.md",
        "plot": out / "policy_rtc.png",
    }
    paths["json"].write_text(json.dumps(results, indent=2))
    paths["table"].write_text(rate_table(results) + "\n")
    plot(results, paths["plot"])
    return paths


DOC_BEGIN = "<!-- policy-rtc:begin (generated by `flora policy bench --docs`) -->"
DOC_END = "<!-- policy-rtc:end -->"
DOC_HEADING = "## Policy / RTC"


def docs_block(results: dict[str, Any], img_rel: str) -> str:
    """The generated part of the docs section: run facts, table and plot link."""
    c = results["config"]
    demos = results["demos"]
    return "\n".join(
        [
            DOC_BEGIN,
            f"Run: `flora policy bench --docs` on {results['date']}; machine: "
            f"{results['machine']}; wall time {results['total_seconds'] / 60:.1f} min "
            f"(training {results['train_seconds'] / 60:.1f} min).",
            f"Setup: H={c['horizon']}, {c['denoise_steps']} Euler steps, "
            f"DiT hidden {c['hidden']} x "
            f"{c['depth']} blocks; {int(demos['demo_episodes'])} expert demos "
            f"({int(demos['demo_samples'])} chunks; expert success {demos['expert_success']:.3f}); "
            f"{c['epochs']} epochs, RTC variants fine-tuned for the last {c['rtc_epochs']}; "
            f"{c['rollouts']} rollouts per point, s = max(d, 1); success rate [95% Wilson].",
            "",
            rate_table(results),
            "",
            f"![RTC benchmark]({img_rel})",
            DOC_END,
        ]
    )


def write_docs(results: dict[str, Any], md_path: Path, img_path: Path) -> list[Path]:
    """Write the plot to ``img_path`` and replace (or append) the generated block of the
    "Policy / RTC" section of the shared ``md_path``; nothing else in the file changes."""
    plot(results, img_path)
    rel = Path(img_path).relative_to(Path(md_path).parent).as_posix()
    block = docs_block(results, rel)
    text = Path(md_path).read_text() if Path(md_path).exists() else "# Benchmarks\n"
    if DOC_BEGIN in text and DOC_END in text:
        a = text.index(DOC_BEGIN)
        b = text.index(DOC_END) + len(DOC_END)
        text = text[:a] + block + text[b:]
    elif DOC_HEADING in text:
        a = text.index(DOC_HEADING) + len(DOC_HEADING)
        text = text[:a] + "\n\n" + block + "\n" + text[a:]
    else:
        text = text.rstrip("\n") + f"\n\n{DOC_HEADING}\n\n{block}\n"
    Path(md_path).write_text(text)
    return [Path(md_path), Path(img_path)]


def check_kinetix_ready(levels: list[str], home: Path) -> list[Path]:
    """Env-selection hook for ``--env kinetix`` (issue 14): the extra and a cached PPO expert
    per level must exist. Raises :class:`flora.policy.kinetix_env.ExpertMissing` (how to make
    one) or ``KinetixUnavailable``; experts are never faked."""
    from flora.policy.kinetix_env import require_expert, shipped_levels

    unknown = sorted(set(levels) - set(shipped_levels()))
    if unknown:
        raise ValueError(f"unknown Kinetix level(s) {unknown}; shipped: l/<name> levels")
    return [require_expert(home, level) for level in levels]
