"""DeepSeek-V4 prompt encoding: the reference prompt examples byte for byte (read from the shared reference
folder beside the checkout when it is there), and the specification's own cases for every message rule."""

import json
from pathlib import Path

import pytest

from atom.entrypoints.dsv4_encoding import REASONING_EFFORT_MAX_PREFIX, encode_messages

EXAMPLES = Path(__file__).resolve().parents[2].parent / "shared" / "reference" / "dsv4_chat_examples"

BOS, EOS, U, A = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"
D = "｜DSML｜"


def _example_params():
    if not EXAMPLES.is_dir():
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"reference examples not found at {EXAMPLES}"))]
    return sorted(p.stem for p in EXAMPLES.glob("[0-9][0-9]_*.json"))


@pytest.mark.parametrize("name", _example_params())
def test_every_reference_prompt_example_is_reproduced_byte_for_byte(name):
    example = json.loads((EXAMPLES / f"{name}.json").read_text(encoding="utf-8"))
    expected = (EXAMPLES / f"{name}.txt").read_bytes()
    assert encode_messages(example["messages"], **example["options"]).encode("utf-8") == expected


@pytest.mark.skipif(not EXAMPLES.is_dir(), reason=f"reference examples not found at {EXAMPLES}")
def test_the_reference_folder_holds_the_twenty_prompt_examples():
    assert len(_example_params()) == 20


def u(content, **kw):
    return {"role": "user", "content": content, **kw}


def s(content, **kw):
    return {"role": "system", "content": content, **kw}


def a(content, reasoning=None, **kw):
    m = {"role": "assistant", "content": content, **kw}
    if reasoning is not None:
        m["reasoning_content"] = reasoning
    return m


def t(content, call_id=None):
    m = {"role": "tool", "content": content}
    if call_id is not None:
        m["tool_call_id"] = call_id
    return m


def call(call_id, name, arguments):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def block(*invokes):
    return f"\n\n<{D}tool_calls>\n" + "\n".join(invokes) + f"\n</{D}tool_calls>"


def invoke(name, *params):
    return f"<{D}invoke name=\"{name}\">\n" + "\n".join(params) + f"\n</{D}invoke>"


def param(key, value, string=True):
    return f"<{D}parameter name=\"{key}\" string=\"{'true' if string else 'false'}\">{value}</{D}parameter>"


WEATHER_TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
TWO_CALLS = a("x", tool_calls=[call("c1", "f", '{"k": 1}'), call("c2", "g", '{"k": 2}')])
TWO_CALLS_TEXT = block(invoke("f", param("k", "1", False)), invoke("g", param("k", "2", False)))
CALL_F = a(None, "r", tool_calls=[call("c1", "f", '{"x": "y"}')])
CALL_F_TEXT = block(invoke("f", param("x", "y")))
HAIKU = a("Soft rain on the roof", "Five, seven, five syllables.", wo_eos=True)

