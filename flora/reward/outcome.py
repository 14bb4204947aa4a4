"""Outcome reward (DESIGN §3.3, seed §4 eq. 19): a 1–5 score read as a distribution.

The rewarder answers ``score: K`` (grammar below). Beyond the argmax answer we read the
probability the model gives each of the five score tokens at the score position, renormalise
them over the five, and take ``E[s] = Σ k p_k`` and ``reward = (E[s] - 1) / 4`` in ``[0, 1]``.
Trajectories are ranked by the expectation, not the argmax: a half-finished task earns an
intermediate reward. The argmax is kept as its own column for reference.

Grammar (exactly one line, optional surrounding whitespace)::

    score: K          K in {1, 2, 3, 4, 5}
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from flora.backends.base import TokenLogprob, VLMResponse
from flora.parsing import Rejection

SCORES = (1, 2, 3, 4, 5)
N_SCORES = len(SCORES)
_GRAMMAR = re.compile(r"\A\s*score:[ \t]*([0-9]+)\s*\Z")


class ScoreProbsError(ValueError):
    """Score probabilities that cannot be turned into an expectation (typed refusal)."""


@dataclass(frozen=True)
class OutcomeScore:
    """One outcome result: the renormalised distribution and what follows from it.

    ``missing_scores`` lists score tokens the backend gave no probability for (they were
    absent from the returned top-k alternatives); the others were renormalised without them.
    """

    score_probs: tuple[float, float, float, float, float]
    expected_score: float
    reward: float
    argmax_score: int
    answer_score: int
    missing_scores: tuple[int, ...] = ()


# --------------------------------------------------------------------------- math


def normalise_score_probs(score_probs: Sequence[float] | np.ndarray) -> np.ndarray:
    """Validate and renormalise five non-negative probabilities (scores 1..5) to sum 1.

    Refuses (``ScoreProbsError``) a wrong length, NaN/inf, a negative entry or a zero sum:
    each of those means the distribution was read wrongly, and a reward must not be made
    up from it.
    """
    p = np.asarray(score_probs, dtype=np.float64)
    if p.ndim != 1 or p.shape[0] != N_SCORES:
        raise ScoreProbsError(
            f"score_probs must hold exactly {N_SCORES} probabilities (scores 1..5), "
            f"got shape {tuple(p.shape)}"
        )
    if not np.all(np.isfinite(p)):
        raise ScoreProbsError(f"score_probs contains NaN or inf: {p.tolist()}")
    if np.any(p < 0):
        raise ScoreProbsError(f"score_probs contains a negative probability: {p.tolist()}")
    total = float(p.sum())
    if total <= 0.0:
        raise ScoreProbsError(f"score_probs sum to {total}; cannot renormalise")
    return p / total


def expected_score(score_probs: Sequence[float] | np.ndarray) -> float:
    """``E[s] = Σ_k k p_k`` over the renormalised probabilities of scores 1..5."""
    p = normalise_score_probs(score_probs)
    return float(np.dot(p, np.asarray(SCORES, dtype=np.float64)))


def expected_reward(score_probs: Sequence[float] | np.ndarray) -> float:
    """Seed eq. (19): ``reward = (E[s] - 1) / 4`` in ``[0, 1]`` after renormalising.

    Raises ``ScoreProbsError`` on a wrong length, NaN, negative entries or a zero sum.
    """
    r = (expected_score(score_probs) - 1.0) / 4.0
    # Guard float noise at the ends of the range so the [0, 1] contract holds exactly.
    return min(1.0, max(0.0, r))


def outcome_from_probs(
    score_probs: Sequence[float] | np.ndarray,
    answer_score: int | None = None,
    missing_scores: Sequence[int] = (),
) -> OutcomeScore:
    """Build an ``OutcomeScore`` (renormalised probs, E[s], reward, argmax) from five probs."""
    p = normalise_score_probs(score_probs)
    argmax = int(SCORES[int(np.argmax(p))])  # ties: lowest score (np.argmax takes the first)
    return OutcomeScore(
        score_probs=tuple(float(x) for x in p),  # type: ignore[arg-type]
        expected_score=float(np.dot(p, np.asarray(SCORES, dtype=np.float64))),
        reward=expected_reward(p),
        argmax_score=argmax,
        answer_score=int(answer_score) if answer_score is not None else argmax,
        missing_scores=tuple(int(s) for s in missing_scores),
    )


def score_probs_from_logits(logits, score_token_ids: Sequence[int]) -> np.ndarray:
    """Softmax restricted to the five score tokens, from full-vocabulary logits.

    ``logits``: torch tensor or numpy array with the vocabulary on the last axis (one
    position ``(V,)`` or a batch ``(..., V)``); ``score_token_ids``: the token ids of
    "1".."5" in that order. Restricting the softmax to the score tokens *is* the
    renormalisation of eq. (19). Returns float64 numpy of shape ``(..., 5)``.
    """
    ids = [int(i) for i in score_token_ids]
    if len(ids) != N_SCORES:
        raise ScoreProbsError(f"need {N_SCORES} score token ids (for 1..5), got {len(ids)}")
    if len(set(ids)) != N_SCORES:
        raise ScoreProbsError(f"score token ids must be distinct, got {ids}")
    try:  # torch is optional here: accept tensors without importing torch eagerly
        import torch

        if isinstance(logits, torch.Tensor):
            logits = logits.detach().to(torch.float64).cpu().numpy()
    except ImportError:  # pragma: no cover - torch is part of the stack
        pass
    x = np.asarray(logits, dtype=np.float64)
    if x.ndim == 0:
        raise ScoreProbsError("logits must have a vocabulary axis")
    vocab = x.shape[-1]
    bad = [i for i in ids if not 0 <= i < vocab]
    if bad:
        raise ScoreProbsError(f"score token ids {bad} outside vocabulary of size {vocab}")
    sel = x[..., ids]
    if not np.all(np.isfinite(sel) | (sel == -np.inf)) or np.any(sel == np.inf):
        raise ScoreProbsError("score-token logits contain NaN or +inf")
    m = sel.max(axis=-1, keepdims=True)
    if np.any(~np.isfinite(m)):
        raise ScoreProbsError("all five score-token logits are -inf (probabilities sum to 0)")
    e = np.exp(sel - m)
    return e / e.sum(axis=-1, keepdims=True)


# --------------------------------------------------------------------------- grammar


def render_outcome(score: int) -> str:
    """SFT target for the outcome prompt: ``score: K``."""
    if isinstance(score, bool) or int(score) != score or int(score) not in SCORES:
        raise ValueError(f"outcome score must be an integer 1..5, got {score!r}")
    return f"score: {int(score)}"


def outcome_regex() -> str:
    """The grammar as a regular expression, for guided decoding: ``score: K``, K in 1..5."""
    return "score: [1-5]"


def parse_outcome(text: str) -> int | Rejection:
    """Strict parser for ``score: K``; returns K (1..5) or a typed ``Rejection``."""
    if not isinstance(text, str):
        return Rejection(f"outcome: expected text, got {type(text).__name__}", repr(text))
    m = _GRAMMAR.match(text)
    if m is None:
        return Rejection("outcome: expected exactly 'score: K' with K in 1..5", text)
    # One digit, as written: a leading zero ("05") is not K, and the score position would
    # then be the '0' token. Compare digits, not int(): int() refuses over 4,300 digits.
    digits = m.group(1)
    if len(digits) != 1 or int(digits) not in SCORES:
        shown = digits if len(digits) <= 12 else f"{digits[:6]}…({len(digits)} digits)"
        return Rejection(f"outcome: score {shown} outside 1..5", text)
    return int(digits)


def _score_of_token(tok: str) -> int | None:
    s = tok.strip()
    # Byte-level BPE tokenizers mark a leading space with "Ġ" (or SentencePiece with "▁").
    s = s.lstrip("Ġ▁").strip()
    if len(s) == 1 and s in "12345":
        return int(s)
    return None


def score_position(token_logprobs: Sequence[TokenLogprob], text: str | None = None) -> int | None:
    """Index of the generated token that carries the score digit, or None.

    The concatenated token strings are matched against the grammar and the token covering
    the digit's character offset is chosen. When the tokens do not concatenate to a
    grammatical string (e.g. special tokens were kept) we fall back to the last token that
    is a bare score digit, which is where ``score: K`` puts it.
    """
    joined = "".join(t.token for t in token_logprobs)
    m = _GRAMMAR.match(joined) if joined else None
    if m is not None:
        off = m.start(1)
        pos = 0
        for i, t in enumerate(token_logprobs):
            if pos <= off < pos + len(t.token):
                return i
            pos += len(t.token)
    for i in range(len(token_logprobs) - 1, -1, -1):
        if _score_of_token(token_logprobs[i].token) is not None:
            return i
    return None


def score_probs_from_top_logprobs(
    token_logprobs: Sequence[TokenLogprob], text: str | None = None
) -> tuple[np.ndarray, tuple[int, ...]] | Rejection:
    """Read the five score probabilities from OpenAI-style ``top_logprobs``.

    At the score position we gather the alternatives (plus the chosen token itself) whose
    text is a score digit 1..5 — variants such as ``"3"`` and ``" 3"`` are summed. Score
    tokens absent from the top-k are reported in the second element and the present ones
    are renormalised; when no score token is present at all the result is a ``Rejection``
    (nothing is filled in).
    """
    if not token_logprobs:
        return Rejection("outcome: response carries no logprobs", text or "", kind="validation")
    i = score_position(token_logprobs, text)
    if i is None:
        return Rejection(
            "outcome: no score token found among the generated tokens",
            text or "",
            kind="validation",
        )
    at = token_logprobs[i]
    mass = np.zeros(N_SCORES, dtype=np.float64)
    seen: set[str] = set()
    candidates = list(at.top.items())
    if at.token not in at.top:
        candidates.append((at.token, at.logprob))
    for tok, lp in candidates:
        k = _score_of_token(tok) if isinstance(tok, str) else None
        if k is None or tok in seen:
            continue
        seen.add(tok)
        if lp is None or (isinstance(lp, float) and math.isnan(lp)):
            continue
        # A log-probability is a number <= 0 (-inf allowed: probability 0). Anything else
        # means the server's answer is broken; exp() of it would overflow or lie.
        if isinstance(lp, bool) or not isinstance(lp, int | float) or lp > 1e-6:
            return Rejection(
                f"outcome: invalid log-probability {str(lp)[:40]!r} for score token {tok!r}",
                text or "",
                kind="validation",
            )
        mass[k - 1] += math.exp(min(float(lp), 0.0))
    missing = tuple(k for k in SCORES if mass[k - 1] <= 0.0)
    if len(missing) == N_SCORES:
        return Rejection(
            "outcome: none of the score tokens 1..5 appear in the top logprobs at the score "
            "position",
            text or "",
            kind="validation",
        )
    return mass / mass.sum(), missing


def parse_outcome_response(resp: VLMResponse) -> OutcomeScore | Rejection:
    """Parse a backend response: grammar first, then the score distribution from logprobs.

    A response without logprobs is rejected: a distribution must come from the model,
    never be synthesised from the argmax.
    """
    k = parse_outcome(resp.text)
    if isinstance(k, Rejection):
        return k
    read = score_probs_from_top_logprobs(resp.logprobs, resp.text)
    if isinstance(read, Rejection):
        return read
    probs, missing = read
    try:
        return outcome_from_probs(probs, answer_score=k, missing_scores=missing)
    except ScoreProbsError as e:  # e.g. every score token had probability 0
        return Rejection(f"outcome: {e}", resp.text, kind="validation")
