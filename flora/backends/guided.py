"""Guided decoding: the request fields, their validation, and regex-constrained generation.

Wire fields (what vLLM's OpenAI server takes, and ``flora serve`` too):

* ``structured_outputs: {"regex": R}`` or ``{"json": SCHEMA}`` — vLLM >= 0.12 (the form the
  Flora client sends);
* the older ``guided_regex`` / ``guided_json`` fields (vLLM < 0.12) and
  ``response_format: {"type": "json_schema", "json_schema": {"schema": SCHEMA}}``.

Every Flora grammar is line-based text, so the engine sends regexes (one function beside
each parser: ``segments_regex``, ``caption_regex``, ``outcome_regex``, ``dense_regex``,
``rubric_regex``); a JSON schema is accepted for other clients. The strict parser stays
the judge of every answer either way.

Enforcement in ``flora serve``:

* **regex** — a logits mask (:class:`RegexMask`; for a regex that is exactly a Flora
  grammar's with an exact guide — ``segments_regex(n)``, ``dense_regex()`` — that guide,
  :func:`exact_guide`) applied at every generated token: a
  token is allowed only if the text so far plus that token can still be extended to a full
  match (``regex`` module partial matching); end-of-sequence only once the text fully
  matches. So greedy and sampled answers both match the regex (unless ``max_tokens`` cuts
  them short). The vocabulary is walked in sorted order like a trie (:class:`VocabIndex`):
  a head nothing can follow rules out every token that starts with it in one check, so a
  position that takes digits or a newline costs a few thousand checks on a 150k-token
  vocabulary; a free-text position (a reason) still checks about every token.
* **JSON schema** — checked, not constrained: the answer is parsed and validated; a failing
  answer is re-sampled up to :data:`JSON_RESAMPLES` more times when the temperature is
  above 0 (greedy would repeat itself), and the last answer is returned as is.

The log-probabilities the backend records are taken before the mask (the raw model
distribution), like vLLM's ``raw_logprobs``.

A guide may also say where an answer it had to force should be decoded again
(``repair``, with the tokens whose raw log-probabilities it reads, ``watch``): the dense
guide forces the declared worst level at group 32 when no label above took it, and its
repair names the group where the model found that level least unlikely
(:meth:`flora.reward.dense.DenseGuide.repair`). The backend then continues the answer
from there under the same mask (:meth:`PrefixMask.continued`).
"""

from __future__ import annotations

import bisect
import functools
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flora.backends.processing import RequestError

JSON_RESAMPLES = 2
#: Prefixes whose allowed-token lists a mask keeps before starting afresh.
MASK_CACHE = 50_000
MAX_PATTERN_CHARS = 100_000
#: Object/array nesting a JSON schema may have (jsonschema recurses through it).
MAX_SCHEMA_DEPTH = 64


@dataclass(frozen=True)
class Guide:
    """One request's output constraint: a regex or a JSON schema (at most one)."""

    regex: str | None = None
    json_schema: dict[str, Any] | None = None

    def __bool__(self) -> bool:
        return self.regex is not None or self.json_schema is not None

    def wire(self) -> dict[str, Any]:
        """The ``structured_outputs`` body field (vLLM >= 0.12)."""
        if self.regex is not None:
            return {"regex": self.regex}
        if self.json_schema is not None:
            return {"json": self.json_schema}
        return {}


def compile_regex(pattern: str) -> Any:
    """Compile with the ``regex`` module (partial matching); ``RequestError`` if invalid."""
    import regex

    if not isinstance(pattern, str) or not pattern:
        raise RequestError("guided regex must be a non-empty string")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise RequestError(f"guided regex is over {MAX_PATTERN_CHARS} characters")
    try:
        return regex.compile(pattern)
    except (regex.error, RecursionError, OverflowError) as e:
        raise RequestError(f"guided regex does not compile: {e}") from e


