"""SGLang: memory accounting, scheduler defaults and `sglang.launch_server` flags (ENGINES.md, SGLang).

usable = mem_fraction_static × total, which holds weights + KV pool only (the fraction is picked by nvidia-smi's
total, but SGLang applies it to the memory torch finds free before the weights load: total is what CUDA reports,
ENGINES.md 1.2); activations, CUDA graphs and
the context live in the (1 − fraction) that SGLang's own default rule sets aside, so they default to 0
here. The default fraction reproduces `ServerArgs._handle_gpu_memory_settings` of the release asked for, from
0.4.0 on (`sglang_mem_fraction_static`). The radix cache allocates token by token (page size 1), on demand.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.sizing.engines.base import (
    DEFAULT_GRAPH_SETUP,
    DRAFT_MODEL,
    EAGLE,
    MIB,
    OF_TOTAL,
    ON_DEMAND,
    Default,
    GraphSetup,
    LaunchSpec,
    checkpoint_kv,
    one_byte_kv_note,
    online_fp8,
    parse_version,
)
from app.sizing.hardware.comm import FFN_ALL_GATHER
from app.sizing.layout import DATA_PARALLEL, EXPERT_PARALLEL, PIPELINE_PARALLEL, Layout, LayoutProblem
from app.sizing.model.params import SPLIT_BEFORE_LAST
from app.sizing.model.recipes import WeightRecipe
from app.sizing.specs import GpuSpec, ModelSpec

if TYPE_CHECKING:
    from app.sizing.engines import EngineConfig

SGLANG_KV_FROM_CHECKPOINT = (0, 5, 5)
PIECEWISE_GRAPHS_FROM = (0, 5, 10)  # piecewise CUDA graphs on by default (ENGINES.md 1.2)
# The default mem_fraction_static's rule by release (ENGINES.md 1.2): by TP alone (0.4.0); the same up to 80 GiB
# and 13 GiB set aside above it (0.4.6); a reserve by GPU size and TP x PP (0.4.9, still in 0.5.2); a reserve
# by chunk and CUDA-graph batch (0.5.5 on). The reference covers no release between 0.5.2 and 0.5.5: 0.5.3 and
# 0.5.4 take the earlier rule.
LARGE_GPU_RESERVE_FROM = (0, 4, 6)
RESERVE_BY_GPU_SIZE_FROM = (0, 4, 9)
RESERVE_BY_CHUNK_FROM = (0, 5, 5)
# From 0.5.10 (piecewise CUDA graphs on by default) the reserve grows by 8 MiB per piecewise graph size on a
# model without MLA, by 1.5 GiB on one with MLA (ENGINES.md 1.2, SGL 0.5.10 `_handle_gpu_memory_settings`). The
# reference counts the sizes only in its worked example, 58 (H100, chunked_prefill_size 8192: 464 MiB).
PIECEWISE_GRAPH_SIZES = 58
PIECEWISE_MIB_PER_SIZE = 8
PIECEWISE_MLA_MIB = 1.5 * 1024
# What SGLang reserves for speculative decoding (ENGINES.md 1.2): 2 GiB for any in 0.4.9-0.5.2; from 0.5.5,
# 4 GiB for EAGLE and 6 GiB for a standalone draft model (the reference names no reserve for n-gram drafting).
SPECULATIVE_MIB_BEFORE_0_5_5 = 2 * 1024
SPECULATIVE_MIB = {EAGLE: 4 * 1024, DRAFT_MODEL: 6 * 1024}
# SGLang 0.5.23 changed the 20-35 GiB tier of its size defaults to chunks of 4096 and CUDA-graph batches of
# 48 (tp < 4) / 160 (ENGINES.md 1.2).
SMALL_TIER_CHANGED_FROM = (0, 5, 23)
# What moves the KV over multi-node NVLink (MNNVL) in an NVL72 instead of RDMA (ENGINES.md section 3,
# sgl-project/sglang `docs/advanced_features/pd_disaggregation.md` @08edc506; aux data stays on TCP).
MNNVL_ENV = ("SGLANG_MOONCAKE_CUSTOM_MEM_POOL=True", "MC_FORCE_MNNVL=True")
SGLANG_PAGE_SIZE = 1  # SGLang's default page_size: the radix cache allocates token by token
_FRACTION_SOURCE = "SGLang {version} default mem_fraction_static for this GPU size and TP x PP"
_MAX_RUNNING_SOURCE = ("SGLang default max_running_requests: min(KV tokens // 2, request pool of "
                       "clamp(KV tokens / context_len x 512, 2048, 4096))")


def piecewise_graphs(at: tuple[int, ...], setup: GraphSetup) -> bool:
    """Whether SGLang at release `at` runs piecewise CUDA graphs in `setup`: on by default from 0.5.10 (ENGINES.md
    1.2), and turned off under attention DP, pipeline stages, speculative decoding, PD disaggregation and on a
    non-CUDA GPU (AMD's HIP), among settings the service does not plan (SGL 0.5.10 `server_args.py`
    `_handle_piecewise_cuda_graph`, which runs before the memory settings: their piecewise reserve is then left
    out)."""
    cuda = setup.vendor.casefold() in ("", "nvidia")  # a maker not stated (an inline spec) is not refused
    return (at >= PIECEWISE_GRAPHS_FROM and setup.data_parallel == 1 and setup.pipeline_parallel == 1
            and setup.speculative is None and not setup.disaggregated and cuda)


def sglang_mem_fraction_static(gpu_memory_bytes: int, tensor_parallel: int, pipeline_parallel: int,
                               chunked_prefill_size: int | None, data_parallel: int = 1,
                               version: str | None = None, mla: bool = False,
                               speculative: str | None = None, vendor: str = "NVIDIA",
                               disaggregated: bool = False) -> tuple[float, int, int]:
    """SGLang's default mem_fraction_static, with the chunked_prefill_size and cuda_graph_max_bs it implies, at
    release `version` (None: the default version, 0.5.10; before 0.5.5: `_earlier_mem_fraction_static`), for
    a model with multi-head latent attention when `mla`, running `speculative` decoding (`EngineConfig`), on a GPU
    of `vendor`, as a worker of a disaggregated deployment when `disaggregated`.

    SGLang 0.5 (`ServerArgs._handle_gpu_memory_settings`), with GPU memory in MiB as the driver reports it:
    buckets by memory pick chunked_prefill_size and cuda_graph_max_bs (`_size_defaults`), then reserved = 512
    + 1.5·max(chunked_prefill_size, 2048) + 2·cuda_graph_max_bs + tp·pp/8·1024 MiB, from 0.5.10 plus the
    piecewise CUDA graphs' 8 MiB x 58 sizes (1.5 GiB with MLA) where it runs them (`piecewise_graphs`), at least
    10 GiB on GPUs over 60 GiB, then 4 GiB
    more for EAGLE or 6 GiB for a draft model, and fraction = round((mem − reserved)/mem, 3). H100 (81,559 MiB)
    at TP1: reserved 13,440 MiB, fraction 0.835 in 0.5.5; 13,904 MiB and 0.830 in 0.5.10 (ENGINES.md's worked
    example).

    With attention data parallelism (`data_parallel` ranks, `--enable-dp-attention`) SGLang's tp is the
    whole group, tensor_parallel · data_parallel GPUs, and it reserves 3·cuda_graph_max_bs·dp MiB more
    (another 1.5·cuda_graph_max_bs·dp when cuda_graph_max_bs > 300), from the replica's chunked_prefill_size
    before `_handle_data_parallelism` divides it among the ranks (ENGINES.md 1.2, SGL 0.5.5/0.5.10).
    """
    memory_mib = gpu_memory_bytes / MIB
    tensor_parallel *= data_parallel  # SGLang's --tp-size spans the attention data-parallel ranks
    at = parse_version(version if version is not None else ENGINE.default_version)
    if at < RESERVE_BY_CHUNK_FROM:
        return _earlier_mem_fraction_static(memory_mib, tensor_parallel, pipeline_parallel, chunked_prefill_size,
                                            data_parallel > 1, at, speculative is not None)
    chunk, graph_bs = _size_defaults(memory_mib, tensor_parallel, chunked_prefill_size, at)
    reserved_mib = (512 + 1.5 * max(chunk, 2048) + 2 * graph_bs
                    + tensor_parallel * pipeline_parallel / 8 * 1024)
    if data_parallel > 1:
        reserved_mib += graph_bs * data_parallel * (3 + (1.5 if graph_bs > 300 else 0))
    if piecewise_graphs(at, GraphSetup(data_parallel, pipeline_parallel, speculative, vendor, disaggregated)):
        reserved_mib += PIECEWISE_MLA_MIB if mla else PIECEWISE_GRAPH_SIZES * PIECEWISE_MIB_PER_SIZE
    if memory_mib > 60 * 1024:
        reserved_mib = max(reserved_mib, 10 * 1024)
    reserved_mib += SPECULATIVE_MIB.get(speculative or "", 0)
    return round((memory_mib - reserved_mib) / memory_mib, 3), chunk, graph_bs


def _size_defaults(memory_mib: float, tensor_parallel: int, chunked_prefill_size: int | None,
                   at: tuple[int, int, int]) -> tuple[int, int]:
    """SGLang's chunked_prefill_size (unless given) and cuda_graph_max_bs for the GPU's memory and its tp, as
    0.5.10 sets them (ENGINES.md 1.2); from 0.5.23 the 20-35 GiB tier takes 4096 and 48 / 160."""
    small_tier = (4096, 48, 160) if at >= SMALL_TIER_CHANGED_FROM else (2048, 24, 80)
    buckets = (  # (memory below, MiB; chunked_prefill_size; cuda_graph_max_bs at tp < 4; at tp >= 4)
        (20 * 1024, 2048, 8, 8),
        (35 * 1024, *small_tier),
        (60 * 1024, 4096, 32, 160),
        (90 * 1024, 8192, 256, 512),
        (160 * 1024, 8192, 256, 512),
        (float("inf"), 16384, 512, 512),
    )
    for limit, default_chunk, graph_bs_small_tp, graph_bs_large_tp in buckets:
        if memory_mib < limit:
            break
    chunk = chunked_prefill_size if chunked_prefill_size is not None else default_chunk
    return chunk, graph_bs_small_tp if tensor_parallel < 4 else graph_bs_large_tp


def _earlier_mem_fraction_static(memory_mib: float, tensor_parallel: int, pipeline_parallel: int,
                                 chunked_prefill_size: int | None, dp_attention: bool,
                                 at: tuple[int, int, int], speculative: bool = False) -> tuple[float, int, int]:
    """The default fraction of SGLang releases before 0.5.5 (ENGINES.md 1.2; `tensor_parallel` is SGLang's,
    the attention data-parallel ranks included):
    - 0.4.0: by TP alone, 0.88 at TP1, 0.87 from 2, 0.85 from 4, 0.81 from 8, 0.79 from 16;
    - 0.4.6: the same on GPUs of at most 80 GiB (81,920 MiB), above it (memory - 13 GiB) / memory;
    - 0.4.9 (to 0.5.2): (memory - reserved) / memory, reserved = (2.8 + tp·pp/10) GiB below 35 GiB,
      (9.5 + tp·pp/2) GiB below 90 GiB, (12 + tp·pp/2) GiB below 160 GiB, else 32 GiB; 4 GiB more under
      attention data parallelism, 2 GiB more with any `speculative` decoding.
    Fractions are rounded to three decimals, as SGLang does. Their chunk and CUDA-graph batch: 0.4.0's 8192
    tokens and 160 (2048 and 8 below 25 GB, taken as GiB: no catalog GPU lies between) before 0.4.9; from 0.4.9,
    for which the reference gives none, 0.5.10's buckets (`_size_defaults`)."""
    if at < RESERVE_BY_GPU_SIZE_FROM:
        small = memory_mib < 25 * 1024
        chunk = chunked_prefill_size if chunked_prefill_size is not None else (2048 if small else 8192)
        graph_bs = 8 if small else 160
        if at >= LARGE_GPU_RESERVE_FROM and memory_mib > 80 * 1024:
            return round((memory_mib - 13 * 1024) / memory_mib, 3), chunk, graph_bs
        by_tp = ((16, 0.79), (8, 0.81), (4, 0.85), (2, 0.87), (1, 0.88))
        return next(fraction for least, fraction in by_tp if tensor_parallel >= least), chunk, graph_bs
    chunk, graph_bs = _size_defaults(memory_mib, tensor_parallel, chunked_prefill_size, at)
    gpus = tensor_parallel * pipeline_parallel
    reserved_gib = (2.8 + gpus / 10 if memory_mib < 35 * 1024 else 9.5 + gpus / 2 if memory_mib < 90 * 1024
                    else 12 + gpus / 2 if memory_mib < 160 * 1024 else 32.0)
    reserved_gib += 4 if dp_attention else 0
    reserved_mib = reserved_gib * 1024 + (SPECULATIVE_MIB_BEFORE_0_5_5 if speculative else 0)
    return round((memory_mib - reserved_mib) / memory_mib, 3), chunk, graph_bs


