"""The OpenAI-compatible API through the official ``openai`` client, against a real server."""

import httpx
import pytest

from atom.builtin_model import BUILTIN_MODEL_NAME as MODEL

pytestmark = pytest.mark.slow

PROMPT = "The quick brown fox jumps over the lazy dog."
EXACT = {"ignore_eos": True}  # random weights may emit EOS; these tests count tokens exactly


def test_a_completion_returns_text_finish_reason_and_usage(server):
    r = server.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0, extra_body=EXACT)
    assert r.object == "text_completion" and r.model == MODEL and r.id.startswith("cmpl-")
    assert len(r.choices) == 1 and r.choices[0].finish_reason == "length" and r.choices[0].index == 0
    assert isinstance(r.choices[0].text, str)
    assert r.usage.prompt_tokens == len(PROMPT.encode()) + 1  # bytes + BOS
    assert r.usage.completion_tokens == 5 and r.usage.total_tokens == r.usage.prompt_tokens + 5
    assert r.usage.prompt_tokens_details.cached_tokens == 0


def test_a_chat_completion_uses_the_chat_template_and_returns_an_assistant_message(server):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    r = server.client().chat.completions.create(model=MODEL, messages=msgs, max_tokens=4, temperature=0,
                                                extra_body=EXACT)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 4
    # BOS + system + <｜User｜> + "hi" + <｜Assistant｜>
    assert r.usage.prompt_tokens == 1 + len("Be brief.") + 1 + 2 + 1


def test_max_completion_tokens_wins_over_max_tokens_in_chat(server):
    r = server.client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                                max_tokens=9, max_completion_tokens=3, extra_body=EXACT)
    assert r.usage.completion_tokens == 3


def test_streaming_a_greedy_completion_gives_the_same_text_as_the_plain_one(server):
    c = server.client()
    plain = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, extra_body=EXACT)
    chunks = list(c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, stream=True,
                                       extra_body=EXACT))
    assert "".join(ch.choices[0].text for ch in chunks) == plain.choices[0].text
    assert [ch.choices[0].finish_reason for ch in chunks][-1] == "length"
    assert all(ch.choices[0].finish_reason is None for ch in chunks[:-1])


def test_a_streamed_chat_starts_with_the_role_and_ends_with_usage_when_asked(server):
    stream = server.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=6, stream=True, seed=1,
        stream_options={"include_usage": True}, extra_body=EXACT)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    assert all(ch.usage is None for ch in chunks[:-1])
    assert chunks[-2].choices[0].finish_reason == "length"


def test_the_raw_stream_is_server_sent_events_ending_in_done(server):
    body = {"model": MODEL, "prompt": "abc", "max_tokens": 3, "stream": True}
    with httpx.stream("POST", f"{server.base_url}/completions", json=body, timeout=60) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        events = [line for line in resp.iter_lines() if line]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"


def test_n_equals_two_returns_two_indexed_choices_and_counts_both_in_usage(server):
    r = server.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, n=2, seed=5, extra_body=EXACT)
    assert sorted(ch.index for ch in r.choices) == [0, 1]
    assert r.usage.completion_tokens == 8 and r.usage.prompt_tokens == len(PROMPT.encode()) + 1
    chunks = list(server.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=3, n=2, stream=True, extra_body=EXACT))
    finished = {ch.choices[0].index for ch in chunks if ch.choices and ch.choices[0].finish_reason}
    assert finished == {0, 1}


def test_a_list_of_prompts_and_token_id_prompts_are_accepted(server):
    c = server.client()
    r = c.completions.create(model=MODEL, prompt=["ab", "cde"], max_tokens=2, extra_body=EXACT)
    assert [ch.index for ch in r.choices] == [0, 1] and r.usage.prompt_tokens == 3 + 4
    r = c.completions.create(model=MODEL, prompt=[256, 104, 105], max_tokens=2, temperature=0, extra_body=EXACT)
    assert r.usage.prompt_tokens == 3


def test_a_stop_string_ends_the_text_before_it_with_finish_reason_stop(server):
    c = server.client()
    full = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0, extra_body=EXACT)
    text = full.choices[0].text
    cut = next((i for i in range(1, len(text)) if text[i] not in "\ufffd" and text[i] not in text[:i]), None)
    if cut is None:
        pytest.skip(f"greedy text {text!r} has no character usable as a stop string")
    r = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0, stop=[text[cut]],
                             extra_body=EXACT)
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == text[:cut]
    streamed = list(c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0, stop=text[cut],
                                         stream=True, extra_body=EXACT))
    assert "".join(ch.choices[0].text for ch in streamed) == text[:cut]
    assert streamed[-1].choices[0].finish_reason == "stop"


def test_the_same_seed_gives_the_same_text_and_other_seeds_differ(server):
    c = server.client()

    def sample(seed):
        r = c.completions.create(model=MODEL, prompt="seed test", max_tokens=16, temperature=1.0, seed=seed,
                                 extra_body=EXACT)
        return r.choices[0].text, r.usage.completion_tokens

    first = sample(11)
    assert sample(11) == first
    assert any(sample(s) != first for s in (12, 13, 14))


def test_a_repeated_prompt_reports_cached_tokens_from_the_prefix_cache(server):
    prompt = [50 + (i * 7) % 150 for i in range(49)]  # 3 full blocks of 16 + 1: the prefix can be reused
    c = server.client()
    first = c.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0)
    hits_before = server.metrics()["atom_prefix_cache_hits_total"]
    second = c.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached < 49 and cached % 16 == 0
    assert server.metrics()["atom_prefix_cache_hits_total"] >= hits_before + cached


def test_models_health_and_metrics_endpoints(server):
    models = server.client().models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
    # one request of its own: the session's server may not have served any on this test worker yet
    server.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, temperature=0, extra_body=EXACT)
    m = server.metrics()
    for name in ('atom_kv_arena_bytes{owner="free"}', 'atom_kv_arena_bytes{owner="swa"}',
                 'atom_kv_arena_bytes{owner="compress"}', "atom_num_requests_running", "atom_num_requests_waiting",
                 "atom_num_preemptions_total", "atom_prefix_cache_hits_total",
                 'atom_prefix_cache_misses_total{reason="swa_window"}', "atom_prompt_tokens_total",
                 "atom_generation_tokens_total", "atom_time_to_first_token_seconds_count",
                 "atom_time_per_output_token_seconds_count", "atom_engine_healthy"):
        assert name in m, name
    assert "atom_prefix_cache_queries_total" not in m  # the prompt tokens, counted once as atom_prompt_tokens
    assert m["atom_engine_healthy"] == 1.0 and m["atom_generation_tokens_total"] > 0


def test_echo_puts_the_prompt_before_the_completion(server):
    c = server.client()
    r = c.completions.create(model=MODEL, prompt="echo me", max_tokens=3, echo=True, temperature=0, extra_body=EXACT)
    plain = c.completions.create(model=MODEL, prompt="echo me", max_tokens=3, temperature=0, extra_body=EXACT)
    assert r.choices[0].text == "echo me" + plain.choices[0].text
    streamed = list(c.completions.create(model=MODEL, prompt="echo me", max_tokens=3, echo=True, temperature=0,
                                         stream=True, extra_body=EXACT))
    assert "".join(ch.choices[0].text for ch in streamed) == r.choices[0].text
