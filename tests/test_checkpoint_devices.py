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
