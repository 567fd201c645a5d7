"""/v1/slo-plan: the request turned into the planner's inputs, and its plans into the response."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol, TypeVar

from sqlalchemy.orm import Session

from app.calibration.held_out_schemas import HeldOutErrorOut
from app.calibration.profiles import HeldOutErrors, profile_snapshot
from app.catalog.schemas import gpu_spec_from_schema, model_spec_from_schema
from app.catalog.service import get_gpu_spec, get_model_hf_id, get_model_spec, list_gpu_specs
from app.errors import NotFound, Unprocessable
from app.estimates.inputs import (
    INLINE_GPU_LABEL,
    INLINE_MODEL_LABEL,
    default_kv_dtype,
    efficiency_out,
    kv_transfer_out,
    published_checkpoint,
    served_dtype,
)
from app.planning.checks import check_plan_parallelism, closed_loop_notes, draft_notes
from app.planning.schemas import (
    DisaggregationOut,
    HistogramLengths,
    InfeasibleOut,
    InlineGpuIn,
    LaunchOut,
    LoadPerReplicaOut,
    LognormalLengths,
    ParetoPointOut,
    PercentilesOut,
    PlanAssumptionsOut,
    PlanOut,
    PoolOut,
    PredictionOut,
    SearchOut,
    SloPlanAssumptions,
    SloPlanRequest,
    SloPlanResponse,
    SpeculativeIn,
    WorkloadIn,
)
from app.sizing import CALCULATION_VERSION
from app.sizing.calibration.fit import CalibrationProfile
from app.sizing.engines import ENGINES
from app.sizing.engines.base import LaunchSpec, ResolvedEngine
from app.sizing.engines.launch import launch_command
from app.sizing.hardware.efficiency import Efficiency
from app.sizing.hardware.roofline import default_compute_dtype
from app.sizing.layout import KIND_DISAGGREGATED
from app.sizing.serving import disaggregated_loop, disaggregation
from app.sizing.serving import plan as plan_core
from app.sizing.serving.disaggregation import NVLINK, DisaggregatedPlan, DisaggregatedResult, Pool
from app.sizing.serving.plan import DECODE_POOL, PREFILL_POOL
from app.sizing.serving.speculative import SpeculativeDecoding
from app.sizing.serving.workload import Fixed, Histogram, LengthDistribution, LogNormal, Workload
from app.sizing.specs import GpuSpec, ModelSpec

# /v1/slo-plan

SLO_PLAN_FORMULAS = (
    ("replicas = ceil(load x peak_to_mean_ratio / (max load per replica x max_utilization_ratio)) + "
     "extra_replicas; the load is requests_per_s (an open loop) or concurrent_users (a closed loop), and "
     "the max load the highest simulated per-replica load (requests/s, or users) meeting every SLO at the percentile"),
    ("GPUs = replicas x tensor_parallel x pipeline_parallel x data_parallel; nodes: tensor parallelism stays "
     "inside one node and replicas smaller than a node share nodes"),
    ("cost per hour = GPUs x price per GPU-hour; $ per million output tokens = cost per hour / (output tokens per "
     "hour at the mean load: requests_per_s x mean output tokens, or a closed loop's users at their simulated pace) "
     "x 1e6 (the fleet is sized for the peak and paid for every hour)"),
    ("TPOT = (E2E - TTFT) / (output tokens - 1), per request; percentiles over the simulated requests after the "
     "first 10 % (warm-up)"),
    ("TPOT floor = one decode step at batch 1 attending the median prompt; TTFT floor = the percentile prompt "
     "prefilled alone; both prune configurations before any simulation"),
    ("speculative decoding: tokens per target pass = (1 - a^(k+1)) / (1 - a); a pass costs k draft decode steps "
     "plus one target pass over k + 1 tokens per sequence"),
)
SLO_PLAN_TPOT_DEFINITION = ("TPOT = (E2E - TTFT) / (output tokens - 1) per request: the mean gap between output "
                            "tokens after the first (harnesses that divide E2E by all output tokens report less)")
# Lognormal lengths are drawn up to this quantile: an unbounded tail would ask for absurd contexts.
LOGNORMAL_CLIP_QUANTILE = 0.9999
INLINE_MODEL_ID = "/path/to/model"  # an inline architecture has no repository id


class PlanSources(Protocol):
    """Where a plan reads catalog rows and its calibration profile: the database (`DatabaseSources`), or
    a stored quote's snapshot (to reproduce the quote from nothing but itself)."""

    def model(self, slug: str) -> tuple[ModelSpec, str]:
        """The model's spec and its Hugging Face id (its slug when it has none)."""

    def gpu(self, slug: str) -> GpuSpec: ...

    def all_gpus(self) -> list[GpuSpec]:
        """Every catalog GPU, ordered by slug."""

    def profile(self, name: str | None) -> CalibrationProfile:
        """The named calibration profile; None = the default."""

    def profile_document(self, name: str | None) -> dict[str, Any]:
        """The whole of the profile `profile(name)` resolved: entries and provenance (`profile_snapshot`)."""


