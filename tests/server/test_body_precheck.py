"""A large body is decoded and checked in the helper process: its refusal is parse_body's own, and
while it is being checked this process's other threads keep running."""

import json
import os
import signal
import threading
import time

import pytest

from atom.builtin_model import BUILTIN_MODEL_NAME as MODEL
from atom.entrypoints.body_precheck import PRECHECK_BYTES, BodyPrecheck
from atom.entrypoints.limits import ServerLimits
from atom.entrypoints.protocol import ApiError, ChatCompletionRequest, CompletionRequest

LIMITS = ServerLimits().for_model(4096)


@pytest.fixture(scope="module")
def precheck():
    checker = BodyPrecheck(LIMITS, 4096)
    yield checker
    checker.close()


def test_a_million_token_ids_are_refused_with_parse_bodys_error(precheck):
    body = json.dumps({"model": MODEL, "prompt": [65] * 1_000_000}).encode()
    with pytest.raises(ApiError) as info:
        precheck.check(body, CompletionRequest)
    assert info.value.status == 400 and info.value.code == "context_length_exceeded"
    assert info.value.param == "prompt" and "1000000 tokens" in info.value.message


def test_a_large_body_that_passes_every_limit_passes_and_a_small_one_is_not_sent(precheck):
    ok = json.dumps({"model": MODEL, "prompt": [[65] * 4000] * 60}).encode()
    assert len(ok) >= PRECHECK_BYTES
    assert precheck.check(ok, CompletionRequest) is None
    small_but_bad = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 0}).encode()
    assert precheck.check(small_but_bad, ChatCompletionRequest) is None  # left to the in-process parse


def test_other_threads_keep_the_interpreter_while_a_large_body_is_checked(precheck):
    body = json.dumps({"model": MODEL, "prompt": [65] * 1_000_000}).encode()
    with pytest.raises(ApiError):
        precheck.check(body, CompletionRequest)  # the helper is warm from here on
    ticks, stop = [0], threading.Event()

    def spin() -> None:
        while not stop.is_set():
            ticks[0] += 1

    def share_while_checked() -> float:
        """The spinner's progress while the body is checked, over its progress alone for as long."""
        start, before = time.perf_counter(), ticks[0]
        with pytest.raises(ApiError) as info:
            precheck.check(body, CompletionRequest)
        busy, during = time.perf_counter() - start, ticks[0] - before
        assert info.value.param == "prompt"
        mark = ticks[0]
        time.sleep(busy)
        return during / max(1, ticks[0] - mark)

    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        time.sleep(0.05)
        shares = []
        while len(shares) < 3 and not any(share > 0.5 for share in shares):
            shares.append(share_while_checked())
    finally:
        stop.set()
        spinner.join()
    # decoding this body in this process holds the lock: the spinner then keeps about 20 % of its rate
    # (measured: 0.16-0.22); checked in the helper it keeps most of it (best of three, for a busy machine;
    # the rounds stop at the first over 0.5, since the best of three then is too)
    assert max(shares) > 0.5, shares


def test_when_a_helper_dies_the_body_is_left_to_the_in_process_parse_and_helpers_are_not_restarted():
    checker = BodyPrecheck(LIMITS, 4096)
    try:
        checker.warm()
        pool = checker._get_pool()
        first = pool.submit(len, b"x")
        assert first.result(timeout=60) == 1
        for pid in list(pool._processes):
            os.kill(pid, signal.SIGKILL)
        body = json.dumps({"model": MODEL, "prompt": [65] * 1_000_000}).encode()
        assert checker.check(body, CompletionRequest) is None  # not refused here: parse_body refuses it
        assert checker._get_pool() is None
        assert checker.check(body, CompletionRequest) is None
    finally:
        checker.close()


def test_the_helpers_run_at_a_lower_cpu_priority_than_the_server(precheck):
    from atom.entrypoints.body_precheck import HELPER_NICENESS

    pool = precheck._get_pool()
    assert pool.submit(len, b"warm").result(timeout=60) == 4
    assert all(os.getpriority(os.PRIO_PROCESS, pid) == os.nice(0) + HELPER_NICENESS for pid in pool._processes)


_SERVER_THAT_DIES = """
import os, sys
from atom.entrypoints.body_precheck import BodyPrecheck
from atom.entrypoints.limits import ServerLimits
if __name__ == "__main__":
    checker = BodyPrecheck(ServerLimits().for_model(4096), 4096)
    pool = checker._get_pool()
    assert pool.submit(len, b"warm").result(timeout=60) == 4
    print(" ".join(str(pid) for pid in pool._processes), flush=True)
    os._exit(1)
"""


def test_the_helpers_end_when_the_server_leaves_by_os_exit(tmp_path):
    import subprocess
    import sys

    from atom.entrypoints.body_precheck import PARENT_POLL_S

    script = tmp_path / "server_that_dies.py"  # spawn re-imports the main module: it must be a file
    script.write_text(_SERVER_THAT_DIES)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    pids = [int(p) for p in done.stdout.split()]
    assert pids
    deadline = time.monotonic() + 20 * PARENT_POLL_S
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(PARENT_POLL_S / 5)
        alive = [pid for pid in alive if _running(pid)]
    assert alive == []


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie waits for its reaper, it no longer runs
        return stat.read().split(") ", 1)[1][0] != "Z"
