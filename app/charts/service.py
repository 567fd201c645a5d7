"""Charts of the sizing answers, as SVG: the roofline, the batching curve and the plan frontier.

Each chart runs the JSON endpoint's own service function and draws its answer; nothing here
recomputes a sizing number. Rendering uses matplotlib's SVG backend (no display), with everything
that could vary between runs pinned: the hash salt behind element ids, no date in the metadata,
text kept as text (fonttype "none": readable, searchable, testable) and a fixed 800 x 500 size.
Colours are the Okabe-Ito palette, told apart by marker and line style too, for colour-blind readers.
"""

from __future__ import annotations

import io
import math
import threading
from collections.abc import Callable, Sequence
from typing import Literal

import matplotlib
from matplotlib.axes import Axes
from matplotlib.axis import Axis
from matplotlib.backends.backend_svg import FigureCanvasSVG
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, MaxNLocator, NullFormatter, NullLocator
from sqlalchemy.orm import Session

from app.errors import Unprocessable
from app.estimates import inputs
from app.estimates import service as estimates
from app.estimates.schemas import BatchSweepRequest, BatchSweepResponse, RooflineRequest, RooflineResponse
from app.planning import service as planning
from app.planning.schemas import PlanOut, SloPlanRequest, SloPlanResponse
from app.sizing.layout import Layout

SVG_MEDIA_TYPE = "image/svg+xml"
WIDTH_PX, HEIGHT_PX = 800, 500
DPI = 100
FIGSIZE_IN = (WIDTH_PX / DPI, HEIGHT_PX / DPI)  # 8 x 5 in
SVG_POINTS_PER_INCH = 72  # matplotlib writes SVG sizes in points

# Okabe & Ito, "Color Universal Design" (2008): distinguishable under every common colour-vision deficiency.
BLACK, ORANGE, SKY_BLUE, GREEN, BLUE, VERMILLION = (
    "#000000", "#E69F00", "#56B4E9", "#009E73", "#0072B2", "#D55E00")
GREY = "#999999"

PlanMetric = Literal["tpot", "ttft"]

_RC = {
    "svg.hashsalt": "llm-sizing-charts",  # element ids from a fixed salt, not a random one
    "svg.fonttype": "none",  # text stays <text>: the browser draws it with the named fonts
    "text.parse_math": False,  # names come from clients: "$...$" is text, never (possibly invalid) TeX
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans", "Liberation Sans", "Arial"],
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "legend.fontsize": 9,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "axes.grid": True,
    "grid.color": "#dddddd",
    "grid.linewidth": 0.6,
    "axes.axisbelow": True,
}
# matplotlib is not thread-safe and rc_context swaps process-wide settings; endpoints run in a thread
# pool, so one chart is drawn at a time.
_render_lock = threading.Lock()


# Chart services: the JSON endpoint's answer, drawn -------------------------------------------

def roofline_chart(session: Session, request: RooflineRequest) -> bytes:
    """The GPU's roofline at the compute dtype with the request's prefill and decode steps on it."""
    prefill_request, decode_request = both_phases(request)
    prefill = estimates.roofline_step(session, prefill_request)
    decode = estimates.roofline_step(session, decode_request)
    gpu, _ = inputs.resolve_gpu(session, request)
    peak = gpu.peak_flops_per_s(prefill.compute_dtype)
    assert peak is not None  # resolve_precisions rejected a compute dtype the GPU lacks
    return draw_roofline(prefill, decode, peak, gpu.memory_bandwidth_bytes_per_s)


def batch_sweep_chart(session: Session, request: BatchSweepRequest) -> bytes:
    return draw_batch_sweep(estimates.batch_sweep(session, request))


def slo_plan_chart(session: Session, request: SloPlanRequest, metric: PlanMetric,
                   offload: planning.Offload = planning.in_this_thread) -> bytes:
    return draw_slo_plan(planning.plan_slo(session, request, offload=offload), metric)


