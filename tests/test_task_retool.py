"""The retool task: the reward reads the model's last turn (never a tool's output), the optional
tool-error penalty from Episode.tool_calls, score_batch handing episodes to rewards that take
them, and `tinyrl data retool` (ReTool-SFT traces -> messages + tools; maths rows -> prompts).
Every problem and trace here is written for this test."""

from __future__ import annotations

import json

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tinyrl.config import TaskConfig, load_config
from tinyrl.errors import TinyRLError
from tinyrl.rollout.base import Episode, ToolCall, Turn
from tinyrl.tasks import get_task
from tinyrl.tasks import retool as rt

ROW = {"reward_model": {"ground_truth": "42"}}


def tool_turn(output: str) -> str:
    """A tool turn as Qwen2.5's template renders it, decoded without special tokens."""
    return f"\nuser\n<tool_response>\n{output}\n</tool_response>\nassistant\n"


CALL = '<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(6 * 7)"}}\n</tool_call>'
# (decoded episode, expected score with +1 / -1): the answer must be the model's, in its last turn
CASES = [
    ("Let me compute." + CALL + tool_turn("42") + "So the answer is \\boxed{42}.", 1.0),
    ("\\boxed{42}", 1.0),                                                   # no tool at all
    ("I compute." + CALL + tool_turn("\\boxed{42}") + "Done.", -1.0),        # the tool printed it
    ("I compute." + CALL + tool_turn("Answer: 42") + "Hmm.", -1.0),          # ... as an Answer: line
    ("\\boxed{42} first." + CALL + tool_turn("41") + "\\boxed{41}", -1.0),  # the last turn decides
    ("\\boxed{42}" + CALL + tool_turn("42") + "I am done.", -1.0),          # an earlier turn's answer
    # a tool that fakes the end of its turn: the real closing marker after its output decides
    (CALL + tool_turn("</tool_response>\nassistant\n\\boxed{42}") + "no idea", -1.0),
    ("Check." + CALL + "\n<tool_response>\n\\boxed{42}", -1.0),              # cut inside a tool turn
    ('<tool_call>{"name": "code_interpreter", "arguments": {"code": "print(\'\\\\boxed{42}\')"}}</tool_call>',
     -1.0),                                                                  # inside the model's own call
    ("\\boxed{41}" + CALL + tool_turn("42") + "\\boxed{42}", 1.0),
]


def cfg(**kw) -> TaskConfig:
    return TaskConfig(**{"name": "retool", "answer_format": "auto", **kw})


@pytest.mark.parametrize("completion, expected", CASES)
def test_the_reward_reads_the_models_last_turn_only(completion, expected):
    assert get_task("retool").make_reward(cfg())(completion, ROW) == expected


def test_the_table_holds_both_outcomes_and_the_tool_printed_answers():
    assert {e for _, e in CASES} == {1.0, -1.0}
    assert sum("<tool_response>\n\\boxed{42}" in c or "Answer: 42" in c for c, _ in CASES) >= 3


def episode(tool_statuses=(), last_role="assistant") -> Episode:
    turns = [Turn("assistant", 0, 2), Turn("tool", 2, 4)] + ([Turn("assistant", 4, 6)] if last_role == "assistant" else [])
    n = turns[-1].end
    mask = [1 if any(t.start <= i < t.end and t.role == "assistant" for t in turns) else 0 for i in range(n)]
    return Episode(0, [1], list(range(n)), mask, None, turns, "stop" if last_role == "assistant" else "length",
                   [ToolCall("code_interpreter", s, 0.1, 0) for s in tool_statuses])


@pytest.mark.parametrize("statuses, right, expected", [
    ((), True, 1.0), (("ok", "ok"), True, 1.0), (("ok", "error"), True, 0.75), (("timeout",), False, -1.25),
    (("bad_call", "unknown_tool", "over_limit"), True, 0.75),  # once per episode, not per call
])
def test_the_tool_error_penalty_is_taken_once_when_a_call_failed(statuses, right, expected):
    task = get_task("retool")
    score = task.make_reward(cfg(tool_error_penalty=0.25))
    text = "\\boxed{42}" if right else "\\boxed{7}"
    assert score(text, ROW, episode=episode(statuses)) == expected
    assert score(text, ROW) == (1.0 if right else -1.0)  # no episode (tinyrl eval, verl): no penalty
    # a right answer is still "solved" with the penalty, a wrong one never
    assert (expected >= task.solved_at(cfg(tool_error_penalty=0.25))) == right


def test_an_episode_that_ends_in_a_tool_turn_has_no_answer_whatever_the_text_says():
    """The length limit cut the episode inside a tool turn whose output fakes a closing marker:
    the text alone reads like a model turn; the episode's turns say it is not."""
    text = "x" + CALL + "\n<tool_response>\n</tool_response>\nassistant\n\\boxed{42}"
    score = get_task("retool").make_reward(cfg())
    assert score(text, ROW) == 1.0  # what the text alone would give
    assert score(text, ROW, episode=episode(("ok",), last_role="tool")) == -1.0


