"""Promotion gates, ``champion`` / ``challenger`` aliases, rollback and an audit trail.

DESIGN §3.9. A registered version gets ``challenger`` on registration
(:func:`model_registry.register.register_model`). :func:`promote` moves ``champion`` to it
only when it passes the model's :class:`GatePolicy`:

- every gated held-out metric is at least as good as the current champion's, plus the
  gate's ``min_improvement`` (direction-aware: lower is better for MAE / L1);
- every gated metric clears its absolute ``floor`` (a ceiling when lower is better);
- the parse rate clears ``min_parse_rate``;
- the tables the evaluation produced passed their GX suites (``flora.suites`` tag);
- challenger and champion were evaluated on the same held-out set (equal
  ``flora.eval_set.sha256`` fingerprints, :func:`eval_set_tags`): metrics of different
  episodes do not compare, so a missing or different fingerprint refuses.

A refusal changes no alias and records the reasons. Evaluation results live on the version
as tags (``flora.eval.<metric>`` written by :func:`record_evaluation`, ``eval.<metric>`` by
``flora eval model`` / :func:`training.evaluate.tag_version`), so the registry alone
decides; the source run's ``eval.<metric>`` metrics are the fallback. Both writers go
through :func:`write_evaluation`: an evaluation replaces every earlier eval tag of the
version (metrics, intervals, run id, eval-set fingerprint), so the gates read exactly the
latest evaluation and nothing it did not produce.

Every decision is an audit tag on the version it concerns
(``flora.audit.<UTC time>.<event>`` → JSON). The new champion remembers the one it replaced
(``flora.previous_champion``), which is what :func:`rollback` restores.

Concurrency: promotions and rollbacks of one model hold an inter-process file lock under
``<FLORA_HOME>/registry-locks``, and gates are evaluated inside it against the champion of
that moment, so two concurrent promotions serialise and leave one consistent champion. With
a remote tracking server the lock only covers one machine: production serialises registry
tasks through the Airflow pool ``flora-registry`` (one slot), see docs/lifecycle.md.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import math
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from model_registry.register import CHALLENGER, MODEL_NAMES, RegistryError

CHAMPION = "champion"
EVAL_PREFIX = "flora.eval."
# `flora eval model` (training/evaluate.py tag_version) writes ``eval.<metric>`` tags,
# record_evaluation ``flora.eval.<metric>``; each write removes the other's, so a version
# holds one evaluation (a version tagged before that rule: ``flora.eval.`` wins).
EVAL_PREFIXES = ("eval.", EVAL_PREFIX)
EVAL_RUN_TAGS = ("eval.run_id", "flora.eval_run_id")
# What an evaluation scored: sha256 of its held-out episodes and data, episode/item counts.
EVAL_SET_PREFIX = "flora.eval_set."
EVAL_SET_TAG = EVAL_SET_PREFIX + "sha256"
SUITES_TAG = "flora.suites"  # "passed" | "failed"
PREVIOUS_TAG = "flora.previous_champion"
AUDIT_PREFIX = "flora.audit."
POLICY_NAME = "flora-policy"


def registered_name(model: str) -> str:
    """``segmenter`` → ``flora-segmenter`` (a full registered name passes through)."""
    if model in MODEL_NAMES:
        return MODEL_NAMES[model]
    if model == "policy":
        return POLICY_NAME
    if model in (*MODEL_NAMES.values(), POLICY_NAME):
        return model
    raise RegistryError(
        f"unknown model {model!r}; expected one of {[*MODEL_NAMES, 'policy']} "
        "or their registered names"
    )


@dataclass(frozen=True)
class MetricGate:
    """One held-out metric a challenger must hold against the champion and a floor."""

    name: str
    higher_is_better: bool = True
    min_improvement: float = 0.0  # over the champion, in the metric's good direction
    floor: float | None = None  # absolute bound (a ceiling when lower is better)


@dataclass(frozen=True)
class GatePolicy:
    """Everything a challenger must pass to become ``champion``."""

    gates: tuple[MetricGate, ...]
    min_parse_rate: float | None = 0.95
    require_suites: bool = True
    # challenger and champion scored on the same held-out set (equal fingerprints)
    same_eval_set: bool = True


# Defaults per model, on the keys `flora eval model` reports (docs/training.md); the
# captioner's r_cap is over all reference events (a missing caption scores 0).
DEFAULT_POLICIES: dict[str, GatePolicy] = {
    "flora-segmenter": GatePolicy(
        (MetricGate("r_seg", floor=0.2), MetricGate("f1_at_0.5", floor=0.1)),
    ),
    "flora-captioner": GatePolicy((MetricGate("r_cap", floor=0.2),)),
    "flora-rewarder": GatePolicy(
        (
            MetricGate("outcome.mae", higher_is_better=False, floor=1.5),
            MetricGate("dense.accuracy", floor=0.5),
            MetricGate("rubric.l1", higher_is_better=False, floor=0.6),
        )
    ),
    POLICY_NAME: GatePolicy(
        (MetricGate("postfix_mse", higher_is_better=False),),
        min_parse_rate=None,
        require_suites=False,
    ),
}


@dataclass
class GateDecision:
    """Outcome of the gates for one challenger (``reasons`` empty when it passed)."""

    model: str
    version: str
    champion: str | None
    passed: bool
    reasons: list[str] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    champion_metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class PromotionResult:
    """What :func:`promote` did."""

    decision: GateDecision
    promoted: bool
    champion: str | None  # the champion after the call
    previous: str | None  # the champion before the call


# --------------------------------------------------------------------------- plumbing


def _client():
    from mlflow import MlflowClient

    from flora.tracking import configure

    configure()
    return MlflowClient()


def _now() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")


def _actor(actor: str | None) -> str:
    if actor:
        return actor
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no user database in some containers
        return "unknown"


def _alias_version(client: Any, name: str, alias: str) -> str | None:
    from mlflow.exceptions import MlflowException

    try:
        return str(client.get_model_version_by_alias(name, alias).version)
    except MlflowException:
        return None


def _resolve(client: Any, name: str, ref: str | int | None) -> str:
    """A version number from a version or an alias (default ``challenger``)."""
    from mlflow.exceptions import MlflowException

    ref = CHALLENGER if ref is None else str(ref)
    if ref.isdigit():
        try:
            client.get_model_version(name, ref)
        except MlflowException as e:
            raise RegistryError(f"{name} has no version {ref}") from e
        return ref
    v = _alias_version(client, name, ref)
    if v is None:
        raise RegistryError(f"{name} has no version with alias {ref!r}")
    return v


def _audit(client: Any, name: str, version: str, event: str, payload: Mapping[str, Any]) -> None:
    client.set_model_version_tag(
        name, version, f"{AUDIT_PREFIX}{_now()}.{event}", json.dumps(payload, sort_keys=True)
    )


@contextmanager
def _locked(name: str) -> Iterator[None]:
    from filelock import FileLock

    from flora.settings import get_settings

    d = get_settings().home / "registry-locks"
    d.mkdir(parents=True, exist_ok=True)
    with FileLock(str(d / f"{name}.lock"), timeout=600):
        yield


# --------------------------------------------------------------------------- evaluation


def eval_set_tags(episodes: Iterable[str], data: Iterable[str] = ()) -> dict[str, str]:
    """The ``flora.eval_set.*`` tags of an evaluation: what it scored, for the gates.

    ``episodes``: the held-out episode ids scored (qualified by dataset when a set mixes
    datasets); ``data``: what identifies the scored data (a digest per item of its id and
    reference, a dataset md5 …). ``sha256`` covers both, sorted; ``episodes`` and ``items``
    count them.
    """
    eps = sorted({str(e) for e in episodes})
    items = sorted(str(d) for d in data)
    blob = json.dumps({"episodes": eps, "data": items}, separators=(",", ":"))
    return {
        EVAL_SET_TAG: hashlib.sha256(blob.encode()).hexdigest(),
        f"{EVAL_SET_PREFIX}episodes": str(len(eps)),
        f"{EVAL_SET_PREFIX}items": str(len(items)),
    }


def _is_eval_tag(key: str) -> bool:
    return key.startswith((*EVAL_PREFIXES, EVAL_SET_PREFIX)) or key in EVAL_RUN_TAGS


def write_evaluation(
    model: str,
    version: str | int,
    tags: Mapping[str, str],
    eval_set: Mapping[str, str] | None = None,
) -> None:
    """Replace a version's evaluation with ``tags`` (``eval.*`` / ``flora.eval.*`` metrics
    and run id) and ``eval_set`` (:func:`eval_set_tags`).

    Every earlier eval tag of the version goes first — metrics the new evaluation did not
    produce included — and the fingerprint is written last, so a gate reading in between
    refuses (no fingerprint) rather than mixing two evaluations. Held under the model's
    promotion lock.
    """
    bad = [k for k in tags if not _is_eval_tag(k) or k.startswith(EVAL_SET_PREFIX)]
    bad += [k for k in eval_set or {} if not k.startswith(EVAL_SET_PREFIX)]
    if bad:
        raise ValueError(f"not evaluation tags: {bad}")
    client = _client()
    name = registered_name(model)
    v = _resolve(client, name, version)
    with _locked(name):
        for k in list(client.get_model_version(name, v).tags):
            if _is_eval_tag(k):
                client.delete_model_version_tag(name, v, k)
        for k, val in tags.items():
            client.set_model_version_tag(name, v, k, str(val))
        for k, val in (eval_set or {}).items():
            client.set_model_version_tag(name, v, k, str(val))


def record_evaluation(
    model: str,
    version: str | int,
    metrics: Mapping[str, float],
    *,
    suites_passed: bool | None = None,
    eval_run_id: str | None = None,
    eval_set: Mapping[str, str] | None = None,
) -> None:
    """Store held-out metrics (and the suites' verdict) on a version for the gates.

    Non-empty ``metrics`` are a new evaluation: they replace every earlier eval tag
    (:func:`write_evaluation`), ``eval_set`` (:func:`eval_set_tags`) saying what was
    scored. Empty ``metrics`` record only the suites' verdict (and ``eval_run_id``) of the
    evaluation already on the version.
    """
    client = _client()
    name = registered_name(model)
    v = _resolve(client, name, version)
    if metrics:
        tags = {f"{EVAL_PREFIX}{k}": repr(float(val)) for k, val in metrics.items()}
        if eval_run_id:
            tags["flora.eval_run_id"] = eval_run_id
        write_evaluation(name, v, tags, eval_set)
    elif eval_set:
        raise ValueError("eval_set describes an evaluation: record it with its metrics")
    elif eval_run_id:
        client.set_model_version_tag(name, v, "flora.eval_run_id", eval_run_id)
    if suites_passed is not None:
        client.set_model_version_tag(name, v, SUITES_TAG, "passed" if suites_passed else "failed")


def version_metrics(model: str, version: str | int) -> dict[str, float]:
    """Held-out metrics of a version: its ``flora.eval.*`` tags, else its run's ``eval.*``."""
    client = _client()
    name = registered_name(model)
    mv = client.get_model_version(name, str(version))
    out = _tag_metrics(mv.tags)
    if not out and mv.run_id:
        run = client.get_run(mv.run_id)
        out = {k[5:]: float(v) for k, v in run.data.metrics.items() if k.startswith("eval.")}
    return out


def _tag_metrics(tags: Mapping[str, str]) -> dict[str, float]:
    """``eval.*`` / ``flora.eval.*`` tags as metrics (unparseable values are skipped)."""
    out: dict[str, float] = {}
    for prefix in EVAL_PREFIXES:  # later prefixes win (only on versions tagged before
        for k, v in tags.items():  # write_evaluation, which keeps one evaluation)
            if k.startswith(prefix) and k not in EVAL_RUN_TAGS:
                try:
                    out[k[len(prefix) :]] = float(v)
                except ValueError:
                    continue
    return out


def _better(a: float, b: float, gate: MetricGate) -> bool:
    """``a`` clears ``b`` plus the required improvement, in the gate's direction."""
    if gate.higher_is_better:
        return a >= b + gate.min_improvement
    return a <= b - gate.min_improvement


def _eval_set_text(tags: Mapping[str, str]) -> str:
    fp = tags.get(EVAL_SET_TAG)
    if not fp:
        return "no eval-set fingerprint recorded"
    eps = tags.get(f"{EVAL_SET_PREFIX}episodes", "?")
    return f"eval set {fp[:12]}, {eps} episodes, eval run {tags.get('eval.run_id') or '?'}"


def _unpaired_reason(name: str, v: str, mine: Mapping[str, str], champ: str,
                     theirs: Mapping[str, str]) -> str:  # fmt: skip
    """Why metrics of two evaluations on different held-out sets do not compare, and how
    to get a comparable pair."""
    model = name.removeprefix("flora-")
    head = (
        f"eval set: v{v} ({_eval_set_text(mine)}) and champion v{champ} "
        f"({_eval_set_text(theirs)}) were not scored on the same held-out episodes"
    )
    if name == POLICY_NAME:
        # `flora eval model` scores the text models only; a policy is re-scored from its
        # logged checkpoint by flora.policy.registry.evaluate_versions.
        dataset = theirs.get("flora.dataset") or mine.get("flora.dataset") or "DATASET"
        return (
            f"{head} (or measured other things: horizon, delays, denoising steps, dataset "
            f"content, captions, metric version); re-evaluate both on the episodes neither "
            f'trained on: `python -c "from flora.policy.registry import evaluate_versions; '
            f'evaluate_versions([{v!r}, {champ!r}], {dataset!r})"` (add episodes=[...] to '
            "choose them, events= when the policies condition on captions; versions of "
            "different horizons never compare)"
        )
    return (
        f"{head}; re-evaluate both on the same episodes: `flora eval model --model {model} "
        f"--version {v} --set SET [--episodes N] --also-unseen-by {champ}` and the same "
        f"with `--version {champ} ... --also-unseen-by {v}` (one --set, the same --episodes)"
    )


def evaluate_gates(
    model: str, version: str | int | None = None, policy: GatePolicy | None = None
) -> GateDecision:
    """Check a version (default: the ``challenger``) against the current champion.

    The champion comparison needs both versions evaluated on the same held-out set
    (``policy.same_eval_set``; moot without metric gates): otherwise the challenger is
    refused, with the command that re-evaluates both on the same episodes.
    """
    client = _client()
    name = registered_name(model)
    v = _resolve(client, name, version)
    policy = policy or DEFAULT_POLICIES[name]
    champ = _alias_version(client, name, CHAMPION)
    mine = version_metrics(name, v)
    vs_champion = bool(champ and champ != v)
    theirs = version_metrics(name, champ) if vs_champion else {}
    reasons: list[str] = []
    if vs_champion and policy.same_eval_set and policy.gates:
        my_tags = client.get_model_version(name, v).tags
        their_tags = client.get_model_version(name, champ).tags
        fp = my_tags.get(EVAL_SET_TAG)
        if not fp or fp != their_tags.get(EVAL_SET_TAG):
            reasons.append(_unpaired_reason(name, v, my_tags, str(champ), their_tags))
            vs_champion = False  # figures of different episodes are not compared
    for g in policy.gates:
        val = mine.get(g.name)
        if val is None or not math.isfinite(val):
            reasons.append(f"{g.name}: no held-out value recorded for version {v}")
            continue
        if g.floor is not None:
            ok = val >= g.floor if g.higher_is_better else val <= g.floor
            if not ok:
                word = "below floor" if g.higher_is_better else "above ceiling"
                reasons.append(f"{g.name}={val:.4g} {word} {g.floor:.4g}")
        ref = theirs.get(g.name)
        if vs_champion and ref is not None and not _better(val, ref, g):
            need = "higher" if g.higher_is_better else "lower"
            reasons.append(
                f"{g.name}={val:.4g} vs champion v{champ} {ref:.4g} "
                f"(needs {need} by >= {g.min_improvement:g})"
            )
    if policy.min_parse_rate is not None:
        pr = mine.get("parse_rate")
        if pr is None or not pr >= policy.min_parse_rate:
            reasons.append(f"parse_rate={pr} below {policy.min_parse_rate}")
    if policy.require_suites:
        mv = client.get_model_version(name, v)
        verdict = mv.tags.get(SUITES_TAG)
        if verdict != "passed":
            reasons.append(f"table suites: {verdict or 'not recorded'}")
    return GateDecision(name, v, champ, not reasons, reasons, mine, theirs)


# --------------------------------------------------------------------------- lifecycle


def promote(
    model: str,
    version: str | int | None = None,
    *,
    policy: GatePolicy | None = None,
    actor: str | None = None,
    force: bool = False,
) -> PromotionResult:
    """Make ``version`` (default: ``challenger``) the champion if it passes the gates.

    A refused promotion leaves every alias as it was and records the reasons on the
    version. ``force`` promotes despite failed gates (recorded as forced, with reasons).
    """
    name = registered_name(model)
    with _locked(name):
        client = _client()
        decision = evaluate_gates(name, version, policy)
        v, prev = decision.version, decision.champion
        who = _actor(actor)
        if prev == v:
            return PromotionResult(decision, False, prev, prev)
        if not decision.passed and not force:
            _audit(client, name, v, "refused", {"by": who, "champion": prev,
                                                "reasons": decision.reasons})  # fmt: skip
            return PromotionResult(decision, False, prev, prev)
        client.set_model_version_tag(name, v, PREVIOUS_TAG, prev or "")
        client.set_registered_model_alias(name, CHAMPION, v)
        event = "forced" if not decision.passed else "promoted"
        _audit(client, name, v, event, {"by": who, "previous": prev, "reasons": decision.reasons,
                                        "metrics": decision.metrics})  # fmt: skip
        if _alias_version(client, name, CHAMPION) != v:  # another writer outside the lock
            raise RegistryError(f"{name}: champion changed during promotion of v{v}")
        return PromotionResult(decision, True, v, prev)


def rollback(model: str, *, actor: str | None = None) -> tuple[str, str]:
    """Move ``champion`` back to the champion it replaced; returns (from, to)."""
    name = registered_name(model)
    with _locked(name):
        client = _client()
        cur = _alias_version(client, name, CHAMPION)
        if cur is None:
            raise RegistryError(f"{name} has no champion to roll back")
        prev = client.get_model_version(name, cur).tags.get(PREVIOUS_TAG) or ""
        if not prev:
            raise RegistryError(f"{name} v{cur} has no previous champion to roll back to")
        client.set_registered_model_alias(name, CHAMPION, prev)
        who = _actor(actor)
        _audit(client, name, cur, "rolled_back", {"by": who, "to": prev})
        _audit(client, name, prev, "restored", {"by": who, "from": cur})
        return cur, prev


def audit_trail(model: str, version: str | int) -> list[dict[str, Any]]:
    """A version's audit events, oldest first."""
    client = _client()
    name = registered_name(model)
    mv = client.get_model_version(name, str(version))
    out = []
    for k in sorted(t for t in mv.tags if t.startswith(AUDIT_PREFIX)):
        stamp, _, event = k[len(AUDIT_PREFIX) :].rpartition(".")
        out.append({"time": stamp, "event": event, **json.loads(mv.tags[k])})
    return out


def list_versions(model: str) -> list[dict[str, Any]]:
    """Every version of a model with its aliases, run, lineage and gated metrics."""
    client = _client()
    name = registered_name(model)
    rm = client.get_registered_model(name)
    aliases: dict[str, list[str]] = {}
    for a, ver in (rm.aliases or {}).items():
        aliases.setdefault(str(ver), []).append(a)
    rows = []
    for mv in client.search_model_versions(f"name='{name}'"):
        rows.append(
            {
                "name": name,
                "version": str(mv.version),
                "aliases": sorted(aliases.get(str(mv.version), [])),
                "run_id": mv.run_id,
                "created": datetime.fromtimestamp(mv.creation_timestamp / 1000, UTC).isoformat(),
                "source": mv.source,
                "metrics": {k: v for k, v in _tag_metrics(mv.tags).items() if ".ci_" not in k},
                "lineage": {
                    k: v
                    for k, v in mv.tags.items()
                    if k.startswith("flora.") and not k.startswith((EVAL_PREFIX, AUDIT_PREFIX))
                },
            }
        )
    return sorted(rows, key=lambda r: int(r["version"]))


def decision_dict(decision: GateDecision) -> dict[str, Any]:
    """JSON-ready form of a decision (CLI ``--json``)."""
    return asdict(decision)


__all__ = [
    "CHAMPION",
    "DEFAULT_POLICIES",
    "GateDecision",
    "GatePolicy",
    "MetricGate",
    "PromotionResult",
    "audit_trail",
    "decision_dict",
    "eval_set_tags",
    "evaluate_gates",
    "list_versions",
    "promote",
    "record_evaluation",
    "registered_name",
    "rollback",
    "version_metrics",
    "write_evaluation",
]