def both_phases(request: RooflineRequest) -> tuple[RooflineRequest, RooflineRequest]:
    """A roofline request describes one step of a sequence; the chart shows both of its phases.

    A prefill of p prompt tokens after c cached ones is followed by decode steps at c + p tokens of
    context; a decode step at c tokens follows the prefill of a c-token prompt. Everything else (model,
    GPU, precisions, batch, TP, calibration) is shared. A disaggregated deployment's steps run on two pools
    (two GPUs, two rooflines): not drawn here.
    """
    if request.deployment != "aggregated":
        raise Unprocessable(
            "The chart draws one GPU's roofline; a disaggregated deployment's pools each have their own",
            errors=[("/body/deployment", "must be aggregated here (POST /v1/roofline answers both pools)")])
    if request.phase == "prefill":
        assert request.prompt_tokens is not None  # RooflineRequest requires it for prefill
        context = (request.context_tokens or 0) + request.prompt_tokens
        decode = request.model_copy(update={"phase": "decode", "prompt_tokens": None,
                                            "context_tokens": context})
        return request, decode
    assert request.context_tokens is not None  # RooflineRequest requires it for decode
    if request.context_tokens == 0:
        raise Unprocessable(
            "The chart's prefill point is the prompt that built the decode step's context; an empty context "
            "has none",
            errors=[("/body/context_tokens", "must be at least 1 (the chart prefills that many tokens)")])
    prefill = request.model_copy(update={"phase": "prefill", "prompt_tokens": request.context_tokens,
                                         "context_tokens": None})
    return prefill, request


# Drawing ---------------------------------------------------------------------------------

def draw_roofline(prefill: RooflineResponse, decode: RooflineResponse, peak_flops_per_s: float,
                  bandwidth_bytes_per_s: float) -> bytes:
    """Log-log roofline (HBM slope, compute roof, ridge point) with one point per phase at its
    arithmetic intensity and the FLOP/s its expected step time achieves, per GPU."""
    ridge = prefill.ridge_point
    assumptions = prefill.assumptions
    intensities = [prefill.arithmetic_intensity, decode.arithmetic_intensity, ridge]
    x_low, x_high = min(intensities) / 8, max(intensities) * 8
    peak_t = peak_flops_per_s / 1e12

    def roof(intensity: float) -> float:
        return min(peak_t, intensity * bandwidth_bytes_per_s / 1e12)

    def draw(fig: Figure) -> None:
        ax = fig.add_subplot()
        ax.set_xscale("log")
        ax.set_yscale("log")
        roof_x = [x_low, ridge, x_high]
        (line,) = ax.plot(roof_x, [roof(x) for x in roof_x], color=BLACK, linewidth=2,
                          label=f"roof: HBM {bandwidth_bytes_per_s / 1e12:,.2f} TB/s, "
                                f"{prefill.compute_dtype} peak {peak_t:,.1f} TFLOP/s")
        line.set_gid("roof")
        (ridge_marker,) = ax.plot([ridge], [peak_t], linestyle="none", marker="D", markersize=7, color=GREEN)
        ridge_marker.set_gid("ridge-point")
        ax.axvline(ridge, color=GREEN, linestyle=":", linewidth=1).set_gid("ridge-line")
        # Written towards the middle of the chart, so that it stays inside it.
        right_side = math.log(ridge / x_low) > 0.6 * math.log(x_high / x_low)
        ax.annotate(f"ridge point {_number(ridge)} FLOP/byte", (ridge, peak_t),
                    xytext=(-8 if right_side else 8, 8), textcoords="offset points", ha="right" if right_side else "left", color=BLACK,
                    gid="ridge-label")
        lows = [roof(x_low)]
        for step, color, marker in ((prefill, VERMILLION, "s"), (decode, BLUE, "o")):
            achieved = step.flops / (step.expected_time_ms / 1e3) / 1e12
            lows.append(achieved)
            (point,) = ax.plot([step.arithmetic_intensity], [achieved], linestyle="none", marker=marker,
                               markersize=9, color=color, label=_phase_legend(step))
            point.set_gid(f"point-{step.phase}")
            ax.annotate(step.phase, (step.arithmetic_intensity, achieved), xytext=(0, -16),
                        textcoords="offset points", ha="center", color=color, fontweight="bold",
                        gid=f"label-{step.phase}")
            # How far the expected step sits below what the roof allows at its intensity.
            ax.plot([step.arithmetic_intensity] * 2, [achieved, roof(step.arithmetic_intensity)], color=color,
                    linestyle=":", linewidth=1)
        ax.set_xlim(x_low, x_high)
        ax.set_ylim(min(lows) / 4, peak_t * 3)
        _plain_log_ticks(ax.xaxis)
        _plain_log_ticks(ax.yaxis)
        ax.set_xlabel("Arithmetic intensity (FLOP/byte)")
        ax.set_ylabel("Performance per GPU (TFLOP/s)")
        ax.set_title(f"Roofline: {_printable(prefill.model)} on {_printable(prefill.gpu)}\n"
                     f"compute {prefill.compute_dtype}, weights {assumptions.weight_dtype}, "
                     f"KV {assumptions.kv_dtype}; batch {prefill.batch_size:,}, {_step_layout(prefill)}")
        ax.legend(loc="lower right", framealpha=0.95)

    return _render(draw)


