"""Parallel layouts: the degrees they derive, and the rules a model and an engine put on them.

Expected values are worked by hand from the published configs (see models_for_tests.py) and the engine
rules of ENGINES.md section 2.
"""

from types import SimpleNamespace

import pytest

from app.catalog.reference import model_spec_from_record, reference_gpu_rows, reference_model_rows
from app.sizing.engines import ENGINES, EngineConfig, dense_over_attention_dp, layout_problems, resolve_engine
from app.sizing.engines.base import DRAFT_MODEL, EAGLE, NGRAM
from app.sizing.hardware.comm import (
    ALL_GATHER,
    FFN_ALL_GATHER,
    PER_EXPERT,
    exchange_latency_scale,
    link_bandwidth,
    moe_exchange_bytes_per_token,
    moe_exchange_time_s,
)
from app.sizing.hardware.efficiency import DEFAULT_EFFICIENCY
from app.sizing.hardware.roofline import roofline
from app.sizing.hardware.step_time import build_step_time_model
from app.sizing.layout import (
    DATA_PARALLEL,
    EXPERT_PARALLEL,
    KIND_DP_EP,
    KIND_PP,
    KIND_TP,
    PIPELINE_PARALLEL,
    TENSOR_PARALLEL,
    Layout,
    valid_tensor_parallel,
)
from app.sizing.layout import layout_problems as generic_layout_problems
from app.sizing.model.flops import DISTINCT_EXPERTS, decode_cost, step_cost_model
from app.sizing.model.recipes import RECIPES
from app.sizing.model.weights import weight_bytes_for_layout, weight_bytes_per_gpu, weight_groups_per_gpu
from app.sizing.serving.memory import kv_token_capacity, memory_budget
from app.sizing.serving.plan import configurations, default_tensor_parallel
from app.sizing.specs import GpuSpec, ModelSpec
from tests.domain.models_for_tests import DEEPSEEK_V3, GPT_OSS_120B, LLAMA_3_70B, MIXTRAL_8X7B

# Qwen/Qwen2.5-7B-Instruct config.json: 28 heads, 4 KV heads, MLP 18,944, 28 layers.
QWEN2_5_7B = ModelSpec(name="Qwen2.5-7B", slug="qwen2.5-7b", num_hidden_layers=28, hidden_size=3584,
                       num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                       intermediate_size=18944, attention_bias=True)


def test_degrees_derive_the_expert_split_and_the_gpu_count():
    """DEP8 (tp 1, dp 8, ep 8): 1 x 1 x 8 = 8 GPUs, MoE group 1 x 8 = 8, moe_tp 8 / 8 = 1.
    SGLang's `--tp 16 --ep 4`: 16 GPUs, each expert over 16 / 4 = 4 ranks. TP8 alone: moe_tp = 8."""
    dep8 = Layout(tensor_parallel=1, data_parallel=8, expert_parallel=8)
    assert (dep8.gpus, dep8.moe_group, dep8.moe_tensor_parallel, dep8.kind) == (8, 8, 1, KIND_DP_EP)
    wide = Layout(tensor_parallel=16, expert_parallel=4)
    assert (wide.gpus, wide.moe_tensor_parallel) == (16, 4)
    plain = Layout(8)
    assert (plain.gpus, plain.moe_tensor_parallel, plain.kind, plain.label) == (8, 8, KIND_TP, "TP8 PP1")
    assert Layout(2, 4).kind == KIND_PP and Layout(2, 4).gpus == 8


@pytest.mark.parametrize("degrees", [{"tensor_parallel": 0}, {"data_parallel": -1},
                                     {"tensor_parallel": 2, "expert_parallel": 4},  # 4 does not divide 2 x 1
                                     {"tensor_parallel": 4, "data_parallel": 2, "expert_parallel": 3}])
def test_inconsistent_degrees_do_not_construct(degrees):
    with pytest.raises(ValueError):
        Layout(**degrees)


def test_qwen2_5_7b_at_tp7_breaks_the_kv_head_and_mlp_rules():
    """28 heads / 7 = 4 fine, but 4 KV heads: 7 >= 4 and 7 % 4 = 3 (no whole replication), and the MLP
    18,944 / 7 = 2,706.3 is not whole (18,944 = 2^8 x 74 = 2^9 x 37)."""
    rules = [p.rule for p in layout_problems(QWEN2_5_7B, Layout(7))]
    assert rules == ["tensor_parallel 7 must be a multiple of the 4 KV heads (each KV head is replicated tp/4 times)",
                     "tensor_parallel 7 must divide the MLP width 18,944"]
    # 1, 2, 4 divide 4 KV heads and 18,944; 3, 5, 6 do not divide 28 heads; 8 is a multiple of 4 KV heads
    # and 18,944 / 8 = 2,368, but 28 heads / 8 = 3.5.
    assert valid_tensor_parallel(QWEN2_5_7B, 8) == (1, 2, 4)


def test_kv_heads_replicate_only_on_whole_multiples():
    """Llama-3-70B, 8 KV heads: TP16 (16 = 2 x 8) replicates each KV head twice; fine."""
    assert layout_problems(LLAMA_3_70B, Layout(16)) == []


def test_mla_has_one_latent_and_no_kv_head_rule():
    """DeepSeek-V3 lists 128 KV heads but caches one latent: TP8 (128 / 8 heads; 18,432 / 8 = 2,304 dense;
    2,048 / 8 = 256 per expert) is valid."""
    assert layout_problems(DEEPSEEK_V3, Layout(8)) == []


