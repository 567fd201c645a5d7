"""Achieved fractions of peak and fixed costs: the calibratable part of the step-time model.

SIZING.md section 5: ideal time assumes every FLOP at peak and every byte at full HBM bandwidth;
expected time divides by what kernels actually achieve, which for matmuls depends on how many rows
(tokens) a step multiplies: small-M GEMMs are inefficient. A "calibration profile" is one
`Efficiency`; `DEFAULT_EFFICIENCY` holds cited constants, and a fit replaces them per GPU family and
precision (mostly through `compute_scale`).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike


@dataclass(frozen=True, slots=True, kw_only=True)
class Efficiency:
    """Achieved fractions of peak, per-step fixed costs, and where the numbers came from.

    `compute_curve` is (matmul rows M, achieved fraction of peak FLOP/s) points with M strictly
    increasing. Between points the fraction is interpolated in log M; below the first point it is
    proportional to M; above the last it stays flat. Within a segment the log interpolation is capped
    by proportionality to the segment's left point, so that `M / fraction(M)` (the time of a matmul
    with M rows) never falls as M grows: adding tokens to a step can never make it faster. For the
    same reason the points themselves must satisfy fraction/M non-increasing; every real GEMM sweep
    does (the time of a GEMM does not drop when rows are added).
    """

    bandwidth_fraction: float  # achieved fraction of HBM bandwidth, 0..1
    compute_curve: tuple[tuple[int, float], ...]  # matmuls: (rows M, achieved fraction of peak)
    compute_scale: float = 1.0  # multiplies every compute fraction (what a fit adjusts per GPU family/precision)
    # Attention is not an M-row matmul: its kernels (FlashAttention/FlashInfer) reach a fraction of peak
    # that does not grow with the step's tokens. FlashAttention-2 reaches 50-73% of A100 peak (Dao,
    # 2023) and FlashAttention-3 75% of H100's fp16 peak (Shah et al., 2024); we take 0.6.
    attention_fraction: float = 0.6
    per_step_overhead_s: float  # scheduling, sampling, launches: once per engine step
    per_layer_overhead_s: float  # kernel launches and small ops: once per decoder layer per step
    # alpha: fixed cost of one communication call between two GPUs (a pipeline hand-off, an MoE exchange, a
    # two-GPU all-reduce); a ring all-reduce over more GPUs takes `comm.ring_latency_scale` times it
    allreduce_latency_s: float
    # Achieved fraction of the PCIe link's per-direction rate in the collectives of a layout on GPUs that talk
    # over PCIe (`GpuSpec.pcie_links`): tensor-parallel all-reduces, pipeline hand-offs, the MoE exchange.
    # 1 = the datasheet rate. A ring between PCIe cards crosses switches and host bridges that several cards
    # share; NVLink and other scale-up fabrics keep their datasheet rate.
    pcie_link_fraction: float = 1.0
    # Host work per sequence per step that the engine does not overlap with the GPU (scheduling, sampling
    # metadata, detokenization in the step loop). 0 for engines that prepare the next step while the GPU
    # runs this one; `engines.host_adjusted` keeps it only for those that do not (vLLM's V0 engine).
    per_sequence_overhead_s: float = 0.0
    # The per-step overhead of an engine that does not overlap host work with the GPU (vLLM's V0 engine): the
    # scheduling, input preparation and sampling bookkeeping it runs between GPU steps, added to each of its
    # steps in place of `per_step_overhead_s` (`engines.host_adjusted`). A quantity of its own: in the engines
    # that do overlap, the per-step overhead is mostly the least a step lasts, which binds only on short steps,
    # and a value that fits those says nothing of a serial host loop. (Where such an engine does not hide its
    # loop, with pipeline stages or on context servers, it adds the per-step overhead: charging this one there
    # instead took the leave-one-engine-out median from 27.0 to 29.3%, 2026-12-05.) None: the per-step
    # overhead's value (what a profile that predates it charged; `serial_step_s`).
    serial_step_overhead_s: float | None = None
    # Host work per sequence per step of an engine that prepares the next step while the GPU runs this one
    # (`Engine.overlaps_host_work`): hidden while the GPU takes longer, so a step takes at least this times
    # the sequences it samples. 0 for engines that do not overlap (they pay `per_sequence_overhead_s` on top).
    overlapped_host_per_sequence_s: float = 0.0
    # Fixed cost per MoE layer of a step that carries prompt tokens, in engines that run such steps outside
    # the CUDA graphs they replay for decode-only steps (`Engine.graphs_prefill_steps`: TensorRT-LLM's PyTorch
    # backend, SGLang before 0.5.10, vLLM's V0 engine): launches and host work the GPU waits for. Never on a
    # disaggregated decode worker, which runs no prompt step (`engines.HostRules.adjusted`). Added to the step's
    # GPU time. Taken instead as launch work the GPU's time hides (the step lasting the larger of the two, as an
    # eager step's asynchronous launches might), held out by GPU on H100, H200, B200 and GB200 (2026-12-07), it
    # took the disaggregated TTFT error from 46.2% to 55.1%, the DP+EP TTFT error from 30.5% to 35.4% and all
    # four GPUs' rows from 18.5% to 19.5%: rejected.
    prefill_moe_layer_overhead_s: float = 0.0
    # What each step of a disaggregated deployment's decode worker costs beyond an aggregated worker's: its loop
    # tracks the KV transfers in flight every step (SGLang's decode scheduler polls its transfer queue and agrees
    # on it across its ranks; TensorRT-LLM's generation servers check their cache transceiver) before it launches
    # the next one. Added to every step, never hidden under the GPU's; 0 everywhere but a decode pool
    # (`engines.host_adjusted`, decode_pool).
    decode_worker_step_overhead_s: float = 0.0
    # Whether `per_step_overhead_s` is host work the engine does while the GPU runs the step (an engine that
    # prepares step n + 1 during step n: `engines.host_adjusted` sets it): then a step lasts at least that plus
    # the overlapped per-sequence work, and the overhead is not added to the GPU's time. False: added (an engine
    # that does not overlap, and the GPU's own time where no engine runs the steps).
    step_overhead_overlapped: bool = False
    source: str
    # The curve as arrays, for interpolation (derived once, on construction).
    _curve_tokens: np.ndarray = field(init=False, repr=False, compare=False)
    _curve_log_tokens: np.ndarray = field(init=False, repr=False, compare=False)
    _curve_fractions: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 0 < self.bandwidth_fraction <= 1:
            raise ValueError("bandwidth_fraction must be in (0, 1]")
        if not self.compute_curve:
            raise ValueError("compute_curve needs at least one point")
        previous_tokens, previous_ratio = 0, float("inf")
        for tokens, fraction in self.compute_curve:
            if tokens <= previous_tokens:
                raise ValueError("compute_curve token counts must be positive and strictly increasing")
            if not 0 < fraction <= 1:
                raise ValueError("compute_curve fractions must be in (0, 1]")
            if fraction / tokens > previous_ratio:
                raise ValueError(
                    "compute_curve fraction/tokens must not increase: a matmul with more rows cannot "
                    "take less time")
            previous_tokens, previous_ratio = tokens, fraction / tokens
        if self.compute_scale <= 0:
            raise ValueError("compute_scale must be positive")
        if not 0 < self.attention_fraction <= 1:
            raise ValueError("attention_fraction must be in (0, 1]")
        if not 0 < self.pcie_link_fraction <= 1:
            raise ValueError("pcie_link_fraction must be in (0, 1]")
        for name in ("per_step_overhead_s", "per_layer_overhead_s", "allreduce_latency_s", "per_sequence_overhead_s",
                     "serial_step_s", "overlapped_host_per_sequence_s", "prefill_moe_layer_overhead_s",
                     "decode_worker_step_overhead_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        curve_tokens = np.array([point[0] for point in self.compute_curve], dtype=float)
        object.__setattr__(self, "_curve_tokens", curve_tokens)
        object.__setattr__(self, "_curve_log_tokens", np.log(curve_tokens))
        object.__setattr__(self, "_curve_fractions",
                           np.array([point[1] for point in self.compute_curve], dtype=float))

    def compute_fraction(self, tokens_per_step: ArrayLike) -> float | np.ndarray:
        """Achieved fraction of peak FLOP/s of a matmul of M rows (0 at M = 0, never above 1).

        Accepts a number or an array; returns a float or an array of the same shape. A number takes
        plain float arithmetic (the same steps as the array path; numpy's per-call cost dominates one value).
        """
        if isinstance(tokens_per_step, int | float):
            return self._scalar_compute_fraction(float(tokens_per_step))
        tokens = np.asarray(tokens_per_step, dtype=float)
        curve_tokens, curve_fractions = self._curve_tokens, self._curve_fractions
        at_least_first = np.maximum(tokens, curve_tokens[0])  # keeps log() finite; M < M0 is capped below
        interpolated = np.interp(np.log(at_least_first), self._curve_log_tokens, curve_fractions)
        left = np.searchsorted(curve_tokens, at_least_first, side="right") - 1
        proportional = curve_fractions[left] / curve_tokens[left] * tokens
        fraction = np.minimum(np.minimum(interpolated, proportional) * self.compute_scale, 1.0)
        return float(fraction) if fraction.ndim == 0 else fraction

    def _scalar_compute_fraction(self, tokens: float) -> float:
        """`compute_fraction` of one row count: np.interp's arithmetic (slope x (x - x_j) + y_j) on floats."""
        curve = self.compute_curve
        first_tokens = curve[0][0]
        at_least_first = max(tokens, first_tokens)
        left = bisect_right(curve, at_least_first, key=lambda point: point[0]) - 1
        left_tokens, left_fraction = curve[left]
        log_tokens, log_left = math.log(at_least_first), math.log(left_tokens)
        if left == len(curve) - 1:
            interpolated = float(left_fraction)
        else:
            right_tokens, right_fraction = curve[left + 1]
            slope = (right_fraction - left_fraction) / (math.log(right_tokens) - log_left)
            interpolated = slope * (log_tokens - log_left) + left_fraction
        proportional = left_fraction / left_tokens * tokens
        return min(min(interpolated, proportional) * self.compute_scale, 1.0)

    @property
    def attention_compute_fraction(self) -> float:
        """Achieved fraction of peak FLOP/s in attention kernels (scaled, never above 1)."""
        # Unscaled instead (the kernel papers' fractions are of the datasheet peak already, and the fitted scale is
        # the matmuls'), held out by GPU on H100, H200, B200 and GB200 (2026-12-08): all four GPUs' rows 18.5% ->
        # 18.3% and TensorRT-LLM's DP+EP TPOT on B200 x1.34 -> x1.20, but GB200 throughput 10.0% -> 32.2%, the
        # disaggregated TPOT 9.3% -> 10.1% and TTFT 46.2% -> 57.5% (x0.61 -> x0.52: prompts faster still): rejected.
        return min(self.attention_fraction * self.compute_scale, 1.0)

    def link_fraction(self, pcie_links: bool) -> float:
        """Achieved fraction of a link's catalog rate in a layout's collectives: `pcie_link_fraction` between
        GPUs that talk over PCIe (`GpuSpec.pcie_links`), 1 over NVLink and other scale-up fabrics."""
        return self.pcie_link_fraction if pcie_links else 1.0

    @property
    def serial_step_s(self) -> float:
        """The per-step overhead a non-overlapping engine pays (`serial_step_overhead_s`, else the per-step one)."""
        return self.per_step_overhead_s if self.serial_step_overhead_s is None else self.serial_step_overhead_s

    def overhead_time_s(self, tokens_per_step: ArrayLike, num_layers: int, step_scale: float = 1.0,
                        layer_scale: float = 1.0) -> float | np.ndarray:
        """Fixed cost of one engine step: per-step plus per-layer overhead (an empty step costs 0). A full
        pipeline's period counts the per-step part `step_scale` times and the per-layer part `layer_scale`
        times (`step_time.pipeline_period_scales`)."""
        tokens = np.asarray(tokens_per_step, dtype=float)
        time = (tokens > 0) * (step_scale * self.per_step_overhead_s
                               + layer_scale * (self.per_layer_overhead_s * num_layers))
        return float(time) if time.ndim == 0 else time


# Published A100 fp16 GEMM sweep (SIZING.md section 5): achieved fraction of peak vs rows M.
A100_FP16_GEMM_CURVE: tuple[tuple[int, float], ...] = (
    (64, 0.33), (128, 0.62), (256, 0.78), (4096, 0.89), (16384, 0.93),
)

DEFAULT_EFFICIENCY = Efficiency(
    # Decode weight reads reach 52-80% of HBM bandwidth (SIZING.md section 5). Two batch-1 decode
    # measurements on A100-80GB (2039 GB/s) bracket our choice: gpt-fast Llama-3.1-8B bf16 reads
    # 1410.76 GB/s (0.692) and LMDeploy Llama-2-7B fp16 100 tok/s x 13.2 GB = 1321 GB/s (0.648), both
    # end to end, i.e. with the step overhead inside; with the overhead below taken out (0.3 ms +
    # 32 x 3 us of a ~10 ms step) the kernels themselves read at ~0.68-0.72. We use 0.70.
    bandwidth_fraction=0.70,
    compute_curve=A100_FP16_GEMM_CURVE,
    compute_scale=1.0,
    # "order 0.1-1 ms per step, plus a few microseconds per layer" (SIZING.md section 5): the low end,
    # as engines replay decode steps from CUDA graphs; 0.3 ms + 32 x 3 us ~ 0.4 ms on a 32-layer model.
    per_step_overhead_s=0.3e-3,
    per_layer_overhead_s=3e-6,
    # alpha of one two-GPU all-reduce: "roughly 5-10 us" (SIZING.md section 6), the midpoint; NCCL's model
    # gives 7.8 us (ENGINES.md section 5), 15.0 us over 8 GPUs (`comm.ring_latency_scale`).
    allreduce_latency_s=7.5e-6,
    # Between PCIe cards: a link's one-way rate in NVIDIA's p2p bandwidth test, 380 of 450 GB/s on H100
    # NVLink (ENGINES.md section 5), the one such measurement cited (NVLink itself keeps its catalog rate).
    pcie_link_fraction=0.84,
    source=(
        "defaults: compute curve = published A100 fp16 GEMM sweep (33% of peak at M=64, 62% at 128, "
        "78% at 256, 89% at 4096, 93% at 16k; SIZING.md s5); attention 0.6 of peak (FlashAttention-2: "
        "50-73% on A100; FlashAttention-3: 75% on H100); bandwidth 0.70 = batch-1 decode on A100-80GB "
        "(gpt-fast Llama-3.1-8B 0.69, LMDeploy Llama-2-7B 0.65 end to end; SIZING.md range 0.52-0.80); "
        "overhead 0.3 ms/step + 3 us/layer (SIZING.md: 0.1-1 ms + a few us/layer); two-GPU all-reduce "
        "alpha 7.5 us (SIZING.md: 5-10 us), longer rings by NCCL's ring model (15.0/7.8 at 8 GPUs); PCIe "
        "links at 0.84 of their rate between cards without NVLink (H100 p2p test: 380 of 450 GB/s). "
        "Uncalibrated for this GPU and precision."
    ),
)
