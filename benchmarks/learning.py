"""Do the three ``small`` Flora models learn the toy world?  (not a timed test)

For each model — segmenter, captioner, rewarder — on held-out toy-world episodes (split by
episode hash): the untrained ``small`` model, SFT, and SFT+GRPO (segmenter and captioner;
no RL for the rewarder), beside simple baselines scored by the *same* code
(:func:`training.evaluate.score_outputs`):

* segmenter: the kinematic baseline (:mod:`flora.segment.kinematic`, per window) and
  "one event per core" (one segment spanning each window's core);
* captioner: the most frequent training caption of the episode's task;
* rewarder: the training-set mean outcome score and the majority dense label; and the
  outcome read from the prompt alone (the score of the training episode with the same
  task and nearest length: in toy world 1 the length fixed the outcome, docs/dataset.md).

Metrics with 95 % intervals from a bootstrap over held-out episodes. GRPO is also judged
on its own prompts: the mean sampled reward (G completions at temperature 1) of the SFT
and the GRPO model on the same training prompts; and held out, against the SFT model's
answers paired by episode (:func:`paired_by_episode`).

Results (JSON per stage, resumable) go under ``--work``; the markdown table is printed and,
with ``--write-docs``, inserted after the last "Learning" section of ``docs/benchmarks.md``
with a plot in ``docs/img/<--plot>``. ``--quick`` shortens every schedule (minutes on 2
CPU cores). ``--sft-steps N`` runs the recipe's schedule compressed to N steps.

    OMP_NUM_THREADS=1 python benchmarks/learning.py --quick --write-docs
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import platform
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pandas as pd  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("segmenter", "captioner", "rewarder")
HEAD = {
    "segmenter": ["parse_rate", "r_seg", "f1@0.5", "f1@0.75", "precision@0.5", "B"],
    "captioner": ["parse_rate", "r_cap", "coverage", "r_cap_judged"],
    "rewarder": ["parse_rate", "outcome.mae", "dense.accuracy", "dense.failure_recall",
                 "rubric.l1", "outcome.parse_rate", "dense.parse_rate", "rubric.parse_rate"],
}  # fmt: skip
# Columns shown in the table but not judged against the baselines in "Targets".
NOT_JUDGED = {"outcome.parse_rate", "dense.parse_rate", "rubric.parse_rate"}
LOWER_IS_BETTER = {"outcome.mae", "rubric.l1"}
# Per-item columns compared episode by episode between the SFT and the SFT+GRPO model
# (the models GRPO trains; "parsed" is the parse rate).
PAIRED_METRICS = {"segmenter": ("r_seg", "parsed"), "captioner": ("r_cap", "parsed")}


def seen_by_init(model: str, args: argparse.Namespace, dataset: Path) -> set[str]:
    """Ids, in this world, of every episode ``--init-from``'s model (or its lineage) trained on."""
    if not args.init_from:
        return set()
    from training.lineage import seen_in

    return seen_in(args.init_from / model, dataset.name)


def seen_by_base(model: str, dataset: Path) -> set[str]:
    """Ids, in this world, of every episode the recipe's base learnt from (the small
    segmenter's LoRA sits on the released captioner): no variant is scored on them."""
    from training.lineage import base_seen_in
    from training.recipe import load_recipe

    return base_seen_in(load_recipe(f"{model}-small").base, dataset.name)


def seen_by_lineage(model: str, args: argparse.Namespace, dataset: Path) -> set[str]:
    """Every held-out episode no variant may be scored on: seen by ``--init-from``'s model
    or by the recipe's base. GRPO's probe picks among the rest, as ``training.grpo`` does."""
    return seen_by_init(model, args, dataset) | seen_by_base(model, dataset)


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _cached(path: Path, fn) -> Any:
    if path.is_file():
        return json.loads(path.read_text())
    val = fn()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(val, indent=2, default=str))
    return val


def _row(res) -> dict[str, Any]:
    return {"metrics": res.metrics, "intervals": {k: list(v) for k, v in res.intervals.items()}}


# --------------------------------------------------------------------------- baselines


def _episode_tasks(dataset: Path) -> dict[str, str]:
    from flora.data.dataset import open_dataset

    ds = open_dataset(dataset)
    return {ds.episode(i).episode_id: ds.episode(i).task for i in ds.episode_indices()}


def _episode_task_lengths(dataset: Path) -> dict[str, tuple[str, int]]:
    from flora.data.dataset import open_dataset

    ds = open_dataset(dataset)
    eps = (ds.episode(i) for i in ds.episode_indices())
    return {e.episode_id: (e.task, e.duration_us) for e in eps}


