"""`tinyrl sft` (issue 14): the loss, both data formats, the loss mask, the trainer (gradients,
resume), model.init_from (the RL reference is the SFT model) and the errors users see.
Fast: in-process on the tiny model; the end-to-end CLI run is test_sft_cli.py."""

from __future__ import annotations

import json
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from test_safety import cli  # tinyrl ARGS in this process: (exit code, stderr)
from tinyrl.config import REPO_ROOT, load_config
from tinyrl.errors import TinyRLError
from tinyrl.rl.losses import sft_loss
from tinyrl.roles import Role

# A chat template for the tiny tokenizer (it has none): Qwen's layout, tools in a system turn.
TEMPLATE = ("{% if tools %}<|im_start|>system\nTools: {% for t in tools %}{{ t['name'] }} {% endfor %}"
            "<|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
            "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CONVERSATION = [{"role": "system", "content": "You solve Countdown."},
                {"role": "user", "content": "Using 3 and 5 make 8."},
                {"role": "assistant", "content": "<answer> 3 + 5 </answer>"},
                {"role": "user", "content": "Now make 15."},
                {"role": "assistant", "content": "<answer> 3 * 5 </answer>"},
                {"role": "user", "content": "Thanks, bye."}]
ASSISTANT_TEXTS = [m["content"] + "<|im_end|>\n" for m in CONVERSATION if m["role"] == "assistant"]


# ------------------------------------------------------------------ the loss, by hand


def test_sft_loss_is_the_token_mean_nll_over_the_mask_by_hand():
    lp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -4.0, -9.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    loss, stats = sft_loss(lp, mask)
    # three trained tokens: (1 + 2 + 0.5) / 3
    assert loss.item() == pytest.approx(3.5 / 3)
    assert stats["loss"].item() == pytest.approx(3.5 / 3)
    loss.backward()
    # d loss / d lp = -1/3 on each trained token, exactly 0 elsewhere (-3, -4, -9 never count)
    torch.testing.assert_close(lp.grad, torch.tensor([[-1 / 3, -1 / 3, 0.0], [-1 / 3, 0.0, 0.0]]))


# ------------------------------------------------------------------ data


@pytest.fixture(scope="module")
def sft_files(tmp_path_factory):
    from tinyrl.data.countdown import generate_countdown

    out = tmp_path_factory.mktemp("sft-data")
    generate_countdown(out, 64, 1024, progress=False, sft=True)
    return out / "sft_train.parquet", out / "sft_test.parquet"


def multiturn_file(path, rows: int = 8, tools_as_json: bool = False):
    """With tools_as_json the tools and the messages columns are JSON text (was: messages refused)."""
    tools = [{"name": "calculator", "description": "adds"}]
    as_stored = json.dumps if tools_as_json else (lambda value: value)
    pq.write_table(pa.Table.from_pylist([
        {"messages": as_stored(CONVERSATION), "tools": as_stored(tools)} for _ in range(rows)]), path)
    return path


@pytest.fixture(scope="module")
def chat_tok(tiny_model_dir):
    """The tiny tokenizer with TEMPLATE, as model.custom_chat_template gives it."""
    from tinyrl.setup import load_tokenizer

    return load_tokenizer(str(tiny_model_dir), TEMPLATE)


def sft_config(train, *extra: str):
    return load_config("countdown-tiny-sft", [
        f"data.train_path={train}", "trainer.train_batch_size=8", "trainer.max_steps=2", "trainer.test_every=0",
        "trainer.save_every=0", "trainer.device=cpu", *extra])


def test_countdown_sft_targets_score_full_marks_and_prompts_match_rl(sft_files, tok):
    """Every reference response scores 1.0 with the task's reward (strict too), and an SFT
    prompt is token for token what `tinyrl train` feeds the model for the same row."""
    from tinyrl.rewards.countdown import compute_score
    from tinyrl.setup import tokenize_rows
    from tinyrl.sft.data import load_sft

    train, _ = sft_files
    rows = pq.read_table(train).to_pylist()
    for row in rows:
        truth = row["reward_model"]["ground_truth"]
        assert compute_score(row["response"], truth) == 1.0
        assert compute_score(row["prompt"][0]["content"] + row["response"], truth, strict=True) == 1.0
    data = load_sft(train, tok, sft_config(train))
    rl_prompts, _ = tokenize_rows(train, tok, 256)
    assert data.format == "single" and data.prompts == rl_prompts
    for row, response, mask in zip(rows, data.responses, data.loss_masks):
        assert response[-1] == tok.eos_token_id and set(mask) == {1}
        assert tok.decode(response, skip_special_tokens=True) == row["response"]


