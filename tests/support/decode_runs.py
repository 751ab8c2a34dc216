"""Running the same requests through a paged engine in each decode mode, recording what it samples."""

from __future__ import annotations

import torch

from atom.bench.forward import prompt
from atom.config import CacheConfig, SchedulerConfig
from atom.kv.block_manager import BlockManager
from atom.kv.kv_layout import plan_kv_layout
from atom.model_engine.llm_engine import LLMEngine
from atom.model_engine.scheduler import Scheduler
from atom.model_executor.model_runner import ModelRunner
from atom.models.deepseek_v4.checkpoint import random_state_dict
from atom.models.deepseek_v4.config import DeepseekV4Config
from atom.models.deepseek_v4_serving import DeepseekV4ForServing
from atom.sampling_params import SamplingParams

MAX_LEN = 64


def thin_model(device: str = "cpu") -> DeepseekV4ForServing:
    """SWA, CSA and HCA layers, hash-routed layers and top-k routing at toy widths."""
    cfg = DeepseekV4Config.tiny(n_mtp_layers=0, compress_ratios=(0, 4, 16, 4, 16, 4), vocab_size=1024)
    model = DeepseekV4ForServing(cfg)
    model.load_state_dict(random_state_dict(cfg, seed=3))
    return model.to(device).eval()


def sampled_run(model: DeepseekV4ForServing, graph_mode: str, kernel_backend: str = "torch", requests: int = 5,
                ) -> tuple[dict[int, list[int]], list[torch.Tensor]]:
    """(tokens each request sampled, by admission order; the logits of every step, as sampled) for
    ``requests`` requests of different lengths (chunked prefill, then decode steps whose batch shrinks
    as requests finish), one of them seeded random sampling; the arena starts NaN-poisoned."""
    cache = CacheConfig(kv_cache_bytes=1 << 26, enable_prefix_caching=False)
    limits = SchedulerConfig(max_num_batched_tokens=48, max_num_seqs=requests, max_model_len=MAX_LEN)
    layout = plan_kv_layout(model.cfg.kv_spec("fp32", include_mtp=False), cache, limits)
    sched = Scheduler(limits, BlockManager(layout, cache), eos_token_id=None)
    runner = ModelRunner(model, layout, max_model_len=MAX_LEN, kernel_backend=kernel_backend, graph_mode=graph_mode,
                         poison=True)
    logits, sample_all = [], runner.sampler.sample_all

    def recorded(step_logits, *args):
        logits.append(step_logits.clone())
        return sample_all(step_logits, *args)

    runner.sampler.sample_all = recorded
    engine = LLMEngine(sched, runner, max_model_len=MAX_LEN)
    for i in range(requests):
        params = SamplingParams(max_tokens=6 + 3 * i, temperature=1.0 if i == 1 else 0.0, seed=11, ignore_eos=True)
        engine.add_request(prompt(9 + 5 * i, i), params)
    tokens: dict[int, list[int]] = {}
    while (batch := sched.schedule()).seqs:
        out = runner.execute(batch)
        sched.postprocess(batch, out)
        for sid, token in out.sampled.items():
            tokens.setdefault(sid, []).append(token)
    first = min(tokens)
    return {sid - first: t for sid, t in tokens.items()}, logits
