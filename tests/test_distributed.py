"""Multi-process training on CPU (gloo), launched with torchrun: one optimizer step of 2 ranks x B/2 equals 1 rank x B;
a 2-process tiny run completes, resumes exactly, and matches a 1-process run where it must (the shared choices and
the initial evaluation)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from multiproc import WALL_CLOCK, shapes_run_config, torchrun

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

out, agg, tiny = sys.argv[1], sys.argv[2], sys.argv[3]
dist = Dist()
img = f"{out}/i.png"
if dist.is_main:
    Image.new("RGB", (56, 56), (9, 99, 199)).save(img)
dist.barrier()
cfg = load_config(None, [f"model.path={tiny}", "model.max_pixels=3136", f"algo.loss_agg={agg}", "rollout.n=2",
                         "optim.micro_batch_size=2", "algo.kl_coef=0.1", "algo.mini_batches=2", "train.seed=5"])
torch.manual_seed(0)
pol = Policy.from_pretrained(cfg.model)
ref = Policy.from_pretrained(cfg.model, trainable=False)
if dist.active:  # a launcher made a process group (torchrun, also with 1 process)
    pol.replicate(dist)  # as the trainer does: DDP sums the gradients
s = Sample("q", [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "?"}]}], [img])
p = pol.encode(s)
comps = [[5, 6, 7], [8], [9, 10, 11, 12, 13], [14, 15], [16, 17, 18, 19], [20], [21, 22], [23, 24, 25]]
with torch.no_grad():
    old = pol.logprobs([p] * 8, comps)[0] + 0.05
    ref_lp = ref.logprobs([p] * 8, comps)[0] - 0.1
world = dist.world
rows = list(range(dist.rank * 8 // world, (dist.rank + 1) * 8 // world))
adv = torch.tensor([1.0, -0.5, 0.3, -1.2, 0.8, 0.0, -0.3, 0.6])
# as the trainer builds it: every rank holds every row's trajectory, so each mini-batch is split over the ranks balanced
batch = RolloutBatch.one_turn([p] * 8, comps, 2, old, ref_logp=ref_lp, advantages=adv, rows=rows)
opt = torch.optim.AdamW([q for q in pol.model.parameters() if q.requires_grad], lr=1e-3)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1.0)
with pol.training():
    stats = PolicyUpdate(cfg, pol, opt, sched, 1.0, dist)(batch, step=3)
if dist.is_main:
    torch.save({"weights": {k: v.detach().clone() for k, v in pol.model.state_dict().items()}, "stats": stats},
               f"{out}/result-{world}.pt")
dist.exit()  # as `mmrl train` ends a launched rank: meet, destroy the groups, leave without interpreter teardown
"""


@pytest.mark.slow
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_two_ranks_times_half_batch_equal_one_rank_times_full_batch(tmp_path, agg):
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    for nproc in (1, 2):
        torchrun(nproc, str(worker), str(tmp_path), agg, str(TINY), cwd=tmp_path)
    one, two = torch.load(tmp_path / "result-1.pt"), torch.load(tmp_path / "result-2.pt")
    # AdamW's first step is lr x m / sqrt(v): an entry whose gradient is near 0 turns the ranks' summation order into
    # a visible step (1.7e-6 of lr 1e-3 on this machine's CPU; bitwise equal on others), so the weights are held to
    # 1e-5 and the summed gradient itself by its norm below
    for k, w in one["weights"].items():
        assert torch.allclose(w, two["weights"][k], atol=1e-5), (k, (w - two["weights"][k]).abs().max())
    for key in ("loss", "pg_loss", "kl", "grad_norm", "clip_frac_high", "ratio_mean"):
        assert one["stats"][key] == pytest.approx(two["stats"][key], rel=1e-5, abs=1e-7), key


@pytest.mark.slow
def test_two_process_run_resumes_exactly_and_matches_one_process_where_it_must(tmp_path):
    cfg = shapes_run_config(tmp_path, micro_batch_size=8)
    run = ["-m", "mmrl", "train", str(cfg), "--output-dir"]
    torchrun(2, *run, str(tmp_path / "full"), "--max-steps", "4", cwd=tmp_path)
    torchrun(2, *run, str(tmp_path / "split"), "--max-steps", "2", cwd=tmp_path)
    torchrun(2, *run, str(tmp_path / "split"), "--max-steps", "4", "--resume", cwd=tmp_path)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "mmrl",
            "train",
            str(cfg),
            "--output-dir",
            str(tmp_path / "one"),
            "--max-steps",
            "4",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    # time/*, sys/* and vade/*_ms are wall-clock and process diagnostics, not training state
    strip = lambda rows: [  # noqa: E731
        {k: v for k, v in x.items() if not k.startswith(("time/", "sys/")) and k not in WALL_CLOCK}
        for x in rows
    ]
    full, split = (
        strip(read_metrics(tmp_path / "full" / "metrics.jsonl")),
        strip(read_metrics(tmp_path / "split" / "metrics.jsonl")),
    )
    one = strip(read_metrics(tmp_path / "one" / "metrics.jsonl"))
    assert full == split  # 2 processes resume exactly (every rank's RNG, the sampler, the optimizer)
    assert [x["step"] for x in full] == [x["step"] for x in one] == [0, 1, 2, 3, 4]
    assert set(full[1]) == set(one[1])  # the same metrics
    assert full[0] == one[0]  # the initial greedy evaluation is the same model on the same records
    ck = tmp_path / "full" / "checkpoints" / "step-4"
    assert (ck / "rng.pt").is_file() and (ck / "rng-1.pt").is_file()  # each process's generators
    assert json.loads((ck / "state.json").read_text())["sampler"]["seen"]  # VADE's state, global
    assert not list((tmp_path / "full").glob("*rank*"))  # rank 1 wrote no logs of its own


TEARDOWN_WORKER = r"""
import atexit, sys
from pathlib import Path
from mmrl.distributed import Dist

out = Path(sys.argv[1])
dist = Dist()
dist.gather({"rank": dist.rank})  # collectives on tensors: gloo's threads let go of them after they return
atexit.register((out / f"atexit-{dist.rank}").touch)


class Teardown:  # freed only by the interpreter's teardown
    def __del__(self, touch=(out / f"teardown-{dist.rank}").touch):
        touch()


kept = Teardown()
dist.exit()
raise AssertionError("Dist.exit returned")
"""


def test_a_launched_rank_ends_after_its_atexit_handlers_without_interpreter_teardown(tmp_path):
    """The teardown abort ("terminate called without an active exception", SIGABRT, after a finished run): in the
    interpreter's teardown a gloo worker thread that still holds a finished collective's tensors asks for the GIL
    to drop them, CPython ends it with pthread_exit, and the forced unwinding meets a noexcept destructor
    (core dump: ProcessGroupGloo::runLoop -> ~AsyncBarrierWork -> ~AsyncAllgatherWork -> decref_pyobject ->
    take_gil -> pthread_exit -> std::terminate). A rank ends with Dist.exit instead: the atexit handlers run,
    the teardown does not."""
    worker = tmp_path / "worker.py"
    worker.write_text(TEARDOWN_WORKER)
    torchrun(2, str(worker), str(tmp_path), cwd=tmp_path)
    assert (tmp_path / "atexit-0").exists() and (tmp_path / "atexit-1").exists()  # the handlers ran
    assert not list(tmp_path.glob("teardown-*"))  # the interpreter's teardown did not
