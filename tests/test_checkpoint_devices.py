"""Resume never loads a process's state onto a GPU it did not choose (issue 17 §1): a checkpoint written by a GPU
rank records each tensor's device (``cuda:1``), and ``torch.load`` without a map location puts it back there: on
a multi-GPU resume every rank's optimizer state landed on the GPU it was saved from (and on a CPU machine the load
fails outright). The test writes a real checkpoint whose tensors are tagged as saved from ``cuda:1``, as a GPU run
writes them, and resumes it on this CPU: the state must arrive on the CPU, equal to what was saved."""

from pathlib import Path
from unittest import mock

import pytest
import torch
import torch.serialization

from mmrl.run.checkpoint import load_training_state, save_checkpoint


class _Saved:
    def save(self, path):
        Path(path).mkdir(parents=True)


def _optimizer() -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    w = torch.nn.Parameter(torch.arange(4.0))
    opt = torch.optim.AdamW([w], lr=0.1)
    w.grad = torch.tensor([0.5, -1.0, 2.0, 0.25])
    opt.step()
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)


def test_a_checkpoint_saved_from_a_gpu_rank_resumes_on_the_cpu(tmp_path):
    opt, sched = _optimizer()
    saved = {k: v.clone() for k, v in opt.state_dict()["state"][0].items()}
    with mock.patch.object(torch.serialization, "location_tag", lambda storage: "cuda:1"):
        ck = save_checkpoint(
            tmp_path, 3, policy=_Saved(), optimizer=opt, scheduler=sched, state={"x": 1}, rank_rng=[{}]
        )
    with pytest.raises(RuntimeError, match="CUDA"):  # what a plain torch.load does with these files here
        torch.load(ck / "optimizer.pt", weights_only=False)
    fresh, fresh_sched = _optimizer()
    fresh.state.clear()
    state = load_training_state(ck, fresh, fresh_sched)
    assert state["step"] == 3 and state["x"] == 1
    restored = fresh.state_dict()["state"][0]
    for k, v in saved.items():
        assert restored[k].device.type == "cpu"
        assert torch.equal(restored[k], v), k


def test_the_resumed_rate_follows_this_runs_schedule(tmp_path):
    """A cosine schedule over 2 steps ends at rate 0; resumed with a schedule over 4 steps, the next step's rate is
    the new schedule's at step 2 (0.5 * (1 + cos(pi / 2)) = 0.5 of the base), not the stale 0 the optimizer state
    holds. With the same schedule it is the saved rate, bit for bit."""
    from mmrl.config import load_config
    from mmrl.train.trainer import build_scheduler

    def run(total):
        w = torch.nn.Parameter(torch.ones(2))
        opt = torch.optim.SGD([w], lr=0.3)
        cfg = load_config(None, ["optim.scheduler=cosine", f"train.max_steps={total}"])
        return opt, build_scheduler(opt, cfg)

    opt, sched = run(2)
    for _ in range(2):
        opt.step()
        sched.step()
    assert opt.param_groups[0]["lr"] == 0.0
    ck = save_checkpoint(tmp_path, 2, policy=_Saved(), optimizer=opt, scheduler=sched, state={})
    longer, longer_sched = run(4)
    load_training_state(ck, longer, longer_sched)
    assert longer.param_groups[0]["lr"] == pytest.approx(0.3 * 0.5) and longer_sched.get_last_lr() == [
        longer.param_groups[0]["lr"]
    ]
    same, same_sched = run(2)
    load_training_state(ck, same, same_sched)
    assert same.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
