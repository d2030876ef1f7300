"""Pure tensor functions for policy-gradient training: advantages and losses, each registered by name."""

from mmrl.algos.grpo import ADVANTAGES, LOSSES, aggregate, kl_k3

__all__ = ["ADVANTAGES", "LOSSES", "aggregate", "kl_k3"]
