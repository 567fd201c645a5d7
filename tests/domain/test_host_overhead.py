"""Host work per sequence per step in engines that do not overlap it with the GPU (vLLM's V0 engine), and
in those that do (a step then lasts at least that long): which engines and versions pay which, how the
step-time model charges each, how a measured run's version is read, and how a fit gives each one value per
profile. Every expected value is worked by hand below.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from app.calibration.profiles import entry_document, profile_from_entries
from app.calibration.rows import stated_version
from app.sizing.calibration.fit import (
    ANY,
    FITTED_PARAMETERS,
    HOST_PARAMETERS,
    CalibrationProfile,
    ProfileEntry,
    fit_efficiency,
    fit_profile,
    parameters_at_bounds,
    single_entry_profile,
    with_parameters,
)
from app.sizing.calibration.predict import PoolLayout, _disaggregated_run
from app.sizing.engines import ENGINES, NO_ENGINE, EngineConfig, HostRules, host_adjusted, host_rules
from app.sizing.engines.base import GraphSetup
from app.sizing.hardware.efficiency import DEFAULT_EFFICIENCY
from app.sizing.hardware.step_time import build_step_time_model
from app.sizing.layout import Layout
from app.sizing.serving import disaggregation
from app.sizing.serving.capacity import capacity
from tests.domain.models_for_tests import LLAMA_3_8B
from tests.domain.test_predict import HOPPER, predict

C = 1e-4  # 100 us of host work per sequence per step
V0 = dataclasses.replace(DEFAULT_EFFICIENCY, per_sequence_overhead_s=C)


# Which engines pay it ---------------------------------------------------------------------------------

def test_only_vllm_before_the_v1_engine_runs_host_work_between_gpu_steps() -> None:
    """vLLM's V1 engine is the default from 0.8.0; 0.7.3 and every 2024 install ran V0. The other engines
    overlap the next step's scheduling with the GPU at every version."""
    vllm = ENGINES["vllm"]
    assert [vllm.overlaps_host_work(v) for v in ("0.5.4", "0.6.3", "0.7.3", "2024")] == [False] * 4
    assert [vllm.overlaps_host_work(v) for v in ("0.8.0", "0.19.0", "2025")] == [True] * 3
    for name in ("sglang", "trtllm", "generic"):
        assert ENGINES[name].overlaps_host_work("0.1") and ENGINES[name].overlaps_host_work("2024")


def test_host_adjusted_keeps_the_overhead_only_where_the_engine_pays_it() -> None:
    assert host_adjusted(V0, "vllm", "0.5.4") is V0
    assert host_adjusted(V0, "vllm", "0.19.0").per_sequence_overhead_s == 0.0
    assert host_adjusted(V0, "trtllm", "0.17").per_sequence_overhead_s == 0.0
    assert host_adjusted(V0, None).per_sequence_overhead_s == 0.0  # no engine: the GPU's own time
    assert host_adjusted(DEFAULT_EFFICIENCY, "vllm", "0.5.4") is DEFAULT_EFFICIENCY  # nothing to take off or move
    # An engine that overlaps host work does its per-step overhead while the GPU runs; V0 and no engine add it.
    assert host_adjusted(DEFAULT_EFFICIENCY, "vllm", "0.19.0").step_overhead_overlapped
    assert host_adjusted(V0, "trtllm", "0.17").step_overhead_overlapped
    assert not host_adjusted(V0, "vllm", "0.5.4").step_overhead_overlapped
    assert not host_adjusted(V0, None).step_overhead_overlapped
    assert dataclasses.replace(host_adjusted(V0, None), source="") == dataclasses.replace(DEFAULT_EFFICIENCY,
                                                                                       source="")


# How a step is charged ----------------------------------------------------------------------------

def _models():
    shape = {"tensor_parallel": 1, "weight_dtype": "bf16", "kv_dtype": "bf16"}
    return (build_step_time_model(LLAMA_3_8B, HOPPER, efficiency=DEFAULT_EFFICIENCY, **shape),
            build_step_time_model(LLAMA_3_8B, HOPPER, efficiency=V0, **shape))


def test_every_sequence_a_step_samples_adds_its_host_work() -> None:
    """A step samples one token per decoding sequence and one per prompt it finishes:
    64 decodes: 64 x 100 us = 6.4 ms; a 512-token prompt alone: 1 x 100 us = 0.1 ms;
    3 decodes and a prompt: 4 x 100 us = 0.4 ms; a prompt of 2 sequences' chunks: 2 x 100 us = 0.2 ms."""
    plain, charged = _models()
    assert charged(64, 64 * 1000, 0, 0) - plain(64, 64 * 1000, 0, 0) == pytest.approx(6.4e-3, abs=1e-12)
    assert charged(0, 0, 512, 512 * 256) - plain(0, 0, 512, 512 * 256) == pytest.approx(0.1e-3, abs=1e-12)
    assert charged(3, 3000, 512, 512 * 256) - plain(3, 3000, 512, 512 * 256) == pytest.approx(0.4e-3, abs=1e-12)
    assert (charged.step_time_s(0, 0, 512, 512 * 256, 2) - plain.step_time_s(0, 0, 512, 512 * 256, 2)
            == pytest.approx(0.2e-3, abs=1e-12))


