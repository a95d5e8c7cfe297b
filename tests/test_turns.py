"""Episodes with tools (tinyrl/rollout/turns.py): the turn loop with the real sandbox, the real
chat template rendering (a hermes template for the tiny model) and the trainer's real math.

The policy is a scripted engine (tests/helpers/scripted_engine.py: given assistant turns
instead of sampled ones) where the test needs exact tool calls; tests/test_turns_engines.py
runs the loop with the HF and vLLM engines and the tiny model itself.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from helpers.hermes_template import HERMES_TEMPLATE
from helpers.scripted_engine import ScriptedEngine
from tinyrl.rollout.base import SamplingSettings
from tinyrl.rollout.chat import ToolChat
from tinyrl.rollout.hermes import parse_tool_calls
from tinyrl.rollout.turns import EpisodeLimits, episode_metrics, run_episodes
from tinyrl.tools import TOOLS

TOOLSET = {"code_interpreter": TOOLS["code_interpreter"]}
SCHEMAS = {name: t.schema for name, t in TOOLSET.items()}


def call(code: str, name: str = "code_interpreter") -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": {"code": code}}) + "\n</tool_call>"


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    t = AutoTokenizer.from_pretrained(tiny_model_dir)
    t.chat_template = HERMES_TEMPLATE
    return t


@pytest.fixture(scope="module")
def chat(tok):
    return ToolChat(tok, list(SCHEMAS.values()), [tok.eos_token_id])


def _messages(k: int) -> list[list[dict]]:
    return [[{"role": "user", "content": f"task {i}: what is {i} * 7?"}] for i in range(k)]


def _run(chat, script, *, k=2, n=2, budget=400, limits=EpisodeLimits(tool_timeout_s=5.0), seed=1, tokenize=None):
    engine = ScriptedEngine(chat.tokenizer, script, tokenize)
    msgs = _messages(k)
    prompts = [chat.render(m, generation_prompt=True) for m in msgs]
    res = run_episodes(engine, prompts, SamplingSettings(n=n, max_new_tokens=budget, seed=seed), chat=chat,
                       tools=TOOLSET, limits=limits, messages=msgs)
    return res, engine, msgs


def _two_turn_script(context: str, j: int) -> str:
    """Turn 1 calls the tool (sample 1 twice), then an answer."""
    if "<tool_response>" not in context:
        task = context.split("task ")[-1].split(":")[0]
        return f"let me run it {call(f'print({task} * 7)')}" + (call("print('second')") if j else "")
    return "<answer> done </answer>"


# -- (b) an episode's tokens equal a full re-render of its conversation ----------------------

def _full_render(tok, messages, episode) -> list[int]:
    """The test's own re-render (not ToolChat's): the conversation from the episode's turns."""
    conv = list(messages)
    for turn in episode.turns:
        ids = episode.response_ids[turn.start:turn.end]
        if turn.role == "assistant":
            body = ids[:-1] if ids and ids[-1] == tok.eos_token_id else ids
            conv.append({"role": "assistant", "content": tok.decode(body, skip_special_tokens=False)})
        else:
            text = tok.decode(ids, skip_special_tokens=False)
            conv += [{"role": "tool", "content": c.split("\n</tool_response>")[0]}
                     for c in text.split("<tool_response>\n")[1:]]
    text = tok.apply_chat_template(conv, tools=list(SCHEMAS.values()), tokenize=False)
    return tok(text, add_special_tokens=False)["input_ids"]


def test_episode_tokens_equal_a_full_rerender(tok, chat):
    res, engine, msgs = _run(chat, _two_turn_script)
    assert [len(e.tool_calls) for e in res.episodes] == [1, 2, 1, 2]
    for e in res.episodes:
        assert [t.role for t in e.turns] == ["assistant", "tool", "assistant"] and e.stop_reason == "stop"
        full = _full_render(tok, msgs[e.prompt_index], e)
        ids = e.prompt_ids + e.response_ids
        assert full[:len(ids)] == ids          # the episode IS the re-rendered conversation
        assert tok.decode(full[len(ids):]) == "\n"  # only the template's text after the last EOS
        tool = e.turns[1]
        text = tok.decode(e.response_ids[tool.start:tool.end], skip_special_tokens=False)
        assert text.startswith("\n<|im_start|>user\n<tool_response>\n") and text.endswith("<|im_start|>assistant\n")
        assert f"{e.prompt_index * 7}\n" in text
        assert e.rerender == "same"
    # turn 1: one call; later turns: the episodes whose calls are back, in one or more calls
    assert engine.calls[0] == (2, 400) and sum(c for c, _ in engine.calls[1:]) == 4
    assert max(m for _, m in engine.calls[1:]) == max(400 - e.turns[1].end for e in res.episodes)


