"""Roles follow the algorithm (issue 30, item 3).

A critic-free estimator (GRPO, RLOO, REINFORCE++, ...) builds, optimises and checkpoints no
critic: no critic adapter, value head, model copy, optimizer or checkpoint tensor; under full
fine-tuning no reference copy either when no KL term reads it. PPO with GAE keeps all of it, and
each of its trained parts moves every step while the frozen base never does. One table
(tinyrl.roles) says which estimators exist and which need a critic; everything reads it.
"""

from __future__ import annotations

import pytest
import torch

from tinyrl import checkpoint as ckpt
from tinyrl import models as models_mod
from tinyrl.errors import TinyRLError
from tinyrl.config import CHOICES, load_config, problems_of, roles_of
from tinyrl.models import PolicyModels
from tinyrl.roles import ESTIMATORS, Role, run_roles
from tinyrl.trainer import Trainer

CRITIC_FREE = [name for name, e in ESTIMATORS.items() if not e.critic]


def _tiny(tmp_path, countdown_train, *extra: str):
    overrides = [f"data.train_path={countdown_train()}", "trainer.train_batch_size=4", "rollout.n=2",
                 "actor.ppo_mini_batch_size=2", "critic.ppo_mini_batch_size=2", "rollout.max_response_length=16",
                 "trainer.test_every=0", "trainer.save_every=0", "trainer.device=cpu", *extra]
    return load_config("countdown-tiny", overrides)


# ----------------------------------------------------------------------------- the one table

def test_every_module_reads_the_one_table_of_estimators():
    from tinyrl.export_verl.mapping import ADV
    from tinyrl.rl.advantages import ADVANTAGE_ESTIMATORS

    assert CHOICES["algorithm.adv_estimator"] == tuple(ESTIMATORS)
    assert set(ADVANTAGE_ESTIMATORS) == set(ESTIMATORS) == set(ADV)
    assert [n for n, e in ESTIMATORS.items() if e.critic] == ["gae"]


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_group_estimators_need_two_samples_per_prompt(name):
    cfg = load_config("countdown-tiny", [f"algorithm.adv_estimator={name}", "rollout.n=1"], check=False)
    complaint = any("rollout.n must be at least 2" in p for p in problems_of(cfg))
    assert complaint == ESTIMATORS[name].grouped


def test_the_roles_of_a_run():
    assert run_roles("gae", uses_kl=True) == {Role.ACTOR, Role.CRITIC, Role.REFERENCE}
    assert run_roles("grpo", uses_kl=True) == {Role.ACTOR, Role.REFERENCE}
    assert run_roles("rloo", uses_kl=False) == {Role.ACTOR}
    cfg = load_config("countdown-grpo-4090", check=False)  # KL as a loss: the reference stays
    assert roles_of(cfg) == {Role.ACTOR, Role.REFERENCE}
    assert roles_of(load_config("math-grpo-4090", check=False)) == {Role.ACTOR}  # DAPO: no KL at all
    assert Role.CRITIC in roles_of(load_config("countdown-tiny"))


# ----------------------------------------------------------------------------- what is built

class _Counts:
    """Model copies loaded, value heads made and LoRA adapters added while PolicyModels builds."""

    def __init__(self, monkeypatch):
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        self.loads, self.heads, self.adapters = 0, 0, []
        load, head_init, add = AutoModelForCausalLM.from_pretrained, models_mod.ValueHead.__init__, PeftModel.add_adapter

        def counted_load(*a, **k):
            self.loads += 1
            return load(*a, **k)

        def counted_head(obj, *a, **k):
            self.heads += 1
            head_init(obj, *a, **k)

        def counted_add(obj, name, *a, **k):
            self.adapters.append(name)
            return add(obj, name, *a, **k)

        monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", counted_load)
        monkeypatch.setattr(models_mod.ValueHead, "__init__", counted_head)
        monkeypatch.setattr(PeftModel, "add_adapter", counted_add)