def test_every_path_of_the_step_time_model_charges_it_alike() -> None:
    """Arrays: 64 and 32 decodes, 6.4 and 3.2 ms more. A closed-form run of 100 decode steps of 64
    sequences: 100 x 6.4 ms = 0.64 s more."""
    plain, charged = _models()
    seqs, contexts, zeros = np.array([64.0, 32.0]), np.array([64000.0, 32000.0]), np.zeros(2)
    assert charged.step_time_s(seqs, contexts, zeros, zeros) - plain.step_time_s(seqs, contexts, zeros, zeros) == (
        pytest.approx([6.4e-3, 3.2e-3], abs=1e-12))
    ran_plain = plain.decode_run(64, 64000.0, 100, 1e9)
    ran_charged = charged.decode_run(64, 64000.0, 100, 1e9)
    assert ran_plain is not None and ran_charged is not None
    assert ran_charged[0] == ran_plain[0] == 100
    assert ran_charged[1] - ran_plain[1] == pytest.approx(0.64, abs=1e-9)


def test_a_measured_v0_run_pays_it_and_a_v1_run_does_not() -> None:
    """A batch-1 vLLM run of 128 output tokens on Llama-3-8B: each decode step samples one sequence, and V0
    adds its 0.1 ms of host work and the 0.3 ms per-step overhead to the GPU's time, where V1 does both while
    the GPU runs (its step of 16 GB of weights at 0.7 x 3.35 TB/s, 6.8 ms, is far longer than the 0.4 ms):
    V0's TPOT is 0.4 ms longer than V1's; the end-to-end latency (one prefill step of 128 tokens, itself
    longer than 0.4 ms on the GPU, and 127 decode steps) 128 x 0.4 = 51.2 ms longer. Without a stated
    version vLLM runs as today (V1)."""
    run = {"engine": "vllm", "isl": 128, "osl": 128}
    v0 = predict(V0, metric="tpot_ms", engine_version="0.5.4", **run)
    v1 = predict(V0, metric="tpot_ms", engine_version="0.19.0", **run)
    assert v0 - v1 == pytest.approx(0.1e-3 + 0.3e-3, rel=1e-6)
    assert predict(V0, metric="tpot_ms", **run) == v1
    e2e = {"scenario": "static_batch", "metric": "e2e_ms", **run}
    assert (predict(V0, engine_version="2024", **e2e) - predict(V0, engine_version="0.8.0", **e2e)
            == pytest.approx(128 * 0.4e-3, rel=1e-6))


# Reading a measured run's version ---------------------------------------------------------------------

def test_a_run_states_its_version_in_free_text() -> None:
    """The first major.minor[.patch] at the start, after the engine's name or a 'v'; a ROCm image's own
    version (rocm6.3.1) is not the engine's; with no number, the year of the install."""
    assert stated_version("0.5.3.post1 (vLLM/GH200/run-throughput-bench.sh)") == "0.5.3"
    assert stated_version("v0.6.1 built from source (Dockerfile.rocm)") == "0.6.1"
    assert stated_version("vLLM 0.5.4") == "0.5.4"
    assert stated_version("vLLM ROCm docker rocm/vllm:rocm6.3.1_instinct_vllm0.8.3_20250410") == "0.8.3"
    assert stated_version("TensorRT-LLM 0.17 (trtllm-bench)") == "0.17"
    assert stated_version("not pinned (pip install vllm, 2024; vLLM/H100|A100 README)") == "2024"
    assert stated_version("not recorded") is None
    assert stated_version("") is None


def test_a_dynamo_images_release_is_not_the_engines_version() -> None:
    """measured-calibration-2-sources.md: for runs through NVIDIA Dynamo images the version column is the
    image's release (0.8.1.post2, 0.5.1-rc0.pre3), not TensorRT-LLM's; where both are given, the engine's
    comes first."""
    assert stated_version("0.8.1.post1 (nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:0.8.1.post1)") is None
    assert stated_version("0.5.1-rc0.pre1 (nvcr.io/nvidia/ai-dynamo/sglang-runtime:0.5.1-rc0.pre1)") is None
    assert stated_version("1.2.0rc6.post1 (nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:0.8.0)") == "1.2.0"
    assert stated_version("0.5.6.post2 (nvcr.io/nvidia/ai-dynamo/sglang-runtime:0.8.0)") == "0.5.6"


# Fitting it ---------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Steps:
    """A run of `batch` sequences: `steps` decode steps of 5 ms on the GPU, plus the host's work where the
    engine pays it (the V0 rows)."""

    batch: int
    measured: float
    family: str
    source_id: str = "v0"
    compute_dtype: str = "bf16"
    vendor: str = ""
    steps: int = 100
    pays_host_work: bool = True
    pays_overlapped_host_work: bool = False
    pays_prefill_overhead: bool = False
    pays_pcie_link: bool = False
    measures_steps: bool = True
    measures_decode_worker_step: bool = False
    measures_latency: bool = True

    def predict(self, efficiency) -> float:
        host = efficiency.per_sequence_overhead_s if self.pays_host_work else 0.0
        return self.steps * (5e-3 + host * self.batch)


