"""The serving engines the service models, one module each (`vllm`, `sglang`, `trtllm`, `generic`), behind
the `Engine` protocol of `base`. `ENGINES` is the registry; `resolve_engine` fills a configuration's
defaults from its engine."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from app.sizing.engines import generic, sglang, trtllm, vllm
from app.sizing.engines.base import (
    DEFAULT_GRAPH_SETUP,
    SPECULATIVE_KINDS,
    Engine,
    GraphSetup,
    ResolvedEngine,
    parse_version,
)
from app.sizing.hardware.comm import FFN_ALL_GATHER
from app.sizing.hardware.efficiency import Efficiency
from app.sizing.layout import Layout, LayoutProblem
from app.sizing.layout import layout_problems as generic_layout_problems
from app.sizing.model.params import SPLIT_BEFORE_LAST
from app.sizing.model.recipes import RECIPES, WeightRecipe
from app.sizing.specs import KV_DTYPES, GpuSpec, ModelSpec

ENGINES: dict[str, Engine] = {engine.name: engine for engine in (vllm.ENGINE, sglang.ENGINE, trtllm.ENGINE,
                                                                 generic.ENGINE)}


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """What the caller set; None = the engine's default (filled in by `engines.resolve_engine`)."""

    engine: str = "vllm"
    engine_version: str | None = None  # None: the engine's `default_version`
    gpu_memory_utilization: float | None = None
    reserved_bytes_per_gpu: int | None = None
    activation_bytes_per_gpu: int | None = None
    non_torch_bytes_per_gpu: int | None = None
    cuda_graph_bytes_per_gpu: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    block_size: int | None = None
    max_model_len: int | None = None
    # The speculative decoding the engine runs beside the model, which some engines reserve memory for:
    # DRAFT_MODEL (a separate draft model), EAGLE (a draft head) or NGRAM (prompt lookup); None: none.
    speculative: str | None = None
    # A prefill or decode worker of a disaggregated deployment (the engines' rules that differ for one apply:
    # SGLang runs no piecewise CUDA graphs there, so sets no memory aside for them).
    disaggregated: bool = False

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"unknown engine {self.engine!r}; expected one of {list(ENGINES)}")
        if self.speculative not in (None, *SPECULATIVE_KINDS):
            raise ValueError(f"unknown speculative decoding {self.speculative!r}; expected one of {SPECULATIVE_KINDS}")
        if self.engine_version is not None:
            parse_version(self.engine_version)
        if self.gpu_memory_utilization is not None and not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")
        for name in ("reserved_bytes_per_gpu", "activation_bytes_per_gpu", "non_torch_bytes_per_gpu",
                     "cuda_graph_bytes_per_gpu"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0")
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "max_model_len"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1")



def layout_problems(model: ModelSpec, layout: Layout, engine: str | None = None,
                    gpus_per_node: int | None = None, weights: WeightRecipe | None = None,
                    speculative: str | None = None) -> list[LayoutProblem]:
    """Every rule `layout` breaks: the generic ones (`layout.layout_problems`), then the engine's own (with
    `weights`, the checkpoint recipe's too; with `speculative`, the speculative decoding's)."""
    problems = generic_layout_problems(model, layout, gpus_per_node)
    if engine is not None:
        problems += ENGINES[engine].layout_problems(model, layout, weights, speculative)
    return problems


def gpu_problems(engine: str | None, gpu: GpuSpec) -> list[str]:
    """Why `engine` cannot run on `gpu` at all (its maker; `Engine.gpu_vendors`): [] where it can, or where the
    GPU's maker is not stated (an inline spec without one)."""
    vendors = ENGINES[engine].gpu_vendors if engine is not None else ()
    if not vendors or not gpu.vendor or gpu.vendor in vendors:
        return []
    named = gpu.name or gpu.slug or "the GPU (unnamed)"
    return [f"{engine} runs on {' or '.join(vendors)} GPUs only, and {named} is {gpu.vendor}'s"]


def pipeline_split(engine: str | None) -> str:
    """How `engine` deals leftover layers to pipeline stages (`Engine.pipeline_split`); vLLM's where none is named."""
    return ENGINES[engine].pipeline_split if engine is not None else SPLIT_BEFORE_LAST


def dense_over_attention_dp(engine: str | None) -> bool:
    """Whether `engine` splits dense MLPs and shared experts over all tp x dp GPUs under attention data parallelism:
    where every feed-forward block spans them (`Engine.moe_exchange` is `comm.FFN_ALL_GATHER`); False (each rank
    keeps them) where none is named."""
    return engine is not None and ENGINES[engine].moe_exchange == FFN_ALL_GATHER


def resolve_version(config: EngineConfig) -> tuple[str, str]:
    """The engine version whose rules apply, and where it came from (a given release outside those the engine
    reference covers says whose rules it gets: the nearest covered release's)."""
    rules = ENGINES[config.engine]
    if config.engine_version is None:
        return rules.default_version, rules.default_version_source
    first, last = rules.covered_versions
    at = parse_version(config.engine_version)
    if first and at < parse_version(first):
        return config.engine_version, (f"given; older than any {rules.name} release the engine reference covers "
                                       f"({first} to {last}): {first}'s rules apply")
    if last and at > parse_version(last):
        return config.engine_version, (f"given; newer than any {rules.name} release the engine reference covers "
                                       f"({first} to {last}): {last}'s rules apply")
    return config.engine_version, "given"


def published_run_kv_dtype(engine: str, weight_dtype: str, version: str | None = None) -> str:
    """The KV dtype of a published run that does not state it: the engine's default for the checkpoint its
    published runs of that weight dtype serve (TensorRT-LLM's fp8/fp4 runs: ModelOpt exports, which cache
    in fp8), or for the checkpoint recipe named instead of a dtype, at the run's engine `version` (None: the
    engine's default version); 16-bit otherwise."""
    rules = ENGINES[engine]
    checkpoint = weight_dtype if weight_dtype in RECIPES else dict(rules.published_checkpoints).get(weight_dtype)
    dtype, _ = rules.kv_dtype(version or rules.default_version, RECIPES[checkpoint] if checkpoint else None, "bf16")
    return dtype if dtype in KV_DTYPES else "bf16"


def host_adjusted(efficiency: Efficiency, engine: str | None, version: str = "",
                  pipeline_parallel: int = 1, prefill_pool: bool = False, decode_pool: bool = False, *,
                  data_parallel: int = 1, speculative: str | None = None, vendor: str = "NVIDIA") -> Efficiency:
    """The efficiency an engine runs at (`HostRules.adjusted` under `host_rules`, in the deployment's
    `GraphSetup`); `engine` None: the GPU's own time, each engine-dependent overhead zero."""
    setup = GraphSetup(data_parallel, pipeline_parallel, speculative, vendor, prefill_pool or decode_pool)
    return host_rules(engine, version, setup).adjusted(efficiency, pipeline_parallel, prefill_pool, decode_pool)


@dataclass(frozen=True, slots=True)
class HostRules:
    """How an engine at a version pays the engine-dependent overheads of an efficiency (`host_rules`)."""

    host_work: bool  # per-sequence host work added to every step (`Engine.overlaps_host_work` false)
    overlapped_host: bool  # host work overlapped with the GPU (`Engine.overlaps_host_work`)
    prefill_overhead: bool  # steps with prompt tokens run outside CUDA graphs (`Engine.graphs_prefill_steps` false)
    hidden_in_pipeline: bool  # `Engine.overlaps_host_work_in_pipeline`
    hidden_in_prefill_pool: bool  # `Engine.overlaps_host_work_in_prefill_pool`

    def adjusted(self, efficiency: Efficiency, pipeline_parallel: int = 1, prefill_pool: bool = False,
                 decode_pool: bool = False) -> Efficiency:
        """The efficiency this engine runs at: its per-sequence host overhead kept only where the engine does
        not overlap host work with the GPU, its overlapped host work only where it does, its overhead per MoE
        layer of a step with prompt tokens only where such steps run outside CUDA graphs; each zero
        elsewhere. Where the engine hides host work under the GPU's step, its per-step overhead and
        overlapped per-sequence work are the least a step lasts (`Efficiency.step_overhead_overlapped`), not
        time added to it; with `pipeline_parallel` stages an engine may not (`hidden_in_pipeline`), and each
        micro-batch's step then pays them on top; nor may it on a disaggregated deployment's prefill workers
        (`prefill_pool`, `hidden_in_prefill_pool`). An engine that does not overlap host work at all adds the
        per-step overhead of its serial loop instead (`Efficiency.serial_step_s`). What a disaggregated decode
        worker's step costs beyond an aggregated one's (`Efficiency.decode_worker_step_overhead_s`) is kept on a
        decode pool's workers (`decode_pool`) alone, under any engine; and those workers never pay the cost per
        MoE layer of a prompt step: a request reaches them with its prompt's KV cache and first token, and joins
        the decode batch, which the engines replay as CUDA graphs (TensorRT-LLM's generation-only requests;
        `disaggregation.decode_role_requests` times its first step as the one-token step it is)."""
        serial_step = self.host_work and efficiency.serial_step_s != efficiency.per_step_overhead_s
        prefill_overhead = self.prefill_overhead and not decode_pool
        decode_step = efficiency.decode_worker_step_overhead_s != 0 and not decode_pool
        if (efficiency.per_sequence_overhead_s == 0 and efficiency.overlapped_host_per_sequence_s == 0
                and efficiency.prefill_moe_layer_overhead_s == 0 and efficiency.per_step_overhead_s == 0
                and not serial_step and not decode_step):
            return efficiency  # nothing engine-dependent to keep, drop or move
        hidden = self.overlapped_host and (pipeline_parallel == 1 or self.hidden_in_pipeline) and (
            not prefill_pool or self.hidden_in_prefill_pool)
        if ((self.host_work or efficiency.per_sequence_overhead_s == 0)
                and (self.overlapped_host or efficiency.overlapped_host_per_sequence_s == 0)
                and (prefill_overhead or efficiency.prefill_moe_layer_overhead_s == 0)
                and hidden == efficiency.step_overhead_overlapped and not serial_step and not decode_step):
            return efficiency
        return _without(efficiency, self.host_work, self.overlapped_host, prefill_overhead, hidden, decode_pool)


NO_ENGINE = HostRules(host_work=False, overlapped_host=False, prefill_overhead=False, hidden_in_pipeline=False,
                      hidden_in_prefill_pool=False)  # the GPU's own time: no engine loop around its steps


@lru_cache(maxsize=256)
def host_rules(engine: str | None, version: str = "", setup: GraphSetup = DEFAULT_GRAPH_SETUP) -> HostRules:
    """The engine's rules at `version` ("": its default) in the deployment `setup`; `NO_ENGINE` for None.
    Cached: every /v1/capacity request and every configuration a plan screens adjusts an efficiency (measured
    per `host_adjusted` call: 6.8-8.6 us reading the four rules each time, 1.7-1.9 us cached)."""
    if engine is None:
        return NO_ENGINE
    rules = ENGINES[engine]
    overlaps = rules.overlaps_host_work(version)
    return HostRules(host_work=not overlaps, overlapped_host=overlaps,
                     prefill_overhead=not rules.graphs_prefill_steps(version, setup),
                     hidden_in_pipeline=rules.overlaps_host_work_in_pipeline(version),
                     hidden_in_prefill_pool=rules.overlaps_host_work_in_prefill_pool(version))


@lru_cache(maxsize=64)
def _without(efficiency: Efficiency, host_work: bool, overlapped_host: bool, prefill_overhead: bool,
             hidden: bool, decode_pool: bool) -> Efficiency:
    # One per profile entry: a plan screens a hundred configurations with the same few efficiencies.
    return replace(efficiency, per_sequence_overhead_s=efficiency.per_sequence_overhead_s if host_work else 0.0,
                   per_step_overhead_s=efficiency.serial_step_s if host_work else efficiency.per_step_overhead_s,
                   overlapped_host_per_sequence_s=(efficiency.overlapped_host_per_sequence_s if overlapped_host
                                                   else 0.0),
                   prefill_moe_layer_overhead_s=efficiency.prefill_moe_layer_overhead_s if prefill_overhead else 0.0,
                   decode_worker_step_overhead_s=efficiency.decode_worker_step_overhead_s if decode_pool else 0.0,
                   step_overhead_overlapped=hidden)


def total_memory(gpu: GpuSpec) -> tuple[int, str]:
    """What an engine sizes from: the total CUDA reports (SIZING.md section 7; vLLM and TensorRT-LLM read
    torch.cuda.mem_get_info, ENGINES.md 1.1 and 1.3; SGLang applies its fraction to the memory torch finds free,
    1.2, though the driver's total picks the fraction), the driver's where the catalog has not measured it."""
    if gpu.cuda_memory_bytes is not None:
        return gpu.cuda_memory_bytes, "the memory CUDA reports (torch.cuda.mem_get_info), from the catalog"
    return gpu.memory_bytes, ("the driver's total: what CUDA reports is not measured for this GPU, and is lower "
                              "by what the driver reserves (0.46 GiB on H100)")


def with_running_limit(engine: ResolvedEngine, kv_tokens: int) -> ResolvedEngine:
    """`engine` with one scheduler's running-sequence limit as its engine applies it to a pool of `kv_tokens`
    (`Engine.running_limit`): derived from the pool where the engine's default is, a given one capped where the
    engine caps it (the cap named in its source)."""
    limit = ENGINES[engine.engine].running_limit(engine.max_num_seqs, kv_tokens, engine.max_model_len)
    if limit == engine.max_num_seqs:
        return engine
    if engine.max_num_seqs is None:
        return replace(engine, max_num_seqs=limit)
    sources = tuple((name, f"{source} ({engine.max_num_seqs}); {engine.engine} caps it at its request pool: "
                           f"{limit} requests for {kv_tokens:,} KV tokens" if name == "max_num_seqs" else source)
                    for name, source in engine.sources)
    return replace(engine, max_num_seqs=limit, sources=sources)


def resolve_engine(config: EngineConfig, model: ModelSpec, gpu: GpuSpec, tensor_parallel: int,
                   pipeline_parallel: int = 1, model_dtype_bytes: int = 2, data_parallel: int = 1) -> ResolvedEngine:
    """Fill in every default of `config` for this model, GPU and parallel layout, naming each source
    ("given" for what the caller set). `model_dtype_bytes`: the unquantized parts' dtype (2; 4 for a model
    served in fp32), which sizes vLLM's logits. With `data_parallel` attention ranks, max_num_batched_tokens
    is one rank's scheduler's: the replica's divided among them where the engine does so."""
    if min(tensor_parallel, pipeline_parallel, data_parallel) < 1:
        raise ValueError("tensor_parallel, pipeline_parallel and data_parallel must be >= 1")
    if config.max_model_len is not None and config.max_model_len > model.max_position_embeddings:
        raise ValueError(f"max_model_len {config.max_model_len} exceeds the model's "
                         f"{model.max_position_embeddings} positions")
    rules = ENGINES[config.engine]
    version, version_source = resolve_version(config)
    settings = rules.defaults(config, model, gpu, tensor_parallel, pipeline_parallel, version, model_dtype_bytes,
                              data_parallel)
    settings["max_model_len"] = (model.max_position_embeddings, "the model's max_position_embeddings")
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name, (default, source) in settings.items():
        given = getattr(config, name)
        values[name], sources[name] = (default, source) if given is None else (given, "given")
    if data_parallel > 1 and rules.divides_limits_by_dp:
        values["max_num_batched_tokens"] = max(1, values["max_num_batched_tokens"] // data_parallel)
        sources["max_num_batched_tokens"] += (f"; per attention rank: the replica's {config.engine} chunk divided by "
                                              f"its {data_parallel} data-parallel ranks")
        if values["max_num_seqs"] is not None:
            values["max_num_seqs"] = max(1, values["max_num_seqs"] // data_parallel)
            sources["max_num_seqs"] += (f"; per attention rank: the replica's {config.engine} limit divided by its "
                                        f"{data_parallel} data-parallel ranks")
    total, sources["total_bytes_per_gpu"] = total_memory(gpu)
    sources["engine_version"] = version_source
    return ResolvedEngine(
        engine=config.engine,
        engine_version=version,
        total_bytes_per_gpu=total,
        gpu_memory_utilization=float(values["gpu_memory_utilization"]),
        utilization_of=rules.utilization_of,
        reserved_bytes_per_gpu=int(values["reserved_bytes_per_gpu"]),
        activation_bytes_per_gpu=int(values["activation_bytes_per_gpu"]),
        non_torch_bytes_per_gpu=int(values["non_torch_bytes_per_gpu"]),
        cuda_graph_bytes_per_gpu=int(values["cuda_graph_bytes_per_gpu"]),
        max_num_seqs=None if values["max_num_seqs"] is None else int(values["max_num_seqs"]),
        max_num_batched_tokens=int(values["max_num_batched_tokens"]),
        block_size=int(values["block_size"]),
        max_model_len=int(values["max_model_len"]),
        kv_allocation=rules.kv_allocation,
        sources=tuple(sources.items()),
    )
