"""Prompt samplers: choose which training records enter each step's batch. They carry state (saved in checkpoints)
and may learn from the rewards they see (``update``), as VADE does."""

from mmrl.samplers.base import SAMPLERS, Sampler
from mmrl.samplers.uniform import UniformSampler
from mmrl.samplers.vade import VadeSampler

__all__ = ["SAMPLERS", "Sampler", "UniformSampler", "VadeSampler"]
