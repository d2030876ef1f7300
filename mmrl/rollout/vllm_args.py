"""The keyword arguments ``vllm.LLM`` accepts, for the vLLM engine's pre-flight (:mod:`mmrl.rollout.vllm`): read
from the installed vLLM's source without importing it, or the list captured from the pinned version."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path


def engine_arg_names() -> set[str]:
    """What ``vllm.LLM(**kwargs)`` accepts: ``EngineArgs``' fields and LLM's own parameters, read from the installed
    vLLM's source (importing vLLM takes seconds and logs to stderr) or, where vLLM is not installed (or its source is
    not laid out as in the pinned version, which :meth:`VLLMEngine.check` then refuses), the pinned version's list."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return set(ENGINE_ARGS)
    root = Path(spec.submodule_search_locations[0])
    engine_args = class_node(root / "engine" / "arg_utils.py", "EngineArgs")
    llm = class_node(root / "entrypoints" / "llm.py", "LLM")
    init = (
        next((n for n in llm.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
        if llm
        else None
    )
    if engine_args is None or init is None:
        return set(ENGINE_ARGS)
    fields = {  # the dataclass's fields: its annotated class attributes but ClassVars
        s.target.id
        for s in engine_args.body
        if isinstance(s, ast.AnnAssign)
        and isinstance(s.target, ast.Name)
        and "ClassVar" not in ast.unparse(s.annotation)
    }
    params = {a.arg for a in init.args.args + init.args.kwonlyargs}
    return {n for n in fields if not n.startswith("_")} | (params - {"self"})


def class_node(path: Path, name: str) -> ast.ClassDef | None:
    tree = ast.parse(path.read_text()) if path.is_file() else ast.Module(body=[], type_ignores=[])
    return next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)


# vllm.LLM's keyword arguments in vLLM 0.32.0 (its own and EngineArgs' fields), for checking engine_options where vLLM
# is not installed; where it is, the installed version's are read (a test compares the two)
ENGINE_ARGS = frozenset(
    """
additional_config aggregate_engine_logging all2all_backend allow_deprecated_quantization
allowed_local_media_path allowed_media_domains async_scheduling attention_backend attention_config
aux_output_config block_size chat_template code_revision collect_detailed_traces compilation_config
config_format convert cp_kv_cache_interleave_size cpu_distributed_timeout_seconds cpu_offload_gb
cpu_offload_params cudagraph_capture_sizes cudagraph_metrics custom_histogram_buckets data_parallel_address
data_parallel_backend data_parallel_external_lb data_parallel_hybrid_lb data_parallel_multi_port_external_lb
data_parallel_rank data_parallel_rpc_port data_parallel_size data_parallel_size_local
data_parallel_start_rank dbo_decode_token_threshold dbo_prefill_token_threshold dcp_comm_backend
dcp_kv_cache_interleave_size dcp_q_replicate decode_context_parallel_size default_mm_loras device_ids
diffusion_config disable_cascade_attn disable_chunked_mm_input disable_custom_all_reduce
disable_hybrid_kv_cache_manager disable_log_stats disable_nccl_for_dp_synchronization disable_sliding_window
distributed_executor_backend distributed_timeout_seconds download_dir dp_sync_interval dtype
ec_manager_config ec_transfer_config elastic_ep_max_dp_size enable_batch_sharded_sampling
enable_chunked_prefill enable_cumem_allocator enable_dbo enable_elastic_ep enable_ep_weight_filter
enable_eplb enable_expert_parallel enable_fault_tolerance enable_flashinfer_autotune enable_hc_sp
enable_layerwise_nvtx_tracing enable_logging_iteration_details enable_lora
enable_mamba_cache_stochastic_rounding enable_mamba_shared_prefix_checkpoint enable_mfu_metrics
enable_mixed_moe_lora_format enable_mm_embeds enable_mm_processor_stats enable_moe_shared_loras
enable_nccl_comm_suspend enable_prefix_caching enable_prompt_embeds enable_return_routed_experts
enable_shm_tensor_arena enable_sleep_mode enable_tower_connector_lora enable_trace_replay enforce_eager
engram_config eplb_config expert_placement_strategy fail_on_environ_validation fault_tolerance_config
fully_sharded_loras gdn_prefill_backend generation_config gpu_memory_utilization hf_config_path hf_overrides
hf_token ignore_patterns interleave_mm_strings io_processor_plugin ir_op_priority jit_monitor_mode
jit_monitor_verbose kda_decode_backend kda_prefill_backend kernel_config kv_cache_dtype
kv_cache_dtype_skip_layers kv_cache_memory_bytes kv_cache_metrics kv_cache_metrics_sample kv_events_config
kv_offloading_backend kv_offloading_size kv_sharing_fast_prefill kv_transfer_config language_model_only
limit_mm_per_prompt linear_backend load_format log_config_file log_level logging_config logits_processors
logprobs_mode long_prefill_token_threshold long_prefill_token_threshold_adaptive lora_dtype
lora_target_modules mamba_backend mamba_block_size mamba_cache_dtype mamba_cache_mode
mamba_cache_philox_rounds mamba_config mamba_ssm_cache_dtype mamba_ssu_algorithm master_addr master_port
max_cpu_loras max_cudagraph_capture_size max_logprobs max_lora_cls_labels max_lora_rank max_loras
max_model_len max_num_active_seqs max_num_batched_tokens max_num_queued_reqs max_num_queued_tokens
max_num_scheduled_tokens max_num_seqs max_parallel_loading_workers media_io_kwargs mm_device_do_normalize
mm_encoder_attn_backend mm_encoder_attn_dtype mm_encoder_fp8_scale_path mm_encoder_fp8_scale_save_margin
mm_encoder_fp8_scale_save_path mm_encoder_only mm_encoder_tp_mode mm_hasher_algorithm mm_ipc_gpu_memory_gb
mm_processor_cache_gb mm_processor_cache_type mm_processor_device mm_processor_kwargs
mm_shm_cache_max_object_size_mb mm_tensor_ipc model model_class_overrides model_impl
model_loader_extra_config model_weights moe_backend nnodes node_rank num_gpu_blocks_override numa_bind
numa_bind_cpus numa_bind_nodes offload_backend offload_group_size offload_num_in_group offload_params
offload_prefetch_step optimization_level otlp_traces_endpoint override_generation_config
per_request_spec_decode_metrics performance_mode pipeline_parallel_size pooler_config
prefill_context_parallel_size prefill_schedule_interval prefix_cache_retention_interval
prefix_caching_hash_algo prefix_match_unit profiler_config pt_load_map_location quantization
quantization_config ray_workers_use_nsight reasoning_config reasoning_parser reasoning_parser_plugin
renderer_num_workers replayssm_buffer_len return_sampling_mask revision runner safetensors_load_strategy
safetensors_prefetch_block_size safetensors_prefetch_num_threads scheduler_cls scheduler_reserve_full_isl
scheduling_policy seed served_model_name show_hidden_metrics_for_version shutdown_timeout skip_mm_profiling
skip_tokenizer_init sleep_mode_offload_cudagraph sleep_preserve_parameter_names sparse_indexer_topk_backend
spec_method spec_model spec_tokens specialize_active_lora speculative_config stream_interval
structured_outputs_config swa_bounded_replay tensor_parallel_size tokenizer tokenizer_mode
tokenizer_revision tokens_only trust_remote_code ubatch_size use_fp64_gumbel use_replayssm use_tqdm_on_load
video_pruning_method video_pruning_rate watermark watermark_config weight_transfer_config worker_cls
worker_extension_cls
""".split()
)
