"""Great Expectations suites for every table the engine reads or writes.

A table that fails its suite is never passed downstream (DESIGN §3): producers call
:func:`assert_valid` before writing or handing a table on, and the DAG's validate step
fails the run when a suite fails.

Suites are declared next to the code that owns the table, in a module of this package,
with :func:`register_suite`::

    @register_suite("events", description="Stitched events, one row per event")
    def _events(gxe):
        return [
            *common_columns(gxe),
            gxe.ExpectColumnValuesToBeBetween(column="start_us", min_value=0),
            gxe.ExpectColumnPairValuesAToBeGreaterThanB(column_A="end_us", column_B="start_us"),
        ]

``gxe`` is ``great_expectations.expectations`` (GX 1.x), passed in lazily so that declaring
a suite does not import GX (a ~5 s import); an optional ``derive`` function adds derived
check columns (e.g. per-episode timestamp deltas) before validation, because GX 1.x has no
per-group row expectations for pandas.

GX runs in-process on pandas with one cached ephemeral context (no project directory,
analytics off). Every validation goes through GX's own objects: the suite is stored in
the context, a ``ValidationDefinition`` binds it to the whole-dataframe batch definition
and a ``Checkpoint`` runs it, so its result lands in the context's validation-results
store under a ``ValidationResultIdentifier``. :func:`write_data_docs` renders the results
of a set of reports as GX Data Docs (HTML) into a folder (the CLI puts them beside the
JSON report). The first validation in a process pays the GX import (~5 s), later ones
cost tens of milliseconds. Results kept for Data Docs are bounded (:data:`KEEP_RESULTS`),
so a long-running process (an Airflow worker) does not grow.
"""

from __future__ import annotations

import importlib
import math
import os
import pkgutil
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from flora.data.episode import FloraDataError
from flora.tables import COMMON_COLUMNS

# Must be set before GX is imported anywhere in the process.
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

#: Failing rows kept per expectation in a report (enough to debug, small enough to log).
MAX_SAMPLES = 20
#: GX validation results kept in the in-memory store for Data Docs (oldest evicted first).
KEEP_RESULTS = 256

SuiteBuilder = Callable[[Any], Sequence[Any]]


@dataclass(frozen=True)
class TableSuite:
    """A declared suite: which table, how to build its expectations, how rows are named."""

    table: str
    build: SuiteBuilder
    index_columns: tuple[str, ...] = ("episode_id",)
    derive: Callable[[pd.DataFrame], pd.DataFrame] | None = None
    description: str = ""

    @property
    def name(self) -> str:
        """GX suite name (``<table>_suite``)."""
        return f"{self.table}_suite"


_REGISTRY: dict[str, TableSuite] = {}
_DISCOVERED = False
_BROKEN: dict[str, str] = {}  # suite modules that failed to import -> error
# Modules of this package that hold no suites (importing them is pointless or circular).
_NOT_SUITE_MODULES = {"core", "cli"}


def register_suite(
    table: str,
    *,
    index_columns: Sequence[str] = ("episode_id",),
    derive: Callable[[pd.DataFrame], pd.DataFrame] | None = None,
    description: str = "",
) -> Callable[[SuiteBuilder], SuiteBuilder]:
    """Decorator declaring the suite of ``table``; the function returns GX expectations.

    ``index_columns`` name the columns copied into failing-row samples (``episode_id``
    first, so every failure names its episode). Registering a table twice replaces the
    earlier suite (module reloads in tests).
    """

    def deco(fn: SuiteBuilder) -> SuiteBuilder:
        doc_lines = (fn.__doc__ or "").strip().splitlines()
        _REGISTRY[table] = TableSuite(
            table=table,
            build=fn,
            index_columns=tuple(index_columns),
            derive=derive,
            description=description or (doc_lines[0] if doc_lines else ""),
        )
        return fn

    return deco


