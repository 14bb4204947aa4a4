"""In-process VLM backend: any Qwen-VL-family checkpoint through transformers Auto classes.

Requests are validated one by one (a bad request becomes an error response, never an
exception), grouped by generation settings, sorted by size and run in left-padded batches
of ``batch_size``. If a whole batch fails (e.g. out of memory), its requests are retried
one at a time so that only the culprit fails.

Log-probabilities are those of the unmodified model distribution (log-softmax of the raw
logits: temperature 1, no top-k/top-p), recorded at every step by a logits processor that
transformers runs before its sampling warpers — the same as vLLM's default
``raw_logprobs`` mode. With
temperature sampling the sampled token is drawn from ``softmax(logits / T)`` but its
reported logprob is still the raw one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from flora.backends.base import BackendError, TokenLogprob, VLMRequest, VLMResponse
from flora.backends.guided import MaskCache, PrefixMask
from flora.backends.processing import (
    Chat,
    RequestError,
    load_processor,
    render_prompt,
    request_to_chat,
    supports_video,
    trained_vision_input,
)

log = logging.getLogger(__name__)

# Checkpoints at most this large are content-hashed in full for ``model_version``; larger
# ones hash names, sizes, small files and each weight file's header + first/last MiB.
FULL_HASH_LIMIT = 2 * 1024**3
_MIB = 1024 * 1024


def fingerprint_dir(path: str | Path, full_limit: int = FULL_HASH_LIMIT) -> str:
    """A stable content hash of a checkpoint/adapter directory (hex sha256).

    Full content when the directory is at most ``full_limit`` bytes; otherwise every
    file's name and size, the whole of every file under 16 MiB (configs, tokenizer,
    safetensors index) and the first and last MiB of larger ones (the safetensors header
    with every tensor's offsets is at the start). Cheap enough to run at every load.
    """
    root = Path(path)
    files = sorted(p for p in root.rglob("*") if p.is_file() and ".cache" not in p.parts)
    total = sum(p.stat().st_size for p in files)
    h = hashlib.sha256()
    for p in files:
        size = p.stat().st_size
        h.update(f"{p.relative_to(root).as_posix()}\0{size}\0".encode())
        with p.open("rb") as f:
            if total <= full_limit or size <= 16 * _MIB:
                for chunk in iter(lambda: f.read(8 * _MIB), b""):  # noqa: B023
                    h.update(chunk)
            else:
                h.update(f.read(_MIB))
                f.seek(size - _MIB)
                h.update(f.read(_MIB))
    return h.hexdigest()


def resolve_local(model_path: str) -> tuple[Path, str | None]:
    """A local directory for ``model_path`` (a path or a hub id) and, for hub ids, the revision.

    Hub ids go through the local Hugging Face cache (``HF_HUB_OFFLINE=1`` never touches
    the network); the snapshot directory's name is the commit hash.
    """
    p = Path(model_path).expanduser()
    if p.is_dir():
        return p.resolve(), None
    from huggingface_hub import snapshot_download

    try:
        local = Path(snapshot_download(model_path))
    except Exception as e:  # noqa: BLE001 - any hub failure is a load error for us
        raise BackendError(
            f"cannot resolve model {model_path!r} locally or from the hub: {e}"
        ) from e
    return local, local.name


def pick_device(device: str = "auto") -> torch.device:
    """``"auto"`` -> CUDA when available, else CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def pick_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """``"auto"`` -> bfloat16 on CUDA, float32 on CPU."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    try:
        return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[
            dtype
        ]
    except KeyError:
        raise ValueError(f"dtype must be auto/bfloat16/float16/float32, got {dtype!r}") from None


@dataclass
class Generation:
    """One generated answer with what the OpenAI wire format needs on top of VLMResponse."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str = "stop"  # "stop" (EOS) | "length"
    prompt_tokens: int = 0
    error: str | None = None


class _LogprobRecorder:
    """Logits processor recording raw log-probs (chosen token + top-k) at every step.

    It runs first, on the unwarped logits. The token chosen at step t is only known at step
    t+1 (it is then the last input id), so one (B, V) row is kept between steps.
    """

    def __init__(self, top_k: int, watch: Sequence[int] = ()):
        self.top_k = top_k
        # Token ids whose log-probs are kept at every step (a guide's repair reads them).
        self.watch = list(watch)
        self.prev: torch.Tensor | None = None
        self.chosen: list[torch.Tensor] = []
        self.top_vals: list[torch.Tensor] = []
        self.top_ids: list[torch.Tensor] = []
        self.watched: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        lp = torch.log_softmax(scores.float(), dim=-1)
        # Everything stays on the device until the end: no host sync per generated token.
        if self.prev is not None:
            self.chosen.append(self.prev.gather(1, input_ids[:, -1:]).squeeze(1))
        self.prev = lp
        if self.top_k > 0:
            v, i = lp.topk(self.top_k, dim=-1)
            self.top_vals.append(v)
            self.top_ids.append(i)
        if self.watch:
            self.watched.append(lp[:, self.watch])
        return scores

    def watched_logprobs(self) -> torch.Tensor:
        """(B, T, len(watch)) raw log-probs of the watched ids at every step, on the CPU."""
        return torch.stack(self.watched, 1).cpu() if self.watched else torch.zeros(0, 0, 0)

    def finish(self, last_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(chosen (B, T), top values (B, T, k), top ids (B, T, k)) on the CPU."""
        if self.prev is not None:
            self.chosen.append(
                self.prev.gather(1, last_ids[:, None].to(self.prev.device)).squeeze(1)
            )
            self.prev = None
        b = last_ids.shape[0]
        chosen = torch.stack(self.chosen, 1).cpu() if self.chosen else torch.zeros(b, 0)
        if self.top_vals:
            vals = torch.stack(self.top_vals, 1).cpu()
            ids = torch.stack(self.top_ids, 1).cpu()
        else:
            vals, ids = torch.zeros(b, 0, 0), torch.zeros(b, 0, 0, dtype=torch.long)
        return chosen, vals, ids


class TransformersBackend:
    """Local VLM backend (CPU or CUDA) over a Qwen-VL-family checkpoint.

    ``model_path``: local dir or hub id. ``adapter_path``: optional PEFT adapter (merged
    into the weights after loading unless ``merge_adapter=False``). ``vision_input``:
    ``"auto"`` (a Flora export: the input it was trained on, from its manifest; any other
    checkpoint: video with timestamps when the processor supports it and the request has
    timestamps, else stamped images), ``"images"`` or ``"video"``. ``guided``: enforce each
    request's grammar regex (``VLMRequest.guided_regex``) token by token with the same mask
    ``flora serve`` applies (:func:`~flora.backends.guided.make_mask`), so in-process answers
    are decoded exactly as served ones (``FLORA_GUIDED``; docs/backends.md).
    """

    name = "transformers"

    def __init__(
        self,
        model_path: str | Path,
        adapter_path: str | Path | None = None,
        device: str = "auto",
        dtype: str | torch.dtype = "auto",
        batch_size: int = 8,
        vision_input: str = "auto",
        merge_adapter: bool = True,
        seed: int | None = None,
        show_progress: bool = False,
        guided: bool = False,
    ):
        from transformers import AutoModelForImageTextToText

        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        if vision_input not in ("auto", "images", "video"):
            raise ValueError(f"vision_input must be auto/images/video, got {vision_input!r}")
        t0 = time.perf_counter()
        self.model_path = str(model_path)
        self.adapter_path = str(adapter_path) if adapter_path else None
        self.device = pick_device(device)
        self.dtype = pick_dtype(dtype, self.device)
        self.batch_size = batch_size
        self.seed = seed
        self.show_progress = show_progress
        self.set_guided(guided)
        if vision_input == "auto":
            # A Flora export is served the way it was trained, whatever this host's
            # processor could do; any other checkpoint keeps the processor's choice.
            vision_input = trained_vision_input(self.adapter_path, self.model_path) or "auto"
        local, revision = resolve_local(self.model_path)
        self.local_path = local
        self.processor = load_processor(local, vision_input)
        self.tokenizer = self.processor.tokenizer
        if vision_input == "video" and not supports_video(self.processor):
            raise BackendError(
                f"{local}: vision_input='video' needs the checkpoint's video processor "
                "(torchvision is not installed)"
            )
        self.vision_input = vision_input
        kwargs: dict[str, Any] = {"dtype": self.dtype}
        if self.device.type == "cuda":
            kwargs["device_map"] = {"": str(self.device)}  # load shards straight to the GPU
        try:
            model = AutoModelForImageTextToText.from_pretrained(str(local), **kwargs)
        except (OSError, ValueError) as e:
            raise BackendError(f"cannot load model from {local}: {e}") from e
        base_version = f"hub:{self.model_path}@{revision}" if revision else fingerprint_dir(local)
        self.model_version = base_version[:16] if not revision else base_version
        if self.adapter_path:
            from peft import PeftModel

            apath, _ = resolve_local(self.adapter_path)
            model = PeftModel.from_pretrained(model, str(apath))
            if merge_adapter:
                model = model.merge_and_unload()
            self.model_version = f"{self.model_version}+lora-{fingerprint_dir(apath)[:12]}"
        self.model = model.to(self.device).eval()
        gc = self.model.generation_config
        eos = gc.eos_token_id if gc is not None else None
        eos_list = eos if isinstance(eos, list) else ([eos] if eos is not None else [])
        im_end = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        if im_end is not None and im_end not in eos_list:
            eos_list.append(im_end)
        self.eos_ids = [int(e) for e in eos_list]
        self.pad_id = (
            self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos_list[0]
        )
        self.load_seconds = time.perf_counter() - t0
        log.info(
            "loaded %s (%s) on %s/%s in %.1fs",
            local,
            self.model_version,
            self.device,
            self.dtype,
            self.load_seconds,
        )

    # ---- public API ---------------------------------------------------------------------

    def generate(self, requests: Sequence[VLMRequest]) -> list[VLMResponse]:
        """One response per request, in order; malformed/failed requests carry ``error``."""
        chats: list[Chat | None] = []
        errors: dict[int, str] = {}
        for i, req in enumerate(requests):
            try:
                mode = self._mode_for(req)
                chat = request_to_chat(req, mode)
                if self.guided and req.guided_regex is not None:
                    chat.meta["logits_mask"] = self.regex_mask(req.guided_regex)
                chats.append(chat)
            except RequestError as e:
                chats.append(None)
                errors[i] = str(e)
        gens = self.generate_chats([c for c in chats if c is not None])
        it = iter(gens)
        out: list[VLMResponse] = []
        for i in range(len(requests)):
            if i in errors:
                out.append(VLMResponse(text="", error=errors[i], model=self.model_version))
                continue
            g = next(it)
            out.append(
                VLMResponse(
                    text=g.text if g.error is None else "",
                    logprobs=g.logprobs,
                    error=g.error,
                    model=self.model_version,
                    finish_reason=g.finish_reason,
                )
            )
        return out

    def generate_chats(self, chats: Sequence[Chat]) -> list[Generation]:
        """Generate for backend-neutral chats (used by ``generate`` and ``flora serve``)."""
        results: list[Generation | None] = [None] * len(chats)
        # A per-request seed seeds its own batch: sampled retries stay reproducible whatever
        # else is generated with them.
        groups: dict[tuple[int, float, int | None], list[int]] = {}
        for i, c in enumerate(chats):
            seed = c.seed if c.temperature > 0 else None
            groups.setdefault((c.max_new_tokens, float(c.temperature), seed), []).append(i)
        batches: list[tuple[tuple[int, float, int | None], list[int]]] = []
        for key, idx in groups.items():
            # Similar sizes together: less padding per batch.
            idx = sorted(idx, key=lambda i: (len(chats[i].images()), _text_len(chats[i])))
            for s in range(0, len(idx), self.batch_size):
                batches.append((key, idx[s : s + self.batch_size]))
        progress = None
        if self.show_progress and len(batches) > 1:
            from tqdm import tqdm

            progress = tqdm(total=len(chats), desc="vlm generate", unit="req")
        for (max_new, temp, seed), idx in batches:
            batch = [chats[i] for i in idx]
            try:
                gens = self._run_batch(batch, max_new, temp, seed)
            except Exception as e:  # noqa: BLE001 - isolate the failing request(s)
                log.warning("batch of %d failed (%s); retrying one at a time", len(batch), e)
                gens = []
                for c in batch:
                    try:
                        gens.extend(self._run_batch([c], max_new, temp, seed))
                    except Exception as e1:  # noqa: BLE001
                        gens.append(
                            Generation(error=f"generation failed: {type(e1).__name__}: {e1}")
                        )
                        if self.device.type == "cuda":
                            torch.cuda.empty_cache()
            for i, g in zip(idx, gens, strict=True):
                results[i] = g
            if progress is not None:
                progress.update(len(idx))
        if progress is not None:
            progress.close()
        return [r if r is not None else Generation(error="not generated") for r in results]

    def set_guided(self, guided: bool) -> None:
        """Turn in-process guided decoding on or off (and start its mask cache afresh)."""
        self.guided = guided
        self._mask_cache: MaskCache | None = None

    def regex_mask(self, pattern: str) -> PrefixMask:
        """The guided-decoding mask for ``pattern`` (:class:`~flora.backends.guided.MaskCache`:
        compiled once per pattern, its allowed-token cache shared by every request).

        Raises :class:`RequestError` when the pattern does not compile.
        """
        if self._mask_cache is None:  # eos_ids are final by the first request
            self._mask_cache = MaskCache(self.tokenizer, list(self.eos_ids))
        return self._mask_cache(pattern)

    # ---- internals ----------------------------------------------------------------------

    def _mode_for(self, req: VLMRequest) -> str:
        if self.vision_input == "images":
            return "images"
        if self.vision_input == "video":
            return "video"
        video_ok = supports_video(self.processor) and req.frame_times_us is not None
        return "video" if video_ok and len(req.images) >= 2 else "images"

    def _inputs(self, batch: Sequence[Chat]) -> Any:
        # An assistant_prefix (a repaired answer's head) is continued, not answered afresh.
        texts = [
            render_prompt(self.processor, c) + c.meta.get("assistant_prefix", "") for c in batch
        ]
        images = [img for c in batch for img in c.images()]
        videos = [v for c in batch for v in c.videos()]
        kwargs: dict[str, Any] = {}
        if videos:
            from transformers.video_utils import VideoMetadata

            metas = []
            for v in videos:
                n = len(v["video"])
                times = v.get("times_us") or [int(k * 250_000) for k in range(n)]
                # Millisecond "frame indices" at fps=1000 make the processor's stamps
                # equal the real frame times, whatever the (possibly uneven) spacing.
                ms = [int(round(t / 1000)) for t in times]
                metas.append(
                    VideoMetadata(total_num_frames=max(ms) + 1, fps=1000.0, frames_indices=ms)
                )
            kwargs["videos"] = [np.stack(v["video"]) for v in videos]
            kwargs["video_metadata"] = metas
            kwargs["do_sample_frames"] = False
        enc = self.processor(
            text=texts, images=images or None, padding=True, return_tensors="pt", **kwargs
        )
        enc.pop("token_type_ids", None)
        return enc.to(self.device)

    @torch.inference_mode()
    def _run_batch(
        self, batch: Sequence[Chat], max_new: int, temperature: float, seed: int | None = None
    ) -> list[Generation]:
        from transformers import GenerationConfig, LogitsProcessorList

        enc = self._inputs(batch)
        prompt_len = enc["input_ids"].shape[1]
        attn = enc["attention_mask"]
        top_k = max((c.top_logprobs for c in batch), default=0)
        watch = self._watch_ids(batch)
        recorder = _LogprobRecorder(top_k, list(watch.values()))
        sample = temperature > 0
        # Flora controls decoding fully: the checkpoint's own defaults (top_k/top_p,
        # repetition penalty…) are overridden. Pure temperature sampling, or greedy.
        flags: dict[str, Any] = {"do_sample": sample, "repetition_penalty": 1.0}
        if sample:
            flags.update(temperature=float(temperature), top_k=0, top_p=1.0)
        gcfg = GenerationConfig(
            max_new_tokens=max_new,
            eos_token_id=self.eos_ids,
            pad_token_id=self.pad_id,
            return_dict_in_generate=True,
            no_repeat_ngram_size=0,
            **flags,
        )
        seed = seed if seed is not None else self.seed
        if seed is not None:
            torch.manual_seed(seed)
        stop_kw: dict[str, Any] = {}
        if any(c.meta.get("should_stop") for c in batch):
            from transformers import StoppingCriteriaList

            stop_kw["stopping_criteria"] = StoppingCriteriaList([_StopRows(batch)])
        processors: list[Any] = [recorder]  # first: log-probs of the raw distribution
        if any(c.meta.get("logits_mask") for c in batch):  # guided decoding (flora serve)
            processors.append(_RowMasks(batch, prompt_len))
        out = self.model.generate(
            **enc,
            generation_config=gcfg,
            logits_processor=LogitsProcessorList(processors),
            **stop_kw,
        )
        seqs = out.sequences[:, prompt_len:].cpu()
        chosen, top_vals, top_ids = recorder.finish(seqs[:, -1])
        gens: list[Generation] = []
        for b, chat in enumerate(batch):
            ids = seqs[b].tolist()
            finish = "length"
            n = len(ids)
            for t, tid in enumerate(ids):
                if tid in self.eos_ids:
                    n, finish = t, "stop"
                    break
            ids = ids[:n]
            lps: list[TokenLogprob] = []
            if chat.want_logprobs:
                for t, tid in enumerate(ids):
                    top: dict[str, float] = {}
                    if chat.top_logprobs > 0:
                        vals = top_vals[b, t, : chat.top_logprobs].tolist()
                        alts = top_ids[b, t, : chat.top_logprobs].tolist()
                        for v, a in zip(vals, alts, strict=True):
                            # Two ids may decode to the same string: keep the likelier.
                            top.setdefault(self._tok_str(a), float(v))
                    lps.append(TokenLogprob(self._tok_str(tid), float(chosen[b, t]), top))
            gens.append(
                Generation(
                    text=self.tokenizer.decode(ids, skip_special_tokens=True),
                    token_ids=ids,
                    logprobs=lps,
                    finish_reason=finish,
                    prompt_tokens=int(attn[b].sum()),
                )
            )
        if watch:
            watched = recorder.watched_logprobs()
            gens = self._repaired(batch, gens, watched, watch, temperature, seed)
        return gens

    def _watch_ids(self, batch: Sequence[Chat]) -> dict[str, int]:
        """Token ids of the strings the batch's repairing guides watch (string -> id)."""
        out: dict[str, int] = {}
        for c in batch:
            mask = c.meta.get("logits_mask")
            for s in getattr(mask, "watch", ()):
                if s not in out and s in mask.tokens:
                    out[s] = mask.tokens.index(s)  # a handful of strings, once per batch
        return out

    def _repair_plan(
        self, chat: Chat, gen: Generation, watched: torch.Tensor, watch: dict[str, int]
    ) -> _Repair | None:
        """How to repair ``gen`` when its guide says the grammar forced the answer
        (:meth:`flora.reward.dense.DenseGuide.repair`), or ``None`` to keep it."""
        mask = chat.meta.get("logits_mask")
        if gen.error is not None or getattr(mask, "repair", None) is None:
            return None
        starts: dict[int, int] = {}
        pos = 0
        for t, tid in enumerate(gen.token_ids):
            starts[pos] = t
            pos += len(mask.tokens[tid] or "")
        text = "".join(mask.tokens[i] or "" for i in gen.token_ids)

        def label_logprobs(i: int) -> dict[str, float] | None:
            t = starts.get(i)
            if t is None or t >= watched.shape[0]:
                return None
            return dict(zip(watch, watched[t].tolist(), strict=True))  # in watch's order

        lead = mask.repair(text, label_logprobs)
        if lead is None:
            return None
        cut = starts[len(lead) - 1]  # the token whose label the repair replaced
        budget = chat.max_new_tokens - cut - 1
        if budget < 1:
            return None
        again = dataclasses.replace(
            chat,
            max_new_tokens=budget,
            meta={**chat.meta, "logits_mask": mask.continued(lead), "assistant_prefix": lead},
        )
        placed = TokenLogprob(lead[-1], float(label_logprobs(len(lead) - 1)[lead[-1]]), {})
        return _Repair(again, lead, cut, watch[lead[-1]], placed)

    def _repaired(
        self,
        batch: Sequence[Chat],
        gens: list[Generation],
        watched: torch.Tensor,
        watch: dict[str, int],
        temperature: float,
        seed: int | None,
    ) -> list[Generation]:
        """``gens`` with every answer its guide says the grammar forced replaced by the
        answer the model gives when decoding goes on from the guide's repair point. All the
        continuations of a batch are decoded together, in one generate call."""
        plans = {b: self._repair_plan(c, gens[b], watched[b], watch) for b, c in enumerate(batch)}
        plans = {b: p for b, p in plans.items() if p is not None}
        if not plans:
            return gens
        budget = max(p.again.max_new_tokens for p in plans.values())
        try:
            rests = self._run_batch([p.again for p in plans.values()], budget, temperature, seed)
        except Exception as e:  # noqa: BLE001 - the guided answers stand without the repair
            log.warning("dense repair of %d answers failed (%s); keeping the guided answers",
                        len(plans), e)  # fmt: skip
            return gens
        out = list(gens)
        for (b, plan), rest in zip(plans.items(), rests, strict=True):
            if rest.error is None:
                out[b] = plan.apply(gens[b], self._trimmed(rest, plan.again.max_new_tokens))
        return out

    def _trimmed(self, gen: Generation, max_new: int) -> Generation:
        """``gen`` cut to ``max_new`` tokens: a row decoded in a batch with a larger budget
        (a greedy row then equals the row decoded alone with its own budget)."""
        if len(gen.token_ids) <= max_new:
            return gen
        ids = gen.token_ids[:max_new]
        return dataclasses.replace(
            gen,
            text=self.tokenizer.decode(ids, skip_special_tokens=True),
            token_ids=ids,
            logprobs=gen.logprobs[:max_new],
            finish_reason="length",
        )

    def _tok_str(self, tid: int) -> str:
        return self.tokenizer.decode([int(tid)], skip_special_tokens=False)

    def info(self) -> dict[str, Any]:
        """What is loaded, for logs and ``/v1/models``."""
        return {
            "model_path": self.model_path,
            "adapter_path": self.adapter_path,
            "model_version": self.model_version,
            "device": str(self.device),
            "dtype": str(self.dtype).replace("torch.", ""),
            "vision_input": self.vision_input,
            "video_supported": supports_video(self.processor),
            "model_type": getattr(self.model.config, "model_type", ""),
            "pid": os.getpid(),
        }


@dataclass
class _Repair:
    """A forced answer's repair: the continuation to decode (``again``: prompt plus
    ``lead``, the answer up to and including the repaired label) and how to join it."""

    again: Chat
    lead: str
    cut: int  # tokens of the first answer kept before the repaired label
    label_id: int
    placed: TokenLogprob  # the repaired label with its raw log-prob

    def apply(self, gen: Generation, rest: Generation) -> Generation:
        """The first answer's head, the repaired label, then the continuation."""
        keep = self.again.want_logprobs
        head = gen.logprobs[: self.cut] + [self.placed] if keep else []
        return Generation(
            text=self.lead + rest.text,
            token_ids=gen.token_ids[: self.cut] + [self.label_id] + rest.token_ids,
            logprobs=head + rest.logprobs if keep else [],
            finish_reason=rest.finish_reason,
            prompt_tokens=gen.prompt_tokens,
        )


class _StopRows:
    """Stopping criterion: row b stops once ``batch[b].meta["should_stop"]()`` is true.

    ``flora serve`` sets it so that a request whose client disconnected or whose deadline
    passed stops generating at the next token instead of running to ``max_new_tokens``.
    """

    def __init__(self, batch: Sequence[Chat]):
        self.checks = [c.meta.get("should_stop") for c in batch]

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        flags = [bool(f is not None and f()) for f in self.checks]
        return torch.tensor(flags, dtype=torch.bool, device=input_ids.device)


class _RowMasks:
    """Logits processor: row b's scores go through ``batch[b].meta["logits_mask"]``
    (``mask(generated_ids, scores_row) -> scores_row``), e.g. a guided-decoding regex."""

    def __init__(self, batch: Sequence[Chat], prompt_len: int):
        self.masks = [c.meta.get("logits_mask") for c in batch]
        self.prompt_len = prompt_len

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        for b, mask in enumerate(self.masks):
            if mask is not None:
                scores[b] = mask(input_ids[b, self.prompt_len :].tolist(), scores[b])
        return scores


def _text_len(c: Chat) -> int:
    return sum(
        len(p.get("text", ""))
        for m in c.messages
        for p in (m["content"] if isinstance(m["content"], list) else [])
    )


def describe(backend: TransformersBackend) -> str:
    """One-line JSON description of a loaded backend."""
    return json.dumps(backend.info(), sort_keys=True)


__all__ = ["Generation", "TransformersBackend", "fingerprint_dir", "pick_device", "pick_dtype"]
