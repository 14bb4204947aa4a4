"""End to end: the tiny VLM through ``segment_dataset``, in process and over ``flora serve``.

Acceptance of the segmentation issue: the tiny model runs through the in-process
``TransformersBackend`` and through a real ``flora serve`` subprocess (``OpenAIBackend``
over HTTP), and ``segment_dataset`` writes a validated ``events`` table. The content may be
poor; the mechanics are what is checked:

* every planned window (primary and shifted pass) gets a request;
* a window whose output the strict parser rejects is re-sent, at most ``max_attempts``
  times, and then recorded as a failure naming its pass, window index and span, with the
  typed reason of the last rejection;
* the table holds exactly what stitching + refinement (the public ``flora.segment`` API)
  make of the accepted outputs — nothing for an episode whose windows all failed;
* the table passes the ``events`` GX suite; a rerun resumes without duplicates.

Two checkpoints, built once per module from the shared random tiny Qwen3-VL:

* the random model itself: it emits garbage, so every window is rejected, retried and
  recorded, and the (empty) table still validates;
* the same model briefly fine-tuned (a couple of seconds on CPU,
  :func:`tests.tiny_finetune.finetune_tiny`)
  to answer every segment prompt with the one-line segment list ``0 97 1 0`` ("an action
  under way at the window start, ending at tick 97"). The grammar accepts that for windows
  of at least 97 ticks and rejects it (``tick_range``) for the two 80-tick edge windows, so
  one deterministic model exercises acceptance and typed failure in the same run, and the
  HTTP run must reproduce the in-process table and failures exactly (greedy decoding).

A transparent recorder wraps each real backend to see every request and response; it never
changes or invents an answer.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pytest

from flora.backends.base import VLMRequest, VLMResponse
from flora.data.dataset import open_dataset
from flora.parsing import RETRY_TEMPERATURE, Rejection
from flora.segment import Window, parse_segments, plan_windows, refine, stitch
from flora.segment.grammar import REASONS
from flora.segment.run import SegmentRun, segment_dataset
from flora.tables import TableStore
from flora.validation.core import validate_table
from tests.backends.backend_helpers import Server, start_server, stop_server
from tests.tiny_finetune import Recording as _Recording
from tests.tiny_finetune import finetune_stats, finetune_tiny, single_torch_thread

TARGET = "0 97 1 0"  # what the fine-tuned model answers for every window
MAX_NEW_TOKENS = 24  # bounds the random model's garbage; the target needs 9 tokens
RANDOM_ATTEMPTS = 2
ATTEMPTS = 3
# Columns that name who produced a row, not what it says.
PROVENANCE = ["model", "model_version", "run_id"]


# --------------------------------------------------------------------------- helpers


class Recording(_Recording):
    """Recording that can also group its calls by window."""

    def by_window(self) -> dict[tuple[str, str, int], list[tuple[VLMRequest, VLMResponse]]]:
        """Calls grouped by (episode_id, pass, window index), in call order."""
        out: dict[tuple[str, str, int], list[tuple[VLMRequest, VLMResponse]]] = defaultdict(list)
        for req, resp in self.calls:
            eid, pass_name, k, _span = req.request_id.rsplit(":", 3)
            out[(eid, pass_name, int(k))].append((req, resp))
        return out


@dataclass
class Plan:
    """The windows ``segment_dataset`` must ask about, per episode."""

    durations: dict[str, int]
    windows: dict[tuple[str, str, int], Window] = field(default_factory=dict)

    def of(self, eid: str, pass_name: str) -> list[Window]:
        keys = sorted(k for k in self.windows if k[0] == eid and k[1] == pass_name)
        return [self.windows[k] for k in keys]


@dataclass
class Outcome:
    """What happened to one window: its parsed output, or the last rejection."""

    attempts: int
    value: list | None
    rejection: Rejection | None


def _plan(dataset_root: Path) -> Plan:
    ds = open_dataset(dataset_root)
    plan = Plan({})
    for i in ds.episode_indices():
        ep = ds.episode(i)
        T = int(ep.duration_us)
        plan.durations[ep.episode_id] = T
        primary = plan_windows(T)
        # An episode of one core has no interior core edge: no shifted pass.
        shifted = plan_windows(T, shift=True) if len(primary) > 1 else []
        for name, wins in (("primary", primary), ("shifted", shifted)):
            for k, w in enumerate(wins):
                plan.windows[(ep.episode_id, name, k)] = w
    return plan


def _item(pass_name: str, k: int, w: Window) -> str:
    return f"{pass_name} window {k} [{w.start_us}, {w.end_us}) µs"


def check_mechanics(
    run: SegmentRun, rec: Recording, plan: Plan, max_attempts: int
) -> dict[tuple[str, str, int], Outcome]:
    """Assert the segment step's mechanics on a finished run; return each window's outcome."""
    calls = rec.by_window()
    # Every planned window was asked about, with its own span and its 4 Hz frames.
    assert set(calls) == set(plan.windows)
    outcomes: dict[tuple[str, str, int], Outcome] = {}
    for key, items in calls.items():
        w = plan.windows[key]
        for req, _ in items:
            assert req.request_id.endswith(f":{w.start_us}-{w.end_us}")
            assert len(req.images) == len(w.frame_times_us())
            assert req.max_new_tokens == MAX_NEW_TOKENS
        # Greedy first, then seeded samples (a greedy retry would repeat the rejection).
        assert [req.temperature for req, _ in items] == [0.0] + [RETRY_TEMPERATURE] * (
            len(items) - 1
        )
        parsed = [parse_segments(resp.text, w.n_ticks) for _, resp in items]
        assert all(resp.ok for _, resp in items), [resp.error for _, resp in items]
        # Re-sent only while rejected, never more than max_attempts times.
        assert 1 <= len(items) <= max_attempts
        assert all(isinstance(p, Rejection) for p in parsed[:-1])
        last = parsed[-1]
        if isinstance(last, Rejection):
            assert len(items) == max_attempts
            outcomes[key] = Outcome(len(items), None, last)
        else:
            outcomes[key] = Outcome(len(items), last, None)

    # Failures: exactly the rejected windows, each with pass, index, span and typed reason.
    got = {(f.episode_id, f.item): f.reason for f in run.failures}
    want = {}
    for (eid, pass_name, k), o in outcomes.items():
        if o.rejection is not None:
            want[(eid, _item(pass_name, k, plan.windows[(eid, pass_name, k)]))] = (
                f"{o.rejection.kind}: {o.rejection.reason} (after {max_attempts} tries)"
            )
            assert o.rejection.kind == "parse"
            assert o.rejection.reason.split(":", 1)[0] in REASONS
    assert got == want
    assert all(f.table == "events" for f in run.failures)

    # The table is what stitch + refine make of the accepted outputs, nothing else.
    assert run.report is not None and run.report.success
    assert validate_table("events", run.events).success
    on_disk = TableStore(run.table_dir.parent).read("events")
    assert len(on_disk) == len(run.events)
    if len(on_disk):
        pd.testing.assert_frame_equal(_content(on_disk), _content(run.events))
    for eid, T in plan.durations.items():
        rows = run.events[run.events["episode_id"] == eid].sort_values("event_index")
        ok = {
            name: [
                (w, outcomes[(eid, name, k)].value)
                for k, w in enumerate(plan.of(eid, name))
                if outcomes[(eid, name, k)].value is not None
            ]
            for name in ("primary", "shifted")
        }
        events = stitch([w for w, _ in ok["primary"]], [v for _, v in ok["primary"]], T)
        events = refine(
            events,
            [w for w, _ in ok["shifted"]],
            [v for _, v in ok["shifted"]],
            T,
            primary_windows=plan.of(eid, "primary"),
        )
        assert list(zip(rows.start_us, rows.end_us, strict=True)) == [
            (e.start_us, e.end_us) for e in events
        ], eid
        if not ok["primary"]:
            assert rows.empty, f"{eid}: events fabricated although every window failed"
        # Provenance names only primary windows whose output was accepted.
        accepted = {w.index for w, _ in ok["primary"]}
        for cell in rows["windows"]:
            assert {int(x) for x in cell.split(",")} <= accepted
        assert (rows["duration_us"] == T).all() and (rows["run_id"] == run.run_id).all()
        assert (rows["model"] == rec.name).all()
        assert (rows["model_version"] == rec.model_version).all()
    json.dumps(run.to_dict())  # the summary an Airflow task / KFP component hands on
    return outcomes


def _content(df: pd.DataFrame) -> pd.DataFrame:
    cols = [c for c in df.columns if c not in PROVENANCE]
    return df[cols].sort_values(["episode_id", "event_index"]).reset_index(drop=True)


# --------------------------------------------------------------------------- fixtures


@dataclass
class Done:
    run: SegmentRun
    rec: Recording
    out: Path
    seconds: float


def _segment(dataset: Path, out: Path, backend, run_id: str, attempts: int) -> Done:
    rec = Recording(backend)
    t0 = time.perf_counter()
    run = segment_dataset(
        dataset,
        out,
        rec,
        run_id,
        max_attempts=attempts,
        max_new_tokens=MAX_NEW_TOKENS,
        progress=False,
    )
    return Done(run, rec, out, time.perf_counter() - t0)


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    with single_torch_thread():
        yield


@pytest.fixture(scope="module")
def plan(tiny_dataset) -> Plan:
    return _plan(tiny_dataset)


@pytest.fixture(scope="module")
def random_done(tiny_dataset, tiny_vlm_dir, tmp_path_factory) -> Done:
    """The random tiny model in process over the whole toy dataset."""
    from flora.backends.transformers_backend import TransformersBackend

    # Stamped images, as over HTTP (video input would need torchvision's video processor).
    backend = TransformersBackend(tiny_vlm_dir("qwen3_vl"), device="cpu", vision_input="images")
    out = tmp_path_factory.mktemp("e2e_random")
    return _segment(tiny_dataset, out, backend, "random-1", RANDOM_ATTEMPTS)


@pytest.fixture(scope="module")
def tuned_dir(tiny_vlm_dir, random_done, tmp_path_factory) -> Path:
    """The random model fine-tuned on the pipeline's own segment prompts to answer TARGET."""
    first: dict[str, VLMRequest] = {}
    for req, _ in random_done.rec.calls:
        first.setdefault(req.request_id, req)
    out = tmp_path_factory.mktemp("e2e_tuned") / "model"
    pairs = [(req, TARGET) for req in first.values()]
    out = finetune_tiny(tiny_vlm_dir("qwen3_vl"), pairs, out)
    stats = finetune_stats(out)
    assert stats["loss"] < 5e-3, stats
    return out