def _discover() -> None:
    """Import every suite module of ``flora.validation`` once (they register on import)."""
    global _DISCOVERED
    if _DISCOVERED:
        return
    import flora.validation as pkg

    for info in pkgutil.iter_modules(pkg.__path__):
        if info.name not in _NOT_SUITE_MODULES and not info.name.startswith("_"):
            try:
                importlib.import_module(f"{pkg.__name__}.{info.name}")
            except ImportError as e:
                # One broken suite module must not hide every other table's suite; the
                # error is reported when a table it would have defined is asked for.
                _BROKEN[info.name] = f"{type(e).__name__}: {e}"
    _DISCOVERED = True


def get_suite(table: str) -> TableSuite:
    """The registered suite of ``table`` (suite modules are discovered on first use)."""
    if table not in _REGISTRY:
        _discover()
    try:
        return _REGISTRY[table]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY)) or "none"
        broken = "".join(f"; module {m} failed to import: {e}" for m, e in _BROKEN.items())
        raise KeyError(
            f"no validation suite for table {table!r} (known: {known}){broken}"
        ) from None


def registered_tables() -> list[str]:
    """Names of all tables that have a suite."""
    _discover()
    return sorted(_REGISTRY)


# --------------------------------------------------------------------------- helpers for suites


def columns_exist(gxe: Any, *columns: str) -> list[Any]:
    """One ``ExpectColumnToExist`` per column (each failure names its field)."""
    return [gxe.ExpectColumnToExist(column=c) for c in columns]


def not_null(gxe: Any, *columns: str) -> list[Any]:
    """One ``ExpectColumnValuesToNotBeNull`` per column."""
    return [gxe.ExpectColumnValuesToNotBeNull(column=c) for c in columns]


def common_columns(gxe: Any) -> list[Any]:
    """Expectations every engine table shares: the common columns exist, ids are set."""
    return [*columns_exist(gxe, *COMMON_COLUMNS), *not_null(gxe, "episode_id", "dataset")]


def interval_in_episode(gxe: Any) -> list[Any]:
    """Eq. (1) row-wise: integer ``0 <= start_us < end_us <= duration_us``."""
    return [
        *(
            gxe.ExpectColumnValuesToBeInTypeList(column=c, type_list=["int64", "int32", "Int64"])
            for c in ("start_us", "end_us")
        ),
        gxe.ExpectColumnValuesToBeBetween(column="start_us", min_value=0),
        gxe.ExpectColumnPairValuesAToBeGreaterThanB(column_A="end_us", column_B="start_us"),
        gxe.ExpectColumnPairValuesAToBeGreaterThanB(
            column_A="duration_us", column_B="end_us", or_equal=True
        ),
    ]


def checks_hold(gxe: Any, *columns: str) -> list[Any]:
    """Every row of each derived boolean ``_chk_*`` column is True."""
    return [gxe.ExpectColumnValuesToBeInSet(column=c, value_set=[True]) for c in columns]


# --------------------------------------------------------------------------- report types


@dataclass(frozen=True)
class ExpectationResult:
    """Outcome of one expectation, with samples of the rows that failed it."""

    expectation: str  # GX type, e.g. "expect_column_values_to_be_between"
    column: str | None  # the field it checks ("a,b" for pair/multicolumn expectations)
    kwargs: dict[str, Any]
    success: bool
    description: str | None = None
    element_count: int | None = None
    unexpected_count: int | None = None
    observed_value: Any = None
    samples: list[dict[str, Any]] = field(default_factory=list)  # failing rows (index cols)
    failing_ids: list[str] = field(default_factory=list)  # distinct episode_id of failing rows
    error: str | None = None  # set when GX could not evaluate it (e.g. missing column)

    def describe(self) -> str:
        """One readable line about this result."""
        what = self.description or self.expectation
        where = f" [{self.column}]" if self.column else ""
        if self.success:
            return f"ok   {what}{where}"
        if self.error:
            return f"FAIL {what}{where}: {self.error}"
        detail = []
        if self.unexpected_count is not None:
            detail.append(f"{self.unexpected_count}/{self.element_count} rows")
        elif self.observed_value is not None:
            detail.append(f"observed {self.observed_value!r}")
        if self.failing_ids:
            more = "" if len(self.failing_ids) <= 5 else f" (+{len(self.failing_ids) - 5})"
            detail.append("episodes " + ", ".join(self.failing_ids[:5]) + more)
        return f"FAIL {what}{where}: " + "; ".join(detail)


