"""What each step of a disaggregated deployment's decode worker costs beyond an aggregated worker's
(`Efficiency.decode_worker_step_overhead_s`): which workers pay it, how a step is charged, and how a fit
gives it one value for every entry. Every expected value is worked by hand below.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pytest

from app.sizing.calibration.fit import (
    ANY,
    DECODE_WORKER_STEP,
    GLOBAL_PARAMETERS,
    MIN_ROWS_PER_ENTRY,
    PRIOR_WEIGHT,
    CalibrationProfile,
    ProfileEntry,
    fit_decode_worker_step,
    fit_profile,
    single_entry_profile,
)
from app.sizing.engines import host_adjusted
from app.sizing.hardware.efficiency import DEFAULT_EFFICIENCY, Efficiency
from app.sizing.hardware.step_time import build_step_time_model
from tests.domain.models_for_tests import LLAMA_3_8B
from tests.domain.test_predict import HOPPER

X = 2e-3  # 2 ms more per decode-worker step
CHARGED = dataclasses.replace(DEFAULT_EFFICIENCY, decode_worker_step_overhead_s=X)


def test_only_a_decode_pools_workers_pay_it_under_every_engine() -> None:
    for engine, version in (("trtllm", "1.2.0"), ("sglang", "0.5.8"), ("vllm", "0.19.0"), ("vllm", "0.5.4")):
        assert host_adjusted(CHARGED, engine, version, decode_pool=True).decode_worker_step_overhead_s == X
        assert host_adjusted(CHARGED, engine, version).decode_worker_step_overhead_s == 0.0
        assert host_adjusted(CHARGED, engine, version, prefill_pool=True).decode_worker_step_overhead_s == 0.0
    assert host_adjusted(CHARGED, None).decode_worker_step_overhead_s == 0.0  # the GPU's own time: no engine loop
    # Zero (every profile before it): nothing changes, on either pool.
    assert host_adjusted(DEFAULT_EFFICIENCY, "vllm", "0.19.0", decode_pool=True) == host_adjusted(
        DEFAULT_EFFICIENCY, "vllm", "0.19.0")


def test_it_adds_to_every_step_and_is_never_hidden_under_the_gpus_time() -> None:
    """vLLM 0.19 overlaps its host loop with the GPU: its 0.3 ms per-step overhead is only the least a step lasts.
    The decode worker's 2 ms is added whatever the step: a decode step of 64 sequences, a prompt step, and a
    mixed one each take exactly 2 ms more; an empty step still costs nothing. Arrays alike: 2 ms each."""
    shape = {"tensor_parallel": 1, "weight_dtype": "bf16", "kv_dtype": "bf16"}
    aggregated = build_step_time_model(LLAMA_3_8B, HOPPER, efficiency=host_adjusted(CHARGED, "vllm", "0.19.0"),
                                       **shape)
    decode = build_step_time_model(LLAMA_3_8B, HOPPER, efficiency=host_adjusted(CHARGED, "vllm", "0.19.0",
                                                                               decode_pool=True), **shape)
    for step in ((64, 64 * 1000, 0, 0), (0, 0, 512, 512 * 256), (3, 3000, 512, 512 * 256)):
        assert decode(*step) - aggregated(*step) == pytest.approx(X, abs=1e-12)
    assert decode(0, 0, 0, 0) == aggregated(0, 0, 0, 0) == 0.0
    seqs, contexts, zeros = np.array([64.0, 1.0]), np.array([64000.0, 8000.0]), np.zeros(2)
    assert decode.step_time_s(seqs, contexts, zeros, zeros) - aggregated.step_time_s(seqs, contexts, zeros, zeros) == (
        pytest.approx([X, X], abs=1e-12))


@dataclass(frozen=True)
class DecodeTpot:
    """A disaggregated run's TPOT: `base_ms` per token at the entry's efficiency, plus the decode worker's step."""

    base_ms: float
    measured: float
    family: str = "hopper"
    source_id: str = "pd"
    compute_dtype: str = "fp8"
    vendor: str = "NVIDIA"
    pays_host_work: bool = False
    pays_overlapped_host_work: bool = False
    pays_prefill_overhead: bool = False
    pays_pcie_link: bool = False
    measures_steps: bool = False
    measures_decode_worker_step: bool = True
    measures_latency: bool = True

    def predict(self, efficiency: Efficiency) -> float:
        return self.base_ms + efficiency.decode_worker_step_overhead_s * 1e3