def check_schema(schema: Any) -> dict[str, Any]:
    """A JSON schema, checked against its metaschema, with every ``$ref`` resolved within
    it (or to a known metaschema); ``RequestError`` if invalid, so a bad schema is a 400
    before any generation."""
    import jsonschema

    if isinstance(schema, str):  # vLLM accepts the schema as a JSON string too
        try:
            schema = json.loads(schema)
        except ValueError as e:
            raise RequestError(f"guided JSON schema is not valid JSON: {e}") from e
    if not isinstance(schema, dict):
        raise RequestError(f"guided JSON schema must be an object, got {type(schema).__name__}")
    # jsonschema walks a schema recursively: a deep one would be a RecursionError (a 500).
    if _depth_over(schema, MAX_SCHEMA_DEPTH):
        raise RequestError(f"guided JSON schema is nested over {MAX_SCHEMA_DEPTH} levels deep")
    dialect = schema.get("$schema")
    if "$schema" in schema and not isinstance(dialect, str):
        # validator_for looks it up in a dict: a list is a TypeError, an int worse.
        raise RequestError(f"guided JSON schema $schema must be a string, got {dialect!r:.80}")
    cls = jsonschema.validators.validator_for(schema, default=None)
    if cls is None and dialect is None:
        cls = jsonschema.validators.validator_for(schema)  # no $schema: the latest draft
    elif cls is None:
        raise RequestError(f"guided JSON schema $schema {dialect!r:.200} is not a known draft")
    try:
        cls.check_schema(schema)
        _check_refs(schema, cls)
    except jsonschema.SchemaError as e:
        raise RequestError(f"guided JSON schema is invalid: {e.message}") from e
    except RecursionError as e:  # the depth bound should make this unreachable
        raise RequestError("guided JSON schema is nested too deep") from e
    return schema


def _depth_over(value: Any, limit: int) -> bool:
    """Whether JSON ``value`` nests objects/arrays more than ``limit`` levels (iterative)."""
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict | list):
            if d > limit:
                return True
            stack.extend((c, d + 1) for c in (v.values() if isinstance(v, dict) else v))
    return False


def _check_refs(schema: dict[str, Any], cls: Any) -> None:
    """Look up every reference in ``schema`` as validation would, from the subschema that
    holds it; no remote retrieval (the registry holds only the known metaschemas).
    ``RequestError`` for one that does not resolve to a schema."""
    import referencing.exceptions
    import referencing.jsonschema
    from jsonschema_specifications import REGISTRY

    spec = referencing.jsonschema.specification_with(
        cls.ID_OF(cls.META_SCHEMA), default=referencing.Specification.OPAQUE
    )
    root = spec.create_resource(schema)
    stack = [(REGISTRY.resolver_with_root(root), root)]
    while stack:
        resolver, resource = stack.pop()
        contents = resource.contents
        if isinstance(contents, dict):
            for key in ("$ref", "$dynamicRef", "$recursiveRef"):
                ref = contents.get(key)
                if key not in cls.VALIDATORS or ref is None:
                    continue  # not a keyword of this draft: validation ignores it
                if not isinstance(ref, str):
                    raise RequestError(f"guided JSON schema {key} must be a string")
                try:
                    target = resolver.lookup(ref).contents
                except referencing.exceptions.Unresolvable as e:
                    raise RequestError(
                        f"guided JSON schema {key} {ref!r:.200} does not resolve"
                    ) from e
                if not isinstance(target, dict | bool):
                    raise RequestError(f"guided JSON schema {key} {ref!r:.200} is not a schema")
        stack.extend((resolver.in_subresource(sub), sub) for sub in resource.subresources())


