"""Capacity: engine memory budgets, KV token capacity, concurrency views, fit checks, operating point.

Golden numbers are worked by hand in each docstring from the architecture (tests/domain/models_for_tests)
and the driver-reported memory of the GPUs (typed in below from ../shared/data/gpus.csv), and checked
against the seed's worked example and the published vLLM measurement (SIZING.md sections 7 and 10).
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.sizing.engines import EngineConfig, resolve_engine
from app.sizing.engines.base import ADMISSION, STEADY_STATE
from app.sizing.engines.sglang import sglang_mem_fraction_static
from app.sizing.hardware.efficiency import DEFAULT_EFFICIENCY
from app.sizing.hardware.step_time import build_step_time_model
from app.sizing.model.activations import activation_peak_bytes, activation_values_per_token
from app.sizing.model.kv import kv_bytes_per_token_per_layer
from app.sizing.model.params import pipeline_stages
from app.sizing.serving.capacity import (
    LIMIT_KV_CACHE,
    LIMIT_MAX_NUM_SEQS,
    capacity,
    operating_point,
    prompt_prefill_s,
)
from app.sizing.serving.memory import (
    kv_bytes_per_token_per_gpu,
    kv_token_capacity,
    memory_budget,
    requests_fitting,
    steady_state_kv_bytes_per_stage,
)
from app.sizing.specs import GpuSpec, ModelSpec
from tests.domain.models_for_tests import (
    DEEPSEEK_V3,
    GEMMA_2_9B,
    GPT_OSS_120B,
    LLAMA_3_1_405B,
    LLAMA_3_8B,
    LLAMA_3_70B,
    MIXTRAL_8X7B,
    random_models,
)

GIB = 2**30

# Driver-reported totals (nvidia-smi): H100 SXM 81,559 MiB, H200 SXM 143,771 MiB, A100 80GB 81,920 MiB.
H100 = GpuSpec(name="NVIDIA H100 SXM5 80GB", slug="h100-sxm", memory_bytes=85_520_809_984,
               memory_bandwidth_bytes_per_s=3.35e12, interconnect_bandwidth_bytes_per_s=450e9,
               bf16_flops_per_s=989.5e12, fp16_flops_per_s=989.5e12, fp8_flops_per_s=1979e12)
H200 = dataclasses.replace(H100, name="NVIDIA H200 SXM 141GB", slug="h200-sxm", memory_bytes=150_754_820_096,
                           memory_bandwidth_bytes_per_s=4.8e12)
# The same H100 with the total CUDA reports, 79.19 GiB = round(79.19 x 2^30) = 85,029,615,043 B (vLLM's
# start-up log on NVIDIA-H100-80GB-HBM3), which vLLM and TensorRT-LLM size from.
H100_CUDA = dataclasses.replace(H100, cuda_memory_bytes=85_029_615_043)
A100_80GB = GpuSpec(name="NVIDIA A100 80GB SXM4", slug="a100-80gb-sxm", memory_bytes=85_899_345_920,
                    memory_bandwidth_bytes_per_s=2.039e12, interconnect_bandwidth_bytes_per_s=300e9,
                    bf16_flops_per_s=312e12, fp16_flops_per_s=312e12)

# Llama-3.1-8B has Llama-3-8B's architecture (32 x 4096, GQA 32/8, SwiGLU 14336, vocab 128256) and a
# 131,072-token context.
LLAMA_3_1_8B = dataclasses.replace(LLAMA_3_8B, name="Llama-3.1-8B", slug="llama-3.1-8b",
                                   max_position_embeddings=131_072)
LLAMA_8B_WEIGHTS = 16_060_522_496  # 8,030,261,248 parameters x 2 bytes (bf16)

# The measured vLLM components (SIZING.md s7), in bytes: round(GiB x 2^30).
ACTIVATION_8B = 5_111_011_082  # 4.76 x 1,073,741,824 = 5,111,011,082.24
NON_TORCH_TP1 = 139_586_437  # 0.13 x 1,073,741,824 = 139,586,437.12
# vLLM defaults from the 0.19 llm-d measurements (engines/vllm.py): non-torch 0.25 / 2.07 GiB, graphs 0.87 GiB.
VLLM_NON_TORCH_TP1 = 268_435_456  # 0.25 x 1,073,741,824
VLLM_NON_TORCH_TP2 = 2_222_645_576  # 2.07 x 1,073,741,824 = 2,222,645,575.68
VLLM_CUDA_GRAPHS = 934_155_387  # 0.87 x 1,073,741,824 = 934,155,386.88
# The published example's own components, given explicitly to a version that does not charge graphs.
MEASURED_EXAMPLE = EngineConfig(engine="vllm", engine_version="0.19.0", gpu_memory_utilization=0.9,
                                activation_bytes_per_gpu=ACTIVATION_8B, non_torch_bytes_per_gpu=NON_TORCH_TP1)


def run(model, gpu=H100, *, tp=1, pp=1, weight_dtype="bf16", kv_dtype="bf16", compute_dtype=None,
        engine=None, input_tokens=1000, output_tokens=500):  # type: ignore[no-untyped-def]
    return capacity(model, gpu, tensor_parallel=tp, pipeline_parallel=pp, weight_dtype=weight_dtype,
                    kv_dtype=kv_dtype, compute_dtype=compute_dtype, engine=engine or EngineConfig(),
                    input_tokens=input_tokens, output_tokens=output_tokens, efficiency=DEFAULT_EFFICIENCY)


def generic_with_kv_budget(kv_budget: int, weights: int, gpu: GpuSpec = H100) -> EngineConfig:
    """A generic engine at utilization 1.0 whose reserve leaves exactly `kv_budget` for the KV cache."""
    return EngineConfig(engine="generic", gpu_memory_utilization=1.0,
                        reserved_bytes_per_gpu=gpu.memory_bytes - weights - kv_budget)


# The seed's worked example and the published measurement ---------------------------------------------

def test_seed_worked_example_llama_3_70b_on_4_h100() -> None:
    """Seed s11: Llama-3-70B fp16, TP4 on 4 x H100, ~30 GB of overhead, ~1k in / 500 out: "~310".

    Weights per GPU (TP4, fp16 = 2 B): each layer holds Q 8192·16·128 = 16,777,216, K+V 2·8192·2·128 =
    4,194,304, O 16,777,216, MLP 3·8192·28672/4 = 176,160,768 -> 213,909,504, plus norms 2·8192; 80 layers
    = 17,112,760,320 + 1,310,720; embedding + LM head shards 2 · 32,064 · 8192 = 525,336,576; final norm
    8192. Sum 17,639,415,808 params x 2 = 35,278,831,616 B (the seed rounds to 140 GB / 4 = 35 GB).
    KV budget per GPU = 85,520,809,984 (driver total) x 1.0 − 35,278,831,616 − 7,500,000,000 (30 GB / 4)
    = 42,741,978,368 B.
    KV per token per GPU: 2 · (8/4 KV heads) · 128 · 2 B · 80 layers = 81,920 B; a block of 16 tokens
    1,310,720 B; blocks = 42,741,978,368 // 1,310,720 = 32,609 (32,609 · 1,310,720 = 42,741,268,480).
    A request of 1,000 + 500 tokens takes ceil(1500/16) = 94 blocks: 32,609 // 94 = 346 admitted.
    The seed's own arithmetic, (320 − 140 − 30) GB / (1500 · 327,680 B) = 305, uses 80 GB GPUs; the
    driver reports 85.5 GB, which is the whole difference (next test).
    """
    result = run(LLAMA_3_70B, tp=4, weight_dtype="fp16", kv_dtype="fp16",
                 engine=EngineConfig(engine="generic", gpu_memory_utilization=1.0,
                                     reserved_bytes_per_gpu=7_500_000_000))
    assert result.fits and result.reasons == ()
    assert result.memory.weights_bytes_per_gpu == 35_278_831_616
    assert result.memory.kv_budget_bytes_per_gpu == 42_741_978_368
    assert result.kv_bytes_per_token_per_gpu == 81_920
    assert (result.kv_tokens, result.kv_blocks) == (32_609 * 16, 32_609)
    admission = result.max_concurrency.admission
    assert (admission.sequences, admission.limit) == (346, LIMIT_KV_CACHE)
    # The generic engine reserves input + output at admission, so it runs at that view.
    assert result.operating_point is not None
    assert (result.operating_point.batch_size, result.operating_point.concurrency_view) == (346, ADMISSION)


def test_seed_worked_example_with_the_seeds_80_gb_gpus_gives_about_310() -> None:
    """Same as above on a GPU of exactly 80e9 bytes (the seed's "80 GB"):
    80,000,000,000 − 35,278,831,616 − 7,500,000,000 = 37,221,168,384 B; // 1,310,720 = 28,397 blocks
    (28,397 · 1,310,720 = 37,220,515,840); // 94 = 302 admitted: the seed's ~310 (its own rounding of
    weights to 140 GB and KV to 150 GB gives 305).
    """
    gpu_80gb = dataclasses.replace(H100, memory_bytes=80_000_000_000)
    result = run(LLAMA_3_70B, gpu_80gb, tp=4, weight_dtype="fp16", kv_dtype="fp16",
                 engine=EngineConfig(engine="generic", gpu_memory_utilization=1.0,
                                     reserved_bytes_per_gpu=7_500_000_000))
    assert result.memory.kv_budget_bytes_per_gpu == 37_221_168_384
    assert result.kv_blocks == 28_397
    assert result.max_concurrency.admission.sequences == 302


def test_vllm_measurement_llama_3_1_8b_on_h100() -> None:
    """Published vLLM start-up on H100, Llama-3.1-8B, utilization 0.9, max-model-len 16k: KV 51.38 GiB
    = 0.9 x 79.19 − 14.99 − 4.76 − 0.13 (SIZING.md s7). With its components given, the rule reproduces it
    from what CUDA reports, and without the CUDA graphs, which that log frees after sizing the KV cache:
    0.9 x 85,029,615,043 = 76,526,653,538 (.7 dropped)
      − weights 16,060,522,496 (8,030,261,248 params x 2 B; vLLM logs 14.99 GiB, we have 14.96)
      − activation peak 5,111,011,082 (4.76 GiB)   − non-torch 139,586,437 (0.13 GiB)
      = 55,215,533,523 B = 51.424 GiB, 0.08% from the measured 51.38 (the weights' 0.03 GiB).
    Blocks of 16 x 131,072 B = 2,097,152 B: 55,215,533,523 // 2,097,152 = 26,328 (26,328 · 2,097,152 =
    55,213,817,856), i.e. 421,248 tokens; 16,384 tokens per request take 1,024 blocks: 26,328 // 1,024 =
    25 requests in the worst case (vLLM would log 25.69x).
    """
    result = run(LLAMA_3_1_8B, H100_CUDA, engine=dataclasses.replace(MEASURED_EXAMPLE, max_model_len=16_384))
    memory = result.memory
    assert memory.total_bytes_per_gpu == 85_029_615_043
    assert memory.usable_bytes_per_gpu == 76_526_653_538
    assert memory.weights_bytes_per_gpu == LLAMA_8B_WEIGHTS
    assert memory.activation_bytes_per_gpu == ACTIVATION_8B
    assert memory.non_torch_bytes_per_gpu == NON_TORCH_TP1
    assert memory.cuda_graph_bytes_per_gpu == 0
    assert memory.kv_budget_bytes_per_gpu == 55_215_533_523
    assert memory.kv_budget_bytes_per_gpu / GIB == pytest.approx(51.38, rel=0.001)
    assert (result.kv_tokens, result.kv_blocks) == (421_248, 26_328)
    assert result.max_concurrency.worst_case.sequences == 25
    assert dict(result.engine.sources)["gpu_memory_utilization"] == "given"


def test_405b_bf16_on_one_h100_does_not_fit_and_gets_a_suggestion() -> None:
    """Llama-3.1-405B: 405,853,388,800 params (model card 405B) x 2 B = 811,706,777,600 B = 811.7 GB,
    nearly ten times one H100's 85,520,809,984 B (85.5 GB). An answer, not an error: fits False, the
    reason with the real numbers, and the smallest configuration in one node that fits. In bf16 no
    8-GPU layout fits (811.7 GB / 8 = 101.5 GB per GPU), so the suggestion changes the precision.
    """
    result = run(LLAMA_3_1_405B)
    assert result.fits is False
    assert result.operating_point is None
    assert result.weights_bytes_total == 811_706_777_600
    assert result.memory.kv_budget_bytes_per_gpu < 0
    assert result.kv_tokens == result.kv_blocks == 0
    assert result.max_concurrency.admission.sequences == 0
    assert result.max_context_tokens == 0
    (reason,) = result.reasons
    assert "811.7 GB" in reason and "1 x 85.5 GB" in reason
    suggestion = result.suggestion
    assert suggestion is not None
    assert suggestion.weight_dtype in ("fp8", "int4")
    assert suggestion.num_gpus == suggestion.tensor_parallel * suggestion.pipeline_parallel
    assert suggestion.num_gpus <= H100.gpus_per_node
    # The suggestion does fit, and nothing with fewer GPUs does at its precision.
    suggested = run(LLAMA_3_1_405B, tp=suggestion.tensor_parallel, pp=suggestion.pipeline_parallel,
                    weight_dtype=suggestion.weight_dtype)
    assert suggested.fits and suggested.kv_tokens == suggestion.kv_tokens
    for gpus in range(1, suggestion.num_gpus):
        for tp in (1, 2, 4, 8):
            if gpus % tp == 0:
                smaller = run(LLAMA_3_1_405B, tp=tp, pp=gpus // tp, weight_dtype=suggestion.weight_dtype)
                assert not smaller.fits


def test_suggested_layouts_are_counted_from_the_heads_divisors_and_the_layers() -> None:
    """Llama-3-70B (64 heads, 80 layers). In an 8-GPU node, fewest GPUs first, then the most TP: 1 GPU (1,1);
    2 (2,1) (1,2); 3 (1,3); 4 (4,1) (2,2) (1,4); 5 (1,5); 6 (2,3) (1,6); 7 (1,7); 8 (8,1) (4,2) (2,4) (1,8): 15.
    A node of 100,000 GPUs (the GPU schema's most) has tp in the 7 divisors 1..64 of 64 heads, each with pp
    1..80: 560 layouts, counted without walking every GPU count and its TP degrees (5 x 10^9 steps: a request
    that held the server for minutes)."""
    from app.sizing.serving.capacity import _layouts

    assert _layouts(LLAMA_3_70B, H100) == [(1, 1), (2, 1), (1, 2), (1, 3), (4, 1), (2, 2), (1, 4), (1, 5), (2, 3),
                                           (1, 6), (1, 7), (8, 1), (4, 2), (2, 4), (1, 8)]
    huge = _layouts(LLAMA_3_70B, dataclasses.replace(H100, gpus_per_node=100_000))
    assert len(huge) == 7 * 80 and huge[:15] == _layouts(LLAMA_3_70B, H100)
    assert huge[-1] == (64, 80)


def test_suggestion_keeps_the_precision_when_more_gpus_suffice() -> None:
    """Llama-3-70B bf16 (141.1 GB) on one H100 does not fit; TP2 leaves 70.6 GB of weights per GPU,
    under vLLM's 0.92 x 85.5 = 78.7 GB minus activations and overhead, so the first layout that fits
    keeps bf16 and needs 2 or more GPUs."""
    result = run(LLAMA_3_70B)
    assert not result.fits and result.suggestion is not None
    assert result.suggestion.weight_dtype == "bf16"
    assert result.suggestion.num_gpus >= 2
    assert run(LLAMA_3_70B, tp=result.suggestion.tensor_parallel,
               pp=result.suggestion.pipeline_parallel).fits


# Engine rules ---------------------------------------------------------------------------------------

def test_vllm_defaults_follow_the_gpu() -> None:
    """vLLM at the default version (0.33): 0.92 of what CUDA reports, block 16; max_num_seqs /
    max_num_batched_tokens 1024 / 8192 on GPUs of >= 70 GiB other than A100, else 256 / 2048; non-torch
    0.25 GiB on one GPU; CUDA graphs 0.87 GiB, charged from v0.20.
    Activation (V1) = 192,255,256 + max(forward, sampler):
      H100: sampler 1024 x 128,256 x (2 + 12.213) = 131,334,144 x 14.213 = 1,866,652,188.672 -> 1,866,652,189,
            forward 8192 x 61,440 x 2 = 1,006,632,960 -> 2,058,907,445;
      A100: sampler 256 x 128,256 x 14.213 = 466,663,047.168, forward 2048 x 61,440 x 2 = 251,658,240
            -> 192,255,256 + 466,663,047 = 658,918,303.
    KV on H100: 0.92 x 85,029,615,043 = 78,227,245,839 (.56 dropped) − 16,060,522,496 − 2,058,907,445
    − 268,435,456 − 934,155,387 = 58,905,225,055.
    """
    on_h100 = resolve_engine(EngineConfig(), LLAMA_3_1_8B, H100_CUDA, 1)
    assert (on_h100.engine_version, on_h100.gpu_memory_utilization, on_h100.block_size) == ("0.33.0", 0.92, 16)
    assert (on_h100.max_num_seqs, on_h100.max_num_batched_tokens) == (1024, 8192)
    assert on_h100.non_torch_bytes_per_gpu == VLLM_NON_TORCH_TP1
    assert on_h100.cuda_graph_bytes_per_gpu == VLLM_CUDA_GRAPHS
    assert on_h100.activation_bytes_per_gpu == 2_058_907_445
    assert on_h100.max_model_len == 131_072
    on_a100 = resolve_engine(EngineConfig(), LLAMA_3_1_8B, A100_80GB, 1)
    assert (on_a100.max_num_seqs, on_a100.max_num_batched_tokens) == (256, 2048)
    assert on_a100.activation_bytes_per_gpu == 658_918_303
    budget = memory_budget(LLAMA_3_1_8B, H100_CUDA, on_h100, tensor_parallel=1, pipeline_parallel=1,
                           weight_dtype="bf16")
    assert budget.usable_bytes_per_gpu == 78_227_245_839
    assert budget.kv_budget_bytes_per_gpu == 58_905_225_055


def test_vllm_version_decides_utilization_and_cuda_graphs() -> None:
    """0.19: utilization 0.90 and the graphs captured after the KV cache (not subtracted); 0.20: 0.92 and
    subtracted (ENGINES.md 1.1). A GPU without a measured CUDA total falls back to the driver's, and says so."""
    old = resolve_engine(EngineConfig(engine_version="0.19.0"), LLAMA_3_1_8B, H100_CUDA, 1)
    assert (old.gpu_memory_utilization, old.cuda_graph_bytes_per_gpu) == (0.90, 0)
    new = resolve_engine(EngineConfig(engine_version="0.20.0"), LLAMA_3_1_8B, H100_CUDA, 1)
    assert (new.gpu_memory_utilization, new.cuda_graph_bytes_per_gpu) == (0.92, VLLM_CUDA_GRAPHS)
    assert dict(new.sources)["engine_version"] == "given"
    assert new.total_bytes_per_gpu == 85_029_615_043
    fallback = resolve_engine(EngineConfig(), LLAMA_3_1_8B, H100, 1)
    assert fallback.total_bytes_per_gpu == 85_520_809_984
    assert "not measured" in dict(fallback.sources)["total_bytes_per_gpu"]
    with pytest.raises(ValueError):
        EngineConfig(engine_version="latest")


def test_sglang_mem_fraction_static_reproduces_its_rule() -> None:
    """SGLang 0.5.5 `_handle_gpu_memory_settings`, memory in MiB:
    H100 81,559 MiB (< 90 GiB bucket: chunked_prefill_size 8192, cuda_graph_max_bs 256 at tp < 4):
    reserved = 512 + 1.5·8192 + 2·256 + 1·1/8·1024 = 512 + 12,288 + 512 + 128 = 13,440 MiB (above the
    10 GiB floor); (81,559 − 13,440) / 81,559 = 0.83521 -> 0.835.
    H200 143,771 MiB (< 160 GiB bucket, same sizes): (143,771 − 13,440) / 143,771 = 0.90652 -> 0.907.
    H100 at TP8 (cuda_graph_max_bs 512): 512 + 12,288 + 1,024 + 8/8·1024 = 14,848; 66,711 / 81,559 =
    0.81795 -> 0.818.
    H100 with chunked_prefill_size 2048: 512 + 3,072 + 512 + 128 = 4,224 MiB, raised to the 10,240 MiB
    floor of GPUs over 60 GiB: 71,319 / 81,559 = 0.87445 -> 0.874.
    """
    v055 = "0.5.5"
    assert sglang_mem_fraction_static(H100.memory_bytes, 1, 1, 2048, version=v055) == (0.874, 2048, 256)
    assert sglang_mem_fraction_static(H100.memory_bytes, 1, 1, None, version=v055) == (0.835, 8192, 256)
    assert sglang_mem_fraction_static(H200.memory_bytes, 1, 1, None, version=v055) == (0.907, 8192, 256)
    assert sglang_mem_fraction_static(H100.memory_bytes, 8, 1, None, version=v055) == (0.818, 8192, 512)


def test_sglang_from_0_5_10_reserves_its_piecewise_cuda_graphs() -> None:
    """ENGINES.md 1.2: piecewise CUDA graphs, on by default from 0.5.10 (the default version), add 8 MiB per
    captured size, 58 sizes in the reference's worked example, to the 0.5.5 reserve; 1.5 GiB with MLA.
    H100 TP1: 13,440 + 58·8 = 13,904 MiB; 67,655 / 81,559 = 0.82952 -> 0.830 (the worked example's).
    H100 TP8: 14,848 + 464 = 15,312; 66,247 / 81,559 = 0.81226 -> 0.812 (the worked example's).
    H200 TP1: 143,771 − 13,904 = 129,867; / 143,771 = 0.90329 -> 0.903.
    H200 TP8 of an MLA model: 14,848 + 1,536 = 16,384; 127,387 / 143,771 = 0.88604 -> 0.886.
    H100 with chunks of 2048: 4,224 + 464 = 4,688, still under the 10,240 MiB floor: 0.874.
    """
    assert sglang_mem_fraction_static(H100.memory_bytes, 1, 1, None) == (0.830, 8192, 256)
    assert sglang_mem_fraction_static(H100.memory_bytes, 1, 1, None, version="0.5.10") == (0.830, 8192, 256)
    assert sglang_mem_fraction_static(H100.memory_bytes, 8, 1, None) == (0.812, 8192, 512)
    assert sglang_mem_fraction_static(H200.memory_bytes, 1, 1, None) == (0.903, 8192, 256)
    assert sglang_mem_fraction_static(H200.memory_bytes, 8, 1, None, mla=True) == (0.886, 8192, 512)
    assert sglang_mem_fraction_static(H200.memory_bytes, 8, 1, None, version="0.5.9", mla=True)[0] == 0.897
    assert sglang_mem_fraction_static(H100.memory_bytes, 1, 1, 2048) == (0.874, 2048, 256)
    # Where SGLang turns them off (`_handle_piecewise_cuda_graph`), nothing is reserved for them: H100 TP1 on two
    # pipeline stages 13,440 + 1/8·1024 = 13,568 -> 67,991 / 81,559 = 0.83364 -> 0.834 (0.5.5's rule and value);
    # on an AMD GPU of H100's size the 0.5.5 reserve, 0.835.
    assert sglang_mem_fraction_static(H100.memory_bytes, 1, 2, None)[0] == 0.834
    assert sglang_mem_fraction_static(H100.memory_bytes, 1, 2, None, version="0.5.5")[0] == 0.834
    assert sglang_mem_fraction_static(H100.memory_bytes, 1, 1, None, vendor="AMD")[0] == 0.835


def test_sglang_sets_memory_aside_for_speculative_decoding() -> None:
    """ENGINES.md 1.2: from 0.5.5 SGLang reserves 4 GiB more for EAGLE and 6 GiB for a standalone draft model
    (after the 10 GiB floor; nothing named for n-gram drafting); 0.4.9-0.5.2 reserve 2 GiB for any. With any
    speculative decoding 0.5.10 turns its piecewise CUDA graphs off (`_handle_piecewise_cuda_graph`), so their
    464 MiB are not reserved: H100 TP1, 0.5.10: 13,440 + 4,096 = 17,536 MiB -> 64,023 / 81,559 = 0.78499 ->
    0.785 (EAGLE); 13,440 + 6,144 = 19,584 -> 61,975 / 81,559 = 0.75988 -> 0.760 (draft model); n-gram 13,440 ->
    68,119 / 81,559 = 0.83521 -> 0.835 (0.830 without speculative decoding).
    0.5.2: (9.5 + 1/2)·1024 = 10,240 + 2,048 = 12,288 -> 69,271 / 81,559 = 0.84933 -> 0.849 (n-gram too)."""
    assert sglang_mem_fraction_static(H100.memory_bytes, 1, 1, None, speculative="eagle")[0] == 0.785
    assert sglang_mem_fraction_static(H100.memory_bytes, 1, 1, None, speculative="draft_model")[0] == 0.760
    assert sglang_mem_fraction_static(H100.memory_bytes, 1, 1, None, speculative="ngram")[0] == 0.835
    assert sglang_mem_fraction_static(H100.memory_bytes, 1, 1, None, version="0.5.2", speculative="ngram")[0] == 0.849
    drafted = resolve_engine(EngineConfig(engine="sglang", speculative="draft_model"), LLAMA_3_1_8B, H100, 1)
    assert drafted.gpu_memory_utilization == 0.760
    assert resolve_engine(EngineConfig(speculative="draft_model"), LLAMA_3_1_8B, H100, 1).gpu_memory_utilization == \
        resolve_engine(EngineConfig(), LLAMA_3_1_8B, H100, 1).gpu_memory_utilization  # vLLM: no such reserve
    with pytest.raises(ValueError, match="speculative"):
        EngineConfig(speculative="medusa")


def test_sglang_size_defaults_of_a_24_gib_gpu_by_release() -> None:
    """ENGINES.md 1.2, GPU-size defaults: 20-35 GiB takes chunks of 2048 and cuda_graph_max_bs 24 (tp < 4) in
    0.5.10, 4096 and 48 in 0.5.23. A 24 GiB GPU (24,576 MiB), TP1:
    0.5.10: 512 + 1.5·2048 + 2·24 + 1/8·1024 + 58·8 = 512 + 3,072 + 48 + 128 + 464 = 4,224 MiB (no floor
    under 60 GiB); 20,352 / 24,576 = 0.82812 -> 0.828.
    0.5.23: 512 + 1.5·4096 + 2·48 + 128 + 464 = 7,344; 17,232 / 24,576 = 0.70117 -> 0.701."""
    gpu_24gib = 24 * 1024 * 1024 * 1024
    assert sglang_mem_fraction_static(gpu_24gib, 1, 1, None) == (0.828, 2048, 24)
    assert sglang_mem_fraction_static(gpu_24gib, 1, 1, None, version="0.5.23") == (0.701, 4096, 48)


def test_sglang_reserves_more_under_dp_attention_and_splits_the_chunk_among_the_ranks() -> None:
    """ENGINES.md 1.2: under --enable-dp-attention SGLang's tp is the whole group (tp·dp GPUs), it reserves
    3·cuda_graph_max_bs·dp MiB more (another 1.5·cuda_graph_max_bs·dp above 300), and divides
    chunked_prefill_size by dp.
    H200 143,771 MiB, DP8 of TP1 (SGLang tp 8: cuda_graph_max_bs 512, chunk 8192):
    512 + 1.5·8192 + 2·512 + 8/8·1024 = 14,848; + 3·512·8 = 12,288; + 1.5·512·8 = 6,144 -> 33,280 MiB;
    (143,771 − 33,280) / 143,771 = 0.76852 -> 0.769. Each rank's chunk: 8192 / 8 = 1,024.
    H100 81,559 MiB, DP2 of TP1 (SGLang tp 2 < 4: cuda_graph_max_bs 256): 512 + 12,288 + 512 + 2/8·1024 =
    13,568; + 3·256·2 = 1,536 (256 <= 300: nothing more) -> 15,104; 66,455 / 81,559 = 0.81481 -> 0.815.
    A given chunk of 4,096 is divided too: 4,096 / 4 = 1,024 per rank. vLLM gives each rank the whole budget.
    """
    assert sglang_mem_fraction_static(H200.memory_bytes, 1, 1, None, 8, version="0.5.5") == (0.769, 8192, 512)
    assert sglang_mem_fraction_static(H100.memory_bytes, 1, 1, None, 2, version="0.5.5") == (0.815, 8192, 256)
    # 0.5.10 (the default) turns its piecewise graphs off under DP attention, so reserves nothing for them: 0.769.
    sglang = resolve_engine(EngineConfig(engine="sglang"), LLAMA_3_1_8B, H200, 1, data_parallel=8)
    assert (sglang.gpu_memory_utilization, sglang.max_num_batched_tokens) == (0.769, 1024)
    given = resolve_engine(EngineConfig(engine="sglang", max_num_batched_tokens=4096), LLAMA_3_1_8B, H200, 1,
                           data_parallel=4)
    assert given.max_num_batched_tokens == 1024
    assert resolve_engine(EngineConfig(), LLAMA_3_1_8B, H200, 1, data_parallel=8).max_num_batched_tokens == 8192


def test_sglang_fraction_follows_the_release_asked_for() -> None:
    """ENGINES.md 1.2, the rule of each release (memory in MiB as the driver reports it; H100 81,559,
    H200 143,771, B200 183,359 = 192,265,846,784 B):
    0.4.0, by TP alone: 0.88 at TP1, 0.81 at TP8; chunk 8192, cuda_graph_max_bs 160 (GPUs over 25 GB).
    0.4.6: an H100 (81,559 <= 81,920) keeps 0.4.0's 0.87 at TP2; an H200 sets 13 GiB aside:
    (143,771 − 13,312) / 143,771 = 0.90741 -> 0.907.
    0.5.2 (the 0.4.9 rule): H100 TP1 reserves (9.5 + 1/2)·1024 = 10,240 -> 71,319 / 81,559 = 0.87445 -> 0.874;
    H100 TP8 (9.5 + 8/2)·1024 = 13,824 -> 67,735 / 81,559 = 0.83050 -> 0.831 (0.818 from 0.5.5);
    H200 TP8 (12 + 4)·1024 = 16,384 -> 127,387 / 143,771 = 0.88604 -> 0.886; B200 (>= 160 GiB) 32 GiB ->
    150,591 / 183,359 = 0.82129 -> 0.821; H200 DP8 of TP1 (SGLang tp 8) 16,384 + 4 GiB = 20,480 ->
    123,291 / 143,771 = 0.85755 -> 0.858. 0.5.3 and 0.5.4, between the two sourced releases, keep it.
    """
    b200_bytes = 192_265_846_784
    assert sglang_mem_fraction_static(H100.memory_bytes, 1, 1, None, version="0.4.0") == (0.88, 8192, 160)
    assert sglang_mem_fraction_static(H100.memory_bytes, 8, 1, None, version="0.4.0")[0] == 0.81
    assert sglang_mem_fraction_static(H100.memory_bytes, 2, 1, None, version="0.4.6")[0] == 0.87
    assert sglang_mem_fraction_static(H200.memory_bytes, 1, 1, None, version="0.4.6")[0] == 0.907
    assert sglang_mem_fraction_static(H100.memory_bytes, 1, 1, None, version="0.5.2") == (0.874, 8192, 256)
    assert sglang_mem_fraction_static(H100.memory_bytes, 8, 1, None, version="0.5.2")[0] == 0.831
    assert sglang_mem_fraction_static(H100.memory_bytes, 8, 1, None, version="0.5.4")[0] == 0.831
    assert sglang_mem_fraction_static(H100.memory_bytes, 8, 1, None, version="0.5.5")[0] == 0.818
    assert sglang_mem_fraction_static(H200.memory_bytes, 8, 1, None, version="0.5.1")[0] == 0.886
    assert sglang_mem_fraction_static(b200_bytes, 8, 1, None, version="0.5.2")[0] == 0.821
    assert sglang_mem_fraction_static(H200.memory_bytes, 1, 1, None, 8, version="0.5.2")[0] == 0.858
    # Through the engine's defaults: the release a request names.
    old = resolve_engine(EngineConfig(engine="sglang", engine_version="0.5.2"), LLAMA_3_1_8B, H100, 8)
    assert old.gpu_memory_utilization == 0.831 and "SGLang 0.5.2" in dict(old.sources)["gpu_memory_utilization"]
    # The default release, 0.5.10: 0.5.5's 14,848 MiB + the piecewise graphs' 464 -> 0.812.
    assert resolve_engine(EngineConfig(engine="sglang"), LLAMA_3_1_8B, H100, 8).gpu_memory_utilization == 0.812


def test_a_data_parallel_rank_of_one_gpu_joins_a_multi_gpu_group() -> None:
    """Attention ranks of one GPU each still share a process group (the MoE exchange's communicators): vLLM
    charges its 2+ GPU non-torch measurement, 2.07 GiB = 2,222,645,576 B, where one lone GPU takes 0.25 GiB
    = 268,435,456 B; TensorRT-LLM, whose tp_size spans the ranks, likewise its multi-GPU figure."""
    lone, rank = (resolve_engine(EngineConfig(), LLAMA_3_1_8B, H100, 1, data_parallel=dp) for dp in (1, 8))
    assert (lone.non_torch_bytes_per_gpu, rank.non_torch_bytes_per_gpu) == (VLLM_NON_TORCH_TP1, VLLM_NON_TORCH_TP2)
    trtllm = [resolve_engine(EngineConfig(engine="trtllm"), LLAMA_3_1_8B, H100, 1, data_parallel=dp)
              for dp in (1, 8)]
    assert trtllm[0].non_torch_bytes_per_gpu == NON_TORCH_TP1
    assert trtllm[1].non_torch_bytes_per_gpu == resolve_engine(EngineConfig(engine="trtllm"), LLAMA_3_1_8B, H100,
                                                               8).non_torch_bytes_per_gpu > NON_TORCH_TP1


def test_sglang_pool_holds_weights_and_kv_only() -> None:
    """SGLang 0.5.10 (the default), Llama-3.1-8B on H100: fraction 0.830 (the piecewise graphs' 464 MiB on top
    of 0.5.5's 13,440), KV = 0.830 x 85,520,809,984 − weights = 70,982,272,286 (.72 dropped) − 16,060,522,496
    = 54,921,749,790 B; page size 1, so 54,921,749,790 // 131,072 = 419,019 tokens (419,019 · 131,072 =
    54,921,658,368). max_running_requests = min(419,019 // 2, pool of clamp(int(419,019 / 131,072 · 512) =
    1,636, 2048, 4096) = 2048) = 2048.
    """
    result = run(LLAMA_3_1_8B, engine=EngineConfig(engine="sglang"))
    assert result.memory.usable_bytes_per_gpu == 70_982_272_286
    assert result.memory.activation_bytes_per_gpu == result.memory.overhead_bytes_per_gpu == 0
    assert result.memory.kv_budget_bytes_per_gpu == 54_921_749_790
    assert (result.kv_tokens, result.kv_blocks) == (419_019, 419_019)
    assert result.engine.max_num_seqs == 2048
    assert result.operating_point is not None and result.operating_point.concurrency_view == STEADY_STATE


def test_trtllm_takes_90_percent_of_the_free_memory_and_reserves_whole_requests() -> None:
    """TensorRT-LLM, Llama-3.1-8B on H100: free = 85,520,809,984 − 16,060,522,496 (weights)
    − 5,111,011,082 (activation peak at max_num_tokens 8192) − 139,586,437 (non-torch) = 64,209,689,969;
    KV = 0.9 x free = 57,788,720,972 (.1 dropped). Blocks of 32 tokens: 32 x 131,072 = 4,194,304 B;
    57,788,720,972 // 4,194,304 = 13,777 (13,777 · 4,194,304 = 57,784,926,208) = 440,864 tokens.
    Admission reserves 1,000 + 500 tokens = ceil(1500/32) = 47 blocks: 13,777 // 47 = 293 requests,
    under max_batch_size 2048, and that is where it runs.
    """
    result = run(LLAMA_3_1_8B, engine=EngineConfig(engine="trtllm"))
    assert result.memory.kv_budget_bytes_per_gpu == 57_788_720_972
    assert result.memory.usable_bytes_per_gpu == (57_788_720_972 + LLAMA_8B_WEIGHTS + ACTIVATION_8B
                                                  + NON_TORCH_TP1)
    assert (result.kv_tokens, result.kv_blocks) == (440_864, 13_777)
    assert result.max_concurrency.admission.sequences == 293
    assert result.engine.max_num_seqs == 2048
    assert result.operating_point is not None
    assert (result.operating_point.batch_size, result.operating_point.concurrency_view) == (293, ADMISSION)


def test_generic_defaults_to_90_percent_and_no_reserve() -> None:
    """Generic: 0.9 x 85,520,809,984 = 76,968,728,985 − 16,060,522,496 = 60,908,206,489 B; nothing else
    is subtracted, and no max_num_seqs limit applies."""
    result = run(LLAMA_3_1_8B, engine=EngineConfig(engine="generic"))
    assert result.memory.kv_budget_bytes_per_gpu == 60_908_206_489
    assert result.engine.max_num_seqs is None
    assert result.max_concurrency.admission.limit == LIMIT_KV_CACHE


def test_every_component_can_be_given() -> None:
    """Each given value replaces the engine's default and is echoed as "given": 0.8 x 85,520,809,984 =
    68,416,647,987 (.2 dropped) − 16,060,522,496 − 3e9 − 1e9 − 2e9 − 5e8 = 45,856,125,491."""
    config = EngineConfig(engine="vllm", gpu_memory_utilization=0.8, activation_bytes_per_gpu=3_000_000_000,
                          non_torch_bytes_per_gpu=1_000_000_000, cuda_graph_bytes_per_gpu=2_000_000_000,
                          reserved_bytes_per_gpu=500_000_000, block_size=32, max_num_seqs=7,
                          max_num_batched_tokens=4096, max_model_len=4096)
    result = run(LLAMA_3_1_8B, engine=dataclasses.replace(config, engine_version="0.20.0"))
    assert result.memory.kv_budget_bytes_per_gpu == 45_856_125_491
    assert result.memory.overhead_bytes_per_gpu == 3_500_000_000
    sources = dict(result.engine.sources)
    assert sources.pop("total_bytes_per_gpu").startswith("the driver's total")  # a property of the GPU
    assert sources == {name: "given" for name in sources}
    engine = result.engine
    assert (engine.block_size, engine.max_num_seqs, engine.max_model_len) == (32, 7, 4096)


# Activation estimate ----------------------------------------------------------------------------------

def test_activation_estimate_is_anchored_and_scales() -> None:
    """Per-token live values of one layer, Llama-3.1-8B at TP1: residual + norm 2·4096 = 8,192; Q, K, V and
    attention output (2·32 + 2·8)·128 = 10,240; gate+up and activated product 3·14,336 = 43,008; total
    61,440, the anchor. At TP2: 8,192 + (2·16 + 2·4)·128 + 3·7,168 = 8,192 + 5,120 + 21,504 = 34,816.
    Bytes scale linearly in batched tokens and in those values."""
    assert activation_values_per_token(LLAMA_3_1_8B, 1) == 61_440
    assert activation_peak_bytes(LLAMA_3_1_8B, 8192, 1) == ACTIVATION_8B
    assert activation_peak_bytes(LLAMA_3_1_8B, 4096, 1) == ACTIVATION_8B // 2
    assert activation_values_per_token(LLAMA_3_1_8B, 2) == 34_816
    assert activation_peak_bytes(LLAMA_3_1_8B, 8192, 2) == ACTIVATION_8B * 34_816 // 61_440


def test_moe_activation_counts_each_chosen_expert() -> None:
    """Mixtral-8x7B (top-2 of 8 experts of 14,336) at TP1: 8,192 + 10,240 + 2·(3·14,336 + 4,096) + 8
    router logits = 8,192 + 10,240 + 94,208 + 8 = 112,648 values per token; at 8192 tokens
    5,111,011,082 · 112,648 // 61,440 = 9,370,852,479 B = 8.73 GiB, near the ~8 GiB measured for MoE
    models (dense models measured 4.8-5.6 GiB)."""
    assert activation_values_per_token(MIXTRAL_8X7B, 1) == 112_648
    peak = activation_peak_bytes(MIXTRAL_8X7B, 8192, 1)
    assert peak == 9_370_852_479
    assert 7 * GIB < peak < 10 * GIB


def test_mla_activation_widths() -> None:
    """DeepSeek-V3 at TP8 (16 heads per GPU): attention = q 16·(128+64) = 3,072 + latent 512+64 = 576 +
    up-projected k_nope and v 16·(128+128) = 4,096 + output 16·128 = 2,048 = 9,792; MoE layer = 8 experts
    x (3·2048/8 + 7168) = 8 · 7,936 = 63,488 + shared 3·2048/8 = 768 + router 256 = 64,512 (the dense
    layers' 3·18,432/8 = 6,912 is smaller); plus 2·7,168 = 14,336: 88,640."""
    assert activation_values_per_token(DEEPSEEK_V3, 8) == 88_640


# MoE, MLA, windows, fp8 KV ---------------------------------------------------------------------------

def test_mixtral_moe_on_two_h100() -> None:
    """Mixtral-8x7B bf16 (93.4 GB) does not fit one H100; at TP2, per GPU:
    weights: attention (16 q heads, 4 KV heads) 8,388,608 + 4,194,304 + 8,388,608, experts 8 x
    3·4096·14,336/2 = 704,643,072 -> 725,614,592 per layer; router 32,768 + norms 8,192 stay bf16; 32
    layers = 23,219,666,944 + 1,310,720; vocabulary shards 2 · 16,000 · 4096 = 131,072,000; final norm
    4,096: 23,352,053,760 params x 2 = 46,704,107,520 B.
    activation (vLLM V1): 8,192 + (2·16 + 2·4)·128 + 2·(3·7,168 + 4,096) + 8 = 64,520 values per token;
    forward 8192 x 64,520 x 2 = 1,057,095,680 beats the sampler's 1024 x 32,000 x 14.213 = 465,731,584:
    192,255,256 + 1,057,095,680 = 1,249,350,936 B. Non-torch at 2 GPUs 2,222,645,576; graphs 934,155,387.
    KV budget = 0.92 x 85,520,809,984 = 78,679,145,185 − 46,704,107,520 − 1,249,350,936 − 2,222,645,576
    − 934,155,387 = 27,568,885,766 B; per token 2·4·128·2·32 = 65,536 B, blocks of 1,048,576 B: 26,291
    blocks (26,292 would need 27,569,160,192) = 420,656 tokens.
    """
    assert not run(MIXTRAL_8X7B).fits
    result = run(MIXTRAL_8X7B, tp=2)
    assert result.fits
    assert result.memory.weights_bytes_per_gpu == 46_704_107_520
    assert result.memory.activation_bytes_per_gpu == 1_249_350_936
    assert result.memory.non_torch_bytes_per_gpu == VLLM_NON_TORCH_TP2
    assert result.memory.kv_budget_bytes_per_gpu == 27_568_885_766
    assert result.kv_bytes_per_token_per_gpu == 65_536
    assert (result.kv_tokens, result.kv_blocks) == (420_656, 26_291)


def test_mla_kv_is_not_divided_by_tensor_parallel() -> None:
    """DeepSeek-V3 at TP8 on H200 (fp8 weights; bf16 would be 1.34 TB, 168 GB per GPU): each token
    caches (512 + 64) · 2 B = 1,152 B per layer on EVERY rank, 61 layers = 70,272 B, the same as at TP1;
    blocks = budget // (16 · 70,272 = 1,124,352)."""
    result = run(DEEPSEEK_V3, H200, tp=8, weight_dtype="fp8")
    assert result.fits
    assert result.kv_bytes_per_token_per_gpu == 70_272
    assert kv_bytes_per_token_per_gpu(DEEPSEEK_V3, "bf16", tensor_parallel=1, pipeline_parallel=1) == 70_272
    budget = result.memory.kv_budget_bytes_per_gpu
    assert result.kv_blocks == budget // 1_124_352
    assert result.kv_tokens == 16 * result.kv_blocks
    # 10 GiB holds 10,737,418,240 // 1,124,352 = 9,549 blocks = 152,784 tokens.
    assert kv_token_capacity(DEEPSEEK_V3, 10 * GIB, "bf16", tensor_parallel=8, pipeline_parallel=1,
                             block_size=16) == (152_784, 9_549)


def test_fp8_kv_doubles_tokens_and_concurrency() -> None:
    """A KV budget of exactly 10 GiB (generic engine, utilization 1.0, the rest reserved), Llama-3.1-8B:
    bf16 131,072 B/token -> 10,737,418,240 // 2,097,152 = 5,120 blocks = 81,920 tokens; fp8 65,536
    B/token -> 10,240 blocks = 163,840 tokens: exactly twice. Admission (94 blocks per 1,500-token
    request): 5,120 // 94 = 54 and 10,240 // 94 = 108."""
    engine = generic_with_kv_budget(10 * GIB, LLAMA_8B_WEIGHTS)
    bf16 = run(LLAMA_3_1_8B, engine=engine)
    fp8 = run(LLAMA_3_1_8B, engine=engine, kv_dtype="fp8")
    assert bf16.memory.kv_budget_bytes_per_gpu == fp8.memory.kv_budget_bytes_per_gpu == 10 * GIB
    assert (bf16.kv_tokens, fp8.kv_tokens) == (81_920, 163_840)
    assert (bf16.max_concurrency.admission.sequences, fp8.max_concurrency.admission.sequences) == (54, 108)


def test_steady_state_counts_mean_live_tokens() -> None:
    """10 GiB of KV, Llama-3.1-8B, 1,000 in / 500 out, blocks of 16. While producing its t-th token a
    request holds 1,000 + t tokens in ceil((1000+t)/16) blocks: contexts 1,001..1,008 take 63 blocks (8
    of them), 1,009..1,488 take 64..93 (16 each), 1,489..1,500 take 94 (12): 63·8 + 16·(64+...+93) +
    94·12 = 504 + 37,680 + 1,128 = 39,312 block-steps = 628,992 token slots over 500 steps, a mean of
    1,257.984 tokens. 81,920 tokens / 1,257.984 = 65.1 -> 65 requests (admission: 54; worst case at
    131,072 tokens: 5,120 // 8,192 = 0)."""
    result = run(LLAMA_3_1_8B, engine=generic_with_kv_budget(10 * GIB, LLAMA_8B_WEIGHTS))
    steady = result.max_concurrency.steady_state
    assert steady.sequences == 65
    assert steady.tokens_per_request == pytest.approx(1257.984, abs=1e-9)
    assert result.max_concurrency.worst_case.sequences == 0
    (mean_bytes,) = steady_state_kv_bytes_per_stage(LLAMA_3_1_8B, 1000, 500, "bf16", tensor_parallel=1,
                                                    pipeline_parallel=1, block_size=16)
    assert mean_bytes == pytest.approx(628_992 * 131_072 / 500, rel=1e-12)


def test_window_layers_hold_only_their_window() -> None:
    """Gemma-2-9B: 21 global and 21 sliding (4,096) layers of 2·8·256·2 = 8,192 B per token each. A block
    of 16 full-equivalent tokens costs 16 · 8,192 · 42 = 5,505,024 B: 10 GiB holds 1,950 of them (31,200
    tokens). At 8,192 tokens a request holds 512 blocks in each global layer and ceil(4095/16) + 1 = 257
    in each sliding one: 8,192 · 21 · (8,192 + 4,112) = 2,116,681,728 B -> 10 GiB // that = 5 requests,
    where counting every layer as global would give 10 GiB // (344,064 · 8,192) = 3."""
    budget = 10 * GIB
    layout = {"tensor_parallel": 1, "pipeline_parallel": 1, "block_size": 16}
    assert kv_token_capacity(GEMMA_2_9B, budget, "bf16", **layout) == (31_200, 1_950)
    assert requests_fitting(GEMMA_2_9B, budget, 8192, "bf16", **layout) == 5
    assert budget // (344_064 * 8192) == 3


def test_max_num_seqs_binds() -> None:
    """vLLM with max_num_seqs 64: the measured-example budget admits 280 requests of 1,500 tokens
    (26,328 blocks // 94) and sustains more, but the scheduler caps both at 64."""
    result = run(LLAMA_3_1_8B, H100_CUDA, engine=dataclasses.replace(MEASURED_EXAMPLE, max_num_seqs=64))
    admission = result.max_concurrency.admission
    assert (admission.sequences, admission.kv_limited_sequences) == (64, 280)
    assert admission.limit == LIMIT_MAX_NUM_SEQS
    assert result.max_concurrency.steady_state.limit == LIMIT_MAX_NUM_SEQS
    assert result.operating_point is not None and result.operating_point.batch_size == 64


def test_longest_single_request() -> None:
    """10 GiB of KV holds 81,920 tokens of Llama-3.1-8B: the longest request, under max_model_len 131,072."""
    result = run(LLAMA_3_1_8B, engine=generic_with_kv_budget(10 * GIB, LLAMA_8B_WEIGHTS))
    assert result.max_context_tokens == 81_920


def test_vllm_refuses_a_max_model_len_the_cache_cannot_hold() -> None:
    """vLLM checks at start-up that one max_model_len request fits: with 81,920 tokens of KV and the model's
    131,072-token context it does not, so the answer says to lower max_model_len to 81,920."""
    engine = generic_with_kv_budget(10 * GIB, LLAMA_8B_WEIGHTS)
    result = run(LLAMA_3_1_8B, engine=dataclasses.replace(
        engine, engine="vllm", activation_bytes_per_gpu=0, non_torch_bytes_per_gpu=0,
        cuda_graph_bytes_per_gpu=0))
    assert not result.fits
    assert any("lower max_model_len to 81920" in reason for reason in result.reasons)


def test_request_longer_than_max_model_len_does_not_fit() -> None:
    result = run(LLAMA_3_1_8B, engine=EngineConfig(max_model_len=1024))
    assert not result.fits
    assert "1500 tokens exceed max_model_len 1024" in result.reasons[0]
    assert result.suggestion is None  # no layout or precision makes the request shorter


# Operating point -------------------------------------------------------------------------------------

def test_operating_point_arithmetic() -> None:
    """At steady state each running request waits one decode step plus its share of prefill per token:
    tpot = decode + B · prefill / output; aggregate = B / tpot = requests/s x output. The step producing
    token t+1 reads 1,000 + t − 1 cached tokens, t = 1..499: a mean of 1,000 + 498/2 = 1,249.
    The ideal decode step at B is at least the weights and the cached KV read once:
    (16,060,522,496 + B · 1,249 · 131,072) / 3.35e12, and it is memory-bound, so within a few percent."""
    result = run(LLAMA_3_1_8B, engine=EngineConfig(gpu_memory_utilization=0.9, max_model_len=16_384))
    point = result.operating_point
    assert point is not None
    batch = point.batch_size
    assert batch == result.max_concurrency.steady_state.sequences
    assert point.mean_context_tokens == 1249
    for decode, prefill, tpot, user, aggregate, requests in (
        (point.ideal_decode_step_s, point.ideal_prefill_s, point.ideal_tpot_s,
         point.ideal_tokens_per_s_per_user, point.ideal_output_tokens_per_s, point.ideal_requests_per_s),
        (point.expected_decode_step_s, point.expected_prefill_s, point.expected_tpot_s,
         point.expected_tokens_per_s_per_user, point.expected_output_tokens_per_s,
         point.expected_requests_per_s),
    ):
        assert tpot == pytest.approx(decode + batch * prefill / 500)
        assert user == pytest.approx(1 / tpot)
        assert aggregate == pytest.approx(batch / tpot)
        assert requests == pytest.approx(aggregate / 500)
    memory_floor = (LLAMA_8B_WEIGHTS + batch * 1249 * 131_072) / 3.35e12
    assert memory_floor <= point.ideal_decode_step_s <= 1.03 * memory_floor
    assert point.expected_decode_step_s > point.ideal_decode_step_s
    assert point.expected_tpot_s > point.ideal_tpot_s


def test_prefill_is_timed_chunk_by_chunk() -> None:
    """A 1,000-token prompt with max_num_batched_tokens 1,000 is one step of 1,000 new tokens attending
    1,000 · 1,001 / 2 = 500,500 positions. A 100,000-token prompt in chunks of 100 is 1,000 steps, chunk k
    after a prefix of 100·k attending 100·(100·k + 50.5) positions; the evenly spaced sample of 256 chunks
    stands for the 1,000 within a fraction of a percent."""
    steps = build_step_time_model(LLAMA_3_1_8B, H100, weight_dtype="bf16", kv_dtype="bf16")
    common = {"batch_size": 1, "concurrency_view": STEADY_STATE, "output_tokens": 2, "tensor_parallel": 1,
              "pipeline_parallel": 1, "weight_dtype": "bf16", "kv_dtype": "bf16", "compute_dtype": "bf16",
              "efficiency": DEFAULT_EFFICIENCY}
    one_chunk = operating_point(LLAMA_3_1_8B, H100, input_tokens=1000, max_num_batched_tokens=1000, **common)
    assert one_chunk.expected_prefill_s == pytest.approx(steps.step_time_s(0, 0, 1000, 500_500, 1))
    many = operating_point(LLAMA_3_1_8B, H100, input_tokens=100_000, max_num_batched_tokens=100, **common)
    exact = sum(steps.step_time_s(0, 0, 100, 100 * (100 * k + 50.5), 1) for k in range(1000))
    assert many.expected_prefill_s == pytest.approx(exact, rel=2e-3)
    # A 1,000-token prompt under an 8,192-token budget: 1/8 of a step of 8 whole prompts (8,000 tokens attending
    # 8 x 500,500 = 4,004,000 positions, 8 sampled), `prompt_prefill_s`.
    shared = operating_point(LLAMA_3_1_8B, H100, input_tokens=1000, max_num_batched_tokens=8192, **common)
    assert shared.expected_prefill_s == pytest.approx(steps.step_time_s(0, 0, 8000, 4_004_000, 8) / 8)


def test_a_pipelines_steady_state_steps_at_its_full_period() -> None:
    """Llama-3.1-8B on 2 x H100 as PP2, 64 running requests (1,000 in, 500 out): two micro-batches of 32 in
    flight, so a decode step of 32 sequences recurs once per period of the full pipeline, 2 x its slowest
    stage (step_time.pipeline_period_scales): the trip plus, once more, the LM head, the embedding and the
    per-step overhead (16 layers a stage: the layers' share is unchanged):
      LM head: 128,256 x 4,096 x 2 B = 1,050,673,152 B once + 32 x (4,096 + 128,256) x 2 B = 8,470,528 B;
      embedding: 32 x (4,096 x 2 + 4,096 x 2) B = 524,288 B; together 1,059,667,968 B / (3.35e12 x 0.70)
      = 451.88 us (the head's 33.6 GFLOP take at most 206 us at 989.5 TFLOP/s x 0.165: memory-bound);
      per-step overhead 300 us: 751.88 us over the trip. A lone request (batch 1) makes one trip."""
    common = {"concurrency_view": STEADY_STATE, "input_tokens": 1000, "output_tokens": 500, "tensor_parallel": 1,
              "pipeline_parallel": 2, "weight_dtype": "bf16", "kv_dtype": "bf16", "compute_dtype": "bf16",
              "efficiency": DEFAULT_EFFICIENCY, "max_num_batched_tokens": 8192}
    trip = build_step_time_model(LLAMA_3_1_8B, H100, pipeline_parallel=2, weight_dtype="bf16", kv_dtype="bf16")
    full = operating_point(LLAMA_3_1_8B, H100, batch_size=64, **common)
    extra = 300e-6 + 1_059_667_968 / (3.35e12 * 0.70)
    assert extra == pytest.approx(751.88e-6, rel=1e-5)
    assert full.expected_decode_step_s - trip.step_time_s(32, 32 * 1249, 0, 0) == pytest.approx(extra, rel=1e-6)
    alone = operating_point(LLAMA_3_1_8B, H100, batch_size=1, **common)
    assert alone.expected_decode_step_s == trip.step_time_s(0.5, 0.5 * 1249, 0, 0)


def test_tensor_parallel_beyond_one_node_uses_the_scale_out_link() -> None:
    """Llama-3-70B at TP16 is allowed (KV heads replicate: 2·1·128·2·80 = 40,960 B/token per GPU). With 8
    GPUs per node the ring crosses between the two nodes over their 8 NICs together: min(450e9 NVLink,
    8 x 50e9) = 400e9 B/s instead of 450e9. Of each all-reduce's 2·15 = 30 ring steps, 2·(2 − 1) = 2 cross
    between the nodes at NCCL's 2.7 µs NET hop instead of a 0.6 µs NVLink one, and the other 28 pay the host's
    1 µs network overhead instead of 0.6 µs: 2 x 2.1 + 28 x 0.4 = 15.4 µs more. Memory and batch are the same,
    and the decode step grows by 2 all-reduces x 80 layers x (15.4e-6 + 2·15/16 · B·8192·2 B x (1/400e9 −
    1/450e9)) (SIZING.md s6, ENGINES.md s5)."""
    one_node = dataclasses.replace(H100, gpus_per_node=16)
    across = run(LLAMA_3_70B, tp=16)
    inside = run(LLAMA_3_70B, one_node, tp=16)
    assert across.fits and inside.fits
    assert across.kv_bytes_per_token_per_gpu == 40_960
    assert across.operating_point is not None and inside.operating_point is not None
    batch = across.operating_point.batch_size
    assert batch == inside.operating_point.batch_size
    extra = 2 * 80 * (2 * 2.1e-6 + 28 * 0.4e-6 + 2 * 15 / 16 * batch * 8192 * 2 * (1 / 400e9 - 1 / 450e9))
    assert across.operating_point.expected_decode_step_s - inside.operating_point.expected_decode_step_s == \
        pytest.approx(extra, rel=1e-6)


def test_pipeline_parallel_splits_layers() -> None:
    """Llama-3-70B at PP2: each stage holds 40 layers, so a token costs 40 · 4,096 = 163,840 B per GPU."""
    result = run(LLAMA_3_70B, pp=2, weight_dtype="fp8")
    assert result.kv_bytes_per_token_per_gpu == 163_840
    assert result.fits and result.operating_point is not None


def test_each_pipeline_stage_has_its_own_kv_budget_and_the_fewest_blocks_bind() -> None:
    """DeepSeek-V3 fp8 at TP8 x PP4 under TensorRT-LLM on H100 (85,029,615,043 B by CUDA). Its first stage takes
    the leftover layer (16, 15, 15, 15 layers) and holds 3 dense layers of 86,212,608 B + 13 MoE layers of
    1,455,128,576 B + the embedding 231,669,760 B = 19,406,979,072 B; the middle ones 15 MoE layers =
    21,826,928,640 B; the last 15 MoE layers + the LM head 231,669,760 + the final norm 14,336 = 22,058,612,736 B
    (tests/domain/test_weights.py works each layer out).

    Every stage pays the same activation peak A and overhead O: A = the 8,192-token anchor 5,111,011,082 B scaled
    by DeepSeek-V3's 88,640 activation values per token at TP8 over Llama-3.1-8B's 61,440 (both above):
    5,111,011,082 x 88,640 // 61,440 = 7,373,698,279 B; O = the non-torch memory measured on H100 with 2+ GPUs, 0.6 GiB:
    int(0.6 x 1,073,741,824) = 644,245,094 B. So stage s gets KV = 0.9 x (85,029,615,043 − weights_s − A − O):
    - first: 0.9 x 57,604,692,598 = 51,844,223,338 B; a block of 32 tokens in its 16 layers of (512 + 64) x 2 B
      = 32 x 1,152 x 16 = 589,824 B: 87,897 blocks (87,897 x 589,824 = 51,843,760,128);
    - middle: 0.9 x 55,184,743,030 = 49,666,268,727 B // (32 x 1,152 x 15 = 552,960) = 89,818 blocks;
    - last: 0.9 x 54,953,058,934 = 49,457,753,040 B // 552,960 = 89,441 blocks.
    One scheduler hands out the same blocks on every stage: the replica holds the first stage's 87,897 blocks =
    2,812,704 tokens. (The heaviest stage's budget over the most layers, 49,457,753,040 // 589,824 = 83,851
    blocks, would be 4.8% short.) Admission of 1,000 + 1,000 tokens = 63 blocks: first 87,897 // 63 = 1,395
    (51,844,223,338 // (63 x 589,824) alike), middle 89,818 // 63 = 1,425, last 89,441 // 63 = 1,419: 1,395."""
    engine = EngineConfig(engine="trtllm")
    resolved = resolve_engine(engine, DEEPSEEK_V3, H100_CUDA, 8, 4)
    assert (resolved.activation_bytes_per_gpu, resolved.overhead_bytes_per_gpu) == (7_373_698_279, 644_245_094)
    result = capacity(DEEPSEEK_V3, H100_CUDA, tensor_parallel=8, pipeline_parallel=4, weight_dtype="fp8",
                      kv_dtype="bf16", compute_dtype=None, engine=engine, input_tokens=1000, output_tokens=1000,
                      efficiency=DEFAULT_EFFICIENCY)
    memory = result.memory
    assert memory.weights_bytes_per_stage == (19_406_979_072, 21_826_928_640, 21_826_928_640, 22_058_612_736)
    assert memory.kv_budget_bytes_per_stage == (51_844_223_338, 49_666_268_727, 49_666_268_727, 49_457_753_040)
    assert (memory.weights_bytes_per_gpu, memory.kv_budget_bytes_per_gpu) == (22_058_612_736, 49_457_753_040)
    assert [(stage.first_layer, stage.layers, stage.kv_blocks) for stage in result.pipeline_stages] == [
        (0, 16, 87_897), (16, 15, 89_818), (31, 15, 89_818), (46, 15, 89_441)]
    assert (result.kv_blocks, result.kv_tokens) == (87_897, 2_812_704)
    assert result.max_concurrency.admission.sequences == 1_395


@settings(max_examples=60, deadline=None)
@given(model=random_models(), budgets=st.lists(st.integers(-10**6, 10**9), min_size=3, max_size=3),
       block=st.sampled_from([1, 16, 32]), tp=st.sampled_from([1, 2, 4]))
def test_a_pipeline_holds_the_fewest_blocks_any_stage_fits(model: ModelSpec, budgets: list[int], block: int,
                                                          tp: int) -> None:
    """Three stages with budgets of their own: the replica's blocks fit every stage's budget in that stage's
    layers, and one more block would overflow some stage (none when a budget is not positive)."""
    pp = min(3, model.num_hidden_layers)
    budgets = budgets[:pp]
    _, blocks = kv_token_capacity(model, budgets, "bf16", tensor_parallel=tp, pipeline_parallel=pp, block_size=block)
    per_layer = kv_bytes_per_token_per_layer(model, 0, "bf16", tp)
    per_block = [block * per_layer * len(stage) for stage in pipeline_stages(model.num_hidden_layers, pp)]
    assert all(blocks * size <= max(budget, 0) for budget, size in zip(budgets, per_block, strict=True))
    assert min(budgets) <= 0 and blocks == 0 or any(
        (blocks + 1) * size > budget for budget, size in zip(budgets, per_block, strict=True))


# Bad input --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs", [
    {"tp": 3},  # 64 heads
    {"pp": 81},  # 80 layers
    {"input_tokens": -1},
    {"output_tokens": 0},
    {"weight_dtype": "fp12"},
    {"kv_dtype": "int4"},
    {"compute_dtype": "fp4"},  # H100 has no fp4 rate
])
def test_inconsistent_input_raises(kwargs: dict) -> None:  # type: ignore[type-arg]
    with pytest.raises(ValueError):
        run(LLAMA_3_70B, **kwargs)


