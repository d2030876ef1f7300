"""FSDP2 on CPU (gloo, 2 processes, torchrun): one optimizer step of the sharded policy equals the 1-process step;
a sharded tiny run completes, resumes exactly, writes full HF weights that transformers loads, and matches the
unsharded 2-process run's first steps. (mmrl/model/fsdp.py; the same code runs on GPUs with nccl.)"""

from pathlib import Path

import pytest
import torch
from multiproc import WALL_CLOCK, shapes_run_config, torchrun
from transformers import AutoModelForImageTextToText

from mmrl.run.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "assets" / "tiny-qwen2.5-vl"

WORKER = r"""
import sys, torch
from PIL import Image
from mmrl.config import load_config
from mmrl.distributed import Dist
from mmrl.model.policy import Policy
from mmrl.types import Sample
from mmrl.train.update import PolicyUpdate, RolloutBatch

out, seed, tiny, shard = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "fsdp"
dist = Dist()
img = f"{out}/i.png"
if dist.is_main:
    Image.new("RGB", (56, 56), (9, 99, 199)).save(img)
dist.barrier()
cfg = load_config(None, [f"model.path={tiny}", "model.max_pixels=3136", "rollout.n=2", "optim.micro_batch_size=1",
                         "algo.kl_coef=0.1", "algo.mini_batches=2", f"train.seed={seed}", *sys.argv[5:]])
torch.manual_seed(0)
pol = Policy.from_pretrained(cfg.model)
ref = Policy.from_pretrained(cfg.model, trainable=False)  # frozen: no adapters even with model.lora
s = Sample("q", [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "?"}]}], [img])
p = pol.encode(s)
comps = [[5, 6, 7], [8], [9, 10, 11, 12, 13], [14, 15], [16, 17, 18, 19], [20], [21, 22], [23, 24, 25]]
with torch.no_grad():
    old = pol.logprobs([p] * 8, comps)[0] + 0.05
    ref_lp = ref.logprobs([p] * 8, comps)[0] - 0.1
if shard:
    pol.shard()
elif dist.active:  # under torchrun, as the trainer does: DDP sums the gradients
    pol.replicate(dist)
world = dist.world
rows = list(range(dist.rank * 8 // world, (dist.rank + 1) * 8 // world))
adv = torch.tensor([1.0, -0.5, 0.3, -1.2, 0.8, 0.0, -0.3, 0.6])
batch = RolloutBatch.one_turn([p] * 8, comps, 2, old, ref_logp=ref_lp, advantages=adv, rows=rows)
# SGD: the weights then show the gradients themselves (AdamW's first step turns the float noise of gradients that
# are zero in exact arithmetic, such as the key biases', into +-lr)
opt = torch.optim.SGD([q for q in pol.model.parameters() if q.requires_grad], lr=0.05)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1.0)
with pol.training():
    stats = PolicyUpdate(cfg, pol, opt, sched, 1.0, dist)(batch, step=3)
weights = pol.full_state_dict() if shard else pol.model.state_dict()
if dist.is_main:
    torch.save({"weights": {k: v.detach().clone() for k, v in weights.items()}, "stats": stats},
               f"{out}/result-{world}-{sys.argv[4]}.pt")
dist.exit()  # as mmrl train ends: meet, the atexit handlers, then out without the interpreter teardown (Dist.exit)
"""