def test_each_family_fits_its_hosts_work_and_a_family_without_such_rows_keeps_the_global_value() -> None:
    """Hopper's hosts made with 100 us per sequence: batch 16 -> 100 x (5 + 1.6) ms = 0.66 s, 64 -> 100 x
    (5 + 6.4) ms = 1.14 s, 128 -> 100 x (5 + 12.8) ms = 1.78 s; ampere's with 200 us: 0.82, 1.78, 3.06 s;
    blackwell's rows run an engine that overlaps host work: 100 x 5 ms = 0.5 s whatever the batch. The
    global entry fits the rows together (a value from 100 to 200 us: under |log| errors an end of that
    span); hopper and ampere each fit their own value back (the prior toward the global value costs at
    most 0.02 x (0.1 / 1)^2 / 7 of the objective); no blackwell row pays host work, so its entry does not fit
    the parameter and keeps the global value exactly."""
    made = {"hopper": (0.66, 1.14, 1.78), "ampere": (0.82, 1.78, 3.06)}
    rows = [_Steps(batch, measured, family) for family, values in made.items()
            for batch, measured in zip((16, 64, 128), values, strict=True)] * 4  # 12 rows per family
    rows += [_Steps(batch, 0.5, "blackwell", pays_host_work=False) for batch in (16, 64, 128)] * 4
    fit = fit_profile(rows, single_entry_profile("b", DEFAULT_EFFICIENCY), name="x", fit_global=True,
                      max_evaluations=200, describe=lambda family, dtype, rows: "fit")
    overhead = {family: fit.profile.efficiency_for(family, "bf16").per_sequence_overhead_s
                for family in ("hopper", "ampere", "blackwell", "cdna3")}
    global_value = fit.profile.efficiency_for(ANY, ANY).per_sequence_overhead_s
    assert 97e-6 <= global_value <= 203e-6
    assert overhead["hopper"] == pytest.approx(100e-6, abs=3e-6)
    assert overhead["ampere"] == pytest.approx(200e-6, abs=3e-6)
    assert fit.profile.entry_for("blackwell", ANY).rows == 12  # fitted (its GPU parameters) ...
    assert overhead["blackwell"] == global_value  # ... its host value the global's
    assert overhead["cdna3"] == global_value  # no rows: the global entry itself


@dataclasses.dataclass(frozen=True)
class _StepOverheadRun(_Steps):
    """100 decode steps: of 5 ms on the GPU, to which a V0 engine (`pays_host_work`) adds its serial per-step
    overhead; or of a small model's 0.2 ms, which an overlapping engine's step outlasts by its per-step floor."""

    def predict(self, efficiency) -> float:
        if self.pays_host_work:
            return self.steps * (5e-3 + efficiency.serial_step_s)
        return self.steps * max(0.2e-3, efficiency.per_step_overhead_s)


def test_a_fit_finds_the_serial_loops_per_step_overhead_apart_from_the_overlapped_floor() -> None:
    """Made with 2 ms per step in V0's serial loop and a 4 ms floor in an overlapping engine (both inside the
    0-5 ms range): the V0 rows measure 100 x (5 + 2) ms = 0.7 s, the overlapping ones 100 x max(0.2, 4) ms =
    0.4 s. One parameter for both could not predict both (2 ms gives the floor rows 0.2 s; 4 ms gives V0 0.9 s);
    apart, the fit finds each (the priors, 0.3 ms, cost 0.02 x ((3.7 / 5)^2 + (1.7 / 5)^2) / 2 = 0.0066 of the
    objective there, less than the |log| error of moving either by 2%)."""
    per_step, serial = (next(bound for bound in (*FITTED_PARAMETERS, *HOST_PARAMETERS) if bound.name == name)
                        for name in ("per_step_overhead_s", "serial_step_overhead_s"))
    rows = [_StepOverheadRun(16, 0.7, "hopper"), _StepOverheadRun(16, 0.4, "hopper", pays_host_work=False)] * 6
    fitted, _ = fit_efficiency(rows, DEFAULT_EFFICIENCY, (per_step, serial), max_evaluations=200)
    assert fitted.serial_step_s == pytest.approx(2e-3, rel=0.02)
    assert fitted.per_step_overhead_s == pytest.approx(4e-3, rel=0.02)
    assert [row.predict(fitted) for row in rows[:2]] == pytest.approx([0.7, 0.4], rel=0.01)

def test_a_stored_entry_without_the_serial_per_step_overhead_charges_the_per_step_one() -> None:
    """A profile stored before the split has no serial_step_overhead_s: read back, V0 pays its per-step
    overhead (2 ms here), as the profile did when it was fitted; one stored with it (0 ms, or null) reads
    back as written."""
    efficiency = dataclasses.replace(DEFAULT_EFFICIENCY, per_step_overhead_s=2e-3)
    stored = entry_document(ProfileEntry(ANY, ANY, efficiency, 10))
    assert stored["serial_step_overhead_s"] is None
    older = {name: value for name, value in stored.items() if name != "serial_step_overhead_s"}
    for document, serial in ((older, 2e-3), (stored, 2e-3), ({**stored, "serial_step_overhead_s": 0.0}, 0.0)):
        read = profile_from_entries("p", [document]).efficiency_for(ANY, ANY)
        assert read.serial_step_s == serial
        assert host_adjusted(read, "vllm", "0.5.4").per_step_overhead_s == serial

def test_the_host_parameter_at_a_bound_is_reported_as_a_defect() -> None:
    """Range 0-1 ms: a fitted entry at 0 sits at its low bound (within 1% of the range: 10 us); 0.5 ms
    does not. The GPU parameters (and the MoE prompt-step overhead, 1 ms, the overlapped host work, 0.1 ms, the
    links at 0.84 of their rate, and the decode worker's 2 ms per step) sit inside their ranges here."""
    assert [bound.name for bound in HOST_PARAMETERS] == ["per_sequence_overhead_s", "serial_step_overhead_s",
                                                         "overlapped_host_per_sequence_s", "prefill_moe_layer_overhead_s",
                                                         "decode_worker_step_overhead_s"]
    assert "per_sequence_overhead_s" not in {bound.name for bound in FITTED_PARAMETERS}
    inside = with_parameters(DEFAULT_EFFICIENCY, {"compute_scale": 0.8, "small_m_flatness": 0.5,
                                                  "prefill_moe_layer_overhead_s": 1e-3, "pcie_link_fraction": 0.84,
                                                  "overlapped_host_per_sequence_s": 0.1e-3,
                                                  "decode_worker_step_overhead_s": 2e-3})
    some = dataclasses.replace(inside, per_sequence_overhead_s=0.5e-3)
    profile = CalibrationProfile("p", (ProfileEntry(ANY, ANY, some, 50), ProfileEntry("hopper", ANY, inside, 50)))
    assert parameters_at_bounds(profile) == [("hopper", ANY, "per_sequence_overhead_s", 0.0, "low")]