def _parameter_names(models: PolicyModels) -> list[str]:
    mods = [m for m in (models.actor, models.critic_backbone, models.reference, models.value_head) if m is not None]
    return [n for m in {id(m): m for m in mods}.values() for n, _ in m.named_parameters()]


@pytest.mark.parametrize("finetune", ["lora", "full"])
@pytest.mark.parametrize("roles, copies_full", [
    (frozenset({Role.ACTOR, Role.REFERENCE}), 2),   # GRPO with a KL loss
    (frozenset({Role.ACTOR}), 1),                   # GRPO without KL (DAPO)
])
def test_a_critic_free_run_builds_no_critic(tiny_model_dir, monkeypatch, finetune, roles, copies_full):
    cfg = load_config("countdown-tiny", [f"model.finetune={finetune}"]).model
    counts = _Counts(monkeypatch)
    models = PolicyModels(cfg, str(tiny_model_dir), torch.device("cpu"), roles=roles)
    assert counts.loads == (copies_full if finetune == "full" else 1)
    assert counts.heads == 0 and "critic" not in counts.adapters
    assert models.value_head is None and models.critic_backbone is None and models.critic_parameters() == []
    assert not [n for n in _parameter_names(models) if "critic" in n]
    assert set(models.trainable_state()) == {"actor"}
    with pytest.raises(ValueError, match="no critic"):
        with models.role(Role.CRITIC):
            pass


@pytest.mark.parametrize("finetune", ["lora", "full"])
def test_ppo_builds_every_role(tiny_model_dir, monkeypatch, finetune):
    cfg = load_config("countdown-tiny", [f"model.finetune={finetune}"]).model
    counts = _Counts(monkeypatch)
    models = PolicyModels(cfg, str(tiny_model_dir), torch.device("cpu"), roles=frozenset(Role))
    assert counts.loads == (3 if finetune == "full" else 1) and counts.heads == 1
    assert set(models.trainable_state()) == {"actor", "critic", "value_head"}
    assert models.critic_parameters()


def test_a_role_is_passed_as_a_role_not_its_string(tiny_model_dir):
    """One name per role: models.role and token_logprobs take Role members; a string (a
    caller's typo, or a name that is only equal to a role's value) is refused, saying what to pass."""
    from tinyrl.models import make_batch

    cfg = load_config("countdown-tiny").model
    models = PolicyModels(cfg, str(tiny_model_dir), torch.device("cpu"), roles=frozenset(Role))
    batch = make_batch([[5, 6, 7]], [[10, 11]], pad_id=0)
    for name in ("critic", "actor", "reference", Role.REFERENCE):
        with pytest.raises(ValueError, match=r"pass Role\.ACTOR or Role\.CRITIC"):
            with models.role(name):
                pass
    for name in ("actor", "reference", Role.CRITIC):
        with pytest.raises(ValueError, match=r"pass Role\.ACTOR or Role\.REFERENCE"), torch.no_grad():
            models.token_logprobs(name, batch)
    with torch.no_grad(), models.role(Role.CRITIC):
        assert models.values(batch).shape == (1, 2)
    with torch.no_grad():
        assert models.token_logprobs(Role.REFERENCE, batch).shape == (1, 2)


def test_the_critic_adapter_learns_from_its_first_backward(tiny_model_dir):
    """The value head starts as verl's (N(0, initializer_range)), not at zero: with a zero head and
    peft's zero LoRA B the critic adapter's gradient is exactly 0 until the head has grown (the
    critic starts as a linear probe of the base's last hidden state; README, the PPO demo). Two
    builds give the same head (its own seeded generator)."""
    from tinyrl.models import make_batch

    cfg = load_config("countdown-tiny", ["model.padding_free=false"]).model
    models = PolicyModels(cfg, str(tiny_model_dir), torch.device("cpu"), roles=frozenset(Role))
    w = models.value_head.proj.weight
    assert 0.01 < float(w.detach().std()) < 0.03 and float(models.value_head.proj.bias.detach()) == 0.0  # range 0.02
    again = PolicyModels(cfg, str(tiny_model_dir), torch.device("cpu"), roles=frozenset(Role))
    assert torch.equal(again.value_head.proj.weight, w)
    batch = make_batch([[5, 6, 7], [5, 6, 7, 8]], [[10, 11, 12], [13]], pad_id=0)
    models.train(True)
    with models.role(Role.CRITIC):
        models.values(batch).sum().backward()
    named = dict(models.actor.named_parameters())
    lora_b = {n: p.grad for n, p in named.items() if ".critic." in n and "lora_B" in n}
    assert lora_b and all(g is not None and g.abs().sum() > 0 for g in lora_b.values()), \
        [n for n, g in lora_b.items() if g is None or not g.abs().sum() > 0]