def test_expert_rules_per_engine():
    """DeepSeek-V3, 256 experts, on 8 GPUs as TP8 with EP2 (moe_tp 4): vLLM's --enable-expert-parallel
    forces ep = dp x tp = 8, so EP2 is a vLLM error; TensorRT-LLM and SGLang accept it (256 % 2 = 0).
    gpt-oss-120b has 128 experts: EP 8 x 3 = 24 does not divide 128 (TensorRT-LLM's E // ep), vLLM
    accepts it (the first 128 mod 24 = 8 ranks get one more); 2880 / (24/24) = 2880 per expert.
    TensorRT-LLM's attention DP gives every GPU its own attention rank (KV sized with tp_size 1, ENGINES.md
    section 2), so its DP ranks are one GPU each: TP8 x DP3 and DeepSeek's TP2 x DP4 are refused on
    tensor_parallel; SGLang splits attention over tp / dp GPUs of its group and takes TP2 x DP4."""
    ep2 = Layout(8, expert_parallel=2)
    assert [p.field for p in layout_problems(DEEPSEEK_V3, ep2, "vllm")] == [EXPERT_PARALLEL]
    assert layout_problems(DEEPSEEK_V3, ep2, "trtllm") == layout_problems(DEEPSEEK_V3, ep2, "sglang") == []
    ep24 = Layout(tensor_parallel=8, data_parallel=3, expert_parallel=24)
    assert [p.field for p in layout_problems(GPT_OSS_120B, ep24, "trtllm")] == [EXPERT_PARALLEL, TENSOR_PARALLEL]
    assert layout_problems(GPT_OSS_120B, ep24, "vllm") == []
    tp2_dp4 = Layout(tensor_parallel=2, data_parallel=4, expert_parallel=8)
    assert [p.field for p in layout_problems(DEEPSEEK_V3, tp2_dp4, "trtllm")] == [TENSOR_PARALLEL]
    assert layout_problems(DEEPSEEK_V3, tp2_dp4, "sglang") == []
    assert layout_problems(DEEPSEEK_V3, Layout(tensor_parallel=1, data_parallel=8, expert_parallel=8), "trtllm") == []


def test_sglang_runs_a_draft_model_only_without_attention_dp():
    """SGLang 0.5.10 refuses to start a draft model's speculative decoding (its STANDALONE algorithm) with
    --enable-dp-attention ("Currently standalone speculative decoding does not support dp attention",
    server_args.py), so DeepSeek-V3 at TP1 DP8 EP8 with a draft model breaks a rule on data_parallel; n-gram
    lookup, EAGLE and TP8 EP8 with the draft are accepted, and the other engines state no such rule."""
    dep8, tep8 = Layout(tensor_parallel=1, data_parallel=8, expert_parallel=8), Layout(8, expert_parallel=8)
    assert [p.field for p in layout_problems(DEEPSEEK_V3, dep8, "sglang", speculative=DRAFT_MODEL)] == [DATA_PARALLEL]
    for kind in (NGRAM, EAGLE, None):
        assert layout_problems(DEEPSEEK_V3, dep8, "sglang", speculative=kind) == []
    assert layout_problems(DEEPSEEK_V3, tep8, "sglang", speculative=DRAFT_MODEL) == []
    for engine in ("vllm", "trtllm"):
        assert layout_problems(DEEPSEEK_V3, dep8, engine, speculative=DRAFT_MODEL) == []


# Qwen/Qwen3-235B-A22B config.json: 94 layers, all MoE (decoder_sparse_step 1, no mlp_only_layers), 64 heads of
# 128, 4 KV heads, 128 experts of width 1,536, top-8, no shared expert. Qwen/Qwen3-235B-A22B-FP8 stores them in
# 128 x 128 FP8 blocks (its card: "fine-grained fp8 quantization with block size of 128"; quant_method fp8,
# weight_block_size [128, 128]), which `recipes.recipe_from_quantization_config` reads as deepseek_fp8.
QWEN3_235B = ModelSpec(name="Qwen3-235B-A22B", slug="qwen3-235b-a22b", num_hidden_layers=94, hidden_size=4096,
                       num_attention_heads=64, num_key_value_heads=4, head_dim=128, vocab_size=151936,
                       intermediate_size=12288, num_experts=128, num_experts_per_tok=8, moe_intermediate_size=1536)