def guide_from_body(data: dict[str, Any]) -> Guide:
    """The guide a chat-completions body asks for (``Guide()`` if none); ``RequestError``
    for a malformed field, a regex that does not compile or an invalid schema."""
    regex_ = json_ = None
    so = data.get("structured_outputs")
    if so is not None:
        if not isinstance(so, dict):
            raise RequestError("structured_outputs must be an object")
        unknown = sorted(set(so) - {"regex", "json"})
        if unknown:
            raise RequestError(f"structured_outputs.{unknown[0]} is not supported (regex, json)")
        regex_, json_ = so.get("regex"), so.get("json")
    regex_ = data.get("guided_regex", regex_)
    json_ = data.get("guided_json", json_)
    rf = data.get("response_format")
    if rf is not None:
        if not isinstance(rf, dict):
            raise RequestError("response_format must be an object")
        kind = rf.get("type")
        if kind == "json_schema":
            js = rf.get("json_schema")
            if not isinstance(js, dict) or "schema" not in js:
                raise RequestError("response_format.json_schema.schema is missing")
            json_ = js["schema"]
        elif kind not in (None, "text"):
            raise RequestError(f"response_format.type {kind!r} is not supported")
    if regex_ is not None and json_ is not None:
        raise RequestError("give either a guided regex or a JSON schema, not both")
    if regex_ is not None:
        compile_regex(regex_)
        return Guide(regex=regex_)
    if json_ is not None:
        return Guide(json_schema=check_schema(json_))
    return Guide()


def json_ok(text: str, schema: dict[str, Any]) -> bool:
    """Whether ``text`` is JSON valid under ``schema``; a schema that cannot be applied
    (invalid, a ``$ref`` that does not resolve) makes every text not ok."""
    import jsonschema
    import referencing
    import referencing.exceptions

    try:
        # An empty registry: a remote $ref is unresolvable, never fetched.
        jsonschema.validate(json.loads(text), schema, registry=referencing.Registry())
    except (
        ValueError,
        jsonschema.ValidationError,
        jsonschema.SchemaError,
        referencing.exceptions.Unresolvable,
        RecursionError,
    ):
        return False
    return True


class VocabIndex:
    """A vocabulary's token strings in sorted order, so tokens sharing a head lie together.

    :meth:`extending` walks it like a trie: a head that cannot be extended rules out every
    token starting with it in one check. Over a 150k-token vocabulary a grammar position
    that takes only digits or a newline then costs a few thousand checks, not 150k.
    """

    def __init__(self, token_strings: list[str | None]):
        pairs = sorted((t, i) for i, t in enumerate(token_strings) if t)
        self.strings = [t for t, _ in pairs]
        self.ids = [i for _, i in pairs]

    def extending(self, check: Callable[[str], bool]) -> list[int]:
        """Ids (ascending) of the tokens ``t`` with ``check(t)``.

        ``check(s)`` says whether the text so far plus ``s`` can still be completed; it
        must be prefix-closed (if ``s`` passes, so does each prefix of ``s``) — true of any
        "is a prefix of a valid answer" test, and what lets one failed head rule out all
        the tokens that start with it.
        """
        strs, ids = self.strings, self.ids
        out: list[int] = []
        # (lo, hi, depth): strings[lo:hi] share their first `depth` characters, and that
        # shared head already passed `check` (depth 0: nothing known).
        stack = [(0, len(strs), 0)]
        while stack:
            lo, hi, depth = stack.pop()
            i = lo
            while i < hi:
                s = strs[i]
                if len(s) == depth:  # the known-extendable head is this whole token
                    out.append(ids[i])
                    i += 1
                    continue
                head = s[: depth + 1]
                j = bisect.bisect_right(strs, head + "\U0010ffff", i, hi)
                while j < hi and strs[j].startswith(head):  # heads followed by U+10FFFF
                    j += 1
                if j - i == 1:
                    if check(s):
                        out.append(ids[i])
                else:
                    shared = os.path.commonprefix([strs[i], strs[j - 1]])  # sorted: all share it
                    if check(shared):
                        stack.append((i, j, len(shared)))
                i = j
        out.sort()
        return out