@pytest.fixture(scope="module")
def tuned_backend(tuned_dir):
    from flora.backends.transformers_backend import TransformersBackend

    return TransformersBackend(tuned_dir, device="cpu", vision_input="images")


@pytest.fixture(scope="module")
def tuned_done(tiny_dataset, tuned_backend, tmp_path_factory) -> Done:
    out = tmp_path_factory.mktemp("e2e_tuned_inproc")
    return _segment(tiny_dataset, out, tuned_backend, "tuned-1", ATTEMPTS)


def _serve(model: Path, log: Path) -> Server:
    """``flora serve --model <model>`` as a real subprocess on a free loopback port."""
    prev = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"  # the server's torch: see _one_torch_thread
    try:
        return start_server(model, log)
    finally:
        if prev is None:
            os.environ.pop("OMP_NUM_THREADS")
        else:
            os.environ["OMP_NUM_THREADS"] = prev


@pytest.fixture(scope="module")
def served_random(tiny_vlm_dir, tmp_path_factory) -> Iterator[Server]:
    """``flora serve`` over the shared random tiny checkpoint."""
    server = _serve(tiny_vlm_dir("qwen3_vl"), tmp_path_factory.mktemp("e2e_serve") / "log")
    yield server
    stop_server(server)


@pytest.fixture(scope="module")
def served_tuned(tuned_dir, tmp_path_factory) -> Iterator[Server]:
    """``flora serve`` over the fine-tuned checkpoint."""
    server = _serve(tuned_dir, tmp_path_factory.mktemp("e2e_serve") / "log")
    yield server
    stop_server(server)