def test_block_fp8_checkpoints_split_only_on_whole_blocks_under_vllm():
    """ENGINES.md section 2, vLLM rules: "FP8-block weights need per-rank dims divisible by 128".

    Qwen3-235B-A22B in 128 x 128 FP8 blocks:
    - TP8: query 64 x 128 / 8 = 1,024 per rank (8 blocks); 8 ranks >= 4 KV heads, so each rank holds one
      whole KV head of 128 (1 block); each expert 1,536 / 8 = 192 per rank = 1.5 blocks: refused, the fix
      being tensor_parallel (the only degree that splits the experts here).
    - TP4: experts 1,536 / 4 = 384 = 3 blocks; query 2,048; KV 4 / 4 = one head of 128: loads.
    - TP8 with EP8: moe_tp = 8 x 1 / 8 = 1, each rank whole experts of 1,536 = 12 blocks: loads.
    DeepSeek-V3 in its native FP8 blocks:
    - TP8: q_b 128 x (128 + 64) / 8 = 3,072 (24 blocks), kv_b 128 x (128 + 128) / 8 = 4,096, o input
      128 x 128 / 8 = 2,048, dense MLP 18,432 / 8 = 2,304 (18 blocks), expert and shared expert
      2,048 / 8 = 256 (2 blocks): loads.
    - TP8 x DP4 without EP: vLLM splits the experts over all 32 ranks, 2,048 / 32 = 64 = half a block:
      refused on expert_parallel (--enable-expert-parallel, EP32, gives each rank whole experts and loads).
    Per-tensor FP8 (the plain fp8 dtype) has no blocks, and ENGINES.md states the rule for vLLM alone."""
    blocks = RECIPES["deepseek_fp8"]
    problems = layout_problems(QWEN3_235B, Layout(8), "vllm", weights=blocks)
    assert [(p.field, p.rule) for p in problems] == [(TENSOR_PARALLEL, (
        "the expert width 1,536 over 8 ranks is 192 per rank, not whole 128x128 blocks of weight_recipe "
        "deepseek_fp8 (fp8_block experts): vLLM loads a block format only in whole blocks per rank"))]
    assert layout_problems(QWEN3_235B, Layout(4), "vllm", weights=blocks) == []
    assert layout_problems(QWEN3_235B, Layout(8, expert_parallel=8), "vllm", weights=blocks) == []
    assert layout_problems(DEEPSEEK_V3, Layout(8), "vllm", weights=blocks) == []
    dp4 = layout_problems(DEEPSEEK_V3, Layout(8, 1, 4, 1), "vllm", weights=blocks)
    assert [(p.field, p.rule.split(" per rank")[0]) for p in dp4] == [
        (EXPERT_PARALLEL, "the expert width 2,048 over 32 ranks is 64")]
    assert layout_problems(DEEPSEEK_V3, Layout(8, 1, 4, 32), "vllm", weights=blocks) == []
    assert layout_problems(QWEN3_235B, Layout(8), "vllm", weights=RECIPES["fp8_dynamic"]) == []
    assert layout_problems(QWEN3_235B, Layout(8), "vllm") == []
    assert layout_problems(QWEN3_235B, Layout(8), "sglang", weights=blocks) == []


def test_experts_must_split_evenly_and_exist():
    """Mixtral-8x7B: expert width 14,336; TP1 x DP8 with EP2 -> moe_tp 4, 14,336 / 4 = 3,584 fine; EP16 over
    8 experts is impossible; a dense model has no experts to split."""
    assert layout_problems(MIXTRAL_8X7B, Layout(1, 1, 8, 2)) == []
    assert [p.field for p in layout_problems(MIXTRAL_8X7B, Layout(2, 1, 8, 16))] == [EXPERT_PARALLEL]
    assert [p.field for p in layout_problems(LLAMA_3_70B, Layout(2, expert_parallel=2))] == [EXPERT_PARALLEL]


def test_stages_and_node_rules():
    """80 layers cannot make 81 stages; TP16 leaves an 8-GPU node; DP over nodes is allowed."""
    assert [p.field for p in layout_problems(LLAMA_3_70B, Layout(1, 81))] == [PIPELINE_PARALLEL]
    assert [p.field for p in layout_problems(LLAMA_3_70B, Layout(16), gpus_per_node=8)] == [TENSOR_PARALLEL]
    assert generic_layout_problems(LLAMA_3_70B, Layout(16)) == []  # without a node size, no node rule
    assert layout_problems(DEEPSEEK_V3, Layout(8, 1, 4, 32), "vllm", gpus_per_node=8) == []


def _catalog_models():
    return [model_spec_from_record(SimpleNamespace(**row), slug=row["slug"]) for row in reference_model_rows()]


def test_the_planner_proposes_no_invalid_layout_for_any_catalog_model():
    """Every configuration the planner lists by default, for every catalog model on every catalog GPU
    node size and engine, passes every rule: the pipelines and the attention DP + EP layouts across nodes
    included, which 80 GiB GPUs get for the models one node of them cannot hold."""
    node_sizes = sorted({row["gpus_per_node"] for row in reference_gpu_rows()})
    assert node_sizes, "the catalog lists GPUs"
    for model in _catalog_models():
        for size in node_sizes:
            gpu = SimpleNamespace(gpus_per_node=size)
            assert default_tensor_parallel(model, gpu), model.slug
            for engine in ("vllm", "sglang", "trtllm", "generic"):
                for configuration in configurations(model, [_gpu(size)], None, None, ["bf16"], ["bf16"], engine=engine):
                    problems = layout_problems(model, configuration.layout, engine, size)
                    assert problems == [], (model.slug, configuration.label, problems)


def test_the_planner_searches_expert_layouts_for_moe_models_only():
    """DeepSeek-V3 on an 8-GPU node: plain TP 1, 2, 4, 8 (128 heads; 18,432 and 2,048 split by each), then
    DEP and TEP at 2, 4 and 8 GPUs. Llama-3-70B (dense): plain TP only."""
    labels = [c.layout.label for c in configurations(DEEPSEEK_V3, [_gpu(8)], None, [1], ["fp8"], ["bf16"],
                                                     engine="vllm")]
    assert labels == ["TP1 PP1", "TP2 PP1", "TP4 PP1", "TP8 PP1", "TP1 DP2 EP2 PP1", "TP2 EP2 PP1",
                      "TP1 DP4 EP4 PP1", "TP4 EP4 PP1", "TP1 DP8 EP8 PP1", "TP8 EP8 PP1"]
    assert all(c.layout.kind == "tp" for c in configurations(LLAMA_3_70B, [_gpu(8)], None, [1], ["bf16"], ["bf16"]))