def test_multiturn_loss_mask_covers_exactly_the_assistant_turns(tmp_path, chat_tok):
    from tinyrl.sft.data import load_sft

    for as_json in (False, True):  # tools and messages as list columns, or as JSON text (verl writes both)
        path = multiturn_file(tmp_path / f"chat{as_json}.parquet", rows=1, tools_as_json=as_json)
        tok = chat_tok
        data = load_sft(path, tok, sft_config(path))
        ids = data.prompts[0] + data.responses[0]
        mask = [0] * len(data.prompts[0]) + data.loss_masks[0]
        full = tok.apply_chat_template(CONVERSATION, tools=[{"name": "calculator"}], tokenize=False)
        assert tok.decode(ids) == full  # nothing lost or added
        trained = tok.decode([t for t, m in zip(ids, mask) if m])
        assert trained == "".join(ASSISTANT_TEXTS)  # both replies with their end-of-turn, nothing else
        assert "Tools: calculator" in tok.decode(data.prompts[0])  # the tools reached the template
        assert data.format == "multiturn" and not data.loss_masks[0][-1]  # the last user turn is not trained


def test_an_assistant_first_conversation_trains_the_reply_not_the_template_opening(tmp_path, chat_tok):
    from tinyrl.sft.data import load_sft

    opening = "<|im_start|>system\nDefault.<|im_end|>\n"  # as Qwen's template adds a default system turn
    tok = chat_tok.__class__.from_pretrained(chat_tok.name_or_path)
    tok.chat_template = "{% if messages[0]['role'] != 'system' %}" + opening + "{% endif %}" + TEMPLATE
    path = tmp_path / "a.parquet"
    pq.write_table(pa.Table.from_pylist([{"messages": CONVERSATION[2:5]}]), path)
    data = load_sft(path, tok, sft_config(path))
    trained = tok.decode([t for t, m in zip(data.responses[0], data.loss_masks[0]) if m])
    assert trained == "".join(ASSISTANT_TEXTS)
    assert tok.decode(data.prompts[0]) == opening + "<|im_start|>assistant\n"


def test_a_template_that_groups_tool_messages_masks_only_the_assistant(tmp_path, chat_tok):
    """Qwen2.5's layout for tools: consecutive tool results share one user turn, closed after the
    last, so the text of the first k messages is not a prefix of k + 1 between assistant turns."""
    from tinyrl.sft.data import load_sft

    tok = chat_tok.__class__.from_pretrained(chat_tok.name_or_path)
    tok.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'tool' %}"
        "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}<|im_start|>user{% endif %}"
        "\n<tool_response>{{ m['content'] }}</tool_response>"
        "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}<|im_end|>\n{% endif %}"
        "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    conversation = [{"role": "user", "content": "Add 3 and 5, then 2 and 2."},
                    {"role": "assistant", "content": "<call> 3 + 5 </call><call> 2 + 2 </call>"},
                    {"role": "tool", "content": "8"}, {"role": "tool", "content": "4"},
                    {"role": "assistant", "content": "<answer> 8 and 4 </answer>"}]
    path = tmp_path / "tools.parquet"
    pq.write_table(pa.Table.from_pylist([{"messages": conversation}]), path)
    data = load_sft(path, tok, sft_config(path))
    ids, mask = data.prompts[0] + data.responses[0], [0] * len(data.prompts[0]) + data.loss_masks[0]
    assert tok.decode(ids) == tok.apply_chat_template(conversation, tokenize=False)
    trained = tok.decode([t for t, m in zip(ids, mask) if m])
    assert trained == "".join(m["content"] + "<|im_end|>\n" for m in conversation if m["role"] == "assistant")


