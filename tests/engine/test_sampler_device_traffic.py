"""What one batched sampling call asks of a GPU, counted on fake ``cuda`` tensors: the rows (with the ids of
histories begun this step) cross in one staged copy, the results come back in one non-blocking read, and
nothing else crosses or syncs."""

import torch

from atom.bench.fake_device import DeviceAccessCounter, fake_cuda
from atom.model_executor.sampler import Sampler
from atom.sampling_params import SamplingParams

VOCAB = 64
MIXED = (
    SamplingParams(max_tokens=8, temperature=0.8, seed=7),
    SamplingParams(max_tokens=8, temperature=1.0, top_p=0.9, top_k=20),
    SamplingParams(max_tokens=8, temperature=0.7, presence_penalty=0.5, frequency_penalty=0.3, repetition_penalty=1.2),
    SamplingParams(max_tokens=8, temperature=0.0, logit_bias=((5, 2.0), (9, -1.0)), min_tokens=3),
    SamplingParams(max_tokens=8, temperature=0.9, min_p=0.1, logprobs=3),
)


@torch.no_grad()
def test_sampling_with_new_histories_and_drafts_crosses_in_one_staged_copy_and_one_token_read():
    with fake_cuda():
        sampler = Sampler(seed=0, eos_token_id=2, device="cuda")
        logits = torch.empty(len(MIXED) + 3, VOCAB, device="cuda")
        with DeviceAccessCounter() as counter:
            requests = []
            for sid, params in enumerate(MIXED):
                if params.needs_history:  # begun this step: its prompt and output ids must reach the device too
                    sampler.begin(sid, (3, 4, 4, 10 + sid), (6,), VOCAB, torch.device("cuda"))
                requests.append(sampler.request(sid, params, 5))
            requests.append(sampler.request(9, SamplingParams(max_tokens=8, temperature=0.0), 5, drafts=(1, 2)))
            out = sampler.sample_all(logits, requests)
    assert counter.counts() == {"h2d": 0, "syncs": 0, "data_dependent": 0, "staged_h2d": 1, "token_reads": 1}
    assert len(out.tokens) == len(requests) and out.logprobs[4] is not None
