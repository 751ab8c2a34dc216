"""Incremental detokenization and stop strings held back on a rolling tail (pure Python + tokenizers)."""

import random

import pytest

from atom.output.detokenizer import CONTEXT, MAX_HELD, IncrementalDetokenizer
from atom.output.request_text import RequestText
from atom.output.stop_strings import StopAutomaton, StopScanner
from atom.tokenizer import Tokenizer, write_builtin_tokenizer
from tests.support.request_text import stream_text


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return Tokenizer.from_dir(write_builtin_tokenizer(tmp_path_factory.mktemp("tok")))


@pytest.fixture(scope="module")
def spm_tok():
    """A SentencePiece-style tokenizer: '▁' word markers, byte fallback, the first space stripped."""
    from tokenizers import Tokenizer as HfTokenizer
    from tokenizers import decoders, models

    vocab = {"<unk>": 0, **{f"<0x{b:02X}>": 1 + b for b in range(256)}}
    for word in ("▁the", "▁cat", "▁sat", "the", "cat", "▁", "s", "at"):
        vocab[word] = len(vocab)
    hf = HfTokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True, unk_token="<unk>"))
    hf.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                    decoders.Strip(" ", 1, 0)])
    return Tokenizer(hf, name="spm")


def _stream(decode, ids):
    detok = IncrementalDetokenizer(decode)
    pieces = [detok.push(t) for t in ids]
    return pieces, detok.finish()


def _random_bytes(rng, n):
    """Byte tokens mixing ASCII, valid multi-byte characters, stray continuation and cut-off lead bytes."""
    out = []
    while len(out) < n:
        kind = rng.random()
        if kind < 0.4:
            out.append(rng.randrange(0x20, 0x7F))
        elif kind < 0.7:
            out.extend(rng.choice(["é", "世", "😀", "ß"]).encode())
        elif kind < 0.85:
            out.append(rng.randrange(0x80, 0xC0))
        else:
            out.append(rng.choice([0xC3, 0xE4, 0xF0]))
    return out[:n]


def test_streamed_pieces_add_up_to_the_full_decode_and_never_change_what_was_sent(tok):
    rng = random.Random(0)
    for trial in range(200):
        ids = _random_bytes(rng, rng.randrange(1, 40)) + ([257, 65] if trial % 3 == 0 else [])
        pieces, last = _stream(tok.decode, ids)
        full = tok.decode(ids)
        assert "".join(pieces) + last == full
        for k in range(len(ids)):
            assert full.startswith("".join(pieces[: k + 1]))


def test_a_multibyte_character_is_held_until_its_last_byte_and_then_released_whole(tok):
    pieces, last = _stream(tok.decode, list("a😀b".encode()))
    assert pieces == ["a", "", "", "", "😀", "b"] and last == ""


def test_a_cut_off_character_at_the_end_is_released_as_one_replacement_on_finish(tok):
    pieces, last = _stream(tok.decode, [0x41, 0xF0, 0x9F])
    assert pieces == ["A", "", ""] and last == "\ufffd"


def test_invalid_bytes_are_released_once_they_cannot_start_a_character_any_more(tok):
    pieces, _ = _stream(tok.decode, [0x80] * 6)
    assert pieces == ["", "", "", "\ufffd", "\ufffd", "\ufffd"]  # the last MAX_HELD stay held
    assert MAX_HELD == 3


def test_sentencepiece_word_markers_and_byte_fallback_decode_the_same_incrementally(spm_tok):
    words = ["▁the", "▁cat", "▁sat", "s", "at", "▁", "the", *(f"<0x{b:02X}>" for b in "é世".encode())]
    ids = [spm_tok.token_to_id(w) for w in words] * 5
    pieces, last = _stream(spm_tok.decode, ids)
    assert "".join(pieces) + last == spm_tok.decode(ids)
    assert pieces[0] == "the" and pieces[1] == " cat"


def test_each_step_decodes_a_bounded_window_however_long_the_output(tok):
    sizes = []

    def decode(ids):
        sizes.append(len(ids))
        return tok.decode(ids)

    ids = _random_bytes(random.Random(1), 3000) + [0x80] * 500
    pieces, last = _stream(decode, ids)
    assert "".join(pieces) + last == tok.decode(ids)
    assert max(sizes) <= 2 * CONTEXT + 8
    assert len(sizes) <= 2 * len(ids) + 1


def _reference_stop(text, stops):
    """Text before the first stop to complete (the longest one at that end); None if none does."""
    for end in range(1, len(text) + 1):
        hits = [s for s in stops if text[:end].endswith(s)]
        if hits:
            return text[: end - max(len(s) for s in hits)]
    return None


def test_the_scanner_agrees_with_a_brute_force_search_and_releases_only_decided_text():
    rng = random.Random(2)
    for _ in range(400):
        stops = tuple({"".join(rng.choice("abé") for _ in range(rng.randrange(1, 5))) for _ in range(3)})
        text = "".join(rng.choice("abcé") for _ in range(rng.randrange(0, 30)))
        scanner, out, stopped = StopScanner(StopAutomaton(stops)), "", False
        expected = _reference_stop(text, stops)
        i = 0
        while i < len(text) and not stopped:
            j = i + rng.randrange(1, 4)
            piece, stopped = scanner.feed(text[i:j])
            out += piece
            assert (expected if expected is not None else text).startswith(out)
            i = j
        if not stopped:
            out += scanner.flush()
        assert stopped == (expected is not None)
        assert out == (expected if expected is not None else text)


def test_overlapping_stops_end_the_text_at_the_first_one_to_complete():
    scanner = StopScanner(StopAutomaton(("abcd", "bc", "cdx")))
    assert scanner.feed("xab") == ("x", False)  # "ab" could start "abcd": held
    assert scanner.feed("cd") == ("a", True)  # "bc" completes first; the text ends before it


def test_held_text_is_only_the_longest_suffix_that_could_start_a_stop():
    scanner = StopScanner(StopAutomaton(("</tool>",)))
    assert scanner.feed("a </to") == ("a ", False)
    assert scanner.feed("p>") == ("</top>", False)
    assert scanner.feed("x</tool>tail") == ("x", True)


def test_request_text_cuts_at_a_multi_token_multibyte_stop_and_never_sends_its_start(tok):
    ids = list("ok 世界 done".encode())
    text = RequestText(tok.decode, ("界 d",))
    sent, stopped = stream_text(text, ids)
    assert stopped and "".join(sent) == "ok 世" == text.text()
    assert "界" not in "".join(sent)


def test_request_text_releases_held_text_when_the_request_ends_for_another_reason(tok):
    text = RequestText(tok.decode, ("xyz",))
    assert text.advance(ord("a"), False) == ("a", False)
    assert text.advance(ord("x"), False) == ("", False)
    assert text.advance(ord("y"), True) == ("xy", False)
    assert text.text() == "axy"
