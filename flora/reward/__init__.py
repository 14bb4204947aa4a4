"""flora.reward: outcome, dense and rubric rewards from one rewarder (DESIGN §3.3, seed §4–5).

- ``flora.reward.outcome``: eq. (19) ``expected_reward``, score distributions, grammar.
- ``flora.reward.dense``: §3.7 ``plan_windows``, window grammar, eq. (22) ``stitch_labels``.
- ``flora.reward.rubric``: eq. (3) ``Rubric`` / ``score``, grammar with optional thinking.
- ``flora.reward.run``: step functions writing the ``outcome``, ``dense_labels`` and
  ``rubric`` tables; ``flora.reward.benchmark``: ``flora eval reward``.

See ``docs/reward.md``.
"""