class DatabaseSources:
    """Today's catalog and profiles. Remembers the profile documents it resolved (for a quote's snapshot)."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.profile_documents: dict[str | None, dict[str, Any]] = {}

    def model(self, slug: str) -> tuple[ModelSpec, str]:
        return get_model_spec(self.session, slug), get_model_hf_id(self.session, slug) or slug

    def gpu(self, slug: str) -> GpuSpec:
        return get_gpu_spec(self.session, slug)

    def all_gpus(self) -> list[GpuSpec]:
        return list_gpu_specs(self.session)

    def profile(self, name: str | None) -> CalibrationProfile:
        profile, self.profile_documents[name] = profile_snapshot(self.session, name)
        return profile

    def profile_document(self, name: str | None) -> dict[str, Any]:
        return self.profile_documents[name]


T = TypeVar("T")


def at_pointer(pointer: str, lookup: Callable[[str], T], slug: str) -> T:
    """`lookup(slug)`, its 404 pointing at where the request named the slug."""
    try:
        return lookup(slug)
    except NotFound as exc:
        raise NotFound(exc.detail, errors=[(pointer, message) for _, message in exc.errors]
                       or [(pointer, exc.detail)]) from None


# Runs a search, `offload(search, *arguments)`: in this thread (`in_this_thread`), or in a worker process
# (`app.planning.pool.PlanPool.call`).
Offload = Callable[..., Any]


def in_this_thread(search: Callable[..., T], *arguments: Any) -> T:
    return search(*arguments)


def plan_slo(session: Session, request: SloPlanRequest, sources: PlanSources | None = None, *,
             offload: Offload = in_this_thread) -> SloPlanResponse:
    """The cheapest deployments meeting the request's SLO (see `app.sizing.serving.plan`), over the
    catalog and profiles of `sources` (default: the database of `session`). The searches (aggregated,
    disaggregated) run through `offload`."""
    sources = sources or DatabaseSources(session)
    if request.model_spec is not None:
        model = model_spec_from_schema(request.model_spec, pointer="/body/model_spec")
        label, model_id = INLINE_MODEL_LABEL, INLINE_MODEL_ID
    else:
        assert request.model is not None  # ModelRef guarantees exactly one of the two
        (model, model_id), label = sources.model(request.model), request.model
    candidates = request.candidates
    defaults: list[str] = []
    if candidates.gpus is None:
        gpus = sources.all_gpus()
        defaults.append(f"gpus = every catalog GPU ({len(gpus)})")
    else:
        gpus = [at_pointer(f"/body/candidates/gpus/{candidates.gpus.index(slug)}", sources.gpu, slug)
                for slug in dict.fromkeys(candidates.gpus)]
    if candidates.gpus == [] and not candidates.gpu_specs:
        raise Unprocessable("no candidate GPUs: list catalog gpus, give gpu_specs, or leave gpus null (every "
                            "catalog GPU)", errors=[("/body/candidates/gpus", "no candidate GPUs")])
    inline_gpus, inline_prices = _inline_gpus(candidates.gpu_specs or [], {gpu.slug for gpu in gpus})
    gpus = [*gpus, *inline_gpus]
    check_plan_parallelism(model, candidates, gpus)
    weight_dtypes = candidates.weight_dtypes
    if weight_dtypes is None:
        weight_dtypes = [served_dtype(model)]
        defaults.append(f"weight_dtypes = [{weight_dtypes[0]}] (the model's published dtype)")
    for dtype in weight_dtypes:  # a dtype the model ships in one checkpoint is planned as that checkpoint
        defaults += published_checkpoint(model, dtype)[1]
    kv_dtypes = candidates.kv_dtypes
    if kv_dtypes is None:
        kv_dtype, why = default_kv_dtype(model)
        kv_dtypes = [kv_dtype]
        defaults.append(f"kv_dtypes = [{kv_dtype}] ({why})")
    if candidates.tensor_parallel is None:
        defaults.append("tensor_parallel = every degree that splits the heads, KV heads and widths evenly, up to "
                        "each GPU's node size")
        if model.is_moe and candidates.data_parallel is None and candidates.expert_parallel is None:
            defaults.append("layouts of an MoE model: also attention DP + EP (TP1 DPg EPg) and TP + EP (TPg EPg) at "
                            "each of those GPU counts g > 1 that the engine accepts")
    if candidates.pipeline_parallel is None:
        defaults.append("pipeline_parallel = 1" + (
            ", and where one node of a GPU cannot hold the weights, a full node's TP in the fewest stages across "
            "nodes that hold them (and twice as many)" if plan_core.adds_pipelines_across_nodes(
                None, candidates.data_parallel, candidates.expert_parallel) else ""))
        if model.is_moe and plan_core.searches_layouts_across_nodes(
                candidates.tensor_parallel, candidates.pipeline_parallel, candidates.data_parallel,
                candidates.expert_parallel):
            defaults.append("where one node of a GPU cannot hold an MoE model's weights, also attention DP + EP "
                            "(TP1 DPg EPg) over the fewest whole nodes that hold them (and twice as many)")
    for knob in ("max_num_seqs", "max_num_batched_tokens"):
        if getattr(candidates, knob) is None:
            defaults.append(f"{knob} = the {candidates.engine} default")
    prices = dict(candidates.gpu_price_per_hour_usd or {})
    for slug in prices.keys() - {gpu.slug for gpu in gpus}:
        raise Unprocessable(f"a price is given for {slug!r}, which is not among the candidate GPUs",
                            errors=[(f"/body/candidates/gpu_price_per_hour_usd/{slug}", "not a candidate GPU")])
    for slug in prices.keys() & inline_prices.keys():
        raise Unprocessable(f"{slug!r} is an inline GPU: give its price in its spec",
                            errors=[(f"/body/candidates/gpu_price_per_hour_usd/{slug}", "inline GPU")])
    prices.update(inline_prices)
    workload = _plan_workload(request.workload, model)
    speculative, draft, draft_id = _plan_speculation(sources, request.speculative)
    try:
        configurations = plan_core.configurations(
            model, gpus, candidates.tensor_parallel, candidates.pipeline_parallel, weight_dtypes, kv_dtypes,
            candidates.max_num_seqs or [None], candidates.max_num_batched_tokens or [None],
            data_parallel=candidates.data_parallel, expert_parallel=candidates.expert_parallel,
            engine=candidates.engine)
    except plan_core.SearchSpaceTooLarge as exc:
        raise Unprocessable(str(exc), errors=[("/body/candidates", str(exc))]) from None
    compute_dtypes = [*weight_dtypes, *([draft.weight_dtype] if draft is not None else [])]
    efficiencies, profiles = _plan_efficiencies(sources.profile(request.calibration), gpus, compute_dtypes)
    validation = (sources.profile_document(request.calibration).get("provenance") or {}).get("cross_validation")
    held_out = HeldOutErrors(validation, None if request.model_spec is not None else model_id, candidates.engine)
    slo = request.slo
    try:
        inputs = plan_core.PlanInputs(
            model=model, workload=workload, efficiencies=efficiencies, engine=candidates.engine,
            slo=plan_core.Slo(ttft_s=slo.ttft_ms / 1e3, tpot_s=slo.tpot_ms / 1e3,
                              e2e_s=None if slo.e2e_ms is None else slo.e2e_ms / 1e3,
                              percentile=slo.percentile, goodput_ratio=slo.goodput_ratio),
            peak_to_mean_ratio=request.workload.peak_to_mean_ratio,
            policy=plan_core.HaPolicy(request.ha_policy.extra_replicas, request.ha_policy.max_utilization_ratio),
            prices=prices, speculative=speculative, draft=draft, seed=request.seed,
            simulated_requests=request.simulated_requests)
    except ValueError as exc:
        raise Unprocessable(str(exc), errors=[("/body/workload", str(exc))]) from None
    deployment = candidates.deployment
    notes: list[str] = [] if draft is None else draft_notes(model, draft.model)
    if deployment != AGGREGATED and request.speculative is not None:
        raise Unprocessable("disaggregated plans are not modelled with speculative decoding",
                            errors=[("/body/candidates/deployment", "aggregated only with speculative decoding")])
    aggregated = offload(plan_core.plan, inputs, configurations) if deployment != DISAGGREGATED else None
    plan_pools = (disaggregated_loop.plan_closed_loop if inputs.workload.is_closed_loop
                  else disaggregation.plan_disaggregated)
    disaggregated = offload(plan_pools, inputs, configurations) if deployment != AGGREGATED else None
    if aggregated is not None and disaggregated is not None:
        notes.append(_comparison_note(aggregated, disaggregated))
    if aggregated is not None and aggregated.plans:
        notes += closed_loop_notes(inputs.workload, disaggregated is not None)
    ranked: list[plan_core.Plan | disaggregation.DisaggregatedPlan] = sorted(
        [*(aggregated.plans if aggregated else ()), *(disaggregated.plans if disaggregated else ())], key=_rank_key)
    max_model_len = plan_core.max_model_len(inputs)
    plans = [_plan_out(rank, plan, model, model_id, profiles, request, draft_id, max_model_len, held_out)
             if isinstance(plan, plan_core.Plan) else
             _disaggregated_out(rank, plan, model, model_id, profiles, request, max_model_len, inputs, held_out)
             for rank, plan in enumerate(ranked, start=1)]
    pareto = plan_core.plan_frontier(ranked)
    infeasible = [*(aggregated.infeasible if aggregated else ()), *(disaggregated.infeasible if disaggregated else ())]
    stats = aggregated.stats if aggregated is not None else None
    simulations = (stats.simulations if stats else 0) + (disaggregated.simulations if disaggregated else 0)
    simulated_requests = ((stats.simulated_requests if stats else 0)
                          + (disaggregated.simulated_requests if disaggregated else 0))
    return SloPlanResponse(
        feasible=bool(ranked), model=label, slo=slo, plans=plans,
        pareto=[ParetoPointOut(rank=index + 1, cost_per_hour_usd=ranked[index].cost_per_hour_usd,
                               gpus=ranked[index].gpus,
                               e2e_ms_at_slo_percentile=ranked[index].e2e_at_slo_percentile_s * 1e3,
                               deployment=DISAGGREGATED if isinstance(ranked[index], disaggregation.DisaggregatedPlan)
                               else AGGREGATED)
                for index in pareto],
        infeasible=[InfeasibleOut(gpu=item.configuration.gpu.slug, tensor_parallel=item.configuration.tensor_parallel,
                                  pipeline_parallel=item.configuration.pipeline_parallel,
                                  data_parallel=item.configuration.data_parallel,
                                  expert_parallel=item.configuration.expert_parallel,
                                  weight_dtype=item.configuration.weight_dtype, kv_dtype=item.configuration.kv_dtype,
                                  max_num_seqs=item.configuration.max_num_seqs,
                                  max_num_batched_tokens=item.configuration.max_num_batched_tokens,
                                  reasons=list(item.reasons))
                    for item in infeasible],
        search=SearchOut(
            configurations_considered=len(configurations), configuration_limit=plan_core.MAX_CONFIGURATIONS,
            screened_out=stats.screened_out if stats else 0, bounded_out=stats.bounded_out if stats else 0,
            simulated=stats.simulated if stats else 0,
            infeasible_in_simulation=stats.infeasible_in_simulation if stats else 0,
            simulator_runs=simulations, simulated_requests=simulated_requests,
            requests_per_run=inputs.simulated_requests, seed=inputs.seed),
        assumptions=SloPlanAssumptions(
            calibration_profiles=sorted(set(profiles.values())), engine=candidates.engine,
            load_model=_load_model_text(request.workload, deployment), tpot_definition=SLO_PLAN_TPOT_DEFINITION,
            formulas=list(SLO_PLAN_FORMULAS) + (list(DISAGGREGATION_FORMULAS) if disaggregated else []),
            defaults_used=defaults,
            notes=[*(aggregated.notes if aggregated else ()), *notes, *_workload_notes(request.workload)]),
        calculation_version=CALCULATION_VERSION,
    )


def _inline_gpus(specs: Sequence[InlineGpuIn], catalog_slugs: set[str]) -> tuple[list[GpuSpec], dict[str, float]]:
    """The request's inline GPUs as specs (checked like catalog rows: a 422 naming the field), and their
    prices, which the plan reports as given in the request. Nothing is stored."""
    gpus: list[GpuSpec] = []
    for index, spec in enumerate(specs):
        pointer = f"/body/candidates/gpu_specs/{index}"
        if spec.slug in catalog_slugs:
            raise Unprocessable(f"the inline GPU {spec.slug!r} has the slug of a candidate catalog GPU",
                                errors=[(f"{pointer}/slug", "already a candidate catalog GPU")])
        gpu = gpu_spec_from_schema(spec, pointer=pointer, slug=spec.slug)
        gpus.append(replace(gpu, name=spec.name or f"{spec.slug} ({INLINE_GPU_LABEL})"))
    return gpus, {spec.slug: spec.price_per_hour_usd for spec in specs}


def _plan_lengths(lengths: Any, pointer: str, cap: int) -> LengthDistribution:
    """The request's lengths as a core distribution; lognormals clipped at LOGNORMAL_CLIP_QUANTILE."""
    try:
        if isinstance(lengths, int):
            return Fixed(lengths)
        if isinstance(lengths, HistogramLengths):
            return Histogram(tuple(lengths.bins))
        statistics = {"mean": lengths.mean, "p50": lengths.p50, "p90": lengths.p90, "p99": lengths.p99}
        fitted = LogNormal(**statistics, max_tokens=cap)
        return LogNormal(**statistics, max_tokens=max(1, min(cap, math.ceil(fitted.quantile(LOGNORMAL_CLIP_QUANTILE)))))
    except ValueError as exc:
        raise Unprocessable(str(exc), errors=[(pointer, str(exc))]) from None


