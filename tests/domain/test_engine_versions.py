"""Engine rules by version and checkpoint (ENGINES.md 1.1-1.3), worked by hand."""

from __future__ import annotations

import dataclasses

import pytest

from app.sizing.calibration.predict import Measurement, prepare
from app.sizing.engines import (
    ENGINES,
    EngineConfig,
    gpu_problems,
    published_run_kv_dtype,
    resolve_engine,
    resolve_version,
)
from app.sizing.engines.base import parse_version
from app.sizing.engines.vllm import SamplerFit, activation_peak_bytes, scheduler_defaults
from app.sizing.model.recipes import RECIPES, uniform_recipe
from app.sizing.specs import GpuSpec
from tests.domain.models_for_tests import DEEPSEEK_V3, LLAMA_3_8B, QWEN2_5_72B


def test_versions_parse_from_what_the_data_and_users_write() -> None:
    assert parse_version("0.19.0 (vllm/vllm-openai:v0.19.0, V1 engine)") == (0, 19, 0)
    assert parse_version("v0.5.10") == (0, 5, 10)
    assert parse_version("1.0") == (1, 0, 0)
    with pytest.raises(ValueError):
        parse_version("nightly")
    assert resolve_version(EngineConfig()) == ("0.33.0", "the latest vLLM release the engine reference covers")
    assert resolve_version(EngineConfig(engine_version="0.19.0")) == ("0.19.0", "given")
    assert resolve_version(EngineConfig(engine="generic")) == ("", "none")


def test_a_release_the_engine_reference_does_not_cover_says_whose_rules_it_gets() -> None:
    """ENGINES.md 1.1's tables run from vLLM 0.6.0 to 0.33, 1.2's from SGLang 0.4.0 to 0.5.23; SGLang's default is
    0.5.10, the latest whose reserve 1.2 sizes in full (its 0.5.23 row names a DeepEP reserve without a size), and
    TensorRT-LLM's 1.0.0, the first whose default is the PyTorch backend 1.3 describes at a commit of main."""
    assert resolve_version(EngineConfig(engine_version="0.5.0")) == (
        "0.5.0", ("given; older than any vllm release the engine reference covers (0.6.0 to 0.33.0): 0.6.0's "
                  "rules apply"))
    assert resolve_version(EngineConfig(engine_version="0.34")) == (
        "0.34", ("given; newer than any vllm release the engine reference covers (0.6.0 to 0.33.0): 0.33.0's "
                 "rules apply"))
    assert resolve_version(EngineConfig(engine_version="0.6.0"))[1] == "given"
    assert resolve_version(EngineConfig(engine="sglang", engine_version="0.3.0"))[1].endswith(
        "(0.4.0 to 0.5.23): 0.4.0's rules apply")
    assert resolve_version(EngineConfig(engine="sglang", engine_version="0.5.23"))[1] == "given"
    version, source = resolve_version(EngineConfig(engine="sglang"))
    assert version == "0.5.10" and "0.5.23 adds terms it does not size" in source
    version, source = resolve_version(EngineConfig(engine="trtllm"))
    assert version == "1.0.0" and source.startswith("the first TensorRT-LLM release whose default is the PyTorch")
    assert resolve_version(EngineConfig(engine="trtllm", engine_version="0.17"))[1] == "given"


def test_trtllm_with_a_modelopt_fp8_checkpoint_caches_fp8() -> None:
    """TensorRT-LLM's kv_cache_config.dtype 'auto' keeps the checkpoint's kv_cache_quant_algo FP8."""
    trtllm = ENGINES["trtllm"]
    dtype, why = trtllm.kv_dtype("1.0.0", RECIPES["modelopt_fp8"], "bf16")
    assert dtype == "fp8" and "TensorRT-LLM" in why
    assert trtllm.kv_dtype("1.0.0", RECIPES["modelopt_nvfp4"], "bf16")[0] == "fp8"


def test_vllm_and_sglang_read_modelopt_kv_from_their_first_versions_that_do() -> None:
    """vLLM resolves 'auto' from a ModelOpt config from 0.14.0, SGLang from 0.5.5 (ENGINES.md 1.1, 1.2)."""
    modelopt = RECIPES["modelopt_fp8"]
    assert ENGINES["vllm"].kv_dtype("0.13.0", modelopt, "bf16")[0] == "bf16"
    assert ENGINES["vllm"].kv_dtype("0.14.0", modelopt, "bf16")[0] == "fp8"
    assert ENGINES["sglang"].kv_dtype("0.5.2", modelopt, "bf16")[0] == "bf16"
    assert ENGINES["sglang"].kv_dtype("0.5.5", modelopt, "bf16")[0] == "fp8"
    assert ENGINES["generic"].kv_dtype("", modelopt, "bf16")[0] == "bf16"


