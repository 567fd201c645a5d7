"""A generic engine: usable = gpu_memory_utilization (default 0.9) × total, minus `reserved_bytes_per_gpu`
(default 0); nothing else is subtracted unless given, requests reserve their whole length at admission,
and there is no sequence limit and no command line."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.sizing.engines.base import (
    DEFAULT_GRAPH_SETUP,
    OF_TOTAL,
    RESERVE_AT_ADMISSION,
    Default,
    GraphSetup,
    LaunchSpec,
    model_dtype_kv,
)
from app.sizing.hardware.comm import PER_EXPERT
from app.sizing.layout import Layout, LayoutProblem
from app.sizing.model.params import SPLIT_BEFORE_LAST
from app.sizing.model.recipes import WeightRecipe
from app.sizing.specs import GpuSpec, ModelSpec

if TYPE_CHECKING:
    from app.sizing.engines import EngineConfig

GENERIC_GPU_MEMORY_UTILIZATION = 0.9
GENERIC_BLOCK_SIZE = 16
GENERIC_MAX_NUM_BATCHED_TOKENS = 8192


class Generic:
    name = "generic"
    default_version = ""
    default_version_source = "none"
    covered_versions = ("", "")
    published_checkpoints: tuple[tuple[str, str], ...] = ()
    published_decode_worker_block: int | None = None
    utilization_of = OF_TOTAL
    kv_allocation = RESERVE_AT_ADMISSION
    speculative_flags = False
    divides_limits_by_dp = False
    moe_exchange = PER_EXPERT
    gpu_vendors = ()
    pipeline_split = SPLIT_BEFORE_LAST

    def defaults(self, config: EngineConfig, model: ModelSpec, gpu: GpuSpec, tensor_parallel: int,
                 pipeline_parallel: int, version: str, model_dtype_bytes: int,
                 data_parallel: int = 1) -> dict[str, Default]:
        only_given = (0, "generic engine: only what is given is subtracted")
        return {
            "gpu_memory_utilization": (GENERIC_GPU_MEMORY_UTILIZATION, "generic default: 0.9 of total memory"),
            "max_num_seqs": (None, "generic engine: no limit"),
            "max_num_batched_tokens": (GENERIC_MAX_NUM_BATCHED_TOKENS, "generic default 8192 (prefill chunk)"),
            "block_size": (GENERIC_BLOCK_SIZE, "generic default block of 16 tokens"),
            "activation_bytes_per_gpu": only_given,
            "non_torch_bytes_per_gpu": only_given,
            "cuda_graph_bytes_per_gpu": only_given,
            "reserved_bytes_per_gpu": (0, "generic default: no reserve"),
        }

    def kv_dtype(self, version: str, recipe: WeightRecipe | None, model_dtype: str) -> tuple[str, str]:
        return model_dtype_kv(model_dtype)

    def running_limit(self, given: int | None, kv_tokens: int, max_model_len: int) -> int | None:
        return given  # None: no limit, a step's token budget is then the only cap on running sequences

    def mixes_prefill_into_decode(self) -> bool:
        return True

    def overlaps_host_work(self, version: str) -> bool:
        return True  # unknown engine: no host work added to a step (the per-step overhead is the least it lasts)

    def overlaps_host_work_in_pipeline(self, version: str) -> bool:
        return True  # unknown engine: as without pipeline stages

    def overlaps_host_work_in_prefill_pool(self, version: str) -> bool:
        return True  # unknown engine: as in an aggregated replica

    def graphs_prefill_steps(self, version: str, setup: GraphSetup = DEFAULT_GRAPH_SETUP) -> bool:
        return True  # unknown engine: nothing charged beyond the per-step and per-layer overheads

    def start_refusals(self, max_model_len: int, max_context_tokens: int, kv_tokens: int) -> tuple[str, ...]:
        return ()

    def launch_words(self, spec: LaunchSpec) -> list[str] | None:
        return None

    def launch_notes(self, spec: LaunchSpec) -> list[str]:
        return [("generic engine: set the same parallelism, batch limits and memory fraction in the engine "
                "you use")]

    def disaggregation_words(self, role: str) -> list[str]:
        return []

    def disaggregation_notes(self, role: str) -> list[str]:
        return [f"generic engine: run this worker in the engine's {role} role"]

    def disaggregation_router(self) -> str:
        return "the engine's own prefill/decode router"

    def kv_transfer_over_nvlink(self, gpu: GpuSpec, as_launched: bool) -> bool:
        return True  # no engine of its own: the GPUs' fastest link

    def disaggregation_env(self, kv_over_nvlink: bool) -> list[str]:
        return []

    def layout_problems(self, model: ModelSpec, layout: Layout, weights: WeightRecipe | None = None,
                        speculative: str | None = None) -> list[LayoutProblem]:
        return []  # no engine of its own: the generic rules only


ENGINE = Generic()
