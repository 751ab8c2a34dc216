"""The engine thread without HTTP: outputs in order, rejection before anything runs, abort on exit."""

import asyncio

import pytest

from atom.entrypoints.async_engine import ServerStoppingError
from atom.entrypoints.launch import load_engine
from atom.sampling_params import SamplingParams
from support.server import small_config


@pytest.fixture(scope="module")
def engine(model_dir):
    eng = load_engine(small_config(model_dir, enable_prefix_caching=False))
    eng.start()
    yield eng
    eng.call_sync(lambda e: e.check_integrity())
    eng.shutdown()


def test_generate_yields_each_step_then_a_finished_output(engine):
    async def run():
        return [o async for o in engine.generate([256, 104, 105], SamplingParams(max_tokens=5, ignore_eos=True), "g1")]

    outs = asyncio.run(run())
    assert [o.num_output_tokens for o in outs if o.new_token_ids] == [1, 2, 3, 4, 5]
    assert outs[-1].finished and outs[-1].finish_reason == "length"
    assert all(not o.finished for o in outs[:-1])


def test_a_request_the_engine_rejects_raises_value_error_before_anything_runs(engine):
    async def run():
        async for _ in engine.generate(list(range(1, 250)) * 2, SamplingParams(max_tokens=2), "too-long"):
            pass

    with pytest.raises(ValueError):
        asyncio.run(run())


def test_leaving_the_iteration_early_aborts_the_request_and_frees_its_blocks(engine):
    async def run():
        async for out in engine.generate([256] * 40, SamplingParams(max_tokens=200, ignore_eos=True), "leaver"):
            if out.new_token_ids:
                break
        await asyncio.sleep(0)

    asyncio.run(run())

    def idle(e):
        s = e.stats()
        return s.num_running + s.num_waiting, s.arena_bytes["swa"] + s.arena_bytes["compress"]

    for _ in range(200):
        if engine.call_sync(idle) == (0, 0):
            break
        asyncio.run(asyncio.sleep(0.01))
    assert engine.call_sync(idle) == (0, 0)
    assert engine.healthy


def test_a_group_failed_while_its_reader_is_between_two_outputs_still_raises_the_failure(engine):
    # the shutdown deadline fails every open group; a stream whose reader is busy sending the previous output
    # (suspended at the ``yield``) must still end with the error, not as if its requests had completed
    async def run():
        group = engine.group()
        await group.add([256] * 8, SamplingParams(max_tokens=200, ignore_eos=True), "between")
        outputs = group.outputs()
        first = await outputs.__anext__()
        group.fail(ServerStoppingError("the server is stopping"))
        with pytest.raises(ServerStoppingError, match="stopping"):
            while True:
                await outputs.__anext__()
        return first

    assert not asyncio.run(run()).finished
