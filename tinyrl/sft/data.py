"""SFT examples from parquet, in verl's two SFT formats, as token ids and a loss mask.

single-turn  columns sft.prompt_key / sft.response_key (verl data.prompt_key / response_key):
             the prompt is text, or [{'role', 'content'}] messages as in RL data (so an RL file
             with a `response` column is an SFT file); it is rendered exactly as `tinyrl train`
             renders prompts (data.chat_template), then the response and the EOS token follow.
             Loss on the response and the EOS token.
multi-turn   column sft.messages_key (verl data.multiturn.messages_key): the conversation,
             rendered by the chat template (model.custom_chat_template or the tokenizer's),
             with sft.tools_key (a list of tool schemas, or its JSON text) handed to the template
             when the column exists. Loss on assistant turns only: the tokens that rendering
             the turn adds after the generation prompt (its content and end-of-turn marker).

Each example is split where the loss starts: `prompt` (no loss) and `response` with a 0/1
mask over it, the layout of tinyrl.models.make_batch, so the trainer's own log-prob pass reads it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from tinyrl.data.io import not_parquet_hint, not_parquet_message, without_nulls
from tinyrl.errors import TinyRLError
from tinyrl.models import Batch, make_batch
from tinyrl.rollout.hermes import has_tool_call

_HINT = ("single-turn: columns prompt + response (sft.prompt_key, sft.response_key); multi-turn: a "
         "messages column (sft.messages_key) of [{'role', 'content'}]; `tinyrl data countdown --sft` "
         "writes an example")


@dataclass
class SFTRows:
    """Tokenized examples: prompt ids (no loss), response ids, a 0/1 loss mask per response id."""

    prompts: list[list[int]]
    responses: list[list[int]]
    loss_masks: list[list[int]]
    format: str                                  # single | multiturn
    calls_without_schemas: int = 0               # multiturn rows that call tools but carry no tool schemas
    tool_without_call: list[int] = field(default_factory=list)  # multiturn rows (indices): _tool_without_call

    def __len__(self) -> int:
        return len(self.prompts)

    def batch(self, rows: list[int], pad_id: int) -> "SFTBatch":
        batch = make_batch([self.prompts[i] for i in rows], [self.responses[i] for i in rows], pad_id)
        width = batch.response_len
        mask = torch.tensor([self.loss_masks[i] + [0] * (width - len(self.loss_masks[i])) for i in rows],
                            dtype=torch.float32)
        return SFTBatch(batch, mask)


@dataclass
class SFTBatch:
    """What a Learner updates on (the slice of a Trajectory it uses): `mask` is the LOSS mask,
    which for multi-turn rows is narrower than the batch's response mask."""

    batch: Batch
    loss_mask: torch.Tensor                      # [B, R]

    @property
    def mask(self) -> torch.Tensor:
        return self.loss_mask

    @property
    def group_ids(self) -> None:
        """SFT's rows share no prompt that a mini-batch should keep together: each is its own
        (Trajectory.group_ids; microbatch.mini_batches)."""
        return None

    def __len__(self) -> int:
        return self.batch.input_ids.shape[0]

    def rows(self, index) -> "SFTBatch":
        return SFTBatch(self.batch.rows(index), self.loss_mask[index])

    def to(self, device) -> "SFTBatch":
        return SFTBatch(self.batch.to(device), self.loss_mask.to(device))


def detect_format(columns: list[str], sft_cfg) -> str:
    """sft.format, or with `auto` the one the columns hold (messages first, as verl's multiturn)."""
    want = sft_cfg.format
    single = sft_cfg.prompt_key in columns and sft_cfg.response_key in columns
    multi = sft_cfg.messages_key in columns
    if want == "auto":
        want = "multiturn" if multi else "single" if single else ""
    if want == "multiturn" and multi:
        _check_tools_column(columns, sft_cfg)
    if (want == "single" and single) or (want == "multiturn" and multi):
        return want
    needs = {"single": f"{sft_cfg.prompt_key} + {sft_cfg.response_key}", "multiturn": sft_cfg.messages_key}
    what = f"columns {needs[want]} (sft.format = {want})" if want else \
        f"columns {needs['single']} or {needs['multiturn']}"
    raise TinyRLError(f"has no {what}; it has: {', '.join(columns)}", hint=_HINT)