def _plan_workload(workload: WorkloadIn, model: ModelSpec) -> Workload:
    """The core workload; a lognormal answer keeps a position for the prompt, a lognormal prompt leaves
    room for the longest answer (a request longer than the model is a 422, from `PlanInputs`)."""
    positions = model.max_position_embeddings
    output_tokens = _plan_lengths(workload.output_tokens, "/body/workload/output_tokens", max(1, positions - 1))
    longest_answer = math.ceil(output_tokens.quantile(1.0))
    return Workload(
        input_tokens=_plan_lengths(workload.input_tokens, "/body/workload/input_tokens",
                                   max(1, positions - longest_answer)),
        output_tokens=output_tokens,
        requests_per_s=workload.requests_per_s, concurrent_users=workload.concurrent_users,
        arrival_cv=workload.arrival_cv, prefix_cache_hit_rate=workload.prefix_cache_hit_rate,
        shared_prefix_tokens=workload.shared_prefix_tokens, think_time_s=workload.think_time_s)


def _plan_speculation(sources: PlanSources, speculative: SpeculativeIn | None,
                      ) -> tuple[SpeculativeDecoding | None, plan_core.DraftModel | None, str | None]:
    """(speculation, draft model, the draft's Hugging Face id) from the request."""
    if speculative is None:
        return None, None, None
    spec = SpeculativeDecoding(speculative.draft_tokens, speculative.acceptance_rate,
                               has_draft_model=speculative.draft_model is not None)
    if speculative.draft_model is None:
        return spec, None, None
    draft_model, draft_id = at_pointer("/body/speculative/draft_model", sources.model, speculative.draft_model)
    draft_dtype = served_dtype(draft_model)
    return spec, plan_core.DraftModel(draft_model, draft_dtype), draft_id


