"""Tensor- and pipeline-parallel communication time.

Independent source: SIZING.md section 6 (ring all-reduce alpha + 2·(tp-1)/tp · message / bandwidth,
two per layer, alpha ~5-10 us; TP beyond a node's NVLink domain uses the scale-out network) and the
GPU catalog's per-direction link bandwidths (H100 NVLink 4: 900 GB/s bidirectional = 450 per direction).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.sizing.hardware.comm import (
    allreduce_time_s,
    link_bandwidth,
    pipeline_hops_time_s,
    ring_latency_scale,
    step_allreduce_time_s,
    tp_link_bandwidth,
    tp_network_latency_s,
)
from app.sizing.hardware.efficiency import DEFAULT_EFFICIENCY
from app.sizing.hardware.roofline import roofline
from app.sizing.hardware.step_time import build_step_time_model
from app.sizing.model.flops import decode_cost
from tests.domain.models_for_tests import LLAMA_3_70B
from tests.domain.test_roofline import H100_SXM


def test_ring_allreduce_by_hand() -> None:
    """1 MB over 2 GPUs at 450e9 B/s, two-GPU alpha 7.5 us: 7.5e-6 + 2 x 1/2 x 1e6 / 450e9 = 7.5e-6 + 2.2222e-6
    = 9.7222 us. Over 8 GPUs the alpha is NCCL's ring ratio longer, (6.6 + 2 x 7 x 0.6) / (6.6 + 2 x 0.6)
    = 15.0 / 7.8 = 1.923077, so 7.5e-6 x 1.923077 = 14.423077e-6, plus 2 x 7/8 x 1e6 / 450e9 = 3.888889e-6:
    18.311966 us."""
    assert allreduce_time_s(1e6, 2, 450e9, 7.5e-6) == pytest.approx(9.722222e-6, rel=1e-6)
    assert allreduce_time_s(1e6, 8, 450e9, 7.5e-6) == pytest.approx(18.311966e-6, rel=1e-6)


def test_a_longer_ring_takes_nccls_ratio_longer() -> None:
    """NCCL's one-node ring LL all-reduce (ENGINES.md section 5, tuning.cc): 6.6 us + 0.6 us per NVLink hop,
    2 (n - 1) hops: 7.8 us for 2 GPUs, 10.2 for 4, 15.0 for 8. Relative to two GPUs: 1, 10.2 / 7.8 =
    1.307692, 15.0 / 7.8 = 1.923077; 16 GPUs: (6.6 + 30 x 0.6) / 7.8 = 24.6 / 7.8 = 3.153846. The inter-node
    latency is added as it is, not scaled: TP16 with 5.4 us of it, 7.5 x 3.153846 + 5.4 = 29.053846 us."""
    assert ring_latency_scale(2) == 1.0
    assert ring_latency_scale(4) == pytest.approx(1.307692, rel=1e-6)
    assert ring_latency_scale(8) == pytest.approx(1.923077, rel=1e-6)
    assert ring_latency_scale(16) == pytest.approx(3.153846, rel=1e-6)
    assert allreduce_time_s(0.0, 16, 450e9, 7.5e-6, 5.4e-6) == pytest.approx(29.053846e-6, rel=1e-6)
    with pytest.raises(ValueError):
        ring_latency_scale(0)


def test_no_allreduce_without_tensor_parallelism() -> None:
    assert allreduce_time_s(1e9, 1, 450e9, 7.5e-6) == 0.0


def test_decode_allreduces_are_latency_bound() -> None:
    """Llama-3-70B (80 layers, h=8192) at batch 1 on TP8: messages of 8192 x 2 = 16,384 B; an 8-GPU alpha of
    7.5e-6 x 15.0 / 7.8 = 14.423077e-6; 160 calls x (14.423077e-6 + 1.75 x 16,384 / 450e9 = 14.486793e-6)
    = 2.3179 ms, 99% of it alpha."""
    total = step_allreduce_time_s(1, 80, 16_384, 8, 450e9, 7.5e-6)
    assert total == pytest.approx(160 * (7.5e-6 * 15.0 / 7.8 + 1.75 * 16_384 / 450e9), rel=1e-12)
    assert total == pytest.approx(2.3179e-3, rel=1e-4)
    assert 160 * 7.5e-6 * 15.0 / 7.8 / total > 0.99


def test_empty_step_makes_no_calls() -> None:
    assert step_allreduce_time_s(0, 80, 16_384, 8, 450e9, 7.5e-6) == 0.0
    assert pipeline_hops_time_s(0, 4, 16_384, 450e9, 7.5e-6) == 0.0


def test_allreduce_accepts_arrays() -> None:
    times = step_allreduce_time_s(np.array([0, 1, 512]), 80, 16_384, 8, 450e9, 7.5e-6)
    alpha = 7.5e-6 * 15.0 / 7.8  # eight GPUs (test_a_longer_ring_takes_nccls_ratio_longer)
    expected = [0.0, 160 * (alpha + 1.75 * 16_384 / 450e9), 160 * (alpha + 1.75 * 512 * 16_384 / 450e9)]
    np.testing.assert_allclose(times, expected, rtol=1e-12)


def test_tensor_parallel_link_is_nvlink_inside_a_node_and_the_nodes_nics_beyond() -> None:
    """H100 SXM nodes hold 8 GPUs on NVLink (450e9 B/s per direction) and one 400 Gb/s NIC each (50e9 B/s).
    TP16 spans two nodes: its rings leave a node through its 8 NICs together, 8 x 50e9 = 400e9 B/s, below
    NVLink's 450e9; TP12 puts 4 GPUs in its second node, whose 4 NICs carry 200e9. With a quarter of the NICs' speed (12.5e9 each: 100e9 together) the NICs bound it
    further; with eight times it (3.2e12 together) NVLink does. A single GPU's link is never the NIC."""
    assert tp_link_bandwidth(H100_SXM, 8) == 450e9
    assert tp_link_bandwidth(H100_SXM, 16) == 400e9
    assert tp_link_bandwidth(H100_SXM, 64) == 400e9
    assert tp_link_bandwidth(H100_SXM, 12) == 200e9  # 8 + 4 GPUs: the second node's 4 NICs, 4 x 50e9
    assert tp_link_bandwidth(dataclasses.replace(H100_SXM, scale_out_bandwidth_bytes_per_s=12.5e9), 16) == 100e9
    assert tp_link_bandwidth(dataclasses.replace(H100_SXM, scale_out_bandwidth_bytes_per_s=400e9), 16) == 450e9
    assert link_bandwidth(H100_SXM, 1) == 450e9
    assert link_bandwidth(H100_SXM, 16) == 50e9  # one GPU's own traffic (MoE exchange, pipeline hop): its NIC