@pytest.mark.parametrize("kwargs", [
    {"engine": "tgi"}, {"gpu_memory_utilization": 0.0}, {"gpu_memory_utilization": 1.5},
    {"reserved_bytes_per_gpu": -1}, {"block_size": 0}, {"max_num_seqs": 0},
])
def test_engine_config_is_checked(kwargs: dict) -> None:  # type: ignore[type-arg]
    with pytest.raises(ValueError):
        EngineConfig(**kwargs)


def test_max_model_len_beyond_the_model_raises() -> None:
    with pytest.raises(ValueError, match="exceeds"):
        run(LLAMA_3_70B, tp=4, engine=EngineConfig(max_model_len=8193))


# Properties ---------------------------------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(model=random_models(), budget=st.integers(1, 10**9), block=st.sampled_from([1, 16, 32]),
       tp=st.sampled_from([1, 2, 4]), pp=st.integers(1, 3))
def test_kv_capacity_is_whole_blocks_of_every_layer(model: ModelSpec, budget: int, block: int, tp: int,
                                                     pp: int) -> None:
    pp = min(pp, model.num_hidden_layers)
    tokens, blocks = kv_token_capacity(model, budget, "bf16", tensor_parallel=tp, pipeline_parallel=pp,
                                       block_size=block)
    per_token = kv_bytes_per_token_per_gpu(model, "bf16", tensor_parallel=tp, pipeline_parallel=pp)
    assert tokens == blocks * block
    assert blocks * block * per_token <= budget < (blocks + 1) * block * per_token


