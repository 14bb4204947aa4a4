"""``flora policy train``: a DiT flow policy with training-time RTC on a LeRobot dataset.

Reads any dataset ``flora.data.open_dataset`` understands (the toy world by default),
cuts every step of every episode into an H-step action chunk (padded with the last action
at the episode end), and conditions the expert on

* the proprioceptive state (standardised),
* the language of the moment: the curated caption of the event covering that step when an
  ``events`` table is given (the engine's captions: columns start_us, end_us, caption and
  episode_id or episode_index), else the episode's task text — hashed word tokens,
* optionally tiny image features of the main camera (``image_features=True``: an 8x8 RGB
  thumbnail of the frame shown at that step).

Training-time RTC is on for the last ``rtc_epochs`` epochs (all by default) with delays from
a uniform or exponentially decreasing distribution. Checkpoints go to ``out``; params, the
loss per epoch, the validation loss and the final checkpoint are logged to MLflow
(``flora.tracking``). An episode that cannot be read is recorded with its reason and the
rest of the dataset is used.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from flora.data.dataset import dataset_name
from flora.data.episode import Episode, FloraDataError, make_episode_id
from flora.policy import rtc
from flora.policy.configuration_dit import DiTConfig
from flora.policy.modeling_dit import DiTActionExpert, hash_tokens
from flora.policy.train import (
    ChunkDataset,
    TrainConfig,
    TrainState,
    load_checkpoint,
    new_state,
    save_checkpoint,
    train_epochs,
)

THUMB = 8  # image-feature thumbnail side


class PolicyConfigError(ValueError):
    """A :class:`PolicyTrainConfig` field out of range; ``field`` names it (the CLI turns
    it into a usage error on the matching option)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


@dataclass
class PolicyTrainConfig:
    """Everything ``flora policy train`` needs."""

    dataset: Path
    out: Path
    horizon: int = 16
    epochs: int = 20
    rtc_epochs: int | None = None  # None: training-time RTC for every epoch
    max_delay: int = 5  # delays in [0, max_delay)
    delay_dist: str = "exp"  # "exp" (weights 2^-d) | "uniform"
    hidden: int = 128
    depth: int = 4
    heads: int = 4
    lang_vocab: int = 4096
    lang_tokens: int = 24
    batch_size: int = 256
    lr: float = 5e-4
    image_features: bool = False
    events: Path | None = None
    episodes: list[int] | None = None
    # Curated mixture (flora.curate): train on its ``mixture_split`` rows, steps sampled by
    # their rows' weights; episodes outside it are left out. None: every step uniformly.
    mixture: Path | None = None
    mixture_split: str = "policy"
    val_fraction: float = 0.1
    checkpoint_every: int = 5
    seed: int = 0
    device: str | None = None  # None: settings.device ("auto": cuda when available)
    mlflow: bool = True
    run_id: str | None = None  # reopen a pipeline's MLflow run
    experiment: str | None = None
    progress: bool = True
    # Step-counted training (a recipe such as "real-robot": 8,000 steps); when set, the
    # epoch count is derived from it and training stops at exactly this many steps.
    max_steps: int | None = None
    denoise_steps: int = 5  # Euler steps when the trained policy is evaluated / served
    recipe: str | None = None  # name of the recipe this config came from (logged)

    def __post_init__(self) -> None:
        self.dataset = Path(self.dataset)
        self.out = Path(self.out)
        self.events = Path(self.events) if self.events is not None else None
        if self.delay_dist not in ("exp", "uniform"):
            raise ValueError(f"delay_dist must be 'exp' or 'uniform', got {self.delay_dist!r}")
        if not 1 <= self.max_delay < self.horizon:
            raise PolicyConfigError(
                "max_delay",
                f"max_delay ({self.max_delay}) must be in [1, horizon = {self.horizon}): a "
                "delay is a number of steps inside one chunk",
            )
        # Caught here rather than minutes later, when the model is built or a step runs.
        if self.hidden % self.heads:
            raise PolicyConfigError(
                "hidden", f"hidden ({self.hidden}) must be a multiple of the {self.heads} heads"
            )
        if not self.lr > 0:
            raise PolicyConfigError("lr", f"lr must be > 0, got {self.lr}")
        if self.rtc_epochs is not None and not 0 <= self.rtc_epochs <= self.epochs:
            raise ValueError("rtc_epochs must lie in [0, epochs]")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        if self.denoise_steps < 1:
            raise ValueError(f"denoise_steps must be >= 1, got {self.denoise_steps}")

    def delays(self) -> rtc.DelayDistribution:
        """The training delay distribution."""
        if self.delay_dist == "uniform":
            return rtc.DelayDistribution.uniform(self.max_delay)
        return rtc.DelayDistribution.exponential(self.max_delay, 0.5)


@dataclass
class EpisodeFailure:
    """An episode left out of training, and why."""

    episode: int
    reason: str


