"""vLLM: memory accounting, scheduler defaults, start-up checks and `vllm serve` flags (ENGINES.md, vLLM).

usable = gpu_memory_utilization (0.92 since v0.11, 0.90 before) × TOTAL memory; the KV cache gets what is
left after the weights, the activation peak of a dummy forward of `max_num_batched_tokens` tokens,
non-torch memory (CUDA context, NCCL, cuBLAS workspaces) and the CUDA-graph estimate that vLLM >= 0.11
subtracts before sizing the KV cache. Blocks are allocated on demand as tokens arrive.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from app.sizing.engines.base import (
    GIB,
    OF_TOTAL,
    ON_DEMAND,
    Default,
    LaunchSpec,
    non_torch_default,
    online_fp8,
)
from app.sizing.layout import EXPERT_PARALLEL, Layout, LayoutProblem
from app.sizing.model.activations import ACTIVATION_SOURCE, activation_peak_bytes
from app.sizing.specs import GpuSpec, ModelSpec

if TYPE_CHECKING:
    from app.sizing.engines import EngineConfig

VLLM_GPU_MEMORY_UTILIZATION = 0.92
VLLM_BLOCK_SIZE = 16
VLLM_CUDA_GRAPH_BYTES = round(0.45 * GIB)  # the measured example's estimate; vLLM >= 0.11 subtracts it
_CUDA_GRAPH_SOURCE = ("0.45 GiB measured (Llama-3.1-8B, H100); vLLM >= 0.11 subtracts its CUDA-graph "
                      "estimate before sizing the KV cache")


class Vllm:
    name = "vllm"
    utilization_of = OF_TOTAL
    kv_allocation = ON_DEMAND
    speculative_flags = True

    def defaults(self, config: EngineConfig, model: ModelSpec, gpu: GpuSpec, tensor_parallel: int,
                 pipeline_parallel: int) -> dict[str, Default]:
        large_gpu = gpu.memory_bytes >= 70 * GIB and "a100" not in f"{gpu.name} {gpu.slug}".lower()
        which = "on GPUs with >= 70 GiB other than A100" if large_gpu else "on GPUs under 70 GiB or A100"
        batched = config.max_num_batched_tokens or (8192 if large_gpu else 2048)
        return {
            "gpu_memory_utilization": (VLLM_GPU_MEMORY_UTILIZATION,
                                       "vLLM default 0.92 (v0.11 and later; 0.90 before)"),
            "max_num_seqs": (1024 if large_gpu else 256, f"vLLM default {which}"),
            "max_num_batched_tokens": (batched, f"vLLM server default {which}"),
            "block_size": (VLLM_BLOCK_SIZE, "vLLM default block of 16 tokens"),
            "activation_bytes_per_gpu": (activation_peak_bytes(model, batched, tensor_parallel),
                                         ACTIVATION_SOURCE),
            "non_torch_bytes_per_gpu": non_torch_default(tensor_parallel * pipeline_parallel),
            "cuda_graph_bytes_per_gpu": (VLLM_CUDA_GRAPH_BYTES, _CUDA_GRAPH_SOURCE),
            "reserved_bytes_per_gpu": (0, "none"),
        }

    def derived_max_num_seqs(self, kv_tokens: int, max_model_len: int) -> int | None:
        return None  # vLLM's max_num_seqs is a fixed default, never derived

    def mixes_prefill_into_decode(self, max_model_len: int, max_num_batched_tokens: int) -> bool:
        return True

    def start_refusals(self, max_model_len: int, max_context_tokens: int, kv_tokens: int) -> tuple[str, ...]:
        if max_context_tokens < max_model_len:
            return ((f"vLLM refuses to start: max_model_len {max_model_len} needs more KV cache than the "
                    f"{kv_tokens} tokens that fit; lower max_model_len to {max_context_tokens} or add GPUs"),)
        return ()

    def launch_words(self, spec: LaunchSpec) -> list[str] | None:
        words = ["vllm", "serve", spec.model_id, "--tensor-parallel-size", str(spec.tensor_parallel)]
        if spec.pipeline_parallel > 1:
            words += ["--pipeline-parallel-size", str(spec.pipeline_parallel)]
        if spec.data_parallel > 1:
            words += ["--data-parallel-size", str(spec.data_parallel)]
        if spec.expert_parallel > 1:  # ep = dp x tp: `layout_problems` allows nothing else
            words += ["--enable-expert-parallel"]
        if spec.max_num_seqs is not None:
            words += ["--max-num-seqs", str(spec.max_num_seqs)]
        words += ["--max-num-batched-tokens", str(spec.max_num_batched_tokens),
                  "--max-model-len", str(spec.max_model_len),
                  "--gpu-memory-utilization", f"{spec.gpu_memory_utilization:g}"]
        if spec.kv_dtype == "fp8":
            words += ["--kv-cache-dtype", "fp8"]
        if online_fp8(spec):
            words += ["--quantization", "fp8"]
        if spec.draft_tokens is not None:
            config: dict[str, object] = (
                {"model": spec.draft_model_id, "num_speculative_tokens": spec.draft_tokens}
                if spec.draft_model_id is not None else
                {"method": "ngram", "num_speculative_tokens": spec.draft_tokens, "prompt_lookup_max": 4})
            words += ["--speculative-config", json.dumps(config, separators=(",", ":"))]
        return words

    def launch_notes(self, spec: LaunchSpec) -> list[str]:
        return []

    def disaggregation_words(self, role: str) -> list[str]:
        # NixlConnector ignores kv_producer/kv_consumer: the proxy assigns the roles (ENGINES.md section 3).
        return ["--kv-transfer-config", json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"},
                                                   separators=(",", ":"))]

    def disaggregation_notes(self, role: str) -> list[str]:
        return [(f"{role} worker: the KV moves over NIXL (UCX; set UCX_TLS/UCX_NET_DEVICES for RDMA); "
                "VLLM_NIXL_SIDE_CHANNEL_HOST/PORT must be reachable from the other pool")]

    def disaggregation_router(self) -> str:
        return ("vLLM's NIXL proxy (tests/v1/kv_connector/nixl_integration/toy_proxy_server.py --prefiller-hosts "
                "PREFILL_HOSTS --decoder-hosts DECODE_HOSTS), or llm-d / NVIDIA Dynamo")

    def layout_problems(self, model: ModelSpec, layout: Layout) -> list[LayoutProblem]:
        """`--enable-expert-parallel` is all or nothing: ep = DP·TP and each rank owns whole experts;
        without it experts are TP-sharded over all DP·TP ranks (vLLM 0.13.0 `FusedMoEParallelConfig.make`).
        `E mod ep` need not be 0: the first ranks take one more expert (`determine_expert_map`)."""
        ep = layout.expert_parallel
        if ep not in (1, layout.moe_group):
            return [LayoutProblem(EXPERT_PARALLEL, f"vLLM's --enable-expert-parallel sets expert_parallel = "
                                  f"data_parallel x tensor_parallel = {layout.moe_group}; {ep} is not possible")]
        return []


ENGINE = Vllm()
