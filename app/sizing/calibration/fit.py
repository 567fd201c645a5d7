"""Calibration profiles and fitting them to published measurements (SIZING.md section 5).

A calibration profile assigns an `Efficiency` to each (GPU family, compute precision) it has evidence
for, with a global entry (`*`, `*`) as the fallback for everything else. Lookup goes from the most to
the least specific entry: (family, precision), then (family, `*`), then the GPU maker's entry
(`vendor:nvidia`, `*`), then (`*`, precision), then (`*`, `*`).

Fitting adjusts six physically meaningful parameters per entry, each inside sane bounds
(`FITTED_PARAMETERS`): the achieved fraction of HBM bandwidth, the scale of the tokens-per-step compute
curve (the published GEMM sweep) and how flat that curve is below its first point, the per-step overhead
(added to the step; in an engine that overlaps host work with the GPU, the least a step lasts, with the
per-sequence host work), the per-layer overhead, and the all-reduce latency; one paid only by layouts that
communicate over PCIe (`LINK_PARAMETERS`): the achieved fraction of the link's rate in their collectives;
and three paid only by some engines (`HOST_PARAMETERS`): the host work per sequence per step of engines that do not overlap it with the
GPU (added to the step), the same of engines that do (the least a step lasts), and the cost per MoE layer of
a step with prompt tokens in engines that run such steps outside CUDA graphs; and the extra cost of each step
of a disaggregated deployment's decode worker, one value for every entry (`fit_decode_worker_step`). A parameter
paid only by some rows is fitted only where rows pay it; a family's is pulled toward the
global entry's, which a family without such rows keeps. Priors: the cited values in
the global entry; in a family's or a precision's entry, the values of the level above (partial pooling:
what its rows do not pin down stays where the wider data put it). The objective is the mean absolute log error over the measurements of the entry,
|ln(predicted / measured)|: symmetric in over- and under-prediction, scale-free (tokens/s and
milliseconds weigh alike), and robust to a few outliers compared with squared errors. It is minimized by
a bounded Nelder–Mead search (below); nothing is ever tuned per measurement.

`FitTarget` is what a fit needs of a measurement: the measured value, where it came from, its group,
and a function from an `Efficiency` to the predicted value. The validator's prepared predictions
(`predict.py`) are such targets, so a fit optimizes exactly what validation reports.

Longer than 600 lines because the parameter table (each bound with its cited source and the rows that pay it),
the profile types and the level-by-level fit that reads both (the search, the prompt-step refit, the decode
worker's step) share their definitions: split apart, each part would import the others' internals.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from app.sizing.calibration.search import golden_section, nelder_mead
from app.sizing.hardware.efficiency import Efficiency

ANY = "*"  # matches every GPU family or every compute precision


@dataclass(frozen=True, slots=True)
class ParameterBounds:
    """A fitted parameter's physical range and prior (the cited value a fit is pulled toward)."""

    name: str  # an `Efficiency` field
    low: float
    high: float
    prior: float
    source: str  # where the range and the prior come from
    # The FitTarget flag that says a row pays this parameter (None: every row); an entry with fewer than
    # `least_payers` rows that pay it keeps it as it starts, unfitted.
    paid_by: str | None = None
    least_payers: int = 1

    def __post_init__(self) -> None:
        if not self.low <= self.prior <= self.high or not self.low < self.high:
            raise ValueError(f"{self.name}: need low <= prior <= high and low < high")

    def at_bound(self, value: float) -> str | None:
        """'low' or 'high' when the value sits within 1% of the range of a bound (a defect of the model:
        the parameter absorbs physics the model lacks), else None."""
        margin = 0.01 * (self.high - self.low)
        return "low" if value <= self.low + margin else "high" if value >= self.high - margin else None