def _plan_efficiencies(profile: CalibrationProfile, gpus: Sequence[GpuSpec], weight_dtypes: Sequence[str],
                       ) -> tuple[dict[tuple[str, str], Efficiency], dict[tuple[str, str], str]]:
    """The efficiency under `profile` (and the profile's name) for every GPU x compute dtype the weights imply."""
    efficiencies: dict[tuple[str, str], Efficiency] = {}
    profiles: dict[tuple[str, str], str] = {}
    for gpu in gpus:
        for weight_dtype in weight_dtypes:
            try:
                compute_dtype = default_compute_dtype(gpu, weight_dtype)
            except ValueError:
                continue  # the plan reports the configuration infeasible, with the reason
            key = (gpu.slug, compute_dtype)
            if key not in efficiencies:
                efficiencies[key] = profile.efficiency_for(gpu.family, compute_dtype, gpu.vendor)
                profiles[key] = profile.name
    return efficiencies, profiles


def _load_model_text(workload: WorkloadIn, deployment: str) -> str:
    if workload.concurrent_users is not None:
        pools = ("" if deployment == AGGREGATED else "; a disaggregated deployment is sized as the open loop of the "
                 "users' rate (users / (mean request time + think time), Little's law): its pools simulated with "
                 "Poisson arrivals at the rate it was sized for")
        replicas = "" if deployment == DISAGGREGATED else "; every replica is simulated with its share of the users"
        sends = f"{workload.think_time_s:g} s on average after" if workload.think_time_s else "the moment"
        return (f"closed loop: {workload.concurrent_users} users, each sending the next request {sends} the last one "
                f"finishes{replicas}{pools}")
    if workload.arrival_cv == 1:
        return (f"open loop: the fleet is sized for {workload.requests_per_s:g} req/s x peak-to-mean ratio "
                f"{workload.peak_to_mean_ratio:g}; every replica is simulated with a Poisson stream of its share")
    return (f"open loop: the fleet is sized for {workload.requests_per_s:g} req/s x peak-to-mean ratio "
            f"{workload.peak_to_mean_ratio:g}; the fleet receives a Gamma renewal stream (gaps with coefficient of "
            f"variation {workload.arrival_cv:g}) dealt out at random over its N schedulers (replicas x attention "
            f"data-parallel ranks x pipeline micro-batches), so each is simulated with its share at a coefficient of "
            f"variation of sqrt(1 + ({workload.arrival_cv:g}^2 - 1) / N)")


