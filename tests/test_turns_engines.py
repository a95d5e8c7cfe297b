"""Both engines run multi-turn episodes with the tiny model: a copy of it is taught (a few
hundred Adam steps on one conversation, ~10 s) to call the code tool and then answer, so the
tool call comes from the engine's own decoding, the sandbox runs it, the tool turn goes back
into the context, and the engine writes the next turn from it."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from helpers.hermes_template import HERMES_TEMPLATE
from tinyrl.rollout.base import SamplingSettings
from tinyrl.rollout.chat import ToolChat
from tinyrl.rollout.turns import EpisodeLimits, run_episodes
from tinyrl.tools import TOOLS

# The real tool (its run and grace), with a short schema: the session's vLLM engine holds 512
# tokens per sequence.
CODE = replace(TOOLS["code_interpreter"], schema={"type": "function", "function": {
    "name": "code_interpreter", "parameters": {"type": "object", "properties": {"code": {"type": "string"}},
                                               "required": ["code"]}}})
QUESTIONS = [(6, 7), (8, 9)]


def _call(a: int, b: int) -> str:
    return "<tool_call>\n" + json.dumps({"name": "code_interpreter", "arguments": {"code": f"print({a} * {b})"}}) \
        + "\n</tool_call>"


@pytest.fixture(scope="module")
def taught(tiny_model_dir):
    """(tokenizer, chat, a model that calls the tool for 'what is a * b?' and then answers)."""
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = HERMES_TEMPLATE
    chat = ToolChat(tok, [CODE.schema], [tok.eos_token_id])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    rows = []
    for a, b in QUESTIONS:
        prompt = chat.render(_messages(a, b), generation_prompt=True)
        turn1 = tok(_call(a, b), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        tool = chat.tool_turn_ids([f"{a * b}"])
        turn2 = tok(f"<answer> {a * b} </answer>", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        ids = prompt + turn1 + tool + turn2
        labels = [-100] * len(prompt) + turn1 + [-100] * len(tool) + turn2  # the policy's turns only
        rows.append((torch.tensor([ids]), torch.tensor([labels])))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(150):
        for ids, labels in rows:
            opt.zero_grad()
            model(input_ids=ids, labels=labels).loss.backward()
            opt.step()
    model.eval()
    return tok, chat, model


def _messages(a: int, b: int) -> list[dict]:
    return [{"role": "user", "content": f"what is {a} * {b}?"}]


def _episodes(engine, chat, sampling: SamplingSettings):
    msgs = [_messages(a, b) for a, b in QUESTIONS]
    return run_episodes(engine, [chat.render(m, True) for m in msgs], sampling, chat=chat,
                        tools={"code_interpreter": CODE}, limits=EpisodeLimits(tool_timeout_s=10.0), messages=msgs)


def _check_greedy(res, tok):
    for e in res.episodes:
        assert [t.role for t in e.turns] == ["assistant", "tool", "assistant"], tok.decode(e.response_ids)
        assert [(c.name, c.status) for c in e.tool_calls] == [("code_interpreter", "ok")]
        call, tool, answer = e.turns
        # the code the engine wrote, run by the sandbox: its output is in the tool turn (the tiny
        # model need not pick the right question's numbers; the mechanics are under test)
        code = json.loads(tok.decode(e.response_ids[call.start:call.end], skip_special_tokens=True)
                          .split("<tool_call>")[1].split("</tool_call>")[0])["arguments"]["code"]
        a, b = (int(x) for x in code.removeprefix("print(").removesuffix(")").split(" * "))
        assert f"<tool_response>\n{a * b}\n</tool_response>" in tok.decode(e.response_ids[tool.start:tool.end])
        assert tok.decode(e.response_ids[answer.start:answer.end], skip_special_tokens=True).startswith("<answer> ")
        assert e.stop_reason == "stop"
        assert e.policy_mask == [0 if tool.start <= i < tool.end else 1 for i in range(len(e.response_ids))]
        assert all(lp == 0.0 for lp in e.logprobs[tool.start:tool.end])
        assert all(lp < 0.0 or lp == 0.0 for lp in e.logprobs)
    assert {e.rerender for e in res.episodes} == {"same"}


def test_hf_engine_runs_multi_turn_episodes(taught):
    from tinyrl.rollout.hf_engine import HFEngine

    tok, chat, model = taught
    engine = HFEngine(model, tok)
    assert engine.multi_turn
    _check_greedy(_episodes(engine, chat, SamplingSettings(n=1, greedy=True, max_new_tokens=200)), tok)
    # sampled, seeded: the same seed gives the same episodes, turn by turn
    sampled = SamplingSettings(n=4, temperature=1.0, max_new_tokens=120, seed=11)
    first, again = _episodes(engine, chat, sampled), _episodes(engine, chat, sampled)
    assert any(len(e.turns) > 2 for e in first.episodes)  # later turns sampled too
    assert [e.response_ids for e in first.episodes] == [e.response_ids for e in again.episodes]
    other = _episodes(engine, chat, SamplingSettings(n=4, temperature=1.0, max_new_tokens=120, seed=12))
    assert [e.response_ids for e in other.episodes] != [e.response_ids for e in first.episodes]
    assert [e.prompt_index for e in first.episodes] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert all(len(e.response_ids) <= 120 for e in first.episodes)


def test_hf_kept_cache_episodes_equal_reprefilled_episodes(taught):
    """The HF engine keeps each episode's KV cache across turns (KeptCacheSession): the turn
    loop's episodes are those of re-prefilling the whole context each turn, token for token, with
    log-probs to 1e-5; seeded, n = 4, with tool turns of different lengths and episodes that
    end at different turns (both checked to occur), and only the added tokens prefilled."""
    from tinyrl.rollout.hf_engine import HFEngine

    tok, chat, model = taught
    kept, reprefill = HFEngine(model, tok), HFEngine(model, tok, keep_context_cache=False)
    sessions = []
    make = kept.episode_session
    kept.episode_session = lambda: sessions.append(make()) or sessions[-1]
    sampling = SamplingSettings(n=4, temperature=1.3, max_new_tokens=160, seed=5)
    a, b = _episodes(kept, chat, sampling), _episodes(reprefill, chat, sampling)
    assert len(sessions) == 1 and not sessions[0].kept  # the kept path ran, and freed its caches at the end
    assert [e.response_ids for e in a.episodes] == [e.response_ids for e in b.episodes]
    assert [e.policy_mask for e in a.episodes] == [e.policy_mask for e in b.episodes]
    for x, y in zip(a.episodes, b.episodes):
        assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs)) < 1e-5
    tools = {t.end - t.start for e in a.episodes for t in e.turns if t.role == "tool"}
    ends = {sum(t.role == "assistant" for t in e.turns) for e in a.episodes}
    assert len(tools) > 1 and len(ends) > 1, (tools, ends)  # tool turns of different lengths; ends at turns 1 and 2+
    # prefilled: each prompt once for its 4 samples, then per later turn the previous turn's stop
    # token and the tool turn only (re-prefilling feeds each later turn's whole context)
    assert sessions[0].prefilled == sum(len(e.prompt_ids) for e in a.episodes[::4]) + \
        sum(1 + t.end - t.start for e in a.episodes for t in e.turns if t.role == "tool")


def _delayed(delays):
    """The code tool, each call first sleeping the next of `delays` seconds (calls run two at a
    time: which call gets which delay, and so which episodes are ready first, varies)."""
    import itertools
    import threading
    import time

    lock, it, real = threading.Lock(), itertools.cycle(delays), CODE.run

    def run(arguments, create_kwargs, **limits):
        with lock:
            pause = next(it)
        time.sleep(pause)
        return real(arguments, create_kwargs, **limits)

    return replace(CODE, run=run)


def test_hf_turns_are_synchronous_and_a_seeded_rollout_repeats_whatever_the_tool_timings(taught):
    """The HF decode loop takes no rows once it runs, so each later turn continues EVERY episode
    whose calls ran, in one generate call, however the calls' times differ (a wave of the
    episodes ready first would cost a whole decode loop: README); each episode's later turns
    sample with their own seed. Two runs with different call delays: the same episodes (tokens,
    turns, tool statuses; log-probs to 1e-5) and the same generate calls."""
    from tinyrl.rollout.hf_engine import HFEngine

    tok, chat, model = taught
    msgs = [_messages(a, b) for a, b in QUESTIONS]
    sampling = SamplingSettings(n=4, temperature=1.3, max_new_tokens=160, seed=6)  # later turns vary by seed
    runs = []
    for delays in ([0.0, 0.8, 0.0, 1.6, 0.4], [1.2, 0.0, 0.6, 0.0, 0.0, 0.3]):
        engine = HFEngine(model, tok)
        batches = []
        make = engine.episode_session

        def session(make=make, batches=batches):
            inner = make()
            real = inner.generate

            def generate(contexts, settings, keys=None):
                batches.append(None if keys is None else tuple(keys))
                return real(contexts, settings, keys)
            inner.generate = generate
            return inner
        engine.episode_session = session
        res = run_episodes(engine, [chat.render(m, True) for m in msgs], sampling, chat=chat,
                           tools={"code_interpreter": _delayed(delays)},
                           limits=EpisodeLimits(tool_timeout_s=10.0, tool_workers=2), messages=msgs)
        runs.append((res, batches))
    (a, batches_a), (b, batches_b) = runs
    assert [e.response_ids for e in a.episodes] == [e.response_ids for e in b.episodes]
    assert [e.turns for e in a.episodes] == [e.turns for e in b.episodes]
    assert [[c.status for c in e.tool_calls] for e in a.episodes] == [[c.status for c in e.tool_calls]
                                                                      for e in b.episodes]
    for x, y in zip(a.episodes, b.episodes):
        assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs)) < 1e-5
    assert sum(len(e.tool_calls) for e in a.episodes) >= 4
    assert batches_a == batches_b, (batches_a, batches_b)
    # one call per turn: turn t continues exactly the episodes with a (t-1)-th tool turn
    for t, keys in enumerate(batches_a[1:], start=1):
        with_tool_turn = tuple(k for k, e in enumerate(a.episodes) if sum(x.role == "tool" for x in e.turns) >= t)
        assert keys == with_tool_turn, (t, keys, with_tool_turn)
    assert len(batches_a) == 1 + max(sum(x.role == "tool" for x in e.turns) for e in a.episodes)


@pytest.mark.vllm
@pytest.mark.xdist_group("vllm")
def test_vllm_engine_runs_multi_turn_episodes(taught, vllm_engine):
    from tinyrl.rollout.hf_engine import HFEngine

    tok, chat, model = taught
    assert vllm_engine.multi_turn and vllm_engine.llm.llm_engine.vllm_config.cache_config.enable_prefix_caching
    vllm_engine.sync_weights(model)  # the taught weights, in full (the fixture's LoRA is dropped)
    greedy = SamplingSettings(n=1, greedy=True, max_new_tokens=200)
    res = _episodes(vllm_engine, chat, greedy)
    _check_greedy(res, tok)
    hf = _episodes(HFEngine(model, tok), chat, greedy)  # fp32 both: the same greedy episodes
    assert [e.response_ids for e in res.episodes] == [e.response_ids for e in hf.episodes]
    # budgets per prompt (the turn loop's later turns): vLLM stops each request at its own
    prompts = [chat.render(_messages(a, b), True) for a, b in QUESTIONS]
    cut = vllm_engine.generate(prompts, SamplingSettings(n=1, greedy=True, max_new_tokens=50,
                                                         max_new_tokens_per_prompt=[3, 7]))
    assert [len(e.response_ids) for e in cut.episodes] == [3, 7]
    assert [e.response_ids for e in cut.episodes] == [e.response_ids[:n] for e, n in zip(res.episodes, (3, 7))]


@pytest.mark.vllm
@pytest.mark.xdist_group("vllm")
def test_vllm_later_turns_join_the_running_batch_and_repeat_whatever_the_timings(taught, vllm_engine):
    """On vLLM an episode's next turn is added to the engine's running batch (StepSession) as
    soon as its calls are back; with a seed per episode and turn (a request's own seed), two
    runs with different call delays give the same episodes, though the turns were submitted in
    a different order."""
    from tinyrl.rollout.vllm_engine import StepSession

    tok, chat, model = taught
    vllm_engine.sync_weights(model)
    msgs = [_messages(a, b) for a, b in QUESTIONS]
    sampling = SamplingSettings(n=4, temperature=1.0, max_new_tokens=160, seed=6)
    runs = []
    for delays in ([0.0, 0.8, 0.0, 1.6, 0.4], [1.2, 0.0, 0.6, 0.0, 0.0, 0.3]):
        order = []
        make = vllm_engine.episode_session

        def session(make=make, order=order):
            inner = make()
            real = inner.submit

            def submit(key, context, settings):
                order.append(key)
                return real(key, context, settings)
            inner.submit = submit
            return inner
        vllm_engine.episode_session = session
        try:
            res = run_episodes(vllm_engine, [chat.render(m, True) for m in msgs], sampling, chat=chat,
                               tools={"code_interpreter": _delayed(delays)},
                               limits=EpisodeLimits(tool_timeout_s=10.0, tool_workers=2), messages=msgs)
        finally:
            del vllm_engine.episode_session
        runs.append((res, order))
    assert isinstance(vllm_engine.episode_session(), StepSession)
    (a, order_a), (b, order_b) = runs
    assert [e.response_ids for e in a.episodes] == [e.response_ids for e in b.episodes]
    assert [[c.status for c in e.tool_calls] for e in a.episodes] == [[c.status for c in e.tool_calls]
                                                                      for e in b.episodes]
    for x, y in zip(a.episodes, b.episodes):
        assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs)) < 1e-4
    assert len(order_a) >= 4 and order_a != order_b, (order_a, order_b)
    assert not vllm_engine.llm.llm_engine.has_unfinished_requests()