# ----------------------------------------------------------------------------- a GRPO run

@pytest.mark.parametrize("finetune", ["lora", "full"])
def test_a_grpo_run_never_builds_a_critic_and_saves_none(tmp_path, countdown_train, monkeypatch, finetune):
    # no KL at all: under full fine-tuning the run's ONE model copy is the actor
    cfg = _tiny(tmp_path, countdown_train, "algorithm.adv_estimator=grpo", f"model.finetune={finetune}",
                "algorithm.kl_in_reward=false", "algorithm.use_kl_loss=false", "trainer.max_steps=2")
    counts = _Counts(monkeypatch)
    trainer = Trainer(cfg, tmp_path / "run")
    history = trainer.train()
    assert counts.loads == 1 and counts.heads == 0 and "critic" not in counts.adapters
    assert set(trainer.learners) == {"actor"} and "critic_update" not in map(str, trainer.budgets.budgets)
    assert not [k for m in history for k in m if k.startswith("critic/") or "critic_update" in k]
    state = ckpt.load_latest(tmp_path / "run" / "checkpoints")
    assert state["step"] == 2
    assert set(state["models"]) == {"actor"} and set(state["learners"]) == {"actor"}
    # plain strings: a checkpoint names no tinyrl class (Role compares equal to its string)
    assert all(type(k) is str for part in ("models", "learners") for k in state[part])
    assert set(state["budgets"]) == {"forward", "actor_update"}
    actor_tensors = sum(1 for v in state["models"]["actor"].values() if isinstance(v, torch.Tensor))
    assert actor_tensors == len(trainer.models.actor_parameters()) or finetune == "full"


def test_a_critic_free_resume_ignores_an_old_checkpoints_critic(tmp_path, countdown_train):
    """A GRPO checkpoint written by an older tinyrl (which built a critic adapter and a value
    head whatever the algorithm): accepted, its critic tensors ignored, and the user told."""
    cfg = _tiny(tmp_path, countdown_train, "algorithm.adv_estimator=grpo", "trainer.max_steps=1")
    run = tmp_path / "run"
    first = Trainer(cfg, run)
    first.train()
    state = first.state()
    actor = {k: v.clone() for k, v in state["models"]["actor"].items()}
    state["models"]["critic"] = {k.replace("actor", "critic"): torch.randn_like(v) for k, v in actor.items()}
    state["models"]["value_head"] = {"proj.weight": torch.randn(1, 8), "proj.bias": torch.zeros(1)}
    state["budgets"]["critic_update"] = 4096
    for path in (run / "checkpoints").iterdir():
        ckpt.shutil.rmtree(path)
    assert ckpt.save_checkpoint(run / "checkpoints", 1, state, keep_last=2).saved

    resumed = Trainer(cfg, run, resume=True)
    assert resumed.step == 1 and resumed.models.value_head is None
    assert any("critic, value_head tensors are ignored" in n for n in resumed.notices), resumed.notices
    from peft import get_peft_model_state_dict

    now = get_peft_model_state_dict(resumed.models.actor, adapter_name="actor")
    for k, v in actor.items():
        torch.testing.assert_close(now[k], v, rtol=0, atol=0)
    assert "critic_update" not in map(str, resumed.budgets.budgets)


