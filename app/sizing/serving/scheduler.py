"""The simulator's scheduler: the state and event loop behind `simulate.simulate` (see its docstring for
the engine behaviour it reproduces and the jump-ahead over decode-only steps).

Compiled with mypyc when the package is installed (setup.py; the README's "Performance"): the loop turns
two to three times per request, and compiled it runs about twice as fast; this file stays plain Python and
runs as such where no compiled build is installed. So the annotations are exact (mypyc checks them at run
time) and nothing here needs numpy beyond the vectorised decode run of a step-time function that has no
`decode_run`.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from app.sizing.hardware.step_scalar import ScalarStepTime

if TYPE_CHECKING:
    from app.sizing.serving.simulate import SchedulerConfig
    from app.sizing.serving.workload import Requests

# Decode steps timed ahead in one window at most: the arrays of a vectorised run stay small.
_MAX_WINDOW_STEPS: Final = 65_536

DecodeRun = Callable[[int, int, int, float], "tuple[int, float, float] | None"]

# Request states
_PENDING: Final = 0
_WAITING: Final = 1
_PREFILLING: Final = 2
_DECODING: Final = 3
_DONE: Final = 4


class Scheduler:
    """The simulation state and loop. Per-request state lives in Python lists (fast scalar access).

    Decode bookkeeping is lazy: a decoding request joined at decode step `ds0` with `c0` tokens
    cached and `g0` generated; at decode step ds it has c0 + (ds − ds0) cached and has produced
    g0 + (ds − ds0) tokens. `ds` counts steps that carry decodes (every step when prompts and decodes mix).
    """

    # Slots: the loop reads and writes these attributes a few dozen times per event (measured: the
    # scheduler's own time about 15% lower than with an instance dict when it runs as plain Python).
    __slots__ = ("arrival", "arrived", "block_size", "c0", "cached", "chunked", "closed_loop", "decode_context",
                 "decode_run", "decoders_by_phase", "decoding", "done", "drawn", "ds", "ds0", "finish", "finish_heap",
                 "finish_step", "first_token", "free_blocks", "generated", "held", "input", "issued",
                 "last_step_s", "max_num_seqs", "max_steps", "mixed", "n", "next_arrival",
                 "next_first_s", "on_demand", "output", "phase", "position", "preemptions", "prefilling", "prompt",
                 "running", "scalar", "sending", "shared", "state", "step_time", "steps", "t", "think", "token_budget",
                 "tokens_out", "trace_time", "trace_tokens", "unsent", "vector_min_steps", "waiting", "window")

    def __init__(self, step_time: Any, config: SchedulerConfig, requests: Requests, closed_loop_users: int | None,
                 *, on_demand: bool, shared_tokens: list[int], window_blocks: list[int], free_blocks: int,
                 max_steps: int, vector_min_steps: int) -> None:
        self.step_time: Any = step_time
        # The step-time model's scalar path (StepTimeModel.scalar): the same times, called directly rather
        # than through the model's dispatch on argument types.
        scalar = getattr(step_time, "scalar", None)
        self.scalar: ScalarStepTime | None = scalar if isinstance(scalar, ScalarStepTime) else None
        # A step-time model may time a run of decode steps in closed form (StepTimeModel.decode_run).
        self.decode_run: Any = getattr(step_time, "decode_run", None)
        self.max_steps = max_steps
        self.vector_min_steps = vector_min_steps
        self.block_size: int = config.block_size
        self.max_num_seqs: int = config.max_num_seqs
        self.token_budget: int = config.max_num_batched_tokens
        self.chunked: bool = config.chunked_prefill
        self.mixed: bool = config.mixed_prefill
        self.on_demand = on_demand
        self.closed_loop = closed_loop_users is not None

        n = len(requests)
        self.n = n
        self.input: list[int] = requests.input_tokens.tolist()
        self.output: list[int] = requests.output_tokens.tolist()
        self.cached: list[int] = requests.cached_prefix_tokens.tolist()
        self.shared = shared_tokens
        self.window = window_blocks  # blocks of its window layers a running request holds (reserved whole)
        self.arrival: list[float]
        # A closed loop's think times (Requests.think_s; empty: none), one draw per send in the order sends are made
        # (`drawn` so far): a user whose answer ended at t sends at t + its draw (into `sending`, a heap of send
        # times), and the users not heard from yet (`unsent`, all thinking since t = 0) send their first one by one,
        # the next when the soonest of their exponential pauses ends (`next_first_s`: the last first send + its draw
        # / unsent, the minimum of `unsent` exponentials of mean Z being one of mean Z / unsent). Each send becomes
        # the next request's arrival when the clock reaches it (`_arrive`; `arrived` so far), so arrivals stay in
        # index order; sends after the last request has arrived are not made. Every user keeps its pace up to the
        # last arrival however many requests are simulated (all users' first requests drawn up front would take
        # every request when users outnumber them, and sends counted as they are made, not as they arrive, would
        # thin the arrivals long before the last).
        self.think: list[float] = ([] if requests.think_s is None or closed_loop_users is None  # what it may use
                                   else requests.think_s[:n + closed_loop_users].tolist())
        self.sending: list[float] = []
        self.arrived = 0
        self.drawn = 0
        self.unsent = 0
        self.next_first_s = math.inf
        self.arrival = [math.inf] * n
        if closed_loop_users is not None and self.think:  # one send at a time, from t = 0
            self.issued = 0  # (unused: the sends are counted as they arrive)
            self.unsent = closed_loop_users
            self.next_first_s = self.think[0] / closed_loop_users
            self.drawn = 1
        elif closed_loop_users is not None:  # the users' first requests at t = 0, the rest sent as these finish
            self.issued = min(closed_loop_users, n)
            self.arrival[:self.issued] = [0.0] * self.issued
        else:
            self.issued = n
            self.arrival = requests.arrival_s.tolist()

        self.state = [_PENDING] * n
        self.prompt = list(self.input)  # tokens to have in KV when the (re)prefill completes
        self.position = list(self.cached)  # prompt tokens in KV so far
        self.generated = [0] * n
        self.held = [0] * n  # blocks held while prefilling (on demand) or reserved (full)
        self.c0 = [0] * n
        self.ds0 = [0] * n
        self.phase = [0] * n
        self.finish_step = [0] * n
        self.first_token = [math.nan] * n
        self.finish = [math.nan] * n

        self.t = 0.0
        self.steps = 0
        self.ds = 0
        self.free_blocks = free_blocks
        self.next_arrival = 0  # index of the next request not yet in the system
        self.waiting: deque[int] = deque()
        self.running: dict[int, None] = {}  # admission order; the last key is the newest
        self.prefilling: list[int] = []  # running requests with prompt left, admission order
        self.decoding = 0
        self.decode_context = 0  # cached tokens summed over decoding requests
        self.decoders_by_phase = [0] * config.block_size  # on demand: who needs a block when
        self.finish_heap: list[tuple[int, int]] = []  # (decode step of last token, request)
        self.done = 0
        self.preemptions = 0
        self.tokens_out = 0
        self.last_step_s = 0.0
        self.trace_time: list[float] = [0.0]
        self.trace_tokens: list[int] = [0]

    # The loop -------------------------------------------------------------------------------

    def run(self) -> bool:
        """Simulate until every request is done (True), or stop at `max_steps` engine steps (False)."""
        # Names that never change bound once: this loop turns two to three times per request.
        arrival, waiting, state, n, mixed = self.arrival, self.waiting, self.state, self.n, self.mixed
        max_num_seqs, token_budget, running = self.max_num_seqs, self.token_budget, self.running
        trace_time, trace_tokens = self.trace_time.append, self.trace_tokens.append
        while self.done < n:
            next_arrival, t = self.next_arrival, self.t
            if (self.sending and self.sending[0] <= t) or self.next_first_s <= t:
                self._arrive(t)
            while next_arrival < n and arrival[next_arrival] <= t:
                waiting.append(next_arrival)
                state[next_arrival] = _WAITING
                next_arrival += 1
            self.next_arrival = next_arrival
            if self.steps >= self.max_steps:
                return False
            # The oldest waiting request can enter now: a free sequence slot, token budget left after the
            # decodes (when they share the step), and KV blocks for it.
            head_admissible = (bool(waiting) and len(running) < max_num_seqs
                               and not (mixed and self.decoding >= token_budget)
                               and self._admission_blocks(waiting[0]) <= self.free_blocks)
            if self.prefilling or head_admissible:
                # Prompt work first; the decodes ride along only in an engine that mixes them in.
                self._step(with_decodes=mixed)
            elif self.decoding:
                self._jump()
            elif next_arrival < n:  # idle until the next arrival
                self.t = max(t, self._next_arrival_s())
                continue
            else:  # cannot happen after _check_servable; fail loudly rather than spin
                raise RuntimeError("scheduler stalled with requests waiting and nothing running")
            trace_time(self.t)
            trace_tokens(self.tokens_out)
        return True

    def _arrive(self, t: float) -> None:
        """The sends due by `t` become the next requests' arrivals, in the order they fall due; a user's first
        send, arriving, lets the next user not heard from yet send. Once the last request has arrived, no more."""
        sending, arrival, think = self.sending, self.arrival, self.think
        while self.arrived < self.n:
            if sending and sending[0] <= self.next_first_s:
                if sending[0] > t:
                    return
                due = heapq.heappop(sending)
            elif self.next_first_s <= t:
                due = self.next_first_s
                self.unsent -= 1
                self.next_first_s = math.inf
                if self.unsent and self.drawn < len(think):
                    self.next_first_s = due + think[self.drawn] / self.unsent
                    self.drawn += 1
            else:
                return
            arrival[self.arrived] = due
            self.arrived += 1
        sending.clear()
        self.next_first_s = math.inf

    def _next_arrival_s(self) -> float:
        """When the next request arrives: the next one in index order, or the next send due (inf: none)."""
        upcoming = self.arrival[self.next_arrival] if self.next_arrival < self.n else math.inf
        if self.sending and self.sending[0] < upcoming:
            upcoming = self.sending[0]
        return min(upcoming, self.next_first_s)

    def _admission_blocks(self, j: int) -> int:
        own = (self.prompt[j] if self.on_demand else self.input[j] + self.output[j]) - self.shared[j]
        return -(-own // self.block_size) + self.window[j]

    def _decoder_blocks(self, j: int) -> int:
        """Blocks a decoding request holds at the current decode step."""
        if not self.on_demand:
            return self.held[j]
        return -(-(self.c0[j] - self.shared[j] + self.ds - self.ds0[j]) // self.block_size) + self.window[j]

    # One step -------------------------------------------------------------------------------

    def _step(self, with_decodes: bool) -> None:
        preempted = False
        if with_decodes and self.on_demand and self.decoding:
            phase_now = -self.ds % self.block_size
            need = self.decoders_by_phase[phase_now]
            while need > self.free_blocks:
                victim = next(reversed(self.running))
                if self.state[victim] == _DECODING and self.phase[victim] == phase_now:
                    need -= 1
                self._preempt(victim)
                preempted = True
            self.free_blocks -= need  # running decodes get their blocks before any admission
        decodes = self.decoding if with_decodes else 0
        budget = self.token_budget - decodes
        prefill_tokens = prefill_context = 0
        completed: list[int] = []

        position, prompt = self.position, self.prompt
        for j in self.prefilling:
            if budget <= 0:
                break
            chunk = min(prompt[j] - position[j], budget)
            prefill_tokens += chunk
            prefill_context += chunk * position[j] + chunk * (chunk + 1) // 2
            position[j] += chunk
            budget -= chunk
            if position[j] == prompt[j]:
                completed.append(j)
        if completed:
            self.prefilling = [j for j in self.prefilling if position[j] < prompt[j]]

        if not preempted and (self.mixed or not with_decodes):
            waiting, running, chunked, max_num_seqs = self.waiting, self.running, self.chunked, self.max_num_seqs
            while waiting and budget > 0 and len(running) < max_num_seqs:
                j = waiting[0]
                blocks = self._admission_blocks(j)
                at = position[j]
                remaining = prompt[j] - at
                if blocks > self.free_blocks or (not chunked and remaining > budget):
                    break
                waiting.popleft()
                running[j] = None
                self.free_blocks -= blocks
                self.held[j] = blocks
                chunk = remaining if remaining < budget else budget  # noqa: FURB136 (min(), as a call, costs more)
                prefill_tokens += chunk
                prefill_context += chunk * at + chunk * (chunk + 1) // 2
                at = position[j] = at + chunk
                budget -= chunk
                if at == prompt[j]:
                    completed.append(j)
                else:
                    self.state[j] = _PREFILLING
                    self.prefilling.append(j)

        context = self.decode_context if decodes else 0
        scalar = self.scalar
        dt = (scalar.step_time_s(decodes, context, prefill_tokens, prefill_context) if scalar is not None
              else float(self.step_time(decodes, context, prefill_tokens, prefill_context)))
        if not 0 < dt < math.inf:
            raise ValueError(f"step_time must return a positive finite time, got {dt}")
        self.last_step_s = dt
        self.t += dt
        self.steps += 1
        if decodes:
            self._advance_decodes(1)
        self.tokens_out += len(completed)
        for j in completed:
            self._prefill_done(j)

    def _preempt(self, j: int) -> None:
        """Free a running request's KV and put it back at the front of the queue."""
        if self.state[j] == _DECODING:
            self.generated[j] += self.ds - self.ds0[j]
            self._stop_decoding(j)
        else:
            self.prefilling.remove(j)
            self.free_blocks += self.held[j]
        del self.running[j]
        self.prompt[j] = self.input[j] + self.generated[j]
        self.position[j] = self.cached[j]
        self.state[j] = _WAITING
        self.waiting.appendleft(j)
        self.preemptions += 1

    def _stop_decoding(self, j: int) -> None:
        self.free_blocks += self._decoder_blocks(j)
        self.decoding -= 1
        self.decode_context -= self.c0[j] + self.ds - self.ds0[j]
        if self.on_demand:
            self.decoders_by_phase[self.phase[j]] -= 1

    def _prefill_done(self, j: int) -> None:
        """The step that completed j's prompt produced its next token."""
        generated = self.generated[j] = self.generated[j] + 1
        if math.isnan(self.first_token[j]):
            self.first_token[j] = self.t
        if generated == self.output[j]:
            self.free_blocks += self.held[j]
            self._finish(j)
            return
        ds, prompt = self.ds, self.prompt[j]
        self.state[j] = _DECODING
        self.c0[j] = prompt
        self.ds0[j] = ds
        self.decoding += 1
        self.decode_context += prompt
        if self.on_demand:
            phase = (prompt - self.shared[j] - ds) % self.block_size
            self.phase[j] = phase
            self.decoders_by_phase[phase] += 1
        last = ds + self.output[j] - generated - 1
        self.finish_step[j] = last
        heapq.heappush(self.finish_heap, (last, j))

    def _finish(self, j: int) -> None:
        self.state[j] = _DONE
        del self.running[j]
        self.finish[j] = self.t
        self.done += 1
        if not self.closed_loop:
            return
        if self.think:  # the user sends the next request after a pause (`_arrive` takes it while requests are left)
            if self.arrived < self.n and self.drawn < len(self.think):
                heapq.heappush(self.sending, self.t + self.think[self.drawn])
                self.drawn += 1
        elif self.issued < self.n:  # the user sends the next request now
            self.arrival[self.issued] = self.t
            self.issued += 1

    def _advance_decodes(self, steps: int) -> None:
        """Account `steps` decode steps just run (clock and KV blocks already advanced), then finish
        who is done."""
        ds = self.ds = self.ds + steps
        produced = self.decoding * steps
        self.decode_context += produced
        self.tokens_out += produced
        heap, state, finish_step = self.finish_heap, self.state, self.finish_step
        while heap and heap[0][0] < ds:
            last, j = heapq.heappop(heap)
            if state[j] == _DECODING and finish_step[j] == last:
                self.generated[j] = self.output[j]
                self._stop_decoding(j)
                self._finish(j)

    def _blocks_needed(self, steps: int) -> int:
        """New KV blocks the decoders take over the next `steps` decode steps (on demand).

        A decoder of phase p needs one at decode step d when (d + p) % block_size == 0: at step
        ds + i that is phase (−ds − i) % block_size. Each full cycle of block_size steps costs one
        block per decoder; the `rest` steps after the cycles take phases a, a − 1, ..., a − rest + 1
        (mod block_size) with a = (−ds) % block_size, summed as at most two slices.
        """
        bs, by_phase = self.block_size, self.decoders_by_phase
        cycles, rest = divmod(steps, bs)
        a = -self.ds % bs
        if rest <= a + 1:
            partial = sum(by_phase[a - rest + 1:a + 1])
        else:
            partial = sum(by_phase[:a + 1]) + sum(by_phase[bs - (rest - a - 1):])
        return cycles * self.decoding + partial

    # Jump ahead over decode-only steps -------------------------------------------------------

    def _jump(self) -> None:
        heap, state, finish_step = self.finish_heap, self.state, self.finish_step
        last, j = heap[0]
        while not (state[j] == _DECODING and finish_step[j] == last):
            heapq.heappop(heap)  # stale: preempted since
            last, j = heap[0]
        t, ds, decodes = self.t, self.ds, self.decoding
        steps = min(last - ds + 1, _MAX_WINDOW_STEPS, self.max_steps - self.steps)

        # An arrival matters only if it could be admitted: empty queue and a free sequence slot.
        next_arrival = math.inf
        if not self.waiting and len(self.running) < self.max_num_seqs and self.next_arrival < self.n:
            next_arrival = self.arrival[self.next_arrival]
            sending = self.sending
            if sending and sending[0] < next_arrival:  # (`_next_arrival_s` inline: this runs once per jump)
                next_arrival = sending[0]
            next_arrival = min(next_arrival, self.next_first_s)
            last_step_s = self.last_step_s
            if last_step_s > 0 and next_arrival < math.inf:
                # size the window to reach about the arrival, not far beyond it
                steps = min(steps, int((next_arrival - t) / last_step_s * 1.25) + 2)

        if self.on_demand and self.free_blocks < decodes * -(-steps // self.block_size):
            steps = self._steps_before_kv_shortage(steps)
            if steps == 0:  # this very step needs blocks it cannot get: preempt in a normal step
                self._step(with_decodes=True)
                return

        context, step_time = self.decode_context, self.step_time
        scalar, decode_run = self.scalar, self.decode_run
        ran = (scalar.decode_run(decodes, context, steps, next_arrival - t) if scalar is not None
               else None if decode_run is None else decode_run(decodes, context, steps, next_arrival - t))
        if ran is not None:
            run, elapsed, dt = ran
            t += elapsed
        elif steps < self.vector_min_steps:
            run = 0
            while run < steps:
                dt = float(step_time(decodes, context + decodes * run, 0, 0))
                if not 0 < dt < math.inf:
                    raise ValueError(f"step_time must return a positive finite time, got {dt}")
                t += dt
                run += 1
                if t >= next_arrival:
                    break
        else:
            contexts = np.arange(context, context + decodes * steps, decodes, dtype=np.float64)
            # The batch size and the (absent) prompt as numbers: the step time's decode-only fast path.
            dts = np.asarray(step_time(decodes, contexts, 0, 0), dtype=np.float64)
            if dts.shape != (steps,):  # a step time that ignores its inputs may return one number
                dts = np.full(steps, float(dts))
            ends = np.cumsum(dts)
            ends += t
            if not (dts.min() > 0 and ends[-1] < math.inf):
                raise ValueError("step_time must return positive finite times")
            run = steps
            if ends[-1] >= next_arrival:
                run = int(np.searchsorted(ends, next_arrival, side="left")) + 1
            t = float(ends[run - 1])
            dt = float(dts[run - 1])
        self.last_step_s = dt
        self.t = t
        self.steps += run
        if self.on_demand:
            self.free_blocks -= self._blocks_needed(run)
        self._advance_decodes(run)

    def _steps_before_kv_shortage(self, steps: int) -> int:
        """How many of the next `steps` decode steps get their blocks (on demand): up to the first step at
        which the blocks taken from now on would exceed the free ones.

        Each block_size steps cost one block per decoder, so the whole cycles the free blocks cover are
        skipped at once; the steps after them are counted one by one, and a shortage comes within about
        one more cycle.
        """
        bs, free, by_phase, ds = self.block_size, self.free_blocks, self.decoders_by_phase, self.ds
        cycles = min(steps // bs, free // self.decoding)
        taken, step = cycles * self.decoding, cycles * bs
        while step < steps:
            taken += by_phase[-(ds + step) % bs]  # who needs a block at decode step ds + step
            if taken > free:
                return step
            step += 1
        return steps