# Physical ranges and priors, each from a cited source (the `source` of each bound). Bandwidth: decode
# weight reads reach 52-80% of HBM bandwidth (SIZING.md section 5), the prior 0.70 is the builtin value
# bracketed by two batch-1 A100 measurements (efficiency.py); the range adds 10 points of margin on each
# side. Compute: the published GEMM sweep (scale 1) tops out at 0.93 of peak; peers' fixed "MFU 0.30
# decode" (SIZING.md section 5) is the floor. Overheads: "order 0.1-1 ms per step, plus a few us per
# layer" (section 5). All-reduce alpha: NCCL's own tuner puts a one-node ring LL all-reduce at 7.8 us
# (2 GPUs) to 15.0 us (8), NVLS at 25 us flat (ENGINES.md, NVIDIA/nccl src/graph/tuning.cc); vLLM's
# custom all-reduce replaces NCCL below it for small messages; 2-30 us spans both. The fitted alpha is the
# two-GPU one: a ring over more GPUs takes NCCL's ratio longer (`comm.ring_latency_scale`), so rows at TP2,
# TP4 and TP8 measure one parameter instead of each wanting its own. A flat alpha (one-shot custom all-reduce
# kernels wait on every peer at once, not along a ring) fitted worse with each of H100, H200, B200 and GB200
# held out (2026-12-07): the DP+EP TPOT median error rose from 10.4% to 13.4%, H100's TPOT from 8.5% to 10.3%.
# Small matmuls: the published GEMM sweep starts at M = 64 rows (33% of peak) and below its first point
# the curve is proportional to M, i.e. a matmul of 1 row costs as long as one of 64. That sweep's small-M
# points are themselves weight-read-bound, which the roofline already charges as memory time, so for
# weight-only quantization (8- or 4-bit weights computing at 16 bits) the floor hides the smaller reads.
# `small_m_flatness` r adds a point at M = 1 with fraction f0 / M0 x M0^r: r = 0 is the proportional
# floor, r = 1 a flat curve below M0 (a 1-row matmul at the first point's fraction).
SMALL_M_FLATNESS = "small_m_flatness"
SERIAL_STEP = "serial_step_overhead_s"  # None in an efficiency: the per-step overhead's value (`serial_step_s`)
# The fixed costs of a step (per step, per layer, an all-reduce's alpha) and the small-matmul floor shape the
# short steps of small batches, which latencies measure; throughput rows run large batches, whose steps they
# barely move. So an entry fits them only on at least MIN_LATENCY_ROWS latency rows (TPOT/ITL, TTFT, E2E), and
# otherwise keeps the level above's: GB200's rows a fit reads are 40 offline throughputs and 2 TPOTs, and the
# blackwell entry fitted on them alone (B200 held out) put B200's disaggregated TPOT 32% off, where the global
# entry put it 10.7% off (2026-12-04, 120 evaluations per entry). As many as an entry needs (MIN_ROWS_PER_ENTRY).
MIN_LATENCY_ROWS = 12
MEASURED_BY_LATENCIES = {"paid_by": "measures_latency", "least_payers": MIN_LATENCY_ROWS}
FITTED_PARAMETERS: tuple[ParameterBounds, ...] = (
    ParameterBounds("bandwidth_fraction", 0.42, 0.90, 0.70,
                    "SIZING.md section 5: decode weight reads reach 52-80% of HBM bandwidth; prior: the builtin "
                    "0.70 (two batch-1 A100 measurements, efficiency.py)"),
    # The cdna3 entry sits on this floor (docs/ACCURACY.md, "Parameters at a bound"). Of its three sources, Argonne's
    # static batches (vLLM 0.6.1 built from source for ROCm, fp16 on MI300X) reach far below it where compute binds:
    # Llama-3-70B on one GPU, batch 256 of 128 in + 128 out, took 145.5 s, i.e. 256 x 255 tokens x 2 x 70.55e9
    # FLOP / 145.5 s = 63 TFLOP/s, 4.8% of the 1,307 TFLOP/s fp16 peak (Llama-3-8B: 72 TFLOP/s, 5.5%; at TP8,
    # 1.7-3.3% per GPU). The floor is 0.30 x 0.93 = 28% of peak at 16k rows, so in-sample the entry predicts the
    # 70B batches of 128 and more 3.4-5.9 times too fast (ratios 0.17-0.29 at TP1). The same build reads weights
    # at 0.47 of HBM bandwidth at batch 1 (127 decode steps x 141.1 GB / 7.13 s = 2.51 of 5.3 TB/s), which the
    # fitted 0.51 matches: what it lacks is that build's GEMMs, not the GPU's. Lowering the floor to reach them
    # would price every MI300X quote at one 2024 build's 5% of peak, and would not move the figures published by
    # GPU held out (a held-out MI300X is predicted without AMD rows: the data's MI250 rows name no catalog GPU, the
    # catalog having the MI250X): the floor stays (2026-12-08).
    ParameterBounds("compute_scale", 0.30, 1.0, 1.0,
                    "SIZING.md section 5: the published A100 fp16 GEMM sweep (scale 1, 93% of peak at 16k rows); "
                    "floor: peers' fixed MFU 0.30"),
    ParameterBounds("per_step_overhead_s", 0.0, 5e-3, 0.3e-3,
                    "SIZING.md section 5: per-step overhead of order 0.1-1 ms; prior 0.3 ms (CUDA-graph decode); "
                    "in an engine that prepares the next step while the GPU runs this one it is host work: the "
                    "least a step lasts (with the per-sequence host work), not added to the GPU's time",
                    **MEASURED_BY_LATENCIES),
    ParameterBounds("per_layer_overhead_s", 0.0, 50e-6, 3e-6,
                    "SIZING.md section 5: a few us per layer; prior 3 us", **MEASURED_BY_LATENCIES),
    # The ceiling is above what NCCL's tuner gives over 8 GPUs (30 x 1.92 against ring LL 15 and NVLS 25 us), and the
    # fitted entries sit near it (hopper 26.0 us: 6.1 ms of TensorRT-LLM DeepSeek-R1's 11.0 ms predicted step on H200
    # TP8 EP8 at 4 users, 7.1 ms measured). Capped at 13 us (NVLS over 8 GPUs), held out by GPU on H100, H200, B200 and
    # GB200 (2026-12-08): all four GPUs' rows 18.5% -> 20.2%, Argonne's H100 static batches (end-to-end 18.0% -> 34.2%,
    # total tokens/s 20.2% -> 27.1%) needing the larger value, DP+EP TPOT 10.4% as it was: the ceiling stays.
    ParameterBounds("allreduce_latency_s", 2e-6, 30e-6, 7.5e-6,
                    "ENGINES.md, NCCL tuner (src/graph/tuning.cc @5067397c): one-node ring LL all-reduce 7.8 us "
                    "over 2 GPUs (15.0 over 8: longer rings scale it, comm.ring_latency_scale), NVLS 25 us; "
                    "SIZING.md section 6: roughly 5-10 us (prior: the builtin 7.5 us)", **MEASURED_BY_LATENCIES),
    ParameterBounds(SMALL_M_FLATNESS, 0.0, 1.0, 0.0,
                    "SIZING.md section 5: below the sweep's first point (M = 64) the curve is proportional to M "
                    "(prior 0); 1 = flat", **MEASURED_BY_LATENCIES),
)
# Host work per sequence per step that an engine does not overlap with the GPU (`engines.host_adjusted`:
# vLLM's V0 engine, before 0.8.0) -- scheduler bookkeeping, the sampler's metadata, detokenization -- is
# Python run once per sequence in the step loop: a few thousand interpreter operations at tens of
# nanoseconds each, i.e. tens to hundreds of microseconds per sequence; the range runs to 1 ms. It is the
# host's (its CPU and the engine build), which a GPU family stands in for. Global prior 0 (nothing beyond
# the per-step overhead); a family entry starts from the global entry's value and, where its rows pay the
# host work, is pulled toward it (`fit_profile`, as every parameter of an entry below the global one is
# pulled toward the level above); an entry none of whose rows pays it does not fit it. The same holds for the
# fixed cost per MoE layer of a step with prompt tokens in engines that run such steps outside CUDA graphs
# (`engines.host_adjusted`): paid only by MoE rows of those engines. An engine that prepares step n + 1 while
# the GPU runs step n (TensorRT-LLM's and SGLang's overlap schedulers, vLLM's V1 engine) does the same kind of
# per-sequence host work, but it costs nothing while the GPU takes longer: a step lasts max(GPU time, host
# work), which binds at large batches of small models, where the GPU's step is short and the sequences many.
# It is fitted apart (the engines' host loops differ from V0's, by their code), on the rows of such engines.
# So is the per-step overhead of a non-overlapping engine (`Efficiency.serial_step_overhead_s`): one parameter
# for both kinds let the overlapping engines' rows, on which the per-step overhead is only the least a step
# lasts and binds on short steps alone, set what every V0 step pays on top of the GPU's time. With H100 held
# out, the hopper entry (H200 and GH200 rows, none of them V0) took the per-step overhead to its 5 ms bound and
# charged it to each step of H100's vLLM 0.5/0.6 static batches, 23.5% off at batch 1. Apart: 9.9%; over the
# whole cross-validation, leave one GPU out 26.0 -> 24.9%, one model family out 17.9 -> 17.2%, one engine out
# 28.3 -> 27.0% (2026-12-05).
HOST_PARAMETERS: tuple[ParameterBounds, ...] = (
    ParameterBounds("per_sequence_overhead_s", 0.0, 1e-3, 0.0,
                    "host work per sequence per step that the engine does not overlap with the GPU (vLLM V0: "
                    "scheduling, sampling metadata, detokenization in the step loop): Python, tens to hundreds "
                    "of us per sequence by its operation count; range to 1 ms; prior 0 in the global entry, the "
                    "global entry's value in a family's", paid_by="pays_host_work"),
    ParameterBounds(SERIAL_STEP, 0.0, 5e-3, 0.3e-3,
                    "per-step overhead of an engine that does not overlap host work with the GPU (vLLM V0), added "
                    "to each step in place of the per-step overhead: SIZING.md section 5's 0.1-1 ms per step, the "
                    "per-step overhead's range and prior", paid_by="pays_host_work"),
    ParameterBounds("overlapped_host_per_sequence_s", 0.0, 1e-3, 0.0,
                    "host work per sequence per step of an engine that prepares the next step while the GPU runs "
                    "this one (TensorRT-LLM's PyTorch backend and SGLang's overlap schedulers, vLLM's V1 engine): "
                    "hidden while the GPU takes longer, the floor of a step when it does not; the same operations "
                    "as the non-overlapped kind, hence its range; prior 0", paid_by="pays_overlapped_host_work"),
    ParameterBounds("prefill_moe_layer_overhead_s", 0.0, 5e-3, 0.0,
                    "a step with prompt tokens that runs outside CUDA graphs (TensorRT-LLM's PyTorch backend, SGLang "
                    "before 0.5.10's piecewise graphs) launches each kernel of an MoE layer from the host: tens of "
                    "kernels at SIZING.md section 5's few us each, plus the host work between them (routing, "
                    "token permutation; ENGINES.md: DeepEP's normal mode cannot be captured in a CUDA graph); "
                    "range 0-5 ms per MoE layer; prior 0", paid_by="pays_prefill_overhead"),
    ParameterBounds("decode_worker_step_overhead_s", 0.0, 5e-3, 0.0,
                    "what each step of a disaggregated deployment's decode worker costs beyond an aggregated "
                    "worker's: its loop tracks the KV transfers in flight (ENGINES.md section 3: SGLang's transfer "
                    "backends, TensorRT-LLM's cache transceiver) before launching the next step; its size is in no "
                    "reference: one value for every GPU and engine, fitted on the disaggregated runs' TPOTs "
                    "(`fit_decode_worker_step`); the per-step overhead's range (SIZING.md section 5: order 0.1-1 ms "
                    "per step); prior 0", paid_by="measures_decode_worker_step"),
)
# Between GPUs that talk over PCIe (`GpuSpec.pcie_links`) the collectives of a layout (tensor-parallel
# all-reduce, pipeline hand-off, MoE exchange) carry less than the link's datasheet rate. A link's one-way
# rate in NVIDIA's p2p bandwidth test reaches 380 of 450 GB/s on H100 NVLink (ENGINES.md section 5: 0.84,
# the one such measurement cited, hence the prior); a ring between PCIe cards also crosses switches and host
# bridges that several cards share (two to four behind one x16 uplink: a half to a quarter of the rate each),
# hence the floor 0.2. Only rows on such GPUs whose layout runs all-reduces or an MoE exchange (TP above 1,
# an MoE model's data-parallel ranks) measure it; NVLink and other scale-up fabrics keep their datasheet rate.
# It belongs to a GPU family's node design, so only a family's (or precision's) entry fits it: the global
# entry, the fallback for GPUs without rows, keeps the cited prior (a few PCIe rows in its sample spread over
# every GPU would set it for all of them).
LINK_PARAMETERS: tuple[ParameterBounds, ...] = (
    ParameterBounds("pcie_link_fraction", 0.2, 1.0, 0.84,
                    "ENGINES.md section 5: a link's one-way rate in NVIDIA's p2pBandwidthLatencyTest, 380 of 450 "
                    "GB/s on H100 NVLink (prior 0.84); 1 = the datasheet rate; floor 0.2: PCIe cards sharing a "
                    "switch or host bridge uplink two to four at a time", paid_by="pays_pcie_link"),
)
GLOBAL_PARAMETERS = FITTED_PARAMETERS + LINK_PARAMETERS + HOST_PARAMETERS

