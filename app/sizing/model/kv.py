"""KV-cache bytes (SIZING.md section 3): per token, per sequence, per GPU, and as a curve over context.

Per token, per layer, on one GPU:
- MHA/GQA/MQA: `2 · ceil(Hkv/tp) · d · b_kv` (one K and one V head each; KV heads are replicated
  when tp > Hkv, so Llama-3-70B holds 40,960 B/token/GPU at TP8 and still at TP16);
- MLA: `(kv_lora_rank + qk_rope_head_dim) · b_kv`, one latent per token, the same on every TP rank.
Window layers (sliding or chunked attention) cache at most their window of tokens per sequence, so a
model mixing them with global layers has no single bytes-per-token: the size is piecewise linear in
the context, with a kink at every window (`kv_breakpoints`).

Everything is exact integer arithmetic: KV dtypes are whole bytes (bf16/fp16 2, fp8/int8 1).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from app.sizing.model.params import SPLIT_BEFORE_LAST, ceil_div, pipeline_stages
from app.sizing.specs import KV_DTYPES, ModelSpec, bits_per_value

KIND_MLA = "mla"


@dataclass(frozen=True, slots=True)
class KvLayerGroup:
    """Layers sharing an attention kind and window, for one sequence."""

    kind: str  # "full_attention", "sliding_attention", "chunked_attention" or "mla"
    window: int | None  # tokens cached at most (None: the whole context)
    layers: int
    bytes_per_token_per_layer: int  # logical (tp=1)
    tokens_cached: int  # per sequence, after the window and block rounding
    bytes: int  # per sequence: layers x bytes_per_token_per_layer x tokens_cached


@dataclass(frozen=True, slots=True)
class KvCacheSize:
    """What one sequence of `context_tokens` keeps in the KV cache."""

    context_tokens: int  # as asked
    rounded_context_tokens: int  # rounded up to whole blocks (= context_tokens without paging)
    block_size: int | None
    bytes_per_sequence: int  # logical, unsharded: what one sequence costs the model
    bytes_per_sequence_per_gpu: int  # most loaded GPU under tp/pp (KV-head replication, MLA latent per rank)
    tokens_cached_max: int  # the most tokens any layer holds
    groups: tuple[KvLayerGroup, ...]


def kv_bytes_per_token_per_layer(model: ModelSpec, layer_index: int, kv_dtype: str,
                                 tensor_parallel: int = 1) -> int:
    """Bytes one cached token costs one layer on one GPU of a `tensor_parallel`-way split."""
    if not 0 <= layer_index < model.num_hidden_layers:
        raise ValueError(f"layer_index {layer_index} outside 0..{model.num_hidden_layers - 1}")
    return _bytes_per_token_per_layer(model, kv_dtype, tensor_parallel)


def kv_cache_size(model: ModelSpec, context_tokens: int, kv_dtype: str, tensor_parallel: int = 1,
                  pipeline_parallel: int = 1, block_size: int | None = None) -> KvCacheSize:
    """KV cache of one sequence holding `context_tokens` tokens (prompt + generated so far).

    Paging (`block_size`, vLLM 16, TensorRT-LLM 32) rounds what each layer holds up to whole blocks:
    a global layer holds ceil(c/block) blocks. A window layer holds the blocks its live window
    touches; past the window those w tokens rarely start on a block boundary, so they straddle up to
    ceil((w-1)/block) + 1 blocks, and that worst case is what we count (it is also vLLM's sliding-window
    accounting, "+1 because the window may not start at a block boundary"). Counting the worst case
    keeps the size monotone in the context instead of flickering by one block per token.
    """
    if context_tokens < 0:
        raise ValueError("context_tokens must be >= 0")
    if block_size is not None and block_size < 1:
        raise ValueError("block_size must be >= 1")
    logical = _bytes_per_token_per_layer(model, kv_dtype, 1)
    groups = tuple(
        _layer_group(kind, window, layers, logical, _tokens_cached(context_tokens, window, block_size))
        for (kind, window), layers in _layer_groups_per_stage(model, 1)[0]
    )
    return KvCacheSize(
        context_tokens=context_tokens,
        rounded_context_tokens=_tokens_cached(context_tokens, None, block_size),
        block_size=block_size,
        bytes_per_sequence=sum(group.bytes for group in groups),
        bytes_per_sequence_per_gpu=kv_cache_bytes_for_batch(
            model, (context_tokens,), kv_dtype, tensor_parallel, pipeline_parallel, block_size),
        tokens_cached_max=max(group.tokens_cached for group in groups),
        groups=groups,
    )


def _layer_group(kind: str, window: int | None, layers: int, bytes_per_token_per_layer: int,
                 tokens_cached: int) -> KvLayerGroup:
    return KvLayerGroup(kind=kind, window=window, layers=layers,
                        bytes_per_token_per_layer=bytes_per_token_per_layer, tokens_cached=tokens_cached,
                        bytes=layers * bytes_per_token_per_layer * tokens_cached)


def kv_cache_bytes_for_batch(model: ModelSpec, context_lengths: Sequence[int], kv_dtype: str,
                             tensor_parallel: int = 1, pipeline_parallel: int = 1,
                             block_size: int | None = None) -> int:
    """KV bytes on the most loaded GPU for a batch of live sequences of the given lengths.

    The most loaded pipeline stage is chosen for the batch as a whole: with window layers, which
    stage holds the most depends on the lengths (more global layers weigh more at long context).
    """
    return max(kv_cache_bytes_per_stage(model, context_lengths, kv_dtype, tensor_parallel, pipeline_parallel,
                                        block_size))


def kv_cache_bytes_per_stage(model: ModelSpec, context_lengths: Sequence[int], kv_dtype: str,
                             tensor_parallel: int = 1, pipeline_parallel: int = 1, block_size: int | None = None,
                             split: str = SPLIT_BEFORE_LAST) -> tuple[int, ...]:
    """KV bytes on one GPU of each pipeline stage (first to last, its layers dealt as the engine deals them:
    `params.pipeline_stages`) for a batch of live sequences of the given lengths."""
    if any(length < 0 for length in context_lengths):
        raise ValueError("context lengths must be >= 0")
    if block_size is not None and block_size < 1:
        raise ValueError("block_size must be >= 1")
    per_layer = _bytes_per_token_per_layer(model, kv_dtype, tensor_parallel)
    stages = _layer_groups_per_stage(model, pipeline_parallel, split)
    windows = {window for stage in stages for (_, window), _ in stage}
    tokens_by_window = {
        window: sum(_tokens_cached(length, window, block_size) for length in context_lengths)
        for window in windows
    }
    return tuple(per_layer * sum(layers * tokens_by_window[window] for (_, window), layers in stage)
                 for stage in stages)


def kv_bytes_per_token_full(model: ModelSpec, kv_dtype: str, tensor_parallel: int = 1,
                            pipeline_parallel: int = 1) -> int:
    """Per-GPU bytes per cached token over the unbounded (full or MLA) layers only.

    This is the slope of the per-GPU size at contexts beyond every window (on the stage with the most
    unbounded layers); below a window the window layers add to it.
    """
    per_layer = _bytes_per_token_per_layer(model, kv_dtype, tensor_parallel)
    return max(
        per_layer * sum(layers for (_, window), layers in stage if window is None)
        for stage in _layer_groups_per_stage(model, pipeline_parallel)
    )


def mha_equivalent_bytes_per_sequence(model: ModelSpec, context_tokens: int, kv_dtype: str) -> int:
    """What the same model would cache with one K and one V head per query head (plain MHA).

    The gap to `kv_cache_size(...).bytes_per_sequence` is what GQA/MQA/MLA saved. For MLA the MHA
    equivalent caches per head a key of qk_nope + qk_rope and a value of v_head_dim; windows are kept.
    """
    if context_tokens < 0:
        raise ValueError("context_tokens must be >= 0")
    if model.is_mla:
        assert model.qk_nope_head_dim is not None and model.qk_rope_head_dim is not None
        assert model.v_head_dim is not None
        values_per_head = model.qk_nope_head_dim + model.qk_rope_head_dim + model.v_head_dim
    else:
        values_per_head = 2 * model.resolved_head_dim
    per_layer = model.num_attention_heads * values_per_head * _kv_value_bytes(kv_dtype)
    return per_layer * sum(
        layers * _tokens_cached(context_tokens, window, None)
        for (_, window), layers in _layer_groups_per_stage(model, 1)[0]
    )


def kv_curve(model: ModelSpec, kv_dtype: str, points: Sequence[int]) -> list[tuple[int, int]]:
    """(context, logical bytes per sequence) at each point, unpaged."""
    return [(context, kv_cache_size(model, context, kv_dtype).bytes_per_sequence) for context in points]


def kv_breakpoints(model: ModelSpec) -> tuple[int, ...]:
    """Contexts where the bytes-per-sequence slope changes: the distinct windows, ascending."""
    return tuple(sorted({window for (_, window), _ in _layer_groups_per_stage(model, 1)[0]
                         if window is not None}))


# Internals ----------------------------------------------------------------------------------------

def _kv_value_bytes(kv_dtype: str) -> int:
    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"unknown KV dtype {kv_dtype!r}; expected one of {list(KV_DTYPES)}")
    return int(bits_per_value(kv_dtype)) // 8


def _bytes_per_token_per_layer(model: ModelSpec, kv_dtype: str, tensor_parallel: int) -> int:
    if tensor_parallel < 1:
        raise ValueError("tensor_parallel must be >= 1")
    value_bytes = _kv_value_bytes(kv_dtype)
    if model.is_mla:
        assert model.kv_lora_rank is not None and model.qk_rope_head_dim is not None
        return (model.kv_lora_rank + model.qk_rope_head_dim) * value_bytes
    kv_heads_per_gpu = ceil_div(model.num_key_value_heads, tensor_parallel)
    return 2 * kv_heads_per_gpu * model.resolved_head_dim * value_bytes


def _tokens_cached(context_tokens: int, window: int | None, block_size: int | None) -> int:
    """Tokens one layer holds for a sequence (see `kv_cache_size` for the paged window rule)."""
    if block_size is None:
        return context_tokens if window is None else min(context_tokens, window)
    blocks = ceil_div(context_tokens, block_size)
    if window is not None:
        blocks = min(blocks, ceil_div(window - 1, block_size) + 1)
    return blocks * block_size


_GroupKey = tuple[str, int | None]  # (kind, window)


@lru_cache(maxsize=256)
def _layer_groups_per_stage(model: ModelSpec, pipeline_parallel: int,
                            split: str = SPLIT_BEFORE_LAST) -> tuple[tuple[tuple[_GroupKey, int], ...], ...]:
    """For each pipeline stage, ((kind, window), layer count) in first-seen order; computed once."""
    keys = [(KIND_MLA if model.is_mla else layer_type, model.layer_window(layer_type))
            for layer_type in model.resolved_layer_types]
    stages = []
    for stage in pipeline_stages(model.num_hidden_layers, pipeline_parallel, split):
        counts: dict[_GroupKey, int] = {}
        for key in keys[stage.start:stage.stop]:
            counts[key] = counts.get(key, 0) + 1
        stages.append(tuple(counts.items()))
    return tuple(stages)


@lru_cache(maxsize=256)
def window_layers_per_stage(model: ModelSpec, pipeline_parallel: int,
                            split: str = SPLIT_BEFORE_LAST) -> tuple[tuple[tuple[int | None, int], ...], ...]:
    """For each pipeline stage (dealt as `params.pipeline_stages` deals them), (window, layers) pairs: how
    many of its layers cache at most that many tokens (None: the whole context)."""
    windows = [model.layer_window(layer_type) for layer_type in model.resolved_layer_types]
    return tuple(tuple(Counter(windows[stage.start:stage.stop]).items())
                 for stage in pipeline_stages(model.num_hidden_layers, pipeline_parallel, split))


@lru_cache(maxsize=256)
def window_slot_caps(model: ModelSpec, block_size: int) -> tuple[tuple[int | None, int | None], ...]:
    """(window, token slots its layers hold at most per sequence; None: unbounded), read off
    `kv_cache_size` at a context past every window."""
    windows = {model.layer_window(layer_type) for layer_type in model.resolved_layer_types}
    finite = [window for window in windows if window is not None]
    if not finite:
        return ((None, None),)
    beyond = 2 * max(finite) + 2 * block_size
    held = {group.window: group.tokens_cached
            for group in kv_cache_size(model, beyond, "bf16", block_size=block_size).groups}
    return tuple((window, None if window is None else held[window]) for window in windows)


def layer_mix(model: ModelSpec, block_size: int, pipeline_parallel: int = 1,
              split: str = SPLIT_BEFORE_LAST) -> tuple[int, tuple[tuple[int, int], ...]]:
    """(full-attention layers, ((window layers, token slots one sequence holds there at most), ...)) of the
    pipeline stage with the most full-attention layers (the engine's `split` deals them), for a scheduler that
    counts window layers apart (`simulate.SchedulerConfig`); (0, ()) when every layer attends the whole context
    or none does."""
    caps = dict(window_slot_caps(model, block_size))
    stage = max(window_layers_per_stage(model, pipeline_parallel, split),
                key=lambda pairs: (sum(layers for window, layers in pairs if window is None),
                                   sum(layers for _, layers in pairs)))
    full = sum(layers for window, layers in stage if window is None)
    windows = tuple((layers, caps[window]) for window, layers in stage if window is not None)
    if not full or not windows:
        return 0, ()
    return full, tuple((layers, slots) for layers, slots in windows if slots is not None)
