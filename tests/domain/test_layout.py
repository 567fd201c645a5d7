"""Parallel layouts: the degrees they derive, and the rules a model and an engine put on them.

Expected values are worked by hand from the published configs (see models_for_tests.py) and the engine
rules of ENGINES.md section 2.
"""

from types import SimpleNamespace

import pytest

from app.catalog import model_spec_from_record, reference_gpu_rows, reference_model_rows
from app.sizing.layout import (
    EXPERT_PARALLEL,
    KIND_DP_EP,
    KIND_PP,
    KIND_TP,
    PIPELINE_PARALLEL,
    TENSOR_PARALLEL,
    Layout,
    layout_problems,
    valid_tensor_parallel,
)
from app.sizing.plan import configurations, default_tensor_parallel
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
    accepts it (the first 128 mod 24 = 8 ranks get one more); 2880 / (24/24) = 2880 per expert."""
    ep2 = Layout(8, expert_parallel=2)
    assert [p.field for p in layout_problems(DEEPSEEK_V3, ep2, "vllm")] == [EXPERT_PARALLEL]
    assert layout_problems(DEEPSEEK_V3, ep2, "trtllm") == layout_problems(DEEPSEEK_V3, ep2, "sglang") == []
    ep24 = Layout(tensor_parallel=8, data_parallel=3, expert_parallel=24)
    assert [p.field for p in layout_problems(GPT_OSS_120B, ep24, "trtllm")] == [EXPERT_PARALLEL]
    assert layout_problems(GPT_OSS_120B, ep24, "vllm") == []


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
    assert layout_problems(DEEPSEEK_V3, Layout(8, 1, 4, 32), "vllm", gpus_per_node=8) == []


def _catalog_models():
    return [model_spec_from_record(SimpleNamespace(**row), slug=row["slug"]) for row in reference_model_rows()]


def test_the_planner_proposes_no_invalid_layout_for_any_catalog_model():
    """Every configuration the planner lists by default, for every catalog model on every catalog GPU
    node size and engine, passes every rule."""
    node_sizes = sorted({row["gpus_per_node"] for row in reference_gpu_rows()})
    assert node_sizes, "the catalog lists GPUs"
    for model in _catalog_models():
        for size in node_sizes:
            gpu = SimpleNamespace(gpus_per_node=size)
            assert default_tensor_parallel(model, gpu), model.slug
            for configuration in configurations(model, [_gpu(size)], None, [1], ["bf16"], ["bf16"]):
                for engine in ("vllm", "sglang", "trtllm", "generic"):
                    problems = layout_problems(model, configuration.layout, engine, size)
                    assert problems == [], (model.slug, configuration.label, problems)


def _gpu(gpus_per_node):
    return GpuSpec(name=f"node of {gpus_per_node}", memory_bytes=80 * 2**30, memory_bandwidth_bytes_per_s=3e12,
                   interconnect_bandwidth_bytes_per_s=450e9, gpus_per_node=gpus_per_node, bf16_flops_per_s=1e15)
