"""The capacity validation on the shipped vLLM 0.19 capacity runs (tests/data/measured-capacity.csv, the
`capacity` rows of measured-calibration-2.csv): the shipped activation fit is what the data gives, and
the accuracy targets hold."""

from __future__ import annotations

from pathlib import Path

from app.calibration.capacity_runs import capacity_report, fit_vllm_activation, is_fit_run, read_capacity_runs
from app.calibration.service import ReferenceCatalog
from app.sizing.engines.vllm import ACTIVATION_FIT

RUNS = read_capacity_runs(Path(__file__).parent / "data" / "measured-capacity.csv")


def test_runs_are_read_whole() -> None:
    """84 rows = 21 runs of 4 metrics; one Qwen2.5-7B run: 1,096,000 tokens, 58.53 GiB, 14.25 GiB weights,
    activation 2.21 GiB (notes), utilization 0.95, max_model_len 8192."""
    assert len(RUNS) == 21
    run = next(r for r in RUNS if r.model == "qwen2.5-7b" and r.tp == 1 and r.kv_dtype == "bf16"
               and r.max_model_len == 8192)
    assert run.measured == {"kv_cache_tokens": 1_096_000, "kv_cache_gib": 58.53, "max_concurrency": 133.79,
                            "weights_gib": 14.25, "activation_gib": 2.21}
    assert (run.gpu_memory_utilization, run.engine_version.split()[0]) == (0.95, "0.19.0")


def test_shipped_activation_fit_is_the_fit_of_the_data() -> None:
    assert fit_vllm_activation(RUNS, ReferenceCatalog()) == ACTIVATION_FIT


def test_capacity_targets_hold() -> None:
    """Median absolute error over the predicted runs: weights <= 1%, KV tokens <= 3%, max concurrency
    <= 3%, activation <= 20%; and on the multi-GPU runs the activation fit did not see."""
    report = capacity_report(RUNS, ReferenceCatalog())
    held_out = [p for p in report.predicted if not is_fit_run(p)]
    assert len(report.predicted) >= 10 and len(held_out) >= 5
    for runs in (None, held_out):
        assert report.median_error("weights_gib", runs) <= 1  # type: ignore[operator]
        assert report.median_error("kv_cache_tokens", runs) <= 3  # type: ignore[operator]
        assert report.median_error("max_concurrency", runs) <= 3  # type: ignore[operator]
        assert report.median_error("activation_gib", runs) <= 20  # type: ignore[operator]