def test_capacity_charges_it_for_a_v0_engine_version_only() -> None:
    """Llama-3-8B on one H100 under vLLM: the decode step at the operating point's batch B of sequences
    costs B x 100 us more at 0.6.3 (V0) than without host work, and nothing more at 0.19.0 (V1). The two
    versions size the KV cache alike here (both before 0.20), so B is the same."""
    def point(version: str, efficiency):
        return capacity(LLAMA_3_8B, HOPPER, tensor_parallel=1, pipeline_parallel=1, weight_dtype="bf16",
                        kv_dtype="bf16", compute_dtype="bf16", input_tokens=1000, output_tokens=500,
                        engine=EngineConfig(engine="vllm", engine_version=version),
                        efficiency=efficiency).operating_point

    v0, v0_plain = point("0.6.3", V0), point("0.6.3", DEFAULT_EFFICIENCY)
    assert v0.batch_size == v0_plain.batch_size
    assert v0.expected_decode_step_s - v0_plain.expected_decode_step_s == pytest.approx(v0.batch_size * C, rel=1e-9)
    assert point("0.19.0", V0).expected_decode_step_s == point("0.19.0", DEFAULT_EFFICIENCY).expected_decode_step_s



# Host work an engine overlaps: the least a step lasts ------------------------------------------------

F = 1e-4  # 100 us of overlapped host work per sequence per step
# An overlapping engine's efficiency (as `host_adjusted` marks it) with no per-step overhead, so that the floor is
# the per-sequence work alone.
OVERLAPPED = dataclasses.replace(DEFAULT_EFFICIENCY, overlapped_host_per_sequence_s=F, per_step_overhead_s=0.0,
                                 step_overhead_overlapped=True)


def test_an_engine_that_overlaps_host_work_keeps_it_as_a_floor_and_v0_as_an_addition() -> None:
    """TensorRT-LLM, SGLang and vLLM from 0.8 (V1) keep the overlapped value; vLLM V0 pays its host work on top
    of the step instead (`per_sequence_overhead_s`), so the floor is dropped there; without an engine (the
    GPU's own time) neither."""
    both = dataclasses.replace(OVERLAPPED, per_sequence_overhead_s=C)
    for engine, version in (("trtllm", "1.0"), ("sglang", "0.5.6"), ("vllm", "0.19.0")):
        adjusted = host_adjusted(both, engine, version)
        assert (adjusted.overlapped_host_per_sequence_s, adjusted.per_sequence_overhead_s) == (F, 0.0)
    v0 = host_adjusted(both, "vllm", "0.5.4")
    assert (v0.overlapped_host_per_sequence_s, v0.per_sequence_overhead_s) == (0.0, C)
    gpu_only = host_adjusted(both, None)
    assert (gpu_only.overlapped_host_per_sequence_s, gpu_only.per_sequence_overhead_s) == (0.0, 0.0)


def _floored_models():
    shape = {"tensor_parallel": 1, "weight_dtype": "bf16", "kv_dtype": "bf16"}
    plain = dataclasses.replace(DEFAULT_EFFICIENCY, per_step_overhead_s=0.0)
    return (build_step_time_model(LLAMA_3_8B, HOPPER, efficiency=plain, **shape),
            build_step_time_model(LLAMA_3_8B, HOPPER, efficiency=OVERLAPPED, **shape))


def test_a_step_lasts_at_least_the_host_work_of_the_sequences_it_samples() -> None:
    """Llama-3-8B bf16 on one H100 (989 TFLOP/s, 3.35 TB/s at the default 0.70: 2.345 TB/s).
    16 decodes at 1,000 tokens each: the weights alone (16.06 GB) take 16.06 / 2.345 = 6.85 ms on the GPU,
    far above the host's 16 x 100 us = 1.6 ms: the GPU's time, unchanged.
    2,048 decodes at 10 tokens each: 2 x 8.03e9 x 2,048 = 32.9 TFLOP at no more than the curve's 93% of
    989 TFLOP/s is about 36 ms, the weights and 20,480 x 128 KiB = 2.7 GB of KV read (18.8 GB / 2.345 TB/s)
    8 ms: under 0.1 s, while the host needs 2,048 x 100 us = 204.8 ms: the step lasts 204.8 ms.
    A 512-token prompt alone samples one sequence: 0.1 ms of host work under milliseconds of GPU time."""
    plain, floored = _floored_models()
    assert floored(16, 16 * 1000, 0, 0) == plain(16, 16 * 1000, 0, 0)
    assert plain(2048, 2048 * 10, 0, 0) < 0.1
    assert floored(2048, 2048 * 10, 0, 0) == pytest.approx(0.2048, rel=1e-12)
    assert floored(0, 0, 512, 512 * 256) == plain(0, 0, 512, 512 * 256)
    # The array path agrees with the scalar one.
    seqs, contexts, zeros = np.array([16.0, 2048.0]), np.array([16000.0, 20480.0]), np.zeros(2)
    assert floored.step_time_s(seqs, contexts, zeros, zeros) == pytest.approx(
        [plain(16, 16000, 0, 0), 0.2048], rel=1e-12)