def test_a_wrong_incremental_render_is_counted_as_a_text_mismatch(chat, monkeypatch):
    right = chat.tool_turn_ids
    monkeypatch.setattr(chat, "tool_turn_ids", lambda contents: right(contents)[1:])  # drops the "\n"
    res, _, _ = _run(chat, _two_turn_script)
    assert [e.rerender for e in res.episodes] == ["text"] * 4
    m = episode_metrics(res.episodes)
    assert (m["episode/tokenization_mismatch"], m["episode/text_mismatch"]) == (4.0, 4.0)


def _char_by_char(tok):
    """A policy's split of its text that the tokenizer would not make: one character at a time
    (the tiny tokenizer writes "answer" and "on" as one token each)."""
    return lambda text: [i for ch in text for i in tok(ch, add_special_tokens=False)["input_ids"]]


def test_a_sampled_split_of_the_same_text_is_a_token_mismatch_only(tok, chat):
    """The policy's own split (an untrained or hot model samples such) is harmless: the text is
    the conversation's, so it counts in episode/tokenization_mismatch but not as a text mismatch,
    which is kept for conversations written wrongly."""
    res, _, msgs = _run(chat, _two_turn_script, tokenize=_char_by_char(tok))
    assert [e.rerender for e in res.episodes] == ["tokens"] * 4
    for e in res.episodes:  # the tokens differ from the re-render, the text does not
        assert _full_render(tok, msgs[e.prompt_index], e)[:len(e.response_ids)] != e.response_ids
    m = episode_metrics(res.episodes)
    assert (m["episode/tokenization_mismatch"], m["episode/text_mismatch"]) == (4.0, 0.0)


def test_an_episode_cut_inside_a_character_is_a_token_mismatch_only(tok, chat):
    """A budget that ends an episode between the bytes of one character (byte-level BPE: "€" is
    3 tokens): its assistant message holds the decoded U+FFFD, which the re-render writes as a
    whole character of its own, so the tokens differ and the text does not."""
    text = "costs 5€ each"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    cut = next(k for k in range(1, len(ids)) if tok.decode(ids[:k]).endswith("\ufffd"))  # after the first byte of €
    res, _, _ = _run(chat, lambda context, j: text, k=1, n=1, budget=cut)
    (e,) = res.episodes
    assert e.stop_reason == "length" and tok.decode(e.response_ids) == "costs 5\ufffd"
    assert e.rerender == "tokens"


# -- (d) bad calls become error tool turns ---------------------------------------------------

def test_bad_calls_become_error_tool_turns(tok, chat):
    bad = [("<tool_call>{not json</tool_call>", "bad_call", "not valid JSON"),
           (call("print(1)", name="browser"), "unknown_tool", "no tool named 'browser'"),
           ('<tool_call>{"name": "code_interpreter", "arguments": {"source": "1"}}</tool_call>', "bad_call",
            "missing argument(s): code"),
           ('<tool_call>{"name": "code_interpreter", "arguments": {"code": 7}}</tool_call>', "bad_call",
            "'code' must be a string"),
           ('<tool_call>["code_interpreter"]</tool_call>', "bad_call", "must be a JSON object"),
           ("<tool_call>{\"name\": \"code_interpreter\"", "bad_call", "not closed")]

    def script(context, j):
        return bad[int(context.split("task ")[-1].split(":")[0])][0] if "<tool_response>" not in context else "ok"

    res, _, _ = _run(chat, script, k=len(bad), n=1)
    for e, (_, status, words) in zip(res.episodes, bad):
        assert [c.status for c in e.tool_calls] == [status] and e.stop_reason == "stop"
        tool = e.turns[1]
        assert words in tok.decode(e.response_ids[tool.start:tool.end]) and "[error: " in tok.decode(
            e.response_ids[tool.start:tool.end])
        assert e.tool_calls[0].seconds == 0.0  # nothing ran
        assert words in e.tool_calls[0].message  # the record says why too (samples.jsonl)
    m = episode_metrics(res.episodes)
    assert (m["tools/calls"], m["tools/errors"], m["tools/timeouts"]) == (6.0, 6.0, 0.0)


