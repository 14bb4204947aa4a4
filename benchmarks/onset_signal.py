"""Is a failure's onset visible in what the small rewarder reads?  (not a test)

    python benchmarks/onset_signal.py --set SET --model-dir RUN/model --out OUT \
        [--vision small] [--train-windows 600] [--threads 2] \
        [--model-only] [--unseen-by OTHER/model]

The small rewarder declares failures it cannot place (`docs/benchmarks.md`): its free
answers say ``worst: 1`` over 32 normal groups. This asks whether the 0.5 s group where a
failure *starts* is readable at each stage of its input, when the reader is told which two
frames belong to the group — the binding the language model has to learn for itself.

For every retained group of every dense window, a group's features are its two frames and
their changes (frame 2g−1 minus frame 2g−3, frame 2g minus 2g−1), each frame first reduced
to its leading principal components. Readers are fit on the set's training windows and
ranked on the windows of the held-out episodes the model never trained on. Scored groups
are those not right after a failure group (so copying the line above does not count);
positives are failure onsets. Stages:

* ``position in the window``: the group number and the window's first/final flags only;
* ``pixels, render (1/4)``: the set's 4 Hz mosaics, block-averaged 4 × 4;
* ``pixels, model input``: the image processor's patches at the size's pixel budget;
* ``visual tokens, <spec>``: after the vision tower and merger of ``--vision`` models
  (default: the scored model) — what the language model receives;
* ``the model's P(1)``: the rewarder itself, teacher-forced on the reference answer
  (``benchmarks/dense_probe.py``), no reader fit.

``--model-only`` keeps the model's own P(1) and the position reader alone (minutes, not
ten): enough to compare models, which ``--unseen-by`` ranks on the same groups when their
lineages differ (one trained over the released captioner, one from scratch).

Each stage is read by a linear reader (logistic regression) and a small MLP. AUC and
average precision (AP; a random ranking scores the onset rate) come with 95 % intervals
from a bootstrap over held-out episodes. Writes ``result.json`` and ``onset_signal.png``
(precision-recall curves) under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

PCS_PER_FRAME = 128  # principal components kept per frame (a group reads 4 such vectors)


def group_rows(ref: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per retained group of a dense reference: its label, whether a failure starts
    there (``onset``) and whether it is scored (``fresh``: first group or not after a 1)."""
    labels = [int(x) for x in ref["labels"]]
    rows = []
    for g in ref["groups"]:
        after_failure = g > 1 and labels[g - 2] == 1
        rows.append({
            "window": int(ref["window"]),
            "group": int(g),
            "label": labels[g - 1],
            "onset": labels[g - 1] == 1 and not after_failure,
            "fresh": not after_failure,
        })  # fmt: skip
    return rows


def group_features(frames: np.ndarray, groups: Sequence[int]) -> np.ndarray:
    """Per group g: frames 2g−1 and 2g and the changes into them (from frame 2g−3, the
    previous group's first frame, clamped at the window's start; and from 2g−1)."""
    out = []
    for g in groups:
        a, b = 2 * g - 2, 2 * g - 1  # 0-based frames of group g
        prev = max(a - 2, 0)
        out.append(np.concatenate([frames[a], frames[b], frames[a] - frames[prev],
                                   frames[b] - frames[a]]))  # fmt: skip
    return np.stack(out)


def position_features(ref: dict[str, Any], n_windows: int) -> np.ndarray:
    """Group number (one-hot of 32) and the window's first / final flags, per group."""
    out = []
    for g in ref["groups"]:
        v = np.zeros(34, np.float32)
        v[g - 1] = 1.0
        v[32] = float(ref["window"] == 0)
        v[33] = float(ref["window"] == n_windows - 1)
        out.append(v)
    return np.stack(out)


