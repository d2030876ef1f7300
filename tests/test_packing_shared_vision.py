"""Vision once per prompt (:func:`mmrl.model.packing.encode_media_once`): the distinct prompts of a micro-batch go through
the vision tower in one call per modality, whose output :func:`mmrl.model.encoders.split_encoder_outputs` cuts back per
prompt for every layout the families' feature functions return; so the number of tower calls is the padded path's
(one per micro-batch and modality) and the sharing holds under FSDP2, where a rank whose micro-batch holds more
distinct prompts than another's no longer runs more collectives, and one whose micro-batch is text only encodes a
blank image where another's runs the tower (mmrl.model.fsdp.matched_tower_calls; without it gloo aborts on a collective
mismatch): 2 gloo processes give the 1-process weights."""

import inspect
from pathlib import Path

import pytest
import torch
from multiproc import torchrun
from test_packing import _check_packed, _completions, media  # noqa: F401 (media: the fixture)
from transformers.modeling_outputs import BaseModelOutputWithPooling
from transformers.models.qwen3_vl.modeling_qwen3_vl import BaseModelOutputWithDeepstackFeatures

from mmrl.config import ModelConfig
from mmrl.model.encoders import split_encoder_outputs
from mmrl.model.policy import Policy
from mmrl.types import Sample

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "assets" / "tiny-qwen2.5-vl"


def _tower_forwards(model) -> list[int]:
    """A list that grows by one at each forward of the model's vision tower."""
    backbone = getattr(model, "model", None) or model  # Llama 4: the model itself
    name = next(n for n in ("visual", "vision_tower", "vision_model") if hasattr(backbone, n))
    calls: list[int] = []
    getattr(backbone, name).register_forward_pre_hook(lambda *_: calls.append(1))
    return calls


def test_split_cuts_every_layout_and_names_what_it_cannot():
    torch.manual_seed(0)
    per_image = tuple(torch.randn(n, 4) for n in (3, 5, 2))  # Qwen's pooler_output: one tensor per image
    deep = [per_image, tuple(t + 1 for t in per_image)]  # Qwen3-VL's deepstack_features: per layer, per image
    out = BaseModelOutputWithDeepstackFeatures(pooler_output=per_image, deepstack_features=deep)
    a, b = split_encoder_outputs(out, [1, 2], "qwen3_vl image")
    assert a.pooler_output == per_image[:1] and b.pooler_output == per_image[1:]
    assert [len(layer) for layer in b.deepstack_features] == [2, 2]
    assert b.deepstack_features[1][0] is deep[1][1]  # slices of the one output, no copies
    # a DeepStack layer that is one tensor over all images' tokens is cut by each prompt's tokens (3 | 5 + 2)
    out["deepstack_features"] = [torch.cat(layer) for layer in deep]
    a, b = split_encoder_outputs(out, [1, 2], "qwen3_vl image")
    assert a.deepstack_features[0].shape == (3, 4) and b.deepstack_features[1].shape == (7, 4)
    assert torch.equal(b.deepstack_features[1], torch.cat(deep[1][1:]))
    # a tensor over images or tiles (Gemma 3, InternVL); Llama 4's last_hidden_state where there is no pooler_output
    tiles = torch.randn(5, 2, 4)
    parts = split_encoder_outputs(BaseModelOutputWithPooling(pooler_output=tiles), [2, 3], "internvl image")
    assert [p.pooler_output.shape[0] for p in parts] == [2, 3]
    parts = split_encoder_outputs(BaseModelOutputWithPooling(last_hidden_state=tiles), [4, 1], "llama4 image")
    assert torch.equal(parts[1].last_hidden_state, tiles[4:])
    # a list (Idefics3: one entry per batch row) stays a list
    rows = [torch.randn(6, 4), torch.randn(2, 4)]
    parts = split_encoder_outputs(BaseModelOutputWithPooling(pooler_output=rows), [1, 1], "idefics3 image")
    assert parts[0].pooler_output == rows[:1] and isinstance(parts[1].pooler_output, list)
    # Idefics3 under transformers before 5.23 (the vLLM venv's 5.19): one tensor over the real tiles of the
    # [rows, tiles, C, H, W] stacks, the all-zero padding tiles dropped
    from types import SimpleNamespace

    from mmrl.model.packing import _split

    two, three = torch.zeros(1, 3, 3, 2, 2), torch.ones(1, 3, 3, 2, 2)
    two[0, :2] = 1.0  # 2 real tiles and a padding one
    real = BaseModelOutputWithPooling(pooler_output=torch.randn(5, 2, 4))
    prompts = [SimpleNamespace(mm={"pixel_values": x}) for x in (two, three)]
    parts = _split(real, prompts, "pixel_values", {"pixel_values"}, "idefics3 image")
    assert [p.pooler_output.shape[0] for p in parts] == [2, 3]
    wrong = r"gemma3 image: cannot split the vision encoder's pooler_output \(a tensor of shape \(5, 2, 4\)\)"
    with pytest.raises(ValueError, match=wrong):
        split_encoder_outputs(BaseModelOutputWithPooling(pooler_output=tiles), [2, 2], "gemma3 image")
    deep = [torch.randn(9, 4)]  # neither the 3 images nor their 10 tokens
    out = BaseModelOutputWithDeepstackFeatures(pooler_output=per_image, deepstack_features=deep)
    with pytest.raises(ValueError, match=r"qwen3_vl video: .* deepstack_features\[0\]"):
        split_encoder_outputs(out, [1, 2], "qwen3_vl video")
    with pytest.raises(ValueError, match="holds none of"):
        split_encoder_outputs(BaseModelOutputWithPooling(), [1], "x image")


