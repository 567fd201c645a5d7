"""Reference architectures for the domain tests, typed in by hand from the published configs.

Each constant copies the Hugging Face `config.json` fields the sizing formulas read (source in the
comment above it; `/work/shared/data/models.json` and `catalog-notes.md` list the mirrors used).
They are written out here rather than loaded from the catalog so a test's expected value never
depends on a data file the product itself ships.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from app.sizing.specs import LAYER_FULL, LAYER_SLIDING, LAYER_TYPES, ModelSpec


def alternating_sliding_full(num_layers: int) -> tuple[str, ...]:
    """Even-indexed layers slide, odd-indexed layers are global (Gemma-2, gpt-oss)."""
    return tuple(LAYER_SLIDING if i % 2 == 0 else LAYER_FULL for i in range(num_layers))


# meta-llama/Llama-2-7b-hf: full multi-head attention (32 KV heads), SwiGLU 11008.
LLAMA_2_7B = ModelSpec(
    name="Llama-2-7B", slug="llama-2-7b",
    num_hidden_layers=32, hidden_size=4096, num_attention_heads=32, num_key_value_heads=32,
    vocab_size=32000, intermediate_size=11008, max_position_embeddings=4096,
    total_params_published=7_000_000_000,
)

# meta-llama/Meta-Llama-3-8B: GQA 32 query / 8 KV heads, head_dim 4096/32 = 128.
LLAMA_3_8B = ModelSpec(
    name="Llama-3-8B", slug="llama-3-8b",
    num_hidden_layers=32, hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
    vocab_size=128256, intermediate_size=14336, max_position_embeddings=8192,
    total_params_published=8_030_000_000,
)

# meta-llama/Meta-Llama-3-70B: GQA 64 / 8, head_dim 8192/64 = 128.
LLAMA_3_70B = ModelSpec(
    name="Llama-3-70B", slug="llama-3-70b",
    num_hidden_layers=80, hidden_size=8192, num_attention_heads=64, num_key_value_heads=8,
    vocab_size=128256, intermediate_size=28672, max_position_embeddings=8192,
    total_params_published=70_600_000_000,
)

# meta-llama/Meta-Llama-3.1-405B: 126 layers, GQA 128 / 8, head_dim 128.
LLAMA_3_1_405B = ModelSpec(
    name="Llama-3.1-405B", slug="llama-3.1-405b",
    num_hidden_layers=126, hidden_size=16384, num_attention_heads=128, num_key_value_heads=8,
    vocab_size=128256, intermediate_size=53248, max_position_embeddings=131072,
    total_params_published=405_000_000_000,
)

# mistralai/Mixtral-8x7B-v0.1: every layer MoE, 8 experts of width 14336 (`intermediate_size`), top-2.
MIXTRAL_8X7B = ModelSpec(
    name="Mixtral-8x7B-v0.1", slug="mixtral-8x7b",
    num_hidden_layers=32, hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
    vocab_size=32000, intermediate_size=14336, max_position_embeddings=32768,
    num_experts=8, num_experts_per_tok=2,
    total_params_published=46_700_000_000, active_params_published=12_900_000_000,
)

# deepseek-ai/DeepSeek-V3: MLA (q LoRA 1536, kv LoRA 512, rope 64, nope 128, v 128), first 3 layers
# dense (width 18432), then 256 routed experts of width 2048, top-8, plus 1 shared expert.
DEEPSEEK_V3 = ModelSpec(
    name="DeepSeek-V3", slug="deepseek-v3",
    num_hidden_layers=61, hidden_size=7168, num_attention_heads=128, num_key_value_heads=128,
    vocab_size=129280, intermediate_size=18432, max_position_embeddings=163840,
    num_experts=256, num_experts_per_tok=8, n_shared_experts=1, moe_intermediate_size=2048,
    first_k_dense_replace=3,
    kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
    total_params_published=671_000_000_000, active_params_published=37_000_000_000,
)

# google/gemma-2-9b: head_dim 256 (16 x 256 = 4096 != hidden 3584), tied embeddings (Gemma2Config
# default), sliding window 4096 on even layers, global attention on odd layers.
GEMMA_2_9B = ModelSpec(
    name="Gemma-2-9B", slug="gemma-2-9b",
    num_hidden_layers=42, hidden_size=3584, num_attention_heads=16, num_key_value_heads=8,
    head_dim=256, vocab_size=256000, intermediate_size=14336, tie_word_embeddings=True,
    max_position_embeddings=8192,
    layer_types=alternating_sliding_full(42), sliding_window=4096,
    total_params_published=9_000_000_000,
)

# openai/gpt-oss-120b: 128 experts of width 2880 (`intermediate_size`), top-4, on every layer;
# head_dim 64 (64 x 64 = 4096 != hidden 2880); QKV biases; window 128 on even layers.
GPT_OSS_120B = ModelSpec(
    name="gpt-oss-120b", slug="gpt-oss-120b",
    num_hidden_layers=36, hidden_size=2880, num_attention_heads=64, num_key_value_heads=8,
    head_dim=64, vocab_size=201088, intermediate_size=2880, attention_bias=True,
    max_position_embeddings=131072,
    num_experts=128, num_experts_per_tok=4,
    layer_types=alternating_sliding_full(36), sliding_window=128,
    total_params_published=117_000_000_000, active_params_published=5_100_000_000,
)

# tiiuae/falcon-7b: multi-query (multi_query=true -> ONE KV head, whatever `num_kv_heads` a re-saved
# config claims), 71 heads of 64, plain 2-matrix MLP of 4 x hidden, tied embeddings, 2048 context.
FALCON_7B = ModelSpec(
    name="Falcon-7B", slug="falcon-7b",
    num_hidden_layers=32, hidden_size=4544, num_attention_heads=71, num_key_value_heads=1,
    head_dim=64, vocab_size=65024, intermediate_size=None, mlp_gated=False,
    tie_word_embeddings=True, max_position_embeddings=2048,
    total_params_published=7_000_000_000,
)

# Qwen/Qwen2.5-0.5B: GQA 14 / 2, head_dim 896/14 = 64, QKV biases, tied embeddings.
QWEN2_5_0_5B = ModelSpec(
    name="Qwen2.5-0.5B", slug="qwen2.5-0.5b",
    num_hidden_layers=24, hidden_size=896, num_attention_heads=14, num_key_value_heads=2,
    vocab_size=151936, intermediate_size=4864, attention_bias=True, tie_word_embeddings=True,
    max_position_embeddings=32768,
    total_params_published=490_000_000,
)

# Qwen/Qwen2.5-72B: GQA 64 / 8, QKV biases, untied embeddings.
QWEN2_5_72B = ModelSpec(
    name="Qwen2.5-72B", slug="qwen2.5-72b",
    num_hidden_layers=80, hidden_size=8192, num_attention_heads=64, num_key_value_heads=8,
    vocab_size=152064, intermediate_size=29568, attention_bias=True,
    max_position_embeddings=131072,
    total_params_published=72_700_000_000,
)

ALL_MODELS = (
    LLAMA_2_7B, LLAMA_3_8B, LLAMA_3_70B, LLAMA_3_1_405B, MIXTRAL_8X7B, DEEPSEEK_V3, GEMMA_2_9B,
    GPT_OSS_120B, FALCON_7B, QWEN2_5_0_5B, QWEN2_5_72B,
)


@st.composite
def random_models(draw: st.DrawFn) -> ModelSpec:
    """Small random decoder architectures: GQA or MLA, dense or MoE, tied or not, with or without
    sliding/chunked window layers mixed among global ones."""
    layers = draw(st.integers(1, 12))
    kv_heads = draw(st.integers(1, 8))
    heads = kv_heads * draw(st.integers(1, 4))
    head_dim = draw(st.sampled_from([8, 16, 64]))
    hidden = draw(st.sampled_from([32, 64, 96]))
    experts = draw(st.sampled_from([0, 0, 4, 8]))
    mla = draw(st.booleans())
    moe_fields: dict[str, Any] = {}
    if experts:
        moe_fields = {
            "num_experts": experts, "num_experts_per_tok": draw(st.integers(1, experts)),
            "n_shared_experts": draw(st.integers(0, 2)), "moe_intermediate_size": draw(st.sampled_from([16, 48])),
            "first_k_dense_replace": draw(st.integers(0, layers - 1)),
        }
    mla_fields: dict[str, Any] = {}
    if mla:
        mla_fields = {"kv_lora_rank": 32, "q_lora_rank": draw(st.sampled_from([None, 24])),
                      "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 16}
    return ModelSpec(
        num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
        num_key_value_heads=kv_heads, head_dim=head_dim, vocab_size=draw(st.integers(1, 500)),
        intermediate_size=draw(st.sampled_from([64, 100, 128])), mlp_gated=draw(st.booleans()),
        tie_word_embeddings=draw(st.booleans()), attention_bias=draw(st.booleans()),
        layer_types=draw(st.none() | st.lists(st.sampled_from(LAYER_TYPES), min_size=layers,
                                              max_size=layers).map(tuple)),
        sliding_window=draw(st.integers(1, 64)), attention_chunk_size=draw(st.integers(1, 64)),
        **moe_fields, **mla_fields,
    )