def _gpu(gpus_per_node):
    return GpuSpec(name=f"node of {gpus_per_node}", memory_bytes=80 * 2**30, memory_bandwidth_bytes_per_s=3e12,
                   interconnect_bandwidth_bytes_per_s=450e9, gpus_per_node=gpus_per_node, bf16_flops_per_s=1e15)


# Memory under a layout: DeepSeek-V3 fp8 on 8 x H200, TP8 against DP8 + EP8 ------------------------------

H200 = GpuSpec(name="NVIDIA H200 SXM 141GB", slug="h200-sxm", memory_bytes=150_754_820_096,
               memory_bandwidth_bytes_per_s=4.8e12, interconnect_bandwidth_bytes_per_s=450e9,
               bf16_flops_per_s=989.5e12, fp8_flops_per_s=1979e12)


def test_deepseek_v3_weights_per_gpu_tp8_against_dp8_ep8():
    """DeepSeek-V3 (h 7168, 128 heads, q LoRA 1536, kv LoRA 512, rope 64, nope 128, v 128, vocab 129,280,
    61 layers: 3 dense of F 18,432, 58 MoE of 256 experts of F_e 2,048 + 1 shared). fp8 linear weights
    (1 B); embedding, head, routers, norms bf16 (2 B).

    Attention per layer at tp t: q = 7168·1536 + 1536·(128/t)·192, kv down 7168·576 = 4,128,768 (replicated),
    kv up 512·(128/t)·256, out (128/t)·128·7168.
      t = 8: 11,010,048 + 4,718,592 + 4,128,768 + 2,097,152 + 14,680,064 = 36,634,624
      t = 1: 11,010,048 + 37,748,736 + 4,128,768 + 16,777,216 + 117,440,512 = 187,105,280
    Dense MLP 3·7168·18432/t: t = 8 49,545,216; t = 1 396,361,728.
    One expert 3·7168·2048 = 44,040,192; at moe_tp 8: 3·7168·256 = 5,505,024.
    TP8: every GPU holds all 256 experts at 1/8 width = 1,409,286,144, and 1/8 of the shared one, 5,505,024.
    DP8 + EP8: 256/8 = 32 whole experts = 1,409,286,144 (the same), the whole shared expert 44,040,192.
    bf16 parts: routers 58 · 7168·256 = 106,430,464; norms 61 · (2·7168 + 1536 + 512) = 999,424; final norm
    7,168; embedding + head 2 · 129,280·7168/t (t = 8: 231,669,760; t = 1: 1,853,358,080).

    TP8 fp8: 61·36,634,624 + 3·49,545,216 + 58·(1,409,286,144 + 5,505,024) = 84,441,235,456 B;
         bf16: (106,430,464 + 999,424 + 7,168 + 231,669,760)·2 = 678,213,632 B; total 85,119,449,088 B.
    DP8+EP8 fp8: 61·187,105,280 + 3·396,361,728 + 58·(1,409,286,144 + 44,040,192) = 96,895,434,752 B;
         bf16: (106,430,464 + 999,424 + 7,168 + 1,853,358,080)·2 = 3,921,590,272 B; total 100,817,025,024 B.
    Attention replicated on every rank costs 15.7 GB per GPU more."""
    assert weight_bytes_for_layout(DEEPSEEK_V3, "fp8", Layout(8)) == 85_119_449_088
    assert weight_bytes_for_layout(DEEPSEEK_V3, "fp8", Layout(1, 1, 8, 8)) == 100_817_025_024


def test_sglang_splits_dense_mlps_and_shared_experts_over_the_attention_dp_ranks():
    """SGLang's TP group spans its attention DP ranks, and its dense MLPs and shared experts follow TP (ENGINES.md
    section 2): DeepSeek-V3 fp8 as DP8 + EP8 keeps them at 1/8 on each GPU, where vLLM and TensorRT-LLM keep them
    whole on every rank (above: 100,817,025,024 B).
    Dense MLP 3 layers · 3·7168·(18,432/8 = 2,304) = 148,635,648 B instead of 3·396,361,728 = 1,189,085,184;
    shared experts 58 · 3·7168·(2,048/8 = 256) = 319,291,392 B instead of 58·44,040,192 = 2,554,331,136.
    That is 1,040,449,536 + 2,235,039,744 = 3,275,489,280 B less. Its LM head follows the whole TP group too
    (SGLang 0.5.10 `ParallelLMHead(use_attn_tp_group=enable_dp_lm_head)`, off by default): 129,280 / 8 = 16,160
    vocabulary rows of 7,168 in bf16, 231,669,760 B instead of 1,853,358,080, 1,621,688,320 B less.
    In all 4,897,177,600 B less: 95,919,847,424 B per GPU, and as much more KV."""
    dep8 = {"tensor_parallel": 1, "pipeline_parallel": 1, "expert_parallel": 8, "data_parallel": 8}
    split = weight_groups_per_gpu(DEEPSEEK_V3, "fp8", **dep8, dense_over_dp=True)
    whole = weight_groups_per_gpu(DEEPSEEK_V3, "fp8", **dep8)
    assert {g.group: g.bytes for g in split if g.group in ("dense_mlp", "shared_experts")} == {
        "dense_mlp": 148_635_648, "shared_experts": 319_291_392}
    assert {g.group: g.bytes for g in whole if g.group in ("dense_mlp", "shared_experts")} == {
        "dense_mlp": 1_189_085_184, "shared_experts": 2_554_331_136}
    assert {g.group: g.bytes for g in split if g.group == "lm_head"} == {"lm_head": 231_669_760}
    assert {g.group: g.bytes for g in whole if g.group == "lm_head"} == {"lm_head": 1_853_358_080}
    assert sum(g.bytes for g in split) == 100_817_025_024 - 4_897_177_600 == 95_919_847_424
    assert [engine for engine in ("vllm", "sglang", "trtllm", "generic") if dense_over_attention_dp(engine)] == [
        "sglang"]
    # Without attention DP the flag changes nothing: TP8 splits them over the same 8 GPUs.
    assert weight_bytes_per_gpu(DEEPSEEK_V3, "fp8", 8, dense_over_dp=True) == 85_119_449_088


