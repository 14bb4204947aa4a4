"""Training recipes: one YAML per model and size (``training/recipes/<model>-<size>.yaml``).

A recipe fixes everything a run depends on — base, trainable parts, learning rates,
ZeRO stage, batch geometry, schedule, early stopping, checkpointing and the GRPO fields
(DESIGN §3.5 defaults: G = 8, temperature 1.0, clip 0.2, beta 0.02, token-level
normalisation). It is validated by pydantic (unknown keys are refused, so a typo never
silently falls back to a default) and logged whole to MLflow as flattened params.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

ModelName = Literal["segmenter", "captioner", "rewarder"]
MODELS: tuple[str, ...] = ("segmenter", "captioner", "rewarder")

# Trainable module keys a recipe may name (see training.sft.TRAINABLE_PREFIXES).
MODULE_KEYS: tuple[str, ...] = ("language_model", "merger", "vision")

# The seed's trainable parts per model (DESIGN §3.5); recipes must agree with them.
SEED_TRAINABLE: dict[str, tuple[str, ...]] = {
    "segmenter": ("language_model",),  # through rank-32 LoRA only
    "captioner": ("language_model", "merger"),
    "rewarder": ("language_model", "merger", "vision"),
}
RECIPES_DIR = Path(__file__).resolve().parent / "recipes"


SEED_MAX = 2**32 - 1  # the largest seed numpy accepts


class RecipeError(ValueError):
    """A recipe that cannot be used (unknown field or module, inconsistent settings)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SetRecipe(_Strict):
    """How the training set is built from a dataset (``training.sets``)."""

    split_fraction: float = Field(0.2, ge=0.0, lt=1.0, description="held-out share of episodes")
    max_episodes: int | None = Field(None, ge=1)
    profiles: tuple[Literal["standard", "long_horizon"], ...] = ("standard", "long_horizon")
    shifted: bool = True  # segmenter: also the shifted pass's windows
    # segmenter: standard windows clipped at random ends added per training episode
    clipped: int = Field(0, ge=0)
    outcome_frames: int = Field(32, ge=1)
    rubric_frames: int = Field(16, ge=1)
    rubric_thinking: bool = True  # rubric targets think first (DESIGN §3.3)

    def sft_kwargs(self) -> dict[str, Any]:
        """The keyword arguments :func:`training.sets.build_sft_set` takes from a recipe."""
        return self.model_dump(include={"profiles", "shifted", "clipped", "outcome_frames",
                                        "rubric_frames", "rubric_thinking"})  # fmt: skip


class GRPORecipe(_Strict):
    """GRPO fields (DESIGN §3.5 defaults; the seed gives none). Read by ``training.grpo``."""

    group_size: int = Field(8, ge=2)
    temperature: float = Field(1.0, gt=0.0)
    clip_eps: float = Field(0.2, gt=0.0)
    beta: float = Field(0.02, ge=0.0)
    # Bound on the log-ratio d = ref − policy of the per-token k3 KL, beyond which it grows
    # linearly (training.grpo.k3_kl): one rare sampled token cannot swamp a step. None:
    # plain k3. docs/training.md ("A bounded KL").
    kl_bound: float | None = Field(None, gt=0.0)
    normalisation: Literal["token"] = "token"
    adv_eps: float = 1e-4
    lr: float = Field(1e-5, gt=0.0)
    max_steps: int = Field(50, ge=1)
    prompts_per_step: int = Field(4, ge=1)
    max_new_tokens: int = Field(128, ge=1)
    judge: Literal["embedding", "llm"] = "embedding"
    # Sample rollouts within each request's grammar regex (as the served engine decodes).
    # The policy-gradient term then scores the masked policy they came from; see
    # docs/training.md ("Guided rollouts").
    guided: bool = False
    # With guided rollouts, the KL to the reference between the masked policies, or between
    # the unmasked ones (anchors free decoding, forced tokens included).
    guided_kl: Literal["masked", "unmasked"] = "masked"
    # With guided rollouts, the share of each group sampled under the guide; the rest decode
    # freely (an unparseable one scores 0 against its guided siblings: free decoding learns).
    guided_share: float = Field(1.0, gt=0.0, le=1.0)
    # Held-out probe (training/grpo_probe.py): every probe_every steps (0: never) the policy
    # answers the windows/events of the last probe_episodes held-out episodes greedily;
    # the state with the best mean reward is exported (the start included), and the run
    # stops after probe_patience probes without a gain (0: never). probe_decoding: free, or
    # under the grammar guide (needs guided rollouts).
    probe_every: int = Field(0, ge=0)
    probe_episodes: int = Field(3, ge=1)
    probe_patience: int = Field(0, ge=0)
    probe_decoding: Literal["free", "guided"] = "free"


