"""DeepSeek-V4 chat prompts, character for character as the release's encoder writes them.

``encode_messages(messages, thinking_mode)`` is the public, offline entry point (batch jobs build
prompts with it; the server's chat route uses it through :mod:`chat_prompt`); its counterpart for the
model's answer, ``parse_completion(text, thinking_mode)`` (:mod:`dsv4_answer`), is importable from here
too. The layout::

    <｜begin▁of▁sentence｜>{system}[\\n\\n{tools block}][\\n\\n{response-format block}]
    <｜User｜>{user}<｜Assistant｜></think>{answer}[\\n\\n{DSML calls}]<｜end▁of▁sentence｜>   (earlier turn)
    <｜User｜><tool_result>{result}</tool_result>\\n\\n{user}<｜Assistant｜><think>          (thinking mode)

Rules, in pipeline order:

1. **Normalisation.** Runs of adjacent ``user`` / ``tool`` messages become one user turn of blocks
   joined with ``"\\n\\n"`` (a ``tool`` message is a ``<tool_result>`` block); a user message after a
   turn that carries a ``task`` starts a new turn. Inside a turn, tool results are put in the order of
   the calls of the latest assistant message with ``tool_calls`` (by ``tool_call_id``).
2. **Pruning** ("drop thinking"), active in thinking mode when ``drop_thinking`` is true and no message
   declares ``tools``: before the last user / developer message only user, system, latest_reminder
   and assistant messages stay, and those assistants lose their reasoning.
3. **Rendering.** BOS (unless ``add_default_bos_token`` is false or a ``context`` is given), the
   ``reasoning_effort="max"`` prefix (thinking mode), then each message's body followed by the
   generation prompt ``<｜Assistant｜>`` + ``<think>`` / ``</think>`` (or a task token) when the next
   message is an assistant or latest_reminder message, or there is none.

Roles: ``system`` (bare text, anywhere), ``developer`` (a user turn that may declare tools),
``user``, ``tool``, ``assistant`` (``content``, ``reasoning_content``, ``tool_calls``, ``wo_eos``: no EOS,
a prefill), ``latest_reminder``; any message may carry a ``task`` (:data:`TASK_TOKENS`). The tool texts
are in :mod:`dsv4_tools_block`.

Bad input is a ``ValueError`` naming the message (``messages[i]``). Two choices differ from the
release's encoder, both for inputs it does not render usefully: ``thinking_mode`` and
``reasoning_effort`` are checked even when ``messages`` is empty, and call arguments nested too deeply
for Python's JSON reader are refused instead of being written as one raw ``arguments`` string.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from atom.entrypoints.dsv4_answer import parse_completion
from atom.entrypoints.dsv4_tools_block import (DSML, TOOL_CALLS_BEGIN, TOOL_CALLS_END, response_format_block,
                                               tool_calls_block, tools_block)

__all__ = ["encode_messages", "parse_completion", "BOS", "EOS", "USER", "ASSISTANT", "LATEST_REMINDER", "THINK", "END_THINK", "DSML",
           "TOOL_CALLS_BEGIN", "TOOL_CALLS_END", "TASK_TOKENS", "REASONING_EFFORT_MAX_PREFIX"]

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
USER, ASSISTANT, LATEST_REMINDER = "<｜User｜>", "<｜Assistant｜>", "<｜latest_reminder｜>"
THINK, END_THINK = "<think>", "</think>"
TOOL_RESULT_OPEN, TOOL_RESULT_CLOSE = "<tool_result>", "</tool_result>"

#: A message's ``task`` -> the token that asks for that short auxiliary output.
TASK_TOKENS = {name: f"<｜{name}｜>" for name in ("action", "query", "authority", "domain", "title", "read_url")}

#: Written after BOS in thinking mode when ``reasoning_effort="max"``.
REASONING_EFFORT_MAX_PREFIX = (
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root "
    "cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial "
    "scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, considered "
    "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n"
)

THINKING_MODES = ("chat", "thinking")
REASONING_EFFORTS = (None, "high", "max")
_USER_SIDE = ("user", "developer")

# A message of the working list: (its name in errors, the message). A user turn is a dict with
# role "user" and "blocks": ("text", content) or ("tool", content, tool_call_id) tuples.
_Entry = tuple[str, Mapping[str, Any]]


def encode_messages(messages: Sequence[Mapping[str, Any]], thinking_mode: str = "chat",
                    context: Sequence[Mapping[str, Any]] | None = None, drop_thinking: bool = True,
                    add_default_bos_token: bool = True, reasoning_effort: str | None = None, *,
                    names: Sequence[str] | None = None) -> str:
    """The prompt text of ``messages`` (OpenAI-style dicts; tools as a ``tools`` list on a system or
    developer message).

    ``thinking_mode``: ``"chat"`` or ``"thinking"``. ``context``: messages whose text was encoded
    earlier; they are looked at but not rendered, and no BOS is written, so a continued conversation
    reuses its earlier prompt as a prefix. ``drop_thinking``: allow pruning earlier reasoning.
    ``reasoning_effort``: None, ``"high"`` (no change) or ``"max"``. ``names``: how errors refer to
    each message of ``messages`` (default ``messages[i]``). Raises ``ValueError`` on bad input.
    """
    if thinking_mode not in THINKING_MODES:
        raise ValueError(f"thinking_mode must be 'chat' or 'thinking', got {_shown(thinking_mode)}")
    if reasoning_effort not in REASONING_EFFORTS:
        raise ValueError(f"reasoning_effort must be None, 'high' or 'max', got {_shown(reasoning_effort)}")
    context = list(context or [])
    messages = list(messages)
    if names is None:
        names = [f"messages[{i}]" for i in range(len(messages))]
    elif len(names) != len(messages):
        raise ValueError(f"names has {len(names)} entries for {len(messages)} messages")
    ctx = _order_tool_results(_merge_user_turns(context, [f"context[{i}]" for i in range(len(context))]), [])
    new = _order_tool_results(_merge_user_turns(messages, list(names)), context)
    work = ctx + new
    thinking = thinking_mode == "thinking"
    pruning = thinking and drop_thinking and not any(m.get("tools") for _, m in work)
    start = len(ctx)
    if pruning:
        work, start = _prune(work), len(_prune(ctx))
    out = [BOS] if add_default_bos_token and not context else []
    if thinking and reasoning_effort == "max" and start == 0 and work:
        out.append(REASONING_EFFORT_MAX_PREFIX)
    last_user = _last_user_side(work)
    for i in range(start, len(work)):
        out.append(_body(work, i, thinking, pruning, last_user))
        out.append(_transition(work, i, thinking, pruning, last_user))
    return "".join(out)


# ---- normalisation ------------------------------------------------------------------------------------------
def _merge_user_turns(messages: list[Mapping[str, Any]], names: list[str]) -> list[_Entry]:
    """Adjacent user / tool messages -> one user turn of blocks (a task-bearing turn takes no more user text)."""
    out: list[_Entry] = []
    for name, m in zip(names, messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise ValueError(f"{name} must be an object with a string 'role'")
        role = m["role"]
        last = out[-1][1] if out else None
        is_turn = last is not None and last.get("role") == "user"
        if role == "tool":
            block = ("tool", m.get("content", ""), m.get("tool_call_id", ""))
            if is_turn:
                last["blocks"].append(block)  # type: ignore[index]
            else:
                out.append((name, {"role": "user", "blocks": [block]}))
        elif role == "user":
            content = m.get("content", "")
            if not isinstance(content, str):
                raise ValueError(f"{name}.content must be a string for role 'user', got "
                                 f"{'null' if content is None else type(content).__name__}")
            if is_turn and last.get("task") is None:  # type: ignore[union-attr]
                last["blocks"].append(("text", content))  # type: ignore[index]
            else:
                turn = {k: m[k] for k in ("task", "wo_eos", "mask") if k in m}
                out.append((name, {"role": "user", "blocks": [("text", content)], **turn}))
        else:
            out.append((name, m))
    return out


def _order_tool_results(work: list[_Entry], earlier: Sequence[Mapping[str, Any]]) -> list[_Entry]:
    """Sort the tool results of each user turn by the position of their call in the latest assistant
    message with tool calls (``earlier`` messages can supply it). Unknown ids sort first; text stays."""
    positions: dict[Any, int] = {}
    for m in earlier:
        positions = _call_positions(m, positions)
    for _, m in work:
        positions = _call_positions(m, positions)
        if m.get("role") != "user" or "blocks" not in m or not positions:
            continue
        blocks = m["blocks"]
        slots = [k for k, b in enumerate(blocks) if b[0] == "tool"]
        if len(slots) < 2:
            continue
        results = sorted((blocks[k] for k in slots), key=lambda b: positions.get(b[2], 0))
        for k, block in zip(slots, results):
            blocks[k] = block
    return work


def _call_positions(m: Any, positions: dict[Any, int]) -> dict[Any, int]:
    if not isinstance(m, Mapping) or m.get("role") != "assistant" or not m.get("tool_calls"):
        return positions
    out: dict[Any, int] = {}
    for k, call in enumerate(m["tool_calls"]):
        if not isinstance(call, Mapping):
            continue
        call_id = call.get("id")
        if call_id is None and isinstance(call.get("function"), Mapping):
            call_id = call["function"].get("id")
        if call_id is not None:
            out[call_id] = k
    return out


# ---- pruning ------------------------------------------------------------------------------------------------
def _last_user_side(work: list[_Entry]) -> int:
    return max((i for i, (_, m) in enumerate(work) if m.get("role") in _USER_SIDE), default=-1)


def _prune(work: list[_Entry]) -> list[_Entry]:
    """Keep everything from the last user / developer message on; before it only user, system,
    latest_reminder and assistant messages (developer messages and unknown roles are removed)."""
    last = _last_user_side(work)
    keep = ("user", "system", "latest_reminder", "assistant")
    return [e for i, e in enumerate(work) if i >= last or e[1].get("role") in keep]


# ---- rendering ----------------------------------------------------------------------------------------------
def _body(work: list[_Entry], i: int, thinking: bool, pruning: bool, last_user: int) -> str:
    name, m = work[i]
    role = m.get("role")
    if role == "system":
        return _text_or_empty(m.get("content")) + _declarations(m, name)
    if role == "developer":
        content = m.get("content")
        if not isinstance(content, str) or not content:
            raise ValueError(f"{name}.content must be a non-empty string for role 'developer'")
        return USER + content + _declarations(m, name)
    if role == "user":
        return USER + "\n\n".join(_block(b) for b in m["blocks"])
    if role == "latest_reminder":
        return LATEST_REMINDER + str(m.get("content"))
    if role == "assistant":
        return _assistant(work, i, thinking, pruning, last_user)
    raise ValueError(f"{name}.role {_shown(role)} is not a role of this format; accepted: system, developer, user, "
                     "assistant, tool, latest_reminder")


def _declarations(m: Mapping[str, Any], name: str) -> str:
    """A system / developer message's tools block and response-format block, each after a blank line."""
    out = ""
    if m.get("tools"):
        out += "\n\n" + tools_block(m["tools"], f"{name}.tools")
    if m.get("response_format"):
        out += "\n\n" + response_format_block(m["response_format"], f"{name}.response_format")
    return out