def test_a_decode_run_sums_the_floor_and_is_stepped_where_the_gpu_overtakes_it() -> None:
    """100 steps of 2,048 decodes from 10 to 109 tokens each: the last step reads 2,048 x 109 x 128 KiB = 29.3
    GB of KV, (16.06 + 29.3) GB / 2.345 TB/s = 19 ms with the weights, still under the 204.8 ms floor, so
    every step lasts 204.8 ms: 100 x 204.8 ms = 20.48 s, summed in closed form.
    256 decodes: a floor of 25.6 ms; the GPU's step, 6.85 ms of weights plus 256 x c x 128 KiB of KV at 2.345
    TB/s (plus 32 layers x 3 us of overhead), crosses it near c = (25.6 - 6.85 - 0.1) ms x 2.345 TB/s / (256 x
    128 KiB) = 1,300
    tokens: a run from 500 to 2,499 tokens has that kink inside, so it is not summed in closed form, and
    timed step by step each step is the larger of the GPU's time and 25.6 ms."""
    plain, floored = _floored_models()
    ran = floored.decode_run(2048, 2048 * 10.0, 100, 1e9)
    assert ran is not None
    assert ran[0] == 100 and ran[1] == pytest.approx(20.48, rel=1e-12) and ran[2] == pytest.approx(0.2048, rel=1e-12)
    assert floored.decode_run(256, 256 * 500.0, 2000, 1e9) is None
    contexts = 256.0 * np.arange(500, 2500)
    gpu = plain.step_time_s(np.full(2000, 256.0), contexts, np.zeros(2000), np.zeros(2000))
    assert gpu[0] < 0.0256 < gpu[-1]  # the kink is inside the run
    assert floored.step_time_s(np.full(2000, 256.0), contexts, np.zeros(2000), np.zeros(2000)) == pytest.approx(
        np.maximum(gpu, 0.0256), rel=1e-12)


STEP_10MS = dataclasses.replace(DEFAULT_EFFICIENCY, per_step_overhead_s=10e-3, per_layer_overhead_s=0.0)


def test_an_overlapping_engines_per_step_overhead_is_the_least_a_step_lasts() -> None:
    """Llama-3-8B bf16 on one H100 at 10 ms per step (no per-layer overhead). vLLM V1 does that work on the host
    while the GPU runs the step; V0 adds it.
    16 decodes at 1,000 tokens: 16.06 GB of weights / 2.345 TB/s = 6.85 ms, plus 16 x 1,001 x 128 KiB = 2.1 GB
    of KV, 0.9 ms: under 10 ms, so V1's step lasts 10 ms, 10 + 16 x 0.1 = 11.6 ms with 100 us per sequence
    overlapped too, and V0's the GPU's time + 10 ms. 2,048 decodes at 10 tokens (36 ms of compute: above) hide
    it: V1's step is the GPU's, as with no overhead at all. 100 such steps of 16 decodes in closed form: 1 s."""
    shape = {"tensor_parallel": 1, "weight_dtype": "bf16", "kv_dtype": "bf16"}

    def model(efficiency):  # type: ignore[no-untyped-def]
        return build_step_time_model(LLAMA_3_8B, HOPPER, efficiency=efficiency, **shape)

    v1, v0 = model(host_adjusted(STEP_10MS, "vllm", "0.19.0")), model(host_adjusted(STEP_10MS, "vllm", "0.5.4"))
    without = model(dataclasses.replace(STEP_10MS, per_step_overhead_s=0.0))
    small, large = (16, 16 * 1000.0, 0, 0), (2048, 2048 * 10.0, 0, 0)
    assert v1(*small) == pytest.approx(10e-3, rel=1e-12)
    assert v0(*small) == pytest.approx(without(*small) + 10e-3, rel=1e-12)
    assert v1(*large) == pytest.approx(without(*large), rel=1e-12)
    per_sequence = dataclasses.replace(STEP_10MS, overlapped_host_per_sequence_s=C)
    assert model(host_adjusted(per_sequence, "vllm", "0.19.0"))(*small) == pytest.approx(11.6e-3, rel=1e-12)
    arrays = [np.array([float(small[i]), float(large[i])]) for i in range(4)]
    np.testing.assert_allclose(v1.step_time_s(*arrays), [10e-3, without(*large)], rtol=1e-12)
    ran = v1.decode_run(16, 16 * 1000.0, 100, 1e9)
    assert ran is not None and ran[0] == 100 and ran[1] == pytest.approx(1.0, rel=1e-12)



def test_a_serial_engine_pays_its_own_per_step_overhead_and_an_overlapping_one_keeps_the_floor() -> None:
    """The per-step overhead of V0's serial host loop is a parameter of its own: with 10 ms per step and 2 ms
    for V0's loop, V0's step of 16 decodes at 1,000 tokens is the GPU's 6.85 + 0.9 ms plus 2 ms (not 10), while
    V1's still lasts the 10 ms floor and a roofline (no engine) still adds 10 ms. Unset (None), V0 pays the
    per-step overhead, as before the split: the profiles fitted before it predict what they did."""
    shape = {"tensor_parallel": 1, "weight_dtype": "bf16", "kv_dtype": "bf16"}

    def model(efficiency):  # type: ignore[no-untyped-def]
        return build_step_time_model(LLAMA_3_8B, HOPPER, efficiency=efficiency, **shape)

    split = dataclasses.replace(STEP_10MS, serial_step_overhead_s=2e-3)
    small = (16, 16 * 1000.0, 0, 0)
    gpu = model(dataclasses.replace(STEP_10MS, per_step_overhead_s=0.0))(*small)
    assert 7e-3 < gpu < 8e-3  # 6.85 ms of weights + 0.9 ms of KV
    assert host_adjusted(split, "vllm", "0.5.4").per_step_overhead_s == 2e-3
    assert model(host_adjusted(split, "vllm", "0.5.4"))(*small) == pytest.approx(gpu + 2e-3, rel=1e-12)
    assert model(host_adjusted(split, "vllm", "0.19.0"))(*small) == pytest.approx(10e-3, rel=1e-12)
    assert model(host_adjusted(split, None))(*small) == pytest.approx(gpu + 10e-3, rel=1e-12)
    assert STEP_10MS.serial_step_overhead_s is None and STEP_10MS.serial_step_s == 10e-3
    assert host_adjusted(STEP_10MS, "vllm", "0.5.4") is STEP_10MS  # nothing to move: V0 pays the 10 ms
    with pytest.raises(ValueError, match="serial_step_s must be >= 0"):
        dataclasses.replace(STEP_10MS, serial_step_overhead_s=-1e-3)

