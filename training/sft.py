"""Supervised fine-tuning of the three Flora models on DeepSpeed (DESIGN §3.5).

Inputs are rendered exactly as at inference: ``Example.to_request()`` →
:func:`flora.backends.processing.request_to_chat` (stamped images) →
:func:`~flora.backends.processing.render_prompt`, followed by the target and
``<|im_end|>``. Only the target tokens (and ``<|im_end|>``) carry labels.

**Loss.** The loss of an optimizer step is the summed token cross-entropy over all target
tokens of the *global* batch divided by their count. The count is known before any
forward pass (targets are tokenised up front) and summed over ranks with ``all_reduce``;
each micro-batch's summed CE is scaled by ``gas * world / count``, which cancels
DeepSpeed's own ``1/gas`` in ``engine.backward`` and the ``1/world`` of its gradient
averaging. The step's loss and gradients therefore do not depend on micro-batch size,
accumulation or the data-parallel split (``tests/training/test_sft_loss.py``).

**Trainable parts** (:func:`apply_trainable`): segmenter — rank-32 LoRA (peft) on the
language model's projections only; captioner — language model + vision merger(s);
rewarder — language model + merger(s) + vision encoder, the vision encoder in its own
parameter group at ``vision_lr``.

**Data order.** Step ``k`` takes examples ``[k*B, (k+1)*B)`` of the endless stream of
epoch permutations (``rng([seed, epoch])``), ``B = micro * gas * world``; rank ``r`` takes
its contiguous share. The position in the data is the step number, so resume needs no
sampler state.

**Checkpoints** (every ``checkpoint_every`` steps): DeepSpeed's own (model, optimizer,
scheduler) plus client state (step, RNG states, best eval loss, patience counter) and a
``flora_checkpoint.json`` manifest written last (model, recipe digest, base fingerprint,
world size, sha256 of every file), in a temporary folder renamed to ``step<N>`` after
that. Resume refuses a checkpoint without a manifest (foreign or half-written), of another
model, recipe or world size, or whose files do not match their hashes (corrupt); the
latest checkpoint is the highest step with a manifest. A new run refuses a checkpoint
folder that already holds ``step*`` folders, and pruning removes only this run's older
checkpoints. A NaN/inf loss (training or held-out) stops training with
:class:`DivergedError` before that state is stepped, saved or exported, leaving the last
good checkpoint untouched. The final model is exported to a temporary folder and renamed
into place; only then is it logged and registered.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import random
import shutil
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from flora.backends.processing import MODEL_FORMAT, MODEL_MANIFEST, TRAINING_VISION_INPUT
from training.recipe import Recipe, load_recipe
from training.sets import Example, SetError, load_set, read_manifest, set_failures

END = "<|im_end|>"
IGNORE = -100
CHECKPOINT_MANIFEST = "flora_checkpoint.json"
CHECKPOINT_FORMAT = "flora-sft-checkpoint/1"
DEEPSPEED_DIR = Path(__file__).resolve().parent / "deepspeed"

# Parameter-name prefixes of each trainable module key (Qwen2.5-VL / Qwen3-VL / Qwen3.5
# share them in transformers 5). The vision encoder is ``model.visual`` minus its mergers.
LANGUAGE_PREFIXES = ("model.language_model.", "lm_head.")
MERGER_PREFIXES = ("model.visual.merger.", "model.visual.deepstack_merger_list.")
VISION_PREFIX = "model.visual."
# LoRA targets: the language model's attention / MLP projections (Qwen3.5's linear
# attention layers included); never a vision module.
LORA_TARGETS = (
    r".*language_model\.layers\.\d+\."
    r"(self_attn\.(q_proj|k_proj|v_proj|o_proj)|mlp\.(gate_proj|up_proj|down_proj)"
    r"|linear_attn\.(in_proj_qkvz|in_proj_ba|in_proj_qkv|in_proj_z|in_proj_b|in_proj_a|out_proj))"
)
# With a recipe's ``lora_merger``: also the vision mergers' linear layers, which project
# every visual token into the language model (the vision encoder itself stays frozen).
LORA_MERGER_TARGETS = r".*visual\.(?:merger|deepstack_merger_list\.\d+)\.linear_fc[12]"


class TrainingError(RuntimeError):
    """Training cannot start or continue (bad set, base, processor, recipe...)."""


class CheckpointError(TrainingError):
    """A checkpoint that must not be resumed from (foreign, corrupt, mismatched)."""


class DivergedError(TrainingError):
    """The loss became NaN/inf; the last good checkpoint is kept."""


# --------------------------------------------------------------------------- modules


def module_key(name: str) -> str | None:
    """Which trainable module key (``language_model`` / ``merger`` / ``vision``) owns a
    parameter name of the base model (``None``: something else)."""
    if name.startswith(LANGUAGE_PREFIXES):
        return "language_model"
    if name.startswith(MERGER_PREFIXES):
        return "merger"
    if name.startswith(VISION_PREFIX):
        return "vision"
    return None


def lora_targets(recipe: Recipe) -> str:
    """The LoRA target regex of a recipe: :data:`LORA_TARGETS`, and with ``lora_merger``
    :data:`LORA_MERGER_TARGETS` too."""
    if not recipe.lora_merger:
        return LORA_TARGETS
    return f"(?:{LORA_TARGETS})|(?:{LORA_MERGER_TARGETS})"


def lora_config(recipe: Recipe) -> Any:
    """The peft ``LoraConfig`` of a LoRA recipe (training, and the check of an init adapter)."""
    from peft import LoraConfig

    return LoraConfig(
        r=recipe.lora_rank,
        lora_alpha=recipe.lora_alpha or 2 * recipe.lora_rank,
        lora_dropout=recipe.lora_dropout,
        target_modules=lora_targets(recipe),
        bias="none",
    )


def apply_trainable(model: Any, recipe: Recipe) -> tuple[Any, list[dict[str, Any]]]:
    """Freeze all but the recipe's parts; returns (model, optimizer param groups).

    Segmenter: the model wrapped by peft with a rank-``lora_rank`` LoRA on
    :func:`lora_targets` (all base weights frozen, the vision encoder never adapted; the
    mergers adapted only with ``lora_merger``). Others: full
    weights of the named modules; the vision encoder gets its own group at ``vision_lr``.
    Groups carry a ``name`` (``main`` / ``vision``). A recipe module that matches no
    parameter of this model is a :class:`TrainingError`.
    """
    names = [n for n, _ in model.named_parameters()]
    for key in recipe.trainable_modules:
        if not any(module_key(n) == key for n in names):
            raise TrainingError(
                f"recipe module {key!r} matches no parameter of {type(model).__name__}"
            )
    for p in model.parameters():
        p.requires_grad_(False)
    if recipe.lora_rank is not None:
        from peft import get_peft_model

        model = get_peft_model(model, lora_config(recipe))
        params = [p for n, p in model.named_parameters() if "lora_" in n]
        for n, p in model.named_parameters():
            p.requires_grad_("lora_" in n)
        return model, [{"name": "main", "params": params, "lr": recipe.lr}]
    main, vision = [], []
    for n, p in model.named_parameters():
        key = module_key(n)
        if key in recipe.trainable_modules:
            p.requires_grad_(True)
            (vision if key == "vision" else main).append(p)
    groups = [{"name": "main", "params": main, "lr": recipe.lr}]
    if vision:
        groups.append({"name": "vision", "params": vision, "lr": recipe.vision_lr})
    return model, groups


def trainable_names(model: Any) -> list[str]:
    """Names of the parameters that require grad, sorted."""
    return sorted(n for n, p in model.named_parameters() if p.requires_grad)


def check_processor(processor: Any, model: Any, where: str) -> None:
    """Refuse a processor that does not belong to ``model`` (tokens, patch geometry)."""
    cfg = model.config
    tok = processor.tokenizer
    problems = []
    vocab = cfg.get_text_config().vocab_size
    if len(tok) > vocab:
        problems.append(f"tokenizer has {len(tok)} tokens, the model embeds {vocab}")
    for attr, token in (
        ("image_token_id", "<|image_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"),
    ):
        want = getattr(cfg, attr, None)
        got = tok.convert_tokens_to_ids(token)
        if want is not None and got != want:
            problems.append(f"{token} is id {got} in the tokenizer, {want} in the model")
    vc = getattr(cfg, "vision_config", None)
    ip = getattr(processor, "image_processor", None)
    if vc is not None and ip is not None:
        if getattr(ip, "patch_size", vc.patch_size) != vc.patch_size:
            problems.append(f"image patch {ip.patch_size} != model patch {vc.patch_size}")
        if getattr(ip, "merge_size", vc.spatial_merge_size) != vc.spatial_merge_size:
            problems.append(f"merge size {ip.merge_size} != model {vc.spatial_merge_size}")
    if problems:
        raise TrainingError(f"{where}: processor does not match the model: " + "; ".join(problems))


# --------------------------------------------------------------------------- data


@dataclass
class Item:
    """One example ready to collate: its rendered text, frames and target token count."""

    example_id: str
    text: str
    images: list[np.ndarray]
    target_ids: list[int]

    @property
    def n_target(self) -> int:
        return len(self.target_ids)


def encode_items(examples: Sequence[Example], processor: Any) -> list[Item]:
    """Render every example the inference way and count its target tokens.

    The target tokens are the tokenisation of ``target + <|im_end|>``; it must be the
    exact suffix of the full sequence's tokens (checked when collating), so the count is
    known before any forward pass.
    """
    from flora.backends.processing import render_prompt, request_to_chat

    items = []
    for ex in examples:
        chat = request_to_chat(ex.to_request(), TRAINING_VISION_INPUT)
        text = render_prompt(processor, chat) + ex.target + END
        ids = processor.tokenizer(ex.target + END, add_special_tokens=False)["input_ids"]
        items.append(Item(ex.example_id, text, chat.images(), list(ids)))
    return items


def collate(items: Sequence[Item], processor: Any, max_length: int | None = None) -> dict:
    """Left-padded batch with ``labels`` on the target tokens only."""
    images = [im for it in items for im in it.images]
    enc = processor(
        text=[it.text for it in items],
        images=images or None,
        padding=True,
        return_tensors="pt",
    )
    enc.pop("token_type_ids", None)
    ids = enc["input_ids"]
    if max_length is not None and ids.shape[1] > max_length:
        raise TrainingError(
            f"example(s) {[it.example_id for it in items]} are {ids.shape[1]} tokens, "
            f"longer than max_length {max_length}"
        )
    labels = torch.full_like(ids, IGNORE)
    for b, it in enumerate(items):
        # Left padding: every row ends at the last position, the target is its suffix.
        tail = ids[b, -it.n_target :]
        if tail.tolist() != it.target_ids:
            raise TrainingError(
                f"example {it.example_id}: the target does not tokenise as a suffix of the "
                "rendered prompt (tokenizer merges across the boundary)"
            )
        labels[b, -it.n_target :] = tail
    enc["labels"] = labels
    return dict(enc)


def summed_ce(model: Any, batch: dict) -> torch.Tensor:
    """Summed token cross-entropy of ``batch``'s labelled tokens (next-token shift)."""
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    logits = model(**inputs).logits
    labels = batch["labels"]
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
        labels[:, 1:].reshape(-1).to(logits.device),
        ignore_index=IGNORE,
        reduction="sum",
    )


