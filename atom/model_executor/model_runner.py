"""ModelRunner: executes one ScheduledBatch on the model and the KV arena, and samples.

It only sequences work: apply the batch's table deltas (:mod:`step_inputs`), build the step tensors,
run the DeepSeek-V4 blocks with :class:`PagedDeepseekV4Attention` in place of the reference cache,
sample (:mod:`sampler`), and return a :class:`RunnerOutput`. It knows nothing model-family specific
beyond what the model declares (its KV spec) and holds no scheduler state.
"""

from __future__ import annotations

import torch

from atom.kernels.backend import load_kernels
from atom.model_engine.kv_layout import KvLayout
from atom.model_engine.outputs import RunnerOutput, ScheduledBatch
from atom.model_executor.kv_views import bind_kv_arena
from atom.model_executor.sampler import Sampler
from atom.model_executor.step_inputs import PageTables, StepInputs, build_step_inputs
from atom.model_ops.deepseek_v4_attn import PagedDeepseekV4Attention
from atom.models.deepseek_v4.layers import map_rows
from atom.models.deepseek_v4.model import DeepseekV4Model

__all__ = ["ModelRunner"]


class ModelRunner:
    """Runs steps of ``model`` over an arena sized by ``layout``.

    ``keep_logits``: keep every step's logits (``last_logits``: seq_id -> ``[T, vocab]``), for tests
    that compare the engine with the reference model step by step.
    """

    def __init__(self, model: DeepseekV4Model, layout: KvLayout, *, max_model_len: int, seed: int = 0,
                 poison: bool = False, kernel_backend: str | None = None, keep_logits: bool = False,
                 eos_token_id: int | None = None) -> None:
        self.model = model.eval()
        self.device = model.embed.weight.device
        self.views = bind_kv_arena(layout, poison=poison, device=self.device)
        self.kernels = load_kernels(kernel_backend)
        model.bind_kernels(self.kernels)
        max_blocks = -(-max_model_len // layout.spec.block_size)
        self.tables = PageTables(layout.max_live_requests, max_blocks, device=self.device)
        self.attn = [PagedDeepseekV4Attention(block.attn, self.views, self.kernels) for block in model.layers]
        self.sampler = Sampler(seed, eos_token_id)
        self.keep_logits = keep_logits
        self.last_logits: dict[int, torch.Tensor] = {}

    @torch.no_grad()
    def execute(self, batch: ScheduledBatch) -> RunnerOutput:
        self.tables.apply(batch)
        self.sampler.release(batch.released_ids)
        if not batch.seqs:
            return RunnerOutput({})
        step = build_step_inputs(batch, self.tables, self.device)
        logits = self._forward(step)
        sampled, logprobs, self.last_logits = {}, {}, {}
        for s, item in enumerate(batch.seqs):
            lo, hi = int(step.cu_seqlens[s]), int(step.cu_seqlens[s + 1])
            if self.keep_logits:
                self.last_logits[item.seq_id] = logits[lo:hi].clone()
            if item.history is not None:
                self.sampler.begin(item.seq_id, *item.history, logits.shape[-1], logits.device)
            if item.sample:
                row = logits[hi - 1]
                token = self.sampler.sample(row, item.params, item.start_pos + item.num_tokens, item.seq_id)
                sampled[item.seq_id] = token
                lp = self.sampler.logprobs(row, item.params, token)
                if lp is not None:
                    logprobs[item.seq_id] = lp
        return RunnerOutput(sampled, logprobs)

    def _forward(self, step: StepInputs) -> torch.Tensor:
        model, rw = self.model, self.model.cfg.batch_invariant
        h = model.embed_tokens(step.token_ids)
        for block, attn in zip(model.layers, self.attn):
            x, post, comb = map_rows(block.attn_input, rw, h)
            a = attn.forward(x, step, self.tables)
            h = map_rows(block.attn_output_and_ffn, rw, a, h, post, comb, step.token_ids)
        return model.head_logits(h)