@dataclass
class PolicyData:
    """Training tensors plus what is needed to normalise / un-normalise at inference."""

    train: ChunkDataset
    val: ChunkDataset | None
    stats: dict[str, list[float]]
    failures: list[EpisodeFailure] = field(default_factory=list)
    episodes: list[int] = field(default_factory=list)
    caption_steps: int = 0  # steps whose text came from a curated caption
    val_episodes: list[int] = field(default_factory=list)  # held out of ``train``
    dataset_name: str = ""
    dataset_root: Path | None = None  # the folder read (a Hub dataset's local snapshot)


# ------------------------------------------------------------------------- captions
def load_captions(path: str | Path) -> pd.DataFrame:
    """Read an events table (a Parquet file or a TableStore table directory) and check it.

    Returns columns ``key`` (episode_id or episode_index as str), start_us, end_us, caption.
    """
    path = Path(path)
    if path.is_dir():
        parts = sorted(path.glob("*.parquet"))
        if not parts:
            raise FloraDataError("events table has no Parquet parts", file=path)
        df = pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)
    elif path.exists():
        df = pd.read_parquet(path)
    else:
        raise FloraDataError("events table not found", file=path)
    for col in ("start_us", "end_us", "caption"):
        if col not in df.columns:
            raise FloraDataError("events table is missing a column", file=path, field=col)
    if "episode_id" in df.columns:
        key = df["episode_id"].astype(str)
    elif "episode_index" in df.columns:
        key = df["episode_index"].astype(int).astype(str)
    else:
        raise FloraDataError(
            "events table needs episode_id or episode_index", file=path, field="episode_id"
        )
    out = pd.DataFrame(
        {
            "key": key,
            "start_us": df["start_us"].astype("int64"),
            "end_us": df["end_us"].astype("int64"),
            "caption": df["caption"].astype(str),
        }
    )
    # A row without caption text (e.g. a segmenter-only events table) conditions nothing.
    out = out[out.caption.str.strip() != ""].reset_index(drop=True)
    bad = out[(out.start_us < 0) | (out.end_us <= out.start_us)]
    if len(bad):
        r = bad.iloc[0]
        raise FloraDataError(
            f"event [{r.start_us}, {r.end_us}) violates 0 <= start < end",
            episode=r.key,
            file=path,
            field="start_us",
        )
    return out


CAPTION_TABLES = ("captions", "events")


def find_caption_table(outputs_dir: str | Path) -> Path | None:
    """The engine's curated captions under ``outputs_dir``: the first of the ``captions``
    (captioner) and ``events`` tables that holds at least one non-empty caption."""
    for name in CAPTION_TABLES:
        d = Path(outputs_dir) / name
        if not d.is_dir() or not any(d.glob("*.parquet")):
            continue
        try:
            if len(load_captions(d)):
                return d
        except FloraDataError:
            continue
    return None


def step_texts(ep: Episode, captions: pd.DataFrame | None) -> tuple[list[str], int]:
    """Text per step: the caption of the event covering the step (latest start wins when
    events overlap), else the task. Returns the texts and how many came from captions."""
    texts = [ep.task or ""] * len(ep.timestamps_us)
    if captions is None:
        return texts, 0
    rows = captions[(captions.key == ep.episode_id) | (captions.key == str(ep.index))]
    n = 0
    if len(rows):
        t = ep.timestamps_us
        for r in rows.sort_values("start_us").itertuples(index=False):
            inside = np.nonzero((t >= r.start_us) & (t < r.end_us))[0]
            for k in inside:
                texts[int(k)] = r.caption
        n = sum(1 for a in texts if a != (ep.task or ""))
    return texts, n


def image_features(ep: Episode) -> np.ndarray:
    """(N, 3*8*8) thumbnails of the main camera at every step, in [-0.5, 0.5]."""
    from flora.data.frames import sample_episode_frames

    frames = sample_episode_frames(ep, "main", ep.timestamps_us.tolist(), clamp_end=True)
    out = np.zeros((len(frames), 3 * THUMB * THUMB), dtype=np.float32)
    for i, fr in enumerate(frames):
        if fr is None:
            raise FloraDataError(
                "missing frame", dataset=ep.dataset, episode=ep.index, field="main"
            )
        img = fr.image.astype(np.float32) / 255.0
        h, w, _ = img.shape
        ys = np.linspace(0, h, THUMB + 1).astype(int)
        xs = np.linspace(0, w, THUMB + 1).astype(int)
        thumb = np.stack(
            [
                np.stack(
                    [
                        img[ys[a] : ys[a + 1], xs[b] : xs[b + 1]].mean(axis=(0, 1))
                        for b in range(THUMB)
                    ]
                )
                for a in range(THUMB)
            ]
        )  # (8, 8, 3) area average
        out[i] = thumb.transpose(2, 0, 1).reshape(-1) - 0.5
    return out


