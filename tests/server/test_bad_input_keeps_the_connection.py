"""Bad input never raises past the request handler: every body of the bad-body corpus (this round's
included) gets a 4xx JSON error over a keep-alive connection that then still serves ``/health``; an
unexpected exception while preparing a request is a JSON 500 (a ``RecursionError`` a 400) on a
connection that stays open; errors never echo unbounded input."""

import http.client
import json
from pathlib import Path

import pytest

from atom.builtin_model import BUILTIN_MODEL_NAME as MODEL
from atom.entrypoints.limits import ServerLimits
from atom.entrypoints.serving import OpenAIServing
from support.server import start_server

CORPUS = Path(__file__).parent / "bad_bodies"
PATHS = {"completions": ["/v1/completions"], "chat": ["/v1/chat/completions"],
         "any": ["/v1/completions", "/v1/chat/completions"]}
THIS_ROUND = ["any/logit_bias_key_superscript_three.json", "any/logit_bias_key_superscript_one_two.json",
              "any/logit_bias_key_circled_one.json", "any/logit_bias_key_arabic_indic_three.json",
              "any/logit_bias_key_5000_digits.json", "any/logit_bias_too_many_entries.json",
              "any/model_name_100k.json", "chat/tools_schema_over_char_limit.json",
              "chat/tool_call_id_over_char_limit.json", "chat/function_name_over_char_limit.json",
              "chat/message_name_over_char_limit.json", "chat/tool_call_arguments_nested_1500.json",
              "chat/top_logprobs_1000.json", "any/stop_token_ids_too_many.json"]


@pytest.fixture(scope="module")
def srv(model_dir):
    server = start_server(model_dir, limits=ServerLimits(max_body_bytes=4 << 20, max_prompt_chars=4096))
    yield server
    server.stop()


class KeptConnection:
    """One keep-alive HTTP/1.1 connection; every call checks that the server kept it open."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self.conn = http.client.HTTPConnection(host, int(port), timeout=60)
        self.conn.connect()
        self.sock = self.conn.sock

    def send(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        self.conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
        resp = self.conn.getresponse()
        data = resp.read()
        assert not resp.will_close and self.conn.sock is self.sock, (path, resp.status, data[:200])
        return resp.status, data

    def close(self) -> None:
        self.conn.close()


def _error(status: int, data: bytes) -> dict:
    err = json.loads(data)["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"], err
    assert len(err["message"]) <= 1100, len(err["message"])  # never the whole of a huge input
    return err


def test_the_corpus_holds_the_first_43_bodies_and_this_rounds():
    names = {f"{kind}/{f.name}" for kind in PATHS for f in (CORPUS / kind).iterdir()}
    assert len(names) >= 43 + len(THIS_ROUND) and set(THIS_ROUND) <= names


def test_every_corpus_body_is_a_4xx_and_the_connection_stays_usable(srv):
    client = KeptConnection(srv.url)
    try:
        for kind, paths in PATHS.items():
            for body in sorted((CORPUS / kind).iterdir()):
                for path in paths:
                    status, data = client.send("POST", path, body.read_bytes())
                    assert 400 <= status < 500, (body.name, path, status, data[:300])
                    _error(status, data)
                    assert client.send("GET", "/health") == (200, b'{"status":"ok"}')
    finally:
        client.close()


@pytest.mark.parametrize("key", ["³", "¹²", "①", "٣", "7" * 5000])
def test_logit_bias_keys_that_are_not_ascii_digits_are_a_400_naming_logit_bias(srv, key):
    client = KeptConnection(srv.url)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "logit_bias": {key: 1}, "max_tokens": 1}
    status, data = client.send("POST", "/v1/chat/completions", json.dumps(body).encode())
    client.close()
    assert status == 400 and _error(status, data)["param"] == "logit_bias"


def test_tool_call_arguments_nested_5000_deep_are_a_400(model_dir):
    server = start_server(model_dir, limits=ServerLimits(max_prompt_chars=65536))
    client = KeptConnection(server.url)
    try:
        call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "[" * 5000 + "]" * 5000}}
        body = {"model": MODEL, "max_tokens": 1, "messages": [
            {"role": "user", "content": "x"}, {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"}]}
        status, data = client.send("POST", "/v1/chat/completions", json.dumps(body).encode())
        assert status == 400, data[:300]
        _error(status, data)
        assert client.send("GET", "/health")[0] == 200
    finally:
        client.close()
        server.stop()


def test_a_4mb_unknown_model_name_is_cut_in_the_404(srv):
    client = KeptConnection(srv.url)
    name = "gpt-" + "9" * 4_000_000
    status, data = client.send("POST", "/v1/completions", json.dumps({"model": name, "prompt": "x"}).encode())
    client.close()
    err = _error(status, data)
    assert status == 404 and err["code"] == "model_not_found"
    assert name[:200] + "..." in err["message"] and name[:201] not in err["message"]


def test_chat_top_logprobs_out_of_range_names_top_logprobs(srv):
    client = KeptConnection(srv.url)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 1000}
    status, data = client.send("POST", "/v1/chat/completions", json.dumps(body).encode())
    client.close()
    err = _error(status, data)
    assert status == 400 and err["param"] == "top_logprobs" and "1000" in err["message"]


@pytest.mark.parametrize("exc,status", [(RuntimeError("a bug"), 500), (RecursionError("deep"), 400)])
def test_an_unexpected_exception_while_preparing_is_a_json_answer_on_a_connection_kept_open(
        srv, monkeypatch, exc, status):
    def broken(self, req):
        raise exc

    monkeypatch.setattr(OpenAIServing, "prepare_completion", broken)
    client = KeptConnection(srv.url)
    try:
        got, data = client.send("POST", "/v1/completions", json.dumps({"model": MODEL, "prompt": "x"}).encode())
        assert got == status
        err = _error(got, data)
        assert err["code"] == ("internal_error" if status == 500 else "invalid_request")
        monkeypatch.undo()
        ok, data = client.send("POST", "/v1/completions",
                               json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 1}).encode())
        assert ok == 200 and json.loads(data)["usage"]["completion_tokens"] == 1
    finally:
        client.close()