@dataclasses.dataclass(frozen=True)
class _OverlappedSteps(_Steps):
    """The same run under an engine that overlaps host work: each step lasts max(5 ms, host work)."""

    pays_host_work: bool = False

    def predict(self, efficiency) -> float:
        return self.steps * max(5e-3, efficiency.overlapped_host_per_sequence_s * self.batch)


def test_a_fit_finds_the_overlapped_host_work_where_it_binds() -> None:
    """Hosts made with 100 us per sequence: batch 16 -> 100 x max(5, 1.6) ms = 0.5 s, 128 -> 100 x 12.8 ms =
    1.28 s, 256 -> 100 x 25.6 ms = 2.56 s. Only the two large batches measure it, and they give 100 us back
    (the prior toward 0 costs at most 0.02 x (0.1 / 1)^2 / 8 of the objective)."""
    rows = [_OverlappedSteps(batch, measured, "hopper", pays_overlapped_host_work=True) for batch, measured in ((16, 0.5), (128, 1.28), (256, 2.56))]
    fit = fit_profile(rows * 4, single_entry_profile("b", DEFAULT_EFFICIENCY), name="x", fit_global=True,
                      max_evaluations=200, describe=lambda family, dtype, rows: "fit")
    assert fit.profile.efficiency_for("hopper", "bf16").overlapped_host_per_sequence_s == pytest.approx(100e-6, abs=3e-6)


# Pipeline stages: TensorRT-LLM's PyTorch backend stops hiding host work ----------------------------

def test_tensorrt_llms_pytorch_backend_does_not_hide_host_work_with_pipeline_stages() -> None:
    """From 1.0 (the PyTorch backend; a year from 2025) TensorRT-LLM runs a loop of its own for pipeline stages,
    without the overlap scheduler: the per-step overhead and the overlapped per-sequence work are added to each
    micro-batch's step, and vLLM V0's per-sequence work is still not charged (it is another engine's loop). The
    TensorRT engines before 1.0, vLLM, SGLang and an unknown engine keep hiding it; one stage hides it as before."""
    trtllm = ENGINES["trtllm"]
    assert [trtllm.overlaps_host_work_in_pipeline(v) for v in ("1.0", "1.2.0", "2025")] == [False] * 3
    assert [trtllm.overlaps_host_work_in_pipeline(v) for v in ("0.17", "0.11.0", "2024")] == [True] * 3
    for name in ("vllm", "sglang", "generic"):
        assert ENGINES[name].overlaps_host_work_in_pipeline("0.19.0")
    both = dataclasses.replace(STEP_10MS, overlapped_host_per_sequence_s=F, per_sequence_overhead_s=C)
    staged = host_adjusted(both, "trtllm", "1.0", pipeline_parallel=4)
    assert not staged.step_overhead_overlapped
    assert (staged.overlapped_host_per_sequence_s, staged.per_sequence_overhead_s) == (F, 0.0)
    assert host_adjusted(both, "trtllm", "1.0", pipeline_parallel=1).step_overhead_overlapped
    assert host_adjusted(both, "trtllm", "0.17", pipeline_parallel=4).step_overhead_overlapped
    assert host_adjusted(both, "vllm", "0.19.0", pipeline_parallel=4).step_overhead_overlapped
    assert not host_adjusted(both, "vllm", "0.5.4", pipeline_parallel=4).step_overhead_overlapped  # V0: added anyway


def test_a_pipeline_period_adds_the_host_work_of_each_micro_batch_where_it_is_not_hidden() -> None:
    """Llama-3-8B bf16 on four H100s as PP4 with all four micro-batches in flight, 16 decodes of 1,000 tokens in
    each, 10 ms per step and 100 us per sequence. Each GPU runs the step of every micro-batch in turn, so a period
    holds four steps' host work: 4 x (10 ms + 16 x 0.1 ms) = 46.4 ms. The GPU's period is four times the largest
    stage (8 of the 32 layers): about the whole model's 7.8 ms of weight and KV reads (above) plus the hand-offs,
    well under 46.4 ms. Hidden (TensorRT-LLM 0.17), the period lasts the 46.4 ms of host work; not hidden (1.0),
    the GPU's period plus 46.4 ms."""
    shape = {"tensor_parallel": 1, "pipeline_parallel": 4, "weight_dtype": "bf16", "kv_dtype": "bf16",
             "pipeline_period": True}
    both = dataclasses.replace(STEP_10MS, overlapped_host_per_sequence_s=F)

    def model(efficiency):  # type: ignore[no-untyped-def]
        return build_step_time_model(LLAMA_3_8B, HOPPER, efficiency=efficiency, **shape)

    step = (16, 16 * 1000.0, 0, 0)
    gpu = model(dataclasses.replace(STEP_10MS, per_step_overhead_s=0.0))(*step)
    assert gpu < 20e-3
    assert model(host_adjusted(both, "trtllm", "0.17", pipeline_parallel=4))(*step) == pytest.approx(46.4e-3, rel=1e-12)
    added = model(host_adjusted(both, "trtllm", "1.0", pipeline_parallel=4))
    assert added(*step) == pytest.approx(gpu + 46.4e-3, rel=1e-12)
    arrays = [np.array([float(value)]) for value in step]
    assert float(added.step_time_s(*arrays)[0]) == pytest.approx(gpu + 46.4e-3, rel=1e-12)