def test_a_ring_across_nodes_adds_nccls_inter_node_steps_to_the_latency() -> None:
    """NCCL's ring all-reduce over n GPUs on k nodes takes 2·(n − 1) steps (Ring LL, tuning.cc, ENGINES.md
    section 5): 2·(k − 1) cross between nodes at the NET hop, 2.7 µs, and the others pay max(NVLink hop 0.6 µs,
    the host's network overhead 1 µs) = 1 µs. Over the one-node ring of n GPUs (6.6 + 2·(n − 1) x 0.6 µs) that
    adds 2·(k − 1) x (2.7 − 0.6) + (2·(n − 1) − 2·(k − 1)) x (1.0 − 0.6):
    - TP8 (one node): 0.
    - TP16 (2 nodes): 2 x 2.1 + 28 x 0.4 = 4.2 + 11.2 = 15.4 µs. Checked against the whole model: NCCL's
      6.6 + 28 x 1.0 + 2 x 2.7 = 40.0 µs less the one-node 6.6 + 30 x 0.6 = 24.6 µs is 15.4 µs.
    - TP64 (8 nodes): 14 x 2.1 + 112 x 0.4 = 29.4 + 44.8 = 74.2 µs.
    - TP24 (3 nodes, the last one partly filled): 4 x 2.1 + 42 x 0.4 = 8.4 + 16.8 = 25.2 µs."""
    assert tp_network_latency_s(H100_SXM, 8) == 0.0
    assert tp_network_latency_s(H100_SXM, 16) == pytest.approx(15.4e-6, rel=1e-12)
    assert tp_network_latency_s(H100_SXM, 64) == pytest.approx(74.2e-6, rel=1e-12)
    assert tp_network_latency_s(H100_SXM, 24) == pytest.approx(25.2e-6, rel=1e-12)


def test_pipeline_hops_by_hand() -> None:
    """pp=4, 512 tokens of 8192 x 2 B: message 8,388,608 B over NVLink: 3 hops x (7.5e-6 +
    8,388,608 / 450e9 = 18.641e-6) = 78.42 us."""
    assert pipeline_hops_time_s(512, 4, 16_384, 450e9, 7.5e-6) == pytest.approx(
        3 * (7.5e-6 + 8_388_608 / 450e9), rel=1e-12)
    assert pipeline_hops_time_s(512, 1, 16_384, 450e9, 7.5e-6) == 0.0


