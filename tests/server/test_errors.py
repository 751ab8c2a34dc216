"""Bad input gets an OpenAI-style error body and the right status, and never hurts other requests."""

import json

import httpx
import pytest

from atom.builtin_model import BUILTIN_MODEL_NAME as MODEL
from support.server import start_server

pytestmark = pytest.mark.slow

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
OK_CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def post(server, path, body=None, *, content=None, headers=None):
    kw = {"content": content} if content is not None else {"json": body}
    return httpx.post(f"{server.url}{path}", headers=headers, timeout=60, **kw)


def assert_error(resp, status, *, param=None, code=None, fragment=None):
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    assert err["type"] == ("server_error" if status >= 500 else
                           "authentication_error" if status == 401 else "invalid_request_error")
    if param is not None:
        assert err["param"] == param
    if code is not None:
        assert err["code"] == code
    if fragment is not None:
        assert fragment in err["message"]
    return err


def test_malformed_json_is_400(server):
    assert_error(post(server, COMPLETIONS, content=b'{"model": "atom-tiny-dsv4", "prompt": '), 400, code="invalid_json")
    assert_error(post(server, COMPLETIONS, content=b"\xff\xfe"), 400, code="invalid_json")
    assert_error(post(server, COMPLETIONS, content=b"[1, 2]"), 400, code="invalid_json", fragment="must be an object")


@pytest.mark.parametrize("body,param", [
    ({"model": MODEL, "prompt": "x", "max_tokens": "5"}, "max_tokens"),
    ({"model": MODEL, "prompt": "x", "temperature": "hot"}, "temperature"),
    ({"model": MODEL, "prompt": "x", "n": True}, "n"),
    ({"model": MODEL, "prompt": 42}, "prompt"),
    ({"model": MODEL, "prompt": "x", "stream": "yes"}, "stream"),
    ({"model": MODEL}, "prompt"),
    ({"prompt": "x"}, "model"),
])
def test_wrong_types_and_missing_fields_are_400_naming_the_field(server, body, param):
    assert_error(post(server, COMPLETIONS, body), 400, param=param, code="invalid_type")


@pytest.mark.parametrize("messages,fragment", [
    ([], "messages"),
    ([{"content": "no role"}], "role"),
    ([{"role": "wizard", "content": "x"}], "role 'wizard' is not accepted"),
    ("hi", "messages"),
])
def test_bad_chat_messages_are_400(server, messages, fragment):
    err = assert_error(post(server, CHAT, {"model": MODEL, "messages": messages}), 400)
    assert fragment in err["message"] or err["param"] == "messages"


def test_an_unknown_model_is_404_with_model_not_found(server):
    err = assert_error(post(server, COMPLETIONS, {"model": "gpt-5", "prompt": "x"}), 404, param="model",
                       code="model_not_found")
    assert "gpt-5" in err["message"] and MODEL in err["message"]
    assert_error(post(server, CHAT, {**OK_CHAT, "model": "nope"}), 404, code="model_not_found")


def test_a_prompt_longer_than_the_model_length_is_400_with_the_numbers(server):
    long_prompt = "a" * 300  # 301 tokens with BOS; max_model_len is 256
    err = assert_error(post(server, COMPLETIONS, {"model": MODEL, "prompt": long_prompt}), 400,
                       code="context_length_exceeded")
    assert "256" in err["message"] and "301" in err["message"]
    err = assert_error(post(server, COMPLETIONS, {"model": MODEL, "prompt": "a" * 200, "max_tokens": 100}), 400,
                       param="max_tokens", code="context_length_exceeded")
    assert "256" in err["message"] and "301" in err["message"] and "100" in err["message"]
    err = assert_error(post(server, CHAT, {"model": MODEL, "messages": [{"role": "user", "content": "b" * 400}]}),
                       400, code="context_length_exceeded")
    assert "256" in err["message"]


@pytest.mark.parametrize("field,value", [
    ("temperature", -0.5), ("temperature", 1000.0), ("top_p", 0.0), ("top_p", 1.5), ("top_k", -2),
    ("max_tokens", 0), ("n", 0), ("n", 1000), ("seed", -1),
])
def test_invalid_sampling_values_are_400_naming_the_parameter(server, field, value):
    err = assert_error(post(server, COMPLETIONS, {"model": MODEL, "prompt": "x", field: value}), 400, param=field)
    assert field in err["message"]