def test_checkpoints_without_a_kv_scheme_keep_the_model_dtype() -> None:
    assert ENGINES["trtllm"].kv_dtype("1.0.0", RECIPES["gpt_oss_mxfp4"], "fp4")[0] == "bf16"
    assert ENGINES["vllm"].kv_dtype("0.33.0", uniform_recipe("fp8"), "bf16")[0] == "bf16"
    assert ENGINES["vllm"].kv_dtype("0.33.0", None, "fp16")[0] == "fp16"
    assert ENGINES["vllm"].kv_dtype("0.19.0", None, "fp32")[0] == "fp32"


def test_measured_runs_without_a_kv_dtype_take_the_engines_checkpoint_default() -> None:
    """TensorRT-LLM's published fp8/fp4 runs serve ModelOpt checkpoints (FP8 KV); its bf16 runs and other
    engines' runs cache in bf16 (the predictor models LMDeploy and gpt-fast as the generic engine)."""
    assert published_run_kv_dtype("trtllm", "fp8") == "fp8"
    assert published_run_kv_dtype("trtllm", "fp4") == "fp8"
    assert published_run_kv_dtype("trtllm", "bf16") == "bf16"
    assert published_run_kv_dtype("vllm", "fp8") == "bf16"
    assert published_run_kv_dtype("generic", "fp8") == "bf16"
    # At the run's own version: SGLang adopts a ModelOpt checkpoint's FP8 KV from 0.5.5, not in 0.5.2.
    assert published_run_kv_dtype("sglang", "modelopt_fp8", "0.5.2") == "bf16"
    assert published_run_kv_dtype("sglang", "modelopt_fp8", "0.5.5") == "fp8"


def test_vllm_activation_is_the_larger_of_forward_and_sampler() -> None:
    """With base 100 and 10 float32 bytes per logit:
    Llama-3-8B, 1024 seqs: sampler 131,334,144 logits x (2 + 10) = 1,576,009,728 > forward 8192 x 61,440 x 2
    = 1,006,632,960 -> 1,576,009,828; fp32 model: sampler 131,334,144 x 14 = 1,838,678,016 vs forward
    8192 x 61,440 x 4 = 2,013,265,920 -> 2,013,266,020.
    Qwen2.5-72B at 16,384 batched tokens, 256 seqs: forward 16,384 x 100,000 x 2 = 3,276,800,000 > sampler
    256 x 152,064 x 12 = 467,140,608 -> 3,276,800,100."""
    fit = SamplerFit(base_bytes=100, float32_bytes_per_logit=10.0)
    common = {"max_num_batched_tokens": 8192, "max_num_seqs": 1024, "values_per_token": 61_440, "fit": fit}
    assert activation_peak_bytes(LLAMA_3_8B, model_dtype_bytes=2, **common) == 1_576_009_828
    assert activation_peak_bytes(LLAMA_3_8B, model_dtype_bytes=4, **common) == 2_013_266_020
    assert activation_peak_bytes(QWEN2_5_72B, max_num_batched_tokens=16_384, max_num_seqs=256,
                                 values_per_token=100_000, model_dtype_bytes=2, fit=fit) == 3_276_800_100


def _gpu(name: str, slug: str, gib: float) -> GpuSpec:
    return GpuSpec(name=name, slug=slug, memory_bytes=round(gib * 2**30), memory_bandwidth_bytes_per_s=3e12,
                   interconnect_bandwidth_bytes_per_s=450e9, bf16_flops_per_s=1e15)


H100 = _gpu("NVIDIA H100 SXM5 80GB", "h100-sxm", 79.65)
A100_80GB = _gpu("NVIDIA A100 80GB SXM4", "a100-80gb-sxm", 80)
MI300X = _gpu("AMD Instinct MI300X", "mi300x", 191.69)
B200 = _gpu("NVIDIA B200", "b200", 178.4)
LLAMA_3_1_8B = dataclasses.replace(LLAMA_3_8B, max_position_embeddings=131_072)  # Llama-3-8B, longer context


