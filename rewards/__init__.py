"""mmrl rewards (see ``base.py`` for the API and ``compose.py`` for the composite the trainer calls).

The built-in rewards are registered lazily: ``base.BUILTIN_REWARDS`` maps each name to its module, imported on the
first ``REWARDS.get(name)`` / ``load_reward(name)``, so a run imports only the rewards it names and the optional
packages they need (the ``render``, ``server`` ... extras, checked first: ``mmrl.extras``). ``REWARDS.names()``
lists every built-in without importing any.
"""