# --------------------------------------------------------------------------- tests


def test_random_tiny_model_in_process(random_done, plan) -> None:
    """Garbage from the random model: every window rejected, retried, recorded; no events."""
    outcomes = check_mechanics(random_done.run, random_done.rec, plan, RANDOM_ATTEMPTS)
    assert all(o.rejection is not None for o in outcomes.values())
    assert len(random_done.run.failures) == len(plan.windows) == 11
    assert random_done.run.events.empty
    assert list(random_done.run.events.columns)[:5] == [
        "episode_id",
        "dataset",
        "model",
        "model_version",
        "run_id",
    ]
    assert sorted(random_done.run.processed) == sorted(plan.durations)


def test_random_tiny_model_over_http(
    served_random, random_done, tiny_dataset, plan, tmp_path
) -> None:
    """The same garbage over ``flora serve``: rejected, retried, recorded; no events."""
    from flora.backends.openai_backend import OpenAIBackend

    with OpenAIBackend(served_random.url, max_concurrency=4, timeout_s=120) as client:
        done = _segment(tiny_dataset, tmp_path / "tables", client, "random-http", RANDOM_ATTEMPTS)
        outcomes = check_mechanics(done.run, done.rec, plan, RANDOM_ATTEMPTS)
        assert client.attempts == len(done.rec.calls) == RANDOM_ATTEMPTS * len(plan.windows)
    assert all(o.rejection is not None for o in outcomes.values())
    assert done.run.events.empty
    assert sorted((f.episode_id, f.item) for f in done.run.failures) == sorted(
        (f.episode_id, f.item) for f in random_done.run.failures
    )
    # The server's fingerprint of the weights is the in-process backend's model_version.
    assert done.rec.model_version == random_done.rec.model_version


