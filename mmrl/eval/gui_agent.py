"""The ``gui_agent`` benchmark: the gui_agent recipe's held-out tasks (``recipes/gui_agent``), each an episode in a
generated web app of the ``browser_app`` env (:mod:`mmrl.envs.browser`, sandboxed Chromium).

Layout: the recipe's ``eval.jsonl`` (:func:`mmrl.recipes.gui_agent.data.build`) with ``images/`` beside it: the task
prompt, the first screenshot and ``metadata`` (``app``, ``seed``, ``task``, ...) from which the env builds the app
again; the env checks that it renders the record's screenshot (rebuild the data on the evaluating machine when it
does not). An episode succeeds when the app's state reaches the task's goal (return > 0); ``step_accuracy`` is the
share of actions that were the oracle's next one. Breakdowns by ``app`` (kind) and ``task`` (template). Episodes
and metrics: :mod:`mmrl.eval.episodic`. ``max_turns`` defaults to the env's ``max_steps`` (8).
"""

from __future__ import annotations

from mmrl.eval.base import register
from mmrl.eval.episodic import EnvBenchmark


@register
class GuiAgentBenchmark(EnvBenchmark):
    name = "gui_agent"
    env = "browser_app"
    breakdowns = ("app", "task")
