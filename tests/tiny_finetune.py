"""Teach the tiny random Qwen3-VL to answer given prompts with given texts (test helper).

End-to-end tests need the real model through the real backend to emit parseable output;
a random checkpoint never does. :func:`finetune_tiny` runs a few seconds of real gradient
fine-tuning on the exact requests a pipeline step sends, so greedy decoding then
reproduces each request's target, and the step's parsing, stitching, validation and
writing run on genuine model output (with genuine logprobs).
"""

from __future__ import annotations

import contextlib
import copy
import json
import shutil
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from flora.backends.base import VLMRequest, VLMResponse

STATS_FILE = "flora_tiny_finetune.json"
END = "<|im_end|>"


def finetune_stats(model_dir: Path) -> dict:
    """The training summary :func:`finetune_tiny` stored next to the weights."""
    return json.loads((Path(model_dir) / STATS_FILE).read_text())


def finetune_tiny(
    base: Path,
    pairs: Sequence[tuple[VLMRequest, str]],
    out: Path,
    *,
    lr: float = 2e-2,
    max_steps: int = 300,
    tol: float = 5e-3,
) -> Path:
    """Fine-tune the tiny Qwen3-VL at ``base`` so each request greedily yields its target.

    Returns ``out``: a full checkpoint (weights, tokenizer, processor, chat template) plus
    :data:`STATS_FILE` (steps, final loss, seconds; see :func:`finetune_stats`).

    Real gradient fine-tuning (AdamW, teacher forcing, token cross-entropy over each answer
    and its ``<|im_end|>``) on the exact prompts, rendered by the same
    ``request_to_chat``/``render_prompt`` path the backends use (stamped images). Trained:
    the last decoder block's query and output projections, query norm, MLP and
    post-attention norm, and the final norm. None of these feeds the keys/values of the
    prompt (those come from the frozen embeddings, vision tower, first block and the last
    block's input norm and k/v projections), so each prompt's KV cache is computed once and
    every step runs only the answer tokens against it: exact (checked below), and seconds
    instead of minutes of full passes over long multi-image prompts on a shared CPU. Stops
    when the summed mean loss is below ``tol`` or after ``max_steps`` full-batch steps.
    """
    import torch
    from transformers import AutoModelForImageTextToText

    from flora.backends.processing import load_processor, render_prompt, request_to_chat

    if not pairs:
        raise ValueError("finetune_tiny needs at least one (request, target) pair")
    proc = load_processor(base, "images")
    model = AutoModelForImageTextToText.from_pretrained(str(base), dtype=torch.float32).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    lm = model.model.language_model
    last = lm.layers[-1]
    trained = [
        last.self_attn.q_proj,
        last.self_attn.q_norm,
        last.self_attn.o_proj,
        last.post_attention_layernorm,
        last.mlp,
        lm.norm,
    ]
    params = [p for m in trained for p in m.parameters()]
    for p in params:
        p.requires_grad_(True)

    items = []
    for req, target in pairs:
        n_answer = len(proc.tokenizer(target + END)["input_ids"])
        chat = request_to_chat(req, "images")
        text = render_prompt(proc, chat) + target + END
        enc = proc(text=[text], images=chat.images(), return_tensors="pt")
        enc.pop("token_type_ids", None)
        ids = enc["input_ids"]
        cut = ids.shape[1] - n_answer - 1  # the suffix starts at the prompt's last token
        pos, _ = model.model.get_rope_index(
            ids,
            mm_token_type_ids=enc["mm_token_type_ids"],
            image_grid_thw=enc["image_grid_thw"],
            attention_mask=enc["attention_mask"],
        )
        with torch.no_grad():
            pre = model(
                input_ids=ids[:, :cut],
                attention_mask=enc["attention_mask"][:, :cut],
                pixel_values=enc["pixel_values"],
                image_grid_thw=enc["image_grid_thw"],
                mm_token_type_ids=enc["mm_token_type_ids"][:, :cut],
                position_ids=pos[:, :, :cut],
                use_cache=True,
            )
        cache = getattr(pre, "cache", None)
        cache = cache if cache is not None else pre.past_key_values
        items.append((enc, pos, cut, cache, ids[0, cut + 1 :]))

    def suffix_logits(enc, pos, cut, cache):
        out = model(
            input_ids=enc["input_ids"][:, cut:],
            attention_mask=enc["attention_mask"],
            position_ids=pos[:, :, cut:],
            cache=copy.deepcopy(cache),  # the prefix cache is reused: never extend it
            use_cache=True,
        )
        return out.logits[0, :-1]

    # The cached-prefix pass equals a full forward pass (same weights, same positions).
    enc, pos, cut, cache, _ = min(items, key=lambda it: it[2])
    with torch.no_grad():
        full = model(**enc, position_ids=pos).logits[0, cut:-1]
        assert torch.allclose(suffix_logits(enc, pos, cut, cache), full, atol=1e-4)

    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    loss_sum, steps = float("inf"), 0
    t0 = time.perf_counter()
    while steps < max_steps and loss_sum >= tol:
        steps += 1
        loss_sum = 0.0
        for enc, pos, cut, cache, labels in items:
            logits = suffix_logits(enc, pos, cut, cache)
            loss = torch.nn.functional.cross_entropy(logits, labels) / len(items)
            loss.backward()
            loss_sum += loss.item()
        opt.step()
        opt.zero_grad()
    stats = {
        "targets": sorted({t for _, t in pairs}),
        "steps": steps,
        "loss": loss_sum,
        "seconds": round(time.perf_counter() - t0, 2),
        "requests": len(items),
        "answer_tokens": sum(len(it[4]) for it in items),
        "trained_params": sum(p.numel() for p in params),
    }
    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(base, out)  # tokenizer, processor config, chat template
    model.save_pretrained(out)
    (out / STATS_FILE).write_text(json.dumps(stats, sort_keys=True))
    return out


class Recording:
    """Transparent backend wrapper: forwards every batch to the real backend, keeps both sides.

    It never changes or invents an answer; tests use it to assert what was sent and returned.
    """

    def __init__(self, inner) -> None:
        self.inner = inner
        self.calls: list[tuple[VLMRequest, VLMResponse]] = []

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def model_version(self) -> str:
        return self.inner.model_version  # OpenAIBackend learns it from the first answer

    def generate(self, requests: Sequence[VLMRequest]) -> list[VLMResponse]:
        responses = self.inner.generate(requests)
        self.calls.extend(zip(requests, responses, strict=True))
        return responses


@contextlib.contextmanager
def single_torch_thread() -> Iterator[None]:
    """One intra-op torch thread for tiny tensors.

    With two, OpenMP workers spin-wait around each of thousands of tiny ops; on CPU cores
    shared with other jobs (CI) that made fine-tuning and generation 10-20x slower.
    """
    import torch

    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(prev)