@settings(max_examples=60, deadline=None)
@given(model=random_models(), budget=st.integers(1, 10**8), block=st.sampled_from([1, 16]),
       input_tokens=st.integers(1, 300), output_tokens=st.integers(1, 300))
def test_views_are_ordered(model: ModelSpec, budget: int, block: int, input_tokens: int,
                           output_tokens: int) -> None:
    """A request never holds more on average than at its end, nor more at its end than at max_model_len."""
    layout = {"tensor_parallel": 1, "pipeline_parallel": 1, "block_size": block}
    admission = requests_fitting(model, budget, input_tokens + output_tokens, "bf16", **layout)
    longest = requests_fitting(model, budget, 4096 + input_tokens + output_tokens, "bf16", **layout)
    (mean_bytes,) = steady_state_kv_bytes_per_stage(model, input_tokens, output_tokens, "bf16", **layout)
    assert longest <= admission <= int(budget / mean_bytes)


def test_window_models_sustain_at_least_their_all_global_twin() -> None:
    """gpt-oss-120b with its sliding layers holds no more per request than the same model with all
    layers global, so it never sustains fewer requests."""
    all_global = dataclasses.replace(GPT_OSS_120B, layer_types=None)
    layout = {"tensor_parallel": 1, "pipeline_parallel": 1, "block_size": 16}
    for model_input, model_output in ((1000, 500), (100_000, 4000)):
        (windowed,) = steady_state_kv_bytes_per_stage(GPT_OSS_120B, model_input, model_output, "bf16", **layout)
        (global_,) = steady_state_kv_bytes_per_stage(all_global, model_input, model_output, "bf16", **layout)
        assert windowed <= global_