def test_a_measured_pipeline_run_pays_it_per_layout() -> None:
    """A batch-1 TensorRT-LLM run of Llama-3-8B on two H100s as PP2, 10 ms per step: one micro-batch in flight,
    so each token takes one trip through both stages (about 4.5 ms of weight reads, the hand-off, the default
    per-layer overhead), under 10 ms. At 1.0 the trip pays the 10 ms on top; at 0.17, and at 1.0 on one GPU,
    the token takes the 10 ms the host needs."""
    run = {"engine": "trtllm", "isl": 128, "osl": 128}
    staged = {"num_gpus": 2, "tp": 1, "pp": 2, **run}
    gpu = predict(dataclasses.replace(STEP_10MS, per_step_overhead_s=0.0), engine_version="1.0", **staged)
    assert gpu < 10e-3
    assert predict(STEP_10MS, engine_version="1.0", **staged) == pytest.approx(gpu + 10e-3, rel=1e-9)
    assert predict(STEP_10MS, engine_version="0.17", **staged) == pytest.approx(10e-3, rel=1e-9)
    assert predict(STEP_10MS, engine_version="1.0", **run) == pytest.approx(10e-3, rel=1e-9)
    # The serial per-step overhead is V0's loop's: TensorRT-LLM's exposed loop still adds the per-step one.
    split = dataclasses.replace(STEP_10MS, serial_step_overhead_s=2e-3)
    assert predict(split, engine_version="1.0", **staged) == pytest.approx(gpu + 10e-3, rel=1e-9)


# Disaggregated prefill workers: TensorRT-LLM's context servers run without the overlap scheduler -------------

def test_tensorrt_llms_context_servers_do_not_hide_host_work() -> None:
    """TensorRT-LLM's disaggregation recipe starts its context servers with `disable_overlap_scheduler: True`
    (ENGINES.md section 3): a prefill worker's steps pay the per-step overhead and the overlapped host work on
    top of the GPU's time, at every version; its generation servers, an aggregated replica, and vLLM's, SGLang's
    and an unknown engine's prefill workers keep hiding them."""
    trtllm = ENGINES["trtllm"]
    assert [trtllm.overlaps_host_work_in_prefill_pool(v) for v in ("0.17", "1.0", "1.2.0", "2025")] == [False] * 4
    for name in ("vllm", "sglang", "generic"):
        assert ENGINES[name].overlaps_host_work_in_prefill_pool("0.19.0")
    both = dataclasses.replace(STEP_10MS, overlapped_host_per_sequence_s=F, per_sequence_overhead_s=C)
    prefill = host_adjusted(both, "trtllm", "1.0", prefill_pool=True)
    assert not prefill.step_overhead_overlapped
    assert (prefill.overlapped_host_per_sequence_s, prefill.per_sequence_overhead_s) == (F, 0.0)
    assert host_adjusted(both, "trtllm", "1.0").step_overhead_overlapped
    assert host_adjusted(both, "sglang", "0.5.6", prefill_pool=True).step_overhead_overlapped
    assert host_adjusted(both, "vllm", "0.19.0", prefill_pool=True).step_overhead_overlapped


def test_an_engines_host_rules_are_its_own_answers_at_the_version() -> None:
    """`host_rules` reads the engine's answers at the version, nothing else: vLLM 0.5.4 (V0) adds host work
    to each step and hides nothing; vLLM 0.19.0 overlaps it, also under pipeline stages and on prefill
    workers; TensorRT-LLM 1.0 overlaps it but not on its context servers. No engine pays none of it."""
    for engine, version in (("vllm", "0.5.4"), ("vllm", "0.19.0"), ("trtllm", "1.0"), ("sglang", "0.5.6"),
                            ("generic", "")):
        rules = ENGINES[engine]
        overlaps = rules.overlaps_host_work(version)
        assert host_rules(engine, version) == HostRules(
            host_work=not overlaps, overlapped_host=overlaps, prefill_overhead=not rules.graphs_prefill_steps(version),
            hidden_in_pipeline=rules.overlaps_host_work_in_pipeline(version),
            hidden_in_prefill_pool=rules.overlaps_host_work_in_prefill_pool(version))
    assert host_rules("vllm", "0.5.4").host_work and not host_rules("vllm", "0.5.4").overlapped_host
    assert host_rules("vllm", "0.19.0").overlapped_host and host_rules("vllm", "0.19.0").hidden_in_prefill_pool
    assert host_rules("trtllm", "1.0").overlapped_host and not host_rules("trtllm", "1.0").hidden_in_prefill_pool
    assert host_rules(None) == NO_ENGINE == HostRules(False, False, False, False, False)


def test_sglang_runs_prompt_steps_outside_graphs_where_it_turns_its_piecewise_graphs_off() -> None:
    """SGLang 0.5.10 replays piecewise CUDA graphs for prompt steps on an NVIDIA GPU with plain TP (ENGINES.md
    1.2), and turns them off under attention DP, pipeline stages, speculative decoding, PD disaggregation and on
    AMD's HIP (`_handle_piecewise_cuda_graph`): there a prompt step pays its overhead per MoE layer. Before 0.5.10
    no setup graphs prompt steps. A maker not stated (an inline spec) is not taken for AMD."""
    graphed = GraphSetup()
    assert not host_rules("sglang", "0.5.10", graphed).prefill_overhead
    assert not host_rules("sglang", "0.5.10", GraphSetup(vendor="")).prefill_overhead
    for setup in (GraphSetup(data_parallel=8), GraphSetup(pipeline_parallel=2), GraphSetup(speculative="ngram"),
                  GraphSetup(vendor="AMD"), GraphSetup(disaggregated=True)):
        assert host_rules("sglang", "0.5.10", setup).prefill_overhead, setup
    assert host_rules("sglang", "0.5.9", graphed).prefill_overhead
    efficiency = dataclasses.replace(DEFAULT_EFFICIENCY, prefill_moe_layer_overhead_s=1e-3)
    assert host_adjusted(efficiency, "sglang", "0.5.10").prefill_moe_layer_overhead_s == 0.0
    assert host_adjusted(efficiency, "sglang", "0.5.10", data_parallel=8).prefill_moe_layer_overhead_s == 1e-3
    assert host_adjusted(efficiency, "sglang", "0.5.10", vendor="AMD").prefill_moe_layer_overhead_s == 1e-3


