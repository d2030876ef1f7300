"""mmrl: reinforcement-learning post-training for vision-language models.

Packages: ``mmrl`` (core), ``mmrl.processors`` (image/video preparation, folder ``processors/``),
``mmrl.rewards`` (rewards and the rendering sandbox, folder ``rewards/``), ``mmrl.recipes`` (folder ``recipes/``).
The folders sit at the top of the repository but install under ``mmrl.`` so that generic names such as
``processors`` or ``rewards`` never clash with other distributions.
"""

__version__ = "0.1.0"