def optimizer_step(engine: Any, micro_batches: Iterable[dict], scale: float) -> float:
    """One optimizer step of a DeepSpeed ``engine`` over its micro-batches (this rank's);
    returns their summed token cross-entropy.

    Each micro-batch's summed CE is back-propagated times ``scale`` (the caller's
    normalisation: accumulation × world / target tokens of the global batch), and
    ``engine.step()`` follows every micro-batch — DeepSpeed's contract: it reduces gradients
    and updates the weights only at the accumulation boundary. A non-finite loss on any
    rank raises :class:`DivergedError` (naming the micro-batch) on every rank, before the
    optimizer step, so all ranks stop together with the weights untouched.
    """
    loss_sum = 0.0
    for m, batch in enumerate(micro_batches):
        ce = summed_ce(engine, batch)
        if _all_sum(0.0 if bool(torch.isfinite(ce)) else 1.0) > 0:
            raise DivergedError(f"micro-batch {m}")
        engine.backward(ce * scale)
        engine.step()
        loss_sum += float(ce.detach())
    return loss_sum


def stream_indices(n: int, seed: int, start: int, count: int) -> list[int]:
    """``count`` indices from position ``start`` of the endless stream of epoch permutations."""
    out: list[int] = []
    pos = start
    while len(out) < count:
        epoch, off = divmod(pos, n)
        perm = np.random.default_rng([seed, epoch]).permutation(n)
        take = perm[off : off + count - len(out)]
        out.extend(int(i) for i in take)
        pos += len(take)
    return out


# --------------------------------------------------------------------------- distributed


def _skip_shm_comm_build() -> None:
    """Tell DeepSpeed not to JIT-compile its shared-memory CPU all-reduce op.

    DeepSpeed's comm backend compiles that C++ op on first init under a torch FileBaton
    lock file; a process killed mid-compile leaves the lock behind and every later init
    on the machine waits on it forever (a CI run hung on exactly this). gloo does the
    same all-reduce without it, and GPU runs use nccl, so the op buys nothing here.
    DeepSpeed keeps one ``__compatible_ops__`` dict precisely so edits to it hold.
    """
    import deepspeed.ops
    from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder

    deepspeed.ops.__compatible_ops__[ShareMemCommBuilder.NAME] = False