# Weight of the priors: the objective adds PRIOR_WEIGHT x the mean over parameters of
# ((value - prior) / range)^2, so a parameter at the far end of its range costs as much as a 2% worse fit
# (mean |ln| error 0.02): the data moves a parameter only where it pays for itself.
PRIOR_WEIGHT = 0.02

# A fit uses at most this many rows per entry, an equal share from each source (`spread`): each
# trial efficiency re-times every row, and cross-validation refits once per GPU, model family and engine
# (about 20 fits of 15 entries); 80 rows still outnumber the six parameters more than tenfold.
MAX_FIT_ROWS_PER_ENTRY = 80

# An entry of its own needs at least this many measurements (twice the fitted parameters); groups with
# fewer use the next less specific entry.
MIN_ROWS_PER_ENTRY = 2 * len(FITTED_PARAMETERS)

# Objective evaluations per fitted entry: on the published data Nelder–Mead over five parameters is within
# 0.1% of its final objective after about 80; a sixth adds a few dozen.
DEFAULT_EVALUATIONS = 120
# The specificity levels of a profile, from the general to the specific (fit_profile fits them in this
# order; each is a candidate profile, and cross-validation chooses among them).
GLOBAL, FAMILY, FAMILY_PRECISION = "global", "family", "family_precision"
LEVELS = (GLOBAL, FAMILY, FAMILY_PRECISION)