def test_only_the_engine_rules_decide_whether_host_work_is_hidden() -> None:
    """One place for the rule: no module but app/sizing/engines/__init__.py sets
    `step_overhead_overlapped` on an efficiency (the validator's prefill pools once spelled it a second
    time, with `replace(efficiency, step_overhead_overlapped=False)`)."""
    app = Path(__file__).resolve().parents[2] / "app"
    setters = sorted(str(path.relative_to(app)) for path in app.rglob("*.py")
                     if "step_overhead_overlapped=" in path.read_text(encoding="utf-8"))
    assert setters == ["sizing/engines/__init__.py"]


def test_a_context_servers_prefill_step_adds_the_step_overhead() -> None:
    """Llama-3-8B bf16 on one H100, a prefill step of one 2,048-token prompt: 30.0 ms of tensor-core work at
    the roof (test_predict.py's batch-1 TTFT), more at the default efficiency, so above the 10 ms per step.
    Hidden, the step lasts the GPU's time (the overhead is the least it lasts); on a TensorRT-LLM context
    server, the GPU's time plus 10 ms."""
    def model(efficiency):  # type: ignore[no-untyped-def]
        return build_step_time_model(LLAMA_3_8B, HOPPER, tensor_parallel=1, weight_dtype="bf16", kv_dtype="bf16",
                                     efficiency=efficiency)

    step = (0, 0.0, 2048, 0.0)  # no decodes, one 2,048-token prompt from position 0
    gpu = model(dataclasses.replace(STEP_10MS, per_step_overhead_s=0.0))(*step)
    assert gpu > 30.0e-3
    assert model(host_adjusted(STEP_10MS, "trtllm", "1.0"))(*step) == pytest.approx(gpu, rel=1e-12)
    assert model(host_adjusted(STEP_10MS, "trtllm", "1.0", prefill_pool=True))(*step) == pytest.approx(
        gpu + 10e-3, rel=1e-12)


@pytest.fixture(autouse=True)
def _forget_patched_host_rules(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """`host_rules` caches each engine's answers: emptied after a test (before `monkeypatch` undoes its
    patches, as this fixture depends on it) so no patched answer outlives its test."""
    yield
    host_rules.cache_clear()


def _context_servers_hide_host_work(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(type(ENGINES["trtllm"]), "overlaps_host_work_in_prefill_pool", lambda self, version: True)
    host_rules.cache_clear()  # read the patched answer, not the cached one


def test_a_measured_disaggregated_run_charges_the_context_servers_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """One user through one prefill and one decode worker (Llama-3-8B, one H100 each), 2,048 in / 4 out,
    10 ms per step: each request's prompt is one prefill step and waits for nothing else, so its TTFT on
    TensorRT-LLM, whose context server adds the 10 ms to that step, is 10 ms longer than with the overhead
    hidden, every other part (transfer, first decode step) alike."""
    run = {"scenario": "closed_loop", "metric": "ttft_ms", "engine": "trtllm", "engine_version": "1.0",
           "num_gpus": 2, "tp": None, "batch": None, "concurrency": 1, "num_requests": 3, "isl": 2048, "osl": 4,
           "disaggregated": True, "prefill": PoolLayout(workers=1, tp=1), "decode": PoolLayout(workers=1, tp=1)}
    charged = predict(STEP_10MS, **run)
    _disaggregated_run.cache_clear()
    _context_servers_hide_host_work(monkeypatch)
    hidden = predict(STEP_10MS, **run)
    _disaggregated_run.cache_clear()
    assert charged == pytest.approx(hidden + 10e-3, rel=1e-9)


def test_a_prefill_pools_operating_point_charges_its_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """/v1/capacity's prefill pool (`disaggregation.pool_capacity`): 2,048-token prompts of Llama-3-8B on a
    TensorRT-LLM context server go 4 to a step (8,192 // 2,048 under its max_num_tokens), so one prompt's expected
    prefill, its quarter of the step, is 10 / 4 = 2.5 ms longer than with the overhead hidden under the step; the
    decode pool's steps are unchanged."""
    def pool(role: str) -> disaggregation.PoolCapacity:
        return disaggregation.pool_capacity(
            role, LLAMA_3_8B, HOPPER, workers=1, layout=Layout(1), input_tokens=2048, output_tokens=128,
            weight_dtype="bf16", kv_dtype="bf16", compute_dtype="bf16", engine=EngineConfig(engine="trtllm"),
            efficiency=STEP_10MS)

    charged, decode = pool("prefill").worker.operating_point, pool("decode").worker.operating_point
    _context_servers_hide_host_work(monkeypatch)
    hidden = pool("prefill").worker.operating_point
    assert charged is not None and hidden is not None and decode is not None
    assert charged.expected_prefill_s == pytest.approx(hidden.expected_prefill_s + 10e-3 / 4, rel=1e-9)
    assert pool("decode").worker.operating_point == decode
