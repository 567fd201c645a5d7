"""Communication time of tensor and pipeline parallelism (SIZING.md section 6).

Tensor parallelism adds two all-reduces per decoder layer (after the attention output projection and
after the MLP down projection), each of `tokens · hidden · activation bytes`. A ring all-reduce costs
`alpha + 2·(tp-1)/tp · message / link bandwidth`; at decode the message is tiny and alpha dominates,
which is why TP speeds decode up sub-linearly. Alpha grows with the ring: NCCL's own latency model puts
a one-node ring LL all-reduce at base + 2·(tp − 1) NVLink hops (`ring_latency_scale`). Pipeline
parallelism sends the same activations once across each stage boundary.

Functions accept numbers or numpy arrays for the message sizes and token counts.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from app.sizing.specs import GpuSpec

ALLREDUCES_PER_LAYER = 2  # after attention-out and after MLP-down
# A ring across nodes, by NCCL's own model (src/graph/tuning.cc @5067397c, ENGINES.md section 5): of an
# all-reduce's 2·(n − 1) steps over n GPUs on k nodes, 2·(k − 1) cross between nodes and take the Ring LL
# per-hop NET latency instead of an NVLink hop; every other step takes max(NVLink hop, the host's network
# overhead), 1 us on Intel hosts (2 us on AMD ones, which the catalog does not record: the Intel value).
NET_RING_HOP_S = 2.7e-6
NET_OVERHEAD_S = 1.0e-6
# NCCL's latency model of a one-node ring all-reduce in its LL protocol (src/graph/tuning.cc @5067397c,
# ENGINES.md section 5): a base of 6.6 us plus 0.6 us per NVLink hop, 2·(n − 1) hops for n GPUs: 7.8 us (2),
# 10.2 (4), 15.0 (8).
RING_LL_BASE_S = 6.6e-6
RING_LL_NVLINK_HOP_S = 0.6e-6


def ring_latency_scale(tensor_parallel: int) -> float:
    """How much longer the latency of a ring all-reduce over `tensor_parallel` GPUs is than over two, by
    NCCL's model: (base + 2·(tp − 1)·hop) / (base + 2·hop) = (6.6 + 1.2·(tp − 1)) / 7.8, i.e. 1 at tp = 2,
    1.31 at 4, 1.92 at 8. A calibrated alpha is the two-GPU one; the ring's length scales it."""
    if tensor_parallel < 1:
        raise ValueError("tensor_parallel must be >= 1")
    two_gpus = RING_LL_BASE_S + 2 * RING_LL_NVLINK_HOP_S
    return (RING_LL_BASE_S + 2 * (tensor_parallel - 1) * RING_LL_NVLINK_HOP_S) / two_gpus


def allreduce_time_s(message_bytes: ArrayLike, tensor_parallel: int, link_bandwidth_bytes_per_s: float,
                     latency_s: float, network_latency_s: float = 0.0) -> float | np.ndarray:
    """One ring all-reduce: alpha + 2·(tp-1)/tp · message / bandwidth; 0 when tp == 1 (no call). `latency_s`
    is a two-GPU all-reduce's alpha, scaled to the ring's length (`ring_latency_scale`); `network_latency_s`
    is what the ring's inter-node steps add (`tp_network_latency_s`)."""
    if tensor_parallel < 1:
        raise ValueError("tensor_parallel must be >= 1")
    if link_bandwidth_bytes_per_s <= 0:
        raise ValueError("link_bandwidth_bytes_per_s must be positive")
    if tensor_parallel == 1:
        return 0.0
    alpha = latency_s * ring_latency_scale(tensor_parallel) + network_latency_s
    return alpha + 2 * (tensor_parallel - 1) / tensor_parallel * message_bytes / link_bandwidth_bytes_per_s


