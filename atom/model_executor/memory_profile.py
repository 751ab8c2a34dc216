"""Sizing the KV arena from what a GPU has left: ``--gpu-memory-utilization F``, as vLLM users know it.

After the weights are loaded, a profiling run executes the largest step the scheduler can build (the
token budget ``max_num_batched_tokens`` spread over ``max_num_seqs`` prompts, one prefill step) and then
one decode step of all of them, on a small temporary arena, and measures the memory each allocates
beyond what was allocated before it (``torch.cuda.max_memory_allocated`` after resetting the peak).
With speculative decoding (``speculative_num_tokens`` K > 0) the profiling runner drafts with the MTP
layer like the served one, and the decode step is the verify step of K drafts per request; when decode
steps are replayed from graphs the profiling runner runs them on the bucketed inputs (``padded``), so
the measured step has the shapes of the largest captured graph (the largest bucket, every request
padded to ``1 + K`` rows).
The arena then gets::

    kv = F * total - weights - step peak - graph pool

where ``total`` is the device's memory, ``weights`` what the loaded model holds, ``step peak`` the larger
of the two profiled peaks, and ``graph pool`` the decode step's peak when decode steps are replayed
from CUDA graphs (their private pool holds that step's activations; 0 when steps run eagerly; with
speculative decoding the verify step's). Each
term is printed at start-up (:meth:`MemorySplit.describe`). On the CPU there is no device memory to
measure: the arena is sized by ``--kv-cache-memory`` there.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import torch

from atom.config import CacheConfig, Dsv4KvSpec, SchedulerConfig
from atom.kv.block_manager import BlockManager
from atom.kv.kv_layout import KvLayout
from atom.model_engine.scheduler import Scheduler
from atom.model_engine.sequence import Sequence
from atom.models.deepseek_v4_serving import DeepseekV4ForServing
from atom.sampling_params import SamplingParams
from atom.spec_decode.draft_source import RunnerDrafts

__all__ = ["MemorySplit", "profile_steps", "gpu_memory_split"]


@dataclass(frozen=True)
class MemorySplit:
    """The terms of ``kv = utilization * total - weights - step_peak - graph_pool`` (bytes)."""

    total: int
    utilization: float
    weights: int
    step_peak: int
    graph_pool: int

    @property
    def kv_bytes(self) -> int:
        return int(self.utilization * self.total) - self.weights - self.step_peak - self.graph_pool

    def check(self) -> None:
        """Raise ``ValueError`` when nothing is left for the arena, naming every term."""
        if self.kv_bytes <= 0:
            raise ValueError(f"--gpu-memory-utilization {self.utilization} leaves no memory for the KV arena: "
                             f"{self.describe()}; raise it, or lower --max-num-batched-tokens / --max-num-seqs")

    def describe(self) -> str:
        gib = 1 << 30
        return (f"GPU memory: {self.utilization:g} x {self.total / gib:.2f} GiB = "
                f"{self.utilization * self.total / gib:.2f} GiB; weights {self.weights / gib:.2f} GiB, "
                f"step peak {self.step_peak / gib:.2f} GiB, graph pool {self.graph_pool / gib:.2f} GiB, "
                f"KV arena {self.kv_bytes / gib:.2f} GiB")


def _profiling_prompts(limits: SchedulerConfig, vocab: int) -> list[list[int]]:
    """``max_num_seqs`` prompts (at most ``max_model_len - 2 - K`` tokens each, so two tokens and K drafts can
    follow) whose lengths add up to the token budget, or as close as the limits allow."""
    seqs = min(limits.max_num_seqs, limits.max_num_batched_tokens)
    per = max(1, min(limits.max_num_batched_tokens // seqs, limits.max_model_len - 2 - limits.speculative_num_tokens))
    return [[1 + (i * 7 + j) % (vocab - 1) for j in range(per)] for i in range(seqs)]


def profile_steps(model: DeepseekV4ForServing, spec: Dsv4KvSpec, cache: CacheConfig, limits: SchedulerConfig,
                  measure: Callable[[Callable[[], None]], int], runner_factory: Callable[..., object]
                  ) -> tuple[int, int, int]:
    """``(tokens of the prefill step, its peak, the decode step's peak)``: runs the largest prefill step and
    one decode step of the same requests on a temporary arena; ``measure(fn)`` runs ``fn`` and returns
    the bytes it allocated at its peak; ``runner_factory(model, layout, max_model_len=...)`` builds the
    runner (a :class:`ModelRunner`, drafting ``limits.speculative_num_tokens`` drafts when that is > 0, as
    ``spec``, which then counts the MTP layer, says)."""
    k = limits.speculative_num_tokens
    prompts = _profiling_prompts(limits, model.cfg.vocab_size)
    blocks = sum(-(-(len(p) + 2 + k) // spec.block_size) for p in prompts)
    cache = dataclasses.replace(cache, enable_prefix_caching=False)
    layout = KvLayout.for_chunks(spec, 2 * (blocks + len(prompts)) + 8, limits, cache)
    runner = runner_factory(model, layout, max_model_len=limits.max_model_len)
    sched = Scheduler(limits, BlockManager(layout, cache, mtp_rows=k > 0), eos_token_id=None,
                      drafter=RunnerDrafts() if k else None)
    for p in prompts:  # room for the K drafts of the verify step after the first sampled token
        sched.add(Sequence(p, SamplingParams(max_tokens=2 + k, temperature=0.0, ignore_eos=True), spec.block_size))
    peaks, tokens = [], 0
    for _ in range(2):  # the prefill step, then the decode step
        batch = sched.schedule()
        tokens = tokens or batch.num_tokens
        out: list = []
        peaks.append(measure(lambda: out.append(runner.execute(batch))))
        sched.postprocess(batch, out[0])
    return tokens, peaks[0], peaks[1]


def cuda_peak(fn: Callable[[], None]) -> int:
    """Bytes ``fn`` allocated on the current CUDA device at its peak, beyond what was allocated before."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def gpu_memory_split(model: DeepseekV4ForServing, spec: Dsv4KvSpec, cache: CacheConfig, limits: SchedulerConfig,
                     utilization: float, graphs: bool, runner_factory: Callable[..., object]) -> MemorySplit:
    """The split for ``model`` (loaded on a CUDA device) at ``utilization``; ``graphs``: decode steps will
    be replayed from CUDA graphs."""
    device = model.device
    if device.type != "cuda":
        raise ValueError(f"--gpu-memory-utilization measures a GPU's memory, but the model is on {device}; "
                         "on the CPU size the arena with --kv-cache-memory")
    with torch.cuda.device(device):
        weights = torch.cuda.memory_allocated()
        _, step_peak, decode_peak = profile_steps(model, spec, cache, limits, cuda_peak, runner_factory)
        torch.cuda.empty_cache()
        total = torch.cuda.get_device_properties(device).total_memory
    split = MemorySplit(total, utilization, weights, max(step_peak, decode_peak), decode_peak if graphs else 0)
    split.check()
    return split
