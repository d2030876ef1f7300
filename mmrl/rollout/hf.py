"""HF ``generate`` rollout engine: runs wherever the policy runs (CPU, one GPU, each rank under accelerate).

Log-probs come from ``output_logits`` (the raw logits, before temperature/top-p processing), as
``log_softmax(logits / temperature)`` of the sampled token: the same quantity the trainer's forward computes, so
the importance ratio is exactly 1 on-policy. Top-p/top-k shape only which token is drawn, not its log-prob; this
matches how the training forward scores it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mmrl.policy import EncodedPrompt, Policy
from mmrl.rollout.base import ENGINES, Completion, SamplingParams


@ENGINES.register("hf")
class HFEngine:
    def __init__(self, policy: Policy, batch_size: int = 16):
        self.policy = policy
        self.batch_size = batch_size

    def sync_weights(self) -> None:  # generation uses the training model itself
        return None

    @torch.no_grad()
    def generate(self, prompts: list[EncodedPrompt], params: SamplingParams) -> list[list[Completion]]:
        expanded = [p for p in prompts for _ in range(params.n)]
        flat: list[Completion] = []
        step = max(1, self.batch_size * params.n)
        for i in range(0, len(expanded), step):
            flat.extend(self._generate_batch(expanded[i : i + step], params))
        return [flat[i * params.n : (i + 1) * params.n] for i in range(len(prompts))]

    def _generate_batch(self, prompts: list[EncodedPrompt], params: SamplingParams) -> list[Completion]:
        pol = self.policy
        ids, attn, mm, P = pol.collate(prompts)
        greedy = params.temperature <= 0
        gen_kwargs = dict(
            max_new_tokens=params.max_new_tokens,
            do_sample=not greedy,
            eos_token_id=pol.eos_ids,
            pad_token_id=pol.pad_id,
            output_logits=True,
            return_dict_in_generate=True,
            use_cache=True,
        )
        if not greedy:
            gen_kwargs.update(
                temperature=params.temperature, top_p=params.top_p, top_k=params.top_k
            )  # 0 disables top-k
        was_training = pol.model.training
        pol.model.eval()
        out = pol.model.generate(input_ids=ids, attention_mask=attn, **mm, **gen_kwargs)
        pol.model.train(was_training)
        seqs = out.sequences[:, P:]  # [B, T]
        logits = torch.stack(out.logits, dim=1).float()  # [B, T, V]
        if not greedy:
            logits = logits / params.temperature
        logp = F.log_softmax(logits, dim=-1).gather(-1, seqs.unsqueeze(-1)).squeeze(-1)  # [B, T]
        return [self._completion(seqs[b].tolist(), logp[b].tolist()) for b in range(seqs.shape[0])]

    def _completion(self, tokens: list[int], logps: list[float]) -> Completion:
        eos = set(self.policy.eos_ids)
        end = next((j + 1 for j, t in enumerate(tokens) if t in eos), None)
        reason = "stop" if end is not None else "length"
        tokens, logps = (tokens[:end], logps[:end]) if end is not None else (tokens, logps)
        text = self.policy.tokenizer.decode(tokens, skip_special_tokens=True)
        return Completion(token_ids=tokens, text=text, logprobs=logps, finish_reason=reason)
