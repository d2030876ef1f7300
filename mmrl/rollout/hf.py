"""HF ``generate`` rollout engine: runs wherever the policy runs (CPU, one GPU, each rank under accelerate).

Log-probs are ``log_softmax(logits / temperature)`` of the sampled token, computed from the plain logits with the
vision placeholders masked (the policy's support), before top-k/top-p shape which token is drawn: the same quantity
the trainer's forward computes, so the importance ratio is exactly 1 on-policy (as TRL and verl score it). The
output head runs in fp32 during generation (:func:`mmrl.model.logprobs.fp32_head`), as in the training forward, so under
``model.dtype: bfloat16`` neither side rounds a logit to bf16: tokens are drawn from, and recorded with, the
log-probs the trainer scores (up to the bf16 backbone's own kernel differences between cached decoding and one
full forward).

The engine builds its own processor chain, in this order: suppress vision placeholders -> record the log-prob ->
temperature -> top-k -> top-p -> draw. The recorder keeps one step of ``[B, V]`` scaled logits (to read the log-prob
of the token drawn from them at the next step) instead of ``output_logits`` for every step, which at Qwen's vocabulary
and 1,024-token responses would be ``B x 1024 x 151,936`` floats. Sampling settings come only from
:class:`SamplingParams`: the policy has replaced the checkpoint's generation config by a neutral one, and ``generate``
runs greedy, so transformers adds none of its own warpers (its top_k would default to 50!).

The draw is hand-written (:func:`draw`, run by the chain's last processor, which hands ``generate`` a one-hot row for
its argmax to take), because transformers samples with ``torch.multinomial``, which for one sample draws an Exp(1)
variate per vocabulary entry (``argmax(p / q)``): on CPU that was most of a decode step. :func:`draw` is exact
inverse-CDF sampling with one uniform per row (the same distribution, ``tests/test_hf_sampler.py``, and the same
``torch.manual_seed`` reproducibility); at Qwen's vocabulary (151,936) on one CPU thread it takes 0.11 ms for 8 rows
and 1.3 ms for 64, where multinomial takes 17-19 and 154-167 ms (130-170x; with the softmax and the one-hot row, the
whole processor vs transformers' softmax + multinomial: ~35x at 8 rows, ~8x at 64, ``benchmarks/sampler.py``).
Greedy decoding (temperature 0) has no draw: the argmax of the suppressed logits.
"""

from __future__ import annotations

import copy
import logging
import math
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext

import torch
import torch.nn.functional as F

from mmrl.model.logprobs import fp32_head
from mmrl.model.packing import encode_media_once
from mmrl.model.policy import Policy
from mmrl.model.prompt import EncodedPrompt
from mmrl.rollout.base import ENGINES, Completion, RolloutEngine, SamplingParams

log = logging.getLogger("mmrl.rollout")


class _LogprobRecorder:
    """Logits processor recording ``log softmax(scores / temperature)`` of each sampled token, one step late."""

    def __init__(self, temperature: float, version: Callable[[], int] = lambda: 0, top: int = 0):
        self.temperature = temperature
        self.top = top  # > 0: also the top-``top`` tokens of log softmax(scores) (T = 1) per step
        self.tops: list[tuple[torch.Tensor, torch.Tensor]] = []  # each ([B, top] log-probs, [B, top] ids)
        self.version = version  # the version of the weights whose scores this step sees
        self.versions: list[int] = []  # per generated token
        self.prev: torch.Tensor | None = None  # [B, V] scaled scores of the previous step
        self.prev_lse: torch.Tensor | None = None  # [B]
        self.logps: list[torch.Tensor] = []  # each [B]

    def _take(self, tokens: torch.Tensor) -> None:
        assert self.prev is not None and self.prev_lse is not None
        self.logps.append(self.prev.gather(-1, tokens[:, None]).squeeze(-1) - self.prev_lse)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.prev is not None:
            self._take(input_ids[:, -1])
        self.versions.append(self.version())  # the token drawn from these scores
        if self.top:
            self.tops.append(torch.log_softmax(scores.float(), dim=-1).topk(self.top, dim=-1))
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