class Recipe(_Strict):
    """One training recipe (SFT + the GRPO section that follows it)."""

    model: ModelName
    size: Literal["tiny", "small", "production"]
    base: str = Field(description="'tiny' | 'small' (built here), a checkpoint dir or a hub id")
    family: Literal["qwen3_vl", "qwen2_5_vl", "qwen3_5"] = "qwen3_vl"
    base_seed: int = 0
    max_pixels: int | None = Field(
        None,
        ge=32 * 32,
        description="per-image pixel budget of a built base's processor (tiny/small); "
        "None keeps the size's (docs/training.md, 'Image budget')",
    )
    init_from: str | None = Field(
        None,
        description="an exported Flora model (same model and base) whose weights start SFT: "
        "full weights for a full fine-tune, the adapter for a LoRA recipe (same rank, alpha, "
        "targets); 'base' stays the architecture, processor and untrained reference",
    )
    trainable: tuple[str, ...]
    lora_rank: int | None = Field(None, ge=1)
    lora_alpha: int | None = Field(None, ge=1)
    lora_dropout: float = Field(0.0, ge=0.0, lt=1.0)
    lora_merger: bool = Field(
        False,
        description="the LoRA also adapts the vision mergers' linear layers (the encoder stays "
        "frozen): for a random-initialised base whose merger never learnt (docs/training.md)",
    )
    lr: float = Field(gt=0.0)
    vision_lr: float | None = Field(None, gt=0.0)
    weight_decay: float = Field(0.0, ge=0.0)
    warmup_steps: int = Field(0, ge=0)
    scheduler: Literal["constant", "cosine", "linear"] = "cosine"
    max_grad_norm: float = Field(1.0, ge=0.0)
    zero_stage: Literal[0, 2, 3] = 2
    micro_batch: int = Field(1, ge=1)
    grad_accum: int = Field(1, ge=1)
    epochs: int = Field(1, ge=1)
    max_steps: int | None = Field(None, ge=1)
    eval_every: int = Field(50, ge=1)
    eval_examples: int | None = Field(64, ge=1)
    patience: int = Field(3, ge=1)
    checkpoint_every: int = Field(50, ge=1)
    keep_checkpoints: int = Field(2, ge=1)
    gradient_checkpointing: bool = False
    max_length: int | None = Field(None, ge=16)
    # numpy's global seed (GRPO, SFT) takes only [0, 2**32): a bad seed fails at load
    seed: int = Field(0, ge=0, le=SEED_MAX)
    gpus: int = Field(0, ge=0, description="GPUs per run in production (0: CPU)")
    nodes: int = Field(1, ge=1)
    sets: SetRecipe = SetRecipe()
    grpo: GRPORecipe | None = None

    @model_validator(mode="after")
    def _check(self) -> Recipe:
        unknown = [m for m in self.trainable if m not in MODULE_KEYS]
        if unknown:
            raise ValueError(
                f"recipe names unknown trainable module(s) {unknown}; known: {list(MODULE_KEYS)}"
            )
        if not self.trainable:
            raise ValueError("recipe trains nothing: 'trainable' is empty")
        want = SEED_TRAINABLE[self.model]
        if tuple(sorted(self.trainable)) != tuple(sorted(want)):
            raise ValueError(
                f"{self.model} trains {list(want)} (DESIGN §3.5), "
                f"recipe says {list(self.trainable)}"
            )
        if self.model == "segmenter" and self.lora_rank is None:
            raise ValueError("segmenter recipes train a LoRA: set lora_rank (the seed: 32)")
        if self.model != "segmenter" and self.lora_rank is not None:
            raise ValueError(f"{self.model} is fully fine-tuned; lora_rank must be unset")
        if self.lora_merger and self.lora_rank is None:
            raise ValueError("lora_merger widens a LoRA: it needs lora_rank (segmenter recipes)")
        if "vision" in self.trainable and self.vision_lr is None:
            raise ValueError("the vision encoder trains at its own lower rate: set vision_lr")
        if self.vision_lr is not None and "vision" not in self.trainable:
            raise ValueError("vision_lr is set but the vision encoder is frozen")
        if self.vision_lr is not None and self.vision_lr > self.lr:
            raise ValueError(f"vision_lr {self.vision_lr} must not exceed lr {self.lr}")
        if self.max_pixels is not None and self.base not in ("tiny", "small"):
            raise ValueError(
                f"max_pixels sets the processor of a built base (tiny/small); base "
                f"{self.base!r} is loaded with its own processor"
            )
        if self.model == "rewarder" and self.grpo is not None:
            raise ValueError("no RL for the rewarder (DESIGN §3.5): drop the grpo section")
        return self

    @property
    def trainable_modules(self) -> tuple[str, ...]:
        """Canonical order of the trainable module keys."""
        return tuple(m for m in MODULE_KEYS if m in self.trainable)

    def flat(self) -> dict[str, Any]:
        """The whole recipe as flat ``a.b`` keys (MLflow params)."""
        out: dict[str, Any] = {}

        def walk(prefix: str, v: Any) -> None:
            if isinstance(v, dict):
                for k, x in v.items():
                    walk(f"{prefix}.{k}" if prefix else k, x)
            elif isinstance(v, list | tuple):
                out[prefix] = ",".join(str(x) for x in v)
            else:
                out[prefix] = v

        walk("", self.model_dump(mode="json"))
        return out

    def digest(self) -> str:
        """sha256 of the canonical JSON (checkpoints record it; resume compares it)."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()


def load_recipe(src: str | Path | dict[str, Any], **overrides: Any) -> Recipe:
    """A validated recipe from a YAML path, a recipe name (``captioner-small``) or a dict.

    ``overrides`` replace top-level fields (CLI ``--max-steps`` and tests). Errors name the
    file and the field.
    """
    import yaml
    from pydantic import ValidationError

    where = "<dict>"
    if isinstance(src, dict):
        data = dict(src)
    else:
        p = Path(src)
        if not p.exists() and (RECIPES_DIR / f"{src}.yaml").exists():
            p = RECIPES_DIR / f"{src}.yaml"
        if not p.exists():
            raise RecipeError(f"recipe {src!r} not found (no file, no {RECIPES_DIR}/{src}.yaml)")
        where = str(p)
        data = yaml.safe_load(p.read_text()) or {}
        if not isinstance(data, dict):
            raise RecipeError(f"{where}: a recipe is a mapping of fields")
    data.update(overrides)
    try:
        return Recipe.model_validate(data)
    except ValidationError as e:
        lines = [f"{'.'.join(str(x) for x in err['loc']) or '<recipe>'}: {err['msg']}"
                 for err in e.errors()]  # fmt: skip
        raise RecipeError(f"{where}: invalid recipe: " + "; ".join(lines)) from None


__all__ = [
    "MODELS",
    "MODULE_KEYS",
    "RECIPES_DIR",
    "SEED_TRAINABLE",
    "GRPORecipe",
    "Recipe",
    "RecipeError",
    "SetRecipe",
    "load_recipe",
]