# ----------------------------------------------------------------------------- a PPO run

def _snapshot(models: PolicyModels) -> dict[str, dict[str, torch.Tensor]]:
    named = dict(models.actor.named_parameters())
    return {
        "actor adapter": {n: p.detach().clone() for n, p in named.items() if ".actor." in n and "lora_" in n},
        "critic adapter": {n: p.detach().clone() for n, p in named.items() if ".critic." in n and "lora_" in n},
        "value head": {n: p.detach().clone() for n, p in models.value_head.named_parameters()},
        "base": {n: p.detach().clone() for n, p in named.items() if "lora_" not in n},
    }


def test_ppo_trains_actor_critic_and_value_head_every_step_and_never_the_base(tmp_path, countdown_train):
    # A reward with spread from step 1 on (countdown's is 0 for most of the tiny model's samples):
    # the returns and advantages are never all zero. Two mini-batches a step.
    (tmp_path / "spread.py").write_text("def score(completion, example):\n    return (len(completion) % 5) / 4\n")
    cfg = _tiny(tmp_path, countdown_train, "algorithm.adv_estimator=gae", "rollout.n=1", "trainer.max_steps=4",
                f"reward.fn={tmp_path / 'spread.py'}:score")
    trainer = Trainer(cfg, tmp_path / "run")
    before = _snapshot(trainer.models)
    assert before["critic adapter"] and before["actor adapter"]
    for step in range(1, 5):
        trainer.train_step()
        after = _snapshot(trainer.models)
        for part in ("actor adapter", "critic adapter", "value head"):
            moved = [n for n, t in after[part].items() if not torch.equal(t, before[part][n])]
            assert moved, f"step {step}: no tensor of the {part} changed"
        assert all(torch.equal(t, before["base"][n]) for n, t in after["base"].items()), f"step {step}: base moved"
        before = after


# ----------------------------------------------------------------------------- the memory plan

SMALL = dict(model_type="qwen2", vocab_size=32000, hidden_size=256, intermediate_size=704,
             num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
             tie_word_embeddings=True, max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=10000.0)
KW = dict(response_len=128, lora_rank=16, logprob_chunk=256)


@pytest.mark.usefixtures("plan_cache")
def test_a_critic_free_trace_holds_one_adapter_and_one_adam():
    from tinyrl.memory import formulas as fm
    from tinyrl.memory import simulate as sim

    lora = fm.lora_param_count(SMALL, 16)
    for phase in ("forward", "actor_update"):
        r = sim.simulate_phase(SMALL, phase, 2, 256, critic=False, **KW)
        assert r["adapters"] == 4 * lora                                  # the actor's adapter, fp32
        assert r["optimizer"] == pytest.approx(fm.adam_state_bytes(lora), rel=0.001)
        with_critic = sim.simulate_phase(SMALL, phase, 2, 256, critic=True, **KW)
        assert with_critic["adapters"] == 4 * (2 * lora + fm.value_head_params(SMALL))
        assert r["peak"] < with_critic["peak"]
    w = fm.weight_bytes(SMALL)
    full = sim.simulate_phase(SMALL, "actor_update", 2, 256, finetune="full", critic=False, reference=False, **KW)
    assert full["base_weights"] == pytest.approx(0, abs=0.001 * w)        # no reference copy, no critic copy
    assert full["adapters"] == pytest.approx(w, rel=0.001)                # the actor alone
    with pytest.raises(TinyRLError, match="without a critic"):
        sim.simulate_phase(SMALL, "critic_update", 2, 256, critic=False, **KW)