# Two tools with different parameters, and a call of each: in a list column parquet stores them
# as structs holding every key of every row, so what reads back is filled with None.
TOOL_SCHEMAS = [{"type": "function", "function": {"name": "code_interpreter", "description": "Run Python.",
                 "parameters": {"type": "object", "properties": {"code": {"type": "string"}}}}},
                {"type": "function", "function": {"name": "web_search", "description": "Search.",
                 "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                                "required": ["query"]}}}]


def _calling(name: str, arguments: dict) -> list[dict]:
    return [{"role": "user", "content": "Go."},
            {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": name, "arguments": arguments}}]},
            {"role": "tool", "content": "done"}, {"role": "assistant", "content": "<answer>1</answer>"}]


def test_tool_calls_and_schemas_from_parquet_render_without_other_rows_keys(tmp_path, tiny_model_dir):
    from tinyrl.setup import load_tokenizer
    from tinyrl.sft.data import load_sft

    tok = load_tokenizer(str(tiny_model_dir), "presets/chat_templates/tiny-hermes.jinja")
    path = tmp_path / "calls.parquet"
    pq.write_table(pa.Table.from_pylist([
        {"messages": _calling("code_interpreter", {"code": "print(1)"}), "tools": TOOL_SCHEMAS},
        {"messages": _calling("web_search", {"query": "cats"}), "tools": TOOL_SCHEMAS}]), path)
    data = load_sft(path, tok, sft_config(path, "sft.max_length=400"))
    search = tok.decode(data.prompts[1] + data.responses[1])
    assert '{"name": "web_search", "arguments": {"query": "cats"}}' in search  # no "code": null trained
    assert "code_interpreter(code): Run Python.\nweb_search(query): Search." in search  # no other's parameters
    assert '"arguments": {"code": "print(1)"}}' in tok.decode(data.prompts[0] + data.responses[0])


def test_tools_that_are_not_a_list_or_a_template_that_raises_say_what_to_fix(tmp_path, chat_tok):
    from tinyrl.sft.data import load_sft

    path = tmp_path / "one-schema.parquet"  # one schema as JSON, not inside a list
    pq.write_table(pa.Table.from_pylist([{"messages": CONVERSATION, "tools": json.dumps(TOOL_SCHEMAS[0])}]), path)
    with pytest.raises(TinyRLError) as got:
        load_sft(path, chat_tok, sft_config(path))
    assert "row 0" in got.value.message and "tools is not a list of tool schemas" in got.value.message
    assert "inside a list" in got.value.hint
    tok = chat_tok.__class__.from_pretrained(chat_tok.name_or_path)
    tok.chat_template = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}" + TEMPLATE
    path = multiturn_file(tmp_path / "system-first.parquet", rows=1)
    with pytest.raises(TinyRLError) as got:  # was transformers' traceback, exit 1
        load_sft(path, tok, sft_config(path))
    assert "chat template cannot render" in got.value.message and "user first" in got.value.message


def test_sharegpt_or_capitalised_roles_are_named_not_left_untrained(tmp_path, chat_tok):
    from tinyrl.sft.data import load_sft

    for roles, said in ((("human", "gpt"), "messages[0] has the role 'human'"),
                        (("user", "Assistant"), "messages[1] has the role 'Assistant'")):
        path = tmp_path / f"{roles[0]}.parquet"
        conversation = [{"role": roles[0], "content": "Hi"}, {"role": roles[1], "content": "Hello"},
                        {"role": "user", "content": "Bye"}, {"role": "assistant", "content": "Bye"}]
        pq.write_table(pa.Table.from_pylist([{"messages": conversation}]), path)
        with pytest.raises(TinyRLError) as got:  # the first turn went untrained (or human/gpt: "no assistant")
            load_sft(path, chat_tok, sft_config(path))
        assert said in got.value.message and "gpt -> assistant" in got.value.hint


def test_single_turn_with_the_chat_template_renders_prompts_as_train_does(sft_files, chat_tok):
    from tinyrl.setup import tokenize_rows
    from tinyrl.sft.data import load_sft

    train, _ = sft_files
    data = load_sft(train, chat_tok, sft_config(train, "data.chat_template=true"))
    assert data.prompts == tokenize_rows(train, chat_tok, 512, chat=True)[0]
    assert chat_tok.decode(data.prompts[0]).endswith("<|im_end|>\n<|im_start|>assistant\n")


def test_the_loss_equals_transformers_own_loss_over_the_same_labels(tmp_path, tiny_model_dir, chat_tok, sft_files):
    """The trainer's loss on a padded batch (single- and multi-turn) is transformers' causal-LM
    loss with every non-trained label set to -100: an independent computation."""
    from tinyrl.models import PolicyModels
    from tinyrl.sft.data import load_sft
    from tinyrl.learners import sft_loss_fn

    chat = multiturn_file(tmp_path / "chat.parquet", rows=2)
    cfg = sft_config(chat, f"model.custom_chat_template={json.dumps(TEMPLATE)}")
    models = PolicyModels(cfg.model, str(tiny_model_dir), torch.device("cpu"), actor_only=True)
    with torch.no_grad():
        for p in models.actor_parameters():  # a non-zero adapter, so the actor is not the base
            p.normal_(0, 0.05)
    models.train(False)
    tok = chat_tok
    for path in (sft_files[0], chat):
        data = load_sft(path, tok, cfg)
        part = data.batch(list(range(min(5, len(data)))), tok.pad_token_id)
        with models.role(Role.ACTOR), torch.no_grad():
            ours, _ = sft_loss_fn()(models, part)
            R = part.batch.response_len
            labels = torch.full_like(part.batch.input_ids, -100)
            labels[:, -R:] = torch.where(part.mask.bool(), part.batch.input_ids[:, -R:], -100)
            theirs = models.actor(input_ids=part.batch.input_ids, attention_mask=part.batch.attention_mask,
                                  position_ids=part.batch.position_ids, labels=labels).loss
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


def test_changing_tokens_outside_the_assistant_turns_leaves_the_loss_alone(tmp_path, tiny_model_dir, chat_tok):
    """Tokens the loss does not train on, after the last trained one (the closing user turn, the
    padding), cannot change the loss; a token inside an assistant turn does (the mutation check)."""
    from tinyrl.models import PolicyModels
    from tinyrl.sft.data import load_sft
    from tinyrl.learners import sft_loss_fn

    chat = multiturn_file(tmp_path / "chat.parquet", rows=2)
    cfg = sft_config(chat, f"model.custom_chat_template={json.dumps(TEMPLATE)}")
    models = PolicyModels(cfg.model, str(tiny_model_dir), torch.device("cpu"), actor_only=True)
    models.train(False)
    tok = chat_tok
    data = load_sft(chat, tok, cfg)
    part = data.batch([0, 1], tok.pad_token_id)

    def loss_of(p):
        with models.role(Role.ACTOR), torch.no_grad():
            return float(sft_loss_fn()(models, p)[0])

    base = loss_of(part)
    last_trained = int(part.mask[0].nonzero().max())
    outside = part.rows(slice(0, 2))
    R = part.batch.response_len
    outside.batch.input_ids = part.batch.input_ids.clone()
    outside.batch.input_ids[0, -R + last_trained + 1:] = tok.convert_tokens_to_ids("<|im_start|>")
    assert loss_of(outside) == pytest.approx(base, abs=1e-6)
    inside = part.rows(slice(0, 2))
    inside.batch.input_ids = part.batch.input_ids.clone()
    first_trained = int(part.mask[0].nonzero().min())
    inside.batch.input_ids[0, -R + first_trained + 1] = tok.convert_tokens_to_ids("<|im_start|>")
    assert abs(loss_of(inside) - base) > 1e-3


# ------------------------------------------------------------------ the trainer


def test_a_packed_sft_micro_batch_holds_no_more_rows_than_the_plan_priced(tmp_path, sft_files):
    """The plan prices b rows of sft.max_length tokens; packed, short rows would fit many more
    into the same token budget, each with its [rows, width] tensors: capped as the RL trainer's."""
    from tinyrl.sft.trainer import SFTTrainer

    cfg = sft_config(sft_files[0])
    cfg.actor.micro_batch_tokens = 2 * cfg.sft.max_length
    trainer = SFTTrainer(cfg, tmp_path / "run")
    short = [10] * 8  # eight rows of 10 real tokens: 80 tokens, far under the budget
    slices = trainer.budgets.slices("actor_update", 8, cfg.sft.max_length, short)
    assert [s.stop - s.start for s in slices] == [2, 2, 2, 2]


@pytest.mark.parametrize("finetune", ["lora", "full"])
def test_every_trainable_tensor_gets_a_gradient_and_changes(tmp_path, sft_files, finetune):
    from tinyrl.sft.trainer import SFTTrainer

    # two steps: at the first, LoRA's A matrices get an exactly zero gradient (B starts at zero)
    trainer = SFTTrainer(sft_config(sft_files[0], f"model.finetune={finetune}"), tmp_path / "run")
    params = trainer.models.actor_parameters()
    before = [p.detach().clone() for p in params]
    grads = {}
    hooks = [p.register_hook(lambda g, i=i: grads.__setitem__(i, float(g.abs().sum()))) for i, p in enumerate(params)]
    trainer.train()
    for h in hooks:
        h.remove()
    names = [n for n, p in trainer.models.actor.named_parameters() if any(p is q for q in params)]
    assert len(params) == len(names) > 0
    assert [n for i, n in enumerate(names) if not grads.get(i)] == [], "tensors without a gradient at the last step"
    unchanged = [n for n, p, b in zip(names, params, before) if torch.equal(p.detach(), b)]
    assert unchanged == []
    if finetune == "lora":
        assert all(".actor." in n for n in names) and trainer.models.critic_backbone is None


def test_resume_equals_an_uninterrupted_run(tmp_path, sft_files):
    from tinyrl import checkpoint as ckpt
    from tinyrl import jsonl
    from tinyrl.sft.trainer import SFTTrainer

    train, test = sft_files
    sets = ["trainer.max_steps=4", "trainer.save_every=2", "trainer.test_every=2", f"data.test_path={test}",
            "data.max_test_prompts=16"]
    SFTTrainer(sft_config(train, *sets), tmp_path / "whole").train()
    SFTTrainer(sft_config(train, *sets), tmp_path / "halves").train(max_steps=2)
    SFTTrainer(sft_config(train, *sets), tmp_path / "halves", resume=True).train()
    a = jsonl.read_records(tmp_path / "whole" / "metrics.jsonl")
    b = jsonl.read_records(tmp_path / "halves" / "metrics.jsonl")
    assert [m["step"] for m in b] == [1, 2, 3, 4]
    assert [m["epoch"] for m in b] == [1, 1, 1, 1]  # 64 rows, 8 a step: steps 1-8 are epoch 1, counted from 1
    assert [m["run/process_step"] for m in b] == [1, 2, 1, 2]  # the resumed process's warm-up step is 3
    assert [m["data/rows_sha1"] for m in a] == [m["data/rows_sha1"] for m in b]
    assert [m.get("val/loss") for m in a] == pytest.approx([m.get("val/loss") for m in b], abs=1e-5)
    # It learns: the held-out loss falls, 3.479 -> 3.241 (-0.238) at steps 2 -> 4, the same to
    # every digit on 1 and 2 OpenMP threads (fixed data and seed, no timing in it): the margin is
    # five orders of magnitude above the float noise the thread count could add.
    assert a[-1]["val/loss"] < a[1]["val/loss"]
    final_a = ckpt.load_latest(tmp_path / "whole" / "checkpoints")
    final_b = ckpt.load_latest(tmp_path / "halves" / "checkpoints")
    assert set(final_a["models"]) == {"actor"}
    for name, tensor in final_a["models"]["actor"].items():
        torch.testing.assert_close(final_b["models"]["actor"][name], tensor, atol=1e-6, rtol=0)


def test_a_multiturn_file_trains(tmp_path):
    from tinyrl.sft.trainer import SFTTrainer

    chat = multiturn_file(tmp_path / "chat.parquet", rows=16)
    trainer = SFTTrainer(sft_config(chat, f"model.custom_chat_template={json.dumps(TEMPLATE)}", "trainer.max_steps=3",
                                    "actor.lr=1e-2"), tmp_path / "run")
    history = trainer.train()
    # 2.788 -> 2.300 over 3 steps, identical on 1 and 2 OpenMP threads: a 0.49 margin
    assert history[-1]["sft/loss"] < history[0]["sft/loss"]
    assert history[0]["sft/loss_tokens"] == 8 * sum(trainer.train_rows.loss_masks[0])  # assistant tokens only


def test_the_sft_presets_own_data_is_generated_on_first_use(tmp_path, monkeypatch):
    from tinyrl.sft.trainer import ensure_sft_data

    monkeypatch.chdir(tmp_path)  # the preset's relative path lands here
    cfg = load_config("countdown-tiny-sft", ["data.generate_train_size=32"])
    path = ensure_sft_data(cfg)
    assert path.absolute() == tmp_path / cfg.data.train_path
    table = pq.read_table(path)
    assert table.num_rows == 32 and "response" in table.column_names
    assert "response" in pq.read_table(path.parent / "test.parquet").column_names
    # no temporary left; the record of the settings that made them
    assert sorted(p.name for p in path.parent.iterdir()) == ["test.parquet", "train.parquet", "train.settings.json"]


def test_val_generate_scores_like_tinyrl_eval_on_the_same_prompts(tmp_path, sft_files):
    """sft.val_generate: val/score and val/reward_mean are `tinyrl eval`'s greedy figures for
    the run's checkpoint on the same prompts (the RL trainer's validation, reused)."""
    from tinyrl.eval import evaluate
    from tinyrl.sft.trainer import SFTTrainer

    train, test = sft_files
    run = tmp_path / "run"
    # 60 steps at 5e-3: 14-22 of the 24 greedy answers are in the format (reward 0.1 each; measured
    # on AVX-512, with AVX2 kernels and on 1 thread: the float kernels change the model). 12 steps,
    # enough on the machine this was first measured on, gave none on an AVX-512 one
    history = SFTTrainer(sft_config(train, "trainer.max_steps=60", "trainer.test_every=60", "sft.val_generate=true",
                                    f"data.test_path={test}", "data.max_test_prompts=24", "actor.lr=5e-3"), run).train()
    last = history[-1]
    pq.write_table(pq.read_table(test).slice(0, 24), tmp_path / "first24.parquet")
    # On the device the run validated on (sft_config: trainer.device=cpu, fp32). eval's `auto` took
    # a GPU when there was one, bf16 there: on an H100 that model greedily put 21 answers in the
    # format where the run's fp32 one put 22 (0.0875 vs 0.0917), the code being the same. What is
    # checked: the same prompts, response limit, stop tokens and scoring, and the run's checkpoint
    # merged as trained, give the same figures; on CPU exactly (tinyrl/eval.py EVAL_DEVICES: why a
    # GPU can differ by a few answers even on one device)
    summary, out = evaluate(str(run), [str(tmp_path / "first24.parquet")], n=0, engine="hf", progress=False,
                            device="cpu")
    assert summary["device"] == "cpu"
    samples = [json.loads(line) for line in (out / "eval_samples.jsonl").read_text().splitlines()]
    assert last["val/score"] == summary["files"]["first24"]["greedy_acc"]
    assert last["val/reward_mean"] == pytest.approx(sum(s["reward"] for s in samples) / len(samples))
    assert 0 < last["val/reward_mean"]  # some answers in the format: the comparison is not 0 == 0


# ------------------------------------------------------------------ model.init_from


@pytest.mark.parametrize("finetune", ["lora", "full"])
def test_rl_from_an_sft_run_has_the_sft_model_as_reference_and_start(tmp_path, sft_files, countdown_train, finetune):
    """verl's recipe: the RL reference (adapters off) and the RL actor at step 0 are the SFT model."""
    from tinyrl.models import make_batch
    from tinyrl.sft.trainer import SFTTrainer
    from tinyrl.trainer import Trainer

    sft = SFTTrainer(sft_config(sft_files[0], f"model.finetune={finetune}", "actor.lr=1e-2"), tmp_path / "sft")
    sft.train()
    rl_sets = [f"data.train_path={countdown_train(64)}", "trainer.train_batch_size=8", "actor.ppo_mini_batch_size=8",
               "trainer.test_every=0", "trainer.device=cpu"]
    rl_cfg = load_config("countdown-tiny", [*rl_sets, f"model.init_from={tmp_path / 'sft'}"])
    rl = Trainer(rl_cfg, tmp_path / "rl")
    batch = make_batch([[5, 6, 7, 8, 9]], [[10, 11, 12, 13]], pad_id=0)
    with torch.no_grad():
        sft.models.train(False)
        rl.models.train(False)
        with sft.models.role(Role.ACTOR):
            sft_lp = sft.models.token_logprobs(Role.ACTOR, batch)
        with rl.models.role(Role.ACTOR):
            actor_lp = rl.models.token_logprobs(Role.ACTOR, batch)
        ref_lp = rl.models.token_logprobs(Role.REFERENCE, batch)
        base = Trainer(load_config("countdown-tiny", rl_sets), tmp_path / "base")
        base_lp = base.models.token_logprobs(Role.REFERENCE, batch)
    torch.testing.assert_close(ref_lp, sft_lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(actor_lp, sft_lp, atol=1e-5, rtol=1e-5)
    assert (ref_lp - base_lp).abs().max() > 1e-2  # SFT moved the model: the check can fail
    # The SFT run trains on; a resumed RL run keeps the starting model (and reference) it began with.
    sft.train(max_steps=3)
    marker = tmp_path / "rl" / "init_model" / "tinyrl_export.json"
    assert json.loads(marker.read_text())["step"] == 2
    resumed = Trainer(rl_cfg, tmp_path / "rl", resume=True)
    assert json.loads(marker.read_text())["step"] == 2
    with torch.no_grad():
        torch.testing.assert_close(resumed.models.token_logprobs(Role.REFERENCE, batch), sft_lp, atol=1e-5, rtol=1e-5)
    # With checkpoints, a lost starting model is not silently rebuilt from the source's newer step.
    resumed.save()
    shutil.rmtree(tmp_path / "rl" / "init_model")
    with pytest.raises(TinyRLError, match="starting model .* is missing"):
        Trainer(rl_cfg, tmp_path / "rl", resume=True)


# ------------------------------------------------------------------ errors users see


def test_bad_sft_input_is_one_screen_and_exit_2(tmp_path, monkeypatch, capsys, countdown_train):
    run = tmp_path / "run"
    base = ["sft", "--preset", "countdown-tiny-sft", "--out", str(run), "--no-dashboard",
            "--set", "trainer.test_every=0", "--set", "trainer.train_batch_size=8"]
    # an RL prompt file: no response column
    code, err = cli(monkeypatch, capsys, *base, "--set", f"data.train_path={countdown_train(64)}")
    assert code == 2 and "has no columns prompt + response or messages" in err and "what to do" in err
    # multi-turn without a chat template
    chat = multiturn_file(tmp_path / "chat.parquet")
    code, err = cli(monkeypatch, capsys, *base, "--set", f"data.train_path={chat}")
    assert code == 2 and "this tokenizer has none" in err and "model.custom_chat_template" in err
    # too long
    code, err = cli(monkeypatch, capsys, *base, "--set", f"data.train_path={chat}", "--set", "sft.max_length=8",
                    "--set", f"model.custom_chat_template={json.dumps(TEMPLATE)}")
    assert code == 2 and "longer than sft.max_length = 8" in err and "row 0" in err
    # several config problems at once, before anything loads
    code, err = cli(monkeypatch, capsys, *base, "--set", "sft.format=chat", "--set", f"model.init_from={tmp_path}",
                    "--set", "sft.max_length=0")
    assert code == 2 and "sft.format = 'chat'" in err and "is not a run directory" in err
    assert "sft.max_length = 0" in err
    # a mistyped SFT data path: the hint makes an SFT file (`--sft`), not an RL prompt file
    code, err = cli(monkeypatch, capsys, *base, "--set", f"data.train_path={tmp_path / 'typo.parquet'}")
    assert code == 2 and "file not found" in err and "--sft --out DIR`" in err, err
    assert not (run / "metrics.jsonl").exists()
    # fewer rows than one batch: said before the model loads (was: after), like RL's prompts
    import tinyrl.sft.trainer

    monkeypatch.setattr(tinyrl.sft.trainer, "PolicyModels", None)  # a load would raise TypeError
    code, err = cli(monkeypatch, capsys, *base[:-2], "--set", f"data.train_path={chat}", "--set",  # base[-2:]: its batch
                    f"model.custom_chat_template={json.dumps(TEMPLATE)}", "--set", "trainer.train_batch_size=16")
    assert code == 2 and "the training data has 8 rows, fewer than one batch" in err, err


def test_a_users_conversations_in_jsonl_or_as_the_scored_test_file_say_what_to_set(tmp_path, monkeypatch, capsys):
    """Two walls a user's own chat data met with hints about Countdown files: JSON lines (the
    hint's one-line conversion must itself work), and a conversation file as data.test_path under
    the preset's sft.val_generate = true (the way out is that switch)."""
    import re
    import subprocess
    import sys

    from tinyrl.sft.data import load_sft

    parquet = multiturn_file(tmp_path / "made.parquet")
    jsonl = tmp_path / "chat.jsonl"
    pq.read_table(parquet).to_pandas().to_json(jsonl, orient="records", lines=True)
    run = tmp_path / "run"
    base = ["sft", "--preset", "countdown-tiny-sft", "--out", str(run), "--no-dashboard", "--max-steps", "1",
            "--set", f"model.custom_chat_template={json.dumps(TEMPLATE)}", "--set", "trainer.train_batch_size=8"]
    code, err = cli(monkeypatch, capsys, *base, "--set", f"data.train_path={jsonl}", "--set", "trainer.test_every=0")
    assert code == 2 and "tinyrl reads parquet" in err and "chat.parquet" in err, err
    with pytest.raises(TinyRLError) as info:
        load_sft(jsonl, None, sft_config(jsonl))
    command = re.search(r'python -c "(.*?)"', info.value.hint).group(1)
    subprocess.run([sys.executable, "-c", command], check=True)
    converted = tmp_path / "chat.parquet"
    assert pq.read_table(converted).column_names == ["messages", "tools"]
    assert info.value.message == f"{jsonl} is a JSON-lines file; tinyrl reads parquet"  # not Arrow's words
    with pytest.raises(TinyRLError) as info:  # chat.parquet is there now: the hint writes beside it
        load_sft(jsonl, None, sft_config(jsonl))
    assert f"to_parquet('{tmp_path / 'chat-converted.parquet'}')" in info.value.hint, info.value.hint
    assert f"'{converted}'" not in info.value.hint
    code, err = cli(monkeypatch, capsys, *base, "--set", f"data.train_path={converted}",
                    "--set", f"data.test_path={converted}")  # the preset samples its test prompts
    assert code == 2 and "sft.val_generate = true" in err and "--set sft.val_generate=false" in err, err
    assert not (run / "metrics.jsonl").exists()
    code, err = cli(monkeypatch, capsys, *base, "--set", f"data.train_path={converted}",
                    "--set", f"data.test_path={converted}", "--set", "sft.val_generate=false")
    assert code == 0, err
    assert "val/loss" in (run / "metrics.jsonl").read_text()


def test_a_missing_start_that_a_preset_makes_names_the_command(tmp_path, monkeypatch):
    """The demos chain presets (countdown-demo-sft -> countdown-tools-demo-sft -> ...): a skipped
    step's error says which command writes the missing run directory; other paths (a preset's
    name outside trainer.out_dir too) keep the generic advice."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TinyRLError) as err:
        load_config("countdown-tools-demo-sft")
    assert "`tinyrl sft --preset countdown-demo-sft` writes: run that first" in str(err.value)
    with pytest.raises(TinyRLError) as err:
        load_config("countdown-tiny", ["model.init_from=runs/countdown-tiny"])
    assert "`tinyrl train --preset countdown-tiny` writes" in str(err.value)
    with pytest.raises(TinyRLError) as err:
        load_config("countdown-tiny", [f"model.init_from={tmp_path / 'elsewhere' / 'countdown-tiny'}"])
    assert "give the --out directory" in str(err.value) and "run that first" not in str(err.value)


def test_a_mistyped_init_from_names_the_run_beside_it(tmp_path, monkeypatch):
    """A walk of "SFT, then RL": `--set model.init_from=runs/sfft` (runs/sft made by the SFT
    step) said only "is not a run directory (no config.json)", as of a directory that exists."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "sft").mkdir(parents=True)
    (tmp_path / "runs" / "sft" / "config.json").write_text(json.dumps({"trainer": {}, "model": {}}))
    (tmp_path / "runs" / "sfx").mkdir()  # a near name that is no run: not suggested
    with pytest.raises(TinyRLError) as err:
        load_config("countdown-tiny", ["model.init_from=runs/sfft"])
    assert "model.init_from = runs/sfft is not a run directory (no such directory); did you mean runs/sft?" \
        in err.value.message
    (tmp_path / "runs" / "empty").mkdir()
    with pytest.raises(TinyRLError) as err:
        load_config("countdown-tiny", ["model.init_from=runs/empty"])
    assert "runs/empty is not a run directory (no config.json); give the --out directory" in err.value.message


def test_init_from_a_run_on_another_base_is_refused(tmp_path):
    (tmp_path / "src" / "checkpoints").mkdir(parents=True)
    (tmp_path / "src" / "config.json").write_text(json.dumps({"model": {"name": "Qwen/Qwen2.5-0.5B"}}))
    with pytest.raises(TinyRLError) as exc:
        load_config("countdown-tiny", [f"model.init_from={tmp_path / 'src'}"])
    assert "was trained on Qwen/Qwen2.5-0.5B" in exc.value.message and "no checkpoint yet" in exc.value.message


def test_a_tool_message_with_no_call_before_it_is_counted_for_the_start_note(tmp_path, tiny_model_dir):
    """A tool message after a turn that called nothing (a converter dropped the call) was trained
    in silence: counted per file and said at the start. A call is tool_calls or the tool demo's
    hermes <tool_call> text; a row opening with a tool's output (the demo's drills) is not one."""
    from tinyrl.setup import load_tokenizer
    from tinyrl.sft.data import load_sft, schemas_note, tool_without_call_note
    from tinyrl.tasks.arith import sft_messages

    tok = load_tokenizer(str(tiny_model_dir), "presets/chat_templates/tiny-hermes.jinja")
    calling, answer = _calling("code_interpreter", {"code": "print(1)"}), {"role": "assistant", "content": "2"}
    rows = [calling,                                                                 # 0 tool_calls
            sft_messages(3, 4, "tool", "5"), sft_messages(3, 4, "drill", "5"),      # 1, 2 the demo's
            [calling[0], {"role": "assistant", "content": "Let me check."}, calling[2], answer],   # 3
            [calling[0], calling[2], answer],                                        # 4 no turn between
            calling[:3] + [calling[2], answer],                                      # 5 two outputs, one call
            calling + [calling[2], answer]]                                          # 6 the second one
    path = tmp_path / "tools.parquet"
    pq.write_table(pa.Table.from_pylist([{"messages": m, "tools": TOOL_SCHEMAS} for m in rows]), path)
    got = load_sft(path, tok, sft_config(path, "sft.max_length=400"))
    assert got.tool_without_call == [3, 4, 6]
    assert tool_without_call_note(got, path).startswith(
        f"3 of 7 conversations in {path} have a tool message with no call before it (rows 3, 4, 6, counting from 0)")
    shipped = REPO_ROOT / "data/countdown-tools-demo/sft_test.parquet"  # drills and tool traces: nothing to say
    demo = load_sft(shipped, tok, sft_config(shipped, "sft.max_length=400"))
    assert tool_without_call_note(demo, shipped) is None
    assert schemas_note(demo, shipped, "tools") is None  # drills list no tools and call none
    from tinyrl.sft.trainer import SFTTrainer  # and the run says it when it starts

    trainer = SFTTrainer(sft_config(path, "sft.max_length=400", "trainer.train_batch_size=7",
                                    "model.custom_chat_template=presets/chat_templates/tiny-hermes.jinja"), tmp_path / "r")
    assert tool_without_call_note(got, path) in trainer.notices


def test_a_tools_key_set_by_hand_must_name_a_column(tmp_path, chat_tok):
    """sft.tools_key=tool_schemas on a file whose column is `tools`: every row's schemas were
    dropped without a word (the default column may be absent: conversations without tools)."""
    from tinyrl.sft.data import load_sft

    path = multiturn_file(tmp_path / "chat.parquet", rows=1)
    with pytest.raises(TinyRLError) as got:
        load_sft(path, chat_tok, sft_config(path, "sft.tools_key=tool_schemas"))
    assert "has no column tool_schemas (sft.tools_key)" in got.value.message and "tools" in got.value.message
    plain = tmp_path / "plain.parquet"
    pq.write_table(pa.Table.from_pylist([{"messages": CONVERSATION}]), plain)
    assert len(load_sft(plain, chat_tok, sft_config(plain))) == 1  # no tools column, default key: fine


def test_conversations_that_call_tools_without_schemas_are_counted_for_the_start_note(tmp_path, tiny_model_dir):
    """A tool call trained under a prompt that lists no tools (no `tools` column) is not what RL
    prompts show: counted per file, said at the start; rows with schemas, or without calls, are not."""
    from tinyrl.setup import load_tokenizer
    from tinyrl.sft.data import load_sft, schemas_note

    tok = load_tokenizer(str(tiny_model_dir), "presets/chat_templates/tiny-hermes.jinja")
    calling = _calling("code_interpreter", {"code": "print(1)"})
    path = tmp_path / "mixed.parquet"
    pq.write_table(pa.Table.from_pylist([{"messages": calling, "tools": None}, {"messages": calling, "tools": None},
                                         {"messages": calling, "tools": TOOL_SCHEMAS},
                                         {"messages": CONVERSATION, "tools": None},
                                         # the tool demo's drill: a tool's output and the answer, no call
                                         {"messages": [{"role": "tool", "content": "3"},
                                                       {"role": "assistant", "content": "<answer>3</answer>"}],
                                          "tools": None}]), path)
    rows = load_sft(path, tok, sft_config(path, "sft.max_length=400"))
    assert rows.calls_without_schemas == 2
    note = schemas_note(rows, path, "tools")
    assert note.startswith(f"2 of 5 conversations in {path} call tools but carry no tool schemas (column tools")
    plain = tmp_path / "plain.parquet"  # no tools column, no calls
    pq.write_table(pa.Table.from_pylist([{"messages": CONVERSATION}]), plain)
    assert schemas_note(load_sft(plain, tok, sft_config(plain)), plain, "tools") is None
    from tinyrl.sft.trainer import SFTTrainer  # and the run says it when it starts

    trainer = SFTTrainer(sft_config(path, "sft.max_length=400", "trainer.train_batch_size=4",
                                    "model.custom_chat_template=presets/chat_templates/tiny-hermes.jinja"), tmp_path / "r")
    assert note in trainer.notices