def _workload_notes(workload: WorkloadIn) -> list[str]:
    if any(isinstance(lengths, LognormalLengths) for lengths in (workload.input_tokens, workload.output_tokens)):
        return [(f"lognormal lengths are drawn up to their {LOGNORMAL_CLIP_QUANTILE:.2%} quantile (and the model's "
                 "context); max_model_len covers the longest prompt plus the longest answer")]
    return []


def _percentiles_out(percentiles: plan_core.Percentiles) -> PercentilesOut:
    def ms(seconds: float) -> float | None:
        return None if math.isnan(seconds) else seconds * 1e3

    return PercentilesOut(p50_ms=ms(percentiles.p50_s), p95_ms=ms(percentiles.p95_s), p99_ms=ms(percentiles.p99_s),
                          at_slo_percentile_ms=ms(percentiles.at_slo_percentile_s))


def _prediction_out(predicted: plan_core.Prediction) -> PredictionOut:
    return PredictionOut(
        load_per_replica=predicted.load, ttft=_percentiles_out(predicted.ttft), tpot=_percentiles_out(predicted.tpot),
        e2e=_percentiles_out(predicted.e2e), goodput_ratio=predicted.goodput_ratio,
        requests_per_s=predicted.requests_per_s, output_tokens_per_s=predicted.output_tokens_per_s,
        preemptions=predicted.preemptions)