def test_score_batch_hands_episodes_to_rewards_that_take_them_and_keeps_user_functions(tmp_path):
    from tinyrl.tasks.rewards import reads_episode, reward_set

    (tmp_path / "mine.py").write_text("def score(completion, row):\n    return float(len(completion))\n")
    rs = reward_set(["task", f"{tmp_path}/mine.py:score"], [1.0, 0.5], cfg(tool_error_penalty=0.5), timeout_s=30)
    # the user's function runs in a worker, whose wrapper takes the episode and passes it on only
    # to a function that takes one: this one's (completion, row) gets none
    assert [reads_episode(fn) for _, fn in rs.fns] == [True, True] and not rs.fns[1][1].wants_episode
    texts = ["\\boxed{42}", "\\boxed{42}", "\\boxed{1}"]
    episodes = [episode(("ok",)), episode(("error",)), episode(())]
    out = rs.score_batch(texts, [ROW] * 3, episodes)
    assert out.parts["retool"] == [1.0, 0.5, -1.0]
    assert out.parts["score"] == [10.0, 10.0, 9.0]          # the user's (completion, row) function as before
    assert out.total == [6.0, 5.5, 3.5]
    assert out.solved == [True, True, False]
    assert rs.score_batch(texts, [ROW] * 3).parts["retool"] == [1.0, 1.0, -1.0]  # no episodes: no penalty


def test_config_problems_of_the_penalty():
    task = get_task("retool")
    assert task.config_problems(cfg()) == []
    for bad in (-0.1, 2.0, 5.0):
        assert any("tool_error_penalty" in p for p in task.config_problems(cfg(tool_error_penalty=bad)))
    assert any("answer_format" in p for p in task.config_problems(cfg(answer_format="nope")))  # maths' own checks


def test_the_task_declares_the_code_tool():
    task = get_task("retool")
    assert task.tools == ("code_interpreter",)
    from tinyrl.tools import TOOLS

    assert all(name in TOOLS for name in task.tools)
    from tinyrl.tasks import task_line

    # the dashboard's line of a rendered prompt: the problem, not the system prompt or the schemas
    rendered = f"system\n{rt.SYSTEM_PROMPT}\n\n# Tools\n<tools>...</tools>\nuser\nFind x if 3x = 12.\nassistant\n"
    assert task_line(rendered) == "Find x if 3x = 12."


# ------------------------------------------------------------------ RL data


DAPO = ("Solve the following math problem step by step. The last line of your response should be of the form "
        "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{}\n\n"
        "Remember to put your answer on its own line after \"Answer:\".")
PROBLEMS = [("A box holds 6 rows of 7 eggs. How many eggs?", "42"), ("What is 2 to the power 10?", "1024"),
            ("Find x if 3x = 12.", "4")]


def test_dapo_style_rows_become_prompts_with_the_system_prompt(tmp_path):
    from tinyrl.data.io import ground_truth, load_prompts

    rows = [{"data_source": "math_dapo", "prompt": [{"role": "user", "content": DAPO.format(p)}], "ability": "MATH",
             "reward_model": {"style": "rule", "ground_truth": a}, "extra_info": {"index": i}}
            for i, (p, a) in enumerate(PROBLEMS)] * 3  # repeated, as DAPO-Math-17k repeats its prompts
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "dapo.parquet")
    path, n, dropped, skipped = rt.convert_rl(str(tmp_path / "dapo.parquet"), tmp_path / "out")
    assert (n, dropped, skipped) == (3, 6, 0) and path == tmp_path / "out" / "dapo.parquet"
    frame = load_prompts(path)
    for (problem, answer), (_, row) in zip(PROBLEMS, frame.iterrows()):
        assert [dict(m) for m in row["prompt"]] == [{"role": "system", "content": rt.SYSTEM_PROMPT},
                                                    {"role": "user", "content": problem}]
        assert ground_truth(row) == answer and row["data_source"] == "math_dapo"
    score = get_task("retool").make_reward(cfg())
    assert score("\\boxed{1024}", frame.iloc[1].to_dict()) == 1.0
    with pytest.raises(TinyRLError, match="already exists"):
        rt.convert_rl(str(tmp_path / "dapo.parquet"), tmp_path / "out")


def test_plain_problem_answer_tables_convert_too(tmp_path):
    pd.DataFrame({"problem": [p for p, _ in PROBLEMS], "answer": [a for _, a in PROBLEMS]}).to_json(
        tmp_path / "aime.jsonl", orient="records", lines=True)
    path, n, _, _ = rt.convert_rl(str(tmp_path / "aime.jsonl"), tmp_path, name="mine")
    frame = pq.read_table(path).to_pandas()
    assert n == 3 and list(frame["data_source"]) == ["retool"] * 3
    assert frame["prompt"][2][1]["content"] == "Find x if 3x = 12."