def _uneven_seed() -> int:
    """A seed whose step-3 shuffle gives the two ranks different numbers of rows (micro-batches of 1) in a
    mini-batch of 4, so the rank with fewer pads with zero-weight micro-batches."""
    for seed in range(100):
        perm = torch.randperm(8, generator=torch.Generator().manual_seed(seed * 1_000_003 + 3)).tolist()
        if any(sum(r < 4 for r in perm[s : s + 4]) != 2 for s in (0, 4)):
            return seed
    raise AssertionError("no uneven seed")


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_sharded_step_equals_one_process_step(tmp_path, lora):
    """2 ranks with FSDP2, one of them padded with zero-weight micro-batches, give the 1-process update: every full
    weight within 1e-6 after two optimizer steps, the same statistics. With LoRA the blocks' FSDP units hold frozen
    base weights and trainable adapters together: the adapters move, the base weights do not."""
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    seed = str(_uneven_seed())
    extra = ["model.lora.r=4", "model.lora.alpha=8"] if lora else []
    torchrun(1, str(worker), str(tmp_path), seed, str(TINY), "plain", *extra, cwd=tmp_path)
    torchrun(2, str(worker), str(tmp_path), seed, str(TINY), "fsdp", *extra, cwd=tmp_path)
    one, two = torch.load(tmp_path / "result-1-plain.pt"), torch.load(tmp_path / "result-2-fsdp.pt")
    assert one["weights"].keys() == two["weights"].keys()
    for k, w in one["weights"].items():
        assert torch.allclose(w, two["weights"][k], atol=1e-6), k
    # the reduce-scatter sums in another order than one process does (gradients differ by ~3e-7): the statistics
    # of the second mini-batch, computed after the first update, agree to 1e-4
    for key in ("loss", "pg_loss", "kl", "grad_norm", "clip_frac_high", "ratio_mean"):
        assert one["stats"][key] == pytest.approx(two["stats"][key], rel=1e-4, abs=1e-7), key
    adapters = [k for k in two["weights"] if "lora_B" in k]
    assert bool(adapters) == lora
    if lora:  # lora_B starts at zero: the update moved it, and left every base weight as loaded
        assert all(two["weights"][k].abs().max() > 1e-4 for k in adapters)
        base = AutoModelForImageTextToText.from_pretrained(TINY).state_dict()
        for k, w in two["weights"].items():
            if "lora_" not in k:
                assert torch.equal(w, base[k.replace(".base_layer", "")]), k


@pytest.mark.slow
def test_sharded_run_resumes_exactly_and_saves_full_weights(tmp_path):
    """A 2-process FSDP2 shapes run (with VADE, KL and evaluation) completes; stopped at step 2 and resumed it
    writes the same metrics as the uninterrupted run; its checkpoint is full HF weights that transformers loads and
    that equal the uninterrupted run's; and until the first update it sees what the unsharded 2-process run sees
    (same initial evaluation, same first rollouts and rewards, same image check)."""
    cfg = shapes_run_config(tmp_path, micro_batch_size=4)
    run = ["-m", "mmrl", "train", str(cfg), "--output-dir"]
    torchrun(2, *run, str(tmp_path / "full"), "--max-steps", "4", "train.fsdp=true", cwd=tmp_path)
    torchrun(2, *run, str(tmp_path / "split"), "--max-steps", "2", "train.fsdp=true", cwd=tmp_path)
    torchrun(
        2, *run, str(tmp_path / "split"), "--max-steps", "4", "--resume", "train.fsdp=true", cwd=tmp_path
    )
    torchrun(2, *run, str(tmp_path / "ddp"), "--max-steps", "1", cwd=tmp_path)

    def rows(name: str) -> list[dict]:
        return [
            {k: v for k, v in r.items() if not k.startswith(("time/", "sys/")) and k not in WALL_CLOCK}
            for r in read_metrics(tmp_path / name / "metrics.jsonl")
        ]

    full, split, ddp = rows("full"), rows("split"), rows("ddp")
    assert full == split and [r["step"] for r in full] == [0, 1, 2, 3, 4]
    assert full[0] == ddp[0]  # the initial evaluation
    for key in ("reward/mean", "rollout/groups_with_signal", "response_length/mean"):
        assert full[1][key] == ddp[1][key], key
    assert full[1]["loss"] == pytest.approx(ddp[1]["loss"], rel=1e-4, abs=1e-6)
    # the image check (at step 1): 2 FSDP2 ranks run its forwards together (collectives) on the same rows and log
    # what 2 DDP ranks, which sample the same first batch, log
    sanity = [k for k in ddp[1] if k.startswith("sanity/")]
    assert "sanity/image_sensitivity" in sanity and ddp[1]["sanity/image_sensitivity"] > 1e-6
    for k in sanity:
        assert full[1][k] == pytest.approx(ddp[1][k], rel=1e-4, abs=1e-7), k
    weights = {}
    for name in ("full", "split"):
        model = AutoModelForImageTextToText.from_pretrained(
            tmp_path / name / "checkpoints" / "step-4" / "model"
        )
        weights[name] = model.state_dict()
    assert all(torch.equal(v, weights["split"][k]) for k, v in weights["full"].items())
    start = AutoModelForImageTextToText.from_pretrained(ROOT / "assets" / "shapes-sft" / "model").state_dict()
    assert any(not torch.equal(v, start[k]) for k, v in weights["full"].items())  # it trained