def test_deepseek_v3_kv_tokens_of_the_replica_tp8_against_dp8_ep8():
    """A generic engine using 0.9 of the H200's 150,754,820,096 B: int(135,679,338,086.4) = 135,679,338,086 B,
    nothing else reserved. MLA caches (512 + 64)·2 B = 1,152 B per token per layer on a GPU, 61 layers =
    70,272 B; a block of 16 tokens 1,124,352 B.
    TP8: KV budget 135,679,338,086 − 85,119,449,088 = 50,559,888,998 B per GPU; 50,559,888,998 // 1,124,352
    = 44,968 blocks (1,124,352 · 44,968 = 50,559,860,736): 719,488 tokens, and every GPU holds all of them
    (the latent is copied onto all 8).
    DP8+EP8: 135,679,338,086 − 100,817,025,024 = 34,862,313,062 B per GPU; // 1,124,352 = 31,006 blocks
    (34,861,658,112) per rank, each rank its own requests: 8 · 31,006 = 248,048 blocks = 3,968,768 tokens,
    5.5 times the TP8 replica."""
    engine = resolve_engine(EngineConfig(engine="generic", gpu_memory_utilization=0.9, reserved_bytes_per_gpu=0,
                                         activation_bytes_per_gpu=0, non_torch_bytes_per_gpu=0,
                                         cuda_graph_bytes_per_gpu=0), DEEPSEEK_V3, H200, 8)
    tp8 = memory_budget(DEEPSEEK_V3, H200, engine, tensor_parallel=8, pipeline_parallel=1, weight_dtype="fp8")
    dep8 = memory_budget(DEEPSEEK_V3, H200, engine, tensor_parallel=1, pipeline_parallel=1, weight_dtype="fp8",
                         data_parallel=8, expert_parallel=8)
    assert (tp8.kv_budget_bytes_per_gpu, dep8.kv_budget_bytes_per_gpu) == (50_559_888_998, 34_862_313_062)
    assert kv_token_capacity(DEEPSEEK_V3, tp8.kv_budget_bytes_per_gpu, "bf16", tensor_parallel=8,
                             pipeline_parallel=1, block_size=16) == (719_488, 44_968)
    assert kv_token_capacity(DEEPSEEK_V3, dep8.kv_budget_bytes_per_gpu, "bf16", tensor_parallel=1,
                             pipeline_parallel=1, block_size=16, data_parallel=8) == (3_968_768, 248_048)


# Time under a layout: the MoE exchange and the experts a rank reads -----------------------------------------

def test_deepseek_v3_all_to_all_bytes_per_layer_at_batch_64():
    """DP8 + EP8, 64 decoding sequences on one rank (tp 1), bf16 activations (2 B), k = 8, h = 7168: each token
    sends its 8 expert copies, 7/8 of them to other GPUs: 64 · 8 · 7/8 · 7168 · 2 = 6,422,528 B per MoE layer
    in each direction (dispatch, then combine). Plain TP8 exchanges nothing (its all-reduces are counted
    apart), nor does TP8 attention with EP8 experts; DP8 without EP all-gathers the other 7 ranks' tokens: 64 · 7 · 7168 · 2 = 6,422,528 B too."""
    dep8 = step_cost_model(DEEPSEEK_V3, "fp8", "bf16", "bf16", 1, 8, 8)
    assert 64 * dep8.moe_exchange_bytes_per_token == 6_422_528
    assert step_cost_model(DEEPSEEK_V3, "fp8", "bf16", "bf16", 8).moe_exchange_bytes_per_token == 0
    # TP8 attention with EP8 experts: the attention's all-reduce already left all 64 tokens on every GPU,
    # each runs its own 32 experts on them and the TP all-reduce sums the outputs: no token exchange.
    assert step_cost_model(DEEPSEEK_V3, "fp8", "bf16", "bf16", 8, 1, 8).moe_exchange_bytes_per_token == 0
    assert 64 * moe_exchange_bytes_per_token(7168, 2, 8, tensor_parallel=1, data_parallel=8,
                                             expert_parallel=1) == 6_422_528