def link_bandwidth(gpu: GpuSpec, gpus_spanned: int) -> float:
    """Per-GPU, per-direction bandwidth of the slowest link a group of `gpus_spanned` GPUs uses.

    Inside one node (NVLink domain) it is the GPU's interconnect; a group larger than a node also
    crosses the scale-out network, which then bounds a ring.
    """
    if gpus_spanned < 1:
        raise ValueError("gpus_spanned must be >= 1")
    if gpus_spanned <= gpu.gpus_per_node:
        return gpu.interconnect_bandwidth_bytes_per_s
    return gpu.scale_out_bandwidth_bytes_per_s


def tp_network_latency_s(gpu: GpuSpec, tensor_parallel: int) -> float:
    """Latency a tensor-parallel all-reduce's ring adds when it spans nodes, over the one-node ring of as many
    GPUs (`allreduce_time_s`'s alpha), by NCCL's model: its 2·(nodes − 1) inter-node steps take NET_RING_HOP_S
    instead of an NVLink hop, and its other 2·(tp − 1) − 2·(nodes − 1) steps max(hop, NET_OVERHEAD_S) instead
    of the hop; 0 inside one node."""
    nodes = -(-tensor_parallel // gpu.gpus_per_node)
    if nodes == 1:
        return 0.0
    inter_node_steps = 2 * (nodes - 1)
    intra_node_steps = 2 * (tensor_parallel - 1) - inter_node_steps
    return (inter_node_steps * (NET_RING_HOP_S - RING_LL_NVLINK_HOP_S)
            + intra_node_steps * (max(RING_LL_NVLINK_HOP_S, NET_OVERHEAD_S) - RING_LL_NVLINK_HOP_S))


def tp_link_bandwidth(gpu: GpuSpec, tensor_parallel: int) -> float:
    """Per-GPU bandwidth of a tensor-parallel group's ring all-reduce (the `link_bandwidth_bytes_per_s` of
    `allreduce_time_s`): NVLink inside a node; beyond one, the node's NICs carry the inter-node hops together.

    A ring over several nodes crosses between them only 2·(nodes − 1) times per pass (ENGINES.md section 5's
    NCCL ring model), and the message is split over parallel rings (channels), each leaving the node
    through a different GPU's NIC: a node's NICs (one per GPU in the catalog) share the traffic that
    crosses, while every GPU still sends its whole 2·(tp − 1)/tp · message over NVLink. The slower of the
    two bounds the ring: min(NVLink, n × NIC), n the group's GPUs in its least filled node (gpus_per_node
    when tp is a multiple of it). One NIC's bandwidth would be the bound only if a single ring carried the
    whole message across.
    """
    per_node = gpu.gpus_per_node
    if tensor_parallel <= per_node:
        return link_bandwidth(gpu, tensor_parallel)
    least_filled = tensor_parallel % per_node or per_node
    return min(gpu.interconnect_bandwidth_bytes_per_s, least_filled * gpu.scale_out_bandwidth_bytes_per_s)


def step_allreduce_time_s(tokens: ArrayLike, num_layers: int, message_bytes_per_token: float,
                          tensor_parallel: int, link_bandwidth_bytes_per_s: float,
                          latency_s: float, network_latency_s: float = 0.0) -> float | np.ndarray:
    """Tensor-parallel communication of one engine step: 2 all-reduces per layer of tokens·h·a bytes
    (`allreduce_time_s`, with its two-GPU `latency_s` and inter-node `network_latency_s`).

    An empty step (0 tokens) makes no calls and costs nothing.
    """
    tokens = np.asarray(tokens, dtype=float)
    per_call = allreduce_time_s(tokens * message_bytes_per_token, tensor_parallel,
                                link_bandwidth_bytes_per_s, latency_s, network_latency_s)
    time = (tokens > 0) * ALLREDUCES_PER_LAYER * num_layers * per_call
    return float(time) if np.ndim(time) == 0 else time


def pipeline_hops_time_s(tokens: ArrayLike, pipeline_parallel: int, message_bytes_per_token: float,
                         link_bandwidth_bytes_per_s: float, latency_s: float) -> float | np.ndarray:
    """Point-to-point sends of one step across the pp-1 stage boundaries: alpha + message / bandwidth each."""
    if pipeline_parallel < 1:
        raise ValueError("pipeline_parallel must be >= 1")
    if link_bandwidth_bytes_per_s <= 0:
        raise ValueError("link_bandwidth_bytes_per_s must be positive")
    tokens = np.asarray(tokens, dtype=float)
    per_hop = latency_s + tokens * message_bytes_per_token / link_bandwidth_bytes_per_s
    time = (tokens > 0) * (pipeline_parallel - 1) * per_hop
    return float(time) if np.ndim(time) == 0 else time


# The MoE exchange of a data- or expert-parallel layout ---------------------------------------------

MOE_EXCHANGES_PER_LAYER = 2  # dispatch before the experts, combine after them
# How an engine's MoE layers move the tokens of an attention data-parallel layout with expert parallelism
# (ENGINES.md section 2). PER_EXPERT: each token goes to the GPUs owning its routed experts and comes back
# (an all-to-all). ALL_GATHER: every GPU gathers every rank's tokens, runs its own experts on all of them
# and reduce-scatters the sums back, vLLM's default `--all2all-backend allgather_reducescatter` (vLLM 0.19.0
# `engine/arg_utils.py`).
# FFN_ALL_GATHER: the same gather and reduce-scatter around every feed-forward block, dense MLPs included,
# whose weights (dense MLPs, shared and routed experts) span all tp·dp GPUs: SGLang under --enable-dp-attention,
# where "MoE/FFN still spans all TP ranks" and its TP group is the tp·dp GPUs; an a2a backend (DeepEP and the
# others) is opt-in (ENGINES.md section 2).
PER_EXPERT = "per_expert"
ALL_GATHER = "allgather_reducescatter"
FFN_ALL_GATHER = "ffn_allgather"
MOE_EXCHANGES = (PER_EXPERT, ALL_GATHER, FFN_ALL_GATHER)


def moe_exchange_bytes_per_token(hidden_size: int, activation_bytes: float, experts_per_token: int, *,
                                 tensor_parallel: int, data_parallel: int, expert_parallel: int,
                                 exchange: str = PER_EXPERT) -> float:
    """Bytes one GPU sends per token of its data-parallel rank, per MoE layer, in each direction.

    - Attention data parallelism with expert parallelism (dp > 1, ep > 1) and a `PER_EXPERT` exchange,
      dispatch then combine: each of a token's k expert copies leaves the GPU unless its expert is local, a
      share (ep-1)/ep under uniform routing, so k·(ep-1)/ep·h values per token. A rank's tokens are split
      over its tp GPUs. (Engines that send a token once per destination GPU rather than once per expert, as
      DeepEP does, send less: this is an upper bound.)
    - Attention data parallelism with an `ALL_GATHER` exchange (vLLM's default) or an `FFN_ALL_GATHER` one
      (SGLang's), or without EP (experts tensor-split over all tp·dp GPUs, which gather every rank's tokens
      too): an all-gather of every rank's tokens, then a reduce-scatter: (dp-1)·h values received per own
      token, whatever k and ep are. It is the per-expert exchange's k·(ep-1)/ep·h at dp = ep with k = 8
      (DeepSeek-V3, Qwen3-MoE: 7·h at DP8), twice it for gpt-oss (k = 4: 3.5·h) and eight times it for
      Llama-4 Maverick (k = 1: 0.875·h). `FFN_ALL_GATHER` moves as much around each dense MLP too
      (`flops.StepCostModel.num_exchange_layers`).
    - Tensor-parallel attention (dp = 1), with or without EP: 0. The attention's all-reduce leaves every
      token of the step on every GPU of the group, so each GPU runs its own experts (or expert slices) on
      the tokens routed to them without receiving any, and the partial outputs are summed by the same
      all-reduce as a TP MoE layer (`step_allreduce_time_s`). ENGINES.md section 2: vLLM's all-gather is
      across the DP ranks, of which there is one; TensorRT-LLM and SGLang keep each attention rank's own
      requests apart only under attention DP.
    """
    if min(tensor_parallel, data_parallel, expert_parallel) < 1:
        raise ValueError("parallel degrees must be >= 1")
    if exchange not in MOE_EXCHANGES:
        raise ValueError(f"unknown MoE exchange {exchange!r}; expected one of {list(MOE_EXCHANGES)}")
    if data_parallel == 1:
        return 0.0
    if expert_parallel > 1 and exchange == PER_EXPERT:
        return experts_per_token * (expert_parallel - 1) / expert_parallel * hidden_size * activation_bytes \
            / tensor_parallel
    return (data_parallel - 1) * hidden_size * activation_bytes


# DeepEP's low-latency all-to-all kernels, dispatch + combine latency at each EP size, in us (author
# measurement at 128 tokens per batch: deepseek-ai/DeepEP docs/legacy.md @dd758caf, ENGINES.md section 5):
# EP8 77 + 114, EP16 118 + 195, EP32 155 + 273, EP64 173 + 314, EP128 192 + 369, EP256 194 + 360.
DEEPEP_LOW_LATENCY_EXCHANGE_US = ((8, 191.0), (16, 313.0), (32, 428.0), (64, 487.0), (128, 561.0), (256, 554.0))


def exchange_latency_scale(gpus: int) -> float:
    """How much longer one MoE exchange call among `gpus` GPUs takes than among 8 or fewer: DeepEP's measured
    dispatch + combine latency at that EP size over its EP8 one, linear in log2(gpus) between the measured
    sizes and held at EP256's beyond them (16 GPUs: 313 / 191 = 1.64; 32: 428 / 191 = 2.24). Each rank sends
    to and waits on every other, so the call grows with the group, far less than linearly. 1 up to 8 GPUs:
    the measurements start at EP8, and the calibrated alpha is the call's latency there."""
    if gpus < 1:
        raise ValueError("gpus must be >= 1")
    sizes, latencies = zip(*DEEPEP_LOW_LATENCY_EXCHANGE_US, strict=True)
    if gpus <= sizes[0]:
        return 1.0
    return float(np.interp(np.log2(gpus), np.log2(sizes), latencies)) / latencies[0]


def moe_exchange_time_s(tokens: ArrayLike, layers: int, bytes_per_token: float,
                        link_bandwidth_bytes_per_s: float, latency_s: float,
                        gpus: int) -> float | np.ndarray:
    """Dispatch and combine of one step over its exchanging `layers` (the MoE layers; every layer under
    `FFN_ALL_GATHER`, `flops.StepCostModel.num_exchange_layers`):
    2 · layers · (alpha · exchange_latency_scale(gpus) + tokens · bytes / bandwidth).

    `gpus` are the tp·dp GPUs of the exchange. The link is NVLink when they sit in one node (NVLink domain),
    the scale-out network when they span nodes (`link_bandwidth`). 0 for an empty step or no exchange. Under
    expert parallelism with a `PER_EXPERT` exchange the step waits for the most loaded rank: callers pass its
    tokens, the rank's own times `flops.expected_expert_load_factor` (an all-gather moves every rank's alike).
    """
    if link_bandwidth_bytes_per_s <= 0:
        raise ValueError("link_bandwidth_bytes_per_s must be positive")
    tokens = np.asarray(tokens, dtype=float)
    if not bytes_per_token:
        time = tokens * 0.0
    else:
        per_call = latency_s * exchange_latency_scale(gpus) + tokens * bytes_per_token / link_bandwidth_bytes_per_s
        time = (tokens > 0) * MOE_EXCHANGES_PER_LAYER * layers * per_call
    return float(time) if np.ndim(time) == 0 else time