def test_tuned_tiny_model_in_process(tuned_done, tuned_backend, plan) -> None:
    """The fine-tuned model's real output is parsed, stitched and written; short windows fail."""
    run, rec = tuned_done.run, tuned_done.rec
    assert [resp.text for _, resp in rec.calls] == [TARGET] * len(rec.calls)
    outcomes = check_mechanics(run, rec, plan, ATTEMPTS)
    # Windows shorter than 97 ticks (the 80-tick right-edge windows) reject the answer.
    for key, o in outcomes.items():
        short = plan.windows[key].n_ticks < 97
        assert (o.rejection is not None) == short, key
        if short:
            assert o.rejection.reason.startswith("tick_range:")
        else:
            assert o.attempts == 1
    eid = sorted(plan.durations)
    assert sorted(f.episode_id for f in run.failures) == [eid[1], eid[2]]
    # Each accepted window says "an action under way at the window start, ending 4.85 s in";
    # kept where it meets the core, stitched across windows, refined by the shifted pass.
    got = {
        e: list(zip(g.start_us, g.end_us, strict=True))
        for e, g in run.events.sort_values("event_index").groupby("episode_id")
    }
    assert got == {
        eid[0]: [(0, 4_850_000)],
        eid[1]: [(0, 4_850_000)],
        eid[2]: [(0, 4_850_000), (10_000_000, 14_850_000)],
    }
    assert set(run.events["model"]) == {"transformers"}
    assert set(run.events["model_version"]) == {tuned_backend.model_version}


def test_rerun_resumes_without_duplicates(
    tuned_done, tuned_backend, tiny_dataset, plan, tmp_path
) -> None:
    """A rerun skips finished episodes, retries those with failures, duplicates nothing."""
    out = tmp_path / "tables"
    shutil.copytree(tuned_done.out, out)
    again = _segment(tiny_dataset, out, tuned_backend, "tuned-2", ATTEMPTS)
    eid = sorted(plan.durations)
    assert again.run.skipped == [eid[0]] and again.run.processed == [eid[1], eid[2]]
    assert {key[0] for key in again.rec.by_window()} == {eid[1], eid[2]}
    df = again.run.events
    assert again.run.report is not None and again.run.report.success
    assert not df.duplicated(["episode_id", "event_index"]).any()
    pd.testing.assert_frame_equal(_content(df), _content(tuned_done.run.events))
    run_ids = df.groupby("episode_id")["run_id"].agg(set).to_dict()
    assert run_ids == {eid[0]: {"tuned-1"}, eid[1]: {"tuned-2"}, eid[2]: {"tuned-2"}}
    # The retried windows failed again: their failures are replaced, not accumulated.
    assert sorted((f.episode_id, f.item, f.reason) for f in again.run.failures) == sorted(
        (f.episode_id, f.item, f.reason) for f in tuned_done.run.failures
    )


def test_http_matches_in_process(served_tuned, tuned_done, tiny_dataset, plan, tmp_path) -> None:
    """``flora serve`` + OpenAIBackend: same mechanics, same table, same failures."""
    from flora.backends.openai_backend import OpenAIBackend

    with OpenAIBackend(served_tuned.url, max_concurrency=4, timeout_s=120) as client:
        done = _segment(tiny_dataset, tmp_path / "tables", client, "http-1", ATTEMPTS)
        assert [resp.text for _, resp in done.rec.calls] == [TARGET] * len(done.rec.calls)
        check_mechanics(done.run, done.rec, plan, ATTEMPTS)
        # Every request went over the wire, once per attempt (no transport retries needed).
        assert client.attempts == len(done.rec.calls)
    assert served_tuned.health()["completions"] >= len(done.rec.calls)
    http, local = done.run.events, tuned_done.run.events
    assert len(http) > 0
    pd.testing.assert_frame_equal(_content(http), _content(local))
    assert set(http["model"]) == {"openai"} and set(http["run_id"]) == {"http-1"}
    # flora serve reports the weights' fingerprint, so even model_version agrees.
    assert set(http["model_version"]) == set(local["model_version"])
    assert sorted((f.episode_id, f.item, f.reason) for f in done.run.failures) == sorted(
        (f.episode_id, f.item, f.reason) for f in tuned_done.run.failures
    )
