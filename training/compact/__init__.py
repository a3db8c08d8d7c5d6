"""Training the compact routing policy on CPU (torch).

- ``config``: ``TrainConfig`` (no torch);
- ``data``: outcome tables as arrays, rewards through ``training.reward``, λ sampling,
  cached features;
- ``model``: the torch twin of ``router.policies.compact.CompactHead``;
- ``run``: a run's table (checks, arrays, split), its greedy validation and what its
  directory and checkpoint record, shared by every builder;
- ``trainer``: GRPO on full-information tables, checkpoints (``train``);
- ``knn``, ``cascade`` (through ``stored``): checkpoints built without gradient steps;
- ``offpolicy``: IPS / SNIPS / doubly robust learning and evaluation on logged traffic;
- ``cli``: ``xrouter train``.

Nothing here is imported by the gateway except ``cli`` when ``xrouter train`` runs; torch
is imported only by ``model``, ``trainer``, ``offpolicy`` and ``run`` (its version, for the
metadata).
"""
