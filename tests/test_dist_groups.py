"""Collectives run on a group that moves the tensor's device (issue 17 §1): under NCCL the default process group
serves CUDA tensors only, and a host tensor all-reduced on it raises "No backend type associated with device type
cpu" at the first optimizer step. These tests build, on this CPU machine, a default group with the same property
(gloo registered for the ``cuda`` device type only) and run every :class:`mmrl.distributed.Dist` collective on it in
2 real processes; the Dist of before (host tensors on the default group) fails here exactly as it failed under NCCL.
A scan of the source keeps every collective inside ``Dist`` or torch's DDP/FSDP2/checkpoint modules."""

import ast
import json
from pathlib import Path

import pytest
from multiproc import torchrun

ROOT = Path(__file__).resolve().parents[1]

WORKER = r"""
import json, sys, torch
import torch.distributed as td

td.init_process_group("cuda:gloo")  # like NCCL: the default group moves no host tensors
from mmrl.distributed import Dist

d = Dist()
try:
    td.all_reduce(torch.ones(1))
    plain = "moved"
except RuntimeError as e:
    plain = str(e).splitlines()[0]
summed = d.sum({"a": float(d.rank + 1), "b": 0.5})
gathered = d.gather({"rank": d.rank, "t": torch.full((2,), float(d.rank))})
t = torch.full((3,), float(d.rank + 7))
d.broadcast([t])
d.barrier()
if d.rank == 0:
    print("RESULT " + json.dumps({
        "plain": plain, "host_group": d.host_group is not None, "sum": summed,
        "gathered": [[g["rank"], g["t"].tolist()] for g in gathered], "broadcast": t.tolist(), "world": d.world,
    }), flush=True)
d.exit()  # as `mmrl train` ends a launched rank (Dist.exit says why)
"""


@pytest.mark.slow
def test_every_collective_runs_where_the_default_group_serves_no_host_tensors(tmp_path):
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    r = torchrun(2, str(worker), cwd=tmp_path)
    line = next(x for x in r.stdout.splitlines() if x.startswith("RESULT "))
    res = json.loads(line.removeprefix("RESULT "))
    assert "No backend type associated with device type cpu" in res["plain"]  # the group is NCCL-like
    assert res["host_group"] and res["world"] == 2
    assert res["sum"] == {"a": 3.0, "b": 1.0}
    assert res["gathered"] == [[0, [0.0, 0.0]], [1, [1.0, 1.0]]]
    assert res["broadcast"] == [7.0, 7.0, 7.0]


# the only modules that may call torch.distributed: Dist itself, and the FSDP2 module (torch's sharding and
# distributed-checkpoint APIs, whose collectives run on the parameters' own device)
ALLOWED = {"mmrl/distributed.py", "mmrl/model/fsdp.py"}


def test_no_collective_outside_dist():
    found = []
    for path in [*ROOT.glob("mmrl/**/*.py"), *ROOT.glob("processors/*.py"), *ROOT.glob("rewards/*.py")]:
        rel = path.relative_to(ROOT).as_posix()
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            name = None
            if isinstance(node, ast.Attribute):
                name = ast.unparse(node)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                name = getattr(node, "module", None) or ",".join(a.name for a in node.names)
            if name and "torch.distributed" in name and rel not in ALLOWED:
                found.append(f"{rel}:{node.lineno}: {name}")
    assert not found, "collectives outside mmrl.distributed.Dist:\n" + "\n".join(found)
