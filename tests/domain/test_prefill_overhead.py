"""The cost per MoE layer of a step that carries prompt tokens, in engines that run such steps outside CUDA
graphs (`Efficiency.prefill_moe_layer_overhead_s`).

Independent source: the model cards' layer counts (DeepSeek-V3: 61 layers, the first 3 dense, so 58 MoE
layers; Mixtral-8x7B: 32 layers, every one MoE). Engine facts: SGLang's piecewise CUDA graphs, which
cover prefill batches, are on by default from 0.5.10 (ENGINES.md 1.2); TensorRT-LLM's PyTorch backend
(the default from 1.0) replays graphs for generation-only batches; vLLM's V1 engine (from 0.8.0) graphs
mixed and prefill steps piecewise.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from app.sizing.engines import host_adjusted
from app.sizing.hardware.efficiency import DEFAULT_EFFICIENCY
from app.sizing.hardware.step_time import build_step_time_model
from tests.domain.models_for_tests import DEEPSEEK_V3, LLAMA_3_8B, MIXTRAL_8X7B
from tests.domain.test_roofline import H100_SXM

ONE_MS = dataclasses.replace(DEFAULT_EFFICIENCY, prefill_moe_layer_overhead_s=1e-3)


def _steps(model, efficiency, tp=1):  # type: ignore[no-untyped-def]
    return build_step_time_model(model, H100_SXM, tensor_parallel=tp, weight_dtype="fp8", kv_dtype="fp8",
                                 efficiency=efficiency)


@pytest.mark.parametrize(("model", "tp", "moe_layers"), [(DEEPSEEK_V3, 8, 61 - 3), (MIXTRAL_8X7B, 2, 32)])
def test_a_step_with_prompt_tokens_pays_it_once_per_moe_layer(model, tp, moe_layers) -> None:  # type: ignore[no-untyped-def]
    """At 1 ms per MoE layer: DeepSeek-V3 58 x 1 ms = 58 ms, Mixtral 32 x 1 ms = 32 ms more for a 512-token
    prefill and for a mixed step (16 decoding sequences plus a 256-token chunk), through the scalar path
    and the array path alike; nothing more for a decode-only step."""
    with_it, without = _steps(model, ONE_MS, tp), _steps(model, DEFAULT_EFFICIENCY, tp)
    extra = moe_layers * 1e-3
    for step in ((0, 0, 512, 512), (16, 16 * 2048, 256, 256)):
        assert with_it.step_time_s(*step) - without.step_time_s(*step) == pytest.approx(extra, rel=1e-9)
    arrays = (np.array([16.0, 0.0, 16.0]), np.array([16 * 2048.0, 0.0, 16 * 2048.0]), np.array([0.0, 512.0, 256.0]),
              np.array([0.0, 512.0, 256.0]))
    np.testing.assert_allclose(with_it.step_time_s(*arrays) - without.step_time_s(*arrays), [0.0, extra, extra],
                               rtol=1e-9, atol=1e-12)
    assert with_it.step_time_s(16, 16 * 2048, 0, 0) == without.step_time_s(16, 16 * 2048, 0, 0)
    assert with_it.ideal_step_time_s(0, 0, 512, 512) == without.ideal_step_time_s(0, 0, 512, 512)


def test_a_dense_model_has_no_moe_layer_to_pay_it_for() -> None:
    assert _steps(LLAMA_3_8B, ONE_MS).step_time_s(0, 0, 512, 512) == \
        _steps(LLAMA_3_8B, DEFAULT_EFFICIENCY).step_time_s(0, 0, 512, 512)


@pytest.mark.parametrize(("engine", "version", "pays"), [
    ("trtllm", "1.0.0", True),  # the PyTorch backend: a batch with context requests runs eagerly
    ("trtllm", "0.17.0", False),  # a TensorRT engine: no per-layer host work
    ("sglang", "0.5.9", True),  # before piecewise CUDA graphs were on by default
    ("sglang", "0.5.10", False),
    ("vllm", "0.19.0", False),  # V1: piecewise graphs
    ("vllm", "0.6.3", True),  # V0: graphs for decode-only batches
])
def test_only_engines_that_run_prompt_steps_outside_graphs_pay_it(engine: str, version: str, pays: bool) -> None:
    assert host_adjusted(ONE_MS, engine, version).prefill_moe_layer_overhead_s == (1e-3 if pays else 0.0)


def test_without_an_engine_it_is_not_charged() -> None:
    """The GPU's own time (a roofline, the planner's analytic screening) has no engine loop."""
    assert host_adjusted(ONE_MS, None).prefill_moe_layer_overhead_s == 0.0


@pytest.mark.parametrize(("engine", "version"), [("trtllm", "1.0.0"), ("sglang", "0.5.9"), ("vllm", "0.6.3")])
def test_a_disaggregated_decode_worker_never_pays_it(engine: str, version: str) -> None:
    """A decode worker runs no prompt step: its requests arrive with the prompt's KV cache and first token and join
    the decode batch, which the engine replays as a graph (TensorRT-LLM's generation-only requests, above). Under
    each engine that pays it aggregated, its prefill workers still pay 1 ms per MoE layer and its decode workers
    nothing: DeepSeek-V3's first step of an arriving request (its last prompt token, 16 sequences decoding beside
    it) costs 58 x 1 ms = 58 ms more aggregated or on a prefill worker, and exactly what it costs without the
    overhead on a decode worker."""
    assert host_adjusted(ONE_MS, engine, version).prefill_moe_layer_overhead_s == 1e-3
    assert host_adjusted(ONE_MS, engine, version, prefill_pool=True).prefill_moe_layer_overhead_s == 1e-3
    decode = host_adjusted(ONE_MS, engine, version, decode_pool=True)
    assert decode.prefill_moe_layer_overhead_s == 0.0
    arriving = (16, 16 * 2048, 1, 2048)  # 16 decoding + one request's last prompt token after 2,047 cached
    without = _steps(DEEPSEEK_V3, host_adjusted(DEFAULT_EFFICIENCY, engine, version, decode_pool=True), 8)
    assert _steps(DEEPSEEK_V3, decode, 8).step_time_s(*arriving) == without.step_time_s(*arriving)
    aggregated = _steps(DEEPSEEK_V3, host_adjusted(ONE_MS, engine, version), 8)
    assert aggregated.step_time_s(*arriving) - _steps(DEEPSEEK_V3, host_adjusted(DEFAULT_EFFICIENCY, engine, version),
                                                      8).step_time_s(*arriving) == pytest.approx(58e-3, rel=1e-9)
