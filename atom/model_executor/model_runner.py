"""ModelRunner: executes one ScheduledBatch of a DeepSeek-V4 model on the KV arena, and samples.

It only sequences work: apply the batch's table deltas (:mod:`step_inputs`), build the step tensors,
run the serving model's forward (:class:`DeepseekV4ForServing`: the arena attention in every layer, the
head on the rows that sample only; kernel value checks off, no device value read back inside it),
sample (:mod:`sampler`, one read-back per step), and return a :class:`RunnerOutput`. It binds the arena
it allocates to the model, takes the arena geometry from the model's KV spec and whether decode steps
may be recorded in CUDA graphs from the model's declaration; it holds no scheduler state.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
from typing import Callable

import torch

from atom.kernels.backend import load_kernels, value_checks_off
from atom.kv.kv_layout import KvLayout
from atom.step_contract import ReadyOutput, RunnerOutput, ScheduledBatch
from atom.model_ops.kv_views import bind_kv_arena
from atom.spec_decode.mtp_draft import MtpDrafter
from atom.model_executor.decode_graphs import GRAPH_MODES, DecodeSteps
from atom.model_executor.host_copies import HostCopies
from atom.model_executor.sampler import Sampler
from atom.model_executor.step_thread import StepThread
from atom.model_ops.decode_buffers import DecodeBuffers
from atom.model_ops.step_inputs import PageTables, StepInputs, build_step_inputs, row_subset
from atom.models.deepseek_v4_serving import DeepseekV4ForServing

__all__ = ["ModelRunner"]


class ModelRunner:
    """Runs steps of the serving ``model`` over an arena sized by ``layout`` (the model is bound to it).

    ``keep_logits``: return the logits of every row in :attr:`RunnerOutput.logits` (seq_id ->
    ``[T, vocab]``), for tests that compare the engine with the reference model step by step;
    otherwise the head runs only on the rows that sample. ``value_checks``: run the kernels' value checks (each a device sync) inside
    the step; off in serving (the inputs come from the scheduler), on in tests.
    ``speculative_num_tokens`` > 0: after every step the model's MTP layer writes its KV rows and
    proposes that many drafts per sampling request (``RunnerOutput.drafts``, :mod:`mtp_draft`); the
    layout must then count the MTP layer.
    ``graph_mode``: how plain decode steps run (:mod:`decode_graphs`): ``eager`` (fresh inputs every
    step), ``padded`` (bucketed preallocated inputs, eager) or ``graph`` (those inputs, replayed from
    CUDA graphs; a GPU); with speculative decoding the bucketed step is the MTP verify step (every request
    verifying ``speculative_num_tokens`` drafts), drafting and committing after it eagerly.
    ``host_free_experts``: on the torch backend, quantized or partitioned routed experts run ``fused_moe``'s
    grouped reference (nothing read back) instead of one GEMM per expert; None = when ``graph_mode`` is not
    ``eager`` (an eager run given True computes what those modes compute, unpadded).
    ``host_kv_chunks`` > 0: the host tier's buffer of that many arena chunks (:mod:`host_copies`); each
    batch's copy orders run before its forward.
    ``step_thread``: :meth:`launch` runs steps on a thread of their own (:mod:`step_thread`), so the
    engine schedules the next step while one runs; None = on a GPU only (on the CPU torch runs each op
    before returning, and a launched step then runs at launch, its output applied when asked for).
    """

    def __init__(self, model: DeepseekV4ForServing, layout: KvLayout, *, max_model_len: int, seed: int = 0,
                 poison: bool = False, kernel_backend: str | None = None, keep_logits: bool = False,
                 eos_token_id: int | None = None, value_checks: bool = False, speculative_num_tokens: int = 0,
                 graph_mode: str = "eager", step_thread: bool | None = None, host_kv_chunks: int = 0,
                 host_free_experts: bool | None = None) -> None:
        if not isinstance(model, DeepseekV4ForServing):
            raise TypeError(f"ModelRunner runs the serving model (DeepseekV4ForServing), got {type(model).__name__}; "
                            "load it with load_checkpoint(..., model_class=DeepseekV4ForServing)")
        self.model = model.eval()
        self.device = model.device
        self.views = bind_kv_arena(layout, poison=poison, device=self.device)
        self.kernels = load_kernels(kernel_backend)
        # quantized / partitioned routed experts on the torch backend: the grouped reference when decode steps
        # run on bucketed inputs (their forward must read nothing back), the reference model's loop otherwise
        host_free_experts = graph_mode != "eager" if host_free_experts is None else host_free_experts
        model.bind_arena(self.views, self.kernels, host_free_experts=host_free_experts)
        # the host tier's bytes (host_kv_chunks arena chunks); the batch's copy orders run before each step
        self.host_copies = HostCopies(layout, host_kv_chunks, self.views.buffer, self.kernels.copy_pages,
                                      poison=poison) if host_kv_chunks else None
        max_blocks = -(-max_model_len // layout.spec.block_size)
        self.tables = PageTables(layout.max_live_requests, max_blocks, device=self.device)
        self.sampler = Sampler(seed, eos_token_id, device=self.device)
        self.keep_logits, self.value_checks = keep_logits, value_checks
        self.mtp = MtpDrafter(model, speculative_num_tokens, max_model_len) if speculative_num_tokens else None
        self.decode = self._decode_steps(graph_mode, layout.max_live_requests, max_model_len, speculative_num_tokens)
        use_thread = self.device.type != "cpu" if step_thread is None else step_thread
        self._thread = StepThread() if use_thread else None

    def launch(self, batch: ScheduledBatch) -> concurrent.futures.Future | ReadyOutput:
        """Start ``batch``: the handle's ``result()`` waits for its :class:`RunnerOutput` (and raises
        what :meth:`execute` raised). Launch the next step only after that result: steps share the
        runner's tables, sampler and arena."""
        if self._thread is None:
            return ReadyOutput(self.execute(batch))
        return self._thread.submit(self._execute_on_device, batch)

    def _execute_on_device(self, batch: ScheduledBatch) -> RunnerOutput:
        """:meth:`execute` on the step thread, with the runner's GPU current there (events, graphs and
        streams follow the current device, which a new thread does not inherit)."""
        if self.device.type != "cuda":
            return self.execute(batch)
        with torch.cuda.device(self.device):
            return self.execute(batch)

    @torch.no_grad()
    def execute(self, batch: ScheduledBatch) -> RunnerOutput:
        self.tables.apply(batch)
        if self.host_copies is not None:
            self.host_copies.run(batch.host_stores, batch.host_loads)
        self.sampler.release(batch.released_ids)
        if not batch.seqs:
            return RunnerOutput({})
        checks = contextlib.nullcontext if self.value_checks else value_checks_off
        with checks():
            decoded = None if self.decode is None else self.decode.run(batch, self.tables)
            if decoded is None:
                step = build_step_inputs(batch, self.tables, self.device, self.model.cfg.compress_ratios)
                logits, hidden = self._forward(step)
            else:  # a bucketed step: its inputs padded to the bucket, the real requests' rows first
                step, logits, hidden = decoded.step, decoded.logits, decoded.hidden
        kept: dict[int, torch.Tensor] = {}
        if self.keep_logits:
            lo = 0
            for item in batch.seqs:
                kept[item.seq_id] = logits[lo:lo + item.num_tokens].clone()
                lo += item.num_tokens
            logits = logits[step.sample_rows]
        for item in batch.seqs:
            if item.history is not None:
                self.sampler.begin(item.seq_id, *item.history, logits.shape[-1], logits.device)
        propose = None
        if self.mtp is not None:
            def propose(tokens: torch.Tensor, accepted: torch.Tensor) -> torch.Tensor:
                with checks():  # the MTP drafts run on the device, read back with the sampled tokens
                    return self.mtp.propose(batch, step, self.tables, hidden, tokens, accepted)
        out, drafted = self._sample(batch, logits, propose)
        with checks():  # the commit runs with the forward's value-check setting
            if step.committed is not None:
                self._commit(batch, step, out.accepted)
        if self.mtp is not None:
            out = dataclasses.replace(out, drafts=self.mtp.drafts(batch, out, drafted))
        return dataclasses.replace(out, logits=kept) if kept else out

    @torch.no_grad()
    def pad_step(self, rows: int = 1) -> None:
        """Data-parallel attention, this replica has nothing to run: every layer's MoE exchange with ``rows``
        zero rows (:meth:`DeepseekV4ForServing.pad_experts`), no attention, no KV page touched, nothing
        sampled; the replicas running real steps need this rank in their expert collectives."""
        with value_checks_off():
            self.model.pad_experts(rows)

    def _sample(self, batch: ScheduledBatch, logits: torch.Tensor, after: Callable | None = None
                ) -> tuple[RunnerOutput, tuple[int, ...]]:
        """Rows of ``logits``: one per sampling request, ``1 + num_draft`` for a request with drafts. Every
        request samples (and verifies its drafts) in one batched call with one read-back, which also
        brings back the values of ``after`` (:meth:`Sampler.sample_all`): ``(the output, those values)``."""
        items = [item for item in batch.seqs if item.sample]
        requests = [self.sampler.request(item.seq_id, item.params, item.start_pos + item.num_committed, item.drafts)
                    for item in items]
        out = self.sampler.sample_all(*(logits, requests) + (() if after is None else (after,)))
        sampled = {item.seq_id: t for item, t in zip(items, out.tokens)}
        accepted = {item.seq_id: a for item, a in zip(items, out.accepted) if item.num_draft}
        logprobs = {item.seq_id: lp for item, lp in zip(items, out.logprobs) if lp is not None}
        return RunnerOutput(sampled, logprobs, accepted), out.extra

    def _commit(self, batch: ScheduledBatch, step: StepInputs, accepted: dict[int, int]) -> None:
        """Advance every layer's compressor state over the accepted drafts of the step just run."""
        starts, lo = [], 0
        for item, rows in zip(batch.seqs, step.lengths):  # row offsets from host lists: no read of step.cu_seqlens
            starts.append(lo + item.num_committed)
            lo += rows  # a bucketed verify step's request spans its padded draft slots too
        pad = len(step.lengths) - len(batch.seqs)  # a bucketed step's padding requests accept nothing
        sub = row_subset(starts + [lo] * pad, [accepted.get(item.seq_id, 0) for item in batch.seqs] + [0] * pad,
                         [item.start_pos + item.num_committed for item in batch.seqs] + [0] * pad, self.device)
        self.model.commit(sub, step, self.tables)

    def _decode_steps(self, mode: str, max_seqs: int, max_model_len: int, drafts: int) -> DecodeSteps | None:
        if mode not in GRAPH_MODES:
            raise ValueError(f"graph_mode={mode!r}; accepted: {', '.join(GRAPH_MODES)}")
        if mode == "eager":
            return None
        if self.keep_logits or self.value_checks:
            raise ValueError(f"graph_mode={mode!r} samples decode steps only: keep_logits and value_checks need "
                             "graph_mode='eager'")
        unsynced = self.model.host_synced_layers
        if mode == "graph" and unsynced:
            raise ValueError(f"graph_mode='graph' needs a forward without host reads; the routed experts of layers "
                             f"{unsynced} run one GEMM per expert (quantized or expert-parallel); use 'eager'")
        buffers = DecodeBuffers(max_seqs, self.model.cfg.compress_ratios, max_model_len, self.tables.padding_row,
                                self.device, drafts=drafts)
        return DecodeSteps(lambda step: self._forward(step), buffers, capture=mode == "graph",
                           keep=self.model.pending_commits, restore=self.model.restore_pending_commits)

    def _forward(self, step: StepInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """The serving model's forward over ``step``: logits of the rows that sample (every row with
        ``keep_logits``) and the final stream of every row; no device value is read back."""
        return self.model(step, self.tables, all_rows=self.keep_logits)
