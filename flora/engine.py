"""The data-engine steps as orchestrator-neutral calls (what the DAG and KFP adapters call).

The Airflow DAG ``flora_data_engine`` and the KFP components in ``components/`` are thin
adapters: each calls one ``run_*`` function here and logs its :class:`StepReport` to the
pipeline run's MLflow run. These functions only *wire* the step functions of
``flora.segment`` / ``flora.caption`` / ``flora.reward`` (which write the tables with
``TableStore`` and validate them with their GX suites): backend selection, which
episodes a step gets, decoding budgets, and a uniform report (counts, failures with
reasons, validation). Nothing here is orchestrator specific, so the two orchestrators
cannot drift apart.

Backend choice (``docs/orchestration.md``): ``FLORA_BACKEND`` selects one backend for the
segmenter, captioner and rewarder. With the embedded default ``kinematic`` the segmenter
is the kinematic baseline, and the captioner and rewarder — which have no kinematic
counterpart — run the tiny random-initialised Qwen3-VL (``flora.backends.tiny``), built
once into ``<FLORA_HOME>/models/tiny``. Its outputs are almost always rejected by the
grammars: those items are recorded as failures with their reasons and nothing is filled
in. That is the honest embedded default; point ``FLORA_BACKEND`` at real checkpoints
(``transformers``) or served models (``openai``) to get real captions and rewards.

A table that fails its suite is never handed on: the step raises
``TableValidationError`` (after logging the report), so the orchestrator task fails and
its downstream tasks do not run. Rows of single episodes that fail a suite are quarantined
by the step functions themselves (recorded as failures, not written).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pandas as pd

from flora.settings import FloraSettings, get_settings

if TYPE_CHECKING:
    from flora.backends.base import VLMBackend

log = logging.getLogger(__name__)

#: Steps after validation, in pipeline order, and the table each one writes.
STEP_TABLES: dict[str, str] = {
    "segment": "events",
    "caption": "captions",
    "outcome": "outcome",
    "dense": "dense_labels",
    "rubric": "rubric",
}
REWARD_MODES: tuple[str, ...] = ("outcome", "dense", "rubric")
#: Failures carried inline in a report (all of them are in the table's ``_failures/``).
INLINE_FAILURES = 5


# --------------------------------------------------------------------------- options


@dataclass(frozen=True)
class StepOptions:
    """Run-level knobs shared by the VLM steps (DAG params / KFP pipeline parameters).

    ``vlm_max_episodes``: the captioner and rewarder process only the first N valid
    episodes (``None``: all) — a bound for CPU demos with the tiny model. ``max_attempts``:
    bounded parse retries per item. ``max_new_tokens``: a cap on every VLM step's own
    generation budget (``None``: each step's default). ``rubric``: a rubric YAML/JSON for
    every episode (``None``: the dataset's ``ground_truth/rubric.json`` family rubrics when
    present, otherwise every episode is recorded as "no rubric").
    """

    vlm_max_episodes: int | None = None
    max_attempts: int = 3
    max_new_tokens: int | None = None
    rubric: str | None = None

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.vlm_max_episodes is not None and self.vlm_max_episodes < 0:
            raise ValueError(f"vlm_max_episodes must be >= 0, got {self.vlm_max_episodes}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    @classmethod
    def from_mapping(cls, d: dict[str, Any] | None) -> StepOptions:
        """From DAG params / run conf (unknown keys ignored; ``None``/0 mean "default")."""
        d = d or {}
        n = d.get("vlm_max_episodes")
        tok = d.get("max_new_tokens")
        return cls(
            vlm_max_episodes=int(n) if n not in (None, "", 0) else None,
            max_attempts=int(d.get("max_attempts") or 3),
            max_new_tokens=int(tok) if tok not in (None, "", 0) else None,
            rubric=str(d["rubric"]) if d.get("rubric") else None,
        )

    def vlm_episodes(self, valid: Sequence[int]) -> list[int]:
        """The valid episodes the VLM steps process (index order)."""
        eps = sorted(int(i) for i in valid)
        return eps if self.vlm_max_episodes is None else eps[: self.vlm_max_episodes]

    def tokens(self, default: int) -> int:
        """A step's generation budget: its default, capped by ``max_new_tokens``."""
        return default if self.max_new_tokens is None else min(default, self.max_new_tokens)


# --------------------------------------------------------------------------- backends


def tiny_model_dir(settings: FloraSettings | None = None) -> Path:
    """Where the embedded tiny VLM lives: ``<FLORA_HOME>/models/tiny``."""
    s = settings or get_settings()
    return (s.home / "models" / "tiny").resolve()


def ensure_tiny_vlm(path: str | Path, *, overwrite: bool = False) -> Path:
    """Build the tiny random Qwen3-VL at ``path`` unless a complete one is there.

    Built into a sibling temp dir and renamed, so concurrent workers never see a half
    written checkpoint (the marker ``flora_tiny.json`` is written last by the builder).
    An incomplete tiny model left by a crashed build is replaced; anything else at
    ``path`` (not made by Flora as a tiny model) is refused with
    :class:`flora.safety.OutputDirError` before any work, unless ``overwrite``.
    """
    from flora.backends.tiny import TINY_DONE_MARKER, TINY_MODEL_KIND, build_tiny_vlm
    from flora.safety import clear_output_path, ensure_own_output_dir

    path = Path(path)
    if path.is_dir() and not path.is_symlink() and (path / TINY_DONE_MARKER).is_file():
        return path
    hint = "pass overwrite=True, or point FLORA_HOME elsewhere"
    ensure_own_output_dir(path, TINY_MODEL_KIND, overwrite=overwrite, hint=hint)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    build_tiny_vlm(tmp, family="qwen3_vl", seed=0)
    try:
        if (path / TINY_DONE_MARKER).is_file():  # another worker finished meanwhile
            shutil.rmtree(tmp, ignore_errors=True)
            return path
        # Checked again right before removing: only our own leftover (or, with
        # overwrite, what the caller gave up) is ever removed.
        if ensure_own_output_dir(path, TINY_MODEL_KIND, overwrite=overwrite, hint=hint):
            clear_output_path(path)
        elif path.is_dir():
            path.rmdir()  # empty
        os.replace(tmp, path)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (path / TINY_DONE_MARKER).exists():
            raise
    return path


_backend_lock = threading.Lock()
_backend_cache: dict[tuple, Any] = {}


def _settings_key(s: FloraSettings) -> tuple:
    return (s.backend, s.model_path, s.adapter_path, s.openai_base_url, s.openai_model,
            s.device, str(tiny_model_dir(s)))  # fmt: skip


def segment_backend(settings: FloraSettings | None = None) -> VLMBackend | None:
    """The segmenter's backend: ``make_backend`` (``None`` = kinematic baseline).

    With ``FLORA_BACKEND=openai`` it reaches ``FLORA_SEGMENTER_BASE_URL`` when set.
    """
    from flora.backends import make_backend

    return make_backend((settings or get_settings()).for_model("segmenter"))


def vlm_backend(
    settings: FloraSettings | None = None, model: Literal["captioner", "rewarder"] = "captioner"
) -> VLMBackend:
    """The captioner's / rewarder's backend: the configured one, else the tiny model.

    With ``FLORA_BACKEND=openai``, ``model``'s own endpoint (``FLORA_CAPTIONER_BASE_URL`` /
    ``FLORA_REWARDER_BASE_URL``) when set, else ``FLORA_OPENAI_BASE_URL``.

    Cached per process and configuration (Airflow ``dags test`` runs every task in one
    process; loading the model once is enough).
    """
    from flora.backends import make_backend

    s = (settings or get_settings()).for_model(model)
    key = _settings_key(s)
    with _backend_lock:
        if key in _backend_cache:
            return _backend_cache[key]
        b = make_backend(s)
        if b is None:
            from flora.backends.transformers_backend import TransformersBackend

            b = TransformersBackend(ensure_tiny_vlm(tiny_model_dir(s)), device=s.device)
        _backend_cache[key] = b
        return b


def backend_label(backend: Any) -> tuple[str, str]:
    """(model name, model version) as written into the tables' common columns."""
    if backend is None:
        from flora.segment import kinematic

        return kinematic.MODEL_NAME, kinematic.MODEL_VERSION
    return (str(getattr(backend, "name", type(backend).__name__)),
            str(getattr(backend, "model_version", "")))  # fmt: skip


# --------------------------------------------------------------------------- reports


@dataclass
class StepReport:
    """What one step did, for logs, MLflow and the orchestrator's hand-off (JSON-able)."""

    step: str
    table: str
    table_dir: str
    dataset: str
    episodes_in: list[int]
    processed: list[str]
    skipped: list[str]
    rows: int  # rows of this dataset's input episodes now in the table
    episodes_with_rows: int
    failures: list[dict[str, str]]  # this dataset's input episodes' recorded failures
    valid: bool | None  # the whole table passed its suite (None: table empty)
    model: str
    model_version: str
    validation: dict[str, Any] | None = None
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def validation_state(self) -> str:
        """``passed`` / ``failed`` / ``empty`` (no rows to validate)."""
        return "empty" if self.valid is None else ("passed" if self.valid else "failed")

    @property
    def failed_episodes(self) -> list[str]:
        return sorted({f["episode_id"] for f in self.failures})

    def counts(self) -> dict[str, float]:
        """``step.<step>.*`` metrics."""
        return report_counts(self.to_dict())

    def to_dict(self, *, all_failures: bool = False) -> dict[str, Any]:
        """JSON summary (no nulls); inline failures are capped unless ``all_failures``.

        ``valid`` is the validation state string (``validation_state``).
        """
        d = asdict(self)
        d.pop("validation")
        # A string, not None: KFP parameters (protobuf structs) cannot hold nulls.
        d["valid"] = self.validation_state
        d["n_failures"] = len(self.failures)
        d["failed_episodes"] = self.failed_episodes
        if not all_failures:
            d["failures"] = self.failures[:INLINE_FAILURES]
        return d

    def log_mlflow(self) -> None:
        """Log counts, table summary, validation and all failures to the active run."""
        import mlflow

        from flora.tracking import log_validation

        mlflow.log_metrics({**self.counts(), **self.metrics})
        mlflow.set_tags(
            {
                f"step.{self.step}.table_dir": self.table_dir,
                f"step.{self.step}.model": self.model,
                f"step.{self.step}.model_version": self.model_version,
            }
        )
        mlflow.log_metrics(
            {f"table.{self.table}.rows": float(self.rows),
             f"table.{self.table}.episodes": float(self.episodes_with_rows)}
        )  # fmt: skip
        if self.validation is not None:
            log_validation(_DictReport(self.validation), name=self.table)
        else:
            mlflow.set_tag(f"validation.{self.table}", "empty")
        mlflow.log_dict(self.to_dict(all_failures=True), f"steps/{self.step}.json")


def report_counts(d: dict[str, Any]) -> dict[str, float]:
    """``step.<step>.*`` and ``table.<table>.*`` count metrics of a report dict
    (``StepReport.to_dict`` or :func:`merge_reports` form)."""
    c = {
        "episodes_in": len(d["episodes_in"]),
        "processed": len(d["processed"]),
        "skipped": len(d["skipped"]),
        "rows": d["rows"],
        "episodes_with_rows": d["episodes_with_rows"],
        "failures": d["n_failures"],
        "failed_episodes": len(d["failed_episodes"]),
    }
    return {f"step.{d['step']}.{k}": float(v) for k, v in c.items()}


@dataclass
class _DictReport:
    """A ValidationReport already turned into a dict (what ``log_validation`` reads)."""

    d: dict[str, Any]

    @property
    def success(self) -> bool:
        return bool(self.d.get("success"))

    def to_dict(self) -> dict[str, Any]:
        return self.d


def _ids(dataset: str, episodes: Sequence[int]) -> set[str]:
    from flora.data.episode import make_episode_id

    return {make_episode_id(dataset, i) for i in episodes}


def _report(
    step: str,
    out_dir: Path,
    dataset: str,
    episodes: Sequence[int],
    *,
    processed: Sequence[str],
    skipped: Sequence[str],
    validation: Any,
    backend: Any,
    metrics: dict[str, float] | None = None,
) -> StepReport:
    from flora.tables import TableStore

    table = STEP_TABLES[step]
    store = TableStore(out_dir)
    ids = _ids(dataset, episodes)
    df = store.read(table)
    mine = df[df["episode_id"].isin(ids)] if len(df) else df
    fails = [asdict(f) for f in store.failures(table) if f.episode_id in ids]
    model, version = backend_label(backend)
    vd = validation.to_dict() if validation is not None else None
    return StepReport(
        step=step,
        table=table,
        table_dir=str((out_dir / table).resolve()),
        dataset=dataset,
        episodes_in=[int(i) for i in episodes],
        processed=list(processed),
        skipped=list(skipped),
        rows=int(len(mine)),
        episodes_with_rows=int(mine["episode_id"].nunique()) if len(mine) else 0,
        failures=fails,
        valid=None if vd is None else bool(vd["success"]),
        model=model,
        model_version=version,
        validation=vd,
        metrics=dict(metrics or {}),
    )


def _log_rejected_table(err: Exception, table: str) -> None:
    """Before a TableValidationError propagates: log its report to the active MLflow run."""
    import mlflow

    from flora.tracking import log_validation

    if mlflow.active_run() is not None and getattr(err, "report", None) is not None:
        log_validation(err.report, name=table)  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- steps


def run_segment(
    dataset_path: str | Path,
    out_dir: str | Path,
    episodes: Sequence[int],
    run_id: str,
    *,
    settings: FloraSettings | None = None,
    evaluate: bool = True,
    progress: bool = True,
) -> StepReport:
    """Segment ``episodes`` into the ``events`` table under ``out_dir``.

    Backend: ``segment_backend`` (kinematic baseline by default). When the dataset has a
    toy-world ground truth (``ground_truth/events.parquet``) and ``evaluate``, the events
    are scored (``flora.segment.evaluate``) and the metrics come back as
    ``segment.<metric>`` (e.g. ``segment.f1_at_0.5``).
    """
    from flora.data import open_dataset
    from flora.segment.run import segment_dataset
    from flora.validation.core import TableValidationError

    root, out = Path(dataset_path), Path(out_dir)
    name = open_dataset(root).name
    backend = segment_backend(settings)
    try:
        res = segment_dataset(root, out, backend, run_id, episodes=list(episodes),
                              progress=progress)  # fmt: skip
    except TableValidationError as e:
        _log_rejected_table(e, "events")
        raise
    metrics = _segment_metrics(res.events, root) if evaluate else {}
    return _report("segment", out, name, episodes, processed=res.processed,
                   skipped=res.skipped, validation=res.report, backend=backend,
                   metrics=metrics)  # fmt: skip


def _segment_metrics(events: pd.DataFrame, root: Path) -> dict[str, float]:
    """``segment.<metric>`` of ``events`` against the toy world's ground truth ({} without)."""
    if not (root / "ground_truth" / "events.parquet").exists():
        return {}
    from flora.segment.evaluate import evaluate_events

    ev = evaluate_events(events, root)
    metrics = {f"segment.{k}".replace("@", "_at_"): float(v) for k, v in ev.metrics.items()}
    metrics["segment.missing_episodes"] = float(len(ev.missing_episodes))
    return metrics


def segment_metrics(
    dataset_path: str | Path, out_dir: str | Path, episodes: Sequence[int]
) -> dict[str, float]:
    """The segment metrics of ``episodes``' events now in the ``events`` table under
    ``out_dir`` (what ``run_segment`` reports; the sharded DAG scores the whole run once)."""
    from flora.data import open_dataset
    from flora.tables import TableStore

    root = Path(dataset_path)
    df = TableStore(out_dir).read("events")
    ids = _ids(open_dataset(root).name, episodes)
    return _segment_metrics(df[df["episode_id"].isin(ids)] if len(df) else df, root)


_STATE_RANK = {"empty": 0, "passed": 1, "failed": 2}


def merge_reports(reports: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One step's report dicts from several shards (``StepReport.to_dict`` form) as one:
    counts summed, episode lists and failures joined, the worst suite state, no metrics
    (a step's metrics are recomputed over the whole run, e.g. :func:`segment_metrics`)."""
    if not reports:
        raise ValueError("no step reports to merge")
    first = reports[0]
    if len({r["step"] for r in reports}) != 1:
        raise ValueError(f"reports of different steps: {sorted({r['step'] for r in reports})}")
    joined = {k: sorted(x for r in reports for x in r[k])
              for k in ("episodes_in", "processed", "skipped")}  # fmt: skip
    failures = [f for r in reports for f in r["failures"]]
    same = ("step", "table", "table_dir", "dataset", "model", "model_version")
    return {
        **{k: first[k] for k in same},
        **joined,
        "rows": sum(int(r["rows"]) for r in reports),
        "episodes_with_rows": sum(int(r["episodes_with_rows"]) for r in reports),
        "failures": failures,
        "n_failures": sum(int(r["n_failures"]) for r in reports),
        "failed_episodes": sorted({e for r in reports for e in r["failed_episodes"]}),
        "valid": max((r["valid"] for r in reports), key=_STATE_RANK.__getitem__),
        "metrics": {},
    }


def run_caption(
    dataset_path: str | Path,
    events: str | Path | pd.DataFrame,
    out_dir: str | Path,
    episodes: Sequence[int],
    run_id: str,
    *,
    options: StepOptions | None = None,
    settings: FloraSettings | None = None,
    progress: bool = True,
) -> StepReport:
    """Caption the events of ``episodes`` (``options.vlm_episodes`` of them) into ``captions``.

    ``events``: the events table (TableStore root, ``events/`` folder, Parquet file or
    DataFrame). Backend: ``vlm_backend``.
    """
    from flora.caption.run import CaptionConfig, caption_dataset
    from flora.data import open_dataset
    from flora.validation.core import TableValidationError

    opt = options or StepOptions()
    root, out = Path(dataset_path), Path(out_dir)
    name = open_dataset(root).name
    eps = opt.vlm_episodes(episodes)
    backend = vlm_backend(settings)
    base = CaptionConfig()
    cfg = CaptionConfig(
        max_attempts=opt.max_attempts, max_new_tokens=opt.tokens(base.max_new_tokens)
    )
    try:
        res = caption_dataset(root, events, out, backend, run_id, config=cfg, episodes=eps,
                              progress=progress)  # fmt: skip
    except TableValidationError as e:
        _log_rejected_table(e, "captions")
        raise
    return _report("caption", out, name, eps, processed=res.processed, skipped=res.skipped,
                   validation=res.report, backend=backend)  # fmt: skip


def rubric_source(dataset_path: str | Path, rubric: str | None = None) -> Any:
    """The rubric(s) for the rubric step: a file, the toy world's family rubrics, or none."""
    from flora.reward.rubric import load_rubric

    if rubric:
        return load_rubric(rubric)
    root = Path(dataset_path)
    if (root / "ground_truth" / "rubric.json").exists():
        from flora.reward.benchmark import gt_rubric_for

        return gt_rubric_for(root)
    return lambda _episode: None  # recorded per episode: "no rubric for this episode's task"


def run_reward(
    mode: str,
    dataset_path: str | Path,
    out_dir: str | Path,
    episodes: Sequence[int],
    run_id: str,
    *,
    options: StepOptions | None = None,
    settings: FloraSettings | None = None,
    progress: bool = True,
) -> StepReport:
    """One rewarder mode (``outcome`` | ``dense`` | ``rubric``) into its table.

    Episode rows failing the table's suite are quarantined by the step function (recorded
    as failures, not written); if the whole table then fails its suite, this raises
    ``TableValidationError`` so the table is not handed on.
    """
    from flora.data import open_dataset
    from flora.reward import run as rr
    from flora.validation.core import TableValidationError

    if mode not in REWARD_MODES:
        raise ValueError(f"unknown reward mode {mode!r}; expected one of {REWARD_MODES}")
    opt = options or StepOptions()
    root, out = Path(dataset_path), Path(out_dir)
    ds = open_dataset(root)
    eps = opt.vlm_episodes(episodes)
    backend = vlm_backend(settings, "rewarder")
    kw: dict[str, Any] = {"run_id": run_id, "episodes": eps, "max_attempts": opt.max_attempts,
                          "progress": progress}  # fmt: skip
    default_tokens = {"outcome": rr.OUTCOME_MAX_NEW_TOKENS, "dense": rr.DENSE_MAX_NEW_TOKENS,
                      "rubric": rr.RUBRIC_MAX_NEW_TOKENS}  # fmt: skip
    kw["max_new_tokens"] = opt.tokens(default_tokens[mode])
    if mode == "rubric":
        res = rr.rubric_dataset(ds, backend, out, rubric_source(root, opt.rubric), **kw)
    else:
        res = rr.reward_dataset(mode, ds, backend, out, **kw)  # type: ignore[arg-type]
    if res.validation is not None and not res.validation.success:
        err = TableValidationError(res.validation)
        _log_rejected_table(err, res.table)
        raise err
    processed = sorted(set(res.written) | {f.episode_id for f in res.failures})
    return _report(mode, out, ds.name, eps, processed=processed, skipped=res.skipped,
                   validation=res.validation, backend=backend)  # fmt: skip


def engine_summary(reports: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One dict per table (rows, failures, location, validity) from step report dicts."""
    out: dict[str, Any] = {}
    for r in reports:
        out[r["table"]] = {
            "step": r["step"],
            "table_dir": r["table_dir"],
            "rows": r["rows"],
            "episodes_in": len(r["episodes_in"]),
            "episodes_with_rows": r["episodes_with_rows"],
            "failures": r["n_failures"],
            "failed_episodes": len(r["failed_episodes"]),
            "valid": r["valid"],
            "model": r["model"],
            "model_version": r["model_version"],
            "metrics": r.get("metrics", {}),
            "failure_examples": [
                f"{f['episode_id']} {f['item']}: {f['reason']}" for f in r["failures"][:2]
            ],  # fmt: skip
        }
    return out


def merge_step_reports(reports: dict[str, Sequence[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per step (pipeline order), its shards' report dicts merged (:func:`merge_reports`);
    steps without any report are left out."""
    return {key: merge_reports(reports[key]) for key in STEP_TABLES if reports.get(key)}


def log_run_totals(
    run_id: str,
    merged: dict[str, dict[str, Any]],
    tables: dict[str, Any],
    *,
    metrics: dict[str, float] | None = None,
    tags: dict[str, str] | None = None,
) -> None:
    """Log a data-engine run's totals to its MLflow parent run: each merged step report's
    counts, metrics, table size, suite state and model, plus ``metrics`` / ``tags``; the
    per-table summary and the merged reports as JSON artifacts."""
    from flora.tracking import log_to_run

    metrics, tags = dict(metrics or {}), dict(tags or {})
    for rep in merged.values():
        metrics |= report_counts(rep) | rep["metrics"]
        metrics |= {f"table.{rep['table']}.rows": rep["rows"],
                    f"table.{rep['table']}.episodes": rep["episodes_with_rows"]}  # fmt: skip
        tags |= {f"validation.{rep['table']}": rep["valid"],
                 f"step.{rep['step']}.model": rep["model"],
                 f"step.{rep['step']}.model_version": rep["model_version"]}  # fmt: skip
    artifacts = {"engine_summary.json": tables} | {
        f"steps/{key}.json": rep for key, rep in merged.items()}  # fmt: skip
    log_to_run(run_id, metrics=metrics, tags=tags, dicts=artifacts)


def summarize_shards(
    state: dict[str, Any],
    shards: Sequence[dict[str, int]],
    handoffs: dict[str, Sequence[dict[str, Any] | None]],
) -> dict[str, Any]:
    """The data-engine DAG's ``summary`` step over its episode shards.

    ``handoffs``: per step (``segment``, ``caption``, ``outcome``, ...), what each shard's
    task handed on, by map index (None where it did not finish). Merges each step's shard
    reports (:func:`merge_reports`), scores the whole run's events against the ground
    truth, writes the per-table summary to ``<outputs>/runs/<dataset>/<run id>.json`` and
    the merged reports beside the episode sets, and logs the run's totals to the MLflow
    parent run. Returns the state with the merged references, ``tables``, ``summary_path``
    and ``failed_shards`` (shard label -> the steps it did not finish).
    """
    from flora.orchestration.shards import episode_set, run_dir, unfinished_shards
    from flora.orchestration.steps import REFERENCE_KEYS

    done = {key: [h for h in handoffs.get(key) or [] if h] for key in STEP_TABLES}
    failed = unfinished_shards(shards, handoffs)
    merged = merge_step_reports({key: [json.loads(Path(r[key]["report"]).read_text())
                                       for r in refs] for key, refs in done.items()})  # fmt: skip
    if "segment" in merged:
        merged["segment"]["metrics"] = segment_metrics(
            state["dataset_path"], state["outputs_dir"], episode_set(state, "valid")
        )
    tables = engine_summary(list(merged.values()))
    out = Path(state["outputs_dir"]) / "runs" / state["dataset"]
    summary_path = write_json(tables, out / f"{state['mlflow_run_id']}.json")
    handed: dict[str, Any] = {}
    for key, rep in merged.items():
        path = write_json(rep, run_dir(state) / "steps" / f"{key}.json")
        handed[key] = {k: rep[k] for k in REFERENCE_KEYS} | {
            "episodes": len(rep["episodes_in"]), "report": str(path)}  # fmt: skip

    metrics = {"ingest.episodes": state["n_episodes"], "ingest.ok": state["n_ingested"],
               "validation.valid_episodes": state["n_valid"],
               "validation.invalid_episodes": state["n_invalid"],
               "shards.failed": len(failed)}  # fmt: skip
    tags = {"validation.raw": "passed" if state["validation_success"] else "failed",
            "flora.failed_shards": ",".join(sorted(failed))}  # fmt: skip
    log_run_totals(state["mlflow_run_id"], merged, tables, metrics=metrics, tags=tags)
    return {**state, **handed, "tables": tables, "summary_path": str(summary_path),
            "failed_shards": failed}  # fmt: skip


# --------------------------------------------------------------------------- adapters' glue


def ingest_tracked(
    path: str | Path,
    manifest_out: str | Path,
    *,
    tags: dict[str, str],
    run_name: str,
    run_id: str | None = None,
) -> tuple[Any, str]:
    """Ingest ``path`` (manifest written to ``manifest_out``) in a new MLflow run.

    Without ``run_id`` the pipeline run's MLflow run starts here (KFP): it gets ``tags``,
    the manifest summary and the ingest counts. With the id of a pipeline parent run
    (``flora.tracking.start_pipeline_run``: the Airflow DAG) they go to ingest's child run.
    Returns ``(IngestResult, mlflow_run_id)``: the id of the run to hand on.
    """
    import mlflow

    from flora.data.ingest import ingest_dataset
    from flora.tracking import log_table_summary, mlflow_run

    with mlflow_run("ingest", tags=tags, run_name=run_name, run_id=run_id) as run:
        result = ingest_dataset(path, out=manifest_out, progress=False)
        log_table_summary("manifest", result.manifest)
        mlflow.log_metrics(
            {
                "ingest.episodes": len(result.manifest),
                "ingest.ok": result.n_ok,
                "ingest.errors": result.n_error,
            }
        )
        handed_on = run_id or run.info.run_id
    return result, handed_on


def tracked(
    name: str,
    mlflow_run_id: str,
    step: Callable[..., StepReport],
    *args: Any,
    run_tags: dict[str, str] | None = None,
    **kwargs: Any,
) -> StepReport:
    """Run ``step(*args, **kwargs)`` as ``name`` in the pipeline's MLflow run (its child run
    when the id is a pipeline parent) tagged ``run_tags``; log its report there."""
    from flora.tracking import mlflow_run

    with mlflow_run(name, run_tags, run_id=mlflow_run_id):
        rep = step(*args, **kwargs)
        rep.log_mlflow()
    return rep


#: Tag tying a KFP pipeline run's MLflow parent run to its KFP job: the exit handler
#: (``finalize_op``) may not take another task's output, only the job id placeholder.
KFP_JOB_TAG = "kfp.job_id"


def start_kfp_run(dataset_path: str | Path, job_id: str, params: dict[str, Any]) -> str:
    """Open the MLflow parent run of one KFP data-engine run (tagged with its job id);
    every component's step then logs to its own child run. Returns the parent's id."""
    from flora.tracking import start_pipeline_run

    path = Path(dataset_path).resolve()
    tags = {"orchestrator": "kfp", KFP_JOB_TAG: job_id, "dataset": path.name,
            "dataset_path": str(path)}  # fmt: skip
    return start_pipeline_run("data-engine", tags=tags, params=params,
                              experiment=get_settings().mlflow_experiment,
                              run_name=f"kfp/{path.name}")  # fmt: skip


def finish_kfp_run(job_id: str, state: str, error: str = "") -> str:
    """The KFP exit handler's step: close the parent run of job ``job_id`` FAILED when the
    pipeline (``state``, KFP's final state of the run's task group) or any child run
    failed, else FINISHED; tags the failed tasks and KFP's error. Returns the status."""
    from mlflow import MlflowClient

    from flora.tracking import child_runs, configure, ensure_experiment, finish_pipeline_run

    configure()
    client = MlflowClient()
    exp_id = ensure_experiment(get_settings().mlflow_experiment)
    runs = client.search_runs([exp_id], filter_string=f"tags.`{KFP_JOB_TAG}` = '{job_id}'")
    if not runs:
        exp = get_settings().mlflow_experiment
        raise LookupError(
            f"no MLflow run tagged {KFP_JOB_TAG}={job_id!r} in experiment {exp!r}: "
            "the pipeline's open_run_op did not run"
        )
    parent = runs[0].info.run_id
    states: dict[str, str] = {}
    for child in child_runs(parent):
        step = child.data.tags.get("flora.step", child.info.run_name or child.info.run_id)
        shard = child.data.tags.get("flora.shard")
        key = f"{step}[{shard}]" if shard else step
        # A child still RUNNING when the pipeline ended was killed with its pod. Children
        # come oldest first, so a task KFP retried counts by its last attempt.
        states[key] = "success" if child.info.status == "FINISHED" else "failed"
    states["pipeline"] = "success" if state.upper() == "SUCCEEDED" else "failed"
    if error:
        client.set_tag(parent, "flora.error", error[:5000])
    return finish_pipeline_run(parent, states)


def summarize_kfp_shards(
    mlflow_run_id: str,
    dataset_path: str | Path,
    valid_episodes: Sequence[int],
    reports: dict[str, Sequence[dict[str, Any]]],
    shard_roots: dict[str, Sequence[str]],
    out_roots: dict[str, str],
) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """The KFP pipeline's ``summary`` step over its episode shards.

    Each shard's component wrote its table into its own artifact (``shard_roots``: per
    step, the store roots of the shards that finished it); they are merged into one store
    per step (``out_roots``, :meth:`flora.tables.TableStore.merge_from`), the finished
    shards' reports are merged, the run's events are scored once against the ground truth,
    and the totals are logged to the MLflow parent run, with the shards that did not finish
    (the hand-offs :func:`kfp_shard_step` marked :data:`SHARD_FAILED`) as the tag
    ``flora.failed_shards`` and the metric ``shards.failed``, as the DAG's summary.
    Returns ``(per-table summary, failed shards)``: shard label -> the steps it did not
    finish.
    """
    from flora.orchestration.shards import shard_label
    from flora.tables import TableStore

    failed: dict[str, list[str]] = {}
    finished: dict[str, list[dict[str, Any]]] = {}
    for key, reps in reports.items():
        for r in reps:
            if SHARD_FAILED in r:
                failed.setdefault(shard_label(r["shard"]), []).append(key)
            else:
                finished.setdefault(key, []).append(r)
    for key, table in STEP_TABLES.items():
        store = TableStore(out_roots[key])
        for root in shard_roots.get(key) or []:
            store.merge_from(table, root)
        (Path(out_roots[key]) / table).mkdir(parents=True, exist_ok=True)
    merged = merge_step_reports(finished)
    for key, rep in merged.items():
        rep["table_dir"] = str(Path(out_roots[key]) / STEP_TABLES[key])
    if "segment" in merged:
        merged["segment"]["metrics"] = segment_metrics(
            dataset_path, out_roots["segment"], valid_episodes
        )
    tables = engine_summary(list(merged.values()))
    n = max((len(r) for r in reports.values()), default=0)
    log_run_totals(mlflow_run_id, merged, tables,
                   metrics={"shards": n, "shards.failed": len(failed)},
                   tags={"flora.failed_shards": ",".join(sorted(failed))})  # fmt: skip
    return tables, failed


#: Key of a shard step's KFP hand-off (its report dict and its table artifact's metadata)
#: when the shard did not finish the step: the reason. KFP has no ``all_done`` trigger
#: inside a DAG, so a shard's bad input is handed on as data instead of failing the loop.
SHARD_FAILED = "flora.failed"


def kfp_shard_step(
    name: str,
    mlflow_run_id: str,
    shard: dict[str, Any],
    step: Callable[..., StepReport],
    *args: Any,
    metrics: Any,
    table: Any,
    upstream: Any = None,
    **kwargs: Any,
) -> tuple[int, int, dict[str, Any]]:
    """One shard's engine step in a KFP component: ``tracked(name, ..., step, *args)`` and
    its outputs (:func:`publish_kfp`).

    Bad input (:func:`flora.orchestration.permanent_errors`: a retry would fail alike)
    does not fail the task: the step's child run ends FAILED, and the step hands on
    ``{SHARD_FAILED: reason, "step", "shard", "ran"}`` with ``table`` marked the same, so the
    other shards' iterations and the summary still run; the summary reports the shard and
    ``check_shards_op`` then fails the pipeline (the DAG's ``summary`` does both). When
    ``upstream`` (the shard's previous table artifact) is so marked the step does not run
    and hands the mark on. Any other error propagates, and KFP's retries apply.
    """
    from flora.orchestration import permanent_errors
    from flora.orchestration.shards import shard_tags

    earlier = upstream.metadata.get(SHARD_FAILED) if upstream is not None else None
    if earlier:  # the shard failed at an earlier step: run nothing, hand its reason on
        reason = earlier
    else:
        try:
            rep = tracked(name, mlflow_run_id, step, *args, run_tags=shard_tags(shard),
                          **kwargs)  # fmt: skip
        except permanent_errors() as e:
            reason = f"{name}: {type(e).__name__}: {e}"
        else:
            return publish_kfp(rep, metrics, table)
    table.metadata.update({SHARD_FAILED: reason})
    return 0, 0, {SHARD_FAILED: reason, "step": name, "shard": dict(shard), "ran": not earlier}


def publish_kfp(rep: StepReport, metrics: Any, table: Any) -> tuple[int, int, dict[str, Any]]:
    """A step's KFP outputs: counts and metrics to the ``Metrics`` artifact, the table's
    metadata on its output artifact. Returns ``(rows, failures, report dict)``."""
    for k, v in {**rep.counts(), **rep.metrics}.items():
        metrics.log_metric(k, v)
    table.metadata.update({"table": rep.table, "rows": rep.rows, "model": rep.model})
    return rep.rows, len(rep.failures), rep.to_dict()


def write_json(obj: Any, path: str | Path) -> Path:
    """Write ``obj`` as indented JSON (parents created) and return the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(obj, indent=1, default=str))
    return p


__all__ = [
    "REWARD_MODES",
    "STEP_TABLES",
    "StepOptions",
    "StepReport",
    "engine_summary",
    "ensure_tiny_vlm",
    "KFP_JOB_TAG",
    "SHARD_FAILED",
    "finish_kfp_run",
    "ingest_tracked",
    "kfp_shard_step",
    "log_run_totals",
    "merge_reports",
    "merge_step_reports",
    "publish_kfp",
    "report_counts",
    "rubric_source",
    "run_caption",
    "run_reward",
    "run_segment",
    "segment_backend",
    "segment_metrics",
    "start_kfp_run",
    "summarize_kfp_shards",
    "summarize_shards",
    "tiny_model_dir",
    "tracked",
    "vlm_backend",
    "write_json",
]