def test_calls_past_the_limit_are_not_run(tok, chat):
    def script(context, j):
        return (call("print('a')") + call("print('b')") + call("print('c')")) if context.count("<tool_response>") < 4 else "end"

    res, _, _ = _run(chat, script, k=1, n=1, budget=2000, limits=EpisodeLimits(max_tool_calls=4, max_turns=4))
    e = res.episodes[0]
    assert [c.status for c in e.tool_calls] == ["ok"] * 4 + ["over_limit"] * 2
    assert [c.turn for c in e.tool_calls] == [0, 0, 0, 2, 2, 2]
    second = e.turns[3]
    text = tok.decode(e.response_ids[second.start:second.end])
    assert text.count("rollout.max_tool_calls") == 2 and "a\n" in text
    assert ["rollout.max_tool_calls" in c.message for c in e.tool_calls] == [False] * 4 + [True] * 2


def test_the_call_limit_counts_the_same_calls_whether_made_in_one_turn_or_several(chat):
    """rollout.max_tool_calls counts the calls that ran: a bad call (an unknown tool) is not one
    of them within a turn, so it is not across turns either. The same four calls, limit 3: all
    three good ones run whether they come in one turn or two (the second turn's last one went
    over the limit when the first turn's bad call was counted there)."""
    bad = call("1", name="nope")
    limits = EpisodeLimits(max_tool_calls=3, max_turns=4, tool_timeout_s=5.0)

    def one_turn(context, j):
        return (bad + call("print(1)") * 3) if "<tool_response>" not in context else "end"

    def two_turns(context, j):
        made = context.count("<|im_start|>assistant") - 1  # assistant turns so far
        return [bad + call("print(1)"), call("print(2)") * 2, "end"][min(made, 2)]

    for script in (one_turn, two_turns):
        res, _, _ = _run(chat, script, k=1, n=1, budget=2000, limits=limits)
        e = res.episodes[0]
        assert [c.status for c in e.tool_calls] == ["unknown_tool", "ok", "ok", "ok"], script.__name__


def test_parse_keeps_calls_in_order_and_never_raises():
    text = "x " + call("1") + " y <tool_call>{\"name\": 3}</tool_call>" + call("2", name="nope")
    got = parse_tool_calls(text, SCHEMAS)
    assert [(c.name, c.status, c.arguments) for c in got] == [
        ("code_interpreter", "", {"code": "1"}), ("", "bad_call", {}), ("nope", "unknown_tool", {})]
    assert parse_tool_calls("no calls here", SCHEMAS) == []
    # double-encoded arguments (some models write a JSON string) are accepted
    got = parse_tool_calls('<tool_call>{"name": "code_interpreter", "arguments": "{\\"code\\": \\"1\\"}"}</tool_call>',
                           SCHEMAS)
    assert got[0].status == "" and got[0].arguments == {"code": "1"}


# -- limits: the budget, the turn limit, stop ------------------------------------------------

def test_budget_bounds_the_whole_episode(tok, chat):
    def script(context, j):  # calls forever; turn 1's length differs per sample, so budgets left differ
        return "thinking " * (12 + 9 * j) + call("print('x' * 40)")

    for budget in (60, 150, 260):
        res, engine, _ = _run(chat, script, k=1, n=3, budget=budget, limits=EpisodeLimits(max_turns=50))
        for e in res.episodes:
            assert len(e.response_ids) <= budget and e.stop_reason == "length"
            assert e.policy_mask.count(0) == sum(t.end - t.start for t in e.turns if t.role == "tool")
        assert all(m <= budget for _, m in engine.calls)


def test_turn_limit_stops_calling(chat):
    res, engine, _ = _run(chat, lambda context, j: call("print(1)"), k=1, n=1,
                          limits=EpisodeLimits(max_turns=3, max_tool_calls=10))
    e = res.episodes[0]
    assert e.stop_reason == "max_turns" and [t.role for t in e.turns] == ["assistant", "tool"] * 2 + ["assistant"]
    assert len(e.tool_calls) == 2 and len(engine.calls) == 3  # the last turn's call was not run


def test_tool_output_is_cut_to_its_head_and_tail(tok, chat):
    """A print flood past the sandbox's 16 kB: the tool turn keeps its head and its tail, so the
    model still reads render's closing "[exit code 0; output truncated]" (the cut ended with the
    note alone before); the episode is still its conversation's re-render, tool tokens masked."""
    def script(context, j):
        return call("print('7 ' * 20000)") if "<tool_response>" not in context else "end"

    # the tiny tokenizer (768 tokens) spends 31 on the note and 26 on that line
    res, _, _ = _run(chat, script, k=1, n=1, limits=EpisodeLimits(max_tool_response_tokens=120))
    e = res.episodes[0]
    tool = e.turns[1]
    text = tok.decode(e.response_ids[tool.start:tool.end], skip_special_tokens=False)
    content = text.split("<tool_response>\n")[1].split("\n</tool_response>")[0]
    head, tail = content.split("\n[... output cut to 120 tokens ...]\n")
    assert head.startswith("7 7 7") and tail.endswith("7 \n[exit code 0; output truncated]")
    assert len(tok(content, add_special_tokens=False)["input_ids"]) <= 120
    assert e.rerender == "same" and set(e.policy_mask[tool.start:tool.end]) == {0}