def test_vllm_scheduler_defaults_follow_the_release() -> None:
    """`vllm serve` defaults by release (ENGINES.md 1.1 defaults table):
    - V0 (0.5.4, 0.6.x): 256 sequences; chunked prefill only above a 32,768-token max_model_len, at 512 tokens
      (Llama-3.1's 131,072 positions); below, a whole prompt per step: max(4,096, 2,048) = 4,096 tokens for
      Llama-2's 4,096 positions. 0.7.x chunks at 2,048.
    - 0.8.3: 1,024 sequences; 8,192 tokens only where the GPU's name says H100/H200: MI300X gets 2,048.
    - 0.8.5: by memory, >= 70 GiB: 1,024 / 8,192, A100 80GB included; from 0.9.0 A100 takes 256 / 2,048.
    - B200 (178 GiB): 8,192 through 0.25; 16,384 in 0.33 (its >= 160 GiB tier)."""
    def at(version: str, gpu: GpuSpec, max_model_len: int = 131_072) -> tuple[int, int]:
        seqs, tokens, _ = scheduler_defaults(gpu, parse_version(version), max_model_len)
        return seqs, tokens

    assert at("0.5.4", H100) == (256, 512)
    assert at("0.6.1", MI300X, max_model_len=4096) == (256, 4096)
    assert at("0.6.1", MI300X, max_model_len=1000) == (256, 2048)
    assert at("0.7.3", H100) == (256, 2048)
    assert at("0.8.3", MI300X) == (1024, 2048)
    assert at("0.8.3", H100) == (1024, 8192)
    assert at("0.8.5", A100_80GB) == (1024, 8192)
    assert at("0.9.0", A100_80GB) == (256, 2048)
    assert at("0.25.0", B200) == (1024, 8192)
    assert at("0.33.0", B200) == (1024, 16384)
    assert at("0.33.0", H100) == (1024, 8192)


def test_vllm_0_8_0_runs_an_mla_model_in_flashmlas_blocks_of_64() -> None:
    """ENGINES.md 1.1's defaults table: block_size "16 (FlashMLA forces 64)" in 0.8.0, 16 in 0.8.5's column:
    DeepSeek-V3 on vLLM 0.8.0 and 0.8.4 gets 64-token blocks, on 0.8.5 and 0.33 the default 16, and a model
    without MLA 16 throughout."""
    def block(model, version: str) -> int:
        return resolve_engine(EngineConfig(engine_version=version), model, H100, 8).block_size

    assert [block(DEEPSEEK_V3, v) for v in ("0.7.3", "0.8.0", "0.8.4", "0.8.5", "0.33.0")] == [16, 64, 64, 16, 16]
    assert block(LLAMA_3_8B, "0.8.0") == 16
    assert "FlashMLA" in dict(resolve_engine(EngineConfig(engine_version="0.8.0"), DEEPSEEK_V3, H100, 8).sources)[
        "block_size"]


def test_a_measured_run_is_predicted_with_its_own_releases_defaults() -> None:
    """The validator resolves the engine at the version the run states: vLLM 0.5.4 runs at most 256
    sequences per step where 0.19.0 runs 1,024 (H100), and caps the chunk at 512 tokens for Llama-3.1."""
    def scheduler(version: str | None):
        measured = Measurement(scenario="offline", metric="output_tokens_per_s", num_gpus=1, weight_dtype="bf16",
                               engine="vllm", engine_version=version, tp=1, isl=100, osl=100, num_requests=50)
        return prepare(measured, LLAMA_3_1_8B, H100).layouts[0].scheduler

    old, new = scheduler("0.5.4"), scheduler("0.19.0")
    assert (old.max_num_seqs, old.max_num_batched_tokens) == (256, 512)
    assert (new.max_num_seqs, new.max_num_batched_tokens) == (1024, 8192)
    assert scheduler("2024").max_num_seqs == scheduler(None).max_num_seqs == 1024  # a year: the default release


def test_tensorrt_llm_refuses_gpus_of_other_makers_and_the_others_refuse_none() -> None:
    """TensorRT-LLM builds on CUDA: NVIDIA GPUs only. A GPU whose maker is not stated (an inline spec) is not
    refused, since nothing says it is not NVIDIA's."""
    mi300x = GpuSpec(name="AMD Instinct MI300X", slug="mi300x", memory_bytes=205_822_885_888,
                     memory_bandwidth_bytes_per_s=5.3e12, interconnect_bandwidth_bytes_per_s=64e9,
                     bf16_flops_per_s=1307.4e12, vendor="AMD")
    h100 = dataclasses.replace(mi300x, name="NVIDIA H100 SXM5 80GB", slug="h100-sxm", vendor="NVIDIA")
    unstated = dataclasses.replace(mi300x, name="inline", slug="inline", vendor="")
    assert gpu_problems("trtllm", mi300x) == ["trtllm runs on NVIDIA GPUs only, and AMD Instinct MI300X is AMD's"]
    assert gpu_problems("trtllm", h100) == [] and gpu_problems("trtllm", unstated) == []
    nameless = dataclasses.replace(mi300x, name="", slug="")  # an inline spec without a name
    assert gpu_problems("trtllm", nameless) == ["trtllm runs on NVIDIA GPUs only, and the GPU (unnamed) is AMD's"]
    for engine in ("vllm", "sglang", "generic", None):
        assert gpu_problems(engine, mi300x) == []
