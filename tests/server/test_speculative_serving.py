"""``atom serve --speculative-num-tokens K``: the flag reaches the scheduler, the MTP layer drafts, the
answers equal those without speculation (greedy), and ``/metrics`` reports the acceptance counters."""

import pytest
from support.server import start_server

from atom.builtin_model import BUILTIN_MODEL_NAME as MODEL
from atom.config import SchedulerConfig
from atom.entrypoints import cli
from atom.entrypoints.args import engine_config_from_args

EXACT = {"ignore_eos": True}
PROMPT = "speculate about the arena"


def test_the_flag_sets_the_drafts_per_step_and_rejects_more_than_three(capsys):
    args = cli.build_parser().parse_args(["serve", "--speculative-num-tokens", "2"])
    assert engine_config_from_args(args).scheduler.speculative_num_tokens == 2
    assert engine_config_from_args(cli.build_parser().parse_args(["serve"])).scheduler.speculative_num_tokens == 0
    with pytest.raises(SystemExit) as exc:
        cli.main(["serve", "--speculative-num-tokens", "4"])
    assert exc.value.code == 2 and "accepted 0 (off) to 3" in capsys.readouterr().err
    with pytest.raises(ValueError, match="speculative_num_tokens=-1"):
        SchedulerConfig(speculative_num_tokens=-1)


@pytest.mark.slow
def test_a_speculating_server_answers_as_one_without_and_reports_acceptance(server, model_dir):
    spec = start_server(model_dir, speculative_num_tokens=2)
    try:
        answers = []
        for srv in (server, spec):
            c = srv.client()
            text = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0,
                                        extra_body=EXACT).choices[0].text
            streamed = "".join(ch.choices[0].text for ch in c.completions.create(
                model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, stream=True, extra_body=EXACT))
            answers.append((text, streamed))
        assert answers[0] == answers[1] and answers[1][0] == answers[1][1]
        m = spec.metrics()
        assert m["atom_spec_decode_num_draft_tokens_total"] > m["atom_spec_decode_verifies_total"] > 0
        assert 0 <= m["atom_spec_decode_num_accepted_tokens_total"] <= m["atom_spec_decode_num_draft_tokens_total"]
        assert m["atom_spec_decode_mean_acceptance_length"] >= 1.0
        assert {'atom_spec_decode_num_accepted_tokens_per_pos_total{position="0"}',
                'atom_spec_decode_num_accepted_tokens_per_pos_total{position="1"}'} <= set(m)
        assert server.metrics()["atom_spec_decode_num_draft_tokens_total"] == 0
    finally:
        spec.stop()
