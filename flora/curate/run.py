"""The curation step: annotation tables → ``curation`` decisions → curated ``mixture``.

``curate_dataset`` reads the engine tables (``flora.curate.sources``), decides every item
(``flora.curate.filter``) and validates the decisions, builds the mixture
(``flora.curate.rebalance``), checks its lineage against the tables it was read from and
validates it with its GX suite; only then does it write the decisions per episode with
``TableStore`` (resumable: an episode whose decisions did not change is not rewritten) and
put the mixture in place atomically at ``<out>/curated/<dataset>/mixture.parquet`` (+
``mixture.json`` summary). An empty mixture raises ``EmptyMixtureError``; a mixture failing
its suite raises ``TableValidationError``; either way nothing on disk is changed, so the
decisions there still match the mixture there.

``log_mixture`` logs it to the active MLflow run as an MLflow dataset (input, context
``curated-mixture``) plus its summary; ``version_with_dvc`` copies it into a DVC repo's
``curated/<dataset>/`` and ``dvc add``/``push``es it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from flora.curate.filter import DECISION_DTYPES, decide, summarize
from flora.curate.rebalance import build_mixture
from flora.curate.rules import CurationRules, load_rules
from flora.curate.sources import Annotations, TableSource, episode_meta, load_annotations
from flora.data.dataset import dataset_name
from flora.tables import TableStore

DECISIONS = "curation"
MIXTURE = "mixture"


@dataclass
class CurateResult:
    """What one curation run wrote and decided."""

    dataset: str
    run_id: str
    decisions: pd.DataFrame
    mixture: pd.DataFrame
    mixture_path: Path
    summary: dict[str, Any]
    processed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    validation: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able report (what the orchestrators hand on)."""
        return {
            "dataset": self.dataset,
            "run_id": self.run_id,
            "mixture_path": str(self.mixture_path),
            "decisions_dir": str(self.mixture_path.parents[2] / DECISIONS),
            "summary": self.summary,
            "processed": len(self.processed),
            "skipped": len(self.skipped),
            "validation": self.validation,
        }


class LineageError(ValueError):
    """A mixture row names a source run that is not in the tables it was read from."""


def check_lineage(mixture: pd.DataFrame, ann: Annotations) -> None:
    """Every row's ``source_run_ids`` appear among its episode's rows of ``source_tables``."""
    known: dict[tuple[str, str], set[str]] = {}
    for t, df in ann.tables.items():
        if len(df) and {"episode_id", "run_id"} <= set(df.columns):
            for eid, g in df.groupby("episode_id"):
                known[(t, str(eid))] = {str(x) for x in g.run_id.dropna()}
    bad = []
    for r in mixture.itertuples(index=False):
        have = set().union(*(known.get((t, r.episode_id), set()) for t in r.source_tables))
        missing = set(r.source_run_ids) - have
        if missing or not r.source_tables:
            bad.append(f"{r.episode_id} [{r.start_us}, {r.end_us}) {r.split}: "
                       f"runs {sorted(missing)} not in tables {list(r.source_tables)}")  # fmt: skip
    if bad:
        raise LineageError(f"{len(bad)} mixture rows do not trace to their sources: "
                           + "; ".join(bad[:5]))  # fmt: skip