# Penalty for a prediction that is not a positive finite number (|ln| of a 1000x miss).
_MISS_PENALTY = math.log(1000.0)


def keep_going() -> None:
    """The `check` of work nobody waits on (a command line's fit or validation): never stops it. A request's
    passes one that raises once the request is past its deadline (`app.web.deadline_check`)."""


def parameter_value(efficiency: Efficiency, name: str) -> float:
    """A fitted parameter's value in an efficiency (SMALL_M_FLATNESS is read off its compute curve)."""
    if name == SERIAL_STEP:
        return efficiency.serial_step_s
    if name != SMALL_M_FLATNESS:
        return float(getattr(efficiency, name))
    curve = efficiency.compute_curve
    if len(curve) < 2 or curve[0][0] != 1:
        return 0.0  # proportional below the first point
    (_, one_row), (first_rows, first_fraction) = curve[0], curve[1]
    return math.log(one_row * first_rows / first_fraction) / math.log(first_rows)


def with_parameters(efficiency: Efficiency, values: dict[str, float]) -> Efficiency:
    """The efficiency with the given fitted parameters set (the others unchanged)."""
    fields = {name: float(value) for name, value in values.items() if name != SMALL_M_FLATNESS}
    if SMALL_M_FLATNESS in values:
        curve = tuple(point for point in efficiency.compute_curve if point[0] > 1)
        first_rows, first_fraction = curve[0]
        one_row = first_fraction / first_rows * first_rows ** float(values[SMALL_M_FLATNESS])
        fields["compute_curve"] = ((1, min(one_row, first_fraction)), *curve)
    return replace(efficiency, **fields)


# Profiles ---------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ProfileEntry:
    family: str  # GpuSpec.family, a maker's `vendor_key`, or ANY
    compute_dtype: str  # or ANY
    efficiency: Efficiency
    rows: int = 0  # measurements this entry was fitted on; 0 = inherited, not fitted here

    @property
    def key(self) -> tuple[str, str]:
        return self.family, self.compute_dtype


@dataclass(frozen=True, slots=True)
class CalibrationProfile:
    """Efficiencies by (GPU family, compute precision); the (`*`, `*`) entry is required."""

    name: str
    entries: tuple[ProfileEntry, ...]

    def __post_init__(self) -> None:
        keys = [entry.key for entry in self.entries]
        if len(set(keys)) != len(keys):
            raise ValueError("profile entries must have distinct (family, compute_dtype) keys")
        if (ANY, ANY) not in keys:
            raise ValueError("a profile needs a global entry (family '*', compute_dtype '*')")

    def entry_for(self, family: str, compute_dtype: str, vendor: str = "") -> ProfileEntry:
        """The most specific entry for a GPU of `family` made by `vendor` ("": not stated) at `compute_dtype`."""
        by_key = {entry.key: entry for entry in self.entries}
        maker = ((vendor_key(vendor), ANY),) if vendor else ()
        for key in ((family, compute_dtype), (family, ANY), *maker, (ANY, compute_dtype), (ANY, ANY)):
            if key in by_key:
                return by_key[key]
        raise AssertionError("unreachable: the global entry always matches")

    def efficiency_for(self, family: str, compute_dtype: str, vendor: str = "") -> Efficiency:
        return self.entry_for(family, compute_dtype, vendor).efficiency


