"""Training the compact routing policy on CPU (torch).

- ``config``: ``TrainConfig`` (no torch);
- ``data``: outcome tables as arrays, rewards through ``training.reward``, λ sampling,
  cached features;
- ``model``: the torch twin of ``router.policies.compact.CompactHead``;
- ``trainer``: GRPO on full-information tables, validation, checkpoints (``train``);
- ``offpolicy``: IPS / SNIPS / doubly robust learning and evaluation on logged traffic;
- ``cli``: ``xrouter train``.

Nothing here is imported by the gateway except ``cli`` when ``xrouter train`` runs; torch
is imported only by ``model``, ``trainer`` and ``offpolicy``.
"""