def draw(probs: torch.Tensor) -> torch.Tensor:
    """One token per row of ``probs [B, V]`` (rows need not sum to 1), drawn with ``P(v) = probs[v] / probs.sum()``.

    Inverse-CDF sampling with one float64 uniform per row from the global RNG (``torch.manual_seed`` repeats a run),
    in two levels so that no ``[B, V]`` cumulative sum is written: the row is cut into blocks of ~sqrt(V) tokens, a
    block is picked by its mass, then a token inside it by what is left of the same uniform. Block masses are float32
    sums (relative error ~1e-7, as the probabilities' own) and the cumulative sums float64, so every token owns a
    slice of [0, total) as wide as its probability (a float32 CDF over 151,936 tokens would round each slice to whole
    ulps of 6e-8: rare tokens drawn too often or never). A zero-probability token's slice is empty and a
    ``right=True`` search never stops on one; the rare row where rounding leaves the uniform at the very end of the
    row or of its block (``u * total == total``) is redrawn by ``torch.multinomial``, and so is a NaN row, which
    multinomial then reports. On CUDA the check costs one host sync per step, as generate's own stopping check does.
    """
    B, V = probs.shape
    size = math.isqrt(V)
    full = V // size * size
    mass = probs[:, :full].unflatten(-1, (-1, size)).sum(-1)  # [B, nb]
    if full < V:
        mass = torch.cat([mass, probs[:, full:].sum(-1, keepdim=True)], dim=-1)
    mass = mass.double()
    cdf = F.pad(mass.cumsum(-1), (1, 0))  # [B, nb + 1], cdf[:, b] = mass of the blocks before b
    u = torch.rand(B, 1, dtype=torch.float64, device=probs.device) * cdf[:, -1:]  # [B, 1]
    block = (torch.searchsorted(cdf, u, right=True) - 1).clamp_(max=mass.shape[1] - 1)  # [B, 1]
    tokens = block * size + torch.arange(size, device=probs.device)  # [B, size]
    inside = probs.gather(-1, tokens.clamp(max=V - 1)).double().masked_fill_(tokens >= V, 0.0)  # [B, size]
    pick = torch.searchsorted(inside.cumsum(-1), u - cdf.gather(-1, block), right=True).clamp_(max=size - 1)
    token = tokens.gather(-1, pick).clamp_(max=V - 1)  # [B, 1]
    bad = ~(probs.gather(-1, token) > 0).squeeze(-1)  # [B]; NaN rows too, which multinomial then reports
    if bad.any():
        token[bad] = torch.multinomial(probs[bad], 1)
    return token.squeeze(-1)


class _Draw:
    """The chain's last processor: draws the next token from ``softmax(scores)`` with :func:`draw` and returns a
    one-hot row (0 at the drawn token, -inf elsewhere), which generate's greedy argmax then takes. A processor put
    after it (a test forcing a token) still decides, as it would under sampling."""

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(scores.float(), dim=-1)  # [B, V]
        token = draw(probs)  # [B]
        # the one-hot row reuses the softmax's buffer: a fresh [B, V] tensor costs as much again in page faults on CPU
        return probs.fill_(float("-inf")).scatter_(-1, token[:, None], 0.0)


def _warn_truncated_sampling(params: SamplingParams) -> None:
    if params.temperature > 0 and (params.top_p < 1.0 or params.top_k > 0):
        log.warning(
            "top_p=%s / top_k=%s shape which token is drawn, but log-probs (and so pi_old and the importance ratio) "
            "are of the untruncated distribution logits / temperature, as in TRL and verl",
            params.top_p,
            params.top_k,
        )


