"""Closed vocabulary behind the embedding judge's contrast set and outcome rules.

Each ``TermClass`` is a set of *groups*; terms inside a group are synonyms, terms of two
different groups of the same class contradict each other ("red" vs "blue", "grasp" vs
"push", "left" vs "right"). A caption clause that uses a group the requirement does not,
where the requirement uses another group of the same class, is a candidate factual error
of the class's family. The vocabulary covers the toy world and common tabletop
manipulation; extending it is a matter of adding groups here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class TermClass:
    """A contrast class: its error family, kind of word, and synonym groups."""

    name: str
    family: str
    kind: str  # "noun" | "verb" | "word" (how forms are generated)
    groups: tuple[tuple[str, ...], ...]


CLASSES: tuple[TermClass, ...] = (
    TermClass(
        "coordination",
        "coordination",
        "word",
        (
            ("left arm", "left hand", "left gripper"),
            ("right arm", "right hand", "right gripper"),
            ("both arms", "both hands", "two arms", "two hands", "both grippers"),
            ("one arm", "one hand", "single arm", "a single arm"),
        ),
    ),
    TermClass(
        "colour",
        "object",
        "word",
        (
            ("red",),
            ("green",),
            ("blue",),
            ("yellow",),
            ("orange",),
            ("purple", "violet"),
            ("pink",),
            ("black",),
            ("white",),
            ("grey", "gray"),
            ("brown",),
            ("cyan",),
            ("magenta",),
        ),
    ),
    TermClass(
        "object",
        "object",
        "noun",
        (
            ("block", "brick"),
            ("cube",),
            ("ball", "sphere"),
            ("bowl", "basin"),
            ("cup", "mug"),
            ("box", "bin", "container", "crate"),
            ("plate", "tray", "dish"),
            ("bottle",),
            ("cylinder",),
            ("drawer",),
            ("lid",),
            ("zone", "area", "region"),
            ("cloth", "towel", "rag"),
            ("button",),
            ("marker", "pen"),
        ),
    ),
    TermClass(
        "failure",
        "outcome",
        "verb",
        (
            ("miss",),
            ("drop", "lose its grip on", "lose grip of", "slip"),
            ("collide with", "bump into", "hit", "knock", "collide"),
            ("lose contact with", "lose contact"),
            ("pause", "hesitate", "stall"),
        ),
    ),
    TermClass(
        "verb",
        "action",
        "verb",
        (
            ("reach", "approach", "move the gripper"),
            ("grasp", "grab", "grip"),
            ("lift", "raise"),
            ("move", "carry", "transport", "bring"),
            ("place", "put", "set down", "lower"),
            ("release", "let go of"),
            ("push", "slide", "shove"),
            ("pull", "drag"),
            ("open",),
            ("close",),
            ("rotate", "turn", "twist"),
            ("pour",),
            ("insert",),
            ("stack",),
            ("wipe",),
            ("retract", "move the arm back", "return"),
        ),
    ),
    TermClass(
        "spatial",
        "spatial",
        "word",
        (
            ("left",),
            ("right",),
            ("above", "over"),
            ("below", "under", "beneath", "underneath"),
            ("into", "inside"),
            ("out of",),
            ("onto", "on top of"),
            ("toward", "towards"),
            ("away from",),
            ("in front of",),
            ("behind",),
            ("next to", "beside"),
        ),
    ),
)

FAIL_WORDS = re.compile(
    r"\b(fail(s|ed|ing|ure)?|miss(es|ed|ing)?|drop(s|ped|ping)?|slip(s|ped|ping)?|"
    r"collid(e|es|ed|ing)|collision|bump(s|ed|ing)?|knock(s|ed|ing)?|"
    r"unsuccessful(ly)?|los(e|es|t|ing) (its grip|grip|contact))\b"
)
ATTEMPT_WORDS = re.compile(r"\b(attempt(s|ed|ing)?|tr(y|ies|ied|ying))\b")
SUCCESS_WORDS = re.compile(
    r"\b(success(ful|fully)?|succeed(s|ed)?|manag(e|es|ed) to|complet(e|es|ed)|"
    r"accomplish(es|ed)?)\b"
)

_IRREGULAR = {  # base -> (past, gerund)
    "grab": ("grabbed", "grabbing"),
    "grip": ("gripped", "gripping"),
    "drop": ("dropped", "dropping"),
    "put": ("put", "putting"),
    "set": ("set", "setting"),
    "drag": ("dragged", "dragging"),
    "hit": ("hit", "hitting"),
    "lose": ("lost", "losing"),
    "slip": ("slipped", "slipping"),
}


def inflect(base: str, kind: str) -> str:
    """Inflect a (possibly phrasal) verb's first word: kind in "", "s", "ed", "ing"."""
    head, _, tail = base.partition(" ")
    if kind == "":
        w = head
    elif kind == "s":
        w = head + ("es" if head.endswith(("s", "sh", "ch", "x", "z")) else "s")
    elif kind in ("ed", "ing"):
        if head in _IRREGULAR:
            w = _IRREGULAR[head][0 if kind == "ed" else 1]
        elif kind == "ed":
            w = head + ("d" if head.endswith("e") else "ed")
        else:
            w = (head[:-1] if head.endswith("e") and not head.endswith("ee") else head) + "ing"
    else:
        raise ValueError(f"unknown inflection {kind!r}")
    return f"{w} {tail}" if tail else w


