"""Engine rules by version and checkpoint (ENGINES.md 1.1-1.3), worked by hand."""

from __future__ import annotations

import pytest

from app.sizing.engines import ENGINES, EngineConfig, published_run_kv_dtype, resolve_version
from app.sizing.engines.base import parse_version
from app.sizing.engines.vllm import SamplerFit, activation_peak_bytes
from app.sizing.model.recipes import RECIPES, uniform_recipe
from tests.domain.models_for_tests import LLAMA_3_8B, QWEN2_5_72B


def test_versions_parse_from_what_the_data_and_users_write() -> None:
    assert parse_version("0.19.0 (vllm/vllm-openai:v0.19.0, V1 engine)") == (0, 19, 0)
    assert parse_version("v0.5.10") == (0, 5, 10)
    assert parse_version("1.0") == (1, 0, 0)
    with pytest.raises(ValueError):
        parse_version("nightly")
    assert resolve_version(EngineConfig()) == ("0.33.0", "the latest vllm release the engine reference covers")
    assert resolve_version(EngineConfig(engine_version="0.19.0")) == ("0.19.0", "given")
    assert resolve_version(EngineConfig(engine="generic")) == ("", "none")


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