@settings(max_examples=150, deadline=None)
@given(body=st.text(alphabet=list("ab7 \n\u20ac\u00e9\U0001f600(x"), max_size=400),
       repeat=st.integers(1, 40), max_tokens=st.integers(1, 120))
def test_a_cut_keeps_within_its_tokens_the_head_and_the_tail(tok, body, repeat, max_tokens):
    """Any output (multi-byte characters cut between their bytes included): an output within the
    limit is kept as it is; a longer one becomes a head of it, the note, a tail of it, within
    `max_tokens` tokens re-tokenized (a seam that tokenizes longer shortens the cut); a limit
    with no room for the note (31 tokens here) keeps a head alone."""
    from tinyrl.rollout.turns import cut_to_tokens

    text = body * repeat
    cut = cut_to_tokens(text, tok, max_tokens)
    if len(tok(text, add_special_tokens=False)["input_ids"]) <= max_tokens:
        assert cut == text
        return
    assert len(tok(cut, add_special_tokens=False)["input_ids"]) <= max_tokens
    note = f"\n[... output cut to {max_tokens} tokens ...]\n"
    if len(tok(note, add_special_tokens=False)["input_ids"]) >= max_tokens:
        assert text.startswith(cut.rstrip("\ufffd"))
        return
    head, tail = cut.split(note)
    # a character cut between its bytes decodes to U+FFFD at the seam
    assert text.startswith(head.rstrip("\ufffd")) and text.endswith(tail.lstrip("\ufffd"))


def test_cutting_a_long_output_says_nothing_of_the_models_length(tiny_model_dir):
    """A 200 kB print is cut, never fed to the model whole, yet tokenizing it printed transformers'
    'Token indices sequence length is longer than the specified maximum sequence length ...
    (200000 > 2048)'. A fresh tokenizer: transformers says it once per tokenizer."""
    import logging

    from tinyrl.rollout.turns import cut_to_tokens

    said = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())
    fresh = AutoTokenizer.from_pretrained(tiny_model_dir)
    logging.getLogger("transformers").addHandler(handler)
    try:
        for text in ("y" * 200_000, "7 " * 20_000):
            assert len(fresh(text[:10_000], add_special_tokens=False, verbose=False)["input_ids"]) > fresh.model_max_length
            assert len(fresh(cut_to_tokens(text, fresh, 256), add_special_tokens=False)["input_ids"]) <= 256 + 1
    finally:
        logging.getLogger("transformers").removeHandler(handler)
    assert not [m for m in said if "sequence length" in m], said


def test_each_turn_gets_its_own_seed_from_the_rollouts(chat):
    _, first, _ = _run(chat, _two_turn_script, seed=5)
    _, again, _ = _run(chat, _two_turn_script, seed=5)
    _, other, _ = _run(chat, _two_turn_script, seed=6)
    assert first.seeds[0] == 5 and first.row_seeds[0] is None  # turn 1: one call, the rollout's seed

    def later(engine):  # each later turn's own seed, whichever calls the turns came in
        return sorted(s for seeds in engine.row_seeds[1:] for s in seeds)

    assert len(later(first)) == len(set(later(first))) == 4 and 5 not in later(first)
    assert later(first) == later(again) and not set(later(other)) & set(later(first))
    _, unseeded, _ = _run(chat, _two_turn_script, seed=None)
    assert set(unseeded.seeds) == {None} and set(unseeded.row_seeds) == {None}


def test_a_template_that_cannot_follow_the_models_turn_is_refused(tok):
    from tinyrl.errors import TinyRLError

    with pytest.raises(TinyRLError, match="does not end an assistant message"):
        ToolChat(tok, list(SCHEMAS.values()), [tok.convert_tokens_to_ids("<|im_start|>") + 10_000])
    wrong = AutoTokenizer.from_pretrained(tok.name_or_path)
    wrong.chat_template = HERMES_TEMPLATE.replace("'<|endoftext|>\\n'", "'<|im_end|>\\n'")
    with pytest.raises(TinyRLError, match="does not end an assistant message"):
        ToolChat(wrong, list(SCHEMAS.values()), [tok.eos_token_id])