def _assumptions_out(efficiency: Efficiency, profile: str, engine: ResolvedEngine, tokens_per_pass: float | None,
                     held_out_error: HeldOutErrorOut | None) -> PlanAssumptionsOut:
    """What a plan assumed: its efficiencies and their profile, each engine setting and where its value came from."""
    return PlanAssumptionsOut(
        efficiency=efficiency_out(efficiency, profile), tokens_per_pass=tokens_per_pass,
        engine_settings=[f"{name} = {getattr(engine, name)} ({source})" for name, source in engine.sources],
        held_out_error=held_out_error)


def _plan_out(rank: int, plan: plan_core.Plan, model: ModelSpec, model_id: str,
              profiles: dict[tuple[str, str], str], request: SloPlanRequest, draft_id: str | None,
              max_model_len: int, held_out: HeldOutErrors) -> PlanOut:
    configuration, engine, predicted = plan.configuration, plan.engine, plan.predicted
    gpu = configuration.gpu
    speculative = request.speculative
    launch = _launch(configuration, engine, model, model_id, max_model_len,
                     None if speculative is None else speculative.draft_tokens, draft_id)
    return PlanOut(
        rank=rank, **_replica_fields(configuration, engine, plan.compute_dtype, max_model_len,
                                     plan.kv_tokens_per_replica),
        load_per_replica=LoadPerReplicaOut(
            unit=plan.load_kind, offered=plan.offered_load_per_replica, max_verified=plan.max_load_per_replica,
            failing=plan.failing_load_per_replica, analytic_ceiling=plan.ceiling_load_per_replica),
        replicas=plan.replicas, extra_replicas=plan.extra_replicas,
        gpus_per_replica=configuration.gpus_per_replica, gpus=plan.gpus, nodes=plan.nodes,
        price_per_gpu_hour_usd=plan.price_per_gpu_hour_usd, price_source=plan.price_source,
        cost_per_hour_usd=plan.cost_per_hour_usd,
        cost_per_million_output_tokens_usd=plan.cost_per_million_output_tokens_usd,
        output_tokens_per_s=plan.output_tokens_per_s, output_tokens_per_s_per_gpu=plan.output_tokens_per_s_per_gpu,
        utilization_ratio=plan.utilization_ratio,
        predicted=_prediction_out(predicted),
        meets_slo=plan.meets_slo, binding_constraint=plan.binding_constraint, binding_detail=plan.binding_detail,
        launch=launch,
        assumptions=_assumptions_out(plan.efficiency, profiles[(gpu.slug, plan.compute_dtype)], engine,
                                     plan.tokens_per_pass, held_out.out(configuration.layout.kind, [gpu.slug])),
    )


def _replica_fields(configuration: plan_core.Configuration, engine: ResolvedEngine, compute_dtype: str,
                    max_model_len: int, kv_tokens: int) -> dict[str, Any]:
    """The plan fields that describe one replica (or one decode worker): hardware, layout, precisions and
    the engine's settings."""
    layout = configuration.layout
    gpu = configuration.gpu
    return {
        "gpu": gpu.slug, "gpu_name": gpu.name, "tensor_parallel": configuration.tensor_parallel,
        "pipeline_parallel": configuration.pipeline_parallel, "data_parallel": layout.data_parallel,
        "expert_parallel": layout.expert_parallel, "moe_tensor_parallel": layout.moe_tensor_parallel,
        "layout": layout.label, "weight_dtype": configuration.weight_dtype, "kv_dtype": configuration.kv_dtype,
        "compute_dtype": compute_dtype, "engine": engine.engine, "max_num_seqs": engine.max_num_seqs,
        "max_num_batched_tokens": engine.max_num_batched_tokens, "block_size": engine.block_size,
        "gpu_memory_utilization_ratio": engine.gpu_memory_utilization, "max_model_len": max_model_len,
        "kv_tokens_per_replica": kv_tokens,
    }