@pytest.mark.usefixtures("plan_cache")
def test_a_critic_free_plan_has_no_critic_phase_and_micro_batches_at_least_as_large():
    from tinyrl.hardware import get_gpu
    from tinyrl.memory import formulas as fm
    from tinyrl.memory.plan import build_plan

    kw = dict(gpu=get_gpu("rtx4090"), prompt_len=128, response_len=128, prompts_per_step=40, lora_rank=16,
              logprob_chunk=128, engine="hf",
              budget_bytes=fm.CUDA_CONTEXT_BYTES + fm.CUBLAS_WORKSPACES_BYTES + 150 * 2**20)
    before = build_plan(SMALL, critic=True, **kw)   # what main planned for GRPO: a critic's parts inside
    after = build_plan(SMALL, critic=False, **kw)
    assert "critic_update" in before.phases and "critic_update" not in after.phases
    for name in ("forward", "actor_update"):
        assert after.phases[name].micro_batch >= before.phases[name].micro_batch >= 1, name
    assert after.phases["forward"].micro_batch > before.phases["forward"].micro_batch  # here it gains
    for name in ("forward", "actor_update"):
        assert after.phases[name].parts["adapters"] < before.phases[name].parts["adapters"]
        assert after.phases[name].parts["optimizer"] < before.phases[name].parts["optimizer"]


@pytest.mark.usefixtures("plan_cache")
def test_probe_memory_json_of_a_grpo_run_has_no_critic_phase(monkeypatch, capsys):
    import json
    import sys

    from tinyrl.cli import main

    def probe(*sets: str) -> dict:
        args = [a for s in sets for a in ("--set", s)]
        monkeypatch.setattr(sys, "argv", ["tinyrl", "probe-memory", "--preset", "countdown-tiny", "--gpu", "rtx4090",
                                          "--simulate", "--json", *args])
        with pytest.raises(SystemExit) as exited:
            main()
        out = capsys.readouterr()
        assert not exited.value.code, out.err
        return json.loads(out.out)

    ppo = probe()
    grpo = probe("algorithm.adv_estimator=grpo", "rollout.n=2")
    assert "critic_update" in ppo["phases"] and "critic_update" not in grpo["phases"]
    for name in ("forward", "actor_update"):
        assert grpo["phases"][name]["parts"]["adapters"] < ppo["phases"][name]["parts"]["adapters"]


def test_doctor_has_no_critic_memory_row_for_a_critic_free_run():
    from tinyrl.doctor.cpu_memory import TensorPeaks, cpu_memory_rows

    def names(*sets: str) -> set[str]:
        cfg = load_config("countdown-tiny", list(sets), check=False)
        return {r.name for r in cpu_memory_rows(cfg, TensorPeaks(), "fp32")}

    assert "memory: critic_update" in names()
    assert "memory: critic_update" not in names("algorithm.adv_estimator=rloo", "rollout.n=2")
    assert "memory: actor_update" in names("algorithm.adv_estimator=rloo", "rollout.n=2")


def test_cost_and_checkpoint_size_count_a_critic_only_for_gae():
    from tinyrl.cost import roofline_for
    from tinyrl.hardware import get_gpu
    from tinyrl.memory import formulas as fm
    from tinyrl.model_specs import load_spec
    from tinyrl.preflight import checkpoint_bytes

    grpo = load_config("countdown-grpo-4090", check=False)
    gae = load_config("countdown-grpo-4090", ["algorithm.adv_estimator=gae"], check=False)
    assert "critic_update" not in roofline_for(grpo, get_gpu("rtx4090")).phases
    assert "critic_update" in roofline_for(gae, get_gpu("rtx4090")).phases
    spec = load_spec(grpo.model.name)
    lora = fm.lora_param_count(spec, grpo.model.lora_rank, tuple(grpo.model.lora_targets))
    # one fp32 adapter and its Adam (8 bytes/param); PPO adds the critic's adapter, head and Adam
    assert checkpoint_bytes(grpo, cuda=True) == int((4 * lora + fm.adam_state_bytes(lora)) * 1.05) + 2**20
    critic = lora + fm.value_head_params(spec)
    assert checkpoint_bytes(gae, cuda=True) - checkpoint_bytes(grpo, cuda=True) == pytest.approx(
        (4 * critic + fm.adam_state_bytes(critic)) * 1.05, abs=2)
