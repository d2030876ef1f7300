"""``mmrl plan``: the memory model of a training run and the planner that reads it."""