def _mixed(files) -> list[Sample]:
    def user(parts, text):
        return {"role": "user", "content": [*({"type": t} for t in parts), {"type": "text", "text": text}]}

    return [
        Sample(
            "both", [user(["image", "video"], "Same?")], images=[files[(57, 83)]], videos=[files["video"]]
        ),
        Sample("image", [user(["image", "image"], "Wider?")], images=[files[(200, 120)], files[(31, 300)]]),
        Sample("video", [user(["video"], "What happens?")], videos=[files["video"]]),
    ]


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl", "qwen3_5", "gemma4", "llava_onevision"])
def test_prompts_with_images_and_videos_share_one_call_per_modality(family, tiny_family, media):  # noqa: F811
    """A prompt with an image and a video (each with its own grid or frame count) beside image-only and video-only
    prompts, each repeated: one image call and one video call in the packed pass, as in the padded pass, with the
    padded path's log-probs and gradients (the vision tower's included); Qwen3-VL joins image and video DeepStack
    features by the rows' own masks."""
    policy = Policy.from_pretrained(
        ModelConfig(path=str(tiny_family(family)), min_pixels=3136, max_pixels=12544)
    )
    assert policy.packs
    assert any(p.requires_grad for n, p in policy.model.named_parameters() if "vis" in n)  # a trainable tower
    calls = _tower_forwards(policy.model)
    encoded = [policy.encode(s) for s in _mixed(media)]
    _check_packed(policy, encoded, family)  # rows: both, image, video, both, image; padded pass, then packed
    assert len(calls) == 4  # two passes, each one image call and one video call
    calls.clear()
    with torch.no_grad():
        policy.logprobs([*encoded, *encoded[:2]], _completions(policy, 5), packed=True)
    assert len(calls) == 2


WORKER = r"""
import json, sys, torch
from PIL import Image
import mmrl.model.packing
from mmrl.config import load_config
from mmrl.distributed import Dist
from mmrl.model.policy import Policy
from mmrl.types import Sample
from mmrl.train.update import PolicyUpdate, RolloutBatch

out, tiny, mode = sys.argv[1], sys.argv[2], sys.argv[3]
dist = Dist(timeout_s=300)  # a collective the ranks do not both run fails here instead of hanging the test
if dist.is_main:
    for i, colour in enumerate([(9, 99, 199), (200, 30, 30), (20, 180, 40)]):
        Image.new("RGB", (56 + 28 * i, 56), colour).save(f"{out}/i{i}.png")
dist.barrier()
cfg = load_config(None, [f"model.path={tiny}", "model.max_pixels=6272", "rollout.n=4", "optim.micro_batch_size=8",
                         "algo.epochs=2", "algo.kl_coef=0", "train.seed=0"])
torch.manual_seed(0)
pol = Policy.from_pretrained(cfg.model)
assert pol.packs
ask = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Which colour?"}]}]
text = [{"role": "user", "content": "Which colour is the sky?"}]
# group 0 is text only: a micro-batch of it runs no tower where the other rank's runs one (mmrl.model.fsdp)
groups = [pol.encode(Sample("q0", text))] + [pol.encode(Sample(f"q{i}", ask, [f"{out}/i{i}.png"])) for i in (1, 2)]
prompts = [p for p in groups for _ in range(4)]  # 12 rows, groups of 4 sharing their prompt object
comps = [[5 + i, 6, 7, 8][: 1 + i % 4] for i in range(12)]
with torch.no_grad():
    old = pol.logprobs(prompts, comps)[0] + 0.05
if mode == "fsdp":
    pol.shard()
elif dist.active:
    pol.replicate(dist)
backbone = pol.model.model
tower_forwards, shared, micro = [], [], []
backbone.visual.register_forward_pre_hook(lambda *_: tower_forwards.append(1))
real_encode, real_micro = mmrl.model.packing.encode_media_once, PolicyUpdate._micro_step

def encode(pol_, prompts_, mm_):  # the distinct prompts whose one encoding the rows shared (0: the model's own)
    got = real_encode(pol_, prompts_, mm_)
    shared.append(len({id(p) for p in prompts_}) if got else 0)
    return got

def micro_step(self, batch_, part, *args):
    micro.append(len(part))
    return real_micro(self, batch_, part, *args)

mmrl.model.packing.encode_media_once, PolicyUpdate._micro_step = encode, micro_step
opt = torch.optim.SGD([q for q in pol.model.parameters() if q.requires_grad], lr=0.05)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1.0)
adv = torch.linspace(-1.0, 1.0, 12)
stats = []
# first rank 0 holds one group (1 distinct prompt in its micro-batch) and rank 1 the other two (2); then rank 0 holds
# one row of each group (no repeat: the model encodes them itself) and rank 1 the other 9 rows (8 + 1)
# (the layouts are forced: each rank's share of a mini-batch is its rows in it, instead of the balanced split)
for layout in ([[0, 1, 2, 3], list(range(4, 12))], [[0, 4, 8], [1, 2, 3, 5, 6, 7, 9, 10, 11]]):
    rows = list(range(12)) if dist.world == 1 else layout[dist.rank]
    dist.balanced = lambda blocks, costs, own=set(rows): [r for b in blocks for r in b if r in own]
    batch = RolloutBatch.one_turn(prompts, comps, 4, old, advantages=adv, rows=rows)
    with pol.training():
        stats.append(PolicyUpdate(cfg, pol, opt, sched, 1.0, dist)(batch, step=len(stats) + 1))
weights = pol.full_state_dict() if mode == "fsdp" else pol.model.state_dict()
seen = {"rank": dist.rank, "tower_forwards": len(tower_forwards), "micro_batches": micro, "shared": shared}
with open(f"{out}/calls-{dist.world}-{mode}-{dist.rank}.json", "w") as f:
    json.dump(seen, f)
if dist.is_main:
    torch.save({"weights": {k: v.detach().clone() for k, v in weights.items()}, "stats": stats},
               f"{out}/result-{dist.world}-{mode}.pt")
dist.exit()
"""


