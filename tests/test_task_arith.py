"""The arith task (tinyrl/tasks/arith.py) and the tiny model's chat template
(presets/chat_templates/tiny-hermes.jinja): what the tool demo's SFT and RL stand on.

Generated data is checked as invariants over every row (held-out split, answers, the tool's
setup, the share of tool conversations, the tool's real output); the reward against episodes written out by hand,
including one that tries to answer from inside a tool response; the template against what the
SFT loss mask and the turn loop need (appending a message only appends text; an assistant turn
ends with the model's one stop token; the tool turn after it is the same whatever came before).
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
import sys

import pyarrow.parquet as pq
import pytest

from tinyrl.tasks import arith

TEMPLATE = "presets/chat_templates/tiny-hermes.jinja"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    out = tmp_path_factory.mktemp("arith")
    arith.generate(out, 600, 200, seed=3, sft=True, tool_share=0.3)
    return out


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from tinyrl.setup import load_tokenizer

    return load_tokenizer(str(tiny_model_dir), TEMPLATE)


def rows(path):
    return pq.read_table(path).to_pylist()


def test_generated_questions_hold_out_the_test_split_and_are_reproducible(data, tmp_path):
    train, test = rows(data / "train.parquet"), rows(data / "test.parquet")
    pair = lambda r: (r["reward_model"]["ground_truth"]["a"], r["reward_model"]["ground_truth"]["b"])  # noqa: E731
    assert len(train) == 600 and len(test) == 200
    assert not {pair(r) for r in train} & {pair(r) for r in test}
    for r in train + test:
        a, b = pair(r)
        assert arith.MIN_NUMBER <= a <= arith.MAX_NUMBER and arith.MIN_NUMBER <= b <= arith.MAX_NUMBER
        assert a % 7 and b % 7  # so the answer is 1-6, never 0
        assert r["reward_model"]["ground_truth"]["answer"] == a * b % 7
        assert r["prompt"] == [{"role": "user", "content": f"a={a}, b={b}. What is a*b%7?"}]
        assert r["extra_info"]["tools_kwargs"] == {"code_interpreter": {"create_kwargs": {"setup": f"a={a}\nb={b}"}}}
    assert sorted({r["reward_model"]["ground_truth"]["answer"] for r in train}) == [1, 2, 3, 4, 5, 6]
    # over every pair the generator may draw, each answer equally often: a guess is right 1 time in 6
    span = [n for n in range(arith.MIN_NUMBER, arith.MAX_NUMBER + 1) if n % 7]
    counts = Counter(arith.solution(a, b) for a in span for b in span)
    assert sorted(counts) == [1, 2, 3, 4, 5, 6] and max(counts.values()) - min(counts.values()) <= 1
    arith.generate(tmp_path, 600, 200, seed=3)
    assert rows(tmp_path / "train.parquet") == train  # the same seed, the same files


def test_the_tool_answers_each_question_only_with_its_rows_setup(data):
    """The question's values reach the program only through the row's setup (verl's
    extra_info.tools_kwargs, which the turn loop passes to the tool: tests/test_turns.py)."""
    from tinyrl.data.io import tools_kwargs
    from tinyrl.tools import TOOLS

    tool = TOOLS["code_interpreter"]
    for r in rows(data / "test.parquet")[:4]:
        create = tools_kwargs(r)["code_interpreter"]["create_kwargs"]
        assert tool.run({"code": arith.TOOL_CODE}, create).stdout == f"{r['reward_model']['ground_truth']['answer']}\n"
        assert "NameError" in tool.run({"code": arith.TOOL_CODE}, {}).stderr


def test_sft_conversations_call_the_tool_at_the_share_asked_with_its_real_output(data):
    from tinyrl.data.io import tools_kwargs
    from tinyrl.tools import TOOLS, render

    train = rows(data / "sft_train.parquet")
    drills = [r for r in train if r["messages"][0]["role"] == "tool"]
    with_tool = [r for r in train if len(r["messages"]) == 4]
    assert 0.42 < len(drills) / len(train) < 0.58  # DRILL_SHARE 0.5 of 600; binomial sd 2.0 points
    assert 0.20 < len(with_tool) / (len(train) - len(drills)) < 0.40  # 30% of the ~300 others; sd 2.6 points
    for r in train:
        truth = r["reward_model"]["ground_truth"]
        msgs = r["messages"]
        assert msgs[-1] == {"role": "assistant", "content": f"<answer>\n{truth['answer']}\n</answer>"}
        if msgs[0]["role"] == "tool":  # a drill: the tool output and the answer copying it, nothing else
            assert msgs == [{"role": "tool", "content": str(truth["answer"])}, msgs[-1]] and r["tools"] == "[]"
            continue
        assert msgs[0] == r["prompt"][0] and json.loads(r["tools"]) == [TOOLS["code_interpreter"].schema]
        if len(msgs) == 4:
            call = json.loads(msgs[1]["content"].removeprefix("<tool_call>\n").removesuffix("\n</tool_call>"))
            assert call == {"name": "code_interpreter", "arguments": {"code": "print(a*b%7)"}}
            assert msgs[2] == {"role": "tool", "content": str(truth["answer"])}
        else:
            assert len(msgs) == 2
    for r in with_tool[:3]:  # the batched run gives what separate tool calls with the row's setup give
        code = json.loads(r["messages"][1]["content"].split("\n")[1])["arguments"]["code"]
        create = tools_kwargs(r)["code_interpreter"]["create_kwargs"]
        assert render(TOOLS["code_interpreter"].run({"code": code}, create)) == r["messages"][2]["content"]
    assert arith.tool_outputs([("", "print(1)"), ("", "x = 2"), ("n = 5", "print('a')\nprint(3 - n)")]) == \
        ["1", "[no output; exit code 0]", "a\n-2"]


def test_the_answer_copies_the_tool_output_after_the_same_tokens(tok, data):
    """The tiny 2-layer model copies by induction: to write the token after X it finds an earlier X
    and copies its successor. So the answer's digit follows the same tokens (">" "\\n") as the tool
    response's (README: the tool demo; with `<answer> 1081 </answer>` every answer was the same
    number, whatever the tool printed)."""
    from tinyrl.tools import TOOLS

    schemas = [TOOLS["code_interpreter"].schema]
    convs = [r for r in rows(data / "sft_train.parquet") if len(r["messages"]) == 4][:20]
    for r in convs:
        ids = tok(tok.apply_chat_template(r["messages"], tools=schemas, tokenize=False),
                  add_special_tokens=False)["input_ids"]
        digits = tok(str(r["reward_model"]["ground_truth"]["answer"]), add_special_tokens=False)["input_ids"]
        starts = [i for i in range(len(ids)) if ids[i:i + len(digits)] == digits]
        assert len(starts) >= 2  # the tool's output, then the answer
        assert ids[starts[-2] - 2:starts[-2]] == ids[starts[-1] - 2:starts[-1]]
        assert ids[starts[-2] + len(digits)] == ids[starts[-1] + len(digits)]  # "\n" after both
    # a drill holds the same copy with nothing else around it: the tool turn, then the answer
    drill = next(r for r in rows(data / "sft_train.parquet") if r["messages"][0]["role"] == "tool")
    text = tok.apply_chat_template(drill["messages"], tools=json.loads(drill["tools"]) or None, tokenize=False)
    assert text == (f"<|im_start|>tool\n<tool_response>\n{drill['messages'][0]['content']}\n</tool_response><|im_end|>\n"
                    f"<|im_start|>assistant\n{drill['messages'][1]['content']}<|endoftext|>")
    assert len(tok(text, add_special_tokens=False)["input_ids"]) < 60  # 49 tokens; a full conversation is ~310


@pytest.mark.parametrize("episode, score", [
    ("<answer> 1 </answer>", 1.0),                                     # a direct (guessed) answer
    ("<answer> 2 </answer>", 0.0),
    ("<answer> 1058 </answer>", 0.0),                                  # the product is not the question
    ('<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(a*b%7)"}}\n</tool_call>'
     "tool\n<tool_response>\n1\n</tool_response>\nassistant\n<answer>\n1\n</answer>", 1.0),
    ('<tool_call>...</tool_call>tool\n<tool_response>\n1\n</tool_response>\nassistant\n', 0.0),
    # the program printed the answer tags: text inside a tool response is not the model's answer
    ("<tool_call>...</tool_call>tool\n<tool_response>\n<answer> 1 </answer>\n</tool_response>\nassistant\n"
     "I think so", 0.0),
    ("<answer> 1 </answer>tool\n<tool_response>\n1\n</tool_response>\nassistant\n<answer> 5 </answer>", 0.0),
    ("<answer> 5 </answer> no, <answer> 1 </answer>", 1.0),           # the last answer counts
])
def test_reward_reads_the_answer_of_the_last_turn_only(episode, score):
    row = {"reward_model": {"ground_truth": {"a": 23, "b": 46, "answer": 1}}}
    assert arith.reward()(episode, row) == score


def test_the_template_appends_each_message_and_ends_assistant_turns_with_eos(tok, data):
    from tinyrl.tools import TOOLS

    schemas = [TOOLS["code_interpreter"].schema]
    msgs = rows(data / "sft_train.parquet")
    msgs = next(r["messages"] for r in msgs if len(r["messages"]) == 4)
    before = ""
    for k in range(1, len(msgs) + 1):
        text = tok.apply_chat_template(msgs[:k], tools=schemas, tokenize=False)
        assert text.startswith(before)
        before = text
        if msgs[k - 1]["role"] == "assistant":  # the turn's last token is the model's stop token
            assert tok(text, add_special_tokens=False)["input_ids"][-1] == tok.eos_token_id
            # and its content comes back from the tokens as it went in (no lossy pieces)
            assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
    prompt = tok.apply_chat_template(msgs[:1], tools=schemas, tokenize=False, add_generation_prompt=True)
    assert "code_interpreter(code): Run a Python program" in prompt and prompt.endswith("<|im_start|>assistant\n")
    # the tool turn the turn loop inserts does not depend on what came before it
    tail = lambda m: tok.apply_chat_template(  # noqa: E731
        m + [{"role": "tool", "content": "1081"}], tools=schemas, tokenize=False, add_generation_prompt=True
    ).removeprefix(tok.apply_chat_template(m, tools=schemas, tokenize=False))
    other = [{"role": "user", "content": "What is 10 * 10?"}, {"role": "assistant", "content": "x"}]
    assert tail(msgs[:2]) == tail(other) == \
        "<|im_start|>tool\n<tool_response>\n1081\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


def test_sft_trains_the_assistant_turns_and_their_eos_never_the_tool_output(tok, data):
    from tinyrl.config import load_config
    from tinyrl.sft.data import load_sft

    path = data / "sft_train.parquet"
    cfg = load_config("countdown-tools-demo-sft", [f"data.train_path={path}", "model.init_from="])  # no SFT run here
    sft = load_sft(path, tok, cfg)
    for r, prompt, response, mask in zip(rows(path), sft.prompts, sft.responses, sft.loss_masks):
        trained = [t for t, m in zip(response, mask) if m]
        want = "".join(m["content"] + "<|endoftext|>" for m in r["messages"] if m["role"] == "assistant")
        assert tok.decode(trained) == want
        assert len(prompt) + len(response) <= cfg.sft.max_length


def test_the_shipped_template_is_found_from_another_directory(tmp_path, tiny_model_dir):
    code = ("from tinyrl.setup import load_tokenizer; import sys; "
            f"t = load_tokenizer({str(tiny_model_dir)!r}, {TEMPLATE!r}); print('<tool_response>' in t.chat_template)")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.stdout.strip() == "True", done.stderr[-2000:]


def test_bad_data_options_are_one_screen_and_exit_2(tmp_path):
    done = subprocess.run([sys.executable, "-m", "tinyrl.cli", "data", "arith", "--out", str(tmp_path / "d"),
                           "--sft", "--tool-share", "1.5"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "--tool-share 1.5" in done.stdout + done.stderr
    assert not (tmp_path / "d").exists()  # nothing written
    done = subprocess.run([sys.executable, "-m", "tinyrl.cli", "data", "arith", "--out", str(tmp_path / "d"),
                           "--sft", "--drill-share", "-0.1"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "--drill-share -0.1" in done.stdout + done.stderr
    assert not (tmp_path / "d").exists()