def test_vllms_default_exchange_gathers_every_ranks_tokens_whatever_the_routing():
    """ENGINES.md section 2: vLLM's `--all2all-backend` defaults to `allgather_reducescatter`: every GPU gathers
    the other dp − 1 ranks' tokens and reduce-scatters the sums back, (dp − 1)·h values per own token, where
    an exchange per expert copy sends k·(ep − 1)/ep·h. DP8 + EP8, tp 1, bf16 activations (2 B):
    - gpt-oss-120b (h 2,880, top-4): per expert 4 · 7/8 · 2,880 · 2 = 20,160 B; gathered 7 · 2,880 · 2 = 40,320 B.
    - Llama-4 Maverick (h 5,120, top-1): per expert 1 · 7/8 · 5,120 · 2 = 8,960 B; gathered 7 · 5,120 · 2
      = 71,680 B, eight times as much.
    - DeepSeek-V3 (h 7,168, top-8): both 8 · 7/8 · 7,168 · 2 = 7 · 7,168 · 2 = 100,352 B.
    With TP attention (dp 1) neither moves a token."""
    def both(h, k):
        return tuple(moe_exchange_bytes_per_token(h, 2, k, tensor_parallel=1, data_parallel=8, expert_parallel=8,
                                                  exchange=exchange) for exchange in (PER_EXPERT, ALL_GATHER))

    assert both(2880, 4) == (20_160, 40_320)
    assert both(5120, 1) == (8_960, 71_680)
    assert both(7168, 8) == (100_352, 100_352)
    assert moe_exchange_bytes_per_token(2880, 2, 4, tensor_parallel=8, data_parallel=1, expert_parallel=8,
                                        exchange=ALL_GATHER) == 0
    assert step_cost_model(GPT_OSS_120B, "bf16", "bf16", "bf16", 1, 8, 8,
                           ALL_GATHER).moe_exchange_bytes_per_token == 40_320
    with pytest.raises(ValueError, match="unknown MoE exchange"):
        moe_exchange_bytes_per_token(2880, 2, 4, tensor_parallel=1, data_parallel=8, expert_parallel=8,
                                     exchange="pplx")
    assert {name: engine.moe_exchange for name, engine in ENGINES.items()} == {
        "vllm": ALL_GATHER, "sglang": FFN_ALL_GATHER, "trtllm": PER_EXPERT, "generic": PER_EXPERT}


def test_a_gathered_exchange_moves_the_ranks_own_tokens_not_the_most_loaded_ranks():
    """gpt-oss-120b DP8 + EP8 on H200 (NVLink 450e9 B/s), a decode step of 64 sequences per rank at 1,000
    cached tokens. The calls' latency is the same either way (same GPUs, 36 MoE layers x 2); the bytes differ.
    Per expert the step waits for the most loaded EP rank: the 8 ranks' 512 tokens send 512 · 4 = 2,048 copies,
    256 per rank on average, the most loaded expecting 1 + 1.42360 / sqrt(256) = 1.0889750 times that
    (`flops.expected_expert_load_factor`), so 64 · 1.0889750 · 20,160 B per call. Gathered, every rank's
    64 tokens move alike: 64 · 40,320 B. Difference: 72 · 64 · (40,320 − 1.0889750 · 20,160) / 450e9
    = 72 · 64 · 18,366.264 / 450e9 = 0.188070 ms."""
    steps = {exchange: build_step_time_model(GPT_OSS_120B, H200, weight_dtype="bf16", kv_dtype="bf16",
                                             data_parallel=8, expert_parallel=8, moe_exchange=exchange)
             for exchange in (PER_EXPERT, ALL_GATHER)}
    gathered, per_expert = (steps[e].step_time_s(64, 64 * 1000, 0, 0) for e in (ALL_GATHER, PER_EXPERT))
    assert gathered - per_expert == pytest.approx(72 * 64 * (40_320 - 1.0889750 * 20_160) / 450e9, rel=1e-6)
    assert gathered - per_expert == pytest.approx(0.188070e-3, rel=1e-5)


