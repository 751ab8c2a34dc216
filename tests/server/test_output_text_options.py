"""``include_stop_str_in_output`` and ``skip_special_tokens``: the stop string kept at the end of the text, and
special tokens in or out of it, from the request text of one sequence up to the API."""

import pytest

from atom.builtin_model import BUILTIN_MODEL_NAME as MODEL
from atom.output.request_text import RequestText
from atom.output.stop_strings import StopAutomaton, StopScanner
from atom.tokenizer import Tokenizer, write_builtin_tokenizer
from tests.support.request_text import stream_text

USER_TOKEN = 258  # <｜User｜> in the built-in tokenizer
EOS_TOKEN = 257


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return Tokenizer.from_dir(write_builtin_tokenizer(tmp_path_factory.mktemp("tok")))


def test_the_scanner_ends_the_text_after_the_stop_when_asked_to_keep_it():
    scanner = StopScanner(StopAutomaton(("</tool>",)), include_stop=True)
    assert scanner.feed("a </to") == ("a ", False)  # a possible stop start is still held
    assert scanner.feed("ol>tail") == ("</tool>", True)


def test_a_multi_token_stop_is_kept_at_the_end_of_the_text_and_nothing_after_it(tok):
    ids = list("ok 世界 done".encode())
    text = RequestText(tok.decode, ("界 d",), include_stop=True)
    sent, stopped = stream_text(text, ids)
    assert stopped and "".join(sent) == "ok 世界 d" == text.text()


def test_overlapping_stops_keep_the_one_that_completed_first(tok):
    text = RequestText(tok.decode, ("bcd", "abcdef", "c"), include_stop=True)
    sent, stopped = stream_text(text, list(b"xabcdefg"))
    assert stopped and "".join(sent) == "xabc"


def test_special_tokens_are_in_the_text_only_when_not_skipped(tok):
    ids = [ord("a"), USER_TOKEN, ord("b")]
    kept = RequestText(lambda w: tok.decode(w, skip_special_tokens=False), ())
    skipped = RequestText(lambda w: tok.decode(w, skip_special_tokens=True), ())
    assert "".join(stream_text(kept, ids)[0]) == "a<｜User｜>b"
    assert "".join(stream_text(skipped, ids)[0]) == "ab"


def test_the_api_keeps_the_stop_string_when_asked_streamed_or_not(server):
    c = server.client()
    kw = dict(model=MODEL, prompt="stop", max_tokens=8, temperature=0, logit_bias={str(ord("A")): 100},
              stop=["AA"], extra_body={"ignore_eos": True, "include_stop_str_in_output": True})
    r = c.completions.create(**kw)
    assert r.choices[0].text == "AA" and r.choices[0].finish_reason == "stop"
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(stream=True, **kw) if ch.choices)
    assert streamed == "AA"
    cut = c.completions.create(**{**kw, "extra_body": {"ignore_eos": True}})
    assert cut.choices[0].text == ""


def test_the_api_skips_special_tokens_by_default_and_keeps_them_when_asked(server):
    c = server.client()
    kw = dict(model=MODEL, prompt="special", max_tokens=2, temperature=0, logit_bias={str(USER_TOKEN): 100})
    assert c.completions.create(**kw, extra_body={"ignore_eos": True}).choices[0].text == ""
    kept = c.completions.create(**kw, extra_body={"ignore_eos": True, "skip_special_tokens": False})
    assert kept.choices[0].text == "<｜User｜><｜User｜>" and kept.usage.completion_tokens == 2


def test_a_stop_token_id_keeps_its_text_only_when_the_stop_is_kept(server):
    c = server.client()
    kw = dict(model=MODEL, prompt="end", max_tokens=10, temperature=0, logit_bias={str(ord("B")): 100})
    stop = {"stop_token_ids": [ord("B")], "ignore_eos": True}
    kept = c.completions.create(**kw, extra_body={**stop, "include_stop_str_in_output": True})
    assert (kept.choices[0].text, kept.choices[0].finish_reason, kept.usage.completion_tokens) == ("B", "stop", 1)
    assert c.completions.create(**kw, extra_body=stop).choices[0].text == ""


def test_the_end_of_sequence_token_stays_out_of_the_text_even_when_the_stop_is_kept(server):
    r = server.client().completions.create(model=MODEL, prompt="end", max_tokens=10, temperature=0,
                                           logit_bias={str(EOS_TOKEN): 100},
                                           extra_body={"include_stop_str_in_output": True, "skip_special_tokens": False})
    assert (r.choices[0].text, r.choices[0].finish_reason, r.usage.completion_tokens) == ("", "stop", 1)
