"""The ``zoom`` benchmark: the zoom recipe's held-out questions (``recipes/zoom``), each answered by an episode of the
``zoom`` env (:mod:`mmrl.envs.zoom`): the model may zoom into boxes of the image, then answers.

Layout: the recipe's ``eval.jsonl`` (:func:`mmrl.recipes.zoom.data.build` or ``build_tiny``) with ``images/`` beside
it: ``prompt``, ``images``, ``answer`` (the code) and ``metadata.target_box``. An episode succeeds when the answer is
right (return > 0; with ``env_options={call_penalty: ...}`` a right answer after many zooms still counts, a wrong one
never does); ``step_accuracy`` counts zooms that held the target and right answers. Episodes and metrics:
:mod:`mmrl.eval.episodic`. ``max_turns`` defaults to the env's 4 zooms and the answer.
"""

from __future__ import annotations

from dataclasses import dataclass

from mmrl.config import opt
from mmrl.eval.base import register
from mmrl.eval.episodic import EnvBenchmark, EpisodeOptions


@dataclass
class ZoomOptions(EpisodeOptions):
    max_turns: int = opt("completions per episode at most: the env's max_calls zooms and the answer", 5)


@register
class ZoomBenchmark(EnvBenchmark):
    name = "zoom"
    env = "zoom"
    Options = ZoomOptions
