"""The activation peak of a forward pass: what an engine's profile run measures before sizing its KV cache
(SIZING.md section 7)."""

from __future__ import annotations

from app.sizing.model.params import ceil_div
from app.sizing.specs import ModelSpec

GIB = 1 << 30

# Measured on H100 80 GB, vLLM (version not stated), Llama-3.1-8B bf16, TP1, max-model-len 16k, taken as
# 8192 batched tokens (SIZING.md s7): weights 14.99 GiB, activation peak 4.76 GiB, non-torch 0.13 GiB.
# One point: it serves TensorRT-LLM's warm-up forward and vLLM before its V1 engine; vLLM V1's own peak is
# fitted on the vLLM 0.19 capacity runs (`engines.vllm.activation_peak_bytes`).
ACTIVATION_ANCHOR_BYTES = round(4.76 * GIB)  # 5,111,011,082
ACTIVATION_ANCHOR_TOKENS = 8192
# `activation_values_per_token` of Llama-3.1-8B at TP1: 2·4096 + (2·32 + 2·8)·128 + 3·14336.
ACTIVATION_ANCHOR_VALUES = 61_440

ACTIVATION_SOURCE = ("estimate: 4.76 GiB measured (vLLM before V1, Llama-3.1-8B, TP1, H100) scaled by batched "
                     "tokens and per-token activation width")


def activation_values_per_token(model: ModelSpec, tensor_parallel: int = 1) -> int:
    """16-bit values one token keeps live inside one decoder layer's forward, on one GPU.

    - residual stream and its normalized copy: 2·h (replicated under TP);
    - attention: Q, K, V projections and the attention output, (2·⌈H/tp⌉ + 2·⌈Hkv/tp⌉)·d; MLA: q
      (⌈H/tp⌉·(d_nope+d_rope)), the replicated latent (kv_lora + d_rope), the up-projected k_nope and v
      (⌈H/tp⌉·(d_nope+d_v)) and the output (⌈H/tp⌉·d_v);
    - dense MLP: gate+up output and the activated product, 3·⌈F/tp⌉;
    - MoE layer (vLLM's fused-MoE intermediate caches): per routed expert chosen, 3·⌈F_e/tp⌉ + h (the
      down projection's output is kept per expert before the weighted sum), i.e. k·(3·⌈F_e/tp⌉ + h),
      plus the shared experts 3·⌈S·F_s/tp⌉ and the router logits E.
    The largest layer kind counts (layers run one after another and free their buffers).
    """
    if tensor_parallel < 1:
        raise ValueError("tensor_parallel must be >= 1")
    tp, h = tensor_parallel, model.hidden_size
    heads = ceil_div(model.num_attention_heads, tp)
    if model.is_mla:
        assert model.kv_lora_rank is not None and model.qk_rope_head_dim is not None
        assert model.qk_nope_head_dim is not None and model.v_head_dim is not None
        attention = (heads * (model.qk_nope_head_dim + model.qk_rope_head_dim)
                     + model.kv_lora_rank + model.qk_rope_head_dim
                     + heads * (model.qk_nope_head_dim + model.v_head_dim) + heads * model.v_head_dim)
    else:
        attention = (2 * heads + 2 * ceil_div(model.num_key_value_heads, tp)) * model.resolved_head_dim
    mlp_widths = []
    if len(model.moe_layer_indices) < model.num_hidden_layers:
        mlp_widths.append(3 * ceil_div(model.dense_intermediate_size, tp))
    if model.is_moe:
        shared_width = model.shared_expert_intermediate_size or model.expert_intermediate_size
        mlp_widths.append(model.num_experts_per_tok * (3 * ceil_div(model.expert_intermediate_size, tp) + h)
                          + 3 * ceil_div(model.n_shared_experts * shared_width, tp) + model.num_experts)
    return 2 * h + attention + max(mlp_widths)


def activation_peak_bytes(model: ModelSpec, batched_tokens: int, tensor_parallel: int = 1) -> int:
    """Estimated activation peak of a forward over `batched_tokens` tokens on one GPU (vLLM's profile run).

    The measured point (4.76 GiB for Llama-3.1-8B at 8192 tokens, TP1, H100) scaled linearly in the
    batched tokens and in `activation_values_per_token`, so it grows with the hidden and intermediate
    widths and with the experts a token visits, and shrinks where TP shards. Scaling the measured peak
    rather than summing buffers keeps what the measurement holds that no formula sees (allocator
    fragmentation, the sampler's dummy run, torch.compile scratch). It puts Mixtral-8x7B at TP1 near
    8.7 GiB, in line with the ~8 GiB measured for MoE models.
    """
    if batched_tokens < 1:
        raise ValueError("batched_tokens must be >= 1")
    values = activation_values_per_token(model, tensor_parallel)
    return ACTIVATION_ANCHOR_BYTES * batched_tokens * values // (ACTIVATION_ANCHOR_TOKENS
                                                                 * ACTIVATION_ANCHOR_VALUES)
