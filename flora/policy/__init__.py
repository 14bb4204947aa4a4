"""flora.policy: flow-matching action expert with training-time real-time chunking.

Public API (DESIGN §4): ``flora.policy.rtc.prefix_weights``, ``training_loss`` and
``sample``; the DiT expert in ``modeling_dit`` / ``configuration_dit``; the async runtime in
``runtime``; the simulated benchmark in ``bench`` / ``sim``; LeRobot training in
``lerobot``. See docs/policy.md.
"""