@dataclass(frozen=True)
class ValidationReport:
    """Result of validating one table against its suite."""

    suite: str
    table: str
    success: bool
    row_count: int
    results: list[ExpectationResult]
    dataset: str | None = None
    #: The GX ``ValidationResultIdentifier`` (as a string) of the Checkpoint run that
    #: produced this report: its Data Docs page (see :func:`write_data_docs`).
    gx_result_id: str | None = None

    @property
    def failures(self) -> list[ExpectationResult]:
        """The expectations that failed (or could not be evaluated)."""
        return [r for r in self.results if not r.success]

    @property
    def failing_episodes(self) -> list[str]:
        """Distinct ``episode_id`` values of all failing rows, sorted."""
        return sorted({e for r in self.failures for e in r.failing_ids})

    @property
    def statistics(self) -> dict[str, int]:
        """Counts of evaluated / successful / failed expectations and rows."""
        return {
            "evaluated": len(self.results),
            "successful": sum(r.success for r in self.results),
            "failed": len(self.failures),
            "rows": self.row_count,
        }

    def summary(self) -> str:
        """Multi-line readable summary (failures first)."""
        head = (
            f"{self.table} ({self.suite}): {'PASSED' if self.success else 'FAILED'} — "
            f"{self.statistics['successful']}/{self.statistics['evaluated']} expectations, "
            f"{self.row_count} rows"
        )
        lines = [head] + ["  " + r.describe() for r in self.failures]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (logged to MLflow, returned by DAG tasks)."""
        d = asdict(self)
        d["statistics"] = self.statistics
        d["failing_episodes"] = self.failing_episodes
        return _jsonable(d)


class TableValidationError(FloraDataError):
    """A table failed its suite; it must not be passed downstream. Carries the report."""

    def __init__(self, report: ValidationReport) -> None:
        self.report = report
        fields = sorted({r.column for r in report.failures if r.column})
        episodes = report.failing_episodes
        shown = ", ".join(episodes[:5]) + (f" (+{len(episodes) - 5})" if len(episodes) > 5 else "")
        msg = f"table {report.table!r} failed its suite {report.suite!r}: " + "; ".join(
            r.describe().removeprefix("FAIL ") for r in report.failures[:5]
        )
        if shown:
            msg += f" — failing episodes: {shown}"
        super().__init__(
            msg,
            dataset=report.dataset,
            episode=episodes[0] if len(episodes) == 1 else None,
            field=",".join(fields) or None,
        )


# --------------------------------------------------------------------------- GX runtime


class _GX:
    """The process-wide GX objects: one ephemeral context and a whole-dataframe batch def."""

    _lock = threading.RLock()
    _instance: _GX | None = None

    def __init__(self) -> None:
        import great_expectations as gx
        from great_expectations.data_context.types.base import ProgressBarsConfig

        self.gx = gx
        self.expectations = gx.expectations
        self.context = gx.get_context(mode="ephemeral")
        # Metric progress bars would flood logs (one per expectation batch).
        self.context.variables.progress_bars = ProgressBarsConfig(globally=False)
        source = self.context.data_sources.add_pandas("flora_tables")
        asset = source.add_dataframe_asset(name="table")
        self.batch_definition = asset.add_batch_definition_whole_dataframe("whole_table")
        # Result id string -> ValidationResultIdentifier, oldest first (for Data Docs).
        self.kept: OrderedDict[str, Any] = OrderedDict()
        self.runs = 0

    @classmethod
    def get(cls) -> _GX:
        with cls._lock:
            if cls._instance is None:
                cls._instance = _GX()
            return cls._instance

    def run_checkpoint(
        self, table: str, suite_name: str, expectations: Sequence[Any], data: pd.DataFrame,
        result_format: dict[str, Any],
    ) -> tuple[Any, str]:  # fmt: skip
        """Store the suite, run it through a ValidationDefinition and a Checkpoint.

        Returns (ExpectationSuiteValidationResult, result id string). Caller holds the lock.
        """
        import datetime as dt

        from great_expectations.core.run_identifier import RunIdentifier

        gx = self.gx
        suite = self.context.suites.add_or_update(
            gx.ExpectationSuite(name=suite_name, expectations=list(expectations))
        )
        vd = self.context.validation_definitions.add_or_update(
            gx.ValidationDefinition(
                name=f"{table}_validation", data=self.batch_definition, suite=suite
            )
        )
        cp = self.context.checkpoints.add_or_update(
            gx.Checkpoint(
                name=f"{table}_checkpoint", validation_definitions=[vd],
                result_format=result_format,
            )
        )  # fmt: skip
        self.runs += 1
        # A unique run name: two runs of one suite in the same microsecond stay distinct.
        run_id = RunIdentifier(
            run_name=f"flora-{os.getpid()}-{self.runs}", run_time=dt.datetime.now(dt.UTC)
        )
        out = cp.run(batch_parameters={"dataframe": data}, run_id=run_id)
        ((key, result),) = out.run_results.items()
        rid = key.to_fixed_length_tuple()
        sid = "/".join(str(x) for x in rid)
        self.kept[sid] = key
        while len(self.kept) > KEEP_RESULTS:
            _, old = self.kept.popitem(last=False)
            store = self.context.validation_results_store
            if store.has_key(old):
                store.remove_key(old)
        return result, sid


def gx_expectations() -> Any:
    """``great_expectations.expectations`` from the cached runtime (for ad-hoc suites)."""
    return _GX.get().expectations


def _jsonable(x: Any) -> Any:
    """Convert numpy/pandas scalars and containers into plain JSON types."""
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple | set):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return _jsonable(x.tolist())
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)  # NaN/inf are what failing rows often hold; keep them readable
    if x is None or isinstance(x, str | int | float | bool):
        return x
    return str(x)


def _error_message(info: Any) -> str | None:
    """GX puts either one exception dict or a dict of them (keyed by metric) here."""
    if not info:
        return None
    if isinstance(info, dict) and "raised_exception" in info:
        return info.get("exception_message") if info.get("raised_exception") else None
    if isinstance(info, dict):
        msgs = {_error_message(v) for v in info.values()}
        msgs.discard(None)
        return "; ".join(sorted(m for m in msgs if m)) or None
    return str(info)


def _column_of(kwargs: dict[str, Any]) -> str | None:
    if "column" in kwargs:
        return str(kwargs["column"])
    if "column_A" in kwargs:
        return f"{kwargs['column_A']},{kwargs['column_B']}"
    if "column_list" in kwargs:
        return ",".join(map(str, kwargs["column_list"]))
    return None


def _convert(er: Any, id_column: str | None) -> ExpectationResult:
    cfg = er.expectation_config
    kwargs = {k: v for k, v in dict(cfg.kwargs).items() if k != "batch_id"}
    res = dict(er.result or {})
    index_rows = res.get("unexpected_index_list") or []
    rows = [r for r in index_rows if isinstance(r, dict)]
    ids: list[str] = []
    if id_column:
        ids = sorted({str(r[id_column]) for r in rows if r.get(id_column) is not None})
    error = _error_message(er.exception_info)
    return ExpectationResult(
        expectation=cfg.type,
        column=_column_of(kwargs),
        kwargs=_jsonable(kwargs),
        success=bool(er.success) and error is None,
        description=getattr(cfg, "description", None),
        element_count=res.get("element_count"),
        unexpected_count=res.get("unexpected_count"),
        observed_value=_jsonable(res.get("observed_value")),
        samples=_jsonable(rows[:MAX_SAMPLES]),
        failing_ids=ids,
        error=error,
    )


def run_suite(
    suite: TableSuite, df: pd.DataFrame, *, dataset: str | None = None
) -> ValidationReport:
    """Validate ``df`` against ``suite`` with GX and return a typed report."""
    data = suite.derive(df) if suite.derive is not None else df
    data = data.reset_index(drop=True)
    rt = _GX.get()
    expectations = list(suite.build(rt.expectations))
    index_cols = [c for c in suite.index_columns if c in data.columns]
    id_column = (
        "episode_id" if "episode_id" in index_cols else (index_cols[0] if index_cols else None)
    )
    result_format: dict[str, Any] = {
        # COMPLETE lists every failing row's index columns, so no failing episode is missed
        # (a sample alone could hide one); the report keeps only MAX_SAMPLES rows.
        "result_format": "COMPLETE" if index_cols else "SUMMARY",
        "partial_unexpected_count": MAX_SAMPLES,
    }
    if index_cols:
        result_format["unexpected_index_column_names"] = index_cols
    with _GX._lock:  # the context and batch definition are shared; GX is not thread-safe
        out, result_id = rt.run_checkpoint(
            suite.table, suite.name, expectations, data, result_format
        )
    results = [_convert(er, id_column) for er in out.results]
    # Stable order: failures first, then by expectation and field.
    results.sort(key=lambda r: (r.success, r.expectation, r.column or ""))
    if dataset is None and "dataset" in data.columns and len(data):
        vals = data["dataset"].dropna().unique()
        dataset = str(vals[0]) if len(vals) == 1 else None
    return ValidationReport(
        suite=suite.name,
        table=suite.table,
        success=all(r.success for r in results),
        row_count=len(data),
        results=results,
        dataset=dataset,
        gx_result_id=result_id,
    )


def validate_table(name: str, df: pd.DataFrame, *, dataset: str | None = None) -> ValidationReport:
    """Validate table ``name`` (a registered suite) on ``df``; never raises on failure."""
    return run_suite(get_suite(name), df, dataset=dataset)


def assert_valid(name: str, df: pd.DataFrame, *, dataset: str | None = None) -> pd.DataFrame:
    """Validate ``df`` and return it unchanged, or raise :class:`TableValidationError`.

    Call this at every hand-off: a table that fails its suite is never passed downstream.
    """
    report = validate_table(name, df, dataset=dataset)
    if not report.success:
        raise TableValidationError(report)
    return df


def failing_rows(report: ValidationReport) -> Iterable[tuple[ExpectationResult, dict[str, Any]]]:
    """Every (failed expectation, sample row) pair of a report, for printing."""
    for r in report.failures:
        for row in r.samples:
            yield r, row


def write_data_docs(reports: Iterable[ValidationReport], folder: str | Path) -> Path | None:
    """Render the GX Data Docs (HTML) of ``reports`` into ``folder``; return its index.html.

    Uses a local Data Docs site whose store is ``folder`` and ``context.build_data_docs``
    restricted to these reports' validation results. Reports whose result is no longer
    kept (older than the last :data:`KEEP_RESULTS` validations) are left out; returns
    None when none is left.
    """
    rt = _GX.get()
    root = Path(folder).resolve()
    with _GX._lock:
        keys = [rt.kept[r.gx_result_id] for r in reports if r.gx_result_id in rt.kept]
        if not keys:
            return None
        root.mkdir(parents=True, exist_ok=True)
        site = "flora_report"
        config = {
            "class_name": "SiteBuilder",
            "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
            "store_backend": {"class_name": "TupleFilesystemStoreBackend",
                              "base_directory": str(root)},
        }  # fmt: skip
        if site in rt.context.list_data_docs_sites():
            rt.context.update_data_docs_site(site, config)
        else:
            rt.context.add_data_docs_site(site, config)
        rt.context.build_data_docs(site_names=[site], resource_identifiers=keys)
    return root / "index.html"