def test_sglangs_feed_forward_blocks_span_every_gpu_of_its_attention_dp_group():
    """ENGINES.md section 2: under SGLang's --enable-dp-attention "MoE/FFN still spans all TP ranks" (its TP group
    is the tp·dp GPUs) and "shared experts/dense MLP follow TP"; an a2a backend is opt-in. DeepSeek-V3 fp8 on
    H200 as DP8 + EP8, a decode step of 64 sequences per rank at 1,000 cached tokens, the builtin efficiency
    (bandwidth 0.70 of 4.8e12 B/s = 3.36e12; 33% of the 1,979e12 fp8 peak at 64 rows; alpha 7.5 us; NVLink
    450e9 B/s), against vLLM's exchange (the MoE layers gather the same 7 · 7,168 · 2 = 100,352 B per token):
    - Dense MLPs (3 layers): whole, 3 · 3 · 7,168 · 18,432 = 1,189,085,184 B of weights and (2 · 7,168 +
      2 · 18,432) · 2 = 102,400 B of activations per token and layer: 1,189,085,184 + 64 · 3 · 102,400
      = 1,208,745,984 B, 0.359746 ms, over its compute 64 · 2 · 1,189,085,184 / (1,979e12 · 0.33) = 0.233058 ms.
      Over the 8 GPUs: 3 · 3 · 7,168 · 2,304 = 148,635,648 B, the gathered 8 · 64 tokens' (2 · 7,168 + 2 · 2,304)
      · 2 = 303,104 B per own token and layer: 206,831,616 B, 0.061557 ms; the same FLOPs (8 · 64 tokens by a
      slice an eighth as wide) timed at the rank's 64 rows: 0.233058 ms, now the longer. Saved 0.126688 ms.
    - Shared experts (58 layers): 58 · 3 · 7,168 · 2,048 = 2,554,331,136 B whole, 58 · 3 · 7,168 · 256
      = 319,291,392 B split: 2,235,039,744 B less, 0.665190 ms (the MoE operator reads 32 whole experts per
      layer, memory-bound either way; its activations are the same: 2 · 2,048 = 2 · 256 · 8).
    - The dense layers gather and scatter too: 3 · 2 · (7.5 us + 64 · 100,352 / 450e9 = 14.272 us) = 0.130634 ms.
    vLLM's step is 0.126688 + 0.665190 − 0.130634 = 0.661244 ms longer. The weights placed this way are what
    /v1/capacity counts for SGLang (`weights.weight_groups_per_stage`, which also splits the LM head: 95,919,847,424 B
    per GPU; this step keeps the head's read per rank)."""
    steps = {exchange: build_step_time_model(DEEPSEEK_V3, H200, weight_dtype="fp8", kv_dtype="bf16",
                                             data_parallel=8, expert_parallel=8, moe_exchange=exchange)
             for exchange in (ALL_GATHER, FFN_ALL_GATHER)}
    vllm_step, sglang_step = (steps[e].step_time_s(64, 64 * 1000, 0, 0) for e in (ALL_GATHER, FFN_ALL_GATHER))
    mlp = (1_208_745_984 / 3.36e12 - 64 * 2 * 1_189_085_184 / (1_979e12 * 0.33))
    shared = 2_235_039_744 / 3.36e12
    exchange = 3 * 2 * (7.5e-6 + 64 * 100_352 / 450e9)
    assert vllm_step - sglang_step == pytest.approx(mlp + shared - exchange, rel=1e-6)
    assert vllm_step - sglang_step == pytest.approx(0.661244e-3, rel=1e-5)
    costs = {e: step_cost_model(DEEPSEEK_V3, "fp8", "bf16", "bf16", 1, 8, 8, e) for e in (ALL_GATHER, FFN_ALL_GATHER)}
    assert (costs[ALL_GATHER].num_exchange_layers, costs[FFN_ALL_GATHER].num_exchange_layers) == (58, 61)
    # With tensor-parallel attention (dp 1) nothing is gathered: the same step as any other engine's.
    tp8 = [build_step_time_model(DEEPSEEK_V3, H200, tensor_parallel=8, weight_dtype="fp8", kv_dtype="bf16",
                                 expert_parallel=8, moe_exchange=e).step_time_s(64, 64 * 1000, 0, 0)
           for e in (PER_EXPERT, FFN_ALL_GATHER)]
    assert tp8[0] == tp8[1]


def test_vllm_capacity_times_its_decode_step_with_the_gathered_exchange(monkeypatch):
    """/v1/capacity for gpt-oss-120b DP8 + EP8 on H200 under vLLM, against the same answer with vLLM's rule
    switched to an exchange per expert copy: only the exchange's bytes differ. At b sequences per rank the
    8 ranks route 8·b·4 copies, 4·b per EP rank, the most loaded expecting 1 + 1.42360 / sqrt(4·b) of that,
    so the decode steps differ by 72 calls · b · (40,320 − (1 + 1.42360 / sqrt(4·b)) · 20,160) / 450e9 s."""
    from app.sizing.engines.vllm import Vllm
    from app.sizing.serving.capacity import capacity

    def answer():
        return capacity(GPT_OSS_120B, H200, tensor_parallel=1, pipeline_parallel=1, weight_dtype="bf16",
                        kv_dtype="bf16", compute_dtype=None, engine=EngineConfig(engine="vllm"), input_tokens=1000,
                        output_tokens=1000, efficiency=DEFAULT_EFFICIENCY, data_parallel=8,
                        expert_parallel=8).operating_point

    gathered = answer()
    monkeypatch.setattr(Vllm, "moe_exchange", PER_EXPERT)
    per_expert = answer()
    b = gathered.batch_size / 8
    assert per_expert.batch_size == gathered.batch_size and b >= 1
    factor = 1 + 1.42360 / (4 * b) ** 0.5
    assert gathered.expected_decode_step_s - per_expert.expected_decode_step_s == pytest.approx(
        72 * b * (40_320 - factor * 20_160) / 450e9, rel=1e-5)


def test_all_to_all_time_over_nvlink_and_across_nodes():
    """58 MoE layers x 2 exchanges x (alpha 10 us + 6,422,528 B / 450e9 B/s = 14.2723 us) = 116 x 24.2723 us
    = 2.81559 ms among the 8 GPUs of an H200 node. Among 16, across nodes at 50e9 B/s, the call's latency is
    DeepEP's EP16 over EP8 one, 313 / 191 = 1.638743 times alpha (16.38743 us):
    116 x (16.38743 + 128.4506) us = 116 x 144.83803 us = 16.8012 ms."""
    nvlink = moe_exchange_time_s(64, 58, 6_422_528 / 64, link_bandwidth(H200, 8), 10e-6, 8)
    assert nvlink == pytest.approx(116 * (10e-6 + 6_422_528 / 450e9), rel=1e-12)
    assert nvlink == pytest.approx(2.81559e-3, rel=1e-5)
    across = moe_exchange_time_s(64, 58, 6_422_528 / 64, link_bandwidth(H200, 16), 10e-6, 16)
    assert across == pytest.approx(16.8012e-3, rel=1e-5)
    assert moe_exchange_time_s(0, 58, 100.0, 450e9, 10e-6, 8) == 0