# --------------------------------------------------------------------------- dataset
def _sha256_files(root: Path, files: list[Path]) -> str:
    """sha256 over each file's path relative to ``root``, size and bytes, in the given order."""
    h = hashlib.sha256()
    for p in files:
        h.update(f"{p.relative_to(root).as_posix()}\0{p.stat().st_size}\0".encode())
        with open(p, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


#: The columns a policy's figures depend on: its dataset identity reads only these, so
#: columns an export adds (``language_persistent``) or metadata it edits leave it as it was.
IDENTITY_COLUMNS = ("index", "episode_index", "frame_index", "timestamp", "observation.state",
                    "action")  # fmt: skip


def dataset_sha256(root: str | Path) -> str:
    """Content identity of a local dataset folder: sha256 over every Parquet file under
    ``data/`` (its relative path and the values of its :data:`IDENTITY_COLUMNS`; videos,
    other columns and ``meta/`` are not read).

    The folder name says nothing about the content (two datasets may share it), so the
    policy checkpoint records this and the evaluation checks and fingerprints it. An
    in-place export (a caption column added, ``info.json`` edited) keeps it; other states
    or actions change it. A plain mp4 folder (no data/) hashes to the digest of nothing.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = Path(root)
    h = hashlib.sha256()
    for p in sorted(q for q in (root / "data").rglob("*.parquet") if q.is_file()):
        names = set(pq.read_schema(p).names)
        t = pq.read_table(p, columns=[c for c in IDENTITY_COLUMNS if c in names])
        t = t.replace_schema_metadata(None).combine_chunks()  # bytes of values, not layout
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, t.schema) as w:
            w.write_table(t)
        h.update(p.relative_to(root).as_posix().encode() + b"\0")
        h.update(sink.getvalue().to_pybytes())
    return h.hexdigest()


def events_sha256(path: str | Path) -> str:
    """Content identity of an events/captions table (a Parquet file or a table directory of
    Parquet parts): sha256 of its Parquet bytes."""
    path = Path(path)
    if path.is_dir():
        return _sha256_files(path, sorted(path.glob("*.parquet")))
    return _sha256_files(path.parent, [path])


def _data_file(ds: Any, ep: Episode) -> Path | None:
    """The file episode ``ep``'s state/action columns come from, for error messages: the
    LeRobot data Parquet file, else (a plain mp4 folder) the episode's video; None when it
    cannot be told."""
    try:
        tpl, i = ds.info["data_path"], int(ep.index)
        if isinstance(ds.episodes_meta, pd.DataFrame):  # v3.0: shared files per chunk
            m = ds.episodes_meta.loc[i]
            rel = tpl.format(chunk_index=int(m["data/chunk_index"]),
                             file_index=int(m["data/file_index"]))  # fmt: skip
        else:  # v2.x: one file per episode
            rel = tpl.format(episode_chunk=i // ds.chunks_size, episode_index=i)
        return Path(ds.root) / rel
    except (AttributeError, KeyError, IndexError, TypeError, ValueError):
        cams = list(ep.cameras.values())
        return Path(cams[0].path) if cams and getattr(cams[0], "path", None) else None


def _check_signals(ds: Any, ep: Episode) -> tuple[np.ndarray, np.ndarray]:
    """The episode's state and action as aligned (N, D) float32 arrays with D > 0 and
    finite values; otherwise a :class:`FloraDataError` naming dataset, episode, data file
    and the field at fault (``observation.state`` or ``action``)."""
    st = np.asarray(ep.state, dtype=np.float32)
    ac = np.asarray(ep.action, dtype=np.float32)
    where = dict(dataset=ds.name, episode=int(ep.index), file=_data_file(ds, ep))
    for name, arr in (("observation.state", st), ("action", ac)):
        if arr.ndim != 2:
            raise FloraDataError(f"{name} is {arr.shape}, not an (N, D) array", field=name,
                                 **where)  # fmt: skip
    # A missing column reads as (N, 0): a policy needs both the state it conditions on and
    # the actions it imitates (state_dim 0 trained silently; action_dim 0 ended in a bare
    # DiTConfig error).
    empty = [n for n, arr in (("observation.state", st), ("action", ac)) if arr.shape[1] == 0]
    if empty:
        raise FloraDataError(
            f"no {' and no '.join(empty)} values (zero-width; the data has no such column): "
            "a policy needs both observation.state and action",
            field=", ".join(empty),
            **where,
        )
    if len(st) != len(ac) or len(ac) == 0:
        raise FloraDataError(
            f"observation.state {st.shape} / action {ac.shape} are not aligned (N, D) arrays",
            field="action",
            **where,
        )
    for name, arr in (("observation.state", st), ("action", ac)):
        bad = np.nonzero(~np.isfinite(arr).all(axis=1))[0]
        if len(bad):
            raise FloraDataError(
                f"non-finite {name} at step {int(bad[0])} ({len(bad)} step(s))",
                field=name,
                **where,
            )
    return st, ac


def build_data(cfg: PolicyTrainConfig, captions: pd.DataFrame | None = None) -> PolicyData:
    """Load episodes, cut chunks, standardise state/actions and split train/val."""
    from flora.data import open_dataset

    ds = open_dataset(cfg.dataset)
    indices = cfg.episodes if cfg.episodes is not None else ds.episode_indices()
    mix = None
    if cfg.mixture is not None:
        from flora.curate.weights import load_split

        mix = load_split(cfg.mixture, cfg.mixture_split)
        indices = [i for i in indices if make_episode_id(ds.name, int(i)) in set(mix.episode_id)]
    per_ep: list[dict[str, Any]] = []
    failures: list[EpisodeFailure] = []
    errors: list[Exception] = []
    cap_steps = 0
    for i in indices:
        try:
            ep = ds.episode(int(i))
            st, ac = _check_signals(ds, ep)
            texts, n_cap = step_texts(ep, captions)
            img = image_features(ep) if cfg.image_features else None
        except (FloraDataError, OSError, ValueError) as e:
            failures.append(EpisodeFailure(int(i), str(e)))
            errors.append(e)
            continue
        cap_steps += n_cap
        w = None
        if mix is not None:
            from flora.curate.weights import step_weights

            w = step_weights(mix, ep.episode_id, ep.timestamps_us)
        per_ep.append({"index": int(i), "state": st, "action": ac, "texts": texts, "img": img,
                       "w": w})  # fmt: skip
    if not per_ep:
        reasons = "; ".join(f"{f.episode}: {f.reason}" for f in failures[:3])
        # Every episode failed the same way (a dataset without observation.state, say):
        # the error names that field and the first such file, not only the dataset.
        fields = {getattr(e, "field", None) for e in errors}
        first = errors[0] if errors and len(fields) == 1 else None
        raise FloraDataError(
            f"no usable episode ({reasons})",
            dataset=dataset_name(cfg.dataset),
            file=getattr(first, "file", None),
            field=getattr(first, "field", None),
        )
    dims = {(e["state"].shape[1], e["action"].shape[1]) for e in per_ep}
    if len(dims) != 1:
        raise FloraDataError(
            f"episodes disagree on state/action sizes {sorted(dims)}",
            dataset=ds.name,
            field="action",
        )
    # Held-out episodes for the validation loss and evaluate_policy: with val_fraction > 0
    # at least one (and at most all but one) of >= 2 usable episodes; none otherwise.
    g = np.random.default_rng(cfg.seed)
    order = g.permutation(len(per_ep))
    n_val = 0
    if cfg.val_fraction > 0 and len(per_ep) >= 2:
        n_val = min(len(per_ep) - 1, max(1, int(round(cfg.val_fraction * len(per_ep)))))
    val_set = {int(k) for k in order[:n_val]}
    train_eps = [e for k, e in enumerate(per_ep) if k not in val_set]
    st_all = np.concatenate([e["state"] for e in train_eps])
    ac_all = np.concatenate([e["action"] for e in train_eps])
    stats = {
        "state_mean": st_all.mean(0).tolist(),
        "state_std": np.maximum(st_all.std(0), 1e-3).tolist(),
        "action_mean": ac_all.mean(0).tolist(),
        "action_std": np.maximum(ac_all.std(0), 1e-3).tolist(),
    }

    def tensors(eps: list[dict[str, Any]]) -> ChunkDataset:
        H = cfg.horizon
        sm, ss = np.array(stats["state_mean"]), np.array(stats["state_std"])
        am, asd = np.array(stats["action_mean"]), np.array(stats["action_std"])
        S, C, T, imgs = [], [], [], []
        for e in eps:
            n = len(e["action"])
            a = (e["action"] - am) / asd
            idx = np.minimum(np.arange(n)[:, None] + np.arange(H)[None, :], n - 1)
            S.append((e["state"] - sm) / ss)
            C.append(a[idx])
            T.extend(e["texts"])
            if e["img"] is not None:
                imgs.append(e["img"])
        obs = {
            "state": torch.from_numpy(np.concatenate(S).astype(np.float32)),
            "lang_ids": hash_tokens(T, cfg.lang_vocab, cfg.lang_tokens),
        }
        if imgs:
            obs["image"] = torch.from_numpy(np.concatenate(imgs))
        w = None
        if mix is not None and eps and sum(float(e["w"].sum()) for e in eps) > 0:
            w = torch.from_numpy(np.concatenate([e["w"] for e in eps]))
        return ChunkDataset(obs, torch.from_numpy(np.concatenate(C).astype(np.float32)), w)

    val_eps = [e for k, e in enumerate(per_ep) if k in val_set]
    return PolicyData(
        train=tensors(train_eps),
        val=tensors(val_eps) if val_eps else None,
        stats=stats,
        failures=failures,
        episodes=[e["index"] for e in per_ep],
        caption_steps=cap_steps,
        val_episodes=[e["index"] for e in val_eps],
        dataset_name=ds.name,
        dataset_root=ds.source.root if getattr(ds, "source", None) else Path(ds.root),
    )


@torch.no_grad()
def validation_loss(
    model: DiTActionExpert,
    data: ChunkDataset,
    delays: rtc.DelayDistribution,
    seed: int = 0,
    batch: int = 512,
) -> float:
    """Training-time RTC loss on held-out chunks with fixed noise/tau/delays."""
    g = torch.Generator().manual_seed(seed)
    dev = next(model.parameters()).device
    total, n = 0.0, 0
    for start in range(0, len(data), batch):
        idx = torch.arange(start, min(start + batch, len(data)))
        obs, chunk = data.batch(idx)
        obs, chunk = {k: v.to(dev) for k, v in obs.items()}, chunk.to(dev)
        loss = rtc.training_loss(model, obs, chunk, delays, generator=g)
        total += float(loss) * len(idx)
        n += len(idx)
    return total / max(1, n)


# --------------------------------------------------------------------------- training
def train_policy(cfg: PolicyTrainConfig) -> dict[str, Any]:
    """Train, checkpoint and log; returns a summary (also written to ``out/summary.json``)."""
    t0 = time.time()
    captions = load_captions(cfg.events) if cfg.events is not None else None
    data = build_data(cfg, captions)
    d_state = data.train.obs["state"].shape[1]
    d_act = data.train.chunks.shape[2]
    dit = DiTConfig(
        action_dim=d_act,
        horizon=cfg.horizon,
        state_dim=d_state,
        image_dim=3 * THUMB * THUMB if cfg.image_features else 0,
        lang_vocab=cfg.lang_vocab,
        lang_max_tokens=cfg.lang_tokens,
        hidden=cfg.hidden,
        depth=cfg.depth,
        heads=cfg.heads,
    )
    if cfg.device is None:
        from flora.settings import get_settings

        device = get_settings().device
    else:
        device = cfg.device
    if cfg.max_steps is not None:
        per_epoch = max(1, len(data.train) // min(cfg.batch_size, len(data.train)))
        cfg.epochs = max(1, math.ceil(cfg.max_steps / per_epoch))
        if cfg.rtc_epochs is not None:
            cfg.rtc_epochs = min(cfg.rtc_epochs, cfg.epochs)
    tc = TrainConfig(
        max_steps=cfg.max_steps,
        total_epochs=cfg.epochs,
        batch_size=min(cfg.batch_size, len(data.train)),
        lr=cfg.lr,
        seed=cfg.seed,
        device=device,
        warmup_steps=max(1, min(200, len(data.train) // cfg.batch_size)),
    )
    cfg.out.mkdir(parents=True, exist_ok=True)
    delays = cfg.delays()
    rtc_epochs = cfg.epochs if cfg.rtc_epochs is None else cfg.rtc_epochs
    extra = {
        "kind": "flora.policy.dit",
        "stats": data.stats,
        "dataset": str(cfg.dataset),
        "delays": list(delays.probs),
        # The episodes the model never trained on: evaluate_policy's default evaluation set,
        # of the dataset named here and holding exactly this content.
        "dataset_name": data.dataset_name,
        "dataset_sha256": dataset_sha256(data.dataset_root) if data.dataset_root else None,
        "val_episodes": list(data.val_episodes),
        "train_episodes": [i for i in data.episodes if i not in set(data.val_episodes)],
        "train_config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()},
    }
    state = new_state(dit, tc)
    val_delays = delays
    summary: dict[str, Any] = {}

    def run(log: Any) -> None:
        def on_epoch(st: TrainState, rec: dict[str, float]) -> None:
            if data.val is not None:
                rec["val_loss"] = validation_loss(st.model, data.val, val_delays, cfg.seed)
                st.model.train()
            log(rec, int(rec["epoch"]))
            if cfg.checkpoint_every and st.epoch % cfg.checkpoint_every == 0:
                save_checkpoint(cfg.out / f"checkpoint-epoch{st.epoch:03d}.pt", st, extra)

        plain = cfg.epochs - rtc_epochs
        if plain:
            train_epochs(
                state,
                data.train,
                plain,
                tc,
                desc="plain",
                progress=cfg.progress,
                on_epoch_end=on_epoch,
            )
        if rtc_epochs:
            train_epochs(
                state,
                data.train,
                rtc_epochs,
                tc,
                delays=delays,
                desc="rtc",
                progress=cfg.progress,
                on_epoch_end=on_epoch,
            )
        final = save_checkpoint(cfg.out / "policy.pt", state, extra)
        summary.update(
            {
                "checkpoint": str(final),
                "episodes": len(data.episodes),
                "val_episodes": list(data.val_episodes),
                "failures": [asdict(f) for f in data.failures],
                "train_chunks": len(data.train),
                "val_chunks": len(data.val) if data.val is not None else 0,
                "caption_steps": data.caption_steps,
                "final_loss": state.history[-1]["loss"] if state.history else None,
                "final_val_loss": state.history[-1].get("val_loss") if state.history else None,
                "parameters": sum(p.numel() for p in state.model.parameters()),
                "seconds": time.time() - t0,
            }
        )

    if cfg.mlflow:
        import mlflow

        from flora.tracking import mlflow_run

        with mlflow_run(
            "policy_train", {"flora.area": "policy"}, cfg.experiment, run_id=cfg.run_id
        ) as active:
            mlflow.log_params(
                {
                    f"policy.{k}": v
                    for k, v in {
                        **dit.to_dict(),
                        "epochs": cfg.epochs,
                        "rtc_epochs": rtc_epochs,
                        "delay_dist": cfg.delay_dist,
                        "max_delay": cfg.max_delay,
                        "lr": cfg.lr,
                        "batch_size": tc.batch_size,
                        "max_steps": cfg.max_steps,
                        "denoise_steps": cfg.denoise_steps,
                        "recipe": cfg.recipe or "custom",
                        "dataset": str(cfg.dataset),
                        "captions": str(cfg.events) if cfg.events else "task",
                    }.items()
                }
            )
            run(
                lambda rec, step: mlflow.log_metrics(
                    {f"policy.{k}": v for k, v in rec.items() if k != "epoch"}, step=step
                )
            )
            mlflow.log_metrics(
                {
                    "policy.failed_episodes": len(data.failures),
                    "policy.caption_steps": data.caption_steps,
                }
            )
            mlflow.log_artifact(summary["checkpoint"], artifact_path="policy")
            summary["run_id"] = active.info.run_id
    else:
        run(lambda rec, step: None)
        summary["run_id"] = None
    (cfg.out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


@dataclass
class TrainedPolicy:
    """A loaded ``policy.pt``: model, normalisation and an un-normalising sampler."""

    model: DiTActionExpert
    stats: dict[str, list[float]]
    extra: dict[str, Any]

    def chunk(
        self,
        state: np.ndarray,
        text: str,
        *,
        image: np.ndarray | None = None,
        prefix: np.ndarray | None = None,
        d: int = 0,
        s: int | None = None,
        steps: int = 5,
        method: str = "training_time",
        generator: torch.Generator | None = None,
    ) -> np.ndarray:
        """One action chunk (H, A) in dataset units; ``prefix`` (L, A) in dataset units;
        ``image``: the :func:`image_features` row of the current frame, if trained with them."""
        cfg = self.model.config
        sm, ss = np.array(self.stats["state_mean"]), np.array(self.stats["state_std"])
        am, asd = np.array(self.stats["action_mean"]), np.array(self.stats["action_std"])
        obs = {
            "state": torch.from_numpy(((state - sm) / ss).astype(np.float32))[None],
            "lang_ids": hash_tokens([text], cfg.lang_vocab, cfg.lang_max_tokens),
        }
        if cfg.image_dim:
            if image is None:
                raise ValueError("this policy was trained with image features: pass image=")
            obs["image"] = torch.as_tensor(image, dtype=torch.float32).reshape(1, -1)
        p = None
        if prefix is not None and len(prefix):
            p = torch.from_numpy(((prefix - am) / asd).astype(np.float32))[None]
        out = rtc.sample(
            self.model,
            obs,
            p,
            d if p is not None else 0,
            steps,
            method if p is not None else "plain",
            s=s,
            shape=(1, cfg.horizon, cfg.action_dim),
            generator=generator,
        )
        return out[0].numpy() * asd + am


def load_policy(path: str | Path) -> TrainedPolicy:
    """Load a checkpoint written by :func:`train_policy`."""
    st, extra = load_checkpoint(path)
    if extra.get("kind") != "flora.policy.dit":
        raise FloraDataError("not a flora policy checkpoint", file=path, field="kind")
    return TrainedPolicy(st.model, extra["stats"], extra)


# ------------------------------------------------------------------------- evaluation
EVAL_METHODS = ("plain", "training_time", "inference_time")


def check_trained_on(
    pol: TrainedPolicy, checkpoint: str | Path, dataset: str | Path, identity: str | None = None
) -> str:
    """Check that ``dataset`` is the data ``pol`` was trained on; returns its
    :func:`dataset_sha256` (``identity``, when the caller computed it already).

    A checkpoint records the dataset's name and content identity; a dataset with another
    content is refused even when its folder has the same name. A checkpoint written before
    the identity was recorded (``dataset_sha256`` absent) is checked by name only.
    """
    from flora.data import open_dataset

    ds = open_dataset(dataset)
    name = ds.name
    if identity is None:
        identity = dataset_sha256(ds.source.root if ds.source else ds.root)
    trained_on = pol.extra.get("dataset_name")
    trained_sha = pol.extra.get("dataset_sha256")
    if trained_sha and trained_sha != identity:
        raise FloraDataError(
            f"the policy was trained on dataset {trained_on!r} with content sha256 "
            f"{trained_sha[:16]}…, but {name!r} ({dataset}) has content sha256 "
            f"{identity[:16]}… (its states or actions differ): its held-out episodes are "
            "not this dataset's; pass episodes= to evaluate on another dataset",
            dataset=name,
            file=checkpoint,
            field="dataset_sha256",
        )
    if trained_on and name != trained_on:
        raise FloraDataError(
            f"the policy's held-out episodes are of dataset {trained_on!r}, not {name!r}: "
            "pass episodes= to evaluate on another dataset",
            dataset=name,
            file=checkpoint,
            field="val_episodes",
        )
    return identity


def held_out_episodes(
    pol: TrainedPolicy, checkpoint: str | Path, dataset: str | Path, identity: str | None = None
) -> list[int]:
    """The episodes ``pol`` was not trained on (its recorded ``val_episodes``), checked to
    belong to ``dataset`` (:func:`check_trained_on`: name and content identity; pass
    ``identity`` when already computed); a :class:`FloraDataError` when there are none to
    evaluate on."""
    held = pol.extra.get("val_episodes")
    if not held:
        why = "an older checkpoint" if held is None else "val_fraction 0 or < 2 episodes"
        raise FloraDataError(
            f"the policy records no held-out episodes ({why}); evaluating it would score "
            "its training episodes: retrain with val_fraction > 0 or pass episodes=",
            file=checkpoint,
            field="val_episodes",
        )
    check_trained_on(pol, checkpoint, dataset, identity)
    return [int(i) for i in held]


#: What ``postfix_mse`` / ``boundary_jump`` of :func:`evaluate_policy` measure. Version 1
#: (before 2026-12-07) was in the checkpoint's own standardised units, so the same network
#: with a wider recorded action_std scored better; version 2 (one commit on 2026-12-07) in
#: the evaluated episodes' own standardised units; version 3 in the whole dataset's
#: (:func:`dataset_action_stats`), the same for every checkpoint and every episode subset.
#: The eval-set fingerprint carries the version, so figures of two never meet in a gate.
METRIC_VERSION = 3
METRIC_UNITS = "dataset-standardised action units"


def dataset_action_stats(ds: Any) -> dict[str, list[float]]:
    """The whole dataset's action mean and std (std floored at 1e-3, as training's), the
    units the gated figures are in: ``meta/stats.json``'s ``action`` entry where the
    dataset has one (LeRobot's own normalisation statistics), else computed over every
    readable episode.

    Not the evaluated episodes' own statistics: on one held-out episode a joint that barely
    moves there gets a tiny std and its small errors would dominate the figure.
    """
    root = ds.source.root if getattr(ds, "source", None) else ds.root
    try:
        entry = json.loads((Path(root) / "meta" / "stats.json").read_text())["action"]
        mean = np.asarray(entry["mean"], dtype=np.float64).reshape(-1)
        std = np.asarray(entry["std"], dtype=np.float64).reshape(-1)
        if (
            mean.shape == std.shape
            and mean.size
            and np.isfinite(mean).all()
            and np.isfinite(std).all()
        ):
            return {"action_mean": mean.tolist(), "action_std": np.maximum(std, 1e-3).tolist()}
    except (OSError, ValueError, KeyError, TypeError):
        pass  # no usable stats.json: computed below
    acts = []
    for i in ds.episode_indices():
        try:
            acts.append(_check_signals(ds, ds.episode(int(i)))[1])
        except (FloraDataError, OSError, ValueError):
            continue  # an unreadable episode is the training/evaluation step's to report
    if not acts:
        raise FloraDataError("no readable episode to standardise actions by", dataset=ds.name,
                             field="action")  # fmt: skip
    a = np.concatenate(acts).astype(np.float64)
    return {"action_mean": a.mean(0).tolist(), "action_std": np.maximum(a.std(0), 1e-3).tolist()}


@torch.no_grad()
def evaluate_policy(
    checkpoint: str | Path,
    dataset: str | Path,
    *,
    episodes: list[int] | None = None,
    events: str | Path | None = None,
    delays: tuple[int, ...] = (0, 1, 2, 3, 4),
    steps: int = 5,
    max_chunks: int = 256,
    latency_repeats: int = 5,
    seed: int = 0,
    identity: str | None = None,
) -> dict[str, Any]:
    """Offline check of a trained policy on dataset chunks, per delay d (s = max(d, 1)).

    ``episodes=None`` evaluates on the episodes training held out (``val_episodes`` in the
    checkpoint) and refuses a checkpoint without any (``val_fraction=0``, too few
    episodes, an older checkpoint) or a dataset other than the one it was trained on (by
    name and by content, :func:`check_trained_on`); explicit ``episodes`` are evaluated as
    given. The report's ``episodes`` lists the evaluated episodes and ``episode_source``
    says ``held_out`` or ``explicit``.

    The committed prefix is the ground truth's first d actions. Inference-time RTC's soft
    overlap beyond it (up to H - s) is the model's own plain chunk for the same
    observation, a stand-in for the previous chunk's plan (until 2026-12-07 it was the
    ground truth the postfix is scored against, which flattered inference-time RTC).
    Per method: ``postfix_mse`` (sampled vs ground-truth postfix) and ``boundary_jump``
    (mean |a_d - a_{d-1}| between the last committed and the first new action, minus the
    ground truth's own step — how much the switch jerks), both in the dataset's standardised
    action units (:data:`METRIC_VERSION` 3: actions minus the whole dataset's action mean,
    over its std, :func:`dataset_action_stats` — independent of the checkpoint's statistics
    and of which episodes are evaluated). ``identity``: the dataset's
    :func:`dataset_sha256` when the caller computed it already.
    Also median per-chunk latency at batch 1. The report records what the figures depend
    on (horizon, delays, steps, dataset and events content sha256, metric version) for the
    eval-set fingerprint (:func:`flora.policy.registry.policy_eval_set`).
    """
    from flora.data import open_dataset

    pol = load_policy(checkpoint)
    model, cfg = pol.model, pol.model.config
    tc = pol.extra.get("train_config", {})
    ds = open_dataset(dataset)
    if identity is None:  # the caller's, when it scores several checkpoints on one dataset
        identity = dataset_sha256(ds.source.root if ds.source else ds.root)
    source = "explicit"
    if episodes is None:
        episodes, source = held_out_episodes(pol, checkpoint, dataset, identity), "held_out"
    pcfg = PolicyTrainConfig(
        dataset=Path(dataset),
        out=Path("."),
        horizon=cfg.horizon,
        max_delay=max(1, min(int(tc.get("max_delay", 2)), cfg.horizon - 1)),
        lang_vocab=cfg.lang_vocab,
        lang_tokens=cfg.lang_max_tokens,
        image_features=cfg.image_dim > 0,
        episodes=episodes,
        val_fraction=0.0,
        seed=seed,
        events=Path(events) if events is not None else None,
        mlflow=False,
        progress=False,
    )
    captions = load_captions(events) if events is not None else None
    data = build_data(pcfg, captions)
    # The model sees its inputs in the checkpoint's units; the figures are in the whole
    # dataset's standardised units, the same for every checkpoint.
    units = dataset_action_stats(ds)
    sm = torch.tensor(pol.stats["state_mean"])
    ss = torch.tensor(pol.stats["state_std"])
    am = torch.tensor(pol.stats["action_mean"])
    asd = torch.tensor(pol.stats["action_std"])
    dm = torch.tensor(data.stats["state_mean"])
    ds_ = torch.tensor(data.stats["state_std"])
    dam = torch.tensor(data.stats["action_mean"])
    das = torch.tensor(data.stats["action_std"])
    g = torch.Generator().manual_seed(seed)
    n = len(data.train)
    idx = torch.randperm(n, generator=g)[: min(max_chunks, n)]
    obs, truth = data.train.batch(idx)
    obs = dict(obs)
    obs["state"] = ((obs["state"] * ds_ + dm) - sm) / ss
    raw = truth * das + dam  # build_data standardised by the evaluated episodes' stats
    gt = (raw - am) / asd  # the ground truth in the checkpoint's units
    um = torch.tensor(units["action_mean"], dtype=truth.dtype)
    us = torch.tensor(units["action_std"], dtype=truth.dtype)
    if um.shape != am.shape:
        raise FloraDataError(f"dataset stats have {um.numel()} action dims, the policy "
                             f"{am.numel()}", dataset=ds.name, field="action")  # fmt: skip
    truth = (raw - um) / us  # what the figures compare against

    def scored(x: torch.Tensor) -> torch.Tensor:
        """A sampled chunk (checkpoint units) in the dataset's standardised units."""
        return ((x * asd + am) - um) / us

    H, A = cfg.horizon, cfg.action_dim
    rows: list[dict[str, Any]] = []
    for d in delays:
        s = max(d, 1)
        rtc.check_delay(d, s, H)
        noise = torch.randn(len(idx), H, A, generator=g)
        prefix = gt[:, : H - s]
        plain: torch.Tensor | None = None
        for m in EVAL_METHODS:
            if m == "inference_time":
                # Beyond the d executed actions the overlap is a plan, never the truth it is
                # scored on: the model's own plain chunk stands in for the previous one's.
                assert plain is not None
                prefix = torch.cat([gt[:, :d], plain[:, d : H - s]], dim=1)
            out = rtc.sample(
                model, obs, prefix, d, steps, m, s=s, shape=(len(idx), H, A), noise=noise
            )
            if m == "plain":
                plain = out
            got = scored(out)
            mse = float(((got[:, d:] - truth[:, d:]) ** 2).mean())
            if d > 0:
                jump = (got[:, d] - truth[:, d - 1]).abs().mean(-1)
                ref = (truth[:, d] - truth[:, d - 1]).abs().mean(-1)
                bj = float((jump - ref).mean())
            else:
                bj = float("nan")
            rows.append({"d": d, "method": m, "postfix_mse": mse, "boundary_jump": bj})
    # Latency at batch 1 (same model, same inputs) for the three samplers.
    lat: dict[str, float] = {}
    one = {k: v[:1] for k, v in obs.items()}
    d_l = min(max(delays), H // 2)
    for m in EVAL_METHODS:
        ts = []
        for _ in range(latency_repeats + 1):
            t0 = time.perf_counter()
            rtc.sample(
                model, one, gt[:1, : H - max(d_l, 1)], d_l, steps, m, s=max(d_l, 1), shape=(1, H, A)
            )
            ts.append((time.perf_counter() - t0) * 1000)
        lat[m] = float(np.median(ts[1:]))
    return {
        "checkpoint": str(checkpoint),
        "dataset": str(dataset),
        "dataset_sha256": identity,
        "events": str(events) if events is not None else None,
        "events_sha256": events_sha256(events) if events is not None else None,
        "chunks": int(len(idx)),
        "seed": int(seed),
        "episodes": list(data.episodes),
        "episode_source": source,
        "horizon": int(H),
        "delays": [int(d) for d in delays],
        "steps": steps,
        "metric_version": METRIC_VERSION,
        "metric_units": METRIC_UNITS,
        # what the figures are standardised by (the whole dataset's actions)
        "metric_action_mean": units["action_mean"],
        "metric_action_std": units["action_std"],
        "rows": rows,
        "latency_ms": lat,
        "latency_ratio_training_time_over_plain": lat["training_time"] / lat["plain"],
        "failures": [asdict(f) for f in data.failures],
    }