# (messages, options, prompt): the cases the specification states, in its section order
CASES = {
    # 4.1 merging
    "tool results then user text form one turn": (
        [u("a"), TWO_CALLS, t("two", "c2"), t("one", "c1"), u("next?")], {},
        f"{BOS}{U}a{A}</think>x{TWO_CALLS_TEXT}{EOS}"
        f"{U}<tool_result>one</tool_result>\n\n<tool_result>two</tool_result>\n\nnext?{A}</think>"),
    "user text then a tool result form one turn": (
        [u("a"), t("T")], {}, f"{BOS}{U}a\n\n<tool_result>T</tool_result>{A}</think>"),
    "two user messages form one turn": ([u("a"), u("b")], {}, f"{BOS}{U}a\n\nb{A}</think>"),
    "a task on a later user message of a run is lost": (
        [u("a"), u("b", task="query")], {}, f"{BOS}{U}a\n\nb{A}</think>"),
    "a tool result merges into a task-bearing turn": (
        [u("a", task="authority"), t("T")], {}, f"{BOS}{U}a\n\n<tool_result>T</tool_result><｜authority｜>"),
    "a user message after a task-bearing turn starts a new turn": (
        [u("q", task="domain"), u("q2")], {}, f"{BOS}{U}q{U}q2{A}</think>"),
    "a developer message is not merged with a user message": (
        [{"role": "developer", "content": "d"}, u("u")], {}, f"{BOS}{U}d{U}u{A}</think>"),
    # 4.2 tool-result content
    "tool content parts give their texts and name other parts": (
        [t([{"type": "text", "text": "p1"}, {"type": "image_url", "image_url": {}}, {"type": "text", "text": "p2"}])],
        {}, f"{BOS}{U}<tool_result>p1\n\n[Unsupported image_url]\n\np2</tool_result>{A}</think>"),
    "a null tool result is written as None": ([t(None)], {}, f"{BOS}{U}<tool_result>None</tool_result>{A}</think>"),
    "an object tool result is written in Python notation": (
        [t({"ok": True})], {}, f"{BOS}{U}<tool_result>{{'ok': True}}</tool_result>{A}</think>"),
    # 4.3 order of results
    "results sort by call order, unknown ids first, text stays in place": (
        [u("go"), a("", tool_calls=[call("1", "f", "{}"), call("2", "f", "{}"), call("3", "f", "{}")]),
         t("R3", "3"), u("mid"), t("RZ", "zz"), t("R1", "1")], {},
        f"{BOS}{U}go{A}</think>" + block(*[invoke("f", "")] * 3) + f"{EOS}{U}<tool_result>RZ</tool_result>\n\nmid"
        f"\n\n<tool_result>R1</tool_result>\n\n<tool_result>R3</tool_result>{A}</think>"),
    "an assistant without calls keeps the previous call order in force": (
        [u("a"), TWO_CALLS, t("two", "c2"), t("one", "c1"), a("ok"), t("2b", "c2"), t("1b", "c1")], {},
        f"{BOS}{U}a{A}</think>x{TWO_CALLS_TEXT}{EOS}{U}<tool_result>one</tool_result>\n\n"
        f"<tool_result>two</tool_result>{A}</think>ok{EOS}{U}<tool_result>1b</tool_result>\n\n"
        f"<tool_result>2b</tool_result>{A}</think>"),
    # 5 reasoning retention
    "thinking with pruning drops earlier reasoning": (
        [u("a"), a("b", "r1"), u("c")], {"thinking_mode": "thinking"},
        f"{BOS}{U}a{A}</think>b{EOS}{U}c{A}<think>"),
    "drop_thinking false keeps every reasoning": (
        [u("a"), a("b", "r1"), u("c")], {"thinking_mode": "thinking", "drop_thinking": False},
        f"{BOS}{U}a{A}<think>r1</think>b{EOS}{U}c{A}<think>"),
    "chat mode never shows reasoning": ([u("a"), a("b", "r1"), u("c")], {}, f"{BOS}{U}a{A}</think>b{EOS}{U}c{A}</think>"),
    "a last assistant without reasoning shows an empty think block": (
        [u("a"), a("b")], {"thinking_mode": "thinking"}, f"{BOS}{U}a{A}<think></think>b{EOS}"),
    "an empty reasoning is the same as none": (
        [u("a"), a("b", "")], {"thinking_mode": "thinking"}, f"{BOS}{U}a{A}<think></think>b{EOS}"),
    "a tool result is the last user turn, so the calling turn loses its reasoning": (
        [u("q"), CALL_F, t("res")], {"thinking_mode": "thinking"},
        f"{BOS}{U}q{A}</think>{CALL_F_TEXT}{EOS}{U}<tool_result>res</tool_result>{A}<think>"),
    "declared tools keep the calling turn's reasoning": (
        [s("", tools=[WEATHER_TOOL]), u("q"), CALL_F, t("res")], {"thinking_mode": "thinking"},
        f"{U}q{A}<think>r</think>{CALL_F_TEXT}{EOS}{U}<tool_result>res</tool_result>{A}<think>"),
    "an empty tools list keeps pruning active and writes no block": (
        [s("S", tools=[]), u("a"), a("b", "r1"), u("c")], {"thinking_mode": "thinking"},
        f"{BOS}S{U}a{A}</think>b{EOS}{U}c{A}<think>"),
    "tools on a user message are lost and keep pruning active": (
        [u("a", tools=[WEATHER_TOOL]), a("b", "r1"), u("c")], {"thinking_mode": "thinking"},
        f"{BOS}{U}a{A}</think>b{EOS}{U}c{A}<think>"),
    # 6 start of the prompt
    "system then user in chat mode": ([s("S"), u("a")], {}, f"{BOS}S{U}a{A}</think>"),
    "system then user in thinking mode": ([s("S"), u("a")], {"thinking_mode": "thinking"}, f"{BOS}S{U}a{A}<think>"),
    "no BOS when asked": ([u("a")], {"thinking_mode": "thinking", "add_default_bos_token": False}, f"{U}a{A}<think>"),
    "reasoning effort max writes its prefix after BOS in thinking mode": (
        [s("You are a careful proof checker."), u("Prove it.")], {"thinking_mode": "thinking", "reasoning_effort": "max"},
        f"{BOS}{REASONING_EFFORT_MAX_PREFIX}You are a careful proof checker.{U}Prove it.{A}<think>"),
    "reasoning effort high changes nothing": (
        [u("a")], {"thinking_mode": "thinking", "reasoning_effort": "high"}, f"{BOS}{U}a{A}<think>"),
    "reasoning effort max changes nothing in chat mode": ([u("a")], {"reasoning_effort": "max"}, f"{BOS}{U}a{A}</think>"),
    "an empty conversation is BOS": ([], {}, BOS),
    # 7 bodies
    "a system message mid-conversation is rendered in place": (
        [u("a"), a("b"), s("S2"), u("c")], {}, f"{BOS}{U}a{A}</think>b{EOS}S2{U}c{A}</think>"),
    "a system message after a user message is glued to it": ([u("a"), s("s")], {}, f"{BOS}{U}as"),
    "a null system content contributes nothing": ([s(None), u("x")], {}, f"{BOS}{U}x{A}</think>"),
    "a developer message alone is a user turn": ([{"role": "developer", "content": "d"}], {}, f"{BOS}{U}d{A}</think>"),
    "system, developer, user in chat mode": (
        [s("S"), {"role": "developer", "content": "d"}, u("u")], {}, f"{BOS}S{U}d{U}u{A}</think>"),
    "an earlier developer message is pruned in thinking mode": (
        [s("S"), {"role": "developer", "content": "d"}, u("u")], {"thinking_mode": "thinking"},
        f"{BOS}S{U}u{A}<think>"),
    "an unknown role before the last user message is pruned silently": (
        [{"role": "wizard", "content": "w"}, u("u")], {"thinking_mode": "thinking"}, f"{BOS}{U}u{A}<think>"),
    "a user message with no content key is empty": ([{"role": "user"}], {}, f"{BOS}{U}{A}</think>"),
    "a reminder after a user turn follows its generation prompt": (
        [u("a"), {"role": "latest_reminder", "content": "R"}], {"thinking_mode": "thinking"},
        f"{BOS}{U}a{A}<think><｜latest_reminder｜>R"),
    "a reminder before a user turn": (
        [{"role": "latest_reminder", "content": "R"}, u("a")], {"thinking_mode": "thinking"},
        f"{BOS}<｜latest_reminder｜>R{U}a{A}<think>"),
    "a reminder without content is written as None": ([{"role": "latest_reminder"}], {}, f"{BOS}<｜latest_reminder｜>None"),
    "a prefill assistant has no EOS": (
        [u("Write a haiku about rain."), HAIKU], {"thinking_mode": "thinking"},
        f"{BOS}{U}Write a haiku about rain.{A}<think>Five, seven, five syllables.</think>Soft rain on the roof"),
    "two assistant messages in a row are concatenated": (
        [u("a"), a("b", "r1"), a("c", "r2")], {"thinking_mode": "thinking"},
        f"{BOS}{U}a{A}<think>r1</think>b{EOS}r2</think>c{EOS}"),
    "without any user message every assistant shows its reasoning": (
        [s("s"), a("c", "r")], {"thinking_mode": "thinking"}, f"{BOS}sr</think>c{EOS}"),
    "an empty assistant turn is just EOS": ([u("a"), a(None)], {}, f"{BOS}{U}a{A}</think>{EOS}"),
    "an empty tool call list writes no block": ([u("a"), a("b", tool_calls=[])], {}, f"{BOS}{U}a{A}</think>b{EOS}"),
    # 13 tasks
    "a query task ends the prompt with its token": ([u("q", task="query")], {}, f"{BOS}{U}q<｜query｜>"),
    "the output of a query task has no reasoning": (
        [u("q", task="query"), a("x", "ignored")], {"thinking_mode": "thinking"}, f"{BOS}{U}q<｜query｜>x{EOS}"),
    "an action task opens the answer in thinking mode": (
        [u("a", task="action"), a("Answer")], {"thinking_mode": "thinking"},
        f"{BOS}{U}a{A}<think><｜action｜>Answer{EOS}"),
    "an action task in chat mode": ([u("a", task="action"), a("Answer")], {}, f"{BOS}{U}a{A}</think><｜action｜>Answer{EOS}"),
    "a title task on an assistant message follows its EOS": (
        [u("q"), a("a", task="title")], {}, f"{BOS}{U}q{A}</think>a{EOS}<｜title｜>"),
    "a task works on a reminder": (
        [{"role": "latest_reminder", "content": "r", "task": "domain"}], {}, f"{BOS}<｜latest_reminder｜>r<｜domain｜>"),
    "an invalid task followed by a user message is never checked": (
        [u("q", task="nonsense"), u("q2")], {}, f"{BOS}{U}q{U}q2{A}</think>"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_each_rule_of_the_specification_renders_its_stated_prompt(name):
    messages, options, expected = CASES[name]
    text = encode_messages(messages, **{"thinking_mode": "chat", **options})
    if name == "declared tools keep the calling turn's reasoning":
        assert text.startswith(f"{BOS}\n\n## Tools\n\n") and text.endswith(expected)
    else:
        assert text == expected


CONVERSATION = [s("You are a weather explainer."), u("What is 212 °F?"),
                a("The boiling point of water.", "212 F is the boiling point of water.")]


def test_a_context_continuation_renders_only_the_new_messages_without_bos():
    assert encode_messages([u("And in Celsius?")], "thinking", context=CONVERSATION) == f"{U}And in Celsius?{A}<think>"


def test_a_continuation_in_chat_mode_appends_to_the_earlier_prompt_exactly():
    later = [u("And in Celsius?"), a("100 °C.")]
    assert (encode_messages(CONVERSATION, "chat") + encode_messages(later, "chat", context=CONVERSATION)
            == encode_messages(CONVERSATION + later, "chat"))


def test_a_call_in_the_context_orders_the_results_of_the_new_messages():
    context = [u("a"), TWO_CALLS]
    assert (encode_messages([t("two", "c2"), t("one", "c1")], "chat", context=context)
            == f"{U}<tool_result>one</tool_result>\n\n<tool_result>two</tool_result>{A}</think>")


def test_a_tool_result_at_the_start_of_the_new_messages_does_not_merge_into_the_context():
    assert encode_messages([t("T")], "chat", context=[u("a")]) == f"{U}<tool_result>T</tool_result>{A}</think>"


@pytest.mark.parametrize("context, messages", [
    ([u("a"), {"role": "developer", "content": "d"}, a("x")], [u("c")]),
    ([{"role": "developer", "content": "d"}], [u("u")]),
])
def test_a_context_developer_message_that_the_full_pruning_removes_skips_the_new_messages(context, messages):
    assert encode_messages(messages, "thinking", context=context) == ""


def test_the_max_effort_prefix_is_the_specified_text():
    assert REASONING_EFFORT_MAX_PREFIX == (
        "Reasoning Effort: Absolute maximum with no shortcuts permitted.\nYou MUST be very thorough in your thinking "
        "and comprehensively decompose the problem to resolve the root cause, rigorously stress-testing your logic "
        "against all potential paths, edge cases, and adversarial scenarios.\nExplicitly write out your entire "
        "deliberation process, documenting every intermediate step, considered alternative, and rejected hypothesis "
        "to ensure absolutely no assumption is left unchecked.\n\n")


def test_no_effort_prefix_is_written_in_a_continuation():
    assert encode_messages([u("b")], "thinking", context=[u("a"), a("x")], reasoning_effort="max") == f"{U}b{A}<think>"


@pytest.mark.parametrize("messages, options, error", [
    ([u("a")], {"thinking_mode": "deep"}, "thinking_mode must be 'chat' or 'thinking', got 'deep'"),
    ([], {"thinking_mode": "deep"}, "thinking_mode must be"),
    ([u("a")], {"reasoning_effort": "low"}, "reasoning_effort must be None, 'high' or 'max', got 'low'"),
    ([u(None)], {}, r"messages\[0\].content must be a string for role 'user', got null"),
    ([s("s"), u([{"type": "text", "text": "x"}])], {}, r"messages\[1\].content must be a string .* got list"),
    ([{"role": "developer", "content": ""}], {}, r"messages\[0\].content must be a non-empty string"),
    ([{"role": "developer"}], {}, r"messages\[0\].content must be a non-empty string"),
    ([{"role": "wizard", "content": "x"}], {}, r"messages\[0\].role 'wizard' is not a role of this format"),
    (["hello"], {}, r"messages\[0\] must be an object with a string 'role'"),
    ([u("q", task="poem")], {}, r"messages\[0\].task 'poem' is not a task; accepted: action, query"),
])
def test_bad_conversations_are_value_errors_naming_what_is_wrong(messages, options, error):
    with pytest.raises(ValueError, match=error):
        encode_messages(messages, **{"thinking_mode": "chat", **options})


def test_errors_name_the_messages_as_the_caller_says():
    with pytest.raises(ValueError, match=r"^turn 7\.content must be a string"):
        encode_messages([u(None)], "chat", names=["turn 7"])


def test_with_tools_declared_a_thinking_prompt_and_its_answer_begin_the_next_prompt():
    conversation = [s("S", tools=[WEATHER_TOOL]), u("q")]
    answer = "r</think>" + CALL_F_TEXT + EOS
    later = conversation + [CALL_F, t("res", "c1")]
    assert encode_messages(later, "thinking").startswith(encode_messages(conversation, "thinking") + answer)