def segmenter_baselines(dataset: Path, held: list) -> dict[str, pd.DataFrame]:
    """Kinematic baseline and one-event-per-core output tables for the held-out windows."""
    from flora.data.dataset import open_dataset
    from flora.segment.grammar import render_segments
    from flora.segment.kinematic import episode_kinematics, kinematic_window_segments
    from flora.segment.plan import LocalSegment, Window

    ds = open_dataset(dataset)
    eps = {ds.episode(i).episode_id: ds.episode(i) for i in ds.episode_indices()}
    kins: dict[str, Any] = {}
    kin_rows, core_rows = [], []
    for ex in held:
        ref = ex.reference_obj()
        s, e, cs, ce = ref["window"]
        w = Window(s, e, cs, ce, profile=ref["profile"], shifted=ref["pass"] == "shifted")
        ep = eps[ex.episode_id]
        kin = kins.setdefault(ex.episode_id, episode_kinematics(ep))
        segs = kinematic_window_segments(ep, w, kin=kin)
        kin_rows.append({"example_id": ex.example_id, "text": render_segments(segs)})
        tick = 50_000
        core = LocalSegment((cs - s) // tick, -(-(ce - s) // tick), False, False)
        core_rows.append({"example_id": ex.example_id, "text": render_segments([core])})
    return {"kinematic": pd.DataFrame(kin_rows), "one event per core": pd.DataFrame(core_rows)}


def captioner_baseline(dataset: Path, train: list, held: list) -> dict[str, pd.DataFrame]:
    """Most frequent training caption of the episode's task."""
    from flora.caption.grammar import render_caption

    tasks = _episode_tasks(dataset)
    by_task: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    overall: collections.Counter = collections.Counter()
    for ex in train:
        cap = ex.reference_obj()["caption"]
        by_task[tasks[ex.episode_id]][cap] += 1
        overall[cap] += 1
    rows = []
    for ex in held:
        c = by_task.get(tasks[ex.episode_id]) or overall
        rows.append({"example_id": ex.example_id, "text": render_caption(c.most_common(1)[0][0])})
    return {"most frequent caption of the task": pd.DataFrame(rows)}


def rewarder_baseline(train: list, held: list) -> dict[str, pd.DataFrame]:
    """Training-set mean outcome score; majority dense label (rubric: no baseline)."""
    from flora.reward.dense import render_dense

    scores = [ex.reference_obj()["score"] for ex in train if ex.task_kind == "outcome"]
    mean = sum(scores) / len(scores)
    labels = collections.Counter(
        int(r["labels"][g - 1])
        for ex in train
        if ex.task_kind == "dense"
        for r in [ex.reference_obj()]
        for g in r["groups"]
    )
    maj = labels.most_common(1)[0][0]
    dense = render_dense([maj] * 32, ["" if maj == 3 else "majority label"] * 32)
    rows = []
    for ex in held:
        if ex.task_kind == "outcome":
            rows.append({"example_id": ex.example_id, "text": f"score: {round(mean)}",
                         "expected_score": mean})  # fmt: skip
        elif ex.task_kind == "dense":
            rows.append({"example_id": ex.example_id, "text": dense, "expected_score": math.nan})
    return {"train mean score / majority dense label": pd.DataFrame(rows)}


def rewarder_prompt_baseline(dataset: Path, train: list, held: list) -> dict[str, pd.DataFrame]:
    """Outcome from the prompt alone: the score of the training episode with the same task
    and the nearest length (both are in the outcome prompt; no frame is looked at)."""
    meta = _episode_task_lengths(dataset)
    known = [(meta[ex.episode_id], ex.reference_obj()["score"])
             for ex in train if ex.task_kind == "outcome"]  # fmt: skip
    if not known:  # no outcome item to read a score from: no such baseline
        return {}
    rows = []
    for ex in held:
        if ex.task_kind != "outcome":
            continue
        task, length = meta[ex.episode_id]
        pool = [k for k in known if k[0][0] == task] or known
        score = min(pool, key=lambda k: abs(k[0][1] - length))[1]
        rows.append({"example_id": ex.example_id, "text": f"score: {score}",
                     "expected_score": float(score)})  # fmt: skip
    return {"task and length (nearest training episode)": pd.DataFrame(rows)}


# --------------------------------------------------------------------------- GRPO on its prompts


def sampled_reward(
    model_dir: Path, prompts: list, group_size: int, judge: Any, guided: bool = False
) -> list[float]:
    """Per prompt, the mean reward of ``group_size`` temperature-1 samples (its own
    prompts; NaN where no sample could be scored); ``guided``: sampled within each
    request's grammar regex, as guided rollouts are. Seeded, so two models' values pair
    by prompt."""
    from training.evaluate import backend_for
    from training.grpo import generate_groups, score_completions

    backend = backend_for(model_dir, guided=guided)
    backend.seed = 1234
    groups = generate_groups(backend, prompts, group_size, 1.0, prompts[0].request.max_new_tokens)
    out = []
    for p, resps in zip(prompts, groups, strict=True):
        vals = [r.value for r in score_completions(p, [x.text for x in resps], judge)
                if not math.isnan(r.value)]  # fmt: skip
        out.append(sum(vals) / len(vals) if vals else math.nan)
    return out


def paired_gain(
    before: list[float], after: list[float], n_boot: int, seed: int = 0
) -> dict[str, Any]:
    """Mean per-prompt gain ``after - before`` with a 95 % percentile bootstrap interval
    over prompts (prompts resampled, both models' values kept together)."""
    import random

    d = [b - a for a, b in zip(before, after, strict=True) if not (math.isnan(a) or math.isnan(b))]
    if not d:
        return {"gain": math.nan, "interval": [math.nan, math.nan], "prompts": 0}
    rng = random.Random(seed)
    boots = sorted(sum(rng.choices(d, k=len(d))) / len(d) for _ in range(max(n_boot, 1)))
    lo, hi = boots[int(0.025 * (len(boots) - 1))], boots[int(0.975 * (len(boots) - 1))]
    return {"gain": sum(d) / len(d), "interval": [lo, hi], "prompts": len(d)}


def paired_by_episode(
    items_a: pd.DataFrame, items_b: pd.DataFrame, metrics: tuple[str, ...], n_boot: int
) -> dict[str, dict[str, Any]]:
    """Two models' scored answers to the same held-out items, compared episode by episode.

    Per metric: both models' per-episode means (every episode weighs alike), their means
    over episodes (``a``, ``b``) and the mean of ``b - a`` with a 95 % bootstrap interval
    over episodes (:func:`paired_gain`). Pairing removes the spread between episodes that
    the unpaired intervals carry, so a real change shows where the intervals overlap.
    """
    ids_a, ids_b = set(items_a["example_id"]), set(items_b["example_id"])
    if ids_a != ids_b:
        raise ValueError(f"the two scorings cover different items ({len(ids_a ^ ids_b)} "
                         f"differ, e.g. {sorted(ids_a ^ ids_b)[:3]})")  # fmt: skip
    cols = list(metrics)
    per = [
        it.assign(**{c: it[c].astype(float) for c in cols}).groupby("episode_id")[cols].mean()
        for it in (items_a, items_b)
    ]
    j = per[0].merge(per[1], left_index=True, right_index=True, suffixes=("_a", "_b"))
    out: dict[str, dict[str, Any]] = {}
    for c in cols:
        g = paired_gain(list(j[f"{c}_a"]), list(j[f"{c}_b"]), n_boot)
        a, b = float(j[f"{c}_a"].mean()), float(j[f"{c}_b"].mean())
        out[c] = {"a": a, "b": b, "gain": g["gain"], "interval": g["interval"],
                  "episodes": g["prompts"]}  # fmt: skip
    return out


def _mean(xs: list[float]) -> float:
    ok = [x for x in xs if not math.isnan(x)]
    return sum(ok) / len(ok) if ok else math.nan


def scored_heldout(model: str, set_dir: Path, args: argparse.Namespace, exclude: set[str]) -> list:
    """The held-out examples every variant is scored on, free and guided alike: the set's
    held-out ``model`` examples less ``exclude`` (:func:`heldout_exclusion`), at most
    ``--eval-episodes`` episodes."""
    from training.evaluate import heldout_examples

    return heldout_examples(model, set_dir, limit=args.eval_episodes, exclude=exclude)


def _guided_set(
    model: str,
    held: list,
    args: argparse.Namespace,
    dataset: Path,
    set_dir: Path,
    exclude: set[str],
) -> Path:
    """A set whose requests carry their grammar regexes (for the guided rows and rollouts).

    A set written before sets stored ``guided_regex`` is rebuilt beside it (deterministic:
    the same held-out examples, less the same ``exclude``, checked) rather than retrained on.
    """
    if all(e.guided_regex for e in held):
        return set_dir
    from training.recipe import load_recipe
    from training.sets import build_sft_set

    again = set_dir.parent / "set_guided"
    if not (again / "examples.parquet").is_file():
        _log(f"{model}: rebuilding the set with its grammar regexes")
        s = load_recipe(f"{model}-small").sets
        profiles = ("standard",) if args.quick else s.profiles
        build_sft_set(model, dataset, again, split_fraction=args.split,
                      **{**s.sft_kwargs(), "profiles": profiles}, progress=False)  # fmt: skip
    out = scored_heldout(model, again, args, exclude)
    same = [(e.example_id, e.prompt, e.target) for e in out] == [
        (e.example_id, e.prompt, e.target) for e in held
    ]
    if not same:
        raise SystemExit(f"{again}: the rebuilt set differs from {set_dir}")
    return again


# --------------------------------------------------------------------------- one model


def _check_sft_lineage(sft_model: Path, all_held: set[str], exclude: set[str]) -> None:
    """Every held-out episode the SFT export learnt from or was selected on is left out."""
    from training.lineage import trained_episodes

    leak = (trained_episodes(sft_model) & all_held) - exclude
    if leak:
        raise SystemExit(
            f"{sft_model}: selected on or trained on held-out episodes this run scores "
            f"({sorted(leak)[:5]}); a cached SFT from another recipe or step count?"
        )


def probe_exclusion(recipe: Any, args: argparse.Namespace, candidates: set[str]) -> set[str]:
    """Held-out episodes that no variant is scored on: those GRPO's held-out probe chooses
    the exported state on (:func:`training.grpo_probe.probe_episode_ids` of ``candidates``).

    Left out whenever the recipe or ``--grpo-probe-every`` turns the probe on, even when the
    flag turns it off: a run without the probe is then scored on the same episodes as the
    recipe's, so the two compare item by item.
    """
    from training.grpo_probe import probe_episode_ids

    grpo = recipe.grpo
    probing = bool(args.grpo_steps and grpo is not None
                   and (grpo.probe_every or args.grpo_probe_every))  # fmt: skip
    if not probing or not candidates:
        return set()
    return set(probe_episode_ids(sorted(candidates), grpo.probe_episodes))


def sft_selection(recipe: Any, held: list, steps: int | None) -> set[str]:
    """Held-out episodes whose loss chooses SFT's exported state
    (:func:`training.sft.sft_eval_pool`), recorded in the export as ``selected_on`` when it
    evaluates more than once: when ``steps`` (or the recipe's) exceed ``eval_every``, or
    the recipe runs by epochs."""
    from training.sft import sft_eval_pool

    stop = steps or recipe.max_steps
    if not held or (stop is not None and stop <= recipe.eval_every):
        return set()
    return {e.episode_id for e in sft_eval_pool(held, recipe)}


def heldout_exclusion(
    recipe: Any,
    args: argparse.Namespace,
    held: list,
    seen: set[str],
    sft_steps: int | None,
) -> dict[str, set[str]]:
    """Every held-out episode no variant is scored on, computed once for all of them (free
    and guided rows, every model): ``seen`` (by the lineage), those whose loss chooses
    SFT's export (:func:`sft_selection`) and those GRPO's probe chooses on — picked, as
    :mod:`training.grpo` does, among the episodes the SFT model never saw."""
    sft = sft_selection(recipe, held, sft_steps)
    ids = {e.episode_id for e in held}
    probe = probe_exclusion(recipe, args, ids - seen - sft)
    return {"sft": sft, "probe": probe, "all": seen | sft | probe}


def run_model(model: str, args: argparse.Namespace, dataset: Path, work: Path) -> dict[str, Any]:
    from training.evaluate import backend_for, generate_outputs, score_outputs
    from training.grpo import prompts_from_examples, train_grpo
    from training.recipe import load_recipe
    from training.rewards import make_judge
    from training.sets import build_sft_set, load_set
    from training.sft import train_sft
    from training.sizes import resolve_base

    wd = work / model
    recipe = load_recipe(f"{model}-small")
    set_dir = wd / "set"
    if not (set_dir / "examples.parquet").is_file():
        _log(f"{model}: building the set")
        s = recipe.sets
        profiles = ("standard",) if args.quick else s.profiles
        build_sft_set(model, dataset, set_dir, split_fraction=args.split,
                      **{**s.sft_kwargs(), "profiles": profiles}, progress=False)  # fmt: skip
    train = [e for e in load_set(set_dir, split="train") if e.model == model]
    by_init, by_base = seen_by_init(model, args, dataset), seen_by_base(model, dataset)
    seen = by_init | by_base
    held_all = [e for e in load_set(set_dir, split="heldout") if e.model == model]
    all_held = {e.episode_id for e in held_all}
    steps = args.sft_steps
    if model == "segmenter" and args.segmenter_sft_steps:
        steps = args.segmenter_sft_steps
    # One exclusion for every variant, free and guided: the lineage's episodes, SFT's
    # checkpoint choice and GRPO's probe (which picks among what the SFT model never saw).
    excl = heldout_exclusion(recipe, args, held_all, seen, steps)
    probe_eps, exclude = excl["probe"], excl["all"]
    held = scored_heldout(model, set_dir, args, exclude)
    dropped, dropped_base = len(all_held & by_init), len(all_held & by_base)
    if dropped:
        _log(f"{model}: {dropped} held-out episodes the --init-from model trained on: not scored")
    if dropped_base:
        _log(f"{model}: {dropped_base} held-out episodes the recipe's base trained on: not scored")
    judge = make_judge("embedding") if model == "captioner" else None
    n_boot = args.bootstrap
    res: dict[str, Any] = {"model": model, "train_examples": len(train),
                           "heldout_examples": len(held),
                           "heldout_episodes": len({e.episode_id for e in held}),
                           "excluded_seen_by_init": dropped,
                           "excluded_seen_by_base": dropped_base,
                           "excluded_sft_selection": sorted(excl["sft"]),
                           "excluded_grpo_probe": sorted(probe_eps),
                           "variants": {}}  # fmt: skip

    makers: dict[str, Any] = {}  # variant -> its answers' maker (for the paired comparison)

    def slug(name: str) -> str:
        return name.replace(" ", "_").replace("/", "_")

    def keep(name: str, items: pd.DataFrame) -> pd.DataFrame:
        """A variant's scored answers, kept for the GRPO-vs-SFT comparison by episode."""
        cols = ["example_id", "episode_id", *PAIRED_METRICS[model]]
        kept = items[cols].copy()
        kept.to_parquet(wd / f"items_{slug(name)}.parquet", index=False)
        return kept

    def ev(name: str, outputs_fn) -> None:
        def go() -> dict[str, Any]:
            t0 = time.perf_counter()
            out = outputs_fn()
            r = score_outputs(model, held, out, judge=judge, n_boot=n_boot)
            if model in PAIRED_METRICS:  # the rewarder has no GRPO to compare
                keep(name, r.items)
            return {**_row(r), "seconds": time.perf_counter() - t0}

        _log(f"{model}: evaluating {name}")
        makers[name] = outputs_fn
        res["variants"][name] = _cached(wd / f"eval_{slug(name)}.json", go)

    def items_of(name: str) -> pd.DataFrame:
        p = wd / f"items_{slug(name)}.parquet"
        if p.is_file():
            return pd.read_parquet(p)
        # a row cached before answers were kept: greedy answers again, scored alike
        _log(f"{model}: answering again as {name} (its answers were not kept)")
        return keep(name, score_outputs(model, held, makers[name](), judge=judge, n_boot=0).items)

    # baselines
    if model == "segmenter":
        for name, tab in segmenter_baselines(dataset, held).items():
            ev(name, lambda tab=tab: tab)
    elif model == "captioner":
        for name, tab in captioner_baseline(dataset, train, held).items():
            ev(name, lambda tab=tab: tab)
    else:
        tabs = {**rewarder_baseline(train, held),
                **rewarder_prompt_baseline(dataset, train, held)}  # fmt: skip
        for name, tab in tabs.items():
            ev(name, lambda tab=tab: tab)

    # untrained
    base = resolve_base(recipe.base, seed=recipe.base_seed, max_pixels=recipe.max_pixels)

    def untrained():
        from flora.backends.transformers_backend import TransformersBackend

        b = TransformersBackend(base, device="cpu", batch_size=8, vision_input="images")
        return generate_outputs(b, held)

    ev("untrained", untrained)

    # SFT
    sft_dir = wd / "sft"
    if steps:  # the whole schedule (warm-up, cosine decay) over the steps actually run
        recipe = recipe.model_copy(update={"max_steps": steps})
    upd: dict[str, Any] = {"lr": recipe.lr * args.lr_scale}
    if recipe.vision_lr is not None:
        upd["vision_lr"] = recipe.vision_lr * args.lr_scale
    if args.patience is not None:  # e.g. early stop off for a long schedule
        upd["patience"] = args.patience
    if recipe.grpo is not None:
        overrides = {"lr": args.grpo_lr, "prompts_per_step": args.grpo_prompts_per_step,
                     "group_size": args.grpo_group_size, "beta": args.grpo_beta,
                     "guided_kl": args.grpo_guided_kl, "kl_bound": args.grpo_kl_bound,
                     "guided_share": args.grpo_guided_share,
                     "probe_every": args.grpo_probe_every}  # fmt: skip
        gupd: dict[str, Any] = {k: v for k, v in overrides.items() if v is not None}
        # validated (model_copy would not): a bad override fails here, not after the SFT
        upd["grpo"] = type(recipe.grpo).model_validate({**recipe.grpo.model_dump(), **gupd})
    if args.init_from:  # continue a release (full weights) or an export (the segmenter's LoRA)
        upd["init_from"] = str(args.init_from / model)
    recipe = recipe.model_copy(update=upd)
    if not (sft_dir / "model" / "flora_model.json").is_file():
        _log(f"{model}: SFT ({steps or recipe.max_steps} steps)")
        t0 = time.perf_counter()
        from training.sft import latest_checkpoint

        # A cut run (a killed job, a session's end) continues from its last checkpoint.
        resume = latest_checkpoint(sft_dir / "checkpoints") is not None
        r = train_sft(recipe, set_dir, sft_dir, max_steps=steps or None,
                      log_mlflow=False, progress=True, resume=resume)  # fmt: skip
        res["sft"] = {"steps": r.steps, "last_loss": r.last_loss,
                      "best_eval_loss": r.best_eval_loss,
                      "seconds": time.perf_counter() - t0}  # fmt: skip
        (wd / "sft_summary.json").write_text(json.dumps(res["sft"], indent=2))
    elif (wd / "sft_summary.json").is_file():
        res["sft"] = json.loads((wd / "sft_summary.json").read_text())
    _check_sft_lineage(sft_dir / "model", all_held, exclude)
    ev("SFT", lambda: generate_outputs(backend_for(sft_dir / "model"), held))
    guided_set = _guided_set(model, held, args, dataset, set_dir, exclude) if args.guided else None
    guided_held = scored_heldout(model, guided_set, args, exclude) if guided_set else None
    if guided_held is not None:
        ev("SFT, guided", lambda: generate_outputs(
            backend_for(sft_dir / "model", guided=True), guided_held))  # fmt: skip

    # GRPO: the recipe's, and with --grpo-guided also one with grammar-guided rollouts.
    if model in ("segmenter", "captioner") and args.grpo_steps > 0:
        prompts = prompts_from_examples(train)
        import random

        probe = random.Random(0).sample(prompts, min(args.probe_prompts, len(prompts)))
        g = args.probe_samples or (recipe.grpo.group_size if recipe.grpo else 8)
        # The recipe's own run: its rollouts are guided when the recipe says so (a set
        # whose prompts carry their regexes, and a guided own-prompt probe).
        recipe_guided = bool(recipe.grpo is not None and recipe.grpo.guided)
        if recipe_guided and guided_set is None:
            guided_set = _guided_set(model, held, args, dataset, set_dir, exclude)
        runs = [] if args.grpo_guided_only else [("", recipe_guided)]
        if (args.grpo_guided or args.grpo_guided_only) and guided_set:
            runs.append(("_guided", True))
        for suffix, rollouts_guided in runs:
            gdir = wd / f"grpo{suffix}"
            name = "SFT+GRPO" + (" (guided rollouts)" if suffix else "")
            gset = guided_set if rollouts_guided else set_dir
            grec = recipe
            if suffix and recipe.grpo is not None:  # --grpo-guided: every rollout guided
                share = args.grpo_guided_share if args.grpo_guided_share is not None else 1.0
                grec = recipe.model_copy(update={"grpo": recipe.grpo.model_copy(
                    update={"guided": True, "guided_share": share})})  # fmt: skip
            if args.grpo_seed is not None:  # another GRPO draw (prompts, samples), same SFT
                grec = grec.model_copy(update={"seed": args.grpo_seed})
            if not (gdir / "model" / "flora_model.json").is_file():
                _log(f"{model}: {name} ({args.grpo_steps} steps)")
                t0 = time.perf_counter()
                r = train_grpo(grec, sft_dir / "model", gset, gdir, judge=judge,
                               max_steps=args.grpo_steps, log_mlflow=False,
                               progress=True)  # fmt: skip
                summary = {"history": r.history, "seconds": time.perf_counter() - t0}
                (wd / f"grpo{suffix}_summary.json").write_text(json.dumps(summary, indent=2))
            res[f"grpo{suffix}"] = json.loads((wd / f"grpo{suffix}_summary.json").read_text())
            gprobe = probe
            if rollouts_guided:  # the same prompts, with their grammar regexes
                by_id = {p.prompt_id: p for p in prompts_from_examples(
                    [e for e in load_set(gset, split="train") if e.model == model])}  # fmt: skip
                gprobe = [by_id[p.prompt_id] for p in probe]

            def own(gp=gprobe, rg=rollouts_guided, gd=gdir) -> dict[str, Any]:
                before = sampled_reward(sft_dir / "model", gp, g, judge, rg)
                after = sampled_reward(gd / "model", gp, g, judge, rg)
                return {"prompts": len(gp), "group_size": g, "guided": rg,
                        "SFT": _mean(before), "SFT+GRPO": _mean(after),
                        "per_prompt": {"SFT": before, "SFT+GRPO": after},
                        "paired": paired_gain(before, after, args.bootstrap)}  # fmt: skip

            res[f"own_prompts{suffix}"] = _cached(wd / f"own_prompts{suffix}.json", own)
            ev(name, lambda gd=gdir: generate_outputs(backend_for(gd / "model"), held))
            pairs = [("SFT", name)]
            if guided_held is not None:
                ev(f"{name}, guided", lambda gd=gdir: generate_outputs(
                    backend_for(gd / "model", guided=True), guided_held))  # fmt: skip
                pairs.append(("SFT, guided", f"{name}, guided"))
            res[f"paired_heldout{suffix}"] = _cached(
                wd / f"paired_heldout{suffix}.json",
                lambda pairs=pairs: {
                    b: paired_by_episode(items_of(a), items_of(b), PAIRED_METRICS[model], n_boot)
                    for a, b in pairs
                },
            )
    return res


# --------------------------------------------------------------------------- report


def _gain_text(own: dict[str, Any]) -> str:
    """ ", gain +x [lo, hi] paired over prompts: raised | not established" (or nothing for a
    probe cached before per-prompt values were kept)."""
    p = own.get("paired")
    if not p:
        return ""
    lo, hi = p["interval"]
    verdict = "raised" if lo > 0 else ("lowered" if hi < 0 else "not established")
    return (f" (gain {p['gain']:+.3f}, 95 % interval [{lo:+.3f}, {hi:+.3f}] paired over "
            f"{p['prompts']} prompts: {verdict})")  # fmt: skip


def _fmt(v: float | None, ci: list | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    s = f"{v:.3f}"
    return f"{s} [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else s


def _argv() -> str:
    """The command line that produced the numbers (without the doc-writing flags)."""
    import sys

    out, skip = [], False
    for a in sys.argv[1:]:
        if skip:
            skip = False
            continue
        if a in ("--plot", "--date"):
            skip = True
            continue
        if a != "--write-docs":
            out.append(a)
    return " ".join(out)


def markdown(results: list[dict[str, Any]], args: argparse.Namespace, seconds: float) -> str:
    lines = [
        "## Learning: untrained vs SFT vs SFT+GRPO, small models "
        f"({'quick' if args.quick else 'full'}, {args.date or time.strftime('%Y-%m-%d')})",
        "",
        f"`OMP_NUM_THREADS={args.threads} python benchmarks/learning.py {_argv()}` — measured "
        f"{args.date or time.strftime('%Y-%m-%d')} (finished {time.strftime('%Y-%m-%d %H:%M')} "
        f"UTC) on 2 shared CPU cores (torch {torch.__version__}, {args.threads} "
        f"thread(s), {platform.machine()}); toy world of {args.episodes} episodes (seed "
        f"{args.seed}), held-out share {args.split} by episode hash; 95 % intervals from a "
        f"bootstrap over held-out episodes ({args.bootstrap} resamples). SFT steps: "
        f"{args.sft_steps or 'recipe'}"
        + (f" (segmenter {args.segmenter_sft_steps})" if args.segmenter_sft_steps else "")
        + (
            f"; SFT starts from `{args.init_from}/<model>` (recipe `init_from`)"
            if args.init_from
            else ""
        )
        + (f"; learning rates {args.lr_scale:g} x the recipe's" if args.lr_scale != 1 else "")
        + f"; GRPO steps: {args.grpo_steps}. Wall time "
        f"{seconds / 60:.0f} min.",
        "",
    ]
    for res in results:
        m = res["model"]
        cols = HEAD[m]
        lines += [f"### {m} — {res['heldout_examples']} held-out items from "
                  f"{res['heldout_episodes']} episodes ({res['train_examples']} train"
                  + (f"; {res['excluded_seen_by_init']} held-out episodes left out: the "
                     "--init-from model trained on them" if res.get("excluded_seen_by_init")
                     else "")
                  + (f"; {res['excluded_seen_by_base']} held-out episodes left out: the "
                     "recipe's base trained on them" if res.get("excluded_seen_by_base")
                     else "") + ")", "",
                  "| variant | " + " | ".join(cols) + " |",
                  "| --- |" + " --- |" * len(cols)]  # fmt: skip
        for name, v in res["variants"].items():
            cells = [_fmt(v["metrics"].get(c), v["intervals"].get(c)) for c in cols]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        for key, what in (("own_prompts", "GRPO"), ("own_prompts_guided", "GRPO, guided rollouts")):
            if key in res:
                o = res[key]
                how = "within the grammar" if o.get("guided") else "free"
                lines += ["", f"{what} on its own prompts ({o['prompts']} training prompts, "
                          f"{o['group_size']} samples each at temperature 1, {how}): mean "
                          f"reward SFT {o['SFT']:.3f} → SFT+GRPO {o['SFT+GRPO']:.3f}"
                          + _gain_text(o) + "."]  # fmt: skip
        if "sft" in res:
            s = res["sft"]
            ev = s.get("best_eval_loss")
            lines += ["", f"SFT: {s['steps']} steps, last loss {s['last_loss']:.3f}"
                      + (f", best held-out loss {ev:.3f}" if ev is not None else "")
                      + f", {s['seconds'] / 60:.1f} min."]  # fmt: skip
        lines.append("")
    lines += verdicts(results)
    lines += ["", f"![learning](img/{args.plot})", ""]
    return "\n".join(lines)


def verdicts(results: list[dict[str, Any]]) -> list[str]:
    """Plain statements of which targets were met (and by how much they were missed)."""
    out = ["### Targets", ""]
    for res in results:
        m = res["model"]
        v = res["variants"]
        sft = v.get("SFT")
        if sft is None:
            continue
        pr = sft["metrics"].get("parse_rate", math.nan)
        out.append(f"- {m}: parse rate after SFT {pr:.2f} "
                   f"({'meets' if pr >= 0.95 else 'misses'} the 0.95 target).")  # fmt: skip
        for c in HEAD[m][1:]:
            if c in NOT_JUDGED:
                continue
            s = sft["metrics"].get(c)
            if s is None or math.isnan(s):
                continue
            lower = c in LOWER_IS_BETTER
            beaten, ceiling = [], []
            best = 0.0 if lower else 1.0  # judged metrics: rates in [0, 1], errors >= 0
            for n, x in v.items():
                o = x["metrics"].get(c)
                if n.startswith("SFT") or o is None or math.isnan(o):  # the model itself
                    continue
                if s == o == best:
                    ceiling.append(n)  # a tie at the best possible value cannot be beaten
                elif (s >= o) if lower else (s <= o):
                    beaten.append(n)
            if beaten:
                out.append(f"  - SFT does not beat {', '.join(beaten)} on {c} ({s:.3f}).")
            if ceiling:
                out.append(f"  - SFT ties {', '.join(ceiling)} on {c} at its ceiling ({s:.3f}).")
        sg = v.get("SFT, guided")
        if sg is not None:
            gp = sg["metrics"].get("parse_rate", math.nan)
            out.append(f"  - With grammar-guided decoding (the engine's served path) the SFT "
                       f"model parses {gp:.2f} ({'meets' if gp >= 0.95 else 'misses'} "
                       "the target there).")  # fmt: skip
        for gname, okey in (("SFT+GRPO", "own_prompts"),
                            ("SFT+GRPO (guided rollouts)", "own_prompts_guided")):  # fmt: skip
            g = v.get(gname)
            if g is None:
                continue
            key = "r_seg" if m == "segmenter" else "r_cap"
            lo, hi = sft["intervals"].get(key, [math.nan, math.nan])
            gv = g["metrics"][key]
            o = res.get(okey, {})
            paired = res.get(okey.replace("own_prompts", "paired_heldout"), {})
            out.append(
                f"  - {gname[4:]}: own-prompt reward {o.get('SFT', math.nan):.3f} → "
                f"{o.get('SFT+GRPO', math.nan):.3f}{_gain_text(o)}; "
                f"held-out {key} {sft['metrics'][key]:.3f} → "
                f"{gv:.3f} (SFT interval [{lo:.2f}, {hi:.2f}]: "
                f"{'within' if gv >= lo else 'BELOW'})"
                + "".join(_paired_text(v, p) for v, p in paired.items())
                + "."
            )
    return out


def _paired_text(variant: str, p: dict[str, dict[str, Any]]) -> str:
    """ "; <variant> paired with the SFT model over N held-out episodes: r_seg +x [lo, hi]
    (lowered | raised | no change shown), parse …" """
    parts = []
    for metric, q in p.items():
        lo, hi = q["interval"]
        verdict = "lowered" if hi < 0 else ("raised" if lo > 0 else "no change shown")
        parts.append(f"{'parse' if metric == 'parsed' else metric} {q['gain']:+.3f} "
                     f"[{lo:+.3f}, {hi:+.3f}] ({verdict})")  # fmt: skip
    n = next(iter(p.values()))["episodes"] if p else 0
    return f"; {variant} paired with the SFT model over {n} held-out episodes: " + ", ".join(parts)


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 4), squeeze=False)
    for ax, res in zip(axes[0], results, strict=True):
        m = res["model"]
        key = {"segmenter": "r_seg", "captioner": "r_cap", "rewarder": "dense.accuracy"}[m]
        names, vals, errs = [], [], [[], []]
        for n, v in res["variants"].items():
            x = v["metrics"].get(key)
            if x is None or math.isnan(x):
                names.append(f"{n}\n(nothing parsed)")
                vals.append(0.0)
                errs[0].append(0.0)
                errs[1].append(0.0)
                continue
            lo, hi = v["intervals"].get(key, [x, x])
            names.append(n)
            vals.append(x)
            errs[0].append(max(0.0, x - lo))
            errs[1].append(max(0.0, hi - x))
        ax.bar(range(len(vals)), vals, yerr=errs, capsize=4, color="#4c72b0")
        ax.set_xticks(range(len(vals)), names, rotation=30, ha="right", fontsize=8)
        ax.set_ylim(0, 1)
        ax.set_title(f"{m}: held-out {key} (95% CI)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short schedules (minutes per model)")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument(
        "--full-durations",
        action="store_true",
        help="with --quick: episodes of the generator's 5 s-3 min, not 12-45 s",
    )
    ap.add_argument("--work", type=Path, default=Path("/tmp/flora-learning"))
    ap.add_argument("--episodes", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--split", type=float, default=0.25)
    ap.add_argument("--sft-steps", type=int, default=None)
    ap.add_argument("--segmenter-sft-steps", type=int, default=None,
                    help="SFT steps for the segmenter (its windows are ~3x longer)")  # fmt: skip
    ap.add_argument("--grpo-steps", type=int, default=None)
    ap.add_argument("--eval-episodes", type=int, default=None)
    ap.add_argument("--probe-prompts", type=int, default=8)
    ap.add_argument("--probe-samples", type=int, default=None,
                    help="samples per own-prompt probe prompt (default: the GRPO group "
                         "size); fixes the probe when runs compare group sizes")  # fmt: skip
    ap.add_argument("--grpo-lr", type=float, default=None,
                    help="Override the recipes' GRPO learning rate.")  # fmt: skip
    ap.add_argument("--guided", action="store_true",
                    help="also evaluate SFT / SFT+GRPO with grammar-guided decoding")  # fmt: skip
    ap.add_argument("--grpo-guided", action="store_true",
                    help="with --guided: also run GRPO with grammar-guided rollouts")  # fmt: skip
    ap.add_argument("--grpo-guided-only", action="store_true",
                    help="with --guided: run GRPO with grammar-guided rollouts only")  # fmt: skip
    ap.add_argument("--grpo-prompts-per-step", type=int, default=None,
                    help="Override the recipes' GRPO prompts per step.")  # fmt: skip
    ap.add_argument("--grpo-group-size", type=int, default=None,
                    help="Override the recipes' GRPO group size G.")  # fmt: skip
    ap.add_argument("--grpo-beta", type=float, default=None,
                    help="Override the recipes' GRPO KL coefficient.")  # fmt: skip
    ap.add_argument("--grpo-guided-kl", choices=("masked", "unmasked"), default=None,
                    help="Override grpo.guided_kl (the KL of guided rollouts).")  # fmt: skip
    ap.add_argument("--grpo-kl-bound", type=float, default=None,
                    help="Set grpo.kl_bound (bounded per-token k3 KL; log-ratio).")  # fmt: skip
    ap.add_argument("--grpo-guided-share", type=float, default=None,
                    help="Override grpo.guided_share (guided share of each group; "
                         "--grpo-guided runs default to 1.0: all guided).")  # fmt: skip
    ap.add_argument("--grpo-probe-every", type=int, default=None,
                    help="Override grpo.probe_every (0: no probe, the last step is "
                         "exported)")  # fmt: skip
    ap.add_argument("--grpo-seed", type=int, default=None,
                    help="GRPO's seed (prompt order, rollout samples); default: the "
                         "recipe's seed, which the SFT also used")  # fmt: skip
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument("--write-docs", action="store_true")
    ap.add_argument("--plot", default="learning.png", help="file name under docs/img/")
    ap.add_argument("--date", default=None, help="date written in the report (default: today)")
    ap.add_argument(
        "--release",
        type=Path,
        default=None,
        help="copy the full-weight SFT models (captioner, rewarder) to DIR/<model> "
        "with their held-out results (training.release; make demo's init_from)",
    )
    ap.add_argument(
        "--init-from",
        type=Path,
        default=None,
        help="SFT starts from DIR/<model> (recipe init_from: a release's full weights, or an "
        "exported segmenter's LoRA adapter); the untrained row stays the random base",
    )
    ap.add_argument(
        "--lr-scale",
        type=float,
        default=1.0,
        help="multiply the recipe's learning rates (e.g. 0.5 with --init-from)",
    )
    ap.add_argument("--threads", type=int, default=1, help="torch threads (one per model run)")
    ap.add_argument("--patience", type=int, default=None,
                    help="override the recipes' early-stop patience (evaluations)")  # fmt: skip
    args = ap.parse_args()
    if args.probe_samples is not None and args.probe_samples < 1:  # `or` would hide a 0
        ap.error(f"--probe-samples must be >= 1, got {args.probe_samples}")
    from training.recipe import SEED_MAX

    if args.grpo_seed is not None and not 0 <= args.grpo_seed <= SEED_MAX:  # fail before SFT
        ap.error(f"--grpo-seed must be in [0, {SEED_MAX}], got {args.grpo_seed}")
    if (args.grpo_guided or args.grpo_guided_only) and not args.guided:
        # without --guided there is no guided set: the run would silently skip GRPO
        ap.error("--grpo-guided / --grpo-guided-only need --guided")
    q = args.quick
    args.episodes = args.episodes or (16 if q else 40)
    args.sft_steps = args.sft_steps if args.sft_steps is not None else (120 if q else 0)
    args.grpo_steps = args.grpo_steps if args.grpo_steps is not None else (6 if q else 30)
    args.eval_episodes = args.eval_episodes or (4 if q else None)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    from flora.data.synth import generate

    tag = "_quick" if q and not args.full_durations else ""
    dataset = args.work / f"toy_{args.episodes}_{args.seed}{tag}"
    if not (dataset / "ground_truth").is_dir():
        _log(f"generating {args.episodes} toy-world episodes")
        # --quick: short episodes (fewer windows per episode); full: the generator's 5 s-3 min.
        # --full-durations: the generator's 5 s-3 min even with --quick (the task families
        # follow the length, and make demo's toy world has them all).
        short = q and not args.full_durations
        durs = [(12.0, 20.0, 30.0, 45.0)[i % 4] for i in range(args.episodes)] if short else None
        generate(dataset, episodes=args.episodes, seed=args.seed, durations_s=durs,
                 progress=False)  # fmt: skip
    results = []
    for m in args.models.split(","):
        results.append(run_model(m, args, dataset, args.work))
        (args.work / "results.json").write_text(json.dumps(results, indent=2, default=str))
    # Wall time over every (resumed) invocation on this work dir: cached stages cost nothing.
    wall = args.work / "wall_seconds.json"
    spent = json.loads(wall.read_text())["seconds"] if wall.is_file() else 0.0
    spent += time.perf_counter() - t0
    wall.write_text(json.dumps({"seconds": spent}))
    md = markdown(results, args, spent)
    print(md)
    if args.release:
        from flora.data.synth import load_config

        # The world the data was made under (a resumed work dir may hold an older one).
        release(results, args, load_config(dataset).world)
    if args.write_docs:
        plot(results, ROOT / "docs" / "img" / args.plot)
        doc = ROOT / "docs" / "benchmarks.md"
        doc.write_text(insert_section(doc.read_text(), md))


def release(results: list[dict[str, Any]], args: argparse.Namespace, world: int) -> None:
    """Release each full-weight model's SFT export with what this run measured of it."""
    import datetime

    from training.release import release_model

    for res in results:
        model = res["model"]
        if model == "segmenter":  # a LoRA over the random base: nothing to start from
            continue
        card = {
            "trained_by": f"python benchmarks/learning.py {_argv()}",
            "date": args.date or datetime.date.today().isoformat(),
            "data": {"toy_world_seed": args.seed, "episodes": args.episodes,
                     "toy_world_version": world,
                     "heldout_share": args.split, "train_examples": res["train_examples"]},
            "sft": res.get("sft", {}),
            "heldout": {"episodes": res["heldout_episodes"], "items": res["heldout_examples"],
                        "variants": res["variants"]},
            "note": "the demo's toy world (seed 0) is not part of this data",
        }  # fmt: skip
        dst = release_model(args.work / model / "sft" / "model", args.release / model, card)
        _log(f"{model}: released to {dst}")


def insert_section(doc: str, md: str) -> str:
    """``doc`` with ``md`` placed after the last "Learning" section (the Learning runs stay
    together, newest last), or at the end when there is none."""
    last = doc.rfind("\n## Learning:")
    nxt = doc.find("\n## ", last + 1) if last >= 0 else -1
    if nxt < 0:
        return doc.rstrip("\n") + "\n\n" + md.rstrip("\n") + "\n"
    return doc[: nxt + 1] + md.rstrip("\n") + "\n\n" + doc[nxt + 1 :]


if __name__ == "__main__":
    main()
