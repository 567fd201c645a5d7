"""What a /v1/slo-plan request asks of its model, checked before planning: the parallel degrees it lists (a
degree the model or the engine cannot run, or one that makes no layout, is a 422 naming it); what a plan
should say of its draft model, and of its closed loop's users."""

from __future__ import annotations

from collections.abc import Sequence

from app.errors import Unprocessable
from app.planning.schemas import CandidatesIn
from app.sizing.engines import layout_problems
from app.sizing.layout import EXPERT_PARALLEL, TENSOR_PARALLEL, Layout
from app.sizing.serving import plan as plan_core
from app.sizing.serving.workload import Fixed, Workload
from app.sizing.specs import GpuSpec, ModelSpec


def check_plan_parallelism(model: ModelSpec, candidates: CandidatesIn, gpus: Sequence[GpuSpec]) -> None:
    """422 for a listed degree the model (or the engine) cannot run: each tensor-parallel degree as plain
    TP, each pipeline degree against the layers, each expert-parallel degree against the model's experts and
    against the listed (or default) tensor- and data-parallel degrees, of which some tp x dp must be a multiple
    of it (`app.sizing.layout`); such a degree made no layout, and the plan answered nothing about it."""
    if candidates.expert_parallel:
        tensor = candidates.tensor_parallel or sorted({tp for gpu in gpus
                                                       for tp in plan_core.default_tensor_parallel(model, gpu)})
        data = candidates.data_parallel or [1]
        for index, ep in enumerate(candidates.expert_parallel):
            rules = [p.rule for p in layout_problems(model, Layout(1, 1, ep, ep), candidates.engine)
                     if p.field == EXPERT_PARALLEL]
            if not rules and not any(tp * dp % ep == 0 for tp in tensor for dp in data):
                rules = [(f"expert_parallel {ep} divides no tensor_parallel x data_parallel of the candidates "
                          f"({tensor} x {data}): its ranks split the tp x dp GPUs of a replica")]
            _refuse("expert_parallel", index, rules)
    for index, tp in enumerate(candidates.tensor_parallel or []):
        _refuse("tensor_parallel", index, [p.rule for p in layout_problems(model, Layout(tp), candidates.engine)
                                           if p.field == TENSOR_PARALLEL])
    for index, pp in enumerate(candidates.pipeline_parallel or []):
        _refuse("pipeline_parallel", index,
                [p.rule for p in layout_problems(model, Layout(pipeline_parallel=pp), candidates.engine)])


def _refuse(field: str, index: int, rules: list[str]) -> None:
    """A 422 naming the listed degree `candidates.<field>[index]` when it breaks `rules` (none: it is fine)."""
    if rules:
        raise Unprocessable("; ".join(rules), errors=[(f"/body/candidates/{field}/{index}", rule) for rule in rules])


def draft_notes(model: ModelSpec, draft: ModelSpec) -> list[str]:
    """What a plan should say of a draft model the target may not be able to use: the target verifies the token
    ids the draft proposes, so both need one tokenizer. Vocabulary sizes that differ do not prove another
    tokenizer (checkpoints pad their embedding tables differently), so this is a note, not a refusal."""
    if draft.vocab_size == model.vocab_size:
        return []
    return [(f"the draft model's vocabulary ({draft.vocab_size:,} tokens) is not the target's ({model.vocab_size:,}): "
            "a draft must share the target's tokenizer, whose token ids the target verifies; check that it does "
            "(a padded embedding table also changes the size)")]


def closed_loop_notes(workload: Workload, with_disaggregated: bool) -> list[str]:
    """What aggregated plans of a closed loop whose answers all have one length should say: the simulation runs the
    users themselves, and requests that start decoding together finish together (2026-12-07, Llama-3-70B TP8 on
    H100 at the builtin efficiency, 2,000 in / 300 out: p95 TTFT 0.24 s for 30-90 users without think time, 0.97-1.11
    s thinking 0.1 s, 0.16-0.34 s thinking 2 s; with answers of lognormal lengths 0.12-0.29 s throughout)."""
    if not workload.is_closed_loop or not isinstance(workload.output_tokens, Fixed):
        return []
    varied = "answers that vary in length keep no such groups: give output_tokens as a distribution (lognormal or histogram)"
    if not workload.think_time_s:
        note = ("aggregated plans simulate the closed loop's users themselves: answers of one length finish together when "
                "they start together, and users who send again at once settle into regular turns (each prompt prefilled "
                "alone, or in waves), so their percentiles show that pattern's spread, often none; " + varied
                + ", and users who pause between requests, think_time_s")
    else:
        note = ("aggregated plans simulate the closed loop's users themselves: answers of one length finish together when "
                "they start together, and users pausing only a few prefill steps come back in bursts that queue, so a "
                "short think time can need more GPUs than none or a longer one; " + varied)
    return [note + ("; disaggregated plans are sized as the open loop of the users' rate, whose arrivals bunch"
                    if with_disaggregated else "")]
