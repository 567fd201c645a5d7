"""A published disaggregated run's TensorRT-LLM decode worker: launched with max_batch_size = the batch the run
states and max_num_tokens = that batch rounded up to a whole 32-token block (aiconfigurator 0.12.0's benchmark
rule), so its activation peak, which TensorRT-LLM profiles at max_num_tokens, leaves the KV cache more than the
default 8,192 tokens would. Every expected value is worked by hand below.
"""

from __future__ import annotations

import pytest

from app.sizing.calibration.predict import PoolLayout, _disaggregated_run, decode_worker_limits, prepare
from tests.domain.models_for_tests import LLAMA_3_8B
from tests.domain.test_predict import HOPPER, measurement

GIB = 2**30


@pytest.mark.parametrize(("batch", "tokens"), [
    (1, 32),      # one block
    (50, 64),     # 50 / 32 = 1.56: two blocks
    (64, 64),     # exactly two blocks
    (512, 512),   # 16 blocks
    (513, 544),   # 16.03: 17 blocks = 544
])
def test_a_tensorrt_llm_decode_worker_runs_its_batch_in_whole_blocks_of_tokens(batch: int, tokens: int) -> None:
    assert decode_worker_limits("trtllm", batch) == {"max_num_seqs": batch, "max_num_batched_tokens": tokens}


@pytest.mark.parametrize(("engine", "batch"), [("trtllm", None), ("sglang", 64), ("vllm", 64)])
def test_other_engines_and_unstated_batches_keep_the_engines_defaults(engine: str, batch: int | None) -> None:
    assert decode_worker_limits(engine, batch) == {}


def _decode_kv_tokens(batch: int | None) -> int:
    """The KV tokens of the decode worker of one H100 prefill worker and one H100 decode worker of Llama-3-8B bf16 on
    TensorRT-LLM 1.0, 1,024 in / 128 out, 64 users."""
    m = measurement(scenario="closed_loop", metric="ttft_ms", stat=None, engine="trtllm", engine_version="1.0",
                    num_gpus=2, tp=None, batch=None, concurrency=64, isl=1024, osl=128, disaggregated=True,
                    prefill=PoolLayout(workers=1, tp=1), decode=PoolLayout(workers=1, tp=1, batch=batch))
    prepare(m, LLAMA_3_8B, HOPPER)  # the row is predictable as stated
    _disaggregated_run.cache_clear()
    run = _disaggregated_run(LLAMA_3_8B, HOPPER, m, "bf16", "bf16", "bf16")
    _disaggregated_run.cache_clear()
    layout = run._decode[0]
    assert layout.scheduler.max_num_seqs <= (batch or layout.scheduler.max_num_seqs)
    return layout.kv_tokens


def test_a_decode_worker_launched_with_its_batchs_tokens_keeps_the_activations_it_does_not_need_for_kv() -> None:
    """TensorRT-LLM's KV = 0.9 x (total - weights - activations - overhead), its activation peak 4.76 GiB (measured on
    Llama-3.1-8B at 8,192 batched tokens) x batched tokens / 8,192 x live values per token / 61,440, and Llama-3-8B's
    live values per token are that model's: 2 x 4,096 + (4,096 + 1,024 + 1,024 + 4,096) + 3 x 14,336 = 61,440. So at
    the default 8,192 tokens the peak is 4.76 GiB, and at batch 64 (max_num_tokens 64) 4.76 GiB x 64 / 8,192: the KV
    budget grows by 0.9 x 4.76 GiB x (1 - 64 / 8,192) = 0.9 x 5,111,011,082 B x 127 / 128 = 4,563,973,177 B, at
    2 (K, V) x 32 layers x 8 KV heads x 128 x 2 B = 131,072 B a token 34,820.4 tokens, counted in whole 32-token
    blocks on each side (one block either way). No other term of the budget depends on the batch."""
    grown = 0.9 * 4.76 * GIB * (1 - 64 / 8192) / 131_072
    assert grown == pytest.approx(34_820.4, abs=0.1)
    assert _decode_kv_tokens(64) - _decode_kv_tokens(None) == pytest.approx(grown, abs=32)