def sglang_max_running_requests(kv_tokens: int, context_len: int, given: int | None = None) -> int:
    """One scheduler's running-request limit in SGLang, its request pool holding
    min(max(⌊tokens / context_len · 512⌋, 2048), 4096) slots: by default min(pool tokens // 2, slots) (SGLang 0.5
    tp_worker and model_runner; ENGINES.md 1.2), a `given` one (one rank's) capped at the slots (SGLang 0.5.10
    model_runner_kv_cache_mixin.py `_resolve_max_num_reqs`: "used as upper bound when user specifies
    max_running_requests")."""
    pool_slots = min(max(int(kv_tokens / context_len * 512), 2048), 4096)
    if given is not None:
        return min(given, pool_slots)
    return max(1, min(kv_tokens // 2, pool_slots))


class Sglang:
    name = "sglang"
    default_version = "0.5.10"
    # ENGINES.md 1.2 covers 0.5.23 too, but not the whole of its reserve: it names a DeepEP reserve and a
    # prefill server's and a PD-decode server's terms without sizing them, so a request that names no release
    # gets the latest whose reserve it states in full.
    default_version_source = ("the latest SGLang release whose memory reserve the engine reference states in full "
                              "(0.5.23 adds terms it does not size)")
    covered_versions = ("0.4.0", "0.5.23")  # ENGINES.md 1.2's table
    published_checkpoints: tuple[tuple[str, str], ...] = ()
    published_decode_worker_block: int | None = None
    utilization_of = OF_TOTAL
    kv_allocation = ON_DEMAND
    speculative_flags = False
    # `_handle_data_parallelism` divides chunked_prefill_size by dp_size under --enable-dp-attention, given
    # or default ("to avoid MoE kernel issues"; ENGINES.md 1.2, SGL 0.5.10 `server_args.py`).
    divides_limits_by_dp = True
    # Under --enable-dp-attention only attention is kept per rank: "MoE/FFN still spans all TP ranks" and
    # "shared experts/dense MLP follow TP (or --moe-dense-tp-size)", its TP group being the tp·dp GPUs; the a2a
    # backends (deepep, mooncake, ...) are opt-in (ENGINES.md section 2, SGL 0.5.10 `server_args.py`,
    # `layers/dp_attention.py`, the tp/dp/dp-attention explainer @51907e21). So every feed-forward block,
    # dense or MoE, gathers the ranks' tokens and reduce-scatters its sums back.
    moe_exchange = FFN_ALL_GATHER
    gpu_vendors = ()  # the reference names no GPU maker it refuses
    pipeline_split = SPLIT_BEFORE_LAST  # the reference states none: vLLM's assumed

    def defaults(self, config: EngineConfig, model: ModelSpec, gpu: GpuSpec, tensor_parallel: int,
                 pipeline_parallel: int, version: str, model_dtype_bytes: int,
                 data_parallel: int = 1) -> dict[str, Default]:
        fraction, chunk, graph_bs = sglang_mem_fraction_static(gpu.memory_bytes, tensor_parallel,
                                                               pipeline_parallel, config.max_num_batched_tokens,
                                                               data_parallel, version, model.is_mla,
                                                               config.speculative, gpu.vendor,
                                                               config.disaggregated)
        at = parse_version(version)  # as sglang_mem_fraction_static reads it
        setup = GraphSetup(data_parallel, pipeline_parallel, config.speculative, gpu.vendor, config.disaggregated)
        graphs = (", no piecewise CUDA graphs (off under attention DP, pipeline stages, speculative decoding, "
                  "PD disaggregation and on AMD)" if at >= PIECEWISE_GRAPHS_FROM and not piecewise_graphs(at, setup)
                  else "")
        outside = (0, "outside mem_fraction_static, in the share SGLang's default fraction sets aside")
        return {
            "gpu_memory_utilization": (fraction, (f"{_FRACTION_SOURCE.format(version=version)} "
                                                  f"(chunked_prefill_size {chunk}, cuda_graph_max_bs {graph_bs}"
                                                  + (f", speculative decoding: {config.speculative}"
                                                     if config.speculative else "") + graphs + ")")),
            "max_num_seqs": (None, _MAX_RUNNING_SOURCE),
            "max_num_batched_tokens": (chunk, "SGLang default chunked_prefill_size for this GPU size"),
            "block_size": (SGLANG_PAGE_SIZE, "SGLang default page_size 1"),
            "activation_bytes_per_gpu": outside,
            "non_torch_bytes_per_gpu": outside,
            "cuda_graph_bytes_per_gpu": outside,
            "reserved_bytes_per_gpu": (0, "none"),
        }

    def kv_dtype(self, version: str, recipe: WeightRecipe | None, model_dtype: str) -> tuple[str, str]:
        """'auto' becomes fp8_e4m3 for a ModelOpt kv_cache_quant_algo FP8 from 0.5.5 (SGL 0.5.10
        model_runner.py configure_kv_cache_dtype; absent in 0.5.2)."""
        return checkpoint_kv("SGLang", version, recipe, model_dtype, since=SGLANG_KV_FROM_CHECKPOINT)

    def running_limit(self, given: int | None, kv_tokens: int, max_model_len: int) -> int | None:
        return sglang_max_running_requests(kv_tokens, max_model_len, given)

    def mixes_prefill_into_decode(self) -> bool:
        """No: SGLang's scheduler runs a prefill batch (chunks of `chunked_prefill_size` tokens) whenever one
        can be formed and the running decodes wait for it; decodes join prefill batches only under
        `--enable-mixed-chunk`, off by default (SGLang `managers/scheduler.py` `get_next_batch_to_run`,
        `server_args.py` `enable_mixed_chunk`). aiconfigurator's benchmark rule turns it on for an aggregated
        worker (aiconfigurator 0.12.0 `generator/rule_plugin/benchmark/sglang.rule`), but predicting the published
        SGLang runs (all of them AIC_SILICON_SAMPLE's, aggregated ones with mixed batches) so, held out by GPU on
        H100, H200, B200 and GB200 (2026-12-07), raised SGLang's TTFT error from 45.4% to 62.7% and its TPOT error
        from 12.6% to 16.8% (those four GPUs' rows from 18.5% to 19.9%): they read as the default."""
        return False

    def overlaps_host_work(self, version: str) -> bool:
        return True  # the overlap scheduler (default since 0.4) prepares the next batch while the GPU runs

    def overlaps_host_work_in_pipeline(self, version: str) -> bool:
        return True  # as without pipeline stages: no published SGLang pipeline run measures otherwise

    def overlaps_host_work_in_prefill_pool(self, version: str) -> bool:
        return True  # `--disaggregation-mode prefill` keeps the scheduler's defaults (ENGINES.md section 3)

    def graphs_prefill_steps(self, version: str, setup: GraphSetup = DEFAULT_GRAPH_SETUP) -> bool:
        """Piecewise CUDA graphs, which cover prefill (extend) batches (`piecewise_graphs`); before 0.5.10 and
        where SGLang turns them off, only decode batches replay graphs."""
        if version.isdigit():  # only the year of the install is known
            return False
        return piecewise_graphs(parse_version(version), setup)

    def start_refusals(self, max_model_len: int, max_context_tokens: int, kv_tokens: int) -> tuple[str, ...]:
        return ()

    def launch_words(self, spec: LaunchSpec) -> list[str] | None:
        # SGLang's TP group spans the attention data-parallel ranks: --tp tp·dp --dp dp --enable-dp-attention.
        words = ["python", "-m", "sglang.launch_server", "--model-path", spec.model_id,
                 "--tp-size", str(spec.tensor_parallel * spec.data_parallel)]
        if spec.pipeline_parallel > 1:
            words += ["--pp-size", str(spec.pipeline_parallel)]
        if spec.data_parallel > 1:
            words += ["--dp-size", str(spec.data_parallel), "--enable-dp-attention"]
        if spec.expert_parallel > 1:
            words += ["--ep-size", str(spec.expert_parallel)]
        # Both flags are the replica's: under --enable-dp-attention SGLang divides each among the attention
        # data-parallel ranks (`_handle_data_parallelism` the chunk, ENGINES.md 1.2; `_resolve_max_num_reqs` the
        # running requests, `max_running_requests // dp_size`, SGL 0.5.10 model_runner_kv_cache_mixin.py), and
        # the plan's limits are one rank's.
        if spec.max_num_seqs is not None:
            words += ["--max-running-requests", str(spec.max_num_seqs * spec.data_parallel)]
        words += ["--chunked-prefill-size", str(spec.max_num_batched_tokens * spec.data_parallel),
                  "--context-length", str(spec.max_model_len),
                  "--mem-fraction-static", f"{spec.gpu_memory_utilization:g}"]
        if spec.kv_dtype in ("fp8", "int8"):  # int8: one byte a value, as fp8 (`one_byte_kv_note`)
            words += ["--kv-cache-dtype", "fp8_e4m3"]
        if online_fp8(spec):
            words += ["--quantization", "fp8"]
        return words

    def launch_notes(self, spec: LaunchSpec) -> list[str]:
        return one_byte_kv_note(spec, "SGLang")

    def disaggregation_words(self, role: str) -> list[str]:
        return ["--disaggregation-mode", role]

    def disaggregation_notes(self, role: str) -> list[str]:
        return [(f"{role} worker: the KV moves with the Mooncake transfer engine over RDMA by default "
                 "(--disaggregation-transfer-backend, --disaggregation-ib-device); where the plan moves it over "
                 f"NVLink across an NVL72 the command starts with {' '.join(MNNVL_ENV)} (MNNVL)")]

    def kv_transfer_over_nvlink(self, gpu: GpuSpec, as_launched: bool) -> bool:
        """Only where the NVLink domain spans hosts (an NVL72) and the launch sets MNNVL_ENV
        (`disaggregation_env`): by default the Mooncake transfer engine moves the KV over RDMA, inside one node
        too (ENGINES.md section 3; sgl-project/sglang `docs/advanced_features/pd_disaggregation.md` @08edc506)."""
        return as_launched and gpu.nvlink_spans_hosts

    def disaggregation_env(self, kv_over_nvlink: bool) -> list[str]:
        return list(MNNVL_ENV) if kv_over_nvlink else []

    def disaggregation_router(self) -> str:
        return ("python -m sglang_router.launch_router --pd-disaggregation --prefill PREFILL_URL ... "
                "--decode DECODE_URL ...")

    def layout_problems(self, model: ModelSpec, layout: Layout, weights: WeightRecipe | None = None,
                        speculative: str | None = None) -> list[LayoutProblem]:
        """SGLang spells attention DP inside its TP group (`--tp tp·dp --dp dp --enable-dp-attention`), gives
        each EP rank E/ep experts, and does not combine DP attention with pipeline stages (SGL 0.5.10
        `server_args.py`), nor with a draft model's speculative decoding (its STANDALONE algorithm: "Currently
        standalone speculative decoding does not support dp attention", SGL 0.5.10 `server_args.py`)."""
        problems = []
        ep = layout.expert_parallel
        if model.is_moe and ep > 1 and model.num_experts % ep:
            problems.append(LayoutProblem(EXPERT_PARALLEL, f"expert_parallel {ep} must divide the "
                                          f"{model.num_experts} routed experts"))
        if layout.data_parallel > 1 and layout.pipeline_parallel > 1:
            problems.append(LayoutProblem(PIPELINE_PARALLEL, "SGLang does not combine DP attention with "
                                          "pipeline stages; use pipeline_parallel 1"))
        if layout.data_parallel > 1 and speculative == DRAFT_MODEL:
            problems.append(LayoutProblem(DATA_PARALLEL, "SGLang does not combine DP attention with a draft "
                                          "model's speculative decoding; use data_parallel 1"))
        return problems


ENGINE = Sglang()