def test_the_per_deployment_memo_keeps_no_request_lengths() -> None:
    """What `capacity` memoizes per deployment (engine, budget, KV pool, worst case, longest context) must not
    carry the first request's lengths into the next: a result computed after another request to the same
    deployment equals the one computed from an empty memo. Lengths that change the admission view (1k + 500
    vs 6k + 1k on Llama-3-70B, 4 x H100, vLLM) make a leak visible."""
    from app.sizing.serving import capacity as capacity_module

    def sized(input_tokens: int, output_tokens: int) -> capacity_module.CapacityResult:
        return capacity(LLAMA_3_70B, H100, tensor_parallel=4, pipeline_parallel=1, weight_dtype="bf16",
                        kv_dtype="bf16", compute_dtype="bf16", engine=EngineConfig(engine="vllm"),
                        input_tokens=input_tokens, output_tokens=output_tokens, efficiency=DEFAULT_EFFICIENCY)

    capacity_module._deployment.cache_clear()
    fresh_long = sized(6_000, 1_000)
    capacity_module._deployment.cache_clear()
    sized(1_000, 500)
    after_short = sized(6_000, 1_000)
    assert after_short == fresh_long
    assert after_short.max_concurrency.admission != sized(1_000, 500).max_concurrency.admission


def test_short_prompts_share_a_prefill_step_and_long_ones_take_their_chunks() -> None:
    """A toy step of 10 ms + 10 us per prompt token. 1,000-token prompts under an 8,192-token budget go 8 to a step
    (8,000 tokens: 10 + 80 = 90 ms), so one prompt's prefill is 90 / 8 = 11.25 ms, not the 20 ms of a step of its
    own: the step's fixed 10 ms is shared (a fuzzing run found TensorRT-LLM's per-MoE-layer cost of a prompt step,
    122 ms for Qwen3-235B, charged to every 100-token prompt). The step carries the 8 prompts' causal context,
    8 x 1,000 x 1,001 / 2 = 4,004,000 positions, and samples 8 last positions. A prompt of 8,192 or of 20,000
    tokens fills the budget alone: its prefill is its chunks' time (`chunks_s`, 0.5 s here)."""
    calls = []

    def step(decode_seqs, decode_context, prefill_tokens, prefill_context, prefill_seqs):
        calls.append((decode_seqs, decode_context, prefill_tokens, prefill_context, prefill_seqs))
        return 0.010 + 1e-5 * prefill_tokens

    assert prompt_prefill_s(step, 1000, 8192, chunks_s=99.0) == pytest.approx(0.09 / 8, rel=1e-12)
    assert calls == [(0.0, 0.0, 8000.0, 4_004_000.0, 8.0)]
    assert prompt_prefill_s(step, 8192, 8192, chunks_s=0.5) == 0.5
    assert prompt_prefill_s(step, 20_000, 8192, chunks_s=0.5) == 0.5
    assert len(calls) == 1  # a prompt alone is timed by its chunks, not again here


