"""Stop strings through the ``openai`` client: multi-token and multi-byte stops, streaming and not."""

from atom.builtin_model import BUILTIN_MODEL_NAME as MODEL

GREEDY = {"ignore_eos": True}


def _greedy(c, prompt, **kw):
    return c.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0, extra_body=GREEDY, **kw)


def _stops_of(text):
    """Two- and three-character stops taken from the greedy text (each token is one byte here, so every
    one of them spans several tokens); the multi-byte ones first."""
    spans = {text[i:i + n] for n in (2, 3) for i in range(1, len(text) - n + 1)}
    return sorted(spans, key=lambda s: (all(ord(ch) < 128 for ch in s), s))[:3]


def test_a_multi_token_stop_cuts_the_text_before_its_first_character_streamed_or_not(server):
    c = server.client()
    text = _greedy(c, "hotel").choices[0].text
    stops = _stops_of(text)
    assert len(stops) == 3 and any(any(ord(ch) >= 128 for ch in s) for s in stops), text
    for stop in stops:
        expected = text[: text.find(stop)]
        r = _greedy(c, "hotel", stop=[stop])
        assert r.choices[0].finish_reason == "stop" and r.choices[0].text == expected, (text, stop)
        chunks = list(_greedy(c, "hotel", stop=[stop], stream=True))
        assert "".join(ch.choices[0].text for ch in chunks) == expected
        assert chunks[-1].choices[0].finish_reason == "stop"


def test_a_stop_that_never_completes_releases_its_held_start_when_the_length_runs_out(server):
    c = server.client()
    text = _greedy(c, "hotel").choices[0].text
    never = text[-1] + "\x00never"  # its first character ends the text, so it is held until the end
    r = _greedy(c, "hotel", stop=[never])
    assert r.choices[0].finish_reason == "length" and r.choices[0].text == text
    chunks = list(_greedy(c, "hotel", stop=[never], stream=True))
    assert "".join(ch.choices[0].text for ch in chunks) == text
