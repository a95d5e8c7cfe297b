"""Tool calls in an assistant turn, in Qwen2.5's hermes format:

    <tool_call>
    {"name": "code_interpreter", "arguments": {"code": "print(1 + 1)"}}
    </tool_call>

(the format Qwen2.5's chat template teaches in its system prompt, and verl's
`HermesToolParser` reads: verl 0.9.1 verl/experimental/agent_loop/tool_parser.py, regex
`<tool_call>(.*?)</tool_call>` with DOTALL, then json.loads of the stripped body).

`parse_tool_calls(text)` never raises: a call that cannot be used comes back with the reason
(`problem`) and the status its tool turn gets (TOOL_CALL_STATUSES), so the model reads what it
did wrong instead of the episode crashing. Knows nothing of tokens, engines or sandboxes.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_JSON_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool,
               "object": dict, "array": list}


@dataclass(frozen=True)
class ParsedCall:
    name: str                                 # "" when the body is not a call object
    arguments: dict[str, Any] = field(default_factory=dict)
    status: str = ""                          # "" = usable; else "bad_call" / "unknown_tool"
    problem: str = ""                         # what was wrong, for the error tool turn

    @property
    def error_turn(self) -> str:
        """The tool turn of a call that is not run: what was wrong with it."""
        return f"[error: {self.problem}]"


def has_tool_call(text: str) -> bool:
    return "<tool_call>" in text


def parse_tool_calls(text: str, schemas: dict[str, dict]) -> list[ParsedCall]:
    """Every `<tool_call>` block of `text`, in order, checked against `schemas` (tool name ->
    OpenAI function schema). An opening tag that is never closed is one bad call."""
    calls = [_parse_one(m.group(1), schemas) for m in CALL_RE.finditer(text)]
    tail = text[text.rfind("</tool_call>") + len("</tool_call>"):] if "</tool_call>" in text else text
    if "<tool_call>" in tail:
        calls.append(ParsedCall("", status="bad_call", problem="<tool_call> is not closed by </tool_call>"))
    return calls


def _parse_one(body: str, schemas: dict[str, dict]) -> ParsedCall:
    try:
        obj = json.loads(body.strip())
    except ValueError as e:  # json.JSONDecodeError is a ValueError
        return ParsedCall("", status="bad_call", problem=f"the call is not valid JSON ({e})")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return ParsedCall("", status="bad_call",
                          problem='the call must be a JSON object {"name": ..., "arguments": {...}}')
    return check_call(obj["name"], obj.get("arguments", {}), schemas)


def check_call(name: str, arguments: Any, schemas: dict[str, dict]) -> ParsedCall:
    """A call of tool `name` with `arguments` (its parsed JSON value) checked against `schemas`
    (tool name -> OpenAI function schema): tinyrl's rules for every call it runs, in its own turn
    loop and in the verl tool `tinyrl export-verl` writes (tinyrl/export_verl/tools.py), so a
    call is run or refused, with the same words, in both."""
    if isinstance(arguments, str):  # some models double-encode the arguments
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass
    if name not in schemas:
        known = ", ".join(sorted(schemas)) or "none"
        return ParsedCall(name, status="unknown_tool", problem=f"no tool named {name!r} (tools: {known})")
    if not isinstance(arguments, dict):
        return ParsedCall(name, status="bad_call", problem='"arguments" must be a JSON object')
    problem = argument_problem(arguments, schemas[name])
    if problem:
        return ParsedCall(name, arguments, status="bad_call", problem=problem)
    return ParsedCall(name, arguments)


def argument_problem(arguments: dict[str, Any], schema: dict) -> str:
    """'' when `arguments` has the schema's required keys with the declared JSON types."""
    params = schema.get("function", schema).get("parameters", {})
    props = params.get("properties", {})
    missing = [k for k in params.get("required", []) if k not in arguments]
    if missing:
        return f"missing argument(s): {', '.join(missing)}"
    for key, value in arguments.items():
        want = _JSON_TYPES.get(props.get(key, {}).get("type", ""))
        if want is not None and (not isinstance(value, want) or (want is not bool and isinstance(value, bool))):
            return f"argument {key!r} must be a {props[key]['type']}, got {type(value).__name__}"
    return ""


# A decoded episode as Qwen2.5's template (and tinyrl's tiny-hermes.jinja) renders it: tool output
# between these markers, a model's call between the call markers. The tasks with tools read their
# answer from the model's last turn with `final_turn`, so that what a program prints is never
# scored as the model's answer.
_RESPONSE_OPEN, _RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
_CALL = re.compile(r"<tool_call>.*?(?:</tool_call>|\Z)", re.S)


def final_turn(completion: str) -> str:
    """The model's last turn of a decoded episode: after the last tool response, tool calls removed;
    "" when the text ends inside a tool response (cut by the length limit: nothing of it is the
    model's). A tool whose output fakes a closing marker cannot move the cut: the real marker after
    its output is the last one (an episode cut inside a tool turn shows in its Episode.turns: the
    last turn is not the assistant's)."""
    close = completion.rfind(_RESPONSE_CLOSE)
    if completion.rfind(_RESPONSE_OPEN) > close:
        return ""
    tail = completion[close + len(_RESPONSE_CLOSE):] if close >= 0 else completion
    return _CALL.sub("", tail)