def _plural(noun: str) -> str:
    return noun + ("es" if noun.endswith(("s", "sh", "ch", "x", "z")) else "s")


@dataclass(frozen=True)
class TermHit:
    """A lexicon term found in a text: where, which class/group, and its inflection."""

    start: int
    end: int
    cls: int  # index into CLASSES
    group: int
    kind: str  # inflection / number of the matched form ("", "s", "ed", "ing")


@lru_cache(maxsize=1)
def _matcher() -> tuple[re.Pattern[str], dict[str, tuple[int, int, str]]]:
    forms: dict[str, tuple[int, int, str]] = {}
    for ci, tc in enumerate(CLASSES):
        for gi, group in enumerate(tc.groups):
            for term in group:
                if tc.kind == "verb":
                    variants = {k: inflect(term, k) for k in ("", "s", "ed", "ing")}
                elif tc.kind == "noun":
                    variants = {"": term, "s": _plural(term)}
                else:
                    variants = {"": term}
                for k, form in variants.items():
                    forms.setdefault(form, (ci, gi, k))  # earlier classes win
    alts = sorted(forms, key=len, reverse=True)  # longest match first ("left arm" > "left")
    pat = re.compile(r"\b(" + "|".join(re.escape(a) for a in alts) + r")\b")
    return pat, forms


def find_terms(text: str) -> list[TermHit]:
    """All lexicon terms in ``text`` (lower-cased), non-overlapping, left to right."""
    pat, forms = _matcher()
    out = []
    for m in pat.finditer(text.lower()):
        ci, gi, k = forms[m.group(1)]
        out.append(TermHit(m.start(), m.end(), ci, gi, k))
    return out


def realise(cls: int, group: int, kind: str) -> str:
    """The representative form of a group with a given inflection."""
    tc = CLASSES[cls]
    base = tc.groups[group][0]
    if tc.kind == "verb":
        return inflect(base, kind)
    if tc.kind == "noun" and kind == "s":
        return _plural(base)
    return base


@dataclass(frozen=True)
class Contrast:
    """A minimally edited, contradicting variant of a requirement text."""

    text: str
    family: str
    cls: int
    old_group: int
    new_group: int


def contrast_set(text: str, only_new: set[tuple[int, int]] | None = None) -> list[Contrast]:
    """Variants of ``text`` with one lexicon term swapped for another group of its class.

    ``only_new`` restricts the swaps to the given ``(class, group)`` targets (the judge only
    needs variants towards groups a caption actually uses).
    """
    low = text.lower()
    hits = find_terms(low)
    present = {(h.cls, h.group) for h in hits}
    out: list[Contrast] = []
    seen: set[str] = set()
    for h in hits:
        tc = CLASSES[h.cls]
        for g in range(len(tc.groups)):
            if (h.cls, g) in present:
                continue  # swapping to a group the text already uses is no contradiction
            if only_new is not None and (h.cls, g) not in only_new:
                continue
            v = low[: h.start] + realise(h.cls, g, h.kind) + low[h.end :]
            if v not in seen:
                seen.add(v)
                out.append(Contrast(v, tc.family, h.cls, h.group, g))
    return out


def abstract_objects(text: str) -> str:
    """``text`` with every object mention ("the red cube", "it") replaced by "the object".

    Requirements may name their object generically ("above the object", "miss the
    object"); this form lets a caption that names the concrete object match them.
    """
    low = text.lower()
    words = {"colour": [], "object": []}
    for ci, tc in enumerate(CLASSES):
        if tc.name in words:
            for g in range(len(tc.groups)):
                words[tc.name] += [realise(ci, g, "")] + list(tc.groups[g][1:])
    nouns = "|".join(sorted(words["object"], key=len, reverse=True))
    colours = "|".join(sorted(words["colour"], key=len, reverse=True))
    pat = rf"\b(?:(?:the|a|an)\s+)?(?:(?:{colours})\s+)?(?:{nouns})(?:e?s)?\b"
    low = re.sub(pat, "the object", low)
    return re.sub(r"\b(it|them)\b", "the object", low)


def canonical(text: str) -> str:
    """``text`` lower-cased with every lexicon term replaced by its group representative.

    Synonyms then embed identically ("lower the cube" -> "place the cube", "carry" ->
    "move", "bump into" -> "collide with"), which single-word MiniLM similarity misses.
    """
    low = text.lower()
    out, pos = [], 0
    for h in find_terms(low):
        out.append(low[pos : h.start])
        out.append(realise(h.cls, h.group, h.kind))
        pos = h.end
    out.append(low[pos:])
    return "".join(out)


def groups_in(text: str) -> set[tuple[int, int]]:
    """``(class, group)`` pairs used by ``text``."""
    return {(h.cls, h.group) for h in find_terms(text)}


def classify_claim(text: str) -> str | None:
    """Family of a free claim (for unsupported-claim errors), None when it has no content.

    Priority: outcome words, then coordination, action verb, spatial relation, object.
    """
    low = text.lower()
    if FAIL_WORDS.search(low) or SUCCESS_WORDS.search(low):
        return "outcome"
    fams = {CLASSES[c].family for c, _ in groups_in(low)}
    for fam in ("outcome", "coordination", "action", "spatial", "object"):
        if fam in fams:
            return fam
    return None