def test_an_exchange_calls_latency_grows_with_its_gpus_as_deepeps_measured_one():
    """DeepEP low-latency dispatch + combine (deepseek-ai/DeepEP docs/legacy.md, ENGINES.md section 5):
    EP8 77 + 114 = 191 us, EP16 118 + 195 = 313, EP32 155 + 273 = 428, EP64 173 + 314 = 487,
    EP128 192 + 369 = 561, EP256 194 + 360 = 554. Over EP8's: 16 -> 313 / 191 = 1.638743; 32 -> 2.240838.
    24 GPUs: log2 24 = 4.5849625, 0.5849625 of the way from EP16 to EP32: 313 + 0.5849625 x 115 = 380.2707 us
    -> 1.990946. 72 (an NVL72 domain): log2 72 = 6.169925, 487 + 0.169925 x 74 = 499.5745 -> 2.615573.
    Up to 8 GPUs the calibrated alpha stands (1), and past 256 EP256's 554 / 191 = 2.900524 holds."""
    for gpus in (1, 2, 4, 8):
        assert exchange_latency_scale(gpus) == 1.0
    assert exchange_latency_scale(16) == pytest.approx(1.638743, rel=1e-6)
    assert exchange_latency_scale(32) == pytest.approx(2.240838, rel=1e-6)
    assert exchange_latency_scale(24) == pytest.approx(1.990946, rel=1e-6)
    assert exchange_latency_scale(72) == pytest.approx(2.615573, rel=1e-6)
    assert exchange_latency_scale(512) == pytest.approx(2.900524, rel=1e-6)
    with pytest.raises(ValueError):
        exchange_latency_scale(0)


def test_each_rank_reads_only_its_own_experts_touched_by_every_rank():
    """Routed-expert weights one GPU reads per decode step, 64 sequences per rank, fp8 (1 B per weight).
    TP8: 64 tokens touch 256·(1 − (1 − 8/256)^64) = 256·(1 − 0.96875^64) experts
    (ln 0.96875 = −0.03174870, x 64 = −2.0319167, e^ = 0.131084) -> 222.4425 experts, each 1/8 of
    44,040,192 = 5,505,024 B, in 58 layers: 222.4425 · 5,505,024 · 58 = 71.024 GB.
    DP8 + EP8: the 8 ranks bring 512 tokens, touching 256·(1 − 0.96875^512) = 256·(1 − 8.7e-8) ≈ 256 experts;
    this GPU owns 1/8 of them, whole: 32 · 44,040,192 · 58 = 81.739 GB (every expert it owns, every step)."""
    tp8 = step_cost_model(DEEPSEEK_V3, "fp8", "bf16", "bf16", 8)
    dep8 = step_cost_model(DEEPSEEK_V3, "fp8", "bf16", "bf16", 1, 8, 8)

    def expert_bytes(costs):
        shape = costs.shape(tokens=64, sampled=64, attended=[64 * 1000], kv_read=[64 * 1000])
        return costs.bytes_per_distinct_expert * shape[DISTINCT_EXPERTS]

    assert expert_bytes(tp8) == pytest.approx(222.4425 * 5_505_024 * 58, rel=1e-6)
    assert expert_bytes(dep8) == pytest.approx(32 * 44_040_192 * 58, rel=1e-6)


def test_the_roofline_pays_the_exchange_of_a_dp_ep_decode_step():
    """DeepSeek-V3 DP8 + EP8 on H200, 64 sequences per rank at 1,000 cached tokens: tp 1 has no all-reduce;
    the exchange is 58 MoE layers x 2 x (alpha + bytes / 450e9 B/s), alpha the efficiency's per-call
    latency, bytes the most loaded EP rank's: the mean 64 x 100,352 = 6,422,528 B times the load factor.
    The 8 ranks' 512 tokens send 512 x 8 = 4,096 expert copies, 512 per EP rank on average; the most
    loaded one expects 1 + E[max of 8 standard normals] / sqrt(512) = 1 + 1.42360 / 22.62742 = 1.062914
    times that (1.42360: Tippett's/Harter's table; `flops.expected_expert_load_factor`).
    TP8 pays its all-reduces instead, and no exchange: their alpha is the two-GPU one over NCCL's 8-GPU ring,
    times 15.0 / 7.8 (`comm.ring_latency_scale`); the exchange's is a two-GPU call's."""
    alpha = DEFAULT_EFFICIENCY.allreduce_latency_s
    dep8 = decode_cost(DEEPSEEK_V3, 1000, 64, "fp8", "bf16", tensor_parallel=1, data_parallel=8, expert_parallel=8)
    result = roofline(dep8, H200, "fp8", DEFAULT_EFFICIENCY)
    assert dep8.expert_load_factor == pytest.approx(1.062914, rel=1e-6)
    assert result.comm_time_s == pytest.approx(116 * (alpha + 6_422_528 * 1.062914 / 450e9), rel=1e-6)
    tp8 = roofline(decode_cost(DEEPSEEK_V3, 1000, 64, "fp8", "bf16", tensor_parallel=8), H200, "fp8",
                   DEFAULT_EFFICIENCY)
    # 2 all-reduces x 61 layers of 64 x 7168 x 2 B = 917,504 B: alpha x 15/7.8 + 2 x 7/8 x 917,504 / 450e9 each.
    assert tp8.comm_time_s == pytest.approx(122 * (alpha * 15.0 / 7.8 + 1.75 * 917_504 / 450e9), rel=1e-12)