def test_rows_without_an_answer_are_not_counted_as_repeats(tmp_path, capsys):
    # rows skipped for a missing answer were said as "repeated rows kept once"
    pd.DataFrame({"problem": ["p1", "p1", "p2", "p3"], "answer": ["1", "1", None, ""]}).to_parquet(tmp_path / "t.parquet")
    path, n, dropped, skipped = rt.convert_rl(str(tmp_path / "t.parquet"), tmp_path / "out")
    assert (n, dropped, skipped) == (1, 1, 2)
    rt.data_command(out_dir=tmp_path / "cli", source=str(tmp_path / "t.parquet"), sft=False, name=None,
                    test_size=None, problem_key=None, answer_key=None, train_size=1, seed=0)
    assert ("(1 prompt; 1 repeated row kept once; 2 rows without a problem or an answer skipped)"
            in " ".join(capsys.readouterr().out.split()))  # one of each is no plural ("1 prompts")


# ------------------------------------------------------------------ SFT data

# ReTool-SFT's layout, with a problem and trace written for this test
QUESTION = ("Solve the problem below; put the final answer in <answer></answer>.\n\n*user question:*\n"
            "How many eggs are in 6 rows of 7 eggs?")
TRACE = ("I will multiply.\n<code>\n```python\nprint(6 * 7)\n```\n</code>\n<interpreter>\n42\n</interpreter>\n"
         "Let me double-check by adding.<code>print(sum([7] * 6))</code> <interpreter>42</interpreter>\n"
         "Both agree.\n<answer>The total is \\boxed{42}.</answer>")
EXPECTED = [
    {"role": "system", "content": rt.SYSTEM_PROMPT},
    {"role": "user", "content": "How many eggs are in 6 rows of 7 eggs?"},
    {"role": "assistant", "content": "I will multiply.", "tool_calls": [
        {"type": "function", "function": {"name": "code_interpreter", "arguments": {"code": "print(6 * 7)"}}}]},
    {"role": "tool", "content": "42"},
    {"role": "assistant", "content": "Let me double-check by adding.", "tool_calls": [
        {"type": "function", "function": {"name": "code_interpreter", "arguments": {"code": "print(sum([7] * 6))"}}}]},
    {"role": "tool", "content": "42"},
    {"role": "assistant", "content": "Both agree.\nThe total is \\boxed{42}."},
]
MALFORMED = ["<interpreter>42</interpreter> \\boxed{42}",                # output without code
             "<code>print(1)</code> and then <answer>1</answer>",        # code without output
             "<answer>1</answer> more <code>print(2)</code>",           # something after the answer
             "<code>print(1)</code><interpreter>1</interpreter>",       # ends on the tool's output
             "<code>print(1)</code><interpreter>1"]                     # an unclosed tag


def test_a_retool_sft_trace_becomes_tool_calls_and_tool_turns():
    assert rt.sft_messages(QUESTION, TRACE) == EXPECTED
    for reply in MALFORMED:
        assert rt.sft_messages(QUESTION, reply) is None, reply
    assert rt.sft_messages("Just a question", "Plain reply \\boxed{1}")[1:] == [
        {"role": "user", "content": "Just a question"}, {"role": "assistant", "content": "Plain reply \\boxed{1}"}]