def _phase_legend(step: RooflineResponse) -> str:
    if step.phase == "prefill":
        what = f"prefill {step.prompt_tokens:,} tokens"
        if step.context_tokens:
            what += f" after {step.context_tokens:,}"
    else:
        what = f"decode at {step.context_tokens:,} tokens"
    return (f"{what}: {_number(step.arithmetic_intensity)} FLOP/byte, {step.bound}-bound, "
            f"{_number(step.expected_time_ms)} ms expected")


def draw_batch_sweep(sweep: BatchSweepResponse) -> bytes:
    """Aggregate and per-user decode tokens/s against batch size (log x), ideal and expected, with
    the knee marked (or why there is none) and the batches whose KV cache does not fit shaded."""
    batches = [point.batch_size for point in sweep.points]
    knee = sweep.knee_batch_size
    x_low, x_high = min(batches[0], knee or batches[0]), max(batches[-1], knee or 0)  # the knee on the axis
    x_limits = (x_low / 1.3, x_high * 1.3)
    assumptions = sweep.assumptions

    def draw(fig: Figure) -> None:
        top, bottom = fig.subplots(2, 1, sharex=True)
        panels = ((top, "aggregate", "Aggregate (tokens/s)", BLUE, "o",
                   [p.expected_tokens_per_s for p in sweep.points],
                   [p.ideal_tokens_per_s for p in sweep.points]),
                  (bottom, "per-user", "Per user (tokens/s)", ORANGE, "s",
                   [p.expected_tokens_per_s_per_user for p in sweep.points],
                   [p.ideal_tokens_per_s_per_user for p in sweep.points]))
        for ax, name, label, color, marker, expected, ideal in panels:
            ax.set_xscale("log")
            (line,) = ax.plot(batches, expected, color=color, marker=marker, markersize=5, linewidth=2,
                              label="expected")
            line.set_gid(f"{name}-expected")
            (line,) = ax.plot(batches, ideal, color=color, linestyle="--", linewidth=1,
                              label="ideal (roofline)")
            line.set_gid(f"{name}-ideal")
            ax.set_ylabel(label)
            ax.set_ylim(bottom=0, top=max(ideal + expected) * 1.15)
            ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}"))
            if knee is not None:
                ax.axvline(knee, color=VERMILLION, linestyle=":", linewidth=1.5).set_gid(f"knee-{name}")
            _shade_unfit(ax, name, sweep, x_limits[1])
        top.legend(loc="best", framealpha=0.95)
        if knee is not None:
            # On whichever side of the line has more room (log scale).
            room_left = math.log(knee / x_limits[0]) > math.log(x_limits[1] / knee)
            top.annotate(f"knee: batch {knee:,} (compute-bound from here)", (knee, 0.5),
                         xycoords=("data", "axes fraction"), xytext=(-6 if room_left else 6, 0),
                         textcoords="offset points", ha="right" if room_left else "left", color=VERMILLION,
                         gid="knee-label")
        else:
            top.text(0.97, 0.08, "no knee: memory-bound at every batch", transform=top.transAxes, ha="right",
                     color=VERMILLION, backgroundcolor="white", gid="knee-label")
        bottom.set_xlim(*x_limits)
        if len(batches) <= 16:
            bottom.xaxis.set_major_locator(FixedLocator(batches))
            bottom.xaxis.set_minor_locator(NullLocator())
            bottom.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}"))
        else:
            _plain_log_ticks(bottom.xaxis)
        bottom.set_xlabel("Batch size (concurrent sequences)")
        top.set_title(f"Decode batching: {_printable(sweep.model)} on {_printable(sweep.gpu)}\n"
                      f"compute {sweep.compute_dtype}, weights {assumptions.weight_dtype}, "
                      f"KV {assumptions.kv_dtype}; {sweep.context_tokens:,} cached tokens per sequence, "
                      f"{_step_layout(sweep)}")

    return _render(draw)


