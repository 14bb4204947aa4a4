"""Flora training: set builders, model sizes, recipes, SFT (DeepSpeed) and GRPO trainers.

See ``docs/training.md``. Modules: :mod:`training.sets` (Parquet SFT/GRPO sets from
ground truth or a curated mixture), :mod:`training.sizes` (tiny / small / production),
:mod:`training.recipe` (the recipe model), :mod:`training.sft` (the SFT trainer).
"""
