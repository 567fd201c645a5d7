"""The serving engine's command line that realizes a planned configuration.

Flags are the engines' own (vLLM `vllm serve`, SGLang `python -m sglang.launch_server`, TensorRT-LLM
`trtllm-serve`). Precisions that need a pre-quantized checkpoint are not switched on by a flag: the
engines read the quantization from the checkpoint's config, so the notes say which checkpoint to serve.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from app.sizing.capacity import GENERIC, SGLANG, TRTLLM, VLLM

SIXTEEN_BIT = ("bf16", "fp16")
# Weight precisions that need a checkpoint quantized ahead of time (no engine quantizes them on load).
CHECKPOINT_FORMATS = {
    "int8": "a W8A8 int8 checkpoint (e.g. made with llm-compressor)",
    "int4": "an int4 AWQ or GPTQ checkpoint",
    "fp4": "an FP4 checkpoint (NVFP4 or MXFP4)",
}


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """What the command must set; `speculative_*` only with speculative decoding."""

    engine: str
    model_id: str  # Hugging Face repository id (or a placeholder for an inline model)
    model_dtype: str  # the checkpoint's own weight precision
    tensor_parallel: int
    pipeline_parallel: int
    weight_dtype: str
    kv_dtype: str
    max_num_seqs: int | None
    max_num_batched_tokens: int
    max_model_len: int
    gpu_memory_utilization: float
    draft_tokens: int | None = None
    draft_model_id: str | None = None  # None with draft_tokens: n-gram (prompt lookup) proposals


@dataclass(frozen=True, slots=True)
class LaunchCommand:
    command: str | None  # None for the generic engine (no command line to give)
    notes: tuple[str, ...]


def launch_command(spec: LaunchSpec) -> LaunchCommand:
    notes = list(_precision_notes(spec))
    if spec.engine == VLLM:
        words = _vllm(spec)
    elif spec.engine == SGLANG:
        words = _sglang(spec)
    elif spec.engine == TRTLLM:
        words = _trtllm(spec)
    else:
        assert spec.engine == GENERIC
        return LaunchCommand(None, (("generic engine: set the same parallelism, batch limits and memory "
                                     "fraction in the engine you use"),))
    if spec.draft_tokens is not None and spec.engine != VLLM:
        notes.append(f"speculative decoding ({spec.draft_tokens} draft tokens) is configured with the "
                     f"engine's own speculative options, not shown here")
    return LaunchCommand(shlex.join(words), tuple(notes))


def _precision_notes(spec: LaunchSpec) -> list[str]:
    notes = []
    if spec.weight_dtype != spec.model_dtype and spec.weight_dtype in CHECKPOINT_FORMATS:
        notes.append(f"serve {CHECKPOINT_FORMATS[spec.weight_dtype]} of the model: the engine reads its "
                     "quantization from the checkpoint")
    if spec.kv_dtype == "int8":
        notes.append("int8 KV cache: vLLM and SGLang offer fp8 KV instead (same size); TensorRT-LLM takes int8 "
                     "KV from a checkpoint quantized with it")
    if spec.engine == TRTLLM and ((spec.weight_dtype == "fp8" and spec.model_dtype != "fp8") or spec.kv_dtype == "fp8"):
        notes.append("TensorRT-LLM takes fp8 weights and fp8 KV from a checkpoint quantized with NVIDIA ModelOpt")
    return notes


def _online_fp8(spec: LaunchSpec) -> bool:
    """fp8 weights from a 16-bit checkpoint: quantized on load by vLLM and SGLang."""
    return spec.weight_dtype == "fp8" and spec.model_dtype in SIXTEEN_BIT


def _vllm(spec: LaunchSpec) -> list[str]:
    words = ["vllm", "serve", spec.model_id, "--tensor-parallel-size", str(spec.tensor_parallel)]
    if spec.pipeline_parallel > 1:
        words += ["--pipeline-parallel-size", str(spec.pipeline_parallel)]
    if spec.max_num_seqs is not None:
        words += ["--max-num-seqs", str(spec.max_num_seqs)]
    words += ["--max-num-batched-tokens", str(spec.max_num_batched_tokens),
              "--max-model-len", str(spec.max_model_len),
              "--gpu-memory-utilization", f"{spec.gpu_memory_utilization:g}"]
    if spec.kv_dtype == "fp8":
        words += ["--kv-cache-dtype", "fp8"]
    if _online_fp8(spec):
        words += ["--quantization", "fp8"]
    if spec.draft_tokens is not None:
        config: dict[str, object] = (
            {"model": spec.draft_model_id, "num_speculative_tokens": spec.draft_tokens}
            if spec.draft_model_id is not None else
            {"method": "ngram", "num_speculative_tokens": spec.draft_tokens, "prompt_lookup_max": 4})
        words += ["--speculative-config", json.dumps(config, separators=(",", ":"))]
    return words


def _sglang(spec: LaunchSpec) -> list[str]:
    words = ["python", "-m", "sglang.launch_server", "--model-path", spec.model_id,
             "--tp-size", str(spec.tensor_parallel)]
    if spec.pipeline_parallel > 1:
        words += ["--pp-size", str(spec.pipeline_parallel)]
    if spec.max_num_seqs is not None:
        words += ["--max-running-requests", str(spec.max_num_seqs)]
    words += ["--chunked-prefill-size", str(spec.max_num_batched_tokens),
              "--context-length", str(spec.max_model_len),
              "--mem-fraction-static", f"{spec.gpu_memory_utilization:g}"]
    if spec.kv_dtype == "fp8":
        words += ["--kv-cache-dtype", "fp8_e4m3"]
    if _online_fp8(spec):
        words += ["--quantization", "fp8"]
    return words


def _trtllm(spec: LaunchSpec) -> list[str]:
    words = ["trtllm-serve", spec.model_id, "--tp_size", str(spec.tensor_parallel),
             "--pp_size", str(spec.pipeline_parallel)]
    if spec.max_num_seqs is not None:
        words += ["--max_batch_size", str(spec.max_num_seqs)]
    words += ["--max_num_tokens", str(spec.max_num_batched_tokens),
              "--max_seq_len", str(spec.max_model_len),
              "--kv_cache_free_gpu_memory_fraction", f"{spec.gpu_memory_utilization:g}"]
    return words
