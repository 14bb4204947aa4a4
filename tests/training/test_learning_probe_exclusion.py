"""``benchmarks/learning.py`` scores no variant on the episodes GRPO's held-out probe
chooses on, whether the recipe or ``--grpo-probe-every`` turns the probe on."""

from __future__ import annotations

from argparse import Namespace

from tests.benchmark_scripts import load_benchmark
from training.recipe import load_recipe

learning = load_benchmark("learning")

CANDIDATES = {f"ep_{i:02d}" for i in range(8)}
LAST_THREE = {"ep_05", "ep_06", "ep_07"}  # probe_episode_ids: the last n sorted ids


def _recipe(probe_every: int):
    r = load_recipe("segmenter-small")
    return r.model_copy(update={"grpo": r.grpo.model_copy(update={"probe_every": probe_every})})


def _args(grpo_steps: int = 40, probe_every: int | None = None) -> Namespace:
    return Namespace(grpo_steps=grpo_steps, grpo_probe_every=probe_every)


def test_the_recipe_probe_leaves_its_episodes_out():
    recipe = _recipe(5)
    assert recipe.grpo.probe_episodes == 3
    assert learning.probe_exclusion(recipe, _args(), CANDIDATES) == LAST_THREE


def test_the_probe_turned_off_by_the_flag_still_leaves_them_out():
    # a probe-off run is scored on the same episodes as the recipe's probe-on run
    assert learning.probe_exclusion(_recipe(5), _args(probe_every=0), CANDIDATES) == LAST_THREE


def test_the_probe_turned_on_by_the_flag_leaves_them_out():
    assert learning.probe_exclusion(_recipe(0), _args(probe_every=5), CANDIDATES) == LAST_THREE


def test_nothing_is_left_out_without_a_probe_or_without_grpo():
    assert learning.probe_exclusion(_recipe(0), _args(), CANDIDATES) == set()
    assert learning.probe_exclusion(_recipe(0), _args(probe_every=0), CANDIDATES) == set()
    assert learning.probe_exclusion(_recipe(5), _args(grpo_steps=0), CANDIDATES) == set()
    rewarder = load_recipe("rewarder-small")  # no GRPO for the rewarder (DESIGN §3.5)
    assert rewarder.grpo is None
    assert learning.probe_exclusion(rewarder, _args(probe_every=5), CANDIDATES) == set()
    assert learning.probe_exclusion(_recipe(5), _args(), set()) == set()


def _held_set(path, regex: str | None):
    """Segmenter-like examples: 4 train episodes, held out mini/000004..mini/000009."""
    from dataclasses import replace

    from tests.training.helpers import mini_examples, write_set

    exs = [replace(e, model="segmenter", guided_regex=regex) for e in mini_examples(n_heldout=6)]
    return write_set(path, exs)


def test_free_and_guided_rows_are_scored_on_one_set_of_episodes(tmp_path):
    """One exclusion, computed once: the lineage's episodes, SFT's checkpoint choice (its
    last held-out example) and GRPO's probe (the last 3 of the rest) are left out of the
    free and the guided rows alike."""
    from training.sets import load_set

    set_dir = _held_set(tmp_path / "set", None)  # a set written before guided_regex
    _held_set(tmp_path / "set_guided", "[0-9 ]+")  # the same set, rebuilt with its regexes
    recipe = _recipe(5).model_copy(update={"eval_examples": 1, "eval_every": 50})
    held = load_set(set_dir, split="heldout")
    args = Namespace(grpo_steps=40, grpo_probe_every=None, eval_episodes=None, quick=True,
                     split=0.3, init_from=None)  # fmt: skip
    excl = learning.heldout_exclusion(recipe, args, held, {"mini/000004"}, 300)
    assert excl["sft"] == {"mini/000009"}
    assert excl["probe"] == {"mini/000006", "mini/000007", "mini/000008"}
    assert excl["all"] == {"mini/000004"} | excl["sft"] | excl["probe"]

    free = learning.scored_heldout("segmenter", set_dir, args, excl["all"])
    assert {e.episode_id for e in free} == {"mini/000005"}
    guided_dir = learning._guided_set("segmenter", free, args, tmp_path, set_dir, excl["all"])
    assert guided_dir == tmp_path / "set_guided"
    guided = learning.scored_heldout("segmenter", guided_dir, args, excl["all"])
    assert [e.example_id for e in guided] == [e.example_id for e in free]
    assert all(e.guided_regex for e in guided)

    # An SFT that evaluates once (at its last step) chooses nothing: nothing left out for it.
    assert learning.sft_selection(recipe, held, 50) == set()
    assert learning.heldout_exclusion(recipe, args, held, set(), 50)["probe"] == {
        "mini/000007", "mini/000008", "mini/000009"}  # fmt: skip
