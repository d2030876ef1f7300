"""HF ``generate`` rollout engine: runs wherever the policy runs (CPU, one GPU, each rank under accelerate).

Log-probs are ``log_softmax(logits / temperature)`` of the sampled token, computed from the plain logits with the
vision placeholders masked (the policy's support), before top-k/top-p shape which token is drawn: the same quantity
the trainer's forward computes, so the importance ratio is exactly 1 on-policy (as TRL and verl score it). The
output head runs in fp32 during generation (:func:`mmrl.logprobs.fp32_head`), as in the training forward, so under
``model.dtype: bfloat16`` neither side rounds a logit to bf16: tokens are drawn from, and recorded with, the
log-probs the trainer scores (up to the bf16 backbone's own kernel differences between cached decoding and one
full forward).

The engine builds its own processor chain, in this order: suppress vision placeholders -> record the log-prob ->
temperature -> top-k -> top-p. The recorder keeps one step of ``[B, V]`` scaled logits (to read the log-prob of the
token drawn from them at the next step) instead of ``output_logits`` for every step, which at Qwen's vocabulary and
1,024-token responses would be ``B x 1024 x 151,936`` floats. Sampling settings come only from
:class:`SamplingParams`: the policy has replaced the checkpoint's generation config by a neutral one, and every field
transformers would otherwise default (top_k=50!) is set here explicitly.
"""

from __future__ import annotations

import logging

import torch

from mmrl.logprobs import fp32_head
from mmrl.policy import EncodedPrompt, Policy
from mmrl.rollout.base import ENGINES, Completion, SamplingParams

log = logging.getLogger("mmrl.rollout")


class _LogprobRecorder:
    """Logits processor recording ``log softmax(scores / temperature)`` of each sampled token, one step late."""

    def __init__(self, temperature: float):
        self.temperature = temperature
        self.prev: torch.Tensor | None = None  # [B, V] scaled scores of the previous step
        self.prev_lse: torch.Tensor | None = None  # [B]
        self.logps: list[torch.Tensor] = []  # each [B]

    def _take(self, tokens: torch.Tensor) -> None:
        assert self.prev is not None and self.prev_lse is not None
        self.logps.append(self.prev.gather(-1, tokens[:, None]).squeeze(-1) - self.prev_lse)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.prev is not None:
            self._take(input_ids[:, -1])
        self.prev = scores.float() / self.temperature
        self.prev_lse = torch.logsumexp(self.prev, dim=-1)
        return scores

    def finish(self, sequences: torch.Tensor) -> torch.Tensor:
        """``sequences [B, T]`` (generated part) -> ``logp [B, T]``."""
        if self.prev is not None and len(self.logps) < sequences.shape[1]:
            self._take(sequences[:, len(self.logps)])
        self.prev = self.prev_lse = None
        return (
            torch.stack(self.logps, dim=1)
            if self.logps
            else sequences.new_zeros(sequences.shape, dtype=torch.float)
        )


def _warn_truncated_sampling(params: SamplingParams) -> None:
    if params.temperature > 0 and (params.top_p < 1.0 or params.top_k > 0):
        log.warning(
            "top_p=%s / top_k=%s shape which token is drawn, but log-probs (and so pi_old and the importance ratio) "
            "are of the untruncated distribution logits / temperature, as in TRL and verl",
            params.top_p,
            params.top_k,
        )


@ENGINES.register("hf")
class HFEngine:
    def __init__(self, policy: Policy, batch_size: int = 16):
        self.policy = policy
        self.batch_size = batch_size
        self._warned = False

    def sync_weights(self) -> None:  # generation uses the training model itself
        return None

    @torch.no_grad()
    def generate(self, prompts: list[EncodedPrompt], params: SamplingParams) -> list[list[Completion]]:
        if not self._warned:
            _warn_truncated_sampling(params)
            self._warned = True
        expanded = [p for p in prompts for _ in range(params.n)]
        flat: list[Completion] = []
        step = max(1, self.batch_size * params.n)
        for i in range(0, len(expanded), step):
            flat.extend(self._generate_batch(expanded[i : i + step], params))
        return [flat[i * params.n : (i + 1) * params.n] for i in range(len(prompts))]

    def _processors(self, params: SamplingParams) -> tuple[list, _LogprobRecorder]:
        from transformers import (
            SuppressTokensLogitsProcessor,
            TemperatureLogitsWarper,
            TopKLogitsWarper,
            TopPLogitsWarper,
        )

        pol, greedy = self.policy, params.temperature <= 0
        recorder = _LogprobRecorder(1.0 if greedy else params.temperature)
        chain: list = []
        if pol.suppressed_token_ids:
            chain.append(SuppressTokensLogitsProcessor(pol.suppressed_token_ids, device=pol.device))
        chain.append(recorder)
        if not greedy:
            if params.temperature != 1.0:
                chain.append(TemperatureLogitsWarper(params.temperature))
            if params.top_k > 0:
                chain.append(TopKLogitsWarper(params.top_k))
            if params.top_p < 1.0:
                chain.append(TopPLogitsWarper(params.top_p))
        return chain, recorder

    def _generate_batch(self, prompts: list[EncodedPrompt], params: SamplingParams) -> list[Completion]:
        from transformers import GenerationConfig, LogitsProcessorList

        pol = self.policy
        ids, attn, mm, P = pol.collate(prompts)
        chain, recorder = self._processors(params)
        sampling = params.temperature > 0
        # when sampling, temperature/top-k/top-p are applied by the chain, after the recorder; transformers would
        # otherwise add its own (top_k defaults to 50). Greedy decoding adds no warpers at all.
        warpers = {"temperature": 1.0, "top_k": 0, "top_p": 1.0} if sampling else {}
        config = GenerationConfig(
            max_new_tokens=params.max_new_tokens,
            do_sample=sampling,
            **warpers,
            eos_token_id=pol.eos_ids,
            pad_token_id=pol.pad_id,
            bos_token_id=pol.model.generation_config.bos_token_id,
            use_cache=True,
            return_dict_in_generate=True,
        )
        pol.model.eval()
        with pol.autocast(), fp32_head(pol.model.get_output_embeddings()):
            out = pol.model.generate(
                input_ids=ids,
                attention_mask=attn,
                generation_config=config,
                logits_processor=LogitsProcessorList(chain),
                # transformers turns this on for an FSDP-sharded model; under Policy.full_weights every rank holds
                # the whole model, so a rank generates alone (rank 0 evaluates alone) with no per-token collective
                synced_gpus=False,
                **mm,
            )
        seqs = out.sequences[:, P:]  # [B, T]
        logp = recorder.finish(seqs)  # [B, T]
        return [self._completion(seqs[b].tolist(), logp[b].tolist()) for b in range(seqs.shape[0])]

    def _completion(self, tokens: list[int], logps: list[float]) -> Completion:
        eos = set(self.policy.eos_ids)
        end = next((j + 1 for j, t in enumerate(tokens) if t in eos), None)
        reason = "stop" if end is not None else "length"
        tokens, logps = (tokens[:end], logps[:end]) if end is not None else (tokens, logps)
        text = self.policy.decode(tokens)
        return Completion(token_ids=tokens, text=text, logprobs=logps, finish_reason=reason)