def _block(block: tuple[Any, ...]) -> str:
    if block[0] == "text":
        return block[1]
    return TOOL_RESULT_OPEN + _tool_result_text(block[1]) + TOOL_RESULT_CLOSE


def _tool_result_text(content: Any) -> str:
    """A string as is; a list of content parts as its texts (other parts named) joined with a blank line."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n\n".join(_part_text(p) for p in content)
    return str(content)


def _part_text(part: Any) -> str:
    if isinstance(part, Mapping) and part.get("type") == "text":
        return _text_or_empty(part.get("text"))
    kind = part.get("type") if isinstance(part, Mapping) else None
    return f"[Unsupported {kind}]"


def _assistant(work: list[_Entry], i: int, thinking: bool, pruning: bool, last_user: int) -> str:
    name, m = work[i]
    after_task = i > 0 and work[i - 1][1].get("task") is not None
    reasoning = ""
    if thinking and not after_task and (not pruning or i > last_user):
        reasoning = _text_or_empty(m.get("reasoning_content")) + END_THINK
    calls = m.get("tool_calls")
    block = "\n\n" + tool_calls_block(calls, f"{name}.tool_calls") if calls else ""
    return reasoning + _text_or_empty(m.get("content")) + block + ("" if m.get("wo_eos") else EOS)


def _transition(work: list[_Entry], i: int, thinking: bool, pruning: bool, last_user: int) -> str:
    """What follows message ``i``: nothing when a user-side or system message comes next; otherwise the
    task token it asks for, or the generation prompt after a user / developer turn."""
    name, m = work[i]
    if i + 1 < len(work) and work[i + 1][1].get("role") not in ("assistant", "latest_reminder"):
        return ""
    task = m.get("task")
    if task is not None:
        if task not in TASK_TOKENS:
            raise ValueError(f"{name}.task {_shown(task)} is not a task; accepted: {', '.join(TASK_TOKENS)}")
        if task == "action":
            return ASSISTANT + (THINK if thinking else END_THINK) + TASK_TOKENS["action"]
        return TASK_TOKENS[task]
    if m.get("role") in _USER_SIDE:
        return ASSISTANT + (THINK if thinking and (not pruning or i >= last_user) else END_THINK)
    return ""


def _shown(value: Any, limit: int = 40) -> str:
    """A caller's value in an error message, cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _text_or_empty(value: Any) -> str:
    """Null or missing -> ``""``; a string as is; anything else as Python's ``str()``."""
    if value is None:
        return ""
    return value if isinstance(value, str) else str(value)