def _check_tools_column(columns: list[str], sft_cfg) -> None:
    """The default tools column may be absent (a conversation without tools); one named in
    sft.tools_key by hand must be there, or every row's tools were dropped without a word."""
    from tinyrl.config import SFTConfig

    if sft_cfg.tools_key not in columns and sft_cfg.tools_key != SFTConfig().tools_key:
        raise TinyRLError(f"has no column {sft_cfg.tools_key} (sft.tools_key); it has: {', '.join(columns)}",
                          hint=f"set sft.tools_key to the column holding the tool schemas, or leave it at "
                               f"{SFTConfig().tools_key!r} for conversations without tools")


def load_sft(path: Path, tokenizer, cfg, max_rows: int | None = None) -> SFTRows:
    """Read, render and tokenize an SFT parquet file; every problem names the file (and row)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise TinyRLError(not_parquet_message(Path(path), exc),
                          hint=not_parquet_hint(Path(path)) + _HINT) from exc
    try:
        fmt = detect_format(table.column_names, cfg.sft)
    except TinyRLError as exc:
        raise TinyRLError(f"{path} {exc.message}", hint=exc.hint) from exc
    if table.num_rows == 0:
        raise TinyRLError(f"{path} has no rows", hint=_HINT)
    if max_rows is not None:
        table = table.slice(0, max_rows)
    rows = table.to_pylist()
    render = single_turn if fmt == "single" else multi_turn
    segments = []
    for i, row in enumerate(rows):
        try:
            segments.append(render(row, tokenizer, cfg))
        except TinyRLError as exc:  # say where: a large file has one bad row
            raise TinyRLError(f"{path} row {i} (counting from 0): {exc.message}", hint=exc.hint) from exc
    out = SFTRows([], [], [], fmt)
    if fmt == "multiturn":
        conversations = [_row_messages(row, cfg.sft) for row in rows]  # parsed once for both counts
        out.calls_without_schemas = sum(1 for row, messages in zip(rows, conversations)
                                        if _calls_tools(messages) and not _row_tools(row, cfg.sft))
        out.tool_without_call = [i for i, messages in enumerate(conversations) if _tool_without_call(messages)]
    eos = tokenizer.eos_token_id if fmt == "single" else None
    for i, tokens in enumerate(tokenize(segments, tokenizer, eos)):
        try:
            prompt, response, mask = split_at_loss(tokens)
        except TinyRLError as exc:
            raise TinyRLError(f"{path} row {i} (counting from 0): {exc.message}", hint=exc.hint) from exc
        out.prompts.append(prompt)
        out.responses.append(response)
        out.loss_masks.append(mask)
    _check_lengths(out, path, cfg.sft.max_length)
    return out


def single_turn(row: dict, tokenizer, cfg) -> list[tuple[str, int]]:
    """[(prompt text, 0), (response text, 1)]: the prompt as `tinyrl train` renders it."""
    from tinyrl.data.io import chat_text, prompt_text

    s = cfg.sft
    prompt_row = {"prompt": row[s.prompt_key]}
    prompt = chat_text(prompt_row, tokenizer) if cfg.data.chat_template else prompt_text(prompt_row)
    response = row[s.response_key]
    if not isinstance(response, str) or not response:
        raise TinyRLError(f"{s.response_key} is {type(response).__name__} {response!r:.80}, not a non-empty text",
                          hint=f"each row's {s.response_key} is the target completion, as text")
    return [(prompt, 0), (response, 1)]


def multi_turn(row: dict, tokenizer, cfg) -> list[tuple[str, int]]:
    """The conversation as rendered text segments, each with its loss flag (1: an assistant turn's
    own tokens). The rendering up to an assistant turn must be a prefix of the rendering with it
    (true for the usual templates); a template that rewrites earlier turns (Qwen3 drops earlier
    thinking) is refused, not silently mis-masked."""
    messages = _row_messages(row, cfg.sft)
    render_messages = _renderer(tokenizer, _row_tools(row, cfg.sft))

    def render(upto: int, generation_prompt: bool) -> str:
        return render_messages(messages[:upto], generation_prompt)

    # Rendered only at assistant turns (and once whole): what lies between them is untrained,
    # so a template may write it differently once later messages exist (Qwen2.5 closes a run
    # of tool messages only after the last one).
    segments, done = [], ""
    for k, message in enumerate(messages, start=1):
        if message["role"] != "assistant":
            continue
        head = render(k - 1, True) if k > 1 else _opening(messages, render_messages)
        full = render(k, False)
        _check_prefix(done, head, k)
        _check_prefix(head, full, k)
        segments += [(head[len(done):], 0), (full[len(head):], 1)]
        done = full
    whole = render(len(messages), False)
    _check_prefix(done, whole, len(messages))
    segments.append((whole[len(done):], 0))
    return [(text, flag) for text, flag in segments if text]


def _row_messages(row: dict, s) -> list[dict]:
    messages = row[s.messages_key]
    if isinstance(messages, str) and messages.lstrip().startswith("["):  # JSON text, as tools may be
        try:
            messages = json.loads(messages)
        except ValueError as exc:
            raise TinyRLError(f"{s.messages_key} is text that starts as a JSON list but is not JSON: {exc}",
                              hint="store the conversation as a list of {'role', 'content'}, or as its JSON "
                                   "text") from exc
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) and "role" in m
                                                                  for m in messages):
        raise TinyRLError(f"{s.messages_key} is not a list of {{'role', 'content'}} messages: {messages!r:.120}",
                          hint=_HINT)
    messages = without_nulls(messages)
    _check_roles([m["role"] for m in messages], s.messages_key)
    return messages


def _calls_tools(messages: list[dict]) -> bool:
    """An assistant turn calls a tool. A tool's output alone is not a call (until 2026-11-27 it
    counted, so the tool demo's drills, which list no tools on purpose, got the schemas note)."""
    return any(_calls(m) for m in messages)