@given(st.floats(0, 1e10), st.floats(0, 1e10), st.integers(2, 64))
def test_allreduce_grows_with_the_message_and_is_bounded_by_twice_the_transfer(small: float, large: float,
                                                                                tp: int) -> None:
    small, large = sorted((small, large))
    alpha = 7.5e-6 * ring_latency_scale(tp)
    assert allreduce_time_s(small, tp, 450e9, 7.5e-6) <= allreduce_time_s(large, tp, 450e9, 7.5e-6)
    assert alpha <= allreduce_time_s(large, tp, 450e9, 7.5e-6) <= alpha + 2 * large / 450e9 * (1 + 1e-12)


def test_invalid_degrees_and_links_are_rejected() -> None:
    with pytest.raises(ValueError):
        allreduce_time_s(1.0, 0, 450e9, 7.5e-6)
    with pytest.raises(ValueError):
        allreduce_time_s(1.0, 2, 0.0, 7.5e-6)
    with pytest.raises(ValueError):
        pipeline_hops_time_s(1, 0, 16_384, 450e9, 7.5e-6)
    with pytest.raises(ValueError):
        link_bandwidth(H100_SXM, 0)


# gpus.csv `l40s`: PCIe Gen4 x16, 32 GB/s per direction, no NVLink; 864 GB/s GDDR6; bf16 362.05 TFLOPS.
L40S = dataclasses.replace(H100_SXM, name="NVIDIA L40S", slug="l40s", memory_bytes=48_305_799_168,
                           memory_bandwidth_bytes_per_s=0.864e12, interconnect_bandwidth_bytes_per_s=32e9,
                           bf16_flops_per_s=362.05e12, fp16_flops_per_s=362.05e12, fp8_flops_per_s=733e12,
                           int8_ops_per_s=733e12, pcie_links=True)


def test_a_pcie_link_at_half_its_rate_doubles_the_transfer_part_of_every_collective() -> None:
    """Llama-3-70B (80 layers, h = 8192, bf16 activations: 16,384 B per token) on 8 x L40S (PCIe 32e9 B/s
    per direction), a decode step of 64 sequences: each all-reduce moves 64 x 16,384 = 1,048,576 B,
    2 x 7/8 x 1,048,576 / 32e9 = 57.344 us of transfer at the full rate, 114.688 us at half; 2 x 80 = 160
    all-reduces a step: 9.17504 ms more at pcie_link_fraction 0.5, the latency alpha unchanged. The roofline
    of the same step charges the same difference as communication time. On H100s (NVLink) the fraction
    changes nothing."""
    full, half = (dataclasses.replace(DEFAULT_EFFICIENCY, pcie_link_fraction=fraction) for fraction in (1.0, 0.5))
    expected = 160 * 2 * 7 / 8 * 1_048_576 / 32e9
    assert expected == pytest.approx(9.17504e-3, rel=1e-12)
    steps = {efficiency.pcie_link_fraction: build_step_time_model(LLAMA_3_70B, L40S, tensor_parallel=8, weight_dtype="bf16",
                                                             kv_dtype="bf16", efficiency=efficiency)
             for efficiency in (full, half)}
    assert float(steps[0.5](64, 64 * 1000, 0, 0)) - float(steps[1.0](64, 64 * 1000, 0, 0)) == pytest.approx(
        expected, rel=1e-9)
    cost = decode_cost(LLAMA_3_70B, 1000, batch_size=64, weight_dtype="bf16", kv_dtype="bf16", tensor_parallel=8)
    slow, fast = (roofline(cost, L40S, "bf16", efficiency) for efficiency in (half, full))
    assert slow.comm_time_s - fast.comm_time_s == pytest.approx(expected, rel=1e-9)
    nvlink = [build_step_time_model(LLAMA_3_70B, H100_SXM, tensor_parallel=8, weight_dtype="bf16", kv_dtype="bf16",
                                    efficiency=efficiency)(64, 64 * 1000, 0, 0) for efficiency in (full, half)]
    assert nvlink[0] == nvlink[1]
    assert roofline(cost, H100_SXM, "bf16", half).comm_time_s == roofline(cost, H100_SXM, "bf16", full).comm_time_s


def test_a_link_fraction_outside_zero_to_one_is_rejected() -> None:
    for bad in (0.0, 1.2):
        with pytest.raises(ValueError, match="pcie_link_fraction"):
            dataclasses.replace(DEFAULT_EFFICIENCY, pcie_link_fraction=bad)