def test_empty_token_prompts_and_out_of_vocabulary_token_ids_are_400(server):
    # (an empty *text* prompt is fine: it is the BOS token alone, as in OpenAI's API)
    assert_error(post(server, COMPLETIONS, {"model": MODEL, "prompt": []}), 400, param="prompt")
    assert_error(post(server, COMPLETIONS, {"model": MODEL, "prompt": [1, 99999]}), 400, param="prompt",
                 fragment="99999")
    assert_error(post(server, COMPLETIONS, {"model": MODEL, "prompt": [1, -3]}), 400, param="prompt")


@pytest.mark.parametrize("content,param", [
    (b'{"model": "atom-tiny-dsv4", "prompt": "\\ud800x"}', "prompt"),  # a lone surrogate is not text
    (b'{"model": "atom-tiny-dsv4", "messages": [{"role": "user", "content": "\\udfff"}]}', "messages"),
    (b'{"model": "atom-tiny-dsv4", "prompt": "x", "temperature": NaN}', "temperature"),
    (b'{"model": "atom-tiny-dsv4", "prompt": "x", "top_p": Infinity}', "top_p"),
    (b'{"model": "atom-tiny-dsv4", "prompt": "x", "stop": [""]}', "stop"),
    (b'{"model": "atom-tiny-dsv4", "prompt": "x", "seed": 99999999999999999999999}', "seed"),
    (b'{"model": "atom-tiny-dsv4", "prompt": ["a", "b", "c", "d", "e"], "n": 64}', "prompt"),
    (b"[" * 30000 + b"]" * 30000, None),  # nested too deeply for the parser
])
def test_edge_case_inputs_are_400_not_500(server, content, param):
    path = CHAT if b"messages" in content else COMPLETIONS
    err = assert_error(post(server, path, content=content), 400)
    assert err["param"] == param


def test_stream_options_without_stream_is_400(server):
    body = {"model": MODEL, "prompt": "x", "stream_options": {"include_usage": True}}
    assert_error(post(server, COMPLETIONS, body), 400, param="stream_options")


def test_an_oversized_body_is_413_whether_declared_or_streamed(server):
    big = json.dumps({"model": MODEL, "prompt": "x" * (100 * 1024)}).encode()  # the fixture's limit is 64 KiB
    assert_error(post(server, COMPLETIONS, content=big), 413, code="request_too_large", fragment=str(64 * 1024))

    def chunks():
        for i in range(0, len(big), 8192):
            yield big[i:i + 8192]

    assert_error(post(server, COMPLETIONS, content=chunks()), 413, code="request_too_large")


def test_unknown_routes_are_404_and_wrong_methods_405_as_json(server):
    assert_error(httpx.get(f"{server.url}/v1/nothing"), 404)
    assert_error(httpx.get(f"{server.url}{COMPLETIONS}"), 405)


def test_after_every_kind_of_bad_request_the_server_still_serves_good_ones(server):
    for content in (b"{", b"null", b'{"model": 1}', json.dumps({"model": MODEL, "prompt": "x", "top_p": 9}).encode()):
        assert post(server, COMPLETIONS, content=content).status_code == 400
    r = post(server, CHAT, OK_CHAT)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
    assert httpx.get(f"{server.url}/health").status_code == 200
    server.engine.call_sync(lambda e: e.check_integrity())


@pytest.fixture(scope="module")
def keyed_server(model_dir):
    srv = start_server(model_dir, api_key="sekret")
    yield srv
    srv.stop()


def test_a_missing_or_wrong_api_key_is_401_and_the_right_one_works(keyed_server):
    import openai

    assert_error(post(keyed_server, CHAT, OK_CHAT), 401, code="invalid_api_key")
    assert_error(post(keyed_server, CHAT, OK_CHAT, headers={"Authorization": "Bearer wrong"}), 401,
                 code="invalid_api_key")
    assert_error(post(keyed_server, CHAT, OK_CHAT, headers={"Authorization": "sekret"}), 401)
    with pytest.raises(openai.AuthenticationError):
        keyed_server.client(api_key="wrong").models.list()
    r = keyed_server.client(api_key="sekret").chat.completions.create(**OK_CHAT)
    assert r.usage.completion_tokens >= 1
    # health and metrics stay open for probes and scrapers
    assert httpx.get(f"{keyed_server.url}/health").status_code == 200
    assert httpx.get(f"{keyed_server.url}/metrics").status_code == 200