def test_the_fit_finds_the_step_the_tpots_are_missing() -> None:
    """Runs predicted at 5, 10 and 20 ms per token measure 6.5, 11.5 and 21.5 ms: 1.5 ms is missing from each.
    At 1.5 ms every error is 0 and the prior adds 0.02 x (1.5 / 5)^2 = 0.0018; moving by d ms changes the errors
    by about d x (1/6.5 + 1/11.5 + 1/21.5) / 3 = 0.096 d, the prior by 0.02 x 2 x 1.5 / 25 d = 0.0024 d: the
    errors' kink holds the minimum at 1.5 ms (to the golden-section search's bracket, 5 ms x 0.618^21)."""
    targets = [DecodeTpot(5.0, 6.5), DecodeTpot(10.0, 11.5), DecodeTpot(20.0, 21.5)]
    assert PRIOR_WEIGHT == 0.02 and (DECODE_WORKER_STEP.low, DECODE_WORKER_STEP.high) == (0.0, 5e-3)
    found = fit_decode_worker_step(targets, single_entry_profile("p", DEFAULT_EFFICIENCY))
    assert found == pytest.approx(1.5e-3, abs=5e-3 * 0.618 ** 21)
    # A run already slower than measured asks for nothing: the range's low end.
    assert fit_decode_worker_step([DecodeTpot(10.0, 9.0)], single_entry_profile("p", DEFAULT_EFFICIENCY)) == 0.0


def test_each_target_is_read_at_its_own_entry_with_the_step_taken_out() -> None:
    """The hopper entry already holds 4 ms (an older fit): the search starts from the TPOT without it, 10 ms, so
    10 + 1.5 = 11.5 measured gives 1.5 ms, not 1.5 - 4."""

    @dataclass(frozen=True)
    class AtEntry(DecodeTpot):
        def predict(self, efficiency: Efficiency) -> float:
            assert efficiency.source == "hopper entry"  # its own entry, not the global one
            return super().predict(efficiency)

    hopper = dataclasses.replace(DEFAULT_EFFICIENCY, decode_worker_step_overhead_s=4e-3, source="hopper entry")
    profile = CalibrationProfile("p", (ProfileEntry(ANY, ANY, DEFAULT_EFFICIENCY), ProfileEntry("hopper", ANY, hopper)))
    assert fit_decode_worker_step([AtEntry(10.0, 11.5)], profile) == pytest.approx(1.5e-3, abs=1e-6)


def test_a_fit_gives_every_entry_of_every_level_the_one_value() -> None:
    """Twelve hopper step rows (decode steps of 16 GB at 0.7 x 3.35 TB/s plus the per-step overhead, measured as
    such) give hopper an entry of its own; twelve disaggregated TPOTs (MIN_ROWS_PER_ENTRY, four of each) 1.5 ms
    above their prediction give 1.5 ms to the global, the hopper and the hopper/fp8 entries at every level; the
    step rows never read it (they are no decode worker's), and the TPOTs never move the search (`measures_steps`
    False). Eleven TPOTs are too few to measure it: every entry keeps the base's 0."""
    from tests.domain.test_fit import ToyTarget  # a decode step read at the efficiency's bandwidth

    step_rows = [ToyTarget(16e9, 16e9 / (0.7 * 3.35e12) + 0.3e-3, compute_dtype="fp8") for _ in range(12)]
    tpots = [DecodeTpot(5.0, 6.5), DecodeTpot(10.0, 11.5), DecodeTpot(20.0, 21.5)] * 4
    assert len(tpots) == MIN_ROWS_PER_ENTRY == 12

    def fitted(rows):
        return fit_profile(rows, single_entry_profile("builtin", DEFAULT_EFFICIENCY), name="p", fit_global=True,
                           describe=lambda family, dtype, rows: f"{family}/{dtype}: {len(rows)} rows",
                           max_evaluations=40)

    fit = fitted([*step_rows, *tpots])
    too_few = fitted([*step_rows, *tpots[:11]])
    assert {entry.efficiency.decode_worker_step_overhead_s for entry in too_few.profile.entries} == {0.0}
    for profile in fit.levels.values():
        values = {entry.key: entry.efficiency.decode_worker_step_overhead_s for entry in profile.entries}
        assert len(set(values.values())) == 1 and next(iter(values.values())) == pytest.approx(1.5e-3, abs=1e-6)
    assert {entry.key for entry in fit.profile.entries} >= {(ANY, ANY), ("hopper", ANY)}
    assert "decode_worker_step_overhead_s" in {bound.name for bound in GLOBAL_PARAMETERS}
    # Each entry's search read the twelve step rows, never the TPOTs.
    assert fit.profile.efficiency_for("hopper", ANY).source == "hopper/*: 12 rows"
    assert fit.levels["global"].efficiency_for(ANY, ANY).source == "*/*: 12 rows"