class PrefixMask:
    """Per-row logits mask: only tokens that keep the text a prefix of a valid answer.

    ``extendable(text)``: whether ``text`` can still be completed; ``complete(text)``:
    whether it is a whole answer. ``token_strings[i]`` is token i decoded alone (special
    tokens: ``None``, never allowed except the end-of-sequence ids, which are allowed once
    the text is complete). Allowed sets are cached per text prefix.
    """

    def __init__(
        self,
        extendable: Callable[[str], bool],
        complete: Callable[[str], bool],
        token_strings: list[str | None],
        eos_ids: list[int],
        repair: Callable[..., str | None] | None = None,
        watch: tuple[str, ...] = (),
        index: VocabIndex | None = None,
        extender: Callable[[str], Callable[[str], bool]] | None = None,
        prefix_closed: bool = True,
    ):
        self.extendable = extendable
        # Whether `extendable` holds for every prefix of a text it holds for (what the
        # sorted walk needs); a mask that cannot promise it checks every token.
        self.prefix_closed = prefix_closed
        # extender(prefix) -> check(s) == extendable(prefix + s), reading the prefix once
        # (a guide's faster form of the same test; the dense guide has one).
        self.extender = extender
        self.complete = complete
        self.tokens = token_strings
        # Shared by every mask over one vocabulary (MaskCache); built here otherwise.
        self.index = index if index is not None else VocabIndex(token_strings)
        self.eos_ids = list(eos_ids)
        # A guide that can say where a forced answer should be decoded again (the dense
        # guide's repair) and which tokens' raw log-probabilities it reads to say so.
        self.repair = repair
        self.watch = watch
        self._cache: dict[str, list[int]] = {}

    def allowed(self, prefix: str) -> list[int]:
        """Token ids allowed after ``prefix``."""
        hit = self._cache.get(prefix)
        if hit is not None:
            return hit
        if len(self._cache) > MASK_CACHE:  # a long-running server: bounded memory
            self._cache.clear()
        if self.extender is not None:
            check = self.extender(prefix)
        else:
            check = functools.partial(_extends, self.extendable, prefix)
        if self.prefix_closed:
            out = self.index.extending(check)
        else:
            out = [i for i, t in enumerate(self.tokens) if t and check(t)]
        if self.complete(prefix) or not out:
            # Complete: it may stop. A dead end (nothing extends it) stops too: the strict
            # parser then judges the answer.
            out += self.eos_ids
        self._cache[prefix] = out
        return out

    def __call__(self, generated: list[int], scores: Any, lead: str = "") -> Any:
        """Mask one row of logits (a 1-D tensor) given the ids generated so far (after
        ``lead``, answer text already in the prompt)."""
        import torch

        prefix = lead + "".join(self.tokens[i] or "" for i in generated)
        keep = torch.tensor(self.allowed(prefix), dtype=torch.long, device=scores.device)
        masked = torch.full_like(scores, float("-inf"))
        masked[keep] = scores[keep]
        return masked

    def continued(self, lead: str) -> Callable[[list[int], Any], Any]:
        """This mask for an answer whose first characters ``lead`` are already written
        (decoding continues after them); it does not repair."""
        return functools.partial(self.__call__, lead=lead)


def _extends(extendable: Callable[[str], bool], prefix: str, s: str) -> bool:
    return extendable(prefix + s)


#: Constructs under which ``regex`` partial matching is not prefix-closed (a text may
#: partially match while a prefix of it does not: ``a\Bb`` takes "ab" but not "a"):
#: lookarounds and other special groups but ``(?:``, word and string anchors, possessive
#: quantifiers. A pattern with one is enforced by checking every token.
_NOT_PREFIX_CLOSED = re.compile(r"\(\?(?!:)|\\[bBGAZz]|[*+?}]\+")


class RegexMask(PrefixMask):
    """A :class:`PrefixMask` for a regex: ``regex`` partial matching decides extendable,
    a full match complete."""

    def __init__(
        self,
        pattern: str,
        token_strings: list[str | None],
        eos_ids: list[int],
        index: VocabIndex | None = None,
    ):
        self.pattern = compile_regex(pattern)
        super().__init__(
            lambda t: self.pattern.fullmatch(t, partial=True) is not None,
            lambda t: self.pattern.fullmatch(t) is not None,
            token_strings,
            eos_ids,
            index=index,
            prefix_closed=_NOT_PREFIX_CLOSED.search(pattern) is None,
        )


