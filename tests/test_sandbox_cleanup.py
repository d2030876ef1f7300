"""Killing whatever drives a TeX run leaves no TeX process and no run directory behind (rewards/sandbox.py).

pdflatex gets ``PR_SET_PDEATHSIG`` = SIGKILL, so it dies with the process that started it; run directories live
under a parent named after that process (pid and start time), which ``sweep_orphans`` removes once the process is
gone: the next render does it, and the reward pool does it right after killing a worker. These tests kill a real
rendering process and a real reward worker in the middle of a TeX run and then look at ``/proc`` and the disk.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest

from mmrl.rewards import landlock, sandbox
from mmrl.rewards.compose import CompositeReward, RewardConfig
from mmrl.rewards.sandbox import render_latex, sweep_orphans
from mmrl.types import RewardInput

pytestmark = pytest.mark.tex
LOOP = r"\def\x{\x}\x"  # passes the screen (a definition: its own run) and spins until the TeX timeout
TABLE = r"\begin{tabular}{c}a\end{tabular}"
RENDER = "import sys\nfrom mmrl.rewards.sandbox import render_latex\nrender_latex([sys.argv[2]], root=sys.argv[1], timeout_s=300)\n"


@pytest.fixture(autouse=True)
def _confined(monkeypatch):
    if landlock.kernel_abi() == 0:  # cleanup does not depend on Landlock; run it unconfined on such kernels
        monkeypatch.setenv(sandbox.ALLOW_UNCONFINED_ENV, "1")


def _wait_for(condition, what: str, limit_s: float = 120.0):
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"gave up waiting for {what}")


def _tex_under(folder: Path) -> list[psutil.Process]:
    """Live pdflatex processes whose working directory is inside ``folder``."""
    out = []
    for p in psutil.process_iter(["name"]):
        try:
            if p.info["name"] in ("pdflatex", "pdftex") and p.status() != psutil.STATUS_ZOMBIE:
                if Path(p.cwd()).is_relative_to(folder):
                    out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, FileNotFoundError):
            continue
    return out


def _gone(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE  # dead, waiting for init to reap it
    except psutil.NoSuchProcess:
        return True


def test_killing_a_rendering_process_kills_its_tex_run_and_the_sweep_removes_its_folder(tmp_path: Path):
    driver = subprocess.Popen([sys.executable, "-c", RENDER, str(tmp_path), LOOP])
    try:
        (tex,) = _wait_for(lambda: _tex_under(tmp_path), "the TeX run to start")
        (parent,) = list(tmp_path.iterdir())
        assert parent.name.startswith(f"mmrl-render-{driver.pid}-") and Path(tex.cwd()).parent == parent
        driver.kill()
        driver.wait()
        _wait_for(lambda: _gone(tex), "pdflatex to die with its parent", limit_s=10)
        assert parent.is_dir()  # nobody was left to remove it
        assert sweep_orphans(tmp_path) == 1
        assert list(tmp_path.iterdir()) == [] and _tex_under(tmp_path) == []
    finally:
        driver.kill()
        driver.wait()


def test_the_sweep_removes_dead_owners_folders_and_never_a_live_ones(tmp_path: Path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    orphan = tmp_path / f"mmrl-render-{dead.pid}-1-k2_x9q"  # mkdtemp's suffix alphabet
    (orphan / "mmrl-tex-x").mkdir(parents=True)
    (orphan / "mmrl-tex-x" / "job.log").write_text("left behind")
    ticks = sandbox._start_ticks(os.getpid())
    mine = tmp_path / f"mmrl-render-{os.getpid()}-{ticks}-def456"  # this live process's, mid-render
    mine.mkdir()
    reused = (
        tmp_path / f"mmrl-render-{os.getpid()}-{ticks + 1}-0a1b2c"
    )  # same pid, other start time: dead owner
    reused.mkdir()
    other = tmp_path / "not-ours"
    other.mkdir()
    assert sweep_orphans(tmp_path) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([mine.name, "not-ours"])


def test_render_latex_sweeps_its_root_before_its_first_render(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(sandbox, "_SWEPT", set())
    dead = subprocess.Popen(["true"])
    dead.wait()
    orphan = tmp_path / f"mmrl-render-{dead.pid}-7-aa11"
    orphan.mkdir()
    assert render_latex([TABLE], root=tmp_path)[0].ok
    assert list(tmp_path.iterdir()) == []  # the orphan is swept, this call's own folder removed


def test_killing_a_reward_worker_mid_render_leaves_no_tex_and_no_folder():
    """The real pool: SIGKILL the worker while its pdflatex spins; the item runs once more alone in a new worker (a
    kill from outside costs it nothing), killed again it scores 0 with the reason; each time nothing is left."""
    root = Path(tempfile.gettempdir())
    reward = CompositeReward(
        [RewardConfig("latex_table", options={"timeout_s": 120.0})], num_workers=1, timeout_s=300
    )
    batch = [RewardInput(id="spin", response=LOOP, reference=LOOP)]  # one text: exactly one TeX run
    out: dict = {}
    caller = threading.Thread(target=lambda: out.update(results=reward(batch)))
    caller.start()
    try:

        def ours() -> list[psutil.Process]:
            kids = {p.pid for p in psutil.Process().children(recursive=True)}
            return [p for p in _tex_under(root) if p.pid in kids]

        killed = []
        for attempt in range(2):  # the first death, then the retry's
            (tex,) = _wait_for(
                lambda: [t for t in ours() if t.pid not in killed], f"TeX run {attempt + 1} to start"
            )
            worker = tex.parent()
            parent = Path(tex.cwd()).parent
            assert parent.name.startswith(f"mmrl-render-{worker.pid}-")
            worker.send_signal(signal.SIGKILL)
            killed.append(tex.pid)
            _wait_for(
                lambda parent=parent: not parent.exists(),
                "the dead worker's folder to be removed",
                limit_s=30,
            )
            _wait_for(lambda tex=tex: _gone(tex), "pdflatex to die with its worker", limit_s=10)
            assert list(root.glob(f"mmrl-render-{worker.pid}-*")) == []
        caller.join(timeout=120)
        assert not caller.is_alive()
        (result,) = out["results"]
        assert result.score == 0.0 and "worker process died" in result.errors[0]["error"]
        assert ours() == []
    finally:
        reward.close()
        caller.join(timeout=10)
