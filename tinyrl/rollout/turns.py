"""The turn loop: episodes with tools over ANY engine (it only calls `engine.generate` on token
contexts).

    turn 1      engine.generate(prompts, sampling): sampling.n episodes per prompt (through the
                engine's episode session when it has one: the HF engine keeps each episode's KV
                cache across turns; otherwise whole contexts are re-submitted, which vLLM serves
                from its prefix cache)
    then        for every episode whose last assistant turn ended by itself (its stop token) and
                holds hermes tool calls (tinyrl.rollout.hermes): parse them and start them at
                once in a bounded thread pool (rollout.tool_workers), each in the sandbox with
                rollout.tool_timeout_s / tool_memory_mb and the episode's create_kwargs for
                that tool (its prompt row's extra_info.tools_kwargs, verl's field: e.g. the
                Python tool's setup code; tinyrl.tools), through tinyrl.tools.call_tool: a call
                that does not return within tool_timeout_s + the tool's grace is given up
                (status timeout). Render each result (tinyrl.tools.render; its head and tail
                within rollout.max_tool_response_tokens tokens), append
                the tool turn the chat template writes (policy_mask 0, log-prob 0.0) and
                generate the next turn (n = 1). An engine whose session `steps` (vLLM: requests
                join a running batch) gets an episode's next turn as soon as ITS calls are back,
                while other calls run and other episodes decode: a slow call holds back its own
                episode only. Otherwise (the HF engine's batched decode loop, which takes no new
                rows once it runs) the loop waits for all calls of the turn and continues every
                episode in one generate call.
    stop        "stop": an assistant turn without a tool call; "length": the episode's budget
                (sampling.max_new_tokens = rollout.max_response_length bounds ALL its tokens
                after the prompt, tool turns included, as verl's multi-turn response length);
                "max_turns": rollout.max_turns assistant turns made and the last one still
                calls a tool (its calls are not run)

A bad call (not JSON, an unknown tool, bad arguments, past rollout.max_tool_calls), a tool that
raises or returns something other than a ToolResult becomes a tool turn that says so, never an
exception (KeyboardInterrupt / SystemExit from a tool stop the run). Per-row budgets differ
after turn 1: they go to the engine as `max_new_tokens_per_prompt` (vLLM stops each request at its own), and every
continuation is cut to its own budget here too (the HF engine decodes the batch to the largest;
the sampled prefix of a row is the same whatever the limit, the surplus is wasted decoding).
Seeds: turn 1 is one call with sampling.seed; a later turn of an episode samples with its own
seed from (sampling.seed, episode, turn) (`episode_seed`, `seeds_per_prompt`), never from the
call's other rows, so a seeded rollout repeats exactly whatever order the tool calls return in.
An engine whose session `steps` (vLLM's StepSession: LLMEngine.add_request / step) takes each
episode's next turn into its running batch as soon as that episode's calls are back, and the
loop steps it while other calls run; with a blocking session (HF) the ready episodes' turns
go in one generate call, and calls that return meanwhile wait for that call to end.

Knows nothing of tasks, the trainer or a particular engine.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace

from tinyrl.rollout.base import TOOL_MESSAGE_CHARS, Episode, RolloutResult, SamplingSettings, ToolCall, Turn
from tinyrl.rollout.chat import ToolChat
from tinyrl.rollout.hermes import ParsedCall, has_tool_call, parse_tool_calls


@dataclass(frozen=True)
class EpisodeLimits:
    """rollout.max_turns ... tool_workers (tinyrl.config.RolloutConfig holds the defaults)."""

    max_turns: int = 4
    max_tool_calls: int = 4
    max_tool_response_tokens: int = 256
    tool_timeout_s: float = 10.0
    tool_memory_mb: int = 1024
    tool_workers: int = 0           # 0 = the usable cores

    @classmethod
    def of(cls, rollout_cfg) -> "EpisodeLimits":
        return cls(**{f: getattr(rollout_cfg, f) for f in cls.__dataclass_fields__})

    def workers(self) -> int:
        if self.tool_workers > 0:
            return self.tool_workers
        from tinyrl.contention import usable_cpus

        return max(1, usable_cpus())


class ToolRollout:
    """What a run with tools rolls out with: the chat template with the tools' schemas, the tools
    and the limits. `run(engine, prompts, sampling, rows)` -> run_episodes(...), with what the
    tools print going to `prints_to` (a run's RUN_DIR/tool_prints.log; None: stderr), not to
    the dashboard's or a --json command's stdout (tinyrl.tools.prints)."""

    def __init__(self, names: tuple[str, ...], tokenizer, engine, rollout_cfg, prints_to=None):
        from tinyrl.errors import TinyRLError
        from tinyrl.tools import TOOLS

        if not getattr(engine, "multi_turn", False):
            raise TinyRLError(f"the {engine.name} rollout engine cannot run episodes with tools",
                              hint="set rollout.engine=hf or rollout.engine=vllm")
        self.tools = {name: TOOLS[name] for name in names}
        self.chat = ToolChat(tokenizer, [t.schema for t in self.tools.values()], engine.stop_ids)
        self.limits = EpisodeLimits.of(rollout_cfg)
        self.prints_to = prints_to

    def run(self, engine, prompt_ids: list[list[int]], sampling: SamplingSettings, rows: list) -> RolloutResult:
        """`rows`: each prompt's dataset row: its messages (the re-render check) and its tools'
        create_kwargs (extra_info.tools_kwargs)."""
        from tinyrl.data.io import prompt_messages, tools_kwargs
        from tinyrl.tools.prints import routed

        with routed(self.prints_to):
            return run_episodes(engine, prompt_ids, sampling, chat=self.chat, tools=self.tools, limits=self.limits,
                                messages=[prompt_messages(r) for r in rows],
                                tools_kwargs=[tools_kwargs(r) for r in rows])


@dataclass
class _Live:
    """An episode being built."""

    prompt_index: int
    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] | None = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    texts: list[tuple[str, str]] = field(default_factory=list)  # (role, content) for the re-render
    tool_calls: list[ToolCall] = field(default_factory=list)
    finished_turn: bool = False       # the last assistant turn ended with a stop token
    stop_reason: str = ""
    key: int = 0                      # its index in the turn-1 result: the engine session's name for it
    # its own copy of its row's {tool: {"create_kwargs": ...}} (made at its first calls): a tool
    # that writes into its create_kwargs changes neither the row nor the prompt's other episodes
    tools_kwargs: dict | None = None

    def add_assistant(self, tokens: list[int], logprobs: list[float] | None, finished: bool, text: str) -> None:
        start = len(self.ids)
        self.ids += tokens
        self.mask += [1] * len(tokens)
        self.logprobs = None if self.logprobs is None or logprobs is None else self.logprobs + list(logprobs)
        self.turns.append(Turn("assistant", start, len(self.ids)))
        self.texts.append(("assistant", text))
        self.finished_turn = finished

    def add_tool(self, tokens: list[int], contents: list[str]) -> None:
        start = len(self.ids)
        self.ids += tokens
        self.mask += [0] * len(tokens)
        if self.logprobs is not None:
            self.logprobs += [0.0] * len(tokens)
        self.turns.append(Turn("tool", start, len(self.ids)))
        self.texts += [("tool", c) for c in contents]

    def episode(self, rerender: str) -> Episode:
        return Episode(self.prompt_index, self.prompt_ids, self.ids, self.mask, self.logprobs, self.turns,
                       self.stop_reason, self.tool_calls, rerender)


@dataclass
class _Outcome:
    status: str
    text: str
    seconds: float = 0.0
    name: str = ""
    message: str = ""   # ToolCall.message, uncut


def run_episodes(engine, prompt_ids: list[list[int]], sampling: SamplingSettings, *, chat: ToolChat,
                 tools: dict, limits: EpisodeLimits, messages: list[list[dict]] | None = None,
                 tools_kwargs: list[dict] | None = None) -> RolloutResult:
    """Episodes with tools, grouped by prompt (sampling.n each, as engine.generate).
    `tools`: name -> tinyrl.tools.Tool offered to the model; `messages`: each prompt's chat
    messages, for the re-render check (None: no check); `tools_kwargs`: each prompt's
    {tool name: {"create_kwargs": {...}}} (verl's tools_kwargs; None: none). Returns the episodes,
    each with how it compares with a full re-render of its conversation (Episode.rerender)."""
    budget = sampling.max_new_tokens
    schemas = {name: tool.schema for name, tool in tools.items()}
    stops = set(getattr(engine, "stop_ids", [])) | chat.stop_ids
    session = _session(engine)
    lives: list[_Live] = []
    for e in session.generate(prompt_ids, sampling).episodes:
        live = _Live(e.prompt_index, list(e.prompt_ids), logprobs=[] if e.logprobs is not None else None,
                     key=len(lives))
        live.add_assistant(e.response_ids, e.logprobs, e.finished, _assistant_text(chat, e.response_ids, stops))
        lives.append(live)
    active = list(lives)
    by_key = {live.key: live for live in lives}
    pending: dict[int, tuple[_Live, list]] = {}  # key -> (episode, its calls: (tool name, Future | _Outcome))
    stepping = getattr(session, "steps", False)   # the engine takes a turn into a batch already decoding
    try:
        with _tool_pool(limits.workers()) as pool:
            while True:
                for live, calls in _next_calls(active, schemas, limits, budget):
                    if live.tools_kwargs is None:
                        live.tools_kwargs = copy.deepcopy(tools_kwargs[live.prompt_index]) if tools_kwargs else {}
                    pending[live.key] = (live, _submit_calls(pool, live, calls, tools, limits, live.tools_kwargs))
                session.retain(list(pending))  # the others' caches go before the calls run
                if stepping:  # each episode's next turn joins the running batch as soon as its calls are back
                    for live in _grow(pending, _ready(pending), chat, budget, limits):
                        session.submit(live.key, live.prompt_ids + live.ids, _settings(sampling, [live], budget))
                    if session.busy():
                        active = [_add_turn(by_key[key], e, budget - len(by_key[key].ids), chat, stops)
                                  for key, e in session.step()]
                    elif pending:  # nothing decodes: wait for a call; the next pass takes its episode
                        _wait_until_one_ready(pending)
                        active = []
                    else:
                        break
                    continue
                if not pending:
                    break
                # A batched decode loop takes no rows once it runs, so a wave of the episodes ready
                # first would cost a whole decode loop for a few rows (measured: 3.56 s inside
                # generate against 1.51 s, no wall-clock gain): one generate call per turn
                grown = _grow(pending, _wait_all(pending), chat, budget, limits)
                active = _continue(session, grown, sampling, budget, chat, stops)
    finally:  # nothing of this rollout stays in the engine, on an error too
        session.close()
    for live in lives:
        live.stop_reason = live.stop_reason or ("stop" if live.finished_turn else "length")
    return RolloutResult([live.episode(rerender="" if messages is None else chat.rerender(
        messages[live.prompt_index], live.texts, live.prompt_ids + live.ids, live.finished_turn)) for live in lives])


@contextlib.contextmanager
def _tool_pool(workers: int) -> Iterator[ThreadPoolExecutor]:
    """A pool for the rollout's tool calls. Left by an exception (a Ctrl-C abandoning the step,
    an engine error), its queued calls are cancelled: ThreadPoolExecutor's own exit waits for
    every queued call to run, so a Ctrl-C went on starting calls (up to tool_timeout_s each,
    `workers` at a time) long after it said the step was abandoned. Running calls still end
    within their timeout, and the sandbox kills what they left."""
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tinyrl-tool")
    try:
        yield pool
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def _assistant_text(chat: ToolChat, tokens: list[int], stops: set[int]) -> str:
    """The assistant message's content: its tokens without the closing stop token."""
    body = tokens[:-1] if tokens and tokens[-1] in stops else tokens
    return chat.tokenizer.decode(body, skip_special_tokens=False)


def _next_calls(active: list[_Live], schemas: dict, limits: EpisodeLimits,
                budget: int) -> list[tuple[_Live, list[ParsedCall]]]:
    """Settle the episodes that end here (their stop_reason); -> those that call tools."""
    calling = []
    for live in active:
        text = live.texts[-1][1]
        if not live.finished_turn:
            live.stop_reason = "length"
        elif not has_tool_call(text):
            live.stop_reason = "stop"       # ended by itself, even on the budget's last token
        elif len(live.ids) >= budget:
            live.stop_reason = "length"     # no room for a tool turn: its calls are not run
        elif sum(t.role == "assistant" for t in live.turns) >= limits.max_turns:
            live.stop_reason = "max_turns"
        else:
            calling.append((live, parse_tool_calls(text, schemas)))
    return calling


_NOT_RUN = ("bad_call", "unknown_tool", "over_limit")  # statuses of calls that never ran


def _submit_calls(pool: ThreadPoolExecutor, live: _Live, calls: list[ParsedCall], tools: dict,
                  limits: EpisodeLimits, tools_kwargs: dict) -> list[tuple[str, object]]:
    """Start an episode's calls in `pool` -> per call (tool name, a Future or an _Outcome).
    `tools_kwargs`: the episode's {tool name: {"create_kwargs": ...}}. Each runs through
    call_tool: a tool that raises, returns something else or hangs gives an error / timeout
    result, and a hung one frees its pool worker after tool_timeout_s + its grace."""
    from tinyrl.tools import call_tool

    # the calls that ran (a bad call, an unknown tool or one past the limit is not counted, in
    # this turn as in earlier ones): the limit is the same whether calls come in one turn or several
    used = sum(c.status not in _NOT_RUN for c in live.tool_calls)
    row: list[tuple[str, object]] = []
    for call in calls:
        if call.status:
            row.append((call.name, _Outcome(call.status, call.error_turn, message=call.problem)))
        elif used >= limits.max_tool_calls:
            over = (f"this episode already made {limits.max_tool_calls} tool calls (rollout.max_tool_calls); "
                    "this call was not run")
            row.append((call.name, _Outcome("over_limit", f"[error: {over}]", message=over)))
        else:
            used += 1
            create = (tools_kwargs.get(call.name) or {}).get("create_kwargs") or {}
            row.append((call.name, pool.submit(call_tool, tools[call.name], call.arguments, create,
                                               timeout_s=limits.tool_timeout_s, memory_mb=limits.tool_memory_mb)))
    return row


def _wait_until_one_ready(pending: dict[int, tuple[_Live, list]]) -> None:
    """Block until at least one pending episode has all its calls back (the others' calls go on
    running). Returns nothing: the caller's next pass takes every ready episode (_ready), also
    those whose calls returned meanwhile."""
    while not _ready(pending):
        wait([done for _, row in pending.values() for _, done in row if isinstance(done, Future) and not done.done()],
             return_when=FIRST_COMPLETED)


def _wait_all(pending: dict[int, tuple[_Live, list]]) -> list[tuple[_Live, list]]:
    """Block until every pending episode has all its calls back -> all of them, in key order."""
    wait([done for _, row in pending.values() for _, done in row if isinstance(done, Future)])
    return _ready(pending)


def _ready(pending: dict[int, tuple[_Live, list]]) -> list[tuple[_Live, list]]:
    """The pending episodes whose calls have all returned, in key order (does not block)."""
    return [pending[k] for k in sorted(pending)
            if all(not isinstance(done, Future) or done.done() for _, done in pending[k][1])]


def _grow(pending: dict, ready: list[tuple[_Live, list]], chat: ToolChat, budget: int,
          limits: EpisodeLimits) -> list[_Live]:
    """Take the ready episodes out of `pending` and append each one's tool turn (its calls'
    results) -> those with room to go on."""
    grown = []
    for live, row in ready:
        del pending[live.key]
        results = _outcomes(row, chat.tokenizer, limits)
        made = len(live.turns) - 1  # the assistant turn that made these calls
        live.tool_calls += [ToolCall(r.name, r.status, r.seconds, made, r.message[:TOOL_MESSAGE_CHARS])
                            for r in results]
        tokens = chat.tool_turn_ids([r.text for r in results])
        if len(live.ids) + len(tokens) >= budget:  # no room left to answer: the budget ends it
            live.stop_reason = "length"
            continue
        live.add_tool(tokens, [r.text for r in results])
        grown.append(live)
    return grown


def _outcomes(row: list[tuple[str, object]], tokenizer, limits: EpisodeLimits) -> list[_Outcome]:
    return [replace(done, name=name) if isinstance(done, _Outcome)
            else _result(done.result(), name, tokenizer, limits.max_tool_response_tokens) for name, done in row]


def _result(result, name: str, tokenizer, max_tokens: int) -> _Outcome:
    from tinyrl.tools import render

    return _Outcome(result.status, cut_to_tokens(render(result), tokenizer, max_tokens), result.seconds, name,
                    message="" if result.status == "ok" else result.message)


def cut_to_tokens(text: str, tokenizer, max_tokens: int) -> str:
    """`text` within `max_tokens` tokens (re-tokenized on its own): when longer, its head and its
    tail with a note between them, the note counted. Head and tail, as the sandbox cuts a stream
    (tinyrl.tools.python._read_output) and verl cuts a tool response: the end holds what render
    says last (a traceback's last line, "[exit code 0; output truncated]", a timeout). The text goes into
    the episode and its re-render alike, so any cut keeps the two equal."""
    ids = _token_ids(tokenizer, text)
    if len(ids) <= max_tokens:
        return text
    note = f"\n[... output cut to {max_tokens} tokens ...]\n"
    keep = max_tokens - len(_token_ids(tokenizer, note))
    if keep <= 0:  # no room for the note: the head alone
        note, keep = "", max_tokens
    while True:
        head = keep - keep // 2 if note else keep
        cut = tokenizer.decode(ids[:head]) + note + tokenizer.decode(ids[len(ids) - (keep - head):])
        over = len(_token_ids(tokenizer, cut)) - max_tokens
        if over <= 0:
            return cut
        keep = max(0, keep - over)  # a seam re-tokenized longer (a character cut between its bytes)


def _token_ids(tokenizer, text: str) -> list[int]:
    """`text`'s tokens, without transformers' warning that they exceed the model's length: a tool's
    output is cut here, never fed to the model whole (a 200 kB print read "200000 > 2048")."""
    return tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]


