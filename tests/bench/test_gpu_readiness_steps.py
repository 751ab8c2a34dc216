"""Each fake-device case measures the step it names: the warm-up reaches the state the kind needs, and a
measured step of another kind is refused. Driven through the cases' own schedulers with the fake runner
(no model), so every case's schedule is checked at its real prompt sizes in a fraction of a second."""

import pytest

from atom.bench.gpu_readiness import CASES, Case, add_prompts, case_scheduler, measure, release_config
from atom.bench.fake_device import DeviceAccessCounter
from atom.bench.step_kinds import check_step, step_kind, warm_up
from atom.model_engine.llm_engine import LLMEngine
from atom.sampling_params import SamplingParams
from atom.step_contract import RunnerOutput, ScheduledBatch, ScheduledSeq
from atom.testing.fake_runner import FakeRunner

GREEDY = SamplingParams(max_tokens=8, temperature=0.0)


class DraftingRunner(FakeRunner):
    """The fake runner that also proposes ``k`` drafts (token 3) after every token it samples, as the MTP
    drafter does, and records the batches it ran."""

    def __init__(self, k: int) -> None:
        super().__init__()
        self.k = k
        self.batches: list[ScheduledBatch] = []

    def execute(self, batch: ScheduledBatch) -> RunnerOutput:
        self.batches.append(batch)
        out = super().execute(batch)
        drafts = {sid: (3,) * self.k for sid in out.sampled} if self.k else {}
        return RunnerOutput(out.sampled, out.logprobs, out.accepted, drafts)


def fake_engine(case: Case) -> LLMEngine:
    sched, _ = case_scheduler(release_config(case.model, mtp=bool(case.drafts)), case, 4096)
    return LLMEngine(sched, DraftingRunner(case.drafts), max_model_len=4096)


def row(seq_id: int, start: int, tokens: int, drafts: int = 0) -> ScheduledSeq:
    return ScheduledSeq(seq_id, start, (5,) * tokens, True, seq_id, False, -1, GREEDY, num_draft=drafts)


def batch(*rows: ScheduledSeq) -> ScheduledBatch:
    return ScheduledBatch(1, rows, (), (), ())


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_every_case_measures_a_step_of_the_kind_it_names_over_all_its_requests(case):
    engine = fake_engine(case)
    add_prompts(engine, case)
    step = measure(engine, case, DeviceAccessCounter())
    measured = engine.runner.batches[-1]
    n = len(case.prompts)
    assert step.split()[0] == case.kind and len(measured.seqs) == n
    if case.kind == "decode":
        assert all(r.num_tokens == 1 and r.num_draft == 0 for r in measured.seqs) and step == f"decode {n}r/{n}t"
    if case.kind == "verify":
        assert step == f"verify {n}r/{n * (1 + case.drafts)}t"
    if case.kind == "prefill":
        assert step == "prefill 1r/2048t"
    if case.kind == "mixed":
        assert step == "mixed 5r/204t" and sorted(r.num_tokens for r in measured.seqs) == [1, 1, 1, 1, 200]


def test_the_old_decode_b8_schedule_counted_a_prefill_chunk_and_is_now_refused():
    case = Case("decode b8 at budget 64", "flash", (40,) * 8, "decode", budget=64)
    engine = fake_engine(case)
    add_prompts(engine, case)
    engine.step()  # the one warm step the case used to run: 64 of the 320 prompt tokens
    with pytest.raises(RuntimeError, match=r"decode b8 at budget 64: the measured step is mixed 4r/64t, "
                                           r"expected decode over all 8 requests"):
        check_step_of_next(engine, case)


def check_step_of_next(engine: LLMEngine, case: Case) -> None:
    """Schedule the next step and check it as the measured step (what :func:`measure` does first)."""
    batch_ = engine.scheduler.schedule()
    lens = {r.seq_id: engine.scheduler.by_id[r.seq_id].num_prompt_tokens for r in batch_.seqs}
    check_step(batch_, lens, case.kind, len(case.prompts), case.name)


def test_a_decode_step_holding_one_prefill_token_is_not_a_decode_step():
    lens = {1: 40, 2: 40}
    assert step_kind(batch(row(1, 40, 1), row(2, 41, 1)), lens) == "decode"
    assert step_kind(batch(row(1, 40, 1), row(2, 39, 1)), lens) == "mixed"  # row 2: its last prompt token
    with pytest.raises(RuntimeError, match="measured step is mixed 2r/2t, expected decode"):
        check_step(batch(row(1, 40, 1), row(2, 39, 1)), lens, "decode", 2)


def test_step_kinds_follow_the_rows_of_the_batch():
    lens = {1: 40, 2: 40, 3: 300}
    assert step_kind(batch(row(1, 0, 40), row(2, 0, 24)), lens) == "prefill"
    assert step_kind(batch(row(1, 40, 3, drafts=2), row(2, 40, 3, drafts=2)), lens) == "verify"
    assert step_kind(batch(row(1, 40, 3, drafts=2), row(2, 40, 1)), lens) == "other"  # drafts on one row only
    assert step_kind(batch(row(1, 40, 1), row(3, 100, 200)), lens) == "mixed"
    assert step_kind(batch(row(1, 41, 2)), lens) == "prefill"  # a recompute past the prompt is a chunk
    assert step_kind(batch(), lens) == "other"


def test_a_decode_step_leaving_a_request_out_is_refused():
    with pytest.raises(RuntimeError, match=r"expected decode over all 3 requests \(rows id@position\+tokens: "
                                           r"1@40\+1, 2@40\+1\)"):
        check_step(batch(row(1, 40, 1), row(2, 40, 1)), {1: 40, 2: 40}, "decode", 3, "b3")


def test_a_case_that_can_never_reach_its_state_fails_the_warm_up():
    case = Case("starved mixed", "flash", (40,) * 2, "mixed", budget=80)  # both prompts finish in one step
    engine = fake_engine(case)
    add_prompts(engine, case)
    with pytest.raises(RuntimeError, match="starved mixed: no mixed step is possible after 64 steps"):
        warm_up(engine, case.kind, 2, name=case.name)


def test_an_unknown_step_kind_is_refused():
    engine = fake_engine(CASES[0])
    with pytest.raises(ValueError, match="step kind 'decoding': expected one of decode, verify, prefill, mixed"):
        warm_up(engine, "decoding", 1)
