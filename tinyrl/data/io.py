"""Read prompt files (TinyZero/verl parquet schema) and pick fields out of their rows.

Knows the columns a trainer needs (`prompt`, `reward_model`) and nothing about the task; files
made by TinyZero's `examples/data_preprocess/countdown.py` load as they are. Parquet hands nested
values back as numpy arrays and numpy scalars; `ground_truth` turns them into plain Python.
pandas and pyarrow are imported by the readers alone: the rewards read rows through this module,
and export-verl's reward_fn.py runs them where tinyrl is installed without its dependencies.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tinyrl.errors import TinyRLError

REQUIRED_COLUMNS = ("prompt", "reward_model")
_MAKE_HINT = ("set data.train_path / data.test_path to a TinyZero-schema parquet file, or make "
              "one with `tinyrl data countdown --out DIR`")


_TEXT_TABLES = {".jsonl": ("JSON-lines", "read_json(f, lines=True)"), ".json": ("JSON", "read_json(f)"),
                ".csv": ("CSV", "read_csv(f)")}


def converted_name(path: Path) -> Path:
    """Where the one-line conversion writes: NAME.parquet, or NAME-converted[-N].parquet where
    that exists (following the hint overwrote the user's own NAME.parquet until 2026-11-28)."""
    out = path.with_suffix(".parquet")
    n = 1
    while out.exists():
        out = path.with_name(f"{path.stem}-converted{'' if n == 1 else f'-{n}'}.parquet")
        n += 1
    return out


def not_parquet_message(path: Path, exc: Exception) -> str:
    """What a file that did not read as parquet is: its kind where the suffix says it (Arrow's
    "Parquet magic bytes not found" told a .csv's owner nothing), else Arrow's own words."""
    kind = _TEXT_TABLES.get(path.suffix.lower())
    if kind is not None:
        return f"{path} is a {kind[0]} file; tinyrl reads parquet"
    return f"cannot read {path} as parquet: {type(exc).__name__}: {exc}"


def not_parquet_hint(path: Path) -> str:
    """What to do with a file that is not parquet: a JSON-lines, JSON or CSV table converts in
    one line (tinyrl reads parquet only, as verl's data sets do, so an export-verl copy loads)."""
    kind = _TEXT_TABLES.get(path.suffix.lower())
    if kind is None:
        return ""
    out = converted_name(path)
    return (f"convert it with python -c \"import pandas as pd; "
            f"f = '{path}'; pd.{kind[1]}.to_parquet('{out}')\" and give {out}; ")


def _read_table(path: Path, max_rows: int | None, make: str, convert: str) -> pa.Table:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
        names = pf.schema_arrow.names
        missing = [c for c in REQUIRED_COLUMNS if c not in names]
        if missing or pf.metadata.num_rows == 0:
            return pf.schema_arrow.empty_table()  # the caller says which problem it is
        if max_rows is None:
            return pf.read()
        batches, seen = [], 0  # read only as far as needed: train files hold 327,680 rows
        for batch in pf.iter_batches(batch_size=min(max_rows, 65_536)):
            batches.append(batch)
            seen += batch.num_rows
            if seen >= max_rows:
                break
        return pa.Table.from_batches(batches, schema=pf.schema_arrow).slice(0, max_rows)
    except (pa.ArrowException, OSError, ValueError) as e:
        hint = not_parquet_hint(path)
        raise TinyRLError(not_parquet_message(path, e),
                          hint=f"{hint}that keeps its columns, so it must already have prompt and reward_model; "
                               + (f"a plain table of problems and answers is the other case: {convert} converts it"
                                  if convert else f"if it is not, {make}") if hint
                          else f"the file is broken or not parquet; {make}") from e


def load_prompts(path: str | Path, max_rows: int | None = None, make: str = _MAKE_HINT,
                 convert: str = "") -> pd.DataFrame:
    """The rows of a parquet prompt file (the first `max_rows` if set), checked for the columns.
    `make`: how to make such a file, for the hints (a caller that knows the task names its command);
    `convert`: the command that converts a plain table at `path` into the task's prompts, "" when
    the task has none (tinyrl.tasks.table_hint). Until 2026-11-28 the hint guessed it from `make`
    holding "--from", which data_hint drops when it names generated data (math-tiny's train file)."""
    path = Path(path).expanduser()
    if max_rows is not None and (isinstance(max_rows, bool) or not isinstance(max_rows, int)
                                 or max_rows < 1):
        raise TinyRLError(f"max_rows must be a positive integer or None, got {max_rows!r}",
                          hint="leave it unset to load every row")
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "not found"
        raise TinyRLError(f"data file {what}: {path}", hint=make)
    table = _read_table(path, max_rows, make, convert)
    missing = [c for c in REQUIRED_COLUMNS if c not in table.column_names]
    if missing:
        raise TinyRLError(
            f"{path} lacks column(s) {', '.join(missing)}; it has: {', '.join(table.column_names)}",
            hint="each row needs `prompt` ([{'role': 'user', 'content': ...}] or text) and "
                 f"`reward_model` ({{'ground_truth': ...}}); {make}")
    if table.num_rows == 0:
        raise TinyRLError(f"{path} has no rows", hint=make)
    return table.to_pandas()


def prompt_text(row: Any) -> str:
    """The prompt fed as it is (data.chat_template = false): the text, or its one message's content.
    A prompt of several messages is refused (check_one_message says it for a whole file first):
    until 2026-11-28 the first message alone was fed and the others dropped without a word."""
    prompt = row["prompt"]
    if isinstance(prompt, str):
        return prompt
    if (roles := _several_roles(prompt)) is not None:
        raise TinyRLError(f"prompt holds {len(roles)} messages (roles {', '.join(roles)}); with data.chat_template "
                          "= false a prompt is fed as text, which one message is", hint=ONE_MESSAGE_HINT)
    return first_message_text(row)


def first_message_text(row: Any) -> str:
    """`prompt[0]["content"]`, or the prompt itself when it is text (TinyZero's strict Countdown
    score reads it whatever the rendering)."""
    prompt = row["prompt"]
    if isinstance(prompt, str):
        return prompt
    try:
        content = prompt[0]["content"]
    except (IndexError, KeyError, TypeError) as e:
        raise TinyRLError(f"prompt is neither text nor a list of messages: {prompt!r:.200}",
                          hint="use prompt = [{'role': 'user', 'content': '...'}]") from e
    if not isinstance(content, str):
        raise TinyRLError(f"prompt content is {type(content).__name__}, not text",
                          hint="use prompt = [{'role': 'user', 'content': '...'}]")
    return content


ONE_MESSAGE_HINT = ("set data.chat_template=true so the tokenizer's chat template renders every message "
                    "(or model.custom_chat_template for a model without one), or make each prompt one "
                    "message: [{'role': 'user', 'content': ...}] holding all of its text")


def _several_roles(prompt: Any) -> list[str] | None:
    """The roles of a prompt of more than one message; None for text or one message."""
    if isinstance(prompt, str):
        return None
    try:
        if len(prompt) < 2:
            return None
        return [str(m["role"]) if hasattr(m, "get") and "role" in m else "?" for m in prompt]
    except TypeError:  # not a list: prompt_text says what it is
        return None


def check_one_message(rows: list, path: Any, hint: str = ONE_MESSAGE_HINT,
                      fed_as_text: str = "with data.chat_template = false") -> None:
    """Prompts fed as text (data.chat_template = false): every row's prompt is text or one
    message, said for the whole file before any model loads (a system + user prompt trained on
    the system message alone, exit 0)."""
    several = [(i, roles) for i, row in enumerate(rows) if (roles := _several_roles(row["prompt"])) is not None]
    if several:
        i, roles = several[0]
        raise TinyRLError(
            f"{len(several)} of {len(rows)} prompts in {path} hold more than one message (first at row {i}, "
            f"counting from 0: roles {', '.join(roles)}); {fed_as_text} a prompt is fed as text, so all "
            "but the first message would be lost", hint=hint)


def prompt_messages(row: Any) -> list[dict]:
    """A row's `prompt` as plain chat messages (text -> one user message)."""
    prompt = row["prompt"]
    return [{"role": str(m["role"]), "content": str(m["content"])} for m in
            ([{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt)]


def chat_text(row: Any, tokenizer, tools: list[dict] | None = None) -> str:
    """The row's `prompt` messages rendered by the tokenizer's chat template, ready to generate;
    `tools` (OpenAI function schemas): the task's tools, which the template lists for the model."""
    messages = prompt_messages(row)
    if not getattr(tokenizer, "chat_template", None):
        raise TinyRLError("data.chat_template = true but this tokenizer has no chat template",
                          hint="set data.chat_template=false (the prompt text is fed as it is) or use an instruct model")
    return tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False, add_generation_prompt=True)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or getattr(value, "ndim", 0) > 0:  # numpy arrays too
        return [_plain(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # numpy scalars
        return value.item()
    return value


def without_nulls(value):
    """`value` without the None that parquet writes for a key a row lacks: a column of structs
    holds every key of every row, so a web_search call's arguments read back with "code": None
    from another row's code_interpreter call (and each tool schema with the others' parameters),
    which the template then writes into the trained text. A null inside JSON text is kept."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value


def tools_kwargs(row: Any) -> dict:
    """A row's per-episode tool state, verl's `extra_info.tools_kwargs`: {tool name:
    {"create_kwargs": {...}}} ({} when the row has none; a tool, or a key, a parquet struct holds
    for other rows only is None here and dropped: without_nulls)."""
    extra = row.get("extra_info") if hasattr(row, "get") else None
    found = extra.get("tools_kwargs") if hasattr(extra, "get") else None
    if not found:
        return {}
    if not hasattr(found, "items"):
        raise TinyRLError(f"extra_info.tools_kwargs is {type(found).__name__}, not a mapping: {found!r:.200}",
                          hint="use extra_info.tools_kwargs = {tool name: {'create_kwargs': {...}}}, as verl's data")
    return {str(name): without_nulls(_plain(kw)) for name, kw in found.items() if kw is not None}


def ground_truth(row: Any) -> Any:
    """`reward_model.ground_truth` in plain Python, e.g. {"target": 24, "numbers": [2, 3, 4]}."""
    try:
        value = row["reward_model"]["ground_truth"]
    except (KeyError, TypeError) as e:
        raise TinyRLError("row has no reward_model.ground_truth",
                          hint="each row needs reward_model = {'style': 'rule', 'ground_truth': ...}") from e
    return _plain(value)
