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
  (``supports_decode_graphs``: every routed-expert layer on the grouped path, dense experts all held
  on this rank).

Other steps (prefill chunks, steps that admit or resume a request, batches over the largest bucket)
run eagerly in every mode. A graph is captured per (batch bucket, context bucket): index widths follow
the longest context in the step (:func:`~atom.model_ops.decode_buffers.context_bucket`), so a few widths
are captured per batch bucket, each on first use. Capture runs on padding-only inputs, which write
nothing into the arena (see :mod:`atom.model_ops.decode_buffers`), after two warm-up runs on a side
stream (lazily created workspaces, the stacked expert weights); all graphs share one memory pool.

Each warm-up runs on a fresh :class:`StepInputs`, and the graph is captured on one of its own, kept with
the graph for as long as it lives (:class:`CapturedStep`): the tensors a forward derives from the step's
buffers (``StepInputs.derive``: positions as int32, window and compressed index lists, the rows each
entry pools) are then computed inside the captured region, so every replay recomputes them from the
buffers :meth:`DecodeBuffers.fill` just wrote. Derived tensors cached by a warm-up would be frozen into
the graph with the padding step's values. ``atom.testing.graph_emulation`` replays this code path on the
CPU (``tests/engine/test_decode_graph_replay.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from atom.step_contract import ScheduledBatch
from atom.model_ops.decode_buffers import DecodeBuffers
from atom.model_ops.step_inputs import PageTables, StepInputs
from atom.models.deepseek_v4_serving import DeepseekV4ForServing

__all__ = ["GRAPH_MODES", "CapturedStep", "DecodeSteps", "serving_graph_mode"]

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


@dataclass(frozen=True)
class CapturedStep:
    """One captured decode step: the graph, the :class:`StepInputs` it was captured on (its ``derived``
    tensors live in the graph's pool and are rewritten by every replay) and the logits it writes."""

    graph: torch.cuda.CUDAGraph
    step: StepInputs
    logits: torch.Tensor


class DecodeSteps:
    """Runs plain decode steps of up to ``buffers.sizes[-1]`` requests through ``forward`` (the runner's
    model forward: ``StepInputs`` -> logits of ``sample_rows``) on ``buffers``; ``capture``: in CUDA graphs."""

    def __init__(self, forward: Callable[[StepInputs], torch.Tensor], buffers: DecodeBuffers, *,
                 capture: bool) -> None:
        if capture and not torch.cuda.is_available():
            raise ValueError("CUDA-graph capture needs a CUDA or ROCm GPU; on the CPU decode steps run eagerly")
        self.forward, self.buffers, self.capture = forward, buffers, capture
        self.graphs: dict[tuple[int, int], CapturedStep] = {}  # (batch bucket, context bucket) ->
        self.pool = torch.cuda.graph_pool_handle() if capture else None

    def run(self, batch: ScheduledBatch, tables: PageTables) -> torch.Tensor | None:
        """Logits ``[len(batch.seqs), vocab]`` of a plain decode step (``tables`` already updated by it), or
        None when ``batch`` is not one (the caller runs it eagerly)."""
        size = self.buffers.bucket_for(batch)
        if size is None:
            return None
        if not self.capture:
            return self.forward(self.buffers.fill(batch, tables))[: len(batch.seqs)]
        key = (size, self.buffers.context_for(batch))
        if key not in self.graphs:
            self.graphs[key] = self._capture(*key)
        captured = self.graphs[key]
        self.buffers.fill(batch, tables)
        captured.graph.replay()
        return captured.logits[: len(batch.seqs)]

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
            logits = self.forward(step)
        return CapturedStep(graph, step, logits)
