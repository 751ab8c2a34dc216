"""Token-budget scheduler: one loop turns requests into ``{request: num_new_tokens}`` per step.

Chunked prefill and decode mix freely in a step. Each step:

1. ``_extend_running``: every running request, oldest first, gets ``min(remaining, budget)`` tokens
   (1 when decoding). If the arena cannot back them, the most recently admitted other request is
   preempted (recompute: its blocks are released, published ones stay cached, so re-admission
   usually hits) until it fits; a request alone first shrinks its chunk to the end of its block,
   then preempts itself.
2. ``_admit_waiting``: first-come first-served, while budget, sequence slots and memory last.
   Admission claims the prefix hit and backs the whole first chunk at once (it reserves what it
   uses, so it never over-commits), and stops at the first request that does not fit. A request
   whose next prompt block is being computed by a running request is passed over until that block
   is published, then hits (burst arrivals of a shared prefix compute it once).
3. ``_build_output``: the frozen :class:`ScheduledBatch`.

Speculative decoding (``speculative_num_tokens`` = K > 0 and a :class:`DraftSource`): a decoding
request's step runs its last token plus up to K drafts from the draft source (fewer near its
``max_tokens`` or the model length, or when the budget or the arena is short). The committed token is
backed first (preempting as above if need be); the drafts only with pages the arena has spare, so
speculation never preempts a request, evicts a cached block or releases a retention pin: drafts
that would need a new block when none is spare stop at the end of the current one. The drafts are not
part of the sequence: ``num_computed_tokens`` advances over the committed token and the drafts the
runner accepted only, so blocks are published (and SWA blocks leave the window) exactly as without
speculation, and rows written for rejected drafts lie past the computed length, where the next
step overwrites them before any query can read them.

Overlapped steps (:meth:`schedule_ahead`, :meth:`complete_ahead`): the engine schedules step N+1
while step N runs. Each request of step N is advanced as :meth:`postprocess` will advance it, and a
request that samples gets a placeholder token (:data:`PENDING`) for the token step N is computing;
requests that step N certainly finishes (their ``max_tokens`` or the model length) are left out.
When step N's tokens arrive, :meth:`postprocess` puts them in place of the placeholders (also for a
request the ahead schedule preempted: its token still counts, and may finish it in the waiting queue),
and :meth:`complete_ahead` fills the ahead batch's token ids, drops the requests that ended meanwhile
(a stop token or string, an abort) and ships their releases with it.

A request that cannot progress even alone (its pages sit in chunks shared with cached ones, which
cannot be lent) is restarted alone on an emptied cache: the layout promises that one request of the
model length fits there, and no other request is admitted until it finishes.

``ArenaEmpty`` never escapes ``schedule()``. A request that could never run (longer than the model
length) is refused in :meth:`add`; one whose first block cannot fit even in an idle arena is
finished as aborted with the reason in :attr:`Sequence.error` (and listed by :meth:`Scheduler.take_ended`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace

from atom.config import SchedulerConfig
from atom.kv.block_manager import BlockManager
from atom.kv.chunk_arena import ArenaEmpty
from atom.spec_decode.draft_source import DraftSource
from atom.step_contract import RunnerOutput, ScheduledBatch, ScheduledSeq
from atom.model_engine.sequence import Sequence, SequenceStatus
from atom.spec_decode.spec_counters import SpecCounters

__all__ = ["Scheduler", "StepResult", "PENDING"]

PENDING = -1
"""The token id of a token the running step samples, until :meth:`Scheduler.postprocess` knows it."""


class StepResult:
    """What one step did to one request (for streaming)."""

    __slots__ = ("seq", "new_tokens", "finished")

    def __init__(self, seq: Sequence, new_tokens: list[int], finished: bool) -> None:
        self.seq, self.new_tokens, self.finished = seq, new_tokens, finished


class Scheduler:
    """Owns the waiting queue and running list; talks to the runner only through frozen batches."""

    def __init__(self, config: SchedulerConfig, block_manager: BlockManager, eos_token_id: int | None,
                 drafter: DraftSource | None = None) -> None:
        self.config = config
        self.drafter = drafter if config.speculative_num_tokens else None
        self.spec = SpecCounters(config.speculative_num_tokens)
        self._drafts: dict[int, tuple[int, ...]] = {}  # this step's drafts per request
        self.bm = block_manager
        self.eos_token_id = eos_token_id
        self.block_size = block_manager.block_size
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.by_id: dict[int, Sequence] = {}
        self.step_count = 0
        self.num_preemptions = 0
        self._released: list[int] = []
        self._preempted_now: set[int] = set()
        self._solo: int | None = None  # a request restarted alone on an emptied arena: admit only it
        self._ended: list[Sequence] = []  # finished outside postprocess, not yet taken (take_ended)
        self._pending: set[int] = set()  # requests whose last token is PENDING (schedule_ahead)
        self._finishing: set[int] = set()  # requests the running step certainly finishes: not scheduled

    # ---- requests -----------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        """Queue a request; ``ValueError`` if it could never run within the model length."""
        limit = self.config.max_model_len
        total = seq.num_prompt_tokens + seq.params.max_tokens
        if seq.num_prompt_tokens >= limit or total > limit:
            raise ValueError(
                f"request needs {seq.num_prompt_tokens} prompt + {seq.params.max_tokens} output tokens = {total}, "
                f"more than the model length {limit}; shorten the prompt or lower max_tokens")
        if seq.seq_id in self.by_id:
            raise ValueError(f"request id {seq.seq_id} is already in use")
        self.by_id[seq.seq_id] = seq
        self.waiting.append(seq)

    def abort(self, seq_id: int) -> bool:
        """Stop a request at any point and free everything it holds. False if unknown/finished."""
        seq = self.by_id.get(seq_id)
        if seq is None or seq.status.finished:
            return False
        self._drop_pending(seq)
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            self.bm.free(seq)
            self._released.append(seq.seq_id)
        else:
            self.waiting.remove(seq)
        self._abort_outside_step(seq)
        return True

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def waiting_tokens(self) -> int:
        """Tokens of the queued requests, none admitted yet: what they will prefill before any prefix
        hit (a preempted request counts its outputs too: it recomputes them). A load signal for a
        router choosing between replicas; O(queued requests)."""
        return sum(len(seq) for seq in self.waiting)

    def has_ended(self) -> bool:
        """Whether requests finished outside a step's postprocess wait to be taken (:meth:`take_ended`)."""
        return bool(self._ended)

    def take_ended(self) -> list[Sequence]:
        """The requests finished outside :meth:`postprocess` since the last call, in the order they
        finished: aborted (:meth:`abort`) or refused at admission (:meth:`schedule`). Their owner
        (the engine, once per step) streams their final outputs from this list, so finding them costs
        O(finished), never a scan of every request. A request that :meth:`postprocess` or
        :meth:`finish_by_stop_string` finishes is not listed: the caller sees it finish there."""
        ended, self._ended = self._ended, []
        return ended

    # ---- scheduling ---------------------------------------------------------------------------
    def schedule(self) -> ScheduledBatch:
        self.step_count += 1
        self._preempted_now.clear()
        budget = self.config.max_num_batched_tokens
        work: dict[int, int] = {}
        budget = self._extend_running(work, budget)
        admitted = self._admit_waiting(work, budget)
        return self._build_output(work, admitted)

    def schedule_ahead(self, running: ScheduledBatch) -> ScheduledBatch:
        """The step after ``running``, scheduled while ``running`` executes (its tokens unknown): every
        request of ``running`` is advanced as :meth:`postprocess` will advance it, with a
        :data:`PENDING` token for each one that samples (its full blocks published and the blocks that
        left its window released, as after the step); those whose sampled token certainly ends them
        (``max_tokens``, the model length) are not scheduled. The batch carries placeholders until
        :meth:`complete_ahead`, after :meth:`postprocess` of ``running``."""
        assert self.config.speculative_num_tokens == 0, "drafts follow the previous step's output: no ahead schedule"
        for item in running.seqs:
            seq = self.by_id.get(item.seq_id)
            if seq is None or seq.status is not SequenceStatus.RUNNING:
                continue
            seq.num_computed_tokens = item.start_pos + item.num_committed
            self.bm.after_step(seq)  # reads tokens before the computed length only; postprocess repeats it
            if item.sample:
                seq.append_token(PENDING)
                self._pending.add(seq.seq_id)
                if seq.num_output_tokens >= seq.params.max_tokens or len(seq) >= self.config.max_model_len:
                    self._finishing.add(seq.seq_id)
        try:
            return self.schedule()
        finally:
            self._finishing.clear()

    def complete_ahead(self, batch: ScheduledBatch) -> ScheduledBatch:
        """``batch`` (from :meth:`schedule_ahead`) once the step it followed was postprocessed: each
        placeholder replaced by the sampled token (a request that sampled runs exactly that one token
        next), without the requests that ended meanwhile, whose
        releases it carries (with the table deltas emitted since, theirs dropped)."""
        assert not self._pending, f"tokens of requests {sorted(self._pending)} are still pending"
        released, self._released = tuple(self._released), []
        gone = set(released)
        seqs = []
        for item in batch.seqs:
            if item.seq_id in gone:
                continue
            if item.token_ids[-1] == PENDING:  # a request that sampled: its one token, the last it has
                item = ScheduledSeq(item.seq_id, item.start_pos, (self.by_id[item.seq_id].token_ids[-1],), True,
                                    item.state_slot, item.state_reset, item.restore_page, item.params, item.history)
            seqs.append(item)
        updates = tuple(u for u in batch.table_updates + tuple(self.bm.take_updates()) if u.seq_id not in gone)
        # (host copies ordered since the ahead schedule, if any, stay pending for the next batch: a store
        # must not run after this batch's loads, which may read the host page it writes)
        return replace(batch, seqs=tuple(seqs), table_updates=updates, released_ids=batch.released_ids + released,
                       new_tables=tuple(t for t in batch.new_tables if t.seq_id not in gone))

    def _drop_pending(self, seq: Sequence) -> None:
        if seq.seq_id in self._pending:
            self._pending.discard(seq.seq_id)
            seq.token_ids.pop()

    def _extend_running(self, work: dict[int, int], budget: int) -> int:
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            if seq.seq_id in self._finishing:
                i += 1
                continue
            drafts = self._propose(seq, budget)
            n = min(seq.num_remaining, budget)
            if n > 1:  # a prefill chunk: no longer than what fits without touching a retention pin
                n = self.bm.chunk_within_pins(seq, n)
            n = self._grow_or_preempt(seq, n, within_pins=n > 1)
            if n:
                if drafts:
                    drafts = self._drafts_that_fit(seq, n, drafts)
                    if drafts:
                        self._drafts[seq.seq_id] = drafts
                        n += len(drafts)
                work[seq.seq_id] = n
                budget -= n
                i += 1
        return budget

    def _drafts_that_fit(self, seq: Sequence, n: int, drafts: tuple[int, ...]) -> tuple[int, ...]:
        """The leading drafts the arena backs with pages it has spare, after the ``n`` committed
        tokens were backed: drafts never preempt a request, evict a cached block or release a pin.
        The block the committed token sits in is backed already, so at worst the drafts stop at its end."""
        try:
            self.bm.grow(seq, n + len(drafts), spare_only=True)
            return drafts
        except ArenaEmpty:
            pass
        in_block = self.block_size - (seq.num_computed_tokens + n) % self.block_size
        in_block = 0 if in_block == self.block_size else in_block  # the committed token ended a block
        return drafts[:in_block]

    def _propose(self, seq: Sequence, budget: int) -> tuple[int, ...]:
        """Drafts for a decoding request: at most K, leaving room for the correction / bonus token
        within ``max_tokens``, the model length and the step budget. Requests whose sampling edits
        logits from the history, ask for log-probabilities or have stop strings (decided on the text,
        one token at a time) decode one token per step."""
        p = seq.params
        if self.drafter is None or seq.num_remaining != 1 or seq.in_prefill or p.needs_history or p.logit_bias \
                or p.logprobs is not None or p.stop:
            return ()
        k = min(self.config.speculative_num_tokens, budget - 1, p.max_tokens - seq.num_output_tokens - 1,
                self.config.max_model_len - len(seq))
        return tuple(self.drafter.propose(seq, k))[:k] if k > 0 else ()

    def _grow_or_preempt(self, seq: Sequence, n: int, within_pins: bool = False) -> int:
        """Back ``n`` tokens of ``seq``, preempting younger requests; 0 if ``seq`` itself was preempted.
        ``within_pins``: see :meth:`BlockManager.grow`."""
        while True:
            try:
                self.bm.grow(seq, n, within_pins=within_pins)
                return n
            except ArenaEmpty:
                pass
            if self.running[-1] is not seq:
                self._preempt(self.running[-1])
                continue
            to_block_end = self.block_size - seq.num_computed_tokens % self.block_size
            if n > to_block_end:
                n = to_block_end
                continue
            alone = len(self.running) == 1  # older requests may still run: then it just waits
            self._preempt(seq)
            if alone:
                self._restart_alone(seq)
            return 0

    def _preempt(self, seq: Sequence) -> None:
        """Recompute policy: release the request's blocks, put it back at the head of the queue."""
        self.running.remove(seq)
        self.bm.free(seq)
        self._released.append(seq.seq_id)
        self._drafts.pop(seq.seq_id, None)
        seq.status = SequenceStatus.WAITING
        seq.num_computed_tokens = seq.num_cached_tokens = 0
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self._preempted_now.add(seq.seq_id)
        self.waiting.appendleft(seq)

    def _restart_alone(self, seq: Sequence) -> None:
        """``seq`` cannot progress even alone: its pages sit in chunks shared with cached pages,
        which can never be lent. Drop the whole cache and let it run alone from scratch, where the
        layout's one-request promise (:func:`~atom.kv.kv_layout.request_chunks_needed`)
        holds; other requests are admitted again once it finishes."""
        self.bm.drop_cache()
        self._solo = seq.seq_id

    def _admit_waiting(self, work: dict[int, int], budget: int) -> list[Sequence]:
        admitted, i = [], 0
        while i < len(self.waiting) and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[i]
            if seq.seq_id in self._preempted_now or self._solo not in (None, seq.seq_id):
                break
            n = self.bm.admit_unless_waiting(seq, budget) if self._solo is None else self.bm.admit(seq, budget)
            if n is None:
                i += 1  # its prefix is being computed by a running request: admit it once published
                continue
            if n == 0 and not self.running:
                n = self.bm.admit(seq, 1)
                if n == 0:
                    self._restart_alone(seq)
                    n = self.bm.admit(seq, 1)
                if n == 0:
                    del self.waiting[i]
                    seq.error = "the KV arena cannot hold this request's first block even when idle"
                    self._abort_outside_step(seq)
                    continue
            if n == 0:
                break
            del self.waiting[i]
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            admitted.append(seq)
            work[seq.seq_id] = n
            budget -= n
            if self._solo is not None:
                break
        return admitted

    def _build_output(self, work: dict[int, int], admitted: list[Sequence]) -> ScheduledBatch:
        released, self._released = tuple(self._released), []
        dropped = set(released)  # requests whose runner tables are dropped this step: their deltas are moot
        updates = tuple(u for u in self.bm.take_updates() if u.seq_id not in dropped)
        for u in updates:  # every other delta reaches the runner, scheduled this step or not
            h = self.bm.holdings.get(u.seq_id)
            assert h is not None and h.shipped, f"table update of a request the runner has no tables for: {u}"
        new_tables = tuple(self.bm.ship_tables(s.seq_id) for s in admitted)
        seqs = tuple(self._scheduled_seq(self.by_id[sid], n, self._drafts.pop(sid, ())) for sid, n in work.items())
        stores, loads = self.bm.take_host_copies()
        return ScheduledBatch(self.step_count, seqs, new_tables, updates, released, stores, loads)

    def _scheduled_seq(self, seq: Sequence, n: int, drafts: tuple[int, ...]) -> ScheduledSeq:
        start, h = seq.num_computed_tokens, self.bm.holdings[seq.seq_id]
        n -= len(drafts)
        history = None
        if h.state_fresh and seq.params.needs_history:  # once per admission: the sampler's penalty state
            history = (tuple(seq.token_ids[: seq.num_prompt_tokens]), tuple(seq.output_token_ids))
        return ScheduledSeq(seq.seq_id, start, tuple(seq.token_ids[start:start + n]) + drafts, start + n == len(seq),
                            h.state_slot, h.state_fresh, h.restore_page, seq.params, history, len(drafts),
                            seq.token_ids[start + n] if start + n < len(seq) else -1)

    # ---- after the runner ---------------------------------------------------------------------
    def postprocess(self, batch: ScheduledBatch, output: RunnerOutput) -> list[StepResult]:
        """Advance every scheduled request, append sampled tokens, finish the ones that stop."""
        results = []
        for item in batch.seqs:
            seq = self.by_id.get(item.seq_id)
            if seq is not None and seq.seq_id in self._pending:
                self._drop_pending(seq)  # the sampled token takes the placeholder's place below
                if seq.status is SequenceStatus.WAITING:
                    results.append(self._resolve_preempted(seq, output.sampled[item.seq_id]))
                    continue
            if seq is None or seq.status is not SequenceStatus.RUNNING:
                continue  # aborted between schedule and postprocess
            tokens, accepted = [], 0
            if item.sample:
                accepted = output.accepted.get(item.seq_id, 0)
                assert 0 <= accepted <= item.num_draft, f"{accepted} of {item.num_draft} drafts accepted"
                tokens = list(item.drafts[:accepted]) + [output.sampled[item.seq_id]]
                if item.num_draft:
                    self.spec.record(item.num_draft, accepted)
            done, emitted = None, []
            for token in tokens:
                seq.append_token(token)
                emitted.append(token)
                done = self._check_stop(seq, token)
                if done:
                    break
            # the rows of accepted drafts were written; a stop inside them ends the request (the KV of
            # its last token is never needed, as without speculation)
            seq.num_computed_tokens = min(item.start_pos + item.num_committed + accepted, len(seq) - 1) \
                if emitted else item.start_pos + item.num_committed
            self.bm.after_step(seq)
            if done:
                self.running.remove(seq)
                self.bm.free(seq)
                self._released.append(seq.seq_id)
                self._finish(seq, done)
            elif self.drafter is not None and item.seq_id in output.drafts:
                self.drafter.observe(seq, output.drafts[item.seq_id])
            results.append(StepResult(seq, emitted, bool(done)))
        return results

    def _resolve_preempted(self, seq: Sequence, token: int) -> StepResult:
        """The token of a request the ahead schedule preempted while its step ran: it joins the
        sequence (recomputed on re-admission) and may finish it where it waits."""
        seq.append_token(token)
        done = self._check_stop(seq, token)
        if done:
            self.waiting.remove(seq)
            self._finish(seq, done)
        return StepResult(seq, [token], bool(done))

    def _check_stop(self, seq: Sequence, token: int) -> SequenceStatus | None:
        p = seq.params
        if not p.ignore_eos and token == self.eos_token_id:
            return SequenceStatus.FINISHED_STOPPED
        if token in p.stop_token_ids:
            return SequenceStatus.FINISHED_STOPPED
        if seq.num_output_tokens >= p.max_tokens or len(seq) >= self.config.max_model_len:
            return SequenceStatus.FINISHED_LENGTH
        return None

    def finish_by_stop_string(self, seq: Sequence) -> None:
        """The engine found a stop string in the text: end the request now (also one the ahead schedule
        preempted while its token was in flight: it waits, holding nothing)."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            self.bm.free(seq)
            self._released.append(seq.seq_id)
            self._finish(seq, SequenceStatus.FINISHED_STOPPED)
        elif seq.status is SequenceStatus.WAITING and seq.num_output_tokens:
            self.waiting.remove(seq)
            self._finish(seq, SequenceStatus.FINISHED_STOPPED)

    def _abort_outside_step(self, seq: Sequence) -> None:
        """Finish ``seq`` as aborted outside :meth:`postprocess`; :meth:`take_ended` lists it."""
        self._finish(seq, SequenceStatus.FINISHED_ABORTED)
        self._ended.append(seq)

    def _finish(self, seq: Sequence, status: SequenceStatus) -> None:
        seq.status = status
        if self.drafter is not None:
            self.drafter.forget(seq.seq_id)
        if self._solo == seq.seq_id:
            self._solo = None
        self.by_id.pop(seq.seq_id, None)

    def check_integrity(self) -> None:
        self.bm.check_integrity(self.running)
        assert all(s.status is SequenceStatus.RUNNING for s in self.running)
        assert all(s.status is SequenceStatus.WAITING and s.seq_id not in self.bm.holdings for s in self.waiting)