@pytest.mark.slow
def test_sharded_update_shares_the_encoding_across_uneven_ranks(tmp_path):
    """Groups of 4 rows, the first text only; under FSDP2 rank 0's micro-batches hold the text-only group and rank 1's
    the 2 image groups, each shared by its rows; then rank 0's hold 3 rows of 3 groups (no repeat) and rank 1's 3
    groups and a last row alone, rank 0 padded to match: every rank runs the tower once per micro-batch (the same
    collectives on both: a text-only micro-batch encodes a blank image, mmrl.model.fsdp.matched_tower_calls), nothing
    hangs, and the weights after four optimizer steps (the vision tower's included) are the 1-process updates' within
    1e-6."""
    import json

    from transformers import AutoModelForImageTextToText

    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    torchrun(1, str(worker), str(tmp_path), str(TINY), "plain", cwd=tmp_path)
    torchrun(2, str(worker), str(tmp_path), str(TINY), "fsdp", cwd=tmp_path)
    calls = {
        name: json.loads((tmp_path / f"calls-{name}.json").read_text())
        for name in ("1-plain-0", "2-fsdp-0", "2-fsdp-1")
    }
    for seen in calls.values():  # four optimizer steps (2 x algo.epochs), the tower once in each micro-batch
        assert seen["tower_forwards"] == len(seen["micro_batches"]) == len(seen["shared"]), seen
    assert calls["2-fsdp-0"]["micro_batches"] == [4, 4, 3, 1, 3, 1]  # 1: a zero-weight padding micro-batch
    # text only (a blank image twice), then no repeat
    assert calls["2-fsdp-0"]["shared"] == [0, 0, 0, 0, 0, 0]
    assert calls["2-fsdp-1"]["micro_batches"] == [8, 8, 8, 1, 8, 1]
    # 8 of 9 rows hold all 3 groups (one text only); transformers before 5.18 takes no precomputed features (each
    # row's images are encoded in the model's forward, warned: mmrl.model.packing._warn_unshared), the rest holds alike
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel

    takes = "mm_encoder_outputs" in inspect.signature(Qwen2_5_VLModel.forward).parameters
    assert calls["2-fsdp-1"]["shared"] == ([2, 2, 3, 0, 3, 0] if takes else [0] * 6)
    one, two = torch.load(tmp_path / "result-1-plain.pt"), torch.load(tmp_path / "result-2-fsdp.pt")
    assert one["weights"].keys() == two["weights"].keys()
    for k, w in one["weights"].items():
        assert torch.allclose(w, two["weights"][k], atol=1e-6), (k, (w - two["weights"][k]).abs().max())
    for a, b in zip(one["stats"], two["stats"]):
        for key in ("loss", "pg_loss", "grad_norm", "ratio_mean"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-7), key
    start = AutoModelForImageTextToText.from_pretrained(TINY).state_dict()
    tower = [k for k in start if ".visual." in f".{k}"]
    assert tower and any(not torch.equal(two["weights"][k], start[k]) for k in tower)  # the tower trained