def episode_seed(seed: int, key: int, turn: int) -> int:
    """The sampling seed of episode `key`'s assistant turn `turn` (>= 2): fixed by the rollout's
    seed, different per episode and turn, and not by which episodes share its generate call
    (tool timings decide that), so a seeded rollout repeats exactly."""
    return (seed * 1_000_003 + key * 7_919 + turn * 104_729) % (2**31 - 1)


class _Reprefill:
    """A session for an engine without one: each turn is engine.generate over the whole grown
    contexts (vLLM serves their prefixes from its prefix cache; HF without a kept cache
    re-prefills them)."""

    def __init__(self, engine) -> None:
        self.engine = engine

    def generate(self, contexts: list[list[int]], sampling: SamplingSettings, keys: list[int] | None = None):
        return self.engine.generate(contexts, sampling)

    def retain(self, keys: list[int]) -> None:
        pass

    def close(self) -> None:
        pass


def _session(engine):
    """The engine's own episode session (the HF engine's kept KV cache), else _Reprefill."""
    make = getattr(engine, "episode_session", None)
    return (make() if make is not None else None) or _Reprefill(engine)


def _settings(sampling: SamplingSettings, grown: list[_Live], budget: int) -> SamplingSettings:
    """A later turn's sampling for `grown`: n = 1, each its own budget left and seed (episode_seed)."""
    left = [budget - len(live.ids) for live in grown]
    seeds = None if sampling.seed is None else [
        episode_seed(sampling.seed, live.key, 1 + sum(t.role == "assistant" for t in live.turns)) for live in grown]
    return replace(sampling, n=1, max_new_tokens=max(left), max_new_tokens_per_prompt=left, seeds_per_prompt=seeds)