def exact_guide(pattern: str) -> Any | None:
    """The exact guide of a Flora grammar whose regex is ``pattern`` — ``segments_regex(n)``
    → :class:`flora.segment.grammar.SegmentsGuide` (adds ``u < v`` and the line order),
    ``dense_regex()`` → :class:`flora.reward.dense.DenseGuide` (adds the declared worst
    level) — or ``None`` for any other pattern. Each grammar module recognises its own
    regex (``guide_for_regex``). A guide's answers are a subset of the regex's, and all of
    them parse."""
    from flora.reward import dense
    from flora.segment import grammar

    for lookup in (grammar.guide_for_regex, dense.guide_for_regex):
        guide = lookup(pattern)
        if guide is not None:
            return guide
    return None


def make_mask(
    pattern: str,
    token_strings: list[str | None],
    eos_ids: list[int],
    index: VocabIndex | None = None,
) -> PrefixMask:
    """The mask for a request's regex: a Flora grammar's exact guide where there is one
    (:func:`exact_guide`), else the regex enforced as is (:class:`RegexMask`). ``index``:
    the vocabulary's :class:`VocabIndex` when the caller keeps one for many masks."""
    compile_regex(pattern)  # a bad pattern is a RequestError either way
    guide = exact_guide(pattern)
    if guide is not None:
        return PrefixMask(guide.extendable, guide.complete, token_strings, eos_ids,
                          getattr(guide, "repair", None), getattr(guide, "watch", ()),
                          index=index, extender=getattr(guide, "extender", None))  # fmt: skip
    return RegexMask(pattern, token_strings, eos_ids, index=index)


class MaskCache:
    """Guided-decoding masks over one tokenizer's vocabulary, one per regex
    (:func:`make_mask`; each keeps its own per-prefix cache of allowed tokens).

    The vocabulary is decoded once, on first use; at most ``keep`` patterns are held (a few
    hundred distinct grammars exist in practice: one per window tick count).
    """

    def __init__(self, tokenizer: Any, eos_ids: list[int], keep: int = 256):
        self.tokenizer = tokenizer
        self.eos_ids = list(eos_ids)
        self.keep = keep
        self._vocab: list[str | None] | None = None
        self._index: VocabIndex | None = None
        self._masks: dict[str, PrefixMask] = {}

    def __call__(self, pattern: str) -> PrefixMask:
        """The mask for ``pattern``; :class:`RequestError` when it does not compile."""
        if self._vocab is None:
            self._vocab = token_strings(self.tokenizer, len(self.tokenizer))
            self._index = VocabIndex(self._vocab)
        mask = self._masks.get(pattern)
        if mask is None:
            if len(self._masks) >= self.keep:
                self._masks.pop(next(iter(self._masks)))
            mask = self._masks[pattern] = make_mask(
                pattern, self._vocab, self.eos_ids, index=self._index
            )
        return mask


def token_strings(tokenizer: Any, vocab_size: int) -> list[str | None]:
    """Every token id decoded alone; special tokens are ``None``."""
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    special |= {i for i, t in added.items() if getattr(t, "special", False)}
    out: list[str | None] = []
    for i in range(vocab_size):
        if i in special:
            out.append(None)
            continue
        try:
            out.append(tokenizer.decode([i], skip_special_tokens=False))
        except Exception:  # noqa: BLE001 - ids past the tokenizer (padded embeddings)
            out.append(None)
    return out


__all__ = [
    "Guide",
    "JSON_RESAMPLES",
    "MAX_SCHEMA_DEPTH",
    "MaskCache",
    "PrefixMask",
    "RegexMask",
    "VocabIndex",
    "check_schema",
    "compile_regex",
    "exact_guide",
    "guide_from_body",
    "json_ok",
    "make_mask",
    "token_strings",
]