def _shade_unfit(ax: Axes, name: str, sweep: BatchSweepResponse, x_end: float) -> None:
    """Shade from the first batch whose weights and KV exceed one GPU's memory."""
    unfit = [point.batch_size for point in sweep.points if not point.fits_in_gpu_memory]
    if unfit:
        ax.axvspan(unfit[0], x_end, color=GREY, alpha=0.2, hatch="//", linewidth=0,
                   label="weights + KV exceed GPU memory").set_gid(f"unfit-{name}")


def draw_slo_plan(plan: SloPlanResponse, metric: PlanMetric) -> bytes:
    """Cost per hour against the plans' TPOT or TTFT at the SLO percentile, the Pareto plans
    highlighted and labelled, and the SLO target as a vertical line."""
    slo = plan.slo
    percentile = f"p{slo.percentile:g}"
    metric_name = metric.upper()
    target_ms = slo.tpot_ms if metric == "tpot" else slo.ttft_ms
    pareto_ranks = {point.rank for point in plan.pareto}
    plotted = [(p, ms) for p in plan.plans
               if p.cost_per_hour_usd is not None and (ms := _latency(p, metric)) is not None]
    frontier = sorted(((p, ms) for p, ms in plotted if p.rank in pareto_ranks), key=lambda item: item[1])
    others = [(p, ms) for p, ms in plotted if p.rank not in pareto_ranks]
    left_out = len(plan.plans) - len(plotted)
    x_high = max([ms for _, ms in plotted] + [target_ms]) * 1.25

    def draw(fig: Figure) -> None:
        ax = fig.add_subplot()
        for kind, marker, color, label in (("aggregated", "o", SKY_BLUE, "other plans"),
                                           ("disaggregated", "s", GREEN, "other plans, prefill/decode pools")):
            kind_plans = [(p, ms) for p, ms in others if p.deployment == kind]
            if kind_plans:
                (points,) = ax.plot([ms for _, ms in kind_plans], [p.cost_per_hour_usd for p, _ in kind_plans],
                                    linestyle="none", marker=marker, markersize=6, color=color, label=label)
                points.set_gid("plans" if kind == "aggregated" else "plans-disaggregated")
        if frontier:
            # Joined in latency order; the frontier is the plan's own (cost against E2E), not refitted
            # here, so the legend says so: on this axis the points are at their TTFT or TPOT.
            (line,) = ax.plot([ms for _, ms in frontier], [p.cost_per_hour_usd for p, _ in frontier],
                              color=VERMILLION, marker="D", markersize=8, linewidth=1.5,
                              label=f"Pareto (cost vs E2E) at their {metric_name}")
            line.set_gid("frontier")
            split = [(p, ms) for p, ms in frontier if p.deployment == "disaggregated"]
            if split:  # frontier plans with separate prefill and decode pools, ringed
                (ringed,) = ax.plot([ms for _, ms in split], [p.cost_per_hour_usd for p, _ in split],
                                    linestyle="none", marker="s", markersize=13, markerfacecolor="none",
                                    markeredgecolor=GREEN, markeredgewidth=1.5,
                                    label="prefill/decode pools (disaggregated)")
                ringed.set_gid("frontier-disaggregated")
            for p, ms in frontier:
                ax.annotate(f"#{p.rank}", (ms, p.cost_per_hour_usd), xytext=(6, 6),
                            textcoords="offset points", fontsize=9, fontweight="bold", color=VERMILLION,
                            gid=f"frontier-rank-{p.rank}")
        ax.axvline(target_ms, color=BLACK, linestyle="--", linewidth=1.5,
                   label=f"SLO: {percentile} {metric_name} {target_ms:,g} ms").set_gid("slo-line")
        ax.set_xlim(0, x_high)
        ax.set_ylim(0, max((p.cost_per_hour_usd for p, _ in plotted), default=1.0) * 1.25)
        round_ticks(ax.xaxis)
        round_ticks(ax.yaxis, prefix="$")
        notes = []
        if not plan.feasible:
            notes.append(f"No plan meets the SLO ({len(plan.infeasible):,} configurations infeasible; "
                         "see /v1/slo-plan for the reasons)")
        if left_out:
            notes.append(f"{left_out:,} plan(s) without a price or a {metric_name} not shown")
        if notes:
            ax.text(0.02, 0.97, "\n".join(notes), transform=ax.transAxes, va="top", fontsize=9, gid="notes")
        ax.set_xlabel(f"{metric_name} at {percentile} (ms)")
        ax.set_ylabel("Cost per hour (USD)")
        targets = f"TTFT ≤ {slo.ttft_ms:,g} ms, TPOT ≤ {slo.tpot_ms:,g} ms"
        if slo.e2e_ms is not None:
            targets += f", E2E ≤ {slo.e2e_ms:,g} ms"
        shown = (f"\nGPUs {_listing(sorted({p.gpu for p in plan.plans}))}; "  # what the plans drawn run on
                 f"weights {_listing(sorted({p.weight_dtype for p in plan.plans}))}; "
                 f"KV {_listing(sorted({p.kv_dtype for p in plan.plans}))}") if plan.plans else ""
        ax.set_title(f"SLO plan: {_printable(plan.model)} at {percentile} {targets}{shown}")
        # The legend, and what each frontier plan is, in a column right of the axes: never over a point.
        fig.subplots_adjust(right=0.64)
        handles, labels = ax.get_legend_handles_labels()
        for p, _ in sorted(frontier, key=lambda item: item[0].rank):
            handles.append(Line2D([], [], linestyle="none"))
            labels.append(_plan_label(p))
        ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0,
                  fontsize=8.5, handlelength=1.5, frameon=False)

    return _render(draw)