def _tool_without_call(messages: list[dict]) -> bool:
    """A tool message whose message before it (other tool messages aside) is not an assistant
    turn that calls a tool: the model is trained on a tool's output that nothing asked for, which
    RL never shows (often a converter dropped the call). A row that opens with a tool's output,
    before any user or assistant turn (the tool demo's drills), has no turn that lacks the call."""
    previous, opened = None, False
    for message in messages:
        if message["role"] != "tool":
            previous, opened = message, opened or message["role"] in ("user", "assistant")
        elif opened and not _calls(previous):
            return True
    return False


def _calls(message: dict) -> bool:
    """An assistant turn with a call: tool_calls, or a hermes <tool_call> in its text (the tool
    demo's; tinyrl's rollouts read that format, tinyrl.rollout.hermes)."""
    content = message.get("content")
    return message["role"] == "assistant" and bool(message.get("tool_calls")
                                                   or isinstance(content, str) and has_tool_call(content))


def start_notes(rows: SFTRows, path: Path, tools_key: str) -> list[str]:
    """What a run on these rows says when it starts."""
    return [note for note in (schemas_note(rows, path, tools_key), tool_without_call_note(rows, path)) if note]


def tool_without_call_note(rows: SFTRows, path: Path) -> str | None:
    if not rows.tool_without_call:
        return None
    shown = ", ".join(map(str, rows.tool_without_call[:5])) + (", ..." if len(rows.tool_without_call) > 5 else "")
    return (f"{len(rows.tool_without_call)} of {len(rows)} conversations in {path} have a tool message with no "
            f"call before it (rows {shown}, counting from 0): the turn before it has no tool_calls and no "
            "<tool_call> in its text, so they train on a tool's output nothing asked for, which RL never "
            "shows; give that turn its call, or drop those rows")


def schemas_note(rows: SFTRows, path: Path, tools_key: str) -> str | None:
    """Said at the start: a conversation that calls tools is trained with the tool list its
    template renders from the row's schemas; without them the model learns calls under a prompt
    that lists no tools, and RL prompts (tinyrl's and verl's) list them."""
    if not rows.calls_without_schemas:
        return None
    return (f"{rows.calls_without_schemas} of {len(rows)} conversations in {path} call tools but carry no tool "
            f"schemas (column {tools_key}, sft.tools_key): they are trained under a prompt that lists no "
            "tools, where RL prompts list them; add each row's schemas to train what RL will see")


ROLES = ("system", "user", "assistant", "tool")  # what chat templates write, and the loss reads
# Names that mean one of ROLES but that a template renders as a role of their own (Qwen2.5
# writes "<|im_start|>gpt"), so their turns went untrained or unlike the model's own turns.
ROLE_ALIASES = {"human": "user", "gpt": "assistant"}  # ShareGPT's


def _check_roles(roles: list, key: str) -> None:
    hint = ("roles are 'system', 'user', 'assistant' (the turns trained on) and 'tool'; rename "
            "ShareGPT's human -> user and gpt -> assistant")
    for i, role in enumerate(roles):
        meant = ROLE_ALIASES.get(role) or (str(role).lower() if str(role).lower() in ROLES else None)
        if role not in ROLES and meant:
            raise TinyRLError(f"{key}[{i}] has the role {role!r}, which the chat template does not read "
                              f"as {meant!r}", hint=hint)
    if "assistant" not in roles:
        raise TinyRLError(f"{key} has no assistant turn, so nothing to learn (roles: {', '.join(map(str, roles))})",
                          hint=hint + "; or drop the row")