def test_an_answer_on_the_budgets_last_token_is_a_stop(tok, chat):
    answer = "<answer> 42 </answer>"
    exact = len(tok(answer, add_special_tokens=False)["input_ids"]) + 1  # + EOS
    res, _, _ = _run(chat, lambda context, j: answer, k=1, n=1, budget=exact)
    assert res.episodes[0].stop_reason == "stop" and len(res.episodes[0].response_ids) == exact
    res, _, _ = _run(chat, lambda context, j: answer, k=1, n=1, budget=exact - 1)
    assert res.episodes[0].stop_reason == "length"


def test_each_episode_runs_its_tools_with_its_own_rows_create_kwargs(tok, chat):
    """verl's extra_info.tools_kwargs: the Python tool runs each prompt row's `setup` before the
    model's code, so the same program prints each episode's own value; a row without one gets
    none (the name is undefined there), and another tool's entry does not reach this one."""
    from tinyrl.config import RolloutConfig
    from tinyrl.rollout.turns import ToolRollout

    script = lambda context, j: (call("print(secret)") if "<tool_response>" not in context  # noqa: E731
                                 else "<answer> done </answer>")
    msgs = _messages(3)
    rows = [{"prompt": msgs[0], "extra_info": {"tools_kwargs": {"code_interpreter": {
                "create_kwargs": {"setup": "secret = 'zero'"}}}}},
            {"prompt": msgs[1], "extra_info": {"tools_kwargs": {"code_interpreter": {
                "create_kwargs": {"setup": "secret = 10 ** 3"}}, "other_tool": {"create_kwargs": {"setup": "x"}}}}},
            {"prompt": msgs[2], "extra_info": {"split": "test"}}]
    engine = ScriptedEngine(chat.tokenizer, script)
    rollout = ToolRollout(("code_interpreter",), tok, engine, RolloutConfig(tool_timeout_s=5.0))  # the trainer's
    res = rollout.run(engine, [chat.render(m, generation_prompt=True) for m in msgs],
                      SamplingSettings(n=2, max_new_tokens=400, seed=1), rows)
    outputs = {}
    for e in res.episodes:
        tool = next(t for t in e.turns if t.role == "tool")
        outputs.setdefault(e.prompt_index, set()).add(tok.decode(e.response_ids[tool.start:tool.end]))
    assert [len(v) for v in outputs.values()] == [1, 1, 1]  # both episodes of a prompt: the same
    assert "\nzero\n" in outputs[0].pop() and "\n1000\n" in outputs[1].pop()
    assert "NameError: name 'secret' is not defined" in outputs[2].pop()


# -- a Ctrl-C while calls run ----------------------------------------------------------------

def test_an_abandoned_rollout_starts_none_of_its_queued_calls(chat, monkeypatch):
    """A Ctrl-C during the tool phase abandons the step (interrupts.StepAbandoned raised where
    the loop waits): the calls still queued must not start. The pool's own exit waited for all
    of them, so the run went on starting calls (up to tool_timeout_s each) after saying it stopped."""
    import threading
    import time
    from dataclasses import replace

    from tinyrl import interrupts
    from tinyrl.rollout import turns

    started = []

    def slow(arguments, create, **limits):
        started.append(arguments["code"])
        time.sleep(0.3)
        return TOOLS["code_interpreter"].run({"code": "print(1)"}, {}, **limits)

    def abandon(pending):  # the signal handler raises in the main thread while it waits
        while not started:
            time.sleep(0.01)
        raise interrupts.StepAbandoned()

    monkeypatch.setattr(turns, "_wait_all", abandon)
    engine = ScriptedEngine(chat.tokenizer, lambda context, j: call("print(2)"))
    msgs = _messages(8)
    prompts = [chat.render(m, generation_prompt=True) for m in msgs]
    with pytest.raises(interrupts.StepAbandoned):
        run_episodes(engine, prompts, SamplingSettings(n=1, max_new_tokens=400, seed=1), chat=chat,
                     tools={"code_interpreter": replace(TOOLS["code_interpreter"], run=slow)}, limits=EpisodeLimits(tool_workers=1), messages=msgs)
    time.sleep(0.5)  # a queued call would have started by now
    assert len(started) == 1, f"{len(started)} of 8 calls ran after the step was abandoned"
    assert not [t for t in threading.enumerate() if t.name.startswith("tinyrl-tool")]
