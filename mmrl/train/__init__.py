"""The training side: the trainer and its timed stages (collect, update), pre-flight checks, held-out validation, the step statistics and supervised warm starts."""