# A maker's entry: the fallback of its GPUs whose family has no entry (a GPU alone in a new generation, or a
# family with too few rows), fitted on every row of that maker's GPUs. A maker's GPUs share its kernel libraries,
# collective library and engine builds (CUDA and NCCL; ROCm and RCCL), which the global entry averages with
# every other maker's. Its key sits in the family column; the colon keeps it apart from every family name
# (`[a-z0-9-]`).
VENDOR_PREFIX = "vendor:"


def vendor_key(vendor: str) -> str:
    """The family column of a maker's entry: 'vendor:nvidia' for "NVIDIA"."""
    return VENDOR_PREFIX + vendor.strip().lower()


def single_entry_profile(name: str, efficiency: Efficiency) -> CalibrationProfile:
    """A profile that applies one efficiency everywhere."""
    return CalibrationProfile(name, (ProfileEntry(ANY, ANY, efficiency),))


# Errors -----------------------------------------------------------------------------------------

def abs_pct_error(predicted: float, measured: float) -> float:
    """|predicted − measured| / measured, in percent."""
    return abs(predicted / measured - 1.0) * 100.0


def abs_log_error(predicted: float, measured: float) -> float:
    """|ln(predicted / measured)|, with a fixed penalty for a prediction that is not positive and finite."""
    if not (math.isfinite(predicted) and predicted > 0):
        return _MISS_PENALTY
    return abs(math.log(predicted / measured))


# Fitting ----------------------------------------------------------------------------------------

class FitTarget(Protocol):
    """What a fit needs of one measurement."""

    @property
    def measured(self) -> float: ...

    @property
    def source_id(self) -> str: ...

    @property
    def family(self) -> str: ...

    @property
    def vendor(self) -> str:
        """The GPU's maker ("": not stated, no maker's entry)."""
        ...

    @property
    def compute_dtype(self) -> str: ...

    @property
    def pays_host_work(self) -> bool:
        """Whether its engine adds host work per sequence to every step (per_sequence_overhead_s)."""
        ...

    @property
    def pays_overlapped_host_work(self) -> bool:
        """Whether its engine overlaps host work with the GPU, so that a step lasts at least that work
        (overlapped_host_per_sequence_s)."""
        ...

    @property
    def pays_prefill_overhead(self) -> bool:
        """Whether its MoE model's steps with prompt tokens run outside CUDA graphs (prefill_moe_layer_overhead_s)."""
        ...

    @property
    def pays_pcie_link(self) -> bool:
        """Whether its layout runs all-reduces or an MoE exchange between GPUs that talk over PCIe
        (pcie_link_fraction)."""
        ...

    @property
    def measures_latency(self) -> bool:
        """Whether it is a latency (TPOT/ITL, TTFT, E2E), which the fixed costs of a step shape (MIN_LATENCY_ROWS)."""
        ...

    @property
    def measures_steps(self) -> bool:
        """Whether every efficiency is fitted to it; else only the cost of an MoE model's prompt steps
        (prefill_moe_layer_overhead_s), or a disaggregated decode worker's step (`measures_decode_worker_step`),
        with everything else held (`fit_profile`)."""
        ...

    @property
    def measures_decode_worker_step(self) -> bool:
        """Whether it is the TPOT of a disaggregated run, which measures what a decode worker's step costs
        beyond an aggregated worker's (decode_worker_step_overhead_s) and nothing else (`fit_decode_worker_step`)."""
        ...

    def predict(self, efficiency: Efficiency) -> float: ...


def mean_abs_log_error(targets: Sequence[FitTarget], efficiency: Efficiency) -> float:
    return float(np.mean([abs_log_error(t.predict(efficiency), t.measured) for t in targets]))


def prior_penalty(values: np.ndarray, bounds: Sequence[ParameterBounds]) -> float:
    """PRIOR_WEIGHT x the mean over the parameters of ((value - prior) / range)^2: what a fit's objective adds
    to the error for leaving the priors."""
    priors = np.array([bound.prior for bound in bounds])
    spans = np.array([bound.high - bound.low for bound in bounds])
    return PRIOR_WEIGHT * float(np.mean(((values - priors) / spans) ** 2))


def fit_efficiency(targets: Sequence[FitTarget], start: Efficiency,
                   bounds: Sequence[ParameterBounds] = FITTED_PARAMETERS, *,
                   max_evaluations: int = DEFAULT_EVALUATIONS,
                   source: str | None = None) -> tuple[Efficiency, float]:
    """The efficiency (starting from `start`, changing only the bounded parameters) that minimizes the
    mean absolute log error over `targets` plus the priors' penalty (PRIOR_WEIGHT); returns it with
    that objective."""
    if not targets:
        raise ValueError("nothing to fit: no measurements")
    names = [bound.name for bound in bounds]

    def with_values(values: np.ndarray) -> Efficiency:
        return with_parameters(start, dict(zip(names, values, strict=True)))

    def objective(values: np.ndarray) -> float:
        return mean_abs_log_error(targets, with_values(values)) + prior_penalty(values, bounds)

    result = nelder_mead(
        objective,
        [parameter_value(start, name) for name in names],
        [bound.low for bound in bounds], [bound.high for bound in bounds],
        max_evaluations=max_evaluations)
    fitted = with_values(result.x)
    if source is not None:
        fitted = replace(fitted, source=source)
    return fitted, result.value


