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