def block_mean(frames: Sequence[np.ndarray], k: int = 4) -> np.ndarray:
    """Frames (H × W × C) averaged over k × k blocks and flattened, one row per frame."""
    arr = np.stack([np.asarray(f, np.float32) for f in frames])
    n, h, w, c = arr.shape
    arr = arr[:, : h // k * k, : w // k * k].reshape(n, h // k, k, w // k, k, c)
    return arr.mean((2, 4)).reshape(n, -1)


def frame_reducer(sample: np.ndarray, n_components: int = PCS_PER_FRAME, seed: int = 0) -> Any:
    """Standardise then project frames onto their leading principal components (fit on
    ``sample``, training frames only)."""
    from sklearn.decomposition import PCA
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    n = min(n_components, sample.shape[0], sample.shape[1])
    return make_pipeline(StandardScaler(), PCA(n, random_state=seed)).fit(sample)


def readout(
    x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, kind: str, seed: int = 0
) -> np.ndarray:
    """Scores of a reader fit on (x_train, y_train): ``linear`` (class-balanced logistic
    regression) or ``mlp`` (one hidden layer of 256, positives repeated to balance)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.neural_network import MLPClassifier
    from sklearn.preprocessing import StandardScaler

    sc = StandardScaler().fit(x_train)
    a, b = sc.transform(x_train), sc.transform(x_test)
    if kind == "linear":
        clf = LogisticRegression(C=0.1, max_iter=3000, class_weight="balanced")
        return clf.fit(a, y_train).decision_function(b)
    if kind != "mlp":
        raise ValueError(f"unknown reader {kind!r} (linear, mlp)")
    pos, neg = np.flatnonzero(y_train), np.flatnonzero(~y_train)
    reps = max(1, len(neg) // max(1, len(pos)))
    idx = np.concatenate([np.repeat(pos, reps), neg])
    mlp = MLPClassifier((256,), alpha=1e-2, max_iter=200, early_stopping=True,
                        random_state=seed)  # fmt: skip
    return mlp.fit(a[idx], y_train[idx]).predict_proba(b)[:, 1]


def ranked(
    y: np.ndarray, score: np.ndarray, episodes: np.ndarray, n_boot: int = 1000, seed: int = 0
) -> dict[str, Any]:
    """AUC and average precision of ``score`` for ``y``, with 95 % intervals from a
    bootstrap over ``episodes`` (resamples without both classes are skipped), and the best
    precision at which a quarter / half of the positives are recalled."""
    from sklearn.metrics import average_precision_score, precision_recall_curve, roc_auc_score

    y = np.asarray(y, bool)
    if y.all() or not y.any():
        raise ValueError(
            f"ranking needs onsets and other groups; got {int(y.sum())} onsets in {len(y)} groups"
        )
    rng = np.random.default_rng(seed)
    by_ep = {e: np.flatnonzero(episodes == e) for e in np.unique(episodes)}
    keys = np.array(sorted(by_ep))
    aucs, aps = [], []
    for _ in range(n_boot):
        m = np.concatenate([by_ep[e] for e in rng.choice(keys, size=len(keys))])
        if y[m].any() and not y[m].all():
            aucs.append(roc_auc_score(y[m], score[m]))
            aps.append(average_precision_score(y[m], score[m]))
    if not aucs:
        raise ValueError("no bootstrap resample of the episodes holds both classes")
    prec, rec, _ = precision_recall_curve(y, score)
    return {
        "auc": float(roc_auc_score(y, score)),
        "auc_ci": [float(np.percentile(aucs, 2.5)), float(np.percentile(aucs, 97.5))],
        "ap": float(average_precision_score(y, score)),
        "ap_ci": [float(np.percentile(aps, 2.5)), float(np.percentile(aps, 97.5))],
        **{f"precision_at_recall_{r}": float(prec[rec >= r].max()) for r in (0.25, 0.5)},
        "positives": int(y.sum()),
        "groups": int(len(y)),
    }


def windows_per_episode(examples: Sequence[Any]) -> dict[str, int]:
    """Dense windows of each episode among ``examples`` (last window index + 1)."""
    out: dict[str, int] = {}
    for ex in examples:
        out[ex.episode_id] = max(out.get(ex.episode_id, 0), ex.reference_obj()["window"] + 1)
    return out


def _windows(
    examples: Sequence[Any], n_windows: dict[str, int]
) -> tuple[list[dict[str, Any]], list[np.ndarray]]:
    """Group rows (with episode ids and the window's position features) of dense examples;
    ``n_windows`` counts from the whole split, so a subset keeps the true final window."""
    rows, pos = [], []
    for ex in examples:
        ref = ex.reference_obj()
        for r in group_rows(ref):
            rows.append({**r, "episode": ex.episode_id})
        pos.append(position_features(ref, n_windows[ex.episode_id]))
    return rows, pos


def _plot(curves: dict[str, tuple[np.ndarray, np.ndarray]], rate: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    for name, (rec, prec) in curves.items():
        ax.plot(rec, prec, label=name)
    ax.axhline(rate, color="grey", ls=":", label=f"random ({rate:.3f})")
    ax.set_xlabel("recall of failure onsets")
    ax.set_ylabel("precision")
    ax.set_title("Failure onsets, held-out dense windows")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # sibling benchmark helpers
    from dense_probe import failure_probs
    from frame_signal import load_vision, processed, token_vectors
    from sklearn.metrics import precision_recall_curve
    from threadpoolctl import threadpool_limits
    from tqdm import tqdm

    from training.evaluate import unseen_heldout
    from training.sets import load_set

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", type=Path, required=True, help="a rewarder set (training.sets)")
    ap.add_argument("--model-dir", type=Path, required=True, help="an exported rewarder")
    ap.add_argument("--vision", action="append", default=[], help="a model whose tokens to read")
    ap.add_argument("--size", default="small", help="the size whose pixel budget applies")
    ap.add_argument("--train-windows", type=int, default=None, help="cap (random subset)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--unseen-by", type=Path, action="append", default=[],
                    help="another exported model whose lineage is left out too, so models of "
                    "different lineages are ranked on the same groups (repeatable)")  # fmt: skip
    ap.add_argument(
        "--model-only",
        action="store_true",
        help="only the model's own P(1) (and position): no pixel or token readers",
    )
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    # The readers run on one BLAS thread, as in the documented runs; torch keeps --threads.
    threadpool_limits(1, user_api="blas")
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()

    rng = np.random.default_rng(0)
    train = load_set(args.set, split="train", kinds=["dense"])
    n_windows = windows_per_episode(train)
    if args.train_windows is not None and args.train_windows < len(train):
        keep = sorted(rng.choice(len(train), size=args.train_windows, replace=False))
        train = [train[i] for i in keep]
    unseen = unseen_heldout("rewarder", args.set, args.model_dir, also_unseen_by=args.unseen_by)
    held = [e for e in unseen.examples if e.task_kind == "dense"]
    if not train or not held:
        raise SystemExit(
            f"{args.set}: {len(train)} training and {len(held)} held-out dense windows that "
            f"{args.model_dir} never trained on; both are needed"
        )
    n_windows |= windows_per_episode(held)
    print(f"{len(train)} training windows, {len(held)} held-out windows", flush=True)

    stages: dict[str, Any] = {}
    if not args.model_only:
        stages["pixels, render (1/4)"] = block_mean
        _, size_proc = load_vision(args.size)
        stages["pixels, model input"] = lambda fr: np.stack(
            [p.reshape(-1) for p in processed(fr, size_proc)]
        )
        for spec in args.vision or [str(args.model_dir)]:
            vm, vp = load_vision(spec)
            stages[f"visual tokens, {spec}"] = lambda fr, vm=vm, vp=vp: np.stack(
                [t.reshape(-1) for t in token_vectors(vm, vp, fr)]
            )

    rows_tr, pos_tr = _windows(train, n_windows)
    rows_te, pos_te = _windows(held, n_windows)
    y_tr = np.array([r["onset"] for r in rows_tr])
    y_te = np.array([r["onset"] for r in rows_te])
    f_tr = np.array([r["fresh"] for r in rows_tr])
    f_te = np.array([r["fresh"] for r in rows_te])
    ep_te = np.array([r["episode"] for r in rows_te])
    scores: dict[str, np.ndarray] = {}
    model, proc = load_vision(str(args.model_dir))
    probs: list[float] = []
    for ex in tqdm(held, desc="the model's P(1)"):
        p1 = failure_probs(model, proc, ex)
        probs.extend(p1[g - 1] for g in ex.reference_obj()["groups"])
    scores["the model's P(1), teacher-forced"] = np.asarray(probs)[f_te]
    scores["position in the window, linear"] = readout(
        np.concatenate(pos_tr)[f_tr], y_tr[f_tr], np.concatenate(pos_te)[f_te], "linear"
    )
    for name, frames_of in stages.items():
        per_tr = [frames_of(ex.to_request().images) for ex in tqdm(train, desc=name)]
        per_te = [frames_of(ex.to_request().images) for ex in tqdm(held, desc=f"{name}, held")]
        # Gather the PCA sample frame by frame: concatenating every training frame first
        # doubled the peak memory of the model-input stage (~4 GB of patches).
        where = [(w, i) for w, f in enumerate(per_tr) for i in range(len(f))]
        pick = rng.choice(len(where), size=min(6000, len(where)), replace=False)
        red = frame_reducer(np.stack([per_tr[where[k][0]][where[k][1]] for k in pick]))

        def feats(per: list[np.ndarray], exs: Sequence[Any], red: Any = red) -> np.ndarray:
            return np.concatenate([group_features(red.transform(f), ex.reference_obj()["groups"])
                                   for f, ex in zip(per, exs, strict=True)])  # fmt: skip

        x_tr, x_te = feats(per_tr, train)[f_tr], feats(per_te, held)[f_te]
        del per_tr, per_te
        for kind in ("linear", "mlp"):
            scores[f"{name}, {kind}"] = readout(x_tr, y_tr[f_tr], x_te, kind)

    yt, et = y_te[f_te], ep_te[f_te]
    result: dict[str, Any] = {
        "set": str(args.set), "model_dir": str(args.model_dir),
        "unseen_by": [str(p) for p in args.unseen_by], "left_out_seen": unseen.left_out,
        "train_windows": len(train), "heldout_windows": len(held),
        "heldout_episodes": len(set(ep_te.tolist())), "onset_rate": float(yt.mean()),
        "readers": {}, "seconds": 0.0,
    }  # fmt: skip
    curves = {}
    print(f"| reader | AUC | AP (random {yt.mean():.3f}) | precision at recall 0.25 / 0.5 |")
    print("| --- | --- | --- | --- |")
    for name, s in scores.items():
        r = ranked(yt, s, et)
        result["readers"][name] = r
        prec, rec, _ = precision_recall_curve(yt, s)
        curves[name] = (rec, prec)
        auc, ap_ = r["auc_ci"], r["ap_ci"]
        print(f"| {name} | {r['auc']:.3f} [{auc[0]:.2f}, {auc[1]:.2f}] | "
              f"{r['ap']:.3f} [{ap_[0]:.3f}, {ap_[1]:.3f}] | "
              f"{r['precision_at_recall_0.25']:.2f} / {r['precision_at_recall_0.5']:.2f} |",
              flush=True)  # fmt: skip
    result["seconds"] = time.perf_counter() - t0
    (args.out / "result.json").write_text(json.dumps(result, indent=2))
    _plot(curves, float(yt.mean()), args.out / "onset_signal.png")


if __name__ == "__main__":
    main()
