"""A run on disk: its directory, atomic checkpoints, metrics and trackers, the rollout log and the report."""