@pytest.mark.slow
def test_sharded_lora_run_resumes_and_saves_the_adapter_and_merged_model(tmp_path):
    """FSDP2 + LoRA over 2 processes: stopped at step 2 and resumed, it writes the metrics and the step-4 adapter of
    the uninterrupted run; its first step matches the unsharded 2-process LoRA run's (which needs every rank to
    start from rank 0's fresh adapters: before they were broadcast, each rank drew its own lora_A, and the first
    step's grad_norm was 0.096 sharded against 0.067 unsharded); the merged model it saves
    (made on rank 0 from the gathered shards) is what peft's own merge_and_unload makes of the saved adapter, and
    transformers loads it. (Later steps are not compared with the unsharded run: AdamW's first steps turn the
    float noise of the reduction order into +-lr differences, as in test_sharded_step_equals_one_process_step.)"""
    from peft import PeftModel

    cfg = shapes_run_config(tmp_path, micro_batch_size=4)
    run = ["-m", "mmrl", "train", str(cfg), "--output-dir"]
    lora = ["model.lora.r=4", "model.lora.alpha=8", "model.lora.save_merged=true"]
    torchrun(2, *run, str(tmp_path / "full"), "--max-steps", "4", "train.fsdp=true", *lora, cwd=tmp_path)
    torchrun(2, *run, str(tmp_path / "split"), "--max-steps", "2", "train.fsdp=true", *lora, cwd=tmp_path)
    torchrun(
        2,
        *run,
        str(tmp_path / "split"),
        "--max-steps",
        "4",
        "--resume",
        "train.fsdp=true",
        *lora,
        cwd=tmp_path,
    )
    torchrun(2, *run, str(tmp_path / "ddp"), "--max-steps", "1", *lora, cwd=tmp_path)

    def rows(name: str) -> list[dict]:
        return [
            {k: v for k, v in r.items() if not k.startswith(("time/", "sys/")) and k not in WALL_CLOCK}
            for r in read_metrics(tmp_path / name / "metrics.jsonl")
        ]

    full, ddp = rows("full"), rows("ddp")
    assert full == rows("split") and [r["step"] for r in full] == [0, 1, 2, 3, 4]
    assert full[0] == ddp[0]  # the initial evaluation
    for key in ("reward/mean", "rollout/groups_with_signal", "response_length/mean"):
        assert full[1][key] == ddp[1][key], key
    for key in ("loss", "kl", "grad_norm"):
        assert full[1][key] == pytest.approx(ddp[1][key], rel=1e-4, abs=1e-6), key
    base = ROOT / "assets" / "shapes-sft" / "model"
    adapters = {}
    for name in ("full", "split"):
        model = PeftModel.from_pretrained(
            AutoModelForImageTextToText.from_pretrained(base),
            tmp_path / name / "checkpoints" / "step-4" / "model" / "adapter",
        )
        adapters[name] = {k: v for k, v in model.state_dict().items() if "lora_" in k}
    assert adapters["full"] and all(torch.equal(v, adapters["split"][k]) for k, v in adapters["full"].items())
    assert all(v.abs().max() > 0 for k, v in adapters["full"].items() if "lora_B" in k)  # it trained
    peft_merged = model.merge_and_unload().state_dict()
    merged = AutoModelForImageTextToText.from_pretrained(
        tmp_path / "split" / "checkpoints" / "step-4" / "model"
    ).state_dict()
    assert merged.keys() == peft_merged.keys()
    for k, v in merged.items():
        assert torch.allclose(v, peft_merged[k], atol=1e-6), k
    start = AutoModelForImageTextToText.from_pretrained(base).state_dict()
    assert any(not torch.equal(v, start[k]) for k, v in merged.items())