def _launch(configuration: plan_core.Configuration, engine: ResolvedEngine, model: ModelSpec, model_id: str,
            max_model_len: int, draft_tokens: int | None = None, draft_model_id: str | None = None,
            role: str | None = None, kv_over_nvlink: bool = False) -> LaunchOut:
    """The engine's command for a replica, or for a disaggregated deployment's `role` worker."""
    launch = launch_command(LaunchSpec(
        engine=engine.engine, model_id=model_id, model_dtype=model.dtype,
        tensor_parallel=configuration.tensor_parallel, pipeline_parallel=configuration.pipeline_parallel,
        weight_dtype=configuration.weight_dtype, kv_dtype=configuration.kv_dtype, max_num_seqs=engine.max_num_seqs,
        max_num_batched_tokens=engine.max_num_batched_tokens, max_model_len=max_model_len,
        gpu_memory_utilization=engine.gpu_memory_utilization, draft_tokens=draft_tokens,
        draft_model_id=draft_model_id, data_parallel=configuration.data_parallel,
        expert_parallel=configuration.expert_parallel, nodes=plan_core.replica_nodes(configuration, 1)),
        role, kv_over_nvlink)
    return LaunchOut(command=launch.command, notes=list(launch.notes))


# Disaggregated plans ------------------------------------------------------------------------------

AGGREGATED = "aggregated"
DISAGGREGATED = "disaggregated"
DISAGGREGATION_FORMULAS = (
    ("disaggregated: decode workers = the fewest whose simulated TPOT meets the SLO at their share of the load; "
    "prefill workers = the fewest whose requests' TTFT = prefill queueing + prefill + KV transfer + the decode "
    "worker's first step meets it"),
    ("KV transfer = latency + prompt KV bytes on the most loaded decode GPU / per-GPU link bandwidth (NVLink inside "
    "one NVLink domain where the engine moves the KV over it, else the scale-out network: SGLang's Mooncake uses "
    "RDMA inside a node, NVLink only across an NVL72 with the variables its launch command then sets)"),
)


def _rank_key(plan: plan_core.Plan | DisaggregatedPlan) -> tuple[int, float, int, float, str]:
    """Priced plans cheapest first, then unpriced by GPU count; ties by E2E, then by name."""
    cost = plan.cost_per_hour_usd
    label = plan.configuration.label if isinstance(plan, plan_core.Plan) else plan.label
    return int(cost is None), cost or 0.0, plan.gpus, plan.e2e_at_slo_percentile_s, label


def _comparison_note(aggregated: plan_core.PlanResult, disaggregated: DisaggregatedResult) -> str:
    """Which kind of deployment wins, by how much, and why."""
    best_agg = min(aggregated.plans, key=_rank_key, default=None)
    best_dis = min(disaggregated.plans, key=_rank_key, default=None)
    if best_agg is None or best_dis is None:
        missing = "plan of either kind" if best_agg is best_dis else f"{'dis' if best_agg else ''}aggregated plan"
        return f"aggregated vs disaggregated: no {missing} meets the SLO"
    if best_agg.cost_per_hour_usd is None or best_dis.cost_per_hour_usd is None:
        return (f"aggregated vs disaggregated: {best_agg.gpus} GPUs against {best_dis.gpus} "
                "(unpriced: compared by GPU count)")
    agg_cost, dis_cost, transfer = best_agg.cost_per_hour_usd, best_dis.cost_per_hour_usd, best_dis.transfer
    if dis_cost == agg_cost:
        first = "disaggregated" if _rank_key(best_dis) < _rank_key(best_agg) else "aggregated"
        return (f"aggregated and disaggregated tie at ${agg_cost:,.2f}/h: the {first} plan ranks first (fewer GPUs, "
                "else the shorter E2E at the SLO percentile)")
    if dis_cost < agg_cost:
        return (f"disaggregated wins: ${dis_cost:,.2f}/h against ${agg_cost:,.2f}/h aggregated "
                f"({1 - dis_cost / agg_cost:.0%} less): decode steps no longer wait for prompt chunks, so each decode "
                f"worker runs a larger batch within the TPOT SLO, and the prefill pool is sized for prompts alone "
                f"(KV transfer {transfer.time_s * 1e3:.3g} ms per mean prompt over {transfer.link})")
    more = f" ({dis_cost / agg_cost - 1:.0%} more)" if agg_cost > 0 else ""  # GPUs may be priced at 0
    share = best_dis.prefill_share
    why = ("is a small share of the work", "so mixing it into decode steps costs little TPOT") if share <= 1 / 3 else (
        ("is most of the work", "so few decode steps are left for prompt chunks to slow") if share >= 2 / 3 else
        ("is much of the work", "and prompt chunks slow the decode steps less than the split costs"))
    return (f"aggregated wins: ${agg_cost:,.2f}/h against ${dis_cost:,.2f}/h disaggregated{more}: with prompts of "
            f"{transfer.prompt_tokens:,} tokens on average, prefill {why[0]} ({share:.0%} of the GPU time a "
            f"request takes in the disaggregated plan), {why[1]}, while separate pools each round up to whole "
            "workers, cannot lend idle capacity to each other and add a KV transfer "
            f"({transfer.time_s * 1e3:.3g} ms per mean prompt over {transfer.link}) to every TTFT")