def _stage(path: Path, write: Any) -> tuple[str, Path]:
    """``write(tmp)`` to a temp file beside ``path``; ``(tmp, path)`` for ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return tmp, path


_UNCHANGED = "; nothing was changed (the decisions and mixture on disk are as they were)"


def _nothing_changed(e: BaseException) -> None:
    """Say in ``e`` that the failed run wrote nothing (in its message where it is a plain
    one, so the CLI's one-line error says it too; else as a traceback note)."""
    if isinstance(e, ValueError) and len(e.args) == 1 and isinstance(e.args[0], str):
        e.args = (e.args[0] + _UNCHANGED,)
    else:
        e.add_note(_UNCHANGED.removeprefix("; "))


def _norm(v: Any) -> Any:
    # Parquet turns list cells into numpy arrays; compare their contents.
    if hasattr(v, "__len__") and not isinstance(v, str):
        return tuple(_norm(x) for x in v)
    if v is None or v is pd.NA or (isinstance(v, float) and v != v):
        return None  # None and NaN both mean "no value" in object columns
    return v


def _same(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    """Equal decision parts, ignoring the run id (a rerun decides the same thing)."""
    cols = [c for c in a.columns if c != "run_id"]
    if len(a) != len(b) or not set(cols) <= set(b.columns):
        return False
    rows = lambda df: [tuple(_norm(v) for v in r) for r in df[cols].itertuples(index=False)]  # noqa: E731
    return rows(a) == rows(b)


def curate_dataset(
    dataset: str | Path,
    tables: TableSource,
    out: str | Path,
    run_id: str | None = None,
    *,
    rules: CurationRules | str | Path | None = None,
    episodes: Sequence[int] | None = None,
    meta: pd.DataFrame | None = None,
    resume: bool = True,
) -> CurateResult:
    """Curate one dataset's annotation tables into the ``curation`` table and the mixture.

    Args:
        dataset: dataset root (task/robot/duration metadata), or its name when ``meta`` is
            given (e.g. built from ground truth).
        tables: TableStore root of the annotation tables, or ``{table: root}``.
        out: TableStore root for ``curation/`` and ``mixture/``.
        rules: rules object or YAML path (default ``rules/default.yaml``).
        episodes: episode indices to curate (default: all in the metadata).
        meta: episode metadata (``sources.META_COLUMNS``) instead of reading the dataset.
        resume: keep decision parts that did not change (``False`` rewrites every one).
    """
    from flora.validation.core import assert_valid

    rules = rules if isinstance(rules, CurationRules) else load_rules(rules)
    run_id = run_id or uuid.uuid4().hex[:12]
    if meta is None:
        meta = episode_meta(dataset, list(episodes) if episodes is not None else None)
    elif episodes is not None:
        meta = meta[meta.episode_index.isin([int(i) for i in episodes])]
    name = dataset_name(dataset)  # as the readers name it: `.` the folder, `org/x@rev` x
    if len(meta) == 0:
        from flora.curate.rebalance import EmptyMixtureError

        raise EmptyMixtureError(f"dataset {name}: no readable episode to curate")
    try:
        # Everything that can refuse the run comes before any decision part is committed:
        # a failed run leaves the decisions and the mixture on disk as they were (and
        # consistent with each other).
        ann = load_annotations(tables)
        decisions = decide(ann, meta, rules, run_id)
        assert_valid(DECISIONS, decisions, dataset=name)
        clusters = None
        if rules.rebalance.verb_source == "cluster":
            from flora.curate.failures import cluster_texts

            caps = decisions.caption.fillna(decisions.verb).astype(str)
            labels = cluster_texts(list(caps))
            clusters = pd.Series(labels, index=decisions.index)
        mixture, mix_summary = build_mixture(decisions, rules, clusters=clusters)
        check_lineage(mixture, ann)
        assert_valid(MIXTURE, mixture, dataset=name)
    except Exception as e:
        _nothing_changed(e)
        raise
    summary = {"dataset": name, "rules_sha": rules.sha(), "rules": rules.model_dump(mode="json"),
               "decisions": summarize(decisions), "mixture": mix_summary,
               "tables": ann.roots}  # fmt: skip
    path = mixture_path(out, name)
    store = TableStore(out)
    processed: list[str] = []
    skipped: list[str] = []
    staged: list[tuple[str, Path]] = []
    try:
        # Mixture and summary are written beside their targets first (a full disk fails
        # here, before any commit) and put in place once the decisions are committed.
        staged.append(_stage(path, lambda f: mixture.to_parquet(f, index=False)))
        staged.append(_stage(path.with_suffix(".json"), lambda f: Path(f).write_text(
            json.dumps(summary, indent=1, default=str))))  # fmt: skip
        for eid, g in decisions.groupby("episode_id", sort=True):
            part = g.reset_index(drop=True)
            old = store.read_part(DECISIONS, str(eid)) if resume else None
            if old is not None and store.has(DECISIONS, str(eid)) and _same(part, old):
                skipped.append(str(eid))
                continue
            store.commit(DECISIONS, str(eid), part, [])  # written and committed (no pending mark)
            processed.append(str(eid))
    except BaseException:
        for tmp, _ in staged:
            Path(tmp).unlink(missing_ok=True)
        raise
    for tmp, target in staged:
        os.replace(tmp, target)
    return CurateResult(name, run_id, decisions, mixture, path, summary, processed, skipped,
                        {"curation": "passed", "mixture": "passed"})  # fmt: skip


def mixture_path(out: str | Path, dataset: str) -> Path:
    """Where the curated mixture of ``dataset`` lives under an output root.

    ``<out>/curated/<dataset>/mixture.parquet`` — deliberately not a ``TableStore`` table
    folder (one file for the whole dataset, not one part per episode).
    """
    return Path(out) / "curated" / dataset / "mixture.parquet"


def read_mixture(path: str | Path, split: str | None = None) -> pd.DataFrame:
    """A mixture Parquet file (optionally one split), validated against its suite."""
    from flora.validation.core import assert_valid

    df = pd.read_parquet(path)
    df["source_run_ids"] = df["source_run_ids"].map(list)
    df["source_tables"] = df["source_tables"].map(list)
    assert_valid(MIXTURE, df)
    return df if split is None else df[df.split == split].reset_index(drop=True)


def log_mixture(result: CurateResult) -> None:
    """Log the mixture to the active MLflow run: dataset input, summary, split metrics."""
    import mlflow

    flat = result.mixture.copy()
    for c in ("source_run_ids", "source_tables"):
        flat[c] = flat[c].map(",".join)
    ds = mlflow.data.from_pandas(flat, source=str(result.mixture_path),
                                 name=f"{result.dataset}-mixture")  # fmt: skip
    mlflow.log_input(ds, context="curated-mixture")
    mlflow.log_dict(result.summary, "curation/summary.json")
    dec = result.summary["decisions"]
    metrics = {f"curate.{k}": float(dec[k]) for k in ("items", "pretrain", "policy",
                                                      "failures", "dropped")}  # fmt: skip
    for split, s in result.summary["mixture"]["splits"].items():
        metrics[f"curate.mixture.{split}.rows"] = float(s.get("rows", 0))
        if "top_task_share" in s:
            metrics[f"curate.mixture.{split}.top_task_share"] = s["top_task_share"]
    mlflow.log_metrics(metrics)
    mlflow.set_tag("curate.mixture_path", str(result.mixture_path))
    mlflow.set_tag("validation.mixture", result.validation.get("mixture", "passed"))


def _dvc_bin() -> str:
    b = Path(sys.executable).parent / "dvc"
    return str(b) if b.exists() else "dvc"


def version_with_dvc(path: str | Path, repo: str | Path, dataset: str) -> dict[str, Any]:
    """Copy the mixture into ``<repo>/curated/<dataset>/mixture.parquet``, ``dvc add`` it
    and ``dvc push`` when the repo has a default remote; returns pointer path and md5."""
    import yaml

    repo = Path(repo)
    if not (repo / ".dvc").is_dir():
        raise FileNotFoundError(f"{repo} is not a DVC repository (no .dvc/)")
    target = repo / "curated" / dataset / "mixture.parquet"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(path, target)
    env = {**os.environ, "DVC_SITE_CACHE_DIR": str(repo / ".flora" / "dvc-site-cache")}

    def dvc(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([_dvc_bin(), *args], cwd=repo, env=env, capture_output=True,
                              text=True)  # fmt: skip

    p = dvc("add", str(target.relative_to(repo)))
    if p.returncode != 0:
        raise RuntimeError(f"dvc add {target} failed: {p.stderr.strip() or p.stdout.strip()}")
    pointer = target.with_name(target.name + ".dvc")
    md5 = yaml.safe_load(pointer.read_text())["outs"][0]["md5"]
    pushed = False
    if dvc("remote", "list").stdout.strip():
        p = dvc("push", str(pointer.relative_to(repo)))
        if p.returncode != 0:
            raise RuntimeError(f"dvc push {pointer} failed: {p.stderr.strip()}")
        pushed = True
    return {"pointer": str(pointer), "md5": md5, "pushed": pushed}


__all__ = [
    "DECISIONS",
    "DECISION_DTYPES",
    "MIXTURE",
    "CurateResult",
    "LineageError",
    "check_lineage",
    "curate_dataset",
    "log_mixture",
    "mixture_path",
    "read_mixture",
    "version_with_dvc",
]