def _latency(plan: PlanOut, metric: PlanMetric) -> float | None:
    percentiles = plan.predicted.tpot if metric == "tpot" else plan.predicted.ttft
    return percentiles.at_slo_percentile_ms


def _step_layout(step: RooflineResponse | BatchSweepResponse) -> str:
    """A step's layout as the titles state it: "TP4", or "TP1 DP8 EP8" (one rank's batch under attention DP)."""
    layout = Layout(step.tensor_parallel, 1, step.data_parallel, step.expert_parallel)
    return layout.stage_label + (" (batch per rank)" if layout.data_parallel > 1 else "")


def _plan_label(plan: PlanOut) -> str:
    if plan.disaggregation is not None:
        prefill, decode = plan.disaggregation.prefill, plan.disaggregation.decode
        return (f"#{plan.rank}: {prefill.workers} x {prefill.gpu} {prefill.layout} prefill + "
                f"{decode.workers} x {decode.gpu} {decode.layout} decode {plan.weight_dtype}, "
                f"${plan.cost_per_hour_usd:,.2f}/h")
    return f"#{plan.rank}: {plan.replicas} x {plan.gpu} {plan.layout} {plan.weight_dtype}, ${plan.cost_per_hour_usd:,.2f}/h"


def _listing(names: Sequence[str], most: int = 3) -> str:
    if not names:
        return "none"
    if len(names) > most:
        return f"{', '.join(names[:most])} and {len(names) - most:,} more"
    return ", ".join(names)