def test_a_disaggregated_decode_worker_prefills_nothing_and_a_prefill_worker_states_its_rate() -> None:
    """Llama-3-70B fp8 on one TP4 H100 worker, 8,192-token prompts (the budget: one prompt a step): a prefill
    worker sustains 1 / (its prompt's prefill time) prompts/s, two attention-DP ranks twice that; a decode worker
    prefills nothing (0)."""
    shape = {"tensor_parallel": 4, "pipeline_parallel": 1, "weight_dtype": "fp8", "kv_dtype": "fp8",
             "compute_dtype": "fp8", "efficiency": DEFAULT_EFFICIENCY, "max_num_batched_tokens": 8192,
             "batch_size": 16, "concurrency_view": "admission", "input_tokens": 8192}
    prefill = operating_point(LLAMA_3_70B, H100, output_tokens=1, **shape)
    assert prefill.expected_prefill_requests_per_s == pytest.approx(1 / prefill.expected_prefill_s, rel=1e-12)
    assert prefill.ideal_prefill_requests_per_s == pytest.approx(1 / prefill.ideal_prefill_s, rel=1e-12)
    ranks = operating_point(LLAMA_3_70B, H100, output_tokens=1, **{**shape, "data_parallel": 2})
    assert ranks.expected_prefill_requests_per_s == pytest.approx(2 / ranks.expected_prefill_s, rel=1e-12)
    decode = operating_point(LLAMA_3_70B, H100, output_tokens=1024, decode_only=True, **shape)
    assert decode.expected_prefill_requests_per_s == decode.ideal_prefill_requests_per_s == 0.0
