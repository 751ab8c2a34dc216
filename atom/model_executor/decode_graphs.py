"""Decode steps through bucketed, preallocated inputs, replayed from CUDA graphs on a GPU.

Modes (``ModelRunner(graph_mode=...)``):

* ``eager``: every step builds fresh inputs (:func:`~atom.model_ops.step_inputs.build_step_inputs`);
  the CPU default, and what ``--enforce-eager`` selects on a GPU;
* ``padded``: plain decode steps (:meth:`DecodeBuffers.bucket_for`) run eagerly on the bucketed
  buffers, padded to their bucket: the graph path's inputs without capture, so it runs and is tested
  on the CPU;
* ``graph``: as ``padded``, but the forward of each bucket is captured once in a CUDA graph (on the
  bucket's first step) and replayed: one launch of the whole recorded step instead of one per op.
  Needs a CUDA device (ROCm builds of torch expose HIP graphs through the same API) and a forward
  that never reads a device value back, which the serving model declares
  (``supports_decode_graphs``: every routed-expert layer on the fused op; on the torch backend, run
  by the CPU emulation of capture, a runner in ``padded`` / ``graph`` mode binds quantized and
  partitioned experts to the fused op's grouped reference, ``host_free_experts``). A tensor-parallel
  rank captures and replays its own graphs (``atom.parallel.worker.build_rank_runner``), its
  collectives recorded in them.

With speculative decoding the bucketed step is the MTP verify step (every request padded to the runner's
``drafts`` drafts: ``1 + drafts`` rows each; a request with fewer drafts has its missing slots filled with
padding tokens that write and read nothing, and only its real rows are sampled, so its acceptance stops at
its last real draft); its sampling, the acceptance, the
compressor-state commit of the accepted drafts and the MTP drafting run after it, eagerly, on its
:class:`StepInputs` and final stream. The verify forward keeps per-layer projections for that commit
(``DeepseekV4ForServing.pending_commits``); a graph's are the tensors its capture made, rewritten by every
replay, and are handed back to the layers after each replay.

Other steps (prefill chunks, steps that admit or resume a request, batches over the largest bucket) run
eagerly in every mode. A graph is captured per (batch bucket,
context bucket): index widths follow the longest context in the step (:func:`~atom.model_ops.decode_buffers.context_bucket`), so a few widths
are captured per batch bucket, each on first use. Capture runs on padding-only inputs, which write
nothing into the arena (see :mod:`atom.model_ops.decode_buffers`), after two warm-up runs on a side
stream (lazily created workspaces, the stacked expert weights); all graphs share one memory pool.

Each warm-up runs on a fresh :class:`StepInputs`, and the graph is captured on one of its own, kept with
the graph for as long as it lives (:class:`CapturedStep`): the tensors a forward derives from the step's
buffers (``StepInputs.derive``: positions as int32, window and compressed index lists, the rows each
entry pools) are then computed inside the captured region, so every replay recomputes them from the
buffers :meth:`DecodeBuffers.fill` just wrote. Derived tensors cached by a warm-up would be frozen into
the graph with the padding step's values. ``atom.testing.graph_emulation`` replays this code path on the
CPU (``tests/engine/test_decode_graph_replay.py``, ``test_decode_graph_cases.py``,
``tests/parallel/test_parallel_decode_graphs.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from atom.step_contract import ScheduledBatch
from atom.model_ops.decode_buffers import DecodeBuffers
from atom.model_ops.step_inputs import PageTables, StepInputs
from atom.models.deepseek_v4_serving import DeepseekV4ForServing

__all__ = ["GRAPH_MODES", "CapturedStep", "DecodedStep", "DecodeSteps", "serving_graph_mode"]

GRAPH_MODES = ("eager", "padded", "graph")


def serving_graph_mode(model: DeepseekV4ForServing, *, enforce_eager: bool, keep_logits: bool = False,
                       value_checks: bool = False) -> str:
    """The mode a served engine runs: ``graph`` when the model declares that its decode steps can be
    recorded (:attr:`DeepseekV4ForServing.supports_decode_graphs`: on a CUDA/ROCm device, no layer
    reading a device value back, as quantized routed experts do: their GEMM ops take one weight each, so
    their dispatch reads the routing back) unless ``--enforce-eager`` is given, logits of every token are
    kept or value checks are on; ``eager`` otherwise (always on the CPU, where a step has no launch cost
    to save)."""
    allowed = model.supports_decode_graphs and not (enforce_eager or keep_logits or value_checks)
    return "graph" if allowed else "eager"


Forward = Callable[[StepInputs], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class CapturedStep:
    """One captured decode step: the graph, the :class:`StepInputs` it was captured on (its ``derived``
    tensors live in the graph's pool and are rewritten by every replay), the logits and final stream it
    writes, and the per-layer state its forward left for after the step (``kept``: verify steps' commits)."""

    graph: torch.cuda.CUDAGraph
    step: StepInputs
    logits: torch.Tensor
    hidden: torch.Tensor
    kept: Any = None


@dataclass(frozen=True)
class DecodedStep:
    """A bucketed step's result: its inputs (padded to the bucket: the real requests first, then padding),
    the logits of its real requests' rows and the final stream of every row of the bucket."""

    step: StepInputs
    logits: torch.Tensor
    hidden: torch.Tensor


class DecodeSteps:
    """Runs decode steps of up to ``buffers.sizes[-1]`` requests (each verifying ``buffers.drafts`` drafts)
    through ``forward`` (the runner's model forward: ``StepInputs`` -> (logits of ``sample_rows``, final
    stream)) on ``buffers``; ``capture``: in CUDA graphs. ``keep`` / ``restore``: read the per-layer state a
    forward leaves for after the step, and hand a captured graph's back after each of its replays."""

    def __init__(self, forward: Forward, buffers: DecodeBuffers, *, capture: bool,
                 keep: Callable[[], Any] | None = None, restore: Callable[[Any], None] | None = None) -> None:
        if capture and not torch.cuda.is_available():
            raise ValueError("CUDA-graph capture needs a CUDA or ROCm GPU; on the CPU decode steps run eagerly")
        self.forward, self.buffers, self.capture = forward, buffers, capture
        self.keep, self.restore = keep, restore
        self.graphs: dict[tuple[int, int], CapturedStep] = {}  # (batch bucket, context bucket) ->
        self.pool = torch.cuda.graph_pool_handle() if capture else None

    def run(self, batch: ScheduledBatch, tables: PageTables) -> DecodedStep | None:
        """The bucketed step of ``batch`` (``tables`` already updated by it), or None when ``batch`` does not
        qualify (:meth:`DecodeBuffers.bucket_for`; the caller runs it eagerly)."""
        size = self.buffers.bucket_for(batch)
        if size is None:
            return None
        if not self.capture:
            step = self.buffers.fill(batch, tables)
            logits, hidden = self.forward(step)
            return DecodedStep(step, self._sampled(batch, logits), hidden)
        key = (size, self.buffers.context_for(batch))
        if key not in self.graphs:
            self.graphs[key] = self._capture(*key)
        captured = self.graphs[key]
        self.buffers.fill(batch, tables)
        captured.graph.replay()
        if self.restore is not None and captured.kept is not None:
            self.restore(captured.kept)
        return DecodedStep(captured.step, self._sampled(batch, captured.logits), captured.hidden)

    def _sampled(self, batch: ScheduledBatch, logits: torch.Tensor) -> torch.Tensor:
        """The logits of ``batch``'s real rows (every request's own, in order) among the bucket's: the first
        rows, or, when a request's missing drafts were padded, the rows :attr:`DecodeBuffers.kept` lists
        (a gather on the device, its index written with the step's inputs)."""
        rows = sum(s.num_tokens for s in batch.seqs)
        if not self.buffers.padded_drafts(batch):
            return logits[:rows]
        return logits.index_select(0, self.buffers.kept[:rows])

    def _capture(self, size: int, context: int) -> CapturedStep:
        """Warm up twice on padding-only inputs (each run on a fresh ``StepInputs``), then capture on a new
        one that nothing has derived from yet."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self.buffers.pad(size)
                self.forward(self.buffers.inputs(size, context))
        torch.cuda.current_stream().wait_stream(side)
        self.buffers.pad(size)
        step = self.buffers.inputs(size, context)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits, hidden = self.forward(step)
        return CapturedStep(graph, step, logits, hidden, None if self.keep is None else self.keep())