# Rendering -------------------------------------------------------------------------------

def _printable(label: str) -> str:
    """A client-given name as one line of text that XML can carry (no control characters)."""
    return "".join(char if char.isprintable() else "\ufffd" for char in label)


def _number(value: float) -> str:
    """Three significant figures without scientific notation: 1.03, 295, 12,345."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    decimals = max(0, 2 - math.floor(math.log10(abs(value))))
    return f"{value:,.{decimals}f}"


def round_ticks(axis: Axis, prefix: str = "") -> None:
    """Ticks 1, 2 or 5 x 10^k apart (matplotlib's default also steps by 2.5), labelled with their exact
    value: 2.5 never reads as $2."""
    axis.set_major_locator(MaxNLocator(nbins="auto", steps=[1, 2, 5, 10]))
    axis.set_major_formatter(FuncFormatter(lambda value, _: prefix + tick_label(value)))


def tick_label(value: float) -> str:
    """A tick value exactly, with thousands separators and no trailing zeros: 1,500, 2.5, 0.05."""
    text = f"{value:,.6f}".rstrip("0").rstrip(".")
    return "0" if text in ("", "-0") else text


def _plain_log_ticks(axis: Axis) -> None:
    # "1,000" rather than mathtext powers of ten: plain text reads better and searches as text.
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,g}" if value >= 1 else f"{value:g}"))
    # Unlabelled minor ticks at 2 and 5 per decade: enough to read a log scale, and every tick costs time.
    axis.set_minor_locator(LogLocator(base=10, subs=(2.0, 5.0)))
    axis.set_minor_formatter(NullFormatter())


def _render(draw: Callable[[Figure], None]) -> bytes:
    """Run `draw(figure)` on an 800 x 500 figure and return the deterministic SVG."""
    buffer = io.BytesIO()
    with _render_lock, matplotlib.rc_context(_RC):
        figure = Figure(figsize=FIGSIZE_IN, dpi=DPI)
        # Fixed margins fit the two-line titles and the axis labels at this size; a layout engine would
        # find the same ones and double the time to draw.
        figure.subplots_adjust(left=0.1, right=0.975, bottom=0.1, top=0.885, hspace=0.08)
        FigureCanvasSVG(figure)
        draw(figure)
        figure.savefig(buffer, format="svg", metadata={"Date": None})
    return _pixel_size(buffer.getvalue())


def _pixel_size(svg: bytes) -> bytes:
    """matplotlib sizes an SVG in points (8 in = 576 pt, which a browser shows as 768 px); give it the
    intended 800 x 500 px, the viewBox scaling the drawing to fit."""
    width_pt = FIGSIZE_IN[0] * SVG_POINTS_PER_INCH
    height_pt = FIGSIZE_IN[1] * SVG_POINTS_PER_INCH
    size_in_points = f'width="{width_pt:g}pt" height="{height_pt:g}pt"'.encode()
    if svg.count(size_in_points) != 1:
        raise RuntimeError("unexpected SVG header from matplotlib")  # a matplotlib upgrade changed its output
    return svg.replace(size_in_points, f'width="{WIDTH_PX}" height="{HEIGHT_PX}"'.encode(), 1)