def _row_tools(row: dict, s) -> list[dict] | None:
    """The row's tool schemas for the template: sft.tools_key as a list, or as its JSON text."""
    tools = row.get(s.tools_key)
    if isinstance(tools, str):
        try:
            tools = json.loads(tools) if tools.strip() else None
        except ValueError as exc:
            raise TinyRLError(f"{s.tools_key} is text but not JSON: {exc}",
                              hint="store the tool schemas as a list, or as JSON text") from exc
    else:
        tools = without_nulls(tools)
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise TinyRLError(f"{s.tools_key} is not a list of tool schemas: {tools!r:.120}",
                          hint="give each row a list of function schemas ([{'type': 'function', 'function': "
                               "{...}}]), as a list or its JSON text; a single schema goes inside a list too")
    return tools or None


def _renderer(tokenizer, tools: list[dict] | None):
    """render(messages, generation_prompt) -> text, by the chat template, with the row's tools."""
    from jinja2 import TemplateError  # transformers' own template engine

    if not getattr(tokenizer, "chat_template", None):
        raise TinyRLError("multi-turn SFT renders messages with a chat template, and this tokenizer has none",
                          hint="set model.custom_chat_template to a Jinja template (text or file), or use an "
                               "instruct model")
    kwargs = {"tools": tools} if tools else {}

    def render_messages(these: list[dict], generation_prompt: bool = False) -> str:
        try:
            return tokenizer.apply_chat_template(these, tokenize=False, add_generation_prompt=generation_prompt,
                                                 **kwargs)
        except (TemplateError, ValueError) as exc:  # the template's raise_exception, transformers' checks
            raise TinyRLError(f"the chat template cannot render this conversation: {type(exc).__name__}: {exc}",
                              hint="check the row's roles, tool calls and tools against the chat template "
                                   "(model.custom_chat_template, else the tokenizer's)") from exc
    return render_messages


def _opening(messages: list[dict], render_messages) -> str:
    """What the template writes before a conversation's first message when that message is the
    assistant's (a default system turn, the assistant header): the rendering of the same turn
    with a marker for its content, cut at the marker. Not trained. (Templates cannot render an
    empty conversation, transformers refuses one.)"""
    marker = "\u2063tinyrl-content\u2063"
    text = render_messages([{**messages[0], "content": marker}])
    if marker not in text:
        raise TinyRLError("the conversation starts with an assistant turn and the chat template does not show "
                          "where its content begins", hint="start each conversation with a system or user message")
    return text[:text.index(marker)]


def _check_prefix(before: str, after: str, k: int) -> None:
    if not after.startswith(before):
        raise TinyRLError(f"the chat template renders message {k} so that the text before it changes, so "
                          "the assistant turns cannot be masked token by token",
                          hint="use a chat template that appends each message (model.custom_chat_template)")


def tokenize(rows: list[list[tuple[str, int]]], tokenizer, eos: int | None) -> list[tuple[list[int], list[int]]]:
    """Per row: token ids and a 0/1 loss flag per id. Segments are tokenized one by one (as
    generation sees them: a prompt, then what is generated after it), all rows in one batched
    call; `eos` is appended, trained, unless the text ended with it already."""
    texts = [text for segments in rows for text, _ in segments]
    ids = iter(tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else [])
    out = []
    for segments in rows:
        row_ids, flags = [], []
        for _, flag in segments:
            part = next(ids)
            row_ids += part
            flags += [flag] * len(part)
        if eos is not None and (not row_ids or row_ids[-1] != eos):
            row_ids.append(eos)
            flags.append(1)
        out.append((row_ids, flags))
    return out


def split_at_loss(tokens: tuple[list[int], list[int]]) -> tuple[list[int], list[int], list[int]]:
    """(ids, flags) -> (prompt: the ids before the first trained one, response, its loss mask)."""
    ids, flags = tokens
    if 1 not in flags:
        raise TinyRLError("the row has no token to learn (an empty response?)", hint=_HINT)
    start = flags.index(1)
    return ids[:start], ids[start:], flags[start:]


def _check_lengths(rows: SFTRows, path: Path, max_length: int) -> None:
    lengths = [len(p) + len(r) for p, r in zip(rows.prompts, rows.responses)]
    too_long = [i for i, n in enumerate(lengths) if n > max_length]
    if too_long:
        raise TinyRLError(
            f"{len(too_long)} of {len(lengths)} rows in {path} are longer than sft.max_length = {max_length} "
            f"tokens (the longest has {max(lengths)}; first at row {too_long[0]})",
            hint=f"set sft.max_length={max(lengths)} (within the model's context), or drop those rows")