def _pool_out(pool: Pool, model: ModelSpec, model_id: str, max_model_len: int, role: str,
              kv_over_nvlink: bool) -> PoolOut:
    configuration, engine, layout = pool.configuration, pool.engine, pool.configuration.layout
    launch = _launch(configuration, engine, model, model_id, max_model_len, role=role, kv_over_nvlink=kv_over_nvlink)
    return PoolOut(
        gpu=configuration.gpu.slug, gpu_name=configuration.gpu.name, tensor_parallel=configuration.tensor_parallel,
        pipeline_parallel=configuration.pipeline_parallel, data_parallel=layout.data_parallel,
        expert_parallel=layout.expert_parallel, moe_tensor_parallel=layout.moe_tensor_parallel, layout=layout.label,
        workers=pool.workers, extra_workers=pool.extra_workers, gpus=pool.gpus,
        load_per_worker_requests_per_s=pool.load_per_worker, users_per_worker=pool.users_per_worker,
        kv_tokens_per_worker=pool.kv_tokens_per_worker,
        max_num_seqs=engine.max_num_seqs, max_num_batched_tokens=engine.max_num_batched_tokens,
        cost_per_hour_usd=pool.cost_per_hour_usd, launch=launch)


def _disaggregated_out(rank: int, plan: DisaggregatedPlan, model: ModelSpec, model_id: str,
                       profiles: dict[tuple[str, str], str], request: SloPlanRequest, max_model_len: int,
                       inputs: plan_core.PlanInputs, held_out: HeldOutErrors) -> PlanOut:
    """A disaggregated plan: the per-replica fields describe one decode worker; GPUs and costs both pools."""
    decode, predicted = plan.decode, plan.decode_worker_prediction
    configuration, engine, gpu = decode.configuration, decode.engine, decode.configuration.gpu
    transfer = plan.transfer
    prefill_out, decode_out = (_pool_out(pool, model, model_id, max_model_len, role, transfer.link == NVLINK)
                               for pool, role in ((plan.prefill, PREFILL_POOL), (decode, DECODE_POOL)))
    # Verified: a decode worker's share with the spares down, as the prediction is timed (offered: every worker up).
    timed = decode.workers / (decode.workers - decode.extra_workers)
    if decode.users_per_worker is None:  # an open loop: a decode worker's share of the rate it was sized for
        unit, sized = "requests_per_s", decode.load_per_worker * timed
        offered = inputs.workload.requests_per_s * inputs.peak_to_mean_ratio / decode.workers  # type: ignore[operator]
    else:  # a closed loop: its share of the users, offered and sized for (over the utilization cap)
        unit, offered = "concurrent_users", decode.users_per_worker
        sized = offered * timed / inputs.policy.max_utilization_ratio
    return PlanOut(
        rank=rank, **_replica_fields(configuration, engine, decode.compute_dtype, max_model_len,
                                     decode.kv_tokens_per_worker),
        load_per_replica=LoadPerReplicaOut(
            unit=unit, offered=offered, max_verified=sized, failing=None, analytic_ceiling=decode.ceiling_per_worker),
        replicas=plan.prefill.workers + decode.workers, extra_replicas=plan.prefill.extra_workers + decode.extra_workers,
        gpus_per_replica=configuration.gpus_per_replica, gpus=plan.gpus,
        nodes=disaggregation.deployment_nodes(plan.prefill, decode),
        price_per_gpu_hour_usd=decode.price_per_gpu_hour_usd, price_source=decode.price_source,
        cost_per_hour_usd=plan.cost_per_hour_usd,
        cost_per_million_output_tokens_usd=plan.cost_per_million_output_tokens_usd,
        output_tokens_per_s=plan.output_tokens_per_s, output_tokens_per_s_per_gpu=plan.output_tokens_per_s / plan.gpus,
        utilization_ratio=offered / sized,
        predicted=_prediction_out(predicted),
        meets_slo=plan.meets_slo, binding_constraint=plan.binding_constraint, binding_detail=plan.binding_detail,
        launch=decode_out.launch,
        assumptions=_assumptions_out(decode.efficiency, profiles[(gpu.slug, decode.compute_dtype)], engine, None,
                                     held_out.out(KIND_DISAGGREGATED, [plan.prefill.configuration.gpu.slug, gpu.slug])),
        deployment=DISAGGREGATED,
        disaggregation=DisaggregationOut(
            prefill=prefill_out, decode=decode_out, router=ENGINES[engine.engine].disaggregation_router(),
            kv_transfer=kv_transfer_out(transfer)),
    )