@ENGINES.register("hf")
class HFEngine(RolloutEngine):
    """``own_weights``: generate with a copy of the policy's weights (asynchronous rollouts, ``rollout.max_staleness``
    > 0: the trainer updates its weights while this engine generates). :meth:`sync_weights` then copies the trained
    weights in between two decoding steps of the requests running (each forward holds a lock the copy waits for), so
    a response's tokens may come from several versions, each recorded in ``Completion.versions``; the KV cache of the
    tokens before the copy is kept, as computed (docs/async.md#asynchronous-rollouts). Without it the engine generates
    with the training model itself and :meth:`sync_weights` has nothing to do."""

    def __init__(
        self, policy: Policy, batch_size: int = 16, own_weights: bool = False, in_flight: bool = False
    ):
        self.policy = policy
        self.batch_size = batch_size
        self._warned = False
        self.version = 0  # the policy version the generation weights hold: the syncs so far
        self.model = policy.model
        self.owns_weights = own_weights
        self._lock = threading.Lock()
        self._forward_version = 0  # the version of the weights of the forward that just ran
        self._hooked = own_weights or in_flight  # forwards hold the lock: weights may change in between
        if own_weights:
            self.model = copy.deepcopy(policy.model).eval().requires_grad_(False)
        if self._hooked:
            inner = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
            inner.register_forward_pre_hook(self._enter)
            inner.register_forward_hook(self._leave, always_call=True)

    def _enter(self, module, args) -> None:  # noqa: ANN001 (torch's hook signature)
        self._lock.acquire()
        self._forward_version = self.version

    def _leave(self, module, args, output) -> None:  # noqa: ANN001
        self._lock.release()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Between two decoding steps of the requests running (``in_flight``): no forward runs inside, so the
        generation weights may be replaced here (a generating process of a separate placement loads the pushed
        weights, :mod:`mmrl.train.placement`); the KV cache of the tokens so far is kept."""
        if not self._hooked:
            raise RuntimeError("HFEngine.paused needs in_flight=True (or own_weights=True)")
        with self._lock:
            yield

    def take_pushed(self, load: Callable[[], None], version: int) -> None:
        """A generating process of a separate placement: ``load`` writes the pushed weights into the generation
        weights (the policy's own: ``in_flight``) between two decoding steps, which then generate as ``version``."""
        with self.paused():
            load()
            self.version = version

    def sync_weights(self) -> None:
        """The trained weights into the copy, between two decoding steps; the version moves on."""
        if not self.owns_weights:
            self.version += 1
            return
        with self._lock, torch.no_grad():
            for src, dst in zip(self.policy.model.parameters(), self.model.parameters()):
                dst.copy_(src.detach())
            self.version += 1

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

    def generate_streaming(
        self,
        prompts: list[EncodedPrompt],
        params: SamplingParams,
        on_group: Callable[[int, list[Completion]], None],
    ) -> list[list[Completion]]:
        """:meth:`generate`, each chunk of ``batch_size`` prompts handed over group by group as soon as it is done:
        the same calls as :meth:`generate` makes, so the same completions."""
        out: list[list[Completion]] = []
        for s in range(0, len(prompts), max(1, self.batch_size)):
            groups = self.generate(prompts[s : s + max(1, self.batch_size)], params)
            for j, group in enumerate(groups):
                on_group(s + j, group)
            out += groups
        return out

    def _processors(self, params: SamplingParams) -> tuple[list, _LogprobRecorder]:
        from transformers import (
            SuppressTokensLogitsProcessor,
            TemperatureLogitsWarper,
            TopKLogitsWarper,
            TopPLogitsWarper,
        )

        pol, greedy = self.policy, params.temperature <= 0
        version = (lambda: self._forward_version) if self._hooked else (lambda: self.version)
        recorder = _LogprobRecorder(1.0 if greedy else params.temperature, version, params.top_logprobs)
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
            chain.append(_Draw())
        return chain, recorder

    def _generate_batch(self, prompts: list[EncodedPrompt], params: SamplingParams) -> list[Completion]:
        from transformers import GenerationConfig, LogitsProcessorList

        pol, model = self.policy, self.model
        ids, attn, mm, P = pol.collate(prompts)
        chain, recorder = self._processors(params)
        # greedy for transformers in both modes: when sampling, the chain ends in _Draw, whose one-hot row argmax
        # takes; so transformers adds no warpers of its own (its top_k would default to 50) and never calls multinomial
        config = GenerationConfig(
            max_new_tokens=params.max_new_tokens,
            do_sample=False,
            eos_token_id=pol.eos_ids,
            pad_token_id=pol.pad_id,
            bos_token_id=model.generation_config.bos_token_id,
            use_cache=True,
            return_dict_in_generate=True,
        )
        model.eval()
        with pol.autocast(), fp32_head(model.get_output_embeddings()):
            # the n rows of a prompt are the same EncodedPrompt: its media go through the vision tower once, and
            # generate gets the features (mm_encoder_outputs) instead of n copies of the pixels
            with torch.no_grad(), self._lock if self._hooked else nullcontext():
                mm = mm | encode_media_once(pol, prompts, mm, model)
            out = model.generate(
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
        versions = recorder.versions[: seqs.shape[1]]
        tops = None
        if recorder.tops:  # [B, T, k] each
            vals = torch.stack([v for v, _ in recorder.tops], dim=1)[:, : seqs.shape[1]].tolist()
            ids = torch.stack([i for _, i in recorder.tops], dim=1)[:, : seqs.shape[1]].tolist()
            tops = [[list(zip(i, v)) for i, v in zip(ids[b], vals[b])] for b in range(seqs.shape[0])]
        return [
            self._completion(seqs[b].tolist(), logp[b].tolist(), versions, None if tops is None else tops[b])
            for b in range(seqs.shape[0])
        ]

    def _completion(
        self, tokens: list[int], logps: list[float], versions: list[int], top: list | None = None
    ) -> Completion:
        eos = set(self.policy.eos_ids)
        end = next((j + 1 for j, t in enumerate(tokens) if t in eos), None)
        reason = "stop" if end is not None else "length"
        tokens, logps = (tokens[:end], logps[:end]) if end is not None else (tokens, logps)
        text = self.policy.decode(tokens)
        top = None if top is None else top[: len(tokens)]
        return Completion(tokens, text, logps, reason, versions=list(versions[: len(tokens)]), top=top)
