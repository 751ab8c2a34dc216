"""A request's token list: a private copy of the prompt, with room for its first outputs."""

import sys

from atom.kv.int_runs import id_run
from atom.model_engine.sequence import Sequence
from atom.sampling_params import SamplingParams


def test_a_long_prompts_first_outputs_are_appended_without_reallocating_its_token_list():
    prompt = list(range(1, 131073))
    seq = Sequence(prompt, SamplingParams(max_tokens=33), block_size=128)
    size = sys.getsizeof(seq.token_ids)  # (a list's size counts the memory it has allocated)
    for t in range(33):
        seq.append_token(t)
    assert sys.getsizeof(seq.token_ids) == size
    assert seq.token_ids == prompt + list(range(33)) and len(seq) == 131072 + 33
    assert seq.num_prompt_tokens == 131072 and seq.output_token_ids == list(range(33))


def test_the_token_list_is_a_copy_of_the_prompt_of_exactly_its_length():
    for prompt in ([7], [5, 6, 7], list(range(1, 1000))):
        before = list(prompt)
        seq = Sequence(prompt, SamplingParams(max_tokens=4096), block_size=16)
        assert seq.token_ids == prompt and seq.token_ids is not prompt and len(seq) == len(prompt)
        seq.append_token(9)
        assert prompt == before and seq.token_ids == before + [9]


def test_an_id_run_equals_the_range_and_reuses_its_int_objects_past_the_first_size():
    far = (1 << 12) * 5 + 3  # past the list made at import: it grows
    run = id_run(far - 70, far)
    assert run == list(range(far - 70, far))
    assert id_run(far - 1, far)[0] is run[-1]  # the same object, not a new int
    assert id_run(10, 10) == [] and id_run(0, 3) == [0, 1, 2]
