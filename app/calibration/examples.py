"""Example request rows of the calibration and validation API (shown in Swagger UI, and sent by a test of every
operation's examples): published measurements in the columns of measured-calibration.csv."""

from __future__ import annotations

from typing import Any

ROW_EXAMPLE: dict[str, Any] = {
    "row_id": "TRTLLM_PERF_V017-2", "source_id": "TRTLLM_PERF_V017", "model": "llama-3.1-8b", "gpu": "h100-sxm",
    "num_gpus": 1, "tp": 1, "pp": 1, "weight_dtype": "fp8", "compute_dtype": "fp8", "kv_dtype": "fp8",
    "engine": "trtllm", "engine_version": "TensorRT-LLM 0.17", "scenario": "offline", "isl": 128, "osl": 128,
    "batch": None, "concurrency": None, "num_requests": None, "request_rate": None,
    "metric": "output_tokens_per_s", "stat": None, "value": 28836.77,
    "notes": "trtllm-bench throughput, all requests at once",
}
LATENCY_ROW_EXAMPLE: dict[str, Any] = {
    "row_id": "TRTLLM_PERF_V017-375", "source_id": "TRTLLM_PERF_V017", "model": "llama-3.1-70b",
    "gpu": "h100-sxm", "num_gpus": 4, "tp": 4, "pp": 1, "weight_dtype": "bf16", "compute_dtype": "bf16",
    "kv_dtype": "bf16", "engine": "trtllm", "scenario": "poisson", "isl": 467, "osl": 256, "request_rate": 2,
    "metric": "itl_ms", "stat": "mean", "value": 21,
}


# Swagger's calibration example: the H100 fp8 rows of examples/calibration-sample.csv (TensorRT-LLM's published
# performance tables: v0.17's offline throughputs and v0.9's static batches; sources in
# ../shared/data/measured-calibration-sources.md), 20 rows: at least the 12 a GPU family and precision needs for
# an entry of its own (fit.MIN_ROWS_PER_ENTRY), so "Try it out" fits a profile.
_V09 = {"source_id": "TRTLLM_PERF_V09", "gpu": "h100-sxm", "num_gpus": 1, "tp": 1, "pp": 1, "weight_dtype": "fp8",
        "compute_dtype": "fp8", "kv_dtype": "fp8", "engine": "trtllm", "engine_version": "TensorRT-LLM 0.9.0"}
_V09_RUNS = (  # (row number, model, scenario, isl, osl, batch, metric, value)
    *((number, model, "static_batch", isl, osl, batch, "output_tokens_per_s_per_gpu", value)
      for number, model, isl, osl, batch, value in (
          (1134, "gpt-j-6b", 128, 128, 1024, 25860), (1135, "gpt-j-6b", 128, 2048, 120, 7350),
          (1136, "gpt-j-6b", 2048, 128, 64, 2570), (1137, "gpt-j-6b", 2048, 2048, 64, 3212),
          (1138, "mistral-7b-v0.1", 128, 128, 896, 20404), (1139, "mistral-7b-v0.1", 128, 2048, 120, 8623),
          (1140, "mistral-7b-v0.1", 2048, 128, 84, 2405), (1141, "mistral-7b-v0.1", 2048, 2048, 56, 3731),
          (1142, "llama-2-7b", 128, 128, 896, 19854), (1143, "llama-2-7b", 128, 2048, 120, 6944),
          (1144, "llama-2-7b", 2048, 128, 84, 2163), (1145, "llama-2-7b", 2048, 2048, 56, 2826))),
    *((number, model, "batch1", isl, 1, 1, "ttft_ms", value) for number, model, isl, value in (
        (1208, "gpt-j-6b", 128, 5.5), (1209, "gpt-j-6b", 2048, 23.8), (1210, "mistral-7b-v0.1", 128, 6.5),
        (1211, "mistral-7b-v0.1", 2048, 32.4), (1212, "llama-2-7b", 128, 6.3), (1213, "llama-2-7b", 2048, 30.8))),
)
CALIBRATION_ROWS_EXAMPLE: list[dict[str, Any]] = [
    ROW_EXAMPLE, {**ROW_EXAMPLE, "row_id": "TRTLLM_PERF_V017-7", "osl": 2048, "value": 21109.38},
    *({**_V09, "row_id": f"TRTLLM_PERF_V09-{number}", "model": model, "scenario": scenario, "isl": isl, "osl": osl,
       "batch": batch, "metric": metric, "value": value}
      for number, model, scenario, isl, osl, batch, metric, value in _V09_RUNS),
]
