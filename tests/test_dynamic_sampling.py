"""DAPO's dynamic sampling keeps only groups whose rewards differ: a group of equal rewards is flat even when the
rewards are not binary fractions (8 x 0.1 has a float32 std of ~8e-9), so a reward that never varies exhausts the
sampling rounds with the error that names the fix."""

from pathlib import Path

import pytest
from tiny_config import shapes_config

from mmrl.config import load_config

PLUGIN = str(Path(__file__).resolve().parents[1] / "tests" / "reward_plugin_example.py")


def _trainer(tmp_path: Path, value: float):
    from mmrl.train.trainer import Trainer

    cfg = shapes_config(
        tmp_path,
        f"""\
rollout: {{n: 8, max_new_tokens: 2, batch_size: 8}}
rewards: [{{name: '{PLUGIN}:constant', options: {{value: {value}}}}}]
algo: {{dynamic_sampling: true, max_sampling_tries: 2}}
train: {{prompts_per_step: 2, progress: false, seed: 3}}
""",
    )
    return Trainer(load_config(str(cfg)), tmp_path / "run")


@pytest.mark.parametrize("value", [0.1, 1.0])
def test_flat_groups_are_never_kept(tmp_path, value):
    from mmrl.train.collect import SamplingExhausted

    trainer = _trainer(tmp_path, value)
    try:
        with pytest.raises(
            SamplingExhausted, match="kept 0 informative groups .* of 4 generated in 2 rounds"
        ):
            trainer.collector.collect(1)
    finally:
        trainer.collector.close()
