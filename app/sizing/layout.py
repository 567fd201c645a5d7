"""A parallel layout of one model replica, and which layouts a model and an engine accept.

Vocabulary (ENGINES.md section 2), the same for every engine:
- `tensor_parallel` (tp): GPUs one attention head group is split over, inside one data-parallel rank.
  Dense layers (non-MoE MLPs, shared experts), the embedding and the LM head follow it too.
- `data_parallel` (dp): attention data-parallel ranks. Each rank holds a full copy of the attention
  weights split only by tp, runs attention for its own requests and keeps their KV cache alone (the MLA
  latent is no longer copied onto every GPU). With dp = 1 this is plain tensor parallelism.
- `pipeline_parallel` (pp): stages, each holding its share of the layers.
- `expert_parallel` (ep): the MoE layers of one stage span all tp·dp ranks; `ep` of them own disjoint
  sets of routed experts and each expert is split over `moe_tensor_parallel = tp·dp / ep` ranks
  (TensorRT-LLM's `tp = moe_tp · moe_ep`, SGLang's `--ep` inside `--tp`, vLLM's
  `--enable-expert-parallel`: ep = dp·tp, moe_tp = 1). Under attention DP tokens reach their experts by an
  all-to-all; with dp = 1 every GPU already holds every token after the attention's all-reduce.

A replica uses tp·pp·dp GPUs (vLLM: TP·PP·DP; TensorRT-LLM and AIC's sample: tp·pp·attention_dp).
A request that names only tp and pp means what it meant before layouts existed: dp = ep = 1, experts
split by tp.

Validity: `layout_problems` lists every generic rule a layout breaks (heads, widths, experts, stages, node
size), as `LayoutProblem(field, rule)`; each engine module adds its own (`Engine.layout_problems`), and
`engines.layout_problems` asks both. Nothing else decides whether a layout is valid.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from app.sizing.model.params import shared_expert_width
from app.sizing.model.recipes import ATTENTION, DENSE_MLP, EXPERTS, SHARED_EXPERTS
from app.sizing.specs import ModelSpec

TENSOR_PARALLEL = "tensor_parallel"
PIPELINE_PARALLEL = "pipeline_parallel"
DATA_PARALLEL = "data_parallel"
EXPERT_PARALLEL = "expert_parallel"

KIND_TP = "tp"  # tensor (and pipeline) parallel only: dp = ep = 1, pp = 1
KIND_DP_EP = "dp_ep"  # attention data parallelism and/or expert parallelism
KIND_PP = "pp"  # pipeline stages (pp > 1), whatever else
KIND_DISAGGREGATED = "disaggregated"  # separate prefill and decode pools, each with its own layout
LAYOUT_KINDS = (KIND_TP, KIND_DP_EP, KIND_PP, KIND_DISAGGREGATED)


@dataclass(frozen=True, slots=True)
class Layout:
    """How one replica is split over GPUs (see the module docstring for each degree's meaning)."""

    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    data_parallel: int = 1
    expert_parallel: int = 1

    def __post_init__(self) -> None:
        for name in (TENSOR_PARALLEL, PIPELINE_PARALLEL, DATA_PARALLEL, EXPERT_PARALLEL):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1")
        if self.moe_group % self.expert_parallel:
            raise ValueError(f"expert_parallel {self.expert_parallel} must divide tensor_parallel x data_parallel "
                             f"({self.moe_group}): the MoE layers span those ranks")

    @property
    def moe_group(self) -> int:
        """GPUs one stage's MoE layers span: every tensor- and data-parallel rank."""
        return self.tensor_parallel * self.data_parallel

    @property
    def moe_tensor_parallel(self) -> int:
        """Ranks each routed expert is split over."""
        return self.moe_group // self.expert_parallel

    @property
    def gpus(self) -> int:
        return self.tensor_parallel * self.pipeline_parallel * self.data_parallel

    @property
    def kind(self) -> str:
        """The layout family the validator reports error by."""
        if self.pipeline_parallel > 1:
            return KIND_PP
        if self.data_parallel > 1 or self.expert_parallel > 1:
            return KIND_DP_EP
        return KIND_TP

    @property
    def label(self) -> str:
        """"TP8 PP1", "TP1 DP8 EP8 PP1": DP and EP named where above 1."""
        return f"{self.stage_label} PP{self.pipeline_parallel}"

    @property
    def stage_label(self) -> str:
        """The label of one pipeline stage's GPUs: "TP8", "TP1 DP8 EP8"."""
        parts = [f"TP{self.tensor_parallel}"]
        if self.data_parallel > 1:
            parts.append(f"DP{self.data_parallel}")
        if self.expert_parallel > 1:
            parts.append(f"EP{self.expert_parallel}")
        return " ".join(parts)


@dataclass(frozen=True, slots=True)
class LayoutProblem:
    """One broken rule: the layout field to change, and the rule in words."""

    field: str
    rule: str


# Generic rules: what the model's shapes allow, whatever the engine ---------------------------------

def _heads(model: ModelSpec, layout: Layout) -> list[LayoutProblem]:
    tp, heads = layout.tensor_parallel, model.num_attention_heads
    problems = []
    if heads % tp:
        problems.append(LayoutProblem(TENSOR_PARALLEL, f"tensor_parallel {tp} must divide the {heads} attention heads"))
    kv_heads = model.num_key_value_heads
    if not model.is_mla:  # MLA has one latent "KV head", replicated on every rank
        # vLLM's QKVParallelLinear: tp >= Hkv replicates each KV head tp/Hkv times (needs tp % Hkv == 0),
        # tp < Hkv splits them (needs Hkv % tp == 0). Qwen2.5-7B (4 KV heads) at TP7 is neither.
        if tp >= kv_heads and tp % kv_heads:
            problems.append(LayoutProblem(TENSOR_PARALLEL, f"tensor_parallel {tp} must be a multiple of the "
                                          f"{kv_heads} KV heads (each KV head is replicated tp/{kv_heads} times)"))
        elif tp < kv_heads and kv_heads % tp:
            problems.append(LayoutProblem(TENSOR_PARALLEL, f"tensor_parallel {tp} must divide the {kv_heads} KV heads"))
    return problems


@dataclass(frozen=True, slots=True)
class SplitWidth:
    """One width of a linear layer that a layout shares out over ranks."""

    group: str  # the weights' parameter group (`recipes.GROUPS`): what a checkpoint stores it in
    field: str  # the layout field that splits it
    name: str  # e.g. "the MLP width"
    width: int
    ranks: int


def split_widths(model: ModelSpec, layout: Layout) -> tuple[SplitWidth, ...]:
    """Every linear width the layout shares out: attention's query and key/value projections over tp (the KV
    heads over at most as many ranks as there are, replicated beyond), or MLA's query and key/value
    up-projections and its output projection's input (its down-projections are replicated); the dense MLP
    and the shared experts over tp; the routed experts over moe_tp, an EP or DP degree's to fix once either
    is set."""
    tp = layout.tensor_parallel
    heads = model.num_attention_heads
    if model.is_mla:
        assert model.qk_nope_head_dim and model.qk_rope_head_dim and model.v_head_dim  # is_mla guarantees them
        widths = [SplitWidth(ATTENTION, TENSOR_PARALLEL, "the MLA query up-projection",
                             heads * (model.qk_nope_head_dim + model.qk_rope_head_dim), tp),
                  SplitWidth(ATTENTION, TENSOR_PARALLEL, "the MLA key/value up-projection",
                             heads * (model.qk_nope_head_dim + model.v_head_dim), tp),
                  SplitWidth(ATTENTION, TENSOR_PARALLEL, "the MLA output projection's input",
                             heads * model.v_head_dim, tp)]
    else:
        head_dim, kv_heads = model.resolved_head_dim, model.num_key_value_heads
        widths = [SplitWidth(ATTENTION, TENSOR_PARALLEL, "the query projection", heads * head_dim, tp),
                  SplitWidth(ATTENTION, TENSOR_PARALLEL, "the key and value projections", kv_heads * head_dim,
                             min(tp, kv_heads))]
    if len(model.moe_layer_indices) < model.num_hidden_layers:
        widths.append(SplitWidth(DENSE_MLP, TENSOR_PARALLEL, "the MLP width", model.dense_intermediate_size, tp))
    if model.is_moe:
        field = TENSOR_PARALLEL if layout.expert_parallel == 1 and layout.data_parallel == 1 else EXPERT_PARALLEL
        widths.append(SplitWidth(EXPERTS, field, "the expert width", model.expert_intermediate_size,
                                 layout.moe_tensor_parallel))
        if model.n_shared_experts:
            widths.append(SplitWidth(SHARED_EXPERTS, TENSOR_PARALLEL, "the shared-expert width",
                                     shared_expert_width(model), tp))
    return tuple(widths)


def _widths(model: ModelSpec, layout: Layout) -> list[LayoutProblem]:
    """Sharded feed-forward widths must split evenly (vLLM's `divide()` asserts, TensorRT-LLM likewise); the
    attention's are the heads' to split (`_heads`)."""
    problems = []
    for split in split_widths(model, layout):
        if split.group == ATTENTION or split.width % split.ranks == 0:
            continue
        degree = (f"each expert is split over tensor_parallel x data_parallel / expert_parallel = {split.ranks} "
                  "ranks, which" if split.group == EXPERTS else f"tensor_parallel {split.ranks}")
        problems.append(LayoutProblem(split.field, f"{degree} must divide {split.name} {split.width:,}"))
    return problems


def _experts(model: ModelSpec, layout: Layout) -> list[LayoutProblem]:
    ep = layout.expert_parallel
    if ep == 1:
        return []
    if not model.is_moe:
        return [LayoutProblem(EXPERT_PARALLEL, f"expert_parallel {ep} needs an MoE model; this one has no experts")]
    if ep > model.num_experts:
        return [LayoutProblem(EXPERT_PARALLEL, f"expert_parallel {ep} exceeds the {model.num_experts} routed "
                              "experts (every rank must own one)")]
    return []


def _stages(model: ModelSpec, layout: Layout) -> list[LayoutProblem]:
    pp, layers = layout.pipeline_parallel, model.num_hidden_layers
    if pp > layers:
        return [LayoutProblem(PIPELINE_PARALLEL, f"pipeline_parallel {pp} exceeds the {layers} layers")]
    return []


GENERIC_RULES: tuple[Callable[[ModelSpec, Layout], list[LayoutProblem]], ...] = (_heads, _widths, _experts, _stages)


def node_problems(layout: Layout, gpus_per_node: int) -> list[LayoutProblem]:
    """Tensor parallelism stays inside one node (its two all-reduces per layer need NVLink). Data- and
    expert-parallel ranks may span nodes: the all-to-all then crosses the scale-out network (`comm.py`)."""
    if layout.tensor_parallel > gpus_per_node:
        return [LayoutProblem(TENSOR_PARALLEL, f"tensor_parallel {layout.tensor_parallel} exceeds the "
                              f"{gpus_per_node} GPUs of one node (tensor parallelism stays inside one node)")]
    return []


def layout_problems(model: ModelSpec, layout: Layout, gpus_per_node: int | None = None) -> list[LayoutProblem]:
    """Every generic rule `layout` breaks for this model (and node size, when given); [] = valid.
    `engines.layout_problems` adds the named engine's own rules."""
    problems = [problem for rule in GENERIC_RULES for problem in rule(model, layout)]
    if gpus_per_node is not None:
        problems += node_problems(layout, gpus_per_node)
    return problems


# A pure function of its arguments, asked for every GPU of a plan's search several times over (the configurations,
# their count, the MoE layouts, the cross-node pipelines), each time checking every degree up to the node size.
@lru_cache(maxsize=512)
def valid_tensor_parallel(model: ModelSpec, gpus_per_node: int) -> tuple[int, ...]:
    """Plain TP degrees (dp = ep = pp = 1) the model accepts inside one node (plain TP passes every engine's
    own rules too: they concern expert and data parallelism)."""
    return tuple(tp for tp in range(1, gpus_per_node + 1) if not layout_problems(model, Layout(tp), gpus_per_node))
