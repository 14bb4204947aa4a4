"""Cost of one guided-decoding mask step over a production-size vocabulary: every token
checked on the whole text (the mask before 2026-12-07) against the mask's sorted-vocabulary
walk (``VocabIndex``, with the dense guide's one-read prefix check, ``extender``).

No tokenizer can be downloaded here, so the vocabulary is synthetic, shaped like Qwen3's
151,643 entries: single characters, single digits (Qwen splits numbers into digits), word
pieces with and without a leading space or capital, CJK pieces, whitespace and punctuation
runs. The prefixes are token boundaries of answers the engine asks for, with the answer
cut into pieces of 1 to 4 characters: a segmenter window (320 ticks) and a dense window
(32 group lines, twelve with a reason), its prefixes split into those inside a reason
(free text: nearly every ASCII token is allowed) and the rest (a label, a group number, a
newline). Each mask step is timed on a fresh cache.

    python benchmarks/guide_mask.py [--vocab 151643] [--prefixes 60] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import string
import time
from pathlib import Path

import torch

from flora.backends.guided import PrefixMask, make_mask
from flora.reward.dense import dense_regex, render_dense
from flora.segment.grammar import render_segments, segments_regex
from flora.segment.plan import LocalSegment


def synthetic_vocab(size: int, seed: int = 0) -> list[str | None]:
    """A Qwen-shaped vocabulary of ``size`` entries (the first 22 special, ``None``)."""
    rng = random.Random(seed)
    toks: list[str | None] = [None] * 22
    toks += [chr(c) for c in range(32, 127)] + [chr(c) for c in range(161, 256)] + ["\n", "\t"]
    seen = set(t for t in toks if t)
    letters = string.ascii_lowercase
    cjk = [chr(c) for c in range(0x4E00, 0x9FFF)]
    punct = "\n\t .,:;!?()[]{}<>=+-*/_#\"'`|\\"
    while len(toks) < size:
        r = rng.random()
        if r < 0.62:
            w = "".join(rng.choice(letters) for _ in range(rng.randint(2, 10)))
            w = w.capitalize() if rng.random() < 0.2 else w
            t = (" " + w) if rng.random() < 0.6 else w
        elif r < 0.88:
            t = "".join(rng.choice(cjk) for _ in range(rng.randint(1, 3)))
        else:
            t = "".join(rng.choice(punct) for _ in range(rng.randint(2, 4)))
        if t not in seen:
            seen.add(t)
            toks.append(t)
    return toks


def boundaries(answer: str, seed: int) -> list[str]:
    """The answer's prefixes at token boundaries, pieces of 1 to 4 characters."""
    rng = random.Random(seed)
    out, i = [""], 0
    while i < len(answer):
        i = min(len(answer), i + rng.randint(1, 4))
        out.append(answer[:i])
    return out


def time_steps(mask: PrefixMask, prefixes: list[str], brute: bool) -> list[float]:
    """Seconds per mask step (a fresh prefix each, so no cache hit)."""
    out = []
    for p in prefixes:
        t0 = time.perf_counter()
        if brute:
            [i for i, t in enumerate(mask.tokens) if t and mask.extendable(p + t)]
        else:
            mask.allowed(p)
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, default=151_643)
    ap.add_argument("--prefixes", type=int, default=60, help="prefixes timed per answer")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)

    t0 = time.perf_counter()
    vocab = synthetic_vocab(args.vocab)
    labels = [3] * 20 + [2, 2, 3, 3, 3, 3, 3, 3, 1, 1, 1, 1]
    reasons = ["" if lab == 3 else "gripper closed on air and slipped" for lab in labels]
    answers = {
        "dense": (dense_regex(), render_dense(labels, reasons)),
        "segments": (
            segments_regex(320),
            render_segments(
                [
                    LocalSegment(0, 37, True, False),
                    LocalSegment(37, 150),
                    LocalSegment(150, 320, False, True),
                ]
            ),  # fmt: skip
        ),
    }
    rows = []
    cases = []
    for name, (pattern, answer) in answers.items():
        prefixes = boundaries(answer, seed=1)
        if name == "dense":  # inside a reason: the last line has its "|"
            cases.append(
                ("dense, reason", pattern, [p for p in prefixes if "|" in p[p.rfind("\n") :]])
            )
            cases.append(
                ("dense, rest", pattern, [p for p in prefixes if "|" not in p[p.rfind("\n") :]])
            )
        else:
            cases.append((name, pattern, prefixes))
    for name, pattern, prefixes in cases:
        index_build = time.perf_counter()
        mask = make_mask(pattern, vocab, eos_ids=[0])  # index built in the constructor
        index_build = time.perf_counter() - index_build
        step = max(1, len(prefixes) // args.prefixes)
        picked = prefixes[::step][: args.prefixes]
        walked = time_steps(mask, picked, brute=False)
        checked = time_steps(mask, picked, brute=True)
        for p in picked[:5]:  # the two agree (the test suite checks this in depth)
            a = [i for i in mask.allowed(p) if i != 0]
            assert a == [i for i, t in enumerate(vocab) if t and mask.extendable(p + t)]
        rows.append(
            {
                "answer": name,
                "prefixes": len(picked),
                "every_token_ms_mean": 1e3 * statistics.mean(checked),
                "walk_ms_mean": 1e3 * statistics.mean(walked),
                "walk_ms_max": 1e3 * max(walked),
                "speedup": statistics.mean(checked) / statistics.mean(walked),
                "mask_build_s": index_build,
            }
        )
        r = rows[-1]
        print(
            f"{name:14s} {len(picked)} prefixes: every token {r['every_token_ms_mean']:.1f} ms,"
            f" walk {r['walk_ms_mean']:.1f} ms (max {r['walk_ms_max']:.1f}),"
            f" x{r['speedup']:.1f}; mask build {index_build:.2f} s"
        )
    result = {
        "vocab": len(vocab),
        "machine": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "wall_s": time.perf_counter() - t0,
        "rows": rows,
    }
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
