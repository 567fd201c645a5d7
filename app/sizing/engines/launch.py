"""The serving engine's command line that realizes a planned configuration.

Flags are the engines' own (vLLM `vllm serve`, SGLang `python -m sglang.launch_server`, TensorRT-LLM
`trtllm-serve`), spelled by each engine's module. Precisions that need a pre-quantized checkpoint are not
switched on by a flag: the engines read the quantization from the checkpoint's config, so the notes say
which checkpoint to serve.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from app.sizing.engines import ENGINES
from app.sizing.engines.base import LaunchSpec

# Weight precisions that need a checkpoint quantized ahead of time (no engine quantizes them on load).
CHECKPOINT_FORMATS = {
    "int8": "a W8A8 int8 checkpoint (e.g. made with llm-compressor)",
    "int4": "an int4 AWQ or GPTQ checkpoint",
    "fp4": "an FP4 checkpoint (NVFP4 or MXFP4)",
}


@dataclass(frozen=True, slots=True)
class LaunchCommand:
    command: str | None  # None for the generic engine (no command line to give)
    notes: tuple[str, ...]


def launch_command(spec: LaunchSpec, role: str | None = None, kv_over_nvlink: bool = False) -> LaunchCommand:
    """The command for an aggregated replica, or for a disaggregated deployment's `role` worker whose KV the
    plan moves over NVLink (`kv_over_nvlink`) or the network."""
    rules = ENGINES[spec.engine]
    words = rules.launch_words(spec)
    role_notes = [] if role is None else rules.disaggregation_notes(role)
    if words is None:
        return LaunchCommand(None, tuple(rules.launch_notes(spec) + role_notes))
    if role is not None:
        words = rules.disaggregation_env(kv_over_nvlink) + words + rules.disaggregation_words(role)
    notes = _precision_notes(spec) + _node_notes(spec, role) + rules.launch_notes(spec) + role_notes
    if spec.draft_tokens is not None and not rules.speculative_flags:
        notes.append(f"speculative decoding ({spec.draft_tokens} draft tokens) is configured with the "
                     f"engine's own speculative options, not shown here")
    return LaunchCommand(shlex.join(words), tuple(notes))


def _precision_notes(spec: LaunchSpec) -> list[str]:
    notes = []
    if spec.weight_dtype != spec.model_dtype and spec.weight_dtype in CHECKPOINT_FORMATS:
        notes.append(f"serve {CHECKPOINT_FORMATS[spec.weight_dtype]} of the model: the engine reads its "
                     "quantization from the checkpoint")
    if spec.kv_dtype == "fp32" and spec.model_dtype != "fp32":
        notes.append(f"fp32 KV cache: the engines cache in the dtype the model is served in ('auto'), fp32 only with "
                     f"the model served in fp32, its weights too; with {spec.weight_dtype} weights they cache 16-bit")
    return notes


def _node_notes(spec: LaunchSpec, role: str | None) -> list[str]:
    """A replica (or a disaggregated worker) larger than a node: one command, started across its nodes."""
    if spec.nodes == 1:
        return []
    gpus = spec.tensor_parallel * spec.pipeline_parallel * spec.data_parallel
    unit = "replica" if role is None else f"{role} worker"
    note = (f"one {unit} spans {spec.nodes} nodes ({gpus} GPUs, tensor parallelism inside each node): the command "
            f"gives the whole {unit}'s degrees; start it across those nodes with the engine's multi-node launch")
    return [note]
