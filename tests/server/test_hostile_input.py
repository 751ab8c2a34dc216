"""Hostile bodies: every parse failure is a 4xx in OpenAI's shape, limits reject before work, parsing and
tokenizing run off the event loop, and every error is counted by status in /metrics."""

import json
import threading
from pathlib import Path

import httpx
import pytest

from atom.builtin_model import BUILTIN_MODEL_NAME as MODEL
from atom.entrypoints.limits import ServerLimits
from support.server import start_server

CORPUS = Path(__file__).parent / "bad_bodies"
PATHS = {"completions": ["/v1/completions"], "chat": ["/v1/chat/completions"],
         "any": ["/v1/completions", "/v1/chat/completions"]}
CASES = [(f"{kind}/{f.name}", path) for kind in PATHS for f in sorted((CORPUS / kind).iterdir())
         for path in PATHS[kind]]


@pytest.fixture(scope="module")
def hardened(model_dir):
    srv = start_server(model_dir, limits=ServerLimits(max_body_bytes=256 * 1024, max_prompt_chars=4096),
                       api_key="k3y")
    yield srv
    srv.stop()


def _post(srv, path, content, key="k3y"):
    return httpx.post(f"{srv.url}{path}", content=content, timeout=60,
                      headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})


def _errors(srv):
    return {k: v for k, v in srv.metrics().items() if k.startswith("atom_request_errors_total")}


def test_the_corpus_has_each_kind_of_bad_body():
    assert len(CASES) >= 60 and all((CORPUS / kind).is_dir() for kind in PATHS)


@pytest.mark.parametrize("name,path", CASES)
def test_every_bad_body_in_the_corpus_is_a_4xx_in_openai_shape_and_the_server_still_answers(hardened, name, path):
    resp = _post(hardened, path, (CORPUS / name).read_bytes())
    assert 400 <= resp.status_code < 500, (name, resp.status_code, resp.text[:300])
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert httpx.get(f"{hardened.url}/health", timeout=10).status_code == 200


def test_a_good_request_still_works_after_the_corpus(hardened):
    body = json.dumps({"model": MODEL, "prompt": "still fine", "max_tokens": 2}).encode()
    assert _post(hardened, "/v1/completions", body).status_code == 200


def test_every_error_status_is_counted_in_metrics(hardened):
    before = _errors(hardened)
    ok = json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 1}).encode()
    assert _post(hardened, "/v1/completions", ok, key="wrong").status_code == 401
    assert _post(hardened, "/v1/completions", b"x" * (300 * 1024)).status_code == 413
    assert _post(hardened, "/v1/nowhere", ok).status_code == 404
    assert httpx.get(f"{hardened.url}/v1/completions", headers={"Authorization": "Bearer k3y"}).status_code == 405
    assert _post(hardened, "/v1/completions", b"{").status_code == 400
    after = _errors(hardened)
    for status in ("401", "413", "404", "405", "400"):
        key = f'atom_request_errors_total{{status="{status}"}}'
        assert after[key] == before.get(key, 0.0) + 1, status


def test_the_bearer_scheme_is_case_insensitive(hardened):
    ok = json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 1}).encode()
    for scheme in ("bearer", "BEARER", "Bearer"):
        resp = httpx.post(f"{hardened.url}/v1/completions", content=ok, timeout=60,
                          headers={"Authorization": f"{scheme} k3y"})
        assert resp.status_code == 200, scheme


class _Recorder:
    """Wraps one bound method of the real tokenizer and records the thread of each call."""

    def __init__(self, obj, name):
        self.obj, self.name, self.original, self.threads = obj, name, getattr(obj, name), []

    def __enter__(self):
        def wrapped(*a, **kw):
            self.threads.append(threading.current_thread().name)
            return self.original(*a, **kw)
        setattr(self.obj, self.name, wrapped)
        return self

    def __exit__(self, *exc):
        delattr(self.obj, self.name)


def test_tokenization_and_chat_templates_run_on_the_parse_threads_not_the_event_loop(hardened):
    tok = hardened.engine.tokenizer
    with _Recorder(tok, "encode") as enc, _Recorder(tok, "apply_chat_template") as tpl:
        assert _post(hardened, "/v1/completions", json.dumps(
            {"model": MODEL, "prompt": "abc", "max_tokens": 1}).encode()).status_code == 200
        assert _post(hardened, "/v1/chat/completions", json.dumps(
            {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}).encode()).status_code == 200
    assert enc.threads and tpl.threads
    assert all(name.startswith("atom-parse") for name in enc.threads + tpl.threads), enc.threads + tpl.threads


def test_a_prompt_over_the_character_limit_is_rejected_before_it_is_tokenized(hardened):
    tok = hardened.engine.tokenizer
    with _Recorder(tok, "encode") as enc, _Recorder(tok, "apply_chat_template") as tpl:
        r = _post(hardened, "/v1/completions", json.dumps({"model": MODEL, "prompt": "x" * 5000}).encode())
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
        r = _post(hardened, "/v1/chat/completions", json.dumps(
            {"model": MODEL, "messages": [{"role": "user", "content": "y" * 5000}]}).encode())
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    assert enc.threads == [] and tpl.threads == []


def test_a_lone_surrogate_in_the_model_name_is_a_400_whose_message_can_be_encoded(hardened):
    r = _post(hardened, "/v1/chat/completions", b'{"model": "\\ud800x", "messages": []}')
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_unicode"
    assert r.json()["error"]["param"] == "model"