def _continue(session, grown: list[_Live], sampling: SamplingSettings, budget: int,
              chat: ToolChat, stops: set[int]) -> list[_Live]:
    """The next assistant turn of every grown episode, in one generate call, each with its own
    seed (episode_seed). -> those still going"""
    if not grown:
        return []
    settings = _settings(sampling, grown, budget)
    out = session.generate([live.prompt_ids + live.ids for live in grown], settings,
                           [live.key for live in grown]).episodes
    return [_add_turn(live, e, room, chat, stops) for live, e, room in zip(grown, out, settings.max_new_tokens_per_prompt)]


def _add_turn(live: _Live, e: Episode, room: int, chat: ToolChat, stops: set[int]) -> _Live:
    """Append the engine's turn `e`, cut to the `room` the episode's budget leaves."""
    tokens = e.response_ids[:room]
    lp = None if e.logprobs is None else e.logprobs[:room]
    live.add_assistant(tokens, lp, e.finished and len(e.response_ids) <= room, _assistant_text(chat, tokens, stops))
    return live


def episode_metrics(episodes: list[Episode]) -> dict[str, float]:
    """Per step: tools/calls, tools/errors (any status but ok and timeout), tools/timeouts (all
    three: totals over the step's episodes), tools/seconds (summed wall clock of the calls that
    ran), episode/turns (mean assistant turns per episode), episode/tokenization_mismatch
    (episodes whose tokens differ from a full re-render of their conversation) and, of those,
    episode/text_mismatch (the text differs too: a fault; Episode.rerender)."""
    calls = [c for e in episodes for c in e.tool_calls]
    n = max(len(episodes), 1)
    return {"tools/calls": float(len(calls)),
            "tools/errors": float(sum(c.status not in ("ok", "timeout") for c in calls)),
            "tools/timeouts": float(sum(c.status == "timeout" for c in calls)),
            "tools/seconds": float(sum(c.seconds for c in calls)),
            "episode/turns": sum(sum(t.role == "assistant" for t in e.turns) for e in episodes) / n,
            "episode/tokenization_mismatch": float(sum(e.rerender in ("tokens", "text") for e in episodes)),
            "episode/text_mismatch": float(sum(e.rerender == "text" for e in episodes))}


def tool_ok_share(episodes: list[Episode]) -> float:
    """The share of episodes with at least one tool call that ran and exited 0 (status "ok")."""
    return sum(any(c.status == "ok" for c in e.tool_calls) for e in episodes) / max(len(episodes), 1)