@dataclass(frozen=True, slots=True)
class EntryFit:
    family: str
    compute_dtype: str
    rows: int
    mean_abs_log_error_before: float
    mean_abs_log_error_after: float


@dataclass(frozen=True, slots=True)
class ProfileFit:
    profile: CalibrationProfile  # the most specific level
    entries: tuple[EntryFit, ...]
    levels: dict[str, CalibrationProfile]  # the profile as it stood after each level (LEVELS)


def fit_profile(targets: Sequence[FitTarget], base: CalibrationProfile, *, name: str, fit_global: bool,
                describe: Callable[[str, str, Sequence[FitTarget]], str], max_evaluations: int = DEFAULT_EVALUATIONS,
                max_rows_per_entry: int | None = MAX_FIT_ROWS_PER_ENTRY,
                check: Callable[[], None] = keep_going) -> ProfileFit:
    """Fit a profile from the general to the specific, each entry starting where the previous level left
    it: the global entry on every target (when `fit_global`); then, for each GPU family with at least
    MIN_ROWS_PER_ENTRY targets, a family entry (family, `*`) on all of them, the fallback for its
    precisions without an entry; then, for each GPU maker with as many, the maker's entry (`vendor_key`, `*`)
    on all of them, the fallback for its GPUs whose family has no entry (a maker whose rows are all of one
    family gives it that family's fit: the same rows); then each (family, compute precision) group with at least
    MIN_ROWS_PER_ENTRY targets (a family with one precision gives that group the family's fit). A maker's entry
    starts from the global entry, as a family's does, and no entry below starts from it: a family entry is
    pulled toward the global entry, so a family's fit is the same with or without its maker's. The global entry
    does not fit LINK_PARAMETERS (a family's node design): it keeps `base`'s.
    Everything the targets do not cover keeps `base`'s entries. `describe(family, dtype, rows)`
    writes each fitted entry's `source` from the rows it was fitted on. An entry fits at most
    `max_rows_per_entry` of its rows, an equal share from each source (`spread`). The profile after each level
    is kept (`levels`). Each entry's search reads the rows that measure every efficiency (`measures_steps`,
    at least MIN_ROWS_PER_ENTRY of them to have an entry); then, where its MoE rows include TTFTs that do not,
    the cost of a prompt step per MoE layer is refitted on all its MoE rows (`fit_prompt_step_overhead`). The
    entries below start from the search's values, not the refit's: a refit that moved where a family's search
    starts would move all of its values (the search is local; 2026-12-04, several points on subsets).
    `check` is called before each entry's search and before the decode worker's fit: whatever it raises stops
    the fit there (a request past its deadline).
    """
    if not targets:
        raise ValueError("nothing to fit: no measurements")
    entries = {entry.key: entry for entry in base.entries}
    searched = dict(entries)  # each entry as its search left it: where the entries below it start
    fits: list[EntryFit] = []
    levels: dict[str, CalibrationProfile] = {}

    def fit(key: tuple[str, str], rows: Sequence[FitTarget]) -> Efficiency:
        check()
        moe_rows = spread([row for row in rows if row.pays_prefill_overhead and not row.measures_decode_worker_step],
                          max_rows_per_entry)
        rows = spread([row for row in rows if row.measures_steps], max_rows_per_entry)
        start = CalibrationProfile(name, tuple(searched.values())).efficiency_for(*key)
        bounds = GLOBAL_PARAMETERS
        if key == (ANY, ANY):  # a family's node design (its PCIe links) is measured in its own entry
            bounds = tuple(bound for bound in bounds if bound not in LINK_PARAMETERS)
        else:  # partial pooling: pulled toward the level above (where it starts), not the cited priors
            bounds = tuple(replace(bound, prior=min(max(parameter_value(start, bound.name), bound.low), bound.high))
                           for bound in bounds)
        # A parameter too few rows pay (`least_payers`) is not measured by these rows: kept, not fitted.
        bounds = tuple(bound for bound in bounds
                       if bound.paid_by is None
                       or sum(1 for row in rows if getattr(row, bound.paid_by)) >= bound.least_payers)
        before = mean_abs_log_error(rows, start)
        fitted, _ = fit_efficiency(rows, start, bounds, max_evaluations=max_evaluations,
                                   source=describe(*key, rows))
        searched[key] = ProfileEntry(*key, fitted, len(rows))
        if any(not row.measures_steps for row in moe_rows):  # then the prompt steps, on their TTFTs too
            fitted = fit_prompt_step_overhead(moe_rows, fitted)
        entries[key] = ProfileEntry(*key, fitted, len(rows))
        fits.append(EntryFit(*key, len(rows), before, mean_abs_log_error(rows, fitted)))
        return fitted

    def snapshot(level: str) -> None:
        levels[level] = CalibrationProfile(name, tuple(entries.values()))

    if fit_global:
        fit((ANY, ANY), targets)
    snapshot(GLOBAL)
    by_family = {family: rows for family, rows in sorted(group_by(targets, lambda t: t.family).items())
                 if _step_rows(rows) >= MIN_ROWS_PER_ENTRY}
    # Families nested in their maker instead (its entry fitted first, each family starting from and pulled toward it,
    # so that a family without V0 rows takes NVIDIA's host costs rather than every maker's): held out by GPU on H100,
    # H200, B200 and GB200 (2026-12-08) the DP+EP TPOT error went 10.4% -> 9.7% but the disaggregated TPOT error 9.3%
    # -> 10.4%, TP-only TPOT 13.2% -> 15.0% and all four GPUs' rows 18.5% -> 18.8%: not taken.
    family_fits = {family: fit((family, ANY), rows) for family, rows in by_family.items()}

    def same_fit(key: tuple[str, str], family: str, rows: Sequence[FitTarget]) -> None:
        """The entry `key` as the family's fit, on the same rows (described as its own)."""
        family_fit = next(item for item in fits if (item.family, item.compute_dtype) == (family, ANY))
        entries[key] = ProfileEntry(*key, replace(family_fits[family], source=describe(*key, spread(
            [row for row in rows if row.measures_steps], max_rows_per_entry))), family_fit.rows)
        fits.append(replace(family_fit, family=key[0], compute_dtype=key[1]))

    for vendor, rows in sorted(group_by([t for t in targets if t.vendor], lambda t: vendor_key(t.vendor)).items()):
        if _step_rows(rows) < MIN_ROWS_PER_ENTRY:
            continue
        families = {row.family for row in rows}
        if len(families) == 1:  # one family's rows (enough for its entry): its fit
            same_fit((vendor, ANY), families.pop(), rows)
        else:
            fit((vendor, ANY), rows)
    snapshot(FAMILY)
    for family, family_rows in by_family.items():
        for dtype, rows in sorted(group_by(family_rows, lambda t: t.compute_dtype).items()):
            if _step_rows(rows) < MIN_ROWS_PER_ENTRY:
                continue
            if len(rows) < len(family_rows):
                fit((family, dtype), rows)
            else:  # the family's only precision: the same rows, the same fit
                same_fit((family, dtype), family, rows)
    snapshot(FAMILY_PRECISION)
    decode_rows = [target for target in targets if target.measures_decode_worker_step]
    # One value for every entry, fitted on the shipped-by-default level's predictions, where as many TPOTs as an
    # entry of its own needs measure it; fewer keep the base's (one model family's four TPOTs, all that is left
    # when DeepSeek's are held out, would set it for every run).
    if len(decode_rows) >= MIN_ROWS_PER_ENTRY:
        check()
        step = fit_decode_worker_step(decode_rows, levels[FAMILY])
        levels = {level: with_decode_worker_step(profile, step) for level, profile in levels.items()}
    return ProfileFit(levels[FAMILY_PRECISION], tuple(fits), levels)