def init_distributed(local_rank: int | None = None) -> tuple[int, int]:
    """Initialise torch.distributed (gloo on CPU, nccl on GPU); returns (rank, world).

    In-process (no launcher env): a one-rank group on 127.0.0.1, its store on port 0 (the
    OS picks a free port when the store binds; no other rank has to find it, and a port
    chosen beforehand and then closed could be taken by a parallel run in between). Under
    the ``deepspeed`` launcher / torchrun the env (RANK, WORLD_SIZE, MASTER_*) is used.
    """
    import deepspeed
    import torch.distributed as dist

    _skip_shm_comm_build()
    if not dist.is_initialized():
        if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
            os.environ.update(
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT="0",
                RANK="0",
                WORLD_SIZE="1",
                LOCAL_RANK="0",
            )
        if local_rank is not None:
            os.environ["LOCAL_RANK"] = str(local_rank)
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        deepspeed.init_distributed(dist_backend=backend, verbose=False)
    return dist.get_rank(), dist.get_world_size()


def _all_sum(x: float) -> float:
    import torch.distributed as dist

    t = torch.tensor([x], dtype=torch.float64)
    if torch.cuda.is_available() and dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t)
    return float(t.item())


def _barrier() -> None:
    import torch.distributed as dist

    dist.barrier()


def deepspeed_config(recipe: Recipe, world: int, hidden: int) -> dict[str, Any]:
    """The recipe's ZeRO config with every ``"auto"`` field filled."""
    name = "zero3.json" if recipe.zero_stage == 3 else "zero2.json"
    cfg = json.loads((DEEPSPEED_DIR / name).read_text())
    cfg["train_micro_batch_size_per_gpu"] = recipe.micro_batch
    cfg["gradient_accumulation_steps"] = recipe.grad_accum
    cfg["train_batch_size"] = recipe.micro_batch * recipe.grad_accum * world
    cfg["gradient_clipping"] = recipe.max_grad_norm
    cfg["bf16"] = {"enabled": bool(torch.cuda.is_available())}  # fp32 on CPU
    zo = cfg["zero_optimization"]
    zo["stage"] = recipe.zero_stage
    for k, v in {
        "stage3_param_persistence_threshold": 10 * hidden,
        "stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
        "reduce_bucket_size": hidden * hidden,
    }.items():
        if zo.get(k) == "auto":
            zo[k] = max(v, 1)
    left = [k for k, v in _walk(cfg) if v == "auto"]
    if left:
        raise TrainingError(f"DeepSpeed config {name}: unfilled 'auto' fields {left}")
    return cfg


def prepare_model(model: Any, recipe: Recipe) -> tuple[Any, list[dict[str, Any]]]:
    """The recipe's training form of a loaded model: gradient checkpointing when the recipe
    asks for it (non-reentrant, no KV cache), then :func:`apply_trainable`."""
    if recipe.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    return apply_trainable(model, recipe)


def deepspeed_engine(
    model: Any, groups: list[dict[str, Any]], recipe: Recipe, world: int, total_steps: int
) -> tuple[Any, Any, Any]:
    """(engine, optimizer, scheduler): AdamW over the trainable ``groups`` (each at its own
    learning rate, the recipe's weight decay), the recipe's schedule over ``total_steps``,
    wrapped by DeepSpeed with :func:`deepspeed_config`."""
    import deepspeed

    opt_groups = [
        {"params": g["params"], "lr": g["lr"], "weight_decay": recipe.weight_decay} for g in groups
    ]
    optimizer = torch.optim.AdamW(opt_groups, lr=recipe.lr, weight_decay=recipe.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(recipe, total_steps))
    hidden = model.config.get_text_config().hidden_size
    engine, optimizer, _, scheduler = deepspeed.initialize(
        model=model,
        optimizer=optimizer,
        lr_scheduler=scheduler,
        config=deepspeed_config(recipe, world, hidden),
    )
    return engine, optimizer, scheduler


