"""The serving engines the service models, one module each (`vllm`, `sglang`, `trtllm`, `generic`), behind
the `Engine` protocol of `base`. `ENGINES` is the registry; `resolve_engine` fills a configuration's
defaults from its engine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.sizing.engines import generic, sglang, trtllm, vllm
from app.sizing.engines.base import Engine, ResolvedEngine
from app.sizing.layout import Layout, LayoutProblem
from app.sizing.layout import layout_problems as generic_layout_problems
from app.sizing.specs import GpuSpec, ModelSpec

ENGINES: dict[str, Engine] = {engine.name: engine for engine in (vllm.ENGINE, sglang.ENGINE, trtllm.ENGINE,
                                                                 generic.ENGINE)}


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """What the caller set; None = the engine's default (filled in by `engines.resolve_engine`)."""

    engine: str = "vllm"
    gpu_memory_utilization: float | None = None
    reserved_bytes_per_gpu: int | None = None
    activation_bytes_per_gpu: int | None = None
    non_torch_bytes_per_gpu: int | None = None
    cuda_graph_bytes_per_gpu: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    block_size: int | None = None
    max_model_len: int | None = None

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"unknown engine {self.engine!r}; expected one of {list(ENGINES)}")
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
                    gpus_per_node: int | None = None) -> list[LayoutProblem]:
    """Every rule `layout` breaks: the generic ones (`layout.layout_problems`), then the engine's own."""
    problems = generic_layout_problems(model, layout, gpus_per_node)
    if engine is not None:
        problems += ENGINES[engine].layout_problems(model, layout)
    return problems


def resolve_engine(config: EngineConfig, model: ModelSpec, gpu: GpuSpec, tensor_parallel: int,
                   pipeline_parallel: int = 1) -> ResolvedEngine:
    """Fill in every default of `config` for this model, GPU and parallel layout, naming each source
    ("given" for what the caller set)."""
    if tensor_parallel < 1 or pipeline_parallel < 1:
        raise ValueError("tensor_parallel and pipeline_parallel must be >= 1")
    if config.max_model_len is not None and config.max_model_len > model.max_position_embeddings:
        raise ValueError(f"max_model_len {config.max_model_len} exceeds the model's "
                         f"{model.max_position_embeddings} positions")
    rules = ENGINES[config.engine]
    settings = rules.defaults(config, model, gpu, tensor_parallel, pipeline_parallel)
    settings["max_model_len"] = (model.max_position_embeddings, "the model's max_position_embeddings")
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name, (default, source) in settings.items():
        given = getattr(config, name)
        values[name], sources[name] = (default, source) if given is None else (given, "given")
    return ResolvedEngine(
        engine=config.engine,
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