DECODE_WORKER_STEP = next(bound for bound in HOST_PARAMETERS if bound.name == "decode_worker_step_overhead_s")


def fit_decode_worker_step(targets: Sequence[FitTarget], profile: CalibrationProfile) -> float:
    """What a disaggregated decode worker's step costs beyond an aggregated worker's (DECODE_WORKER_STEP), one
    value for every GPU and engine: the one that minimizes the mean absolute log error over `targets` (the
    TPOTs of disaggregated runs, each at its entry of `profile`) plus the prior's penalty.

    A decode worker's request takes one step per token, each step `value` longer, so a TPOT predicted without it
    grows by `value`: each target is simulated once, at 0, and the search runs on those TPOTs (the closed loop's
    users stay the same, and so do the decode batches; a longer step also delays the users' next requests, a
    second-order effect on the TPOT that this leaves out). Its value is then charged in full in every prediction.
    A golden-section search over the parameter's range. TPOTs are in ms (`FitTarget.predict`)."""
    without = [target.predict(replace(profile.efficiency_for(target.family, target.compute_dtype, target.vendor),
                                      decode_worker_step_overhead_s=0.0)) for target in targets]

    def objective(value: float) -> float:
        errors = [abs_log_error(ms + value * 1e3, target.measured) for ms, target in zip(without, targets, strict=True)]
        return math.fsum(errors) / len(errors) + prior_penalty(np.array([value]), (DECODE_WORKER_STEP,))

    return golden_section(objective, DECODE_WORKER_STEP.low, DECODE_WORKER_STEP.high)


def with_decode_worker_step(profile: CalibrationProfile, value: float) -> CalibrationProfile:
    """`profile` with `value` as every entry's decode_worker_step_overhead_s."""
    return CalibrationProfile(profile.name, tuple(
        replace(entry, efficiency=replace(entry.efficiency, decode_worker_step_overhead_s=value))
        for entry in profile.entries))


PROMPT_STEP_OVERHEAD = next(bound for bound in HOST_PARAMETERS if bound.name == "prefill_moe_layer_overhead_s")


def fit_prompt_step_overhead(targets: Sequence[FitTarget], efficiency: Efficiency) -> Efficiency:
    """The efficiency with the cost per MoE layer of a prompt step (PROMPT_STEP_OVERHEAD, in engines that run
    such steps outside CUDA graphs) that minimizes the mean absolute log error over `targets` plus the prior's
    penalty (the prior: the value the entry's search found), everything else held. The targets are the MoE
    rows that pay it, the TTFTs of light closed loops among them: a TTFT is mostly prompt steps, which the
    offline and static-batch rows of the search dilute among decode steps, and those TTFTs may not move the
    other efficiencies (`FitTarget.measures_steps`). A golden-section search over its range."""
    bound = replace(PROMPT_STEP_OVERHEAD, prior=parameter_value(efficiency, PROMPT_STEP_OVERHEAD.name))

    def objective(value: float) -> float:
        tried = replace(efficiency, prefill_moe_layer_overhead_s=value)
        return mean_abs_log_error(targets, tried) + prior_penalty(np.array([value]), (bound,))

    return replace(efficiency, prefill_moe_layer_overhead_s=golden_section(objective, bound.low, bound.high))