def test_fsdp_follows_the_setting_then_the_launcher_and_never_shards_without_a_launcher(monkeypatch):
    from mmrl.model.fsdp import wanted

    monkeypatch.delenv("ACCELERATE_USE_FSDP", raising=False)
    assert not wanted(None, True) and wanted(True, True) and not wanted(True, False)
    monkeypatch.setenv(
        "ACCELERATE_USE_FSDP", "true"
    )  # what accelerate launch exports for distributed_type: FSDP
    assert wanted(None, True) and not wanted(False, True) and not wanted(None, False)


def test_fsdp_with_the_vllm_engine_passes_the_preflight(monkeypatch):
    """FSDP2 + vLLM streams the weights from the shards (tests/test_vllm_train.py runs it); no longer refused."""
    from mmrl.config import load_config
    from mmrl.rollout import ENGINES
    from mmrl.train.checks import check_components

    monkeypatch.setattr(ENGINES.get("vllm"), "check", staticmethod(lambda: None))  # vLLM lives in .venv-vllm
    check_components(load_config(None, [f"model.path={TINY}", "train.fsdp=true", "rollout.engine=vllm"]))


def test_resuming_with_another_fsdp_setting_names_the_fix(tmp_path):
    from mmrl.run.checkpoint import load_training_state

    lin = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(lin.parameters())
    sharded, plain = tmp_path / "sharded", tmp_path / "plain"
    (sharded / "optimizer").mkdir(parents=True)  # torch's distributed checkpoint of an FSDP run
    plain.mkdir()
    torch.save(opt.state_dict(), plain / "optimizer.pt")
    with pytest.raises(
        ValueError, match="was sharded .FSDP. and this run is unsharded; resume with the same train.fsdp"
    ):
        load_training_state(sharded, opt, None)
    with pytest.raises(ValueError, match="was unsharded and this run is sharded"):
        load_training_state(plain, opt, None, model=lin)


@pytest.mark.slow
def test_sharded_bf16_run_with_activation_checkpointing_keeps_fp32_master_weights(tmp_path):
    """FSDP2 with bf16 gathers and fp32 gradient reduction (model.dtype bfloat16) and activation checkpointing:
    two steps train, and the checkpoint holds fp32 weights (the sharded master copy) that moved."""
    from mmrl.recipes.shapes.data import build

    build(tmp_path / "data", n_train=16, n_eval=4, seed=2)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        f"""
model: {{path: {ROOT / "assets" / "shapes-sft" / "model"}, min_pixels: 3136, max_pixels: 3136,
        dtype: bfloat16, gradient_checkpointing: true}}
data: {{train: data/train.jsonl}}
rollout: {{n: 4, max_new_tokens: 4, batch_size: 8}}
optim: {{lr: 0.001, micro_batch_size: 4}}
rewards: [{{name: exact_match}}]
train: {{prompts_per_step: 4, progress: false, seed: 1, fsdp: true}}
"""
    )
    torchrun(
        2,
        "-m",
        "mmrl",
        "train",
        str(cfg),
        "--output-dir",
        str(tmp_path / "bf16"),
        "--max-steps",
        "2",
        cwd=tmp_path,
    )
    rows = read_metrics(tmp_path / "bf16" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2] and all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)
    saved = AutoModelForImageTextToText.from_pretrained(
        tmp_path / "bf16" / "checkpoints" / "step-2" / "model"
    )
    start = AutoModelForImageTextToText.from_pretrained(ROOT / "assets" / "shapes-sft" / "model").state_dict()
    state = saved.state_dict()
    assert all(v.dtype == torch.float32 for v in state.values())
    assert any(not torch.equal(v, start[k]) for k, v in state.items())
