"""One greedy request run to completion through an engine, its launches counted: what two engine variants are
compared on (same tokens, same logits at every step, fewer launches)."""

from __future__ import annotations

import torch

from atom.bench.kernel_count import KernelCounter
from atom.sampling_params import SamplingParams


def counted_greedy_run(engine, prompt: list[int], max_tokens: int
                       ) -> tuple[list[int], list[torch.Tensor], KernelCounter, int]:
    """(greedy tokens, logits of every step, launches counted, forward steps) of ``prompt`` to completion."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    seq = engine.sequence(engine.add_request(prompt, params))
    logits, steps = [], 0
    with KernelCounter() as count:
        while engine.has_unfinished_requests():
            step = engine.step_detailed()
            steps += 1
            logits += [step.output.logits[item.seq_id].clone() for item in step.batch.seqs]
    return seq.output_token_ids, logits, count, steps