def _walk(d: dict, prefix: str = "") -> Iterator[tuple[str, Any]]:
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _walk(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def lr_lambda(recipe: Recipe, total_steps: int):
    """Warmup then constant / cosine / linear decay (multiplier of each group's lr)."""

    def f(step: int) -> float:
        if recipe.warmup_steps and step < recipe.warmup_steps:
            return (step + 1) / recipe.warmup_steps
        if recipe.scheduler == "constant":
            return 1.0
        span = max(1, total_steps - recipe.warmup_steps)
        frac = min(1.0, (step - recipe.warmup_steps) / span)
        if recipe.scheduler == "linear":
            return 1.0 - frac
        return 0.5 * (1.0 + math.cos(math.pi * frac))

    return f


# --------------------------------------------------------------------------- checkpoints


def _sha256(p: Path) -> str:
    h = hashlib.sha256()
    with p.open("rb") as f:
        for chunk in iter(lambda: f.read(8 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _files(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): _sha256(p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != CHECKPOINT_MANIFEST
    }


def verify_checkpoint(
    ckpt: Path, *, model: str, recipe_digest: str, base_id: str, world_size: int | None = None
) -> dict:
    """The checkpoint's manifest if it may be resumed from; else :class:`CheckpointError`.

    ``world_size`` (when given) must be the one that wrote it: the data order and the
    per-rank RNG and optimizer state assume the same number of ranks."""
    ckpt = Path(ckpt)
    man_path = ckpt / CHECKPOINT_MANIFEST
    if not ckpt.is_dir():
        raise CheckpointError(f"checkpoint {ckpt} does not exist")
    if not man_path.is_file():
        raise CheckpointError(
            f"checkpoint {ckpt} has no {CHECKPOINT_MANIFEST}: not written by flora SFT "
            "(foreign) or interrupted while saving"
        )
    try:
        man = json.loads(man_path.read_text())
    except ValueError as e:
        raise CheckpointError(f"checkpoint {ckpt}: unreadable manifest: {e}") from e
    if man.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"checkpoint {ckpt}: format {man.get('format')!r} is not ours")
    if man.get("model") != model:
        raise CheckpointError(f"checkpoint {ckpt} trains {man.get('model')!r}, not {model!r}")
    if man.get("recipe_digest") != recipe_digest:
        raise CheckpointError(f"checkpoint {ckpt} was written under another recipe")
    if man.get("base") != base_id:
        raise CheckpointError(f"checkpoint {ckpt} is of base {man.get('base')!r}, not {base_id!r}")
    if world_size is not None and man.get("world_size") != world_size:
        raise CheckpointError(
            f"checkpoint {ckpt} was written by world size {man.get('world_size')}, this run "
            f"has world size {world_size}: resume it with the same number of ranks"
        )
    files = man.get("files") or {}
    got = _files(ckpt)
    for rel, digest in files.items():
        if rel not in got:
            raise CheckpointError(f"checkpoint {ckpt} is corrupt: {rel} is missing")
        if got[rel] != digest:
            raise CheckpointError(f"checkpoint {ckpt} is corrupt: {rel} does not match its sha256")
    return man


def _step_dirs(root: Path) -> list[tuple[int, Path]]:
    """``(step, folder)`` of every ``step<N>`` folder under ``root``, by step."""
    if not root.is_dir():
        return []
    return sorted((int(p.name[4:]), p) for p in root.glob("step*") if p.name[4:].isdigit())


def _manifest(ckpt: Path) -> dict[str, Any] | None:
    try:
        man = json.loads((ckpt / CHECKPOINT_MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return man if isinstance(man, dict) else None


def latest_checkpoint(root: Path) -> Path | None:
    """The highest-step complete ``step*`` checkpoint under ``root`` (one with its manifest).

    A ``step*`` folder without a manifest (foreign, or cut off while saving by a trainer
    that saved in place) is skipped, so a retry resumes from the last complete checkpoint;
    resuming from such a folder by its path is refused by :func:`verify_checkpoint`.
    """
    done = [p for _, p in _step_dirs(root) if (p / CHECKPOINT_MANIFEST).is_file()]
    return done[-1] if done else None


# --------------------------------------------------------------------------- the trainer


@dataclass
class SFTResult:
    """What a run produced."""

    model: str
    output_dir: Path
    model_dir: Path | None
    steps: int
    last_loss: float
    best_eval_loss: float | None
    stopped_early: bool
    history: list[dict[str, float]] = field(default_factory=list)
    run_id: str | None = None
    registered_version: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["output_dir"] = str(self.output_dir)
        d["model_dir"] = str(self.model_dir) if self.model_dir else None
        return d


def _git_commit() -> str:
    import subprocess

    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _rng_state() -> dict[str, Any]:
    """This rank's generators; on a GPU its device's too (dropout there draws from it)."""
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }


def _set_rng_state(s: dict[str, Any]) -> None:
    torch.set_rng_state(s["torch"])
    # Absent from checkpoints written before it was saved, None from a CPU run.
    if s.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(s["cuda"])
    np.random.set_state(s["numpy"])
    random.setstate(s["python"])


def _load_examples(set_path: Path, model: str) -> tuple[list[Example], list[Example]]:
    try:
        train = load_set(set_path, split="train")
        held = load_set(set_path, split="heldout")
    except SetError as e:
        raise TrainingError(str(e)) from e
    wrong = sorted({e.model for e in train + held} - {model})
    if wrong:
        raise TrainingError(f"set {set_path} holds examples of {wrong}, not only {model!r}")
    if not train:
        fails = set_failures(set_path)
        why = (
            (
                f"; {len(fails)} item(s) failed to build, e.g. {fails.iloc[0].episode_id} "
                f"{fails.iloc[0].item}: {fails.iloc[0].reason}"
            )
            if len(fails)
            else ""
        )
        raise TrainingError(f"set {set_path} has no train examples{why}")
    return train, held


def train_sft(
    recipe: Recipe | str | Path,
    set_path: str | Path,
    output_dir: str | Path,
    *,
    resume: bool | str | Path = False,
    max_steps: int | None = None,
    local_rank: int | None = None,
    log_mlflow: bool = True,
    register: bool = False,
    system_metrics: bool = True,
    progress: bool = True,
    base_cache: Path | None = None,
) -> SFTResult:
    """Run SFT of ``recipe.model`` on the set at ``set_path``; outputs under ``output_dir``.

    ``output_dir/checkpoints/step<N>`` holds resumable checkpoints, ``output_dir/model``
    the final exported model (full weights or a PEFT adapter plus its base), written to a
    temporary folder and renamed. ``resume``: ``True`` (latest checkpoint under
    ``output_dir``) or a checkpoint path. ``max_steps`` overrides the recipe's stop step
    (the schedule still follows the recipe, so a cut run resumes identically).
    """
    from tqdm.auto import tqdm
    from transformers import AutoModelForImageTextToText

    from flora.backends.processing import load_processor
    from flora.backends.transformers_backend import fingerprint_dir
    from training.sizes import check_family, resolve_base

    recipe = recipe if isinstance(recipe, Recipe) else load_recipe(recipe)
    set_path = Path(set_path)
    out = Path(output_dir)
    for d in (out / "best", out / "model"):
        check_model_out(d)  # refuse a user's folder there before any training
    ckpt_root = out / "checkpoints"
    earlier = _step_dirs(ckpt_root)
    continues = resume is True or (
        bool(resume) and Path(resume).resolve().parent == ckpt_root.resolve()
    )
    if earlier and not continues:
        # A new run (or one resumed from elsewhere) would prune or overwrite them as its own:
        # someone's checkpoints are never deleted.
        raise TrainingError(
            f"{ckpt_root} already holds checkpoints of another run "
            f"({', '.join(p.name for _, p in earlier)}): resume it, or train into another "
            "output folder (delete them yourself if they are disposable)"
        )
    rank, world = init_distributed(local_rank)
    torch.manual_seed(recipe.seed)
    np.random.seed(recipe.seed)
    random.seed(recipe.seed)

    train, held = _load_examples(set_path, recipe.model)
    try:
        base_dir = resolve_base(
            recipe.base, seed=recipe.base_seed, cache=base_cache, max_pixels=recipe.max_pixels
        )
    except (FileNotFoundError, ValueError) as e:
        raise TrainingError(f"recipe {recipe.model}-{recipe.size}: missing base: {e}") from e
    try:
        check_family(recipe.family, base_dir, f"recipe {recipe.model}-{recipe.size}")
    except ValueError as e:
        raise TrainingError(str(e)) from None
    base_id = f"{recipe.base}@{fingerprint_dir(base_dir)[:16]}"
    init = resolve_init(recipe, base_id)
    processor = load_processor(base_dir, "images")
    device = torch.device(
        f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if torch.cuda.is_available() else "cpu"
    )
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(recipe.seed)  # LoRA init is seeded, independent of the caller
        weights = init.weights if init and init.kind == "full" else base_dir
        model = AutoModelForImageTextToText.from_pretrained(str(weights), dtype=dtype)
        check_processor(processor, model, str(base_dir))
        model, groups = prepare_model(model, recipe)
        if init and init.kind == "lora":
            load_init_adapter(model, init)
    model.train()

    train_items = encode_items(train, processor)
    eval_pool = sft_eval_pool(held, recipe)
    eval_items = encode_items(eval_pool, processor)
    # What the export records once the held-out loss has chosen between states (two or
    # more evaluations): training.lineage.trained_episodes then counts these episodes as
    # seen, so no evaluation scores the model on the episodes that selected it.
    selection = {"episodes": sorted({e.episode_id for e in eval_pool}), "metric": "eval_loss"}
    gb = recipe.micro_batch * recipe.grad_accum * world
    total_steps = recipe.max_steps or math.ceil(recipe.epochs * len(train_items) / gb)
    if recipe.max_steps is not None:
        total_steps = min(total_steps, recipe.max_steps)
    stop_at = min(total_steps, max_steps) if max_steps else total_steps

    engine, optimizer, scheduler = deepspeed_engine(model, groups, recipe, world, total_steps)

    step, best, bad_evals, history = 0, None, 0, []
    evals, best_step = 0, None  # held-out evaluations so far, and the step of the best one
    if resume:
        ckpt = latest_checkpoint(ckpt_root) if resume is True else Path(resume)
        if ckpt is None:
            raise CheckpointError(f"--resume: no checkpoint under {ckpt_root}")
        man = verify_checkpoint(
            ckpt,
            model=recipe.model,
            recipe_digest=recipe.digest(),
            base_id=base_id,
            world_size=world,
        )
        _, client = engine.load_checkpoint(
            str(ckpt.parent),
            tag=ckpt.name,
            load_optimizer_states=True,
            load_lr_scheduler_states=True,
        )
        if client is None:
            raise CheckpointError(f"checkpoint {ckpt}: DeepSpeed could not load it")
        step, best, bad_evals = client["step"], client["best"], client["bad_evals"]
        # A checkpoint written before these were kept: assume its best was chosen (more
        # held-out episodes left out of evaluation, never a leak).
        evals = client.get("evals", 2 if best is not None else 0)
        best_step = client.get("best_step")
        history = list(client.get("history", []))
        _set_rng_state(client["rng"][rank] if rank < len(client["rng"]) else client["rng"][0])
        assert step == man["step"]

    mlf = _MLflow(recipe, set_path, base_dir, base_id, rank, log_mlflow, system_metrics, init)
    last_loss = float("nan")
    stopped_early = False
    bar = tqdm(
        total=stop_at,
        initial=step,
        desc=f"sft {recipe.model}",
        unit="step",
        disable=not progress or rank != 0,
    )
    try:
        mlf.start()
        while step < stop_at:
            t0 = time.perf_counter()
            batch_idx = stream_indices(len(train_items), recipe.seed, step * gb, gb)
            per_rank = recipe.micro_batch * recipe.grad_accum
            mine = batch_idx[rank * per_rank : (rank + 1) * per_rank]
            local_count = sum(train_items[i].n_target for i in mine)
            count = _all_sum(float(local_count))
            scale = recipe.grad_accum * world / count
            micro_batches = (
                {
                    k: v.to(device) if hasattr(v, "to") else v
                    for k, v in collate(
                        [train_items[i] for i in mine[m : m + recipe.micro_batch]],
                        processor,
                        recipe.max_length,
                    ).items()
                }
                for m in range(0, per_rank, recipe.micro_batch)
            )
            try:
                loss_sum = optimizer_step(engine, micro_batches, scale)
            except DivergedError as e:
                raise DivergedError(
                    f"{recipe.model}: loss is not finite at step {step + 1} ({e}); stopped "
                    f"before the optimizer step, last good checkpoint: "
                    f"{latest_checkpoint(ckpt_root) or 'none'}"
                ) from None
            loss = _all_sum(loss_sum) / count
            if engine.global_steps != step + 1:
                raise TrainingError(
                    f"DeepSpeed took {engine.global_steps} optimizer steps, expected {step + 1}"
                )
            step += 1
            last_loss = loss
            dt = time.perf_counter() - t0
            gn = engine.get_global_grad_norm()
            rec = {
                "step": step,
                "loss": loss,
                "lr": float(scheduler.get_last_lr()[0]),
                "grad_norm": float(gn) if gn is not None else float("nan"),
                "target_tokens_per_s": count / dt,
                "target_tokens": count,
            }
            history.append({"step": step, "loss": loss, "grad_norm": rec["grad_norm"]})
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.4f}")
            if step % recipe.eval_every == 0 or step == stop_at:
                if eval_items:
                    ev = evaluate_loss(engine, eval_items, processor, recipe, rank, world, device)
                    if not math.isfinite(ev):  # a NaN first eval became "best", was exported
                        raise DivergedError(
                            f"{recipe.model}: held-out loss is not finite at step {step}; "
                            "nothing saved or exported from it, last good checkpoint: "
                            f"{latest_checkpoint(ckpt_root) or 'none'}"
                        )
                    rec["eval_loss"] = ev
                    evals += 1
                    if best is None or ev < best:
                        best, best_step, bad_evals = ev, step, 0
                        # The first evaluation alone chooses nothing (the state is the
                        # last); from the second on the held-out loss picks the export.
                        chosen = _selected_on(selection, best_step, best) if evals > 1 else None
                        _export(engine, recipe, base_dir, base_id, out / "best", rank,
                                set_path, init, selected_on=chosen)  # fmt: skip
                    else:
                        bad_evals += 1
                        # The kept state now won over a later one: record what chose it.
                        _record_selection(out / "best", _selected_on(selection, best_step, best),
                                          rank)  # fmt: skip
            mlf.log_step(rec)
            # Also when a run is cut short of the recipe's schedule, so it can be resumed.
            if step < total_steps and (step % recipe.checkpoint_every == 0 or step == stop_at):
                _save_checkpoint(
                    engine,
                    ckpt_root,
                    step,
                    recipe,
                    base_id,
                    rank,
                    world,
                    {
                        "step": step,
                        "best": best,
                        "bad_evals": bad_evals,
                        "history": history,
                        "evals": evals,
                        "best_step": best_step,
                    },
                )
            if eval_items and bad_evals >= recipe.patience:
                stopped_early = True
                break
        bar.close()
        # The final model: the best held-out state when there was an eval, else the last.
        final = out / "model"
        if best is not None and (out / "best").is_dir():
            if rank == 0:
                _replace(out / "best", final)
        else:
            _export(engine, recipe, base_dir, base_id, final, rank, set_path, init)
        _barrier()
        result = SFTResult(recipe.model, out, final, step, last_loss, best, stopped_early, history)
        mlf.finish(result, final, register)
        return result
    except BaseException:
        bar.close()
        mlf.fail()
        raise


def sft_eval_pool(held: Sequence[Example], recipe: Recipe) -> list[Example]:
    """The held-out examples whose loss chooses SFT's exported state (and stops it early):
    the set's *last* ``recipe.eval_examples`` held-out examples (all when unset), never
    from the first held-out episode when there are two or more.

    Evaluation reports take whole held-out episodes from the front
    (:func:`training.evaluate.heldout_examples`), and the export records the pool's
    episodes (``selected_on``) once they chose, so no evaluation scores the model on them;
    keeping the first episode out of the pool leaves evaluation at least one episode (the
    demo's sets hold out two). On a large set the last examples never reach it, so the pool
    is what it always was."""
    first = held[0].episode_id if held else None
    rest = [e for e in held if e.episode_id != first]
    pool = rest if rest else list(held)
    return list(pool[-recipe.eval_examples :] if recipe.eval_examples else pool)


def _selected_on(selection: dict[str, Any], step: int | None, value: float) -> dict[str, Any]:
    """``selected_on`` of an export (GRPO's format): the episodes, metric, kept step, value."""
    return {**selection, "kept_step": step, "value": float(value)}


def _record_selection(dst: Path, selected_on: dict[str, Any], rank: int) -> None:
    """Add ``selected_on`` to the export at ``dst`` (its manifest only: ``files`` does not
    hash the manifest), written to a temporary file and renamed."""
    if rank == 0 and (dst / MODEL_MANIFEST).is_file():
        man = read_model_manifest(dst)
        if man.get("selected_on") != selected_on:
            man["selected_on"] = selected_on
            tmp = dst / f".{MODEL_MANIFEST}.tmp{os.getpid()}"
            tmp.write_text(json.dumps(man, indent=2, sort_keys=True, default=str))
            tmp.replace(dst / MODEL_MANIFEST)
    _barrier()


def evaluate_loss(
    engine: Any,
    items: Sequence[Item],
    processor: Any,
    recipe: Recipe,
    rank: int,
    world: int,
    device: torch.device,
) -> float:
    """Token-level held-out loss (summed CE / target tokens), sharded over ranks."""
    engine.eval()
    ce_sum, n = 0.0, 0
    with torch.no_grad():
        mine = list(items)[rank::world]
        for i in range(0, len(mine), recipe.micro_batch):
            chunk = mine[i : i + recipe.micro_batch]
            batch = {
                k: v.to(device) if hasattr(v, "to") else v
                for k, v in collate(chunk, processor, recipe.max_length).items()
            }
            ce_sum += float(summed_ce(engine, batch))
            n += sum(it.n_target for it in chunk)
    engine.train()
    return _all_sum(ce_sum) / max(_all_sum(float(n)), 1.0)


def _save_checkpoint(
    engine: Any,
    root: Path,
    step: int,
    recipe: Recipe,
    base_id: str,
    rank: int,
    world: int,
    client: dict[str, Any],
) -> Path:
    import torch.distributed as dist

    tag = f"step{step}"
    ckpt = root / tag
    # Saved under a temporary name (the same on every rank) and renamed into place once its
    # manifest is written: a run killed while saving leaves no step* folder behind.
    partial = f".{tag}.partial"
    if rank == 0 and (root / partial).exists():
        shutil.rmtree(root / partial)  # left by a run killed while saving this step
    _barrier()
    rngs: list[Any] = [None] * world
    dist.all_gather_object(rngs, _rng_state())
    engine.save_checkpoint(
        str(root), tag=partial, client_state={**client, "rng": rngs}, save_latest=False
    )
    _barrier()
    if rank == 0:
        man = {
            "format": CHECKPOINT_FORMAT,
            "model": recipe.model,
            "step": step,
            "recipe_digest": recipe.digest(),
            "base": base_id,
            "world_size": world,
            "files": _files(root / partial),
        }
        (root / partial / CHECKPOINT_MANIFEST).write_text(json.dumps(man, indent=2, sort_keys=True))
        replaced = root / f".{tag}.old"
        if ckpt.exists():  # this run's own, from before the checkpoint it resumed
            ckpt.rename(replaced)
        (root / partial).rename(ckpt)
        shutil.rmtree(replaced, ignore_errors=True)
        (root / "latest").write_text(tag)  # DeepSpeed's pointer (its zero_to_fp32 reads it)
        # Only this run's older checkpoints go (same model, recipe and base, lower step);
        # a later step or another run's folder is never pruned.
        older = [
            p
            for n, p in _step_dirs(root)
            if n < step
            and (m := _manifest(p)) is not None
            and all(m.get(k) == man[k] for k in ("model", "recipe_digest", "base"))
        ]
        for p in older[: max(0, len(older) - (recipe.keep_checkpoints - 1))]:
            shutil.rmtree(p, ignore_errors=True)
    _barrier()
    return ckpt


def check_model_out(dst: str | Path) -> bool:
    """True when ``dst`` holds a model Flora exported (its ``flora_model.json``; replaced by
    the next export), False when free. Anything else there — a dataset, an unrelated folder,
    a file — raises :class:`flora.safety.OutputDirError`: training never deletes it."""
    from flora.safety import ensure_own_output_dir

    hint = "delete it yourself if it is disposable"
    return ensure_own_output_dir(dst, "model", markers=(MODEL_MANIFEST,), hint=hint)


def _replace(src: Path, dst: Path) -> None:
    check_model_out(dst)  # right before moving it aside: only an earlier model goes
    tmp = dst.parent / f".{dst.name}.old{os.getpid()}"
    if dst.exists():
        dst.rename(tmp)
    shutil.copytree(src, dst.parent / f".{dst.name}.new{os.getpid()}")
    (dst.parent / f".{dst.name}.new{os.getpid()}").rename(dst)
    shutil.rmtree(tmp, ignore_errors=True)


def _export(
    engine: Any,
    recipe: Recipe,
    base_dir: Path,
    base_id: str,
    dst: Path,
    rank: int,
    set_path: Path,
    init: InitWeights | None = None,
    *,
    selected_on: dict[str, Any] | None = None,
) -> None:
    """Write the model (adapter + base, or full weights + processor) to ``dst`` atomically.

    ``selected_on``: the held-out episodes that chose this state (GRPO's probe, SFT's
    held-out loss), recorded so that evaluation leaves them out
    (:func:`training.lineage.trained_episodes`)."""
    module = engine.module
    state = None
    if recipe.zero_stage == 3:
        state = engine._zero3_consolidated_16bit_state_dict()  # every rank must call it
    if rank == 0:
        tmp = dst.parent / f".{dst.name}.tmp{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        if recipe.lora_rank is not None:
            module.save_pretrained(tmp / "adapter", state_dict=state, safe_serialization=True)
            if Path(recipe.base).exists() or recipe.base in ("tiny", "small"):
                shutil.copytree(base_dir, tmp / "base")
            kind = "lora"
        else:
            shutil.copytree(
                base_dir,
                tmp / "model",
                ignore=shutil.ignore_patterns("*.safetensors", "*.bin", "*.safetensors.index.json"),
            )
            module.save_pretrained(tmp / "model", state_dict=state, safe_serialization=True)
            kind = "full"
        man = {
            "format": MODEL_FORMAT,
            "model": recipe.model,
            "kind": kind,
            "size": recipe.size,
            "base": recipe.base,
            "base_id": base_id,
            "recipe": recipe.model_dump(mode="json"),
            "set": str(set_path),
            "set_manifest": read_manifest(set_path),
            "git_commit": _git_commit(),
            # Served the way it was trained (flora.backends.processing.trained_vision_input).
            "vision_input": TRAINING_VISION_INPUT,
        }
        if init is not None:
            man["init_from"] = {**init.lineage(), **init.ancestry}
        base_lineage = base_ancestry(base_dir)
        if base_lineage is not None:
            man["base_lineage"] = base_lineage
        if selected_on is not None:
            man["selected_on"] = selected_on
        man["files"] = {
            p.relative_to(tmp).as_posix(): _sha256(p) for p in sorted(tmp.rglob("*")) if p.is_file()
        }
        (tmp / MODEL_MANIFEST).write_text(json.dumps(man, indent=2, sort_keys=True, default=str))
        old = dst.parent / f".{dst.name}.old{os.getpid()}"
        check_model_out(dst)  # the run's own model only (train_sft checked it at start too)
        if dst.exists():
            dst.rename(old)
        tmp.rename(dst)
        shutil.rmtree(old, ignore_errors=True)
    _barrier()


@dataclass(frozen=True)
class InitWeights:
    """Exported weights that start SFT (recipe ``init_from``), verified: full weights, or
    the adapter a LoRA recipe continues."""

    root: Path
    weights: Path  # the HF model folder (full) or the adapter folder (lora) inside the export
    sha256: str  # of its model.safetensors / adapter_model.safetensors
    source_git_commit: str
    kind: str = "full"  # "lora": the adapter continues training over the recipe's base
    # {"train_episodes": [...]} of this export's whole lineage, read when the weights were
    # resolved (the start of training), so the next export records it even if this folder
    # is gone by then; {} when that lineage is unknown.
    ancestry: dict[str, list[str]] = field(default_factory=dict)

    def lineage(self) -> dict[str, str]:
        return {"path": str(self.root), "sha256": self.sha256,
                "git_commit": self.source_git_commit}  # fmt: skip


def init_path(init_from: str) -> Path:
    """A recipe's ``init_from`` folder: as given, else relative to the repository root."""
    from training.sizes import repo_path

    return repo_path(init_from)


def resolve_init(recipe: Recipe, base_id: str) -> InitWeights | None:
    """The verified export named by ``recipe.init_from`` (None when unset).

    A full fine-tune starts from full weights; a LoRA recipe (segmenter) continues an
    exported adapter of the same rank, alpha and target modules. A relative path is tried
    from the working directory, then from the repository root (the released ``models/``
    live there). Refused with the reason: not an intact Flora export, another model's
    weights, the other kind of weights, another LoRA shape, or weights of a different base
    (architecture or tokenizer), which would load with mismatched shapes or token ids.
    """
    if recipe.init_from is None:
        return None
    p = init_path(recipe.init_from)
    where = f"recipe {recipe.model}-{recipe.size}: init_from {recipe.init_from!r}"
    if not p.is_dir():
        raise TrainingError(f"{where}: no such directory")
    try:
        man = verify_model_dir(p)
    except TrainingError as e:
        raise TrainingError(f"{where}: {e}") from None
    if man.get("model") != recipe.model:
        raise TrainingError(f"{where}: holds a {man.get('model')} model, not a {recipe.model}")
    kind = "full" if recipe.lora_rank is None else "lora"
    if man.get("kind") != kind:
        raise TrainingError(f"{where}: holds {man.get('kind')} weights, not {kind} weights")
    if man.get("base_id") != base_id:
        raise TrainingError(
            f"{where}: trained over base {man.get('base_id')}, the recipe's base is {base_id}"
        )
    if kind == "lora":
        _check_adapter_shape(p / "adapter", recipe, where)
    return export_weights(p, man)


def _ancestor_episodes(root: Path) -> dict[str, list[str]]:
    """``{"train_episodes": [...]}``: every episode the model at ``root`` and its own
    lineage trained on, written into the new export so that evaluating it never needs the
    ancestor on disk (another machine, another pod); ``{}`` when that lineage is unknown
    (then :func:`training.lineage.trained_episodes` follows the path, or refuses)."""
    from training.lineage import trained_episodes

    try:
        return {"train_episodes": sorted(trained_episodes(root))}
    except (TrainingError, OSError, ValueError):
        return {}


def base_ancestry(base_dir: str | Path) -> dict[str, Any] | None:
    """The lineage of a base that is a folder of a Flora export (a released model's
    ``model/``, an export's ``base/``): ``{"path", "train_episodes"}``, the latter absent
    when that export's lineage is unknown. ``None`` for a built or hub base, which learnt
    nothing from the toy world.

    A model trained over such a base must not be scored on the episodes the base learnt
    from, so its export records them (:func:`training.lineage.trained_episodes`). For an
    export's ``base/`` this is the whole export's lineage, a superset of the base's own:
    more held-out episodes left out, never a leak.
    """
    root = Path(base_dir).resolve().parent
    if not (root / MODEL_MANIFEST).is_file():
        return None
    return {"path": str(root), **_ancestor_episodes(root)}


def read_model_manifest(path: str | Path) -> dict[str, Any]:
    """An export's ``flora_model.json``, read without re-hashing its files (for a model a
    caller has already verified)."""
    return json.loads((Path(path) / MODEL_MANIFEST).read_text())


def export_weights(path: str | Path, manifest: dict[str, Any]) -> InitWeights:
    """The weights of a verified export (``manifest``: its ``flora_model.json``), as the
    lineage a model trained from them records (``init_from``), its ancestors' training
    episodes read now."""
    p = Path(path).resolve()
    kind = str(manifest.get("kind"))
    sub, weights = ("model", "model.safetensors") if kind == "full" else (
        "adapter", "adapter_model.safetensors")  # fmt: skip
    digest = manifest["files"].get(f"{sub}/{weights}", "")  # verified: files is a dict
    return InitWeights(p, p / sub, digest, str(manifest.get("git_commit", "")), kind,
                       _ancestor_episodes(p))  # fmt: skip


def _check_adapter_shape(adapter: Path, recipe: Recipe, where: str) -> None:
    """The exported adapter has the recipe's LoRA rank, alpha and target modules."""
    try:
        cfg = json.loads((adapter / "adapter_config.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise TrainingError(f"{where}: unreadable adapter_config.json ({e})") from None
    lc = lora_config(recipe)
    want = {"r": lc.r, "lora_alpha": lc.lora_alpha, "target_modules": lc.target_modules}
    got = {"r": cfg.get("r"), "lora_alpha": cfg.get("lora_alpha"),
           "target_modules": cfg.get("target_modules")}  # fmt: skip
    diff = [f"{k} {got[k]} (recipe: {want[k]})" for k in want if got[k] != want[k]]
    if diff:
        raise TrainingError(f"{where}: the adapter has {', '.join(diff)}")


def load_init_adapter(model: Any, init: InitWeights) -> None:
    """Put an exported adapter's weights into the freshly wrapped LoRA ``model``; every
    LoRA parameter must be filled, nothing may be left over."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    state = load_file(str(init.weights / "adapter_model.safetensors"))
    res = set_peft_model_state_dict(model, state)
    lora = [n for n, _ in model.named_parameters() if "lora_" in n]
    unfilled = [n for n in res.missing_keys if "lora_" in n]
    if res.unexpected_keys or unfilled or len(state) != len(lora):
        raise TrainingError(
            f"init_from {init.root}: the adapter does not fit this model "
            f"({len(res.unexpected_keys)} unexpected, {len(unfilled)} LoRA weights unfilled)"
        )


def model_paths(model_dir: str | Path) -> tuple[Path | str, Path | None]:
    """(model path or hub id, adapter path or None) of an exported model, for backends."""
    root = Path(model_dir)
    man = verify_model_dir(root)
    if man["kind"] == "lora":
        base = root / "base" if (root / "base").is_dir() else man["base"]
        return base, root / "adapter"
    return root / "model", None


def verify_model_dir(root: str | Path) -> dict[str, Any]:
    """The exported model's manifest after checking every file's sha256 (complete, intact)."""
    root = Path(root)
    mp = root / MODEL_MANIFEST
    if not mp.is_file():
        raise TrainingError(f"{root} is not an exported flora model (no {MODEL_MANIFEST})")
    try:
        man = json.loads(mp.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TrainingError(f"{root}: {MODEL_MANIFEST} is not valid JSON ({e})") from None
    files = man.get("files") if isinstance(man, dict) else None
    # Every export lists its files: an empty or missing list would verify nothing.
    if not isinstance(files, dict) or not files:
        raise TrainingError(f"{root}: {MODEL_MANIFEST} lists no files to verify")
    for rel, digest in files.items():
        p = root / rel
        if not p.is_file() or _sha256(p) != digest:
            raise TrainingError(f"{root}: {rel} is missing or does not match its sha256")
    return man


# --------------------------------------------------------------------------- MLflow


class _MLflow:
    """Rank-0 MLflow logging of one SFT run (no-op on other ranks or when disabled)."""

    def __init__(
        self,
        recipe: Recipe,
        set_path: Path,
        base_dir: Path,
        base_id: str,
        rank: int,
        enabled: bool,
        system_metrics: bool,
        init: InitWeights | None = None,
    ) -> None:
        self.init = init
        self.recipe, self.set_path, self.base_dir, self.base_id = (
            recipe,
            set_path,
            base_dir,
            base_id,
        )
        self.on = enabled and rank == 0
        self.system_metrics = system_metrics
        self._cm: contextlib.AbstractContextManager | None = None
        self.run_id: str | None = None

    def lineage(self) -> dict[str, str]:
        man = read_manifest(self.set_path)
        return {
            "flora.git_commit": _git_commit(),
            "flora.data.md5": str(man.get("dataset_md5", "")),
            "flora.set.run_id": str(man.get("mlflow_run_id", "")),
            "flora.set.sha256": str(man.get("sha256", "")),
            "flora.recipe": f"{self.recipe.model}-{self.recipe.size}",
            "flora.recipe.digest": self.recipe.digest(),
            "flora.base": self.recipe.base,
            "flora.base_id": self.base_id,
            **(
                {f"flora.init_from.{k}": v for k, v in self.init.lineage().items()}
                if self.init
                else {}
            ),
        }

    def start(self) -> None:
        if not self.on:
            return
        import importlib.util

        import mlflow

        from flora.tracking import mlflow_run

        if self.system_metrics and importlib.util.find_spec("psutil"):
            mlflow.enable_system_metrics_logging()
        self._cm = mlflow_run(
            f"sft-{self.recipe.model}",
            self.lineage(),
            experiment=f"flora-train-{self.recipe.model}",
        )
        run = self._cm.__enter__()
        self.run_id = run.info.run_id
        mlflow.log_params(self.recipe.flat())

    def log_step(self, rec: dict[str, float]) -> None:
        if not self.on:
            return
        import mlflow

        mlflow.log_metrics({k: v for k, v in rec.items() if k != "step"}, step=int(rec["step"]))

    def finish(self, result: SFTResult, model_dir: Path, register: bool) -> None:
        result.run_id = self.run_id
        if not self.on:
            return
        import mlflow

        from model_registry.register import log_flora_model, register_model

        try:
            mlflow.log_metrics({"final.steps": result.steps, "final.loss": result.last_loss})
            if result.best_eval_loss is not None:
                mlflow.log_metric("final.best_eval_loss", result.best_eval_loss)
            mlflow.set_tag("flora.stopped_early", str(result.stopped_early))
            uri = log_flora_model(model_dir)
            if register:
                result.registered_version = register_model(
                    self.recipe.model, uri, self.run_id, tags=self.lineage()
                )
        except BaseException:
            self.fail()
            raise
        self._close(None)

    def fail(self) -> None:
        if self._cm is not None:
            import sys

            self._close(sys.exc_info())

    def _close(self, exc: Any) -> None:
        cm, self._cm = self._cm, None
        if cm is not None:
            import mlflow

            if exc and exc[0] is not None:
                with contextlib.suppress(BaseException):
                    cm.__exit__(*exc)
            else:
                cm.__exit__(None, None, None)
            if self.system_metrics:
                mlflow.disable_system_metrics_logging()


__all__ = [
    "CheckpointError",
    "DivergedError",
    "InitWeights",
    "SFTResult",
    "TrainingError",
    "apply_trainable",
    "collate",
    "deepspeed_config",
    "encode_items",
    "init_distributed",
    "init_path",
    "model_paths",
    "resolve_init",
    "stream_indices",
    "summed_ce",
    "train_sft",
    "trainable_names",
    "verify_checkpoint",
    "verify_model_dir",
]