def _step_rows(rows: Sequence[FitTarget]) -> int:
    """How many of the rows every efficiency is fitted to (`FitTarget.measures_steps`)."""
    return sum(1 for row in rows if row.measures_steps)


def fitted_sources(rows: Sequence[FitTarget]) -> str:
    """Which published sources the rows come from, the most rows first: 'A 62 rows, B 18 rows'. Written into a
    fitted entry's `source`, so that a response naming the entry says whose measurements it stands on."""
    counts = Counter(row.source_id for row in rows)
    return ", ".join(f"{source} {count} row{'' if count == 1 else 's'}" for source, count in
                     sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def spread(rows: Sequence[FitTarget], most: int | None) -> list[FitTarget]:
    """At most `most` of the rows, an equal share of them from each published source (`source_id`), each
    share evenly spaced in its source's order (all of them when there are no more). A source with fewer rows
    than its share gives all it has, and the rest goes to the larger sources.

    Why by source: a source is one experiment (one harness, engine build and set of machines), and its rows
    share whatever the model does not represent of it; a source with 70 times the rows of another is not 70
    times the evidence. Spread in proportion to rows, one 2024 build's 1,258 MI300X static batches made
    nearly all of the MI300X entry's sample and aiconfigurator's rows most of the global one; and a row added
    anywhere shifted every later pick (one more predicted row moved the leave-one-GPU-out median from 27.7% to
    29.4%). Equal shares, against the same code and data sampled in proportion: leave one GPU out 29.4 ->
    27.3%, one model family out 19.0 -> 19.5%, one engine out 29.5 -> 27.0% (2026-12-04, 80 evaluations)."""
    if most is None or len(rows) <= most:
        return list(rows)
    by_source = group_by(rows, lambda row: row.source_id)
    taken: dict[str, list[FitTarget]] = {}
    left = most
    smallest_first = sorted(by_source, key=lambda source: (len(by_source[source]), source))
    for i, source in enumerate(smallest_first):
        share = min(left // (len(smallest_first) - i), len(by_source[source]))
        taken[source] = _evenly_spaced(by_source[source], share)
        left -= share
    return [row for source in by_source for row in taken[source]]


def _evenly_spaced(rows: Sequence[FitTarget], count: int) -> list[FitTarget]:
    """`count` of the rows at indices floor(i x len / count)."""
    return [rows[int(i * len(rows) / count)] for i in range(count)]


def group_by(targets: Iterable[FitTarget], key: Callable[[FitTarget], str]) -> dict[str, list[FitTarget]]:
    """The targets by `key`, each group in the targets' order (groups in order of first appearance)."""
    groups: dict[str, list[FitTarget]] = {}
    for target in targets:
        groups.setdefault(key(target), []).append(target)
    return groups


def same_fits(profile: CalibrationProfile) -> dict[tuple[str, str], tuple[str, str]]:
    """Each fitted entry that carries another's fit (`fit_profile`: a maker whose rows are all one family's, a
    family's only precision) -> the first entry with that fit in the profile's order, the efficiencies compared
    whole but for their `source`. Their parameters at a bound are one defect, not two."""
    fitted = [(entry.key, replace(entry.efficiency, source="")) for entry in profile.entries if entry.rows]
    return {key: first for key, fit in fitted
            if (first := next(other_key for other_key, other in fitted if other == fit)) != key}


def parameters_at_bounds(profile: CalibrationProfile,
                         bounds: Sequence[ParameterBounds] = GLOBAL_PARAMETERS) -> list[tuple[str, str, str, float, str]]:
    """(family, compute_dtype, parameter, value, 'low'|'high') for every fitted entry's parameter at a
    bound: each is a defect of the model (the parameter stands in for missing physics), not a result."""
    found = []
    for entry in profile.entries:
        if entry.rows == 0:
            continue
        for bound in bounds:
            value = parameter_value(entry.efficiency, bound.name)
            side = bound.at_bound(value)
            if side:
                found.append((entry.family, entry.compute_dtype, bound.name, value, side))
    return found


def pinned_against_prior(bound: ParameterBounds, value: float) -> str | None:
    """'low' or 'high' when the fit pushed the parameter to a bound away from its cited prior; None when it is
    not at a bound or sits at the bound its prior sits at (a prior of 0 at a floor of 0: the rows asked for
    none of the effect, which is a result)."""
    side = bound.at_bound(value)
    return side if side is not None and bound.at_bound(bound.prior) != side else None


def mark_pinned(profile: CalibrationProfile) -> CalibrationProfile:
    """The profile with each fitted entry's `source` saying which of its parameters the fit pushed to a bound
    away from the cited prior (`pinned_against_prior`), so that every response using the entry says so."""
    def marked(entry: ProfileEntry) -> ProfileEntry:
        pinned = [(bound, value, side) for bound in GLOBAL_PARAMETERS if entry.rows
                  and (side := pinned_against_prior(bound, value := parameter_value(entry.efficiency, bound.name)))]
        if not pinned:
            return entry
        what = "; ".join(f"{bound.name} {value:.4g} at the {side} end of its range [{bound.low:g}, {bound.high:g}] "
                         f"(cited prior {bound.prior:g})" for bound, value, side in pinned)
        note = (f". Pinned: {what}. A parameter the fit pushes to a bound stands in for something the model lacks "
                f"for these rows: this entry's predictions are less certain than its fit error says")
        return replace(entry, efficiency=replace(entry.efficiency, source=entry.efficiency.source + note))

    return CalibrationProfile(profile.name, tuple(marked(entry) for entry in profile.entries))