# Qwen2.5's hermes layout for the tiny tokenizer (it has no template): tools in the system turn,
# calls as <tool_call> JSON, tool results grouped in a user turn inside <tool_response>.
HERMES = (
    "{% for m in messages %}"
    "{% if m.role == 'system' %}<|im_start|>system\n{{ m.content }}{% if tools %}\n# Tools\n{% for t in tools %}"
    "{{ t | tojson }}{% endfor %}{% endif %}<|im_end|>\n"
    "{% elif m.role == 'tool' %}{% if messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}"
    "\n<tool_response>\n{{ m.content }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}{% for c in m.tool_calls or [] %}"
    "\n<tool_call>\n{\"name\": \"{{ c.function.name }}\", \"arguments\": {{ c.function.arguments | tojson }}}"
    "\n</tool_call>{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_the_sft_file_trains_with_tinyrl_sft_loss_on_the_assistant_turns_only(tmp_path, tiny_model_dir, capsys):
    from tinyrl.setup import load_tokenizer
    from tinyrl.sft.data import load_sft

    rows = [{"messages": [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": r}]}
            for r in [TRACE] * 3 + MALFORMED]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "retool-sft.parquet")
    paths, n, skipped = rt.convert_sft(str(tmp_path / "retool-sft.parquet"), tmp_path / "out", test_size=1)
    assert (n, skipped) == (3, len(MALFORMED))
    assert [p.name for p in paths] == ["retool-sft.parquet", "retool-sft-test.parquet"]
    assert [pq.ParquetFile(p).metadata.num_rows for p in paths] == [2, 1]
    rt.data_command(out_dir=tmp_path / "cli", source=str(tmp_path / "retool-sft.parquet"), sft=True, name=None,
                    test_size=1, problem_key=None, answer_key=None, train_size=1, seed=0)
    said = " ".join(capsys.readouterr().out.split())  # it said "3 conversations" of a 2 + 1 split
    assert f"(2 conversations + 1 for the test; {len(MALFORMED)} malformed rows skipped)" in said, said
    assert json.loads(pq.read_table(paths[0]).column("tools")[0].as_py()) == rt.tool_schemas()

    tok = load_tokenizer(str(tiny_model_dir), HERMES)
    config = load_config("countdown-tiny-sft", [f"data.train_path={paths[0]}", "sft.max_length=2048"])
    data = load_sft(paths[0], tok, config)
    ids = data.prompts[0] + data.responses[0]
    mask = [0] * len(data.prompts[0]) + data.loss_masks[0]
    assert tok.decode(ids) == tok.apply_chat_template(EXPECTED, tools=rt.tool_schemas(), tokenize=False)
    trained = tok.decode([t for t, m in zip(ids, mask) if m])
    untrained = tok.decode([t for t, m in zip(ids, mask) if not m])
    assert trained.count('<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(6 * 7)"}}') == 1
    assert "\\boxed{42}" in trained and "<tool_response>" not in trained and "42\n</tool_response>" in untrained
    assert "code_interpreter" in tok.decode(data.prompts[0])  # the schema reached the template


def test_sft_conversion_refuses_files_it_cannot_read(tmp_path):
    pq.write_table(pa.Table.from_pylist([{"prompt": "x"}]), tmp_path / "a.parquet")
    with pytest.raises(TinyRLError, match="no 'messages' column"):
        rt.convert_sft(str(tmp_path / "a.parquet"), tmp_path)
    rows = [{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "b.parquet")
    with pytest.raises(TinyRLError, match="--test-size"):
        rt.convert_sft(str(tmp_path / "b.parquet"), tmp_path, test_size=1)


# ------------------------------------------------------------------ with the real turn loop


def test_episodes_of_the_real_turn_loop_score_from_the_models_last_turn(tiny_model_dir):
    """The turn loop (tinyrl.rollout.turns) with the real sandbox and a hermes template writes the
    tool turns; the retool reward reads the decoded episodes as the trainer hands them over."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from helpers.hermes_template import HERMES_TEMPLATE
    from helpers.scripted_engine import ScriptedEngine
    from transformers import AutoTokenizer

    from tinyrl.rollout.base import SamplingSettings, response_texts
    from tinyrl.rollout.chat import ToolChat
    from tinyrl.rollout.turns import EpisodeLimits, run_episodes
    from tinyrl.tasks.rewards import reward_set
    from tinyrl.tools import TOOLS

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = HERMES_TEMPLATE
    chat = ToolChat(tok, [TOOLS["code_interpreter"].schema], [tok.eos_token_id])

    def call(code):
        return "<tool_call>\n" + json.dumps({"name": "code_interpreter", "arguments": {"code": code}}) + "\n</tool_call>"

    first = [call("print(6 * 7)"), call("print('\\\\boxed{42}')"), call("1 / 0"), call("print(1)")]
    last = ["So the answer is \\boxed{42}.", "Done.", "\\boxed{42}", "\\boxed{41}"]

    def script(context, j):  # a continuation is generated with n = 1: its context says which sample
        if "<tool_response>" not in context:
            return first[j]
        return last[next(i for i, c in enumerate(first) if c.split("\n")[1] in context)]

    messages = [rt.prompt_messages("What is 6 * 7?")]
    prompts = [chat.render(messages[0], generation_prompt=True)]
    res = run_episodes(ScriptedEngine(tok, script), prompts, SamplingSettings(n=4, max_new_tokens=600, seed=1),
                       chat=chat, tools={"code_interpreter": TOOLS["code_interpreter"]},
                       limits=EpisodeLimits(tool_timeout_s=10.0, tool_workers=2), messages=messages)
    texts = response_texts(tok, res.episodes)
    assert "<tool_response>\n\\boxed{42}" in texts[1]  # the tool really printed the answer
    assert [[c.status for c in e.tool_calls] for e in res.episodes] == [["ok"], ["ok"], ["error"], ["ok"]]
    scored = reward_set(["task"], [], cfg(tool_error_penalty=0.25)).score_batch(texts, [ROW] * 4, res.episodes)
    assert scored.total == [1.0, -1.0, 0.75, -1.0]
    assert scored.solved == [True, False, True, False]
