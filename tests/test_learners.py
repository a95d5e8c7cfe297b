"""Each trainable role trains exactly its own tensors — the invariant whose absence let the
critic's LoRA adapter sit at zero for a whole release while only its value head learned.

For actor and critic x LoRA / full fine-tuning x gradient checkpointing on / off (and bf16):
a few real learner updates (tinyrl.learners, the code the trainer runs) give every trainable
tensor of the role a non-zero gradient and change it, and change nothing else. With
checkpointing on, gradients equal those with it off (the recomputed forward must use the
role's adapter). And the learner's loss is tinyrl.rl.losses' actor_objective / value_loss fed
from the config, term by term: one code path for the loss.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tinyrl.config import load_config
from tinyrl.learners import actor_loss_fn, make_learners
from tinyrl.microbatch import BudgetKeeper
from tinyrl.models import PolicyModels, make_batch
from tinyrl.phases import Phase
from tinyrl.rl import losses
from tinyrl.roles import Role
from tinyrl.trajectory import Trajectory

ROLES = (Role.ACTOR, Role.CRITIC)


def _config(finetune: str, checkpointing: bool, dtype: str = "fp32", **extra):
    overrides = [f"model.finetune={finetune}", f"model.gradient_checkpointing={str(checkpointing).lower()}",
                 f"model.dtype={dtype}", "actor.lr=1e-2", "critic.lr=1e-2", "actor.ppo_mini_batch_size=0",
                 "critic.ppo_mini_batch_size=0", "actor.ppo_epochs=1", "critic.ppo_epochs=1",
                 "actor.entropy_coeff=0.01", "trainer.train_batch_size=4", "rollout.n=1",
                 "algorithm.kl_in_reward=false", "algorithm.use_kl_loss=true", "algorithm.kl_loss_coef=0.1",
                 *[f"{k}={v}" for k, v in extra.items()]]
    return load_config("countdown-tiny", overrides, check=False)


def _models(cfg, tiny_model_dir) -> PolicyModels:
    torch.manual_seed(0)
    return PolicyModels(cfg.model, str(tiny_model_dir), torch.device("cpu"))


def _trajectory(models: PolicyModels, seed: int = 0) -> Trajectory:
    """Four ragged rollouts with random advantages/returns, and old/ref log-probs and values
    read from the models (as the FORWARD phase does) plus noise."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 200, (int(n),), generator=g).tolist() for n in (5, 9, 7, 6)]
    responses = [torch.randint(3, 200, (int(n),), generator=g).tolist() for n in (4, 11, 2, 8)]
    batch = make_batch(prompts, responses, pad_id=0)
    B, R = batch.response_mask.shape
    with torch.no_grad():
        with models.role(Role.ACTOR):
            old = models.token_logprobs(Role.ACTOR, batch).float() - 0.05 * torch.rand(B, R, generator=g)
        with models.role(Role.CRITIC):
            values = models.values(batch).float() + 0.1 * torch.randn(B, R, generator=g)
        ref = models.token_logprobs(Role.REFERENCE, batch).float()
    return Trajectory(batch=batch, group_ids=torch.arange(B), old_lp=old, ref_lp=ref, values=values,
                      advantages=torch.randn(B, R, generator=g), returns=torch.randn(B, R, generator=g))


def _all_tensors(models: PolicyModels) -> dict[str, torch.Tensor]:
    out = {}
    for prefix, module in (("actor", models.actor), ("critic", models.critic_backbone),
                           ("reference", models.reference), ("value_head", models.value_head)):
        if module is None or (prefix == "critic" and module is models.actor):
            continue
        for name, p in module.named_parameters():
            out[f"{prefix}:{name}"] = p
    return out


def _names(models: PolicyModels, params) -> set[str]:
    ids = {id(p) for p in params}
    return {n for n, p in _all_tensors(models).items() if id(p) in ids}


@pytest.mark.parametrize("checkpointing", [False, True], ids=["no-ckpt", "ckpt"])
@pytest.mark.parametrize("finetune", ["lora", "full"])
@pytest.mark.parametrize("role", ROLES)
def test_a_role_trains_every_tensor_of_its_own_and_nothing_else(tiny_model_dir, role, finetune, checkpointing):
    cfg = _config(finetune, checkpointing)
    models = _models(cfg, tiny_model_dir)
    learners = make_learners(cfg, models, BudgetKeeper({p: 10**6 for p in Phase}), True, lambda m: None)
    learner = learners[role]
    traj = _trajectory(models)
    own = _names(models, learner.params)
    assert own, "the role has trainable tensors"
    before = {n: p.detach().clone() for n, p in _all_tensors(models).items()}
    # LoRA's B and the value head start at zero, so the first updates reach some tensors only
    # through others (A's gradient is 0 while B is 0): three updates reach every one.
    for _ in range(3):
        learner.update(traj, generator=torch.Generator().manual_seed(0))
    with models.role(role):
        learner.opt.zero_grad(set_to_none=True)
        learner.accumulate_gradients(traj, [slice(0, 2), slice(2, 4)])
    named = _all_tensors(models)
    no_grad = sorted(n for n in own if named[n].grad is None or not named[n].grad.abs().sum() > 0)
    assert not no_grad, f"{role} tensors without a gradient: {no_grad[:5]} ({len(no_grad)} of {len(own)})"
    unchanged = sorted(n for n in own if torch.equal(before[n], named[n].detach()))
    assert not unchanged, f"{role} tensors that never changed: {unchanged[:5]} ({len(unchanged)} of {len(own)})"
    moved_elsewhere = sorted(n for n in named if n not in own and not torch.equal(before[n], named[n].detach()))
    assert not moved_elsewhere, f"{role}'s update changed other tensors: {moved_elsewhere[:5]}"
    assert models.actor.active_adapter == "actor" if models.lora else True  # the actor is restored


@pytest.mark.parametrize("role", ROLES)
def test_bf16_lora_role_trains_every_tensor(tiny_model_dir, role):
    # The CUDA default dtype; issue 20 saw the critic's lora_B stay exactly 0 there too.
    cfg = _config("lora", True, dtype="bf16")
    models = _models(cfg, tiny_model_dir)
    learner = make_learners(cfg, models, BudgetKeeper({p: 10**6 for p in Phase}), True, lambda m: None)[role]
    traj = _trajectory(models)
    before = [p.detach().clone() for p in learner.params]
    for _ in range(3):
        learner.update(traj, generator=torch.Generator().manual_seed(0))
    unchanged = [i for i, (b, p) in enumerate(zip(before, learner.params)) if torch.equal(b, p.detach())]
    assert not unchanged and learner.skipped_steps == 0


@pytest.mark.parametrize("finetune", ["lora", "full"])
@pytest.mark.parametrize("role", ROLES)
def test_gradient_checkpointing_gives_the_same_gradients(tiny_model_dir, role, finetune):
    grads = {}
    state = None
    for checkpointing in (False, True):
        cfg = _config(finetune, checkpointing)
        models = _models(cfg, tiny_model_dir)
        learners = make_learners(cfg, models, BudgetKeeper({p: 10**6 for p in Phase}), True, lambda m: None)
        if state is None:  # move every adapter and the head off zero, then share the weights
            for learner in learners.values():
                for _ in range(2):
                    learner.update(_trajectory(models), generator=torch.Generator().manual_seed(0))
            state = models.trainable_state()
        else:
            models.load_trainable_state(state)
        models.train(True)
        traj = _trajectory(models, seed=1)
        learner = learners[role]
        with models.role(role):
            learner.opt.zero_grad(set_to_none=True)
            learner.accumulate_gradients(traj, [slice(0, 4)])
        grads[checkpointing] = [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in learner.params]
    assert all(g.abs().sum() > 0 for g in grads[False])
    for off, on in zip(grads[False], grads[True]):
        torch.testing.assert_close(on, off, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("role", ROLES)
def test_one_micro_batch_and_four_give_the_same_gradient(tiny_model_dir, role, agg):
    cfg = _config("lora", False, **{f"{role}.loss_agg_mode": f'"{agg}"'})
    models = _models(cfg, tiny_model_dir)
    learner = make_learners(cfg, models, BudgetKeeper({p: 10**6 for p in Phase}), True, lambda m: None)[role]
    for _ in range(2):  # off zero, so every tensor has a gradient to compare
        learner.update(_trajectory(models), generator=torch.Generator().manual_seed(0))
    traj = _trajectory(models, seed=2)

    def grads(slices):
        with models.role(role):
            learner.opt.zero_grad(set_to_none=True)
            learner.accumulate_gradients(traj, slices)
        return [p.grad.clone() for p in learner.params]

    one = grads([slice(0, 4)])
    four = grads([slice(i, i + 1) for i in range(4)])
    assert all(g.abs().sum() > 0 for g in one)
    for a, b in zip(one, four):
        # float sums reordered: packed attention pads each row's keys to its micro-batch's longest
        torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-5 * float(b.abs().max()))


def test_the_actor_learner_back_propagates_actor_objective_with_the_config_coefficients(tiny_model_dir):
    # Every coefficient distinct, so swapping two of them in the wiring changes the loss.
    cfg = _config("lora", False, **{"actor.clip_ratio_low": 0.1, "actor.clip_ratio_high": 0.3,
                                    "actor.entropy_coeff": 0.05, "algorithm.kl_loss_coef": 0.7,
                                    "algorithm.kl_loss_type": '"k2"', "actor.loss_agg_mode": '"seq-mean-token-mean"',
                                    "rollout.temperature": 0.9})
    models = _models(cfg, tiny_model_dir)
    traj = _trajectory(models)
    traj.ref_lp = traj.ref_lp - 0.3  # a visible KL term
    traj.is_weights = torch.rand_like(traj.old_lp) * traj.mask
    with models.role(Role.ACTOR):
        loss, stats = actor_loss_fn(cfg)(models, traj)
        lp, ent = models.token_logprobs(Role.ACTOR, traj.batch, 0.9, with_entropy=True)
    pg, _ = losses.policy_loss(lp, traj.old_lp, traj.advantages, traj.mask, eps_low=0.1, eps_high=0.3,
                               agg_mode="seq-mean-token-mean", max_len=cfg.rollout.max_response_length,
                               is_weights=traj.is_weights)
    entropy = losses.agg_loss(ent, traj.mask, "seq-mean-token-mean")
    kl = losses.kl_loss(lp, traj.ref_lp, traj.mask, "k2", "seq-mean-token-mean")
    torch.testing.assert_close(loss, pg - 0.05 * entropy + 0.7 * kl)
    assert float(stats["kl_loss"]) == pytest.approx(float(kl)) and float(kl) > 0.01
    cfg.algorithm.use_kl_loss = False  # KL in the reward instead: no KL term in the loss
    with models.role(Role.ACTOR):
        loss_no_kl, _ = actor_loss_fn(cfg)(models, traj)
    torch.testing.assert_close(loss_no_kl, pg - 0.05 * entropy)


def test_the_critic_borrows_nothing_from_the_actor_section():
    from tinyrl.config import ActorConfig, CriticConfig, LearnerConfig

    shared = {f.name for f in dataclasses.fields(LearnerConfig)}
    assert {"weight_decay", "warmup_steps", "ppo_mini_batch_size", "ppo_epochs", "loss_agg_mode"} <= shared
    assert shared <= {f.name for f in dataclasses.fields(CriticConfig)}
    assert shared <= {f.name for f in dataclasses.fields(ActorConfig)}


def test_a_pass_outside_its_role_is_refused(tiny_model_dir):
    models = _models(_config("lora", False), tiny_model_dir)
    batch = make_batch([[1, 2, 3]], [[4, 5]], pad_id=0)
    with pytest.raises(RuntimeError, match="models.role"):
        models.values(batch)
    with models.role(Role.CRITIC), pytest.raises(RuntimeError, match="models.role"):
        models.token_logprobs(Role.ACTOR, batch)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_a_one_pass_update_equals_the_two_pass_one(tiny_model_dir, checkpointing):
    # trainer.one_pass_update skips the old-log-prob forward (old_lp None): the actor loss then
    # uses its own log-probs, detached. One optimizer step over the whole batch must give the
    # same loss, gradients and new weights as with old log-probs from a separate no-grad pass.
    cfg = _config("full", checkpointing, **{"actor.clip_ratio_low": 0.1})
    models = _models(cfg, tiny_model_dir)
    traj = _trajectory(models)
    with torch.no_grad(), models.role(Role.ACTOR):
        models.train(False)  # as the trainer's FORWARD phase
        traj.old_lp = models.token_logprobs(Role.ACTOR, traj.batch, cfg.rollout.temperature).float()
    models.train(True)
    one_pass = dataclasses.replace(traj, old_lp=None)
    learner = make_learners(cfg, models, BudgetKeeper({p: 10**6 for p in Phase}), False, lambda m: None)["actor"]
    start = [p.detach().clone() for p in learner.params]

    def step(t):
        for p, s in zip(learner.params, start):
            p.data.copy_(s)
        learner.opt = type(learner.opt)(learner.params, lr=cfg.actor.lr)
        with models.role(Role.ACTOR):
            learner.opt.zero_grad(set_to_none=True)
            stats = learner.accumulate_gradients(t, [slice(0, 2), slice(2, 4)])
        grads = [p.grad.clone() for p in learner.params]
        learner._step()
        return stats, grads, [p.detach().clone() for p in learner.params]

    stats2, grads2, after2 = step(traj)
    stats1, grads1, after1 = step(one_pass)
    assert stats1["pg_loss"] == pytest.approx(stats2["pg_loss"], rel=1e-5, abs=1e-7)
    assert sum(float(g.abs().sum()) for g in grads2) > 0
    for a, b in zip(grads1, grads2):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
    # The new weights: Adam's first step is ~lr * g / (|g| + eps), so where |g| is near eps the
    # float noise between a no-grad and a grad forward (1e-9 in g) moves a weight by a few % of
    # a step (seen: 5e-4 at lr 1e-2 on 2 of 16,384). Compared where the gradient is well above eps.
    for a, b, g in zip(after1, after2, grads2):
        clear = g.abs() > 1e-6
        torch.testing.assert_close(a[clear], b[clear], rtol=0, atol=0.01 * cfg.actor.lr)
    assert any(not torch.equal(a, s) for a, s in zip(after1, start))


def test_the_trainer_skips_the_old_log_prob_pass_only_for_one_step_over_the_whole_batch():
    from tinyrl.trainer import one_pass_update

    grpo = _config("full", False, **{"algorithm.adv_estimator": '"grpo"', "rollout.n": 2})
    assert one_pass_update(grpo, "hf", "off")
    for key, value in (("actor.ppo_epochs", 2), ("actor.ppo_mini_batch_size", 2)):
        assert not one_pass_update(_config("full", False, **{key: value}), "hf", "off"), key
    assert not one_pass_update(_config("full", False, **{"algorithm.kl_in_reward": "true",
                                                         "algorithm.use_kl_loss": "false"}), "hf", "off")
    assert not one_pass_update(grpo, "hf", "token")   # rollout IS weights need old log-probs
    assert not one_pass_update(grpo, "vllm", "off")   # the parity guard needs them


def test_by_prompt_puts_each_prompts_rows_together_in_their_shuffled_order():
    from tinyrl.microbatch import by_prompt

    group_ids = torch.tensor([0, 0, 1, 1, 2, 2, 7, 7])  # row -> prompt
    rows = torch.tensor([5, 0, 7, 2, 4, 1, 3])          # a shuffled mini-batch (row 6 is in another)
    assert by_prompt(rows, group_ids).tolist() == [0, 1, 2, 3, 5, 4, 7]


def test_mini_batches_hold_whole_prompts_in_the_order_they_were_drawn():
    from tinyrl.microbatch import mini_batches

    group_ids = torch.tensor([0, 0, 1, 1, 2, 2])  # row -> prompt
    order = torch.tensor([5, 0, 3, 1, 4, 2])      # prompts first seen: 2 (row 5), 0 (row 0), 1 (row 3)
    assert [m.tolist() for m in mini_batches(order, group_ids, 2)] == [[5, 0, 1, 4], [3, 2]]
    assert [m.tolist() for m in mini_batches(order, group_ids, 1)] == [[5, 4], [0, 1], [3, 2]]
    assert [m.tolist() for m in mini_batches(order, None, 4)] == [[5, 0, 3, 1], [4, 2]]  # SFT: rows


@pytest.mark.parametrize("seed", range(5))
def test_mini_batches_cover_every_row_once_and_keep_old_cuts_where_nothing_is_shared(seed):
    from tinyrl.microbatch import mini_batches

    g = torch.Generator().manual_seed(seed)
    group_ids = torch.randint(0, 7, (40,), generator=g) * 3 + 5  # 40 rows, uneven groups, sparse ids
    order = torch.randperm(40, generator=g)
    for prompts in (1, 2, 3, 7, 100):
        minis = mini_batches(order, group_ids, prompts)
        assert sorted(torch.cat(minis).tolist()) == list(range(40))
        seen = [set(group_ids[m].tolist()) for m in minis]
        assert all(len(s) == prompts for s in seen[:-1]) and 0 < len(seen[-1]) <= prompts
        assert all(not (a & b) for i, a in enumerate(seen) for b in seen[i + 1:])  # a prompt in one only
        assert all(m.tolist() == [r for r in order.tolist() if r in set(m.tolist())] for m in minis)
    # one row per prompt (PPO with rollout.n = 1, SFT) or every prompt in one mini-batch: what
    # consecutive cuts of the permutation gave before, so those runs are unchanged bit for bit
    unique = torch.randperm(40, generator=g)
    for prompts in (1, 3, 8, 40):
        assert [m.tolist() for m in mini_batches(order, unique, prompts)] == \
               [order[i:i + prompts].tolist() for i in range(0, 40, prompts)]
    assert [m.tolist() for m in mini_batches(order, group_ids, 7)] == [order.tolist()]


@pytest.mark.parametrize("prompts_per_mini", [0, 1, 2])
def test_the_update_computes_each_prompt_once_when_its_rows_fit_one_micro_batch(tiny_model_dir, prompts_per_mini):
    # GRPO's shape: 3 prompts x 4 answers, one mini-batch of the 12 rows, micro-batches of at
    # most 5 rows (budget 50 tokens / planned row width 10; every row has <= 9 real tokens).
    # Hand-worked: with each prompt's 4 rows in one micro-batch, the padding-free passes compute
    # every prompt once: 4 + 6 + 5 prompt tokens + 24 response tokens = 39 of the 84 real ones
    # (the 12 rows' 15 x 4 prompt tokens + 24). Shuffled rows spread the prompts over the
    # micro-batches (the demo's update computed 0.54 tokens per real token, the forward 0.29);
    # rows in prompt order cut at 5 rows ([0:5] [5:10] [10:12]) compute prompts 1 and 2 twice
    # (50 tokens); cut between prompts ([0:4] [4:8] [8:12]: as many passes) once each.
    # Mini-batches of 1 or 2 prompts (actor.ppo_mini_batch_size; 0 = all 3) hold whole prompts
    # (microbatch.mini_batches): each prompt once too. Rows drawn one by one into mini-batches of
    # 4 or 8 spread the prompts over them (the demo critic's 0.72 tokens per real token).
    cfg = _config("lora", False, **{"rollout.n": 4, "algorithm.adv_estimator": '"grpo"', "actor.ppo_epochs": 3,
                                    "actor.ppo_mini_batch_size": prompts_per_mini})
    models = _models(cfg, tiny_model_dir)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 200, (n,), generator=g).tolist() for n in (4, 6, 5)]
    lengths = [1, 2, 3, 2, 3, 3, 1, 2, 2, 1, 1, 3]
    responses = [torch.randint(3, 200, (n,), generator=g).tolist() for n in lengths]
    batch = make_batch([prompts[i // 4] for i in range(12)], responses, pad_id=0)
    traj = Trajectory(batch=batch, group_ids=torch.arange(12) // 4,
                      advantages=torch.randn(batch.response_mask.shape, generator=g))
    learner = make_learners(cfg, models, BudgetKeeper({p: 50 for p in Phase}, row_width=10), False,
                            lambda m: None)["actor"]
    for seed in range(4):
        before = list(models.token_counts)
        learner.update(traj, generator=torch.Generator().manual_seed(seed))
        computed, real = (a - b for a, b in zip(models.token_counts, before))
        assert (computed, real) == (3 * 39, 3 * 84), f"shuffle seed {seed}"


def test_the_critic_update_is_a_plain_value_regression(tiny_model_dir):
    # The critic's update, as the trainer runs it (values read before the update, the packed
    # pass, the clipped loss, the loss weights, grad clip, tinyrl's AdamW, the role context), must
    # be ordinary regression: an independent plain-PyTorch critic (the HF body with a padded
    # pass, the same head, 0.5 * token-mean MSE of V read BEFORE each response token,
    # torch.optim.AdamW over the body and head, torch's grad-norm clip) fed the same returns
    # must end at the same values. Issue 30 asked whether the demo critic's slow learning was
    # the code; a defect here (values at the wrong positions, the input detached, the optimizer
    # over the wrong tensors, the actor's rate or clip) breaks this. Each role gets a different
    # lr / weight decay / clip, so reading the actor's section breaks it too.
    from transformers import AutoModelForCausalLM

    cfg = _config("full", False, **{"critic.lr": 3e-3, "critic.weight_decay": 0.1, "critic.grad_clip": 0.5,
                                    "actor.lr": 1e-4, "actor.weight_decay": 0.0, "actor.grad_clip": 1.0})
    models = _models(cfg, tiny_model_dir)
    learner = make_learners(cfg, models, BudgetKeeper({p: 10**6 for p in Phase}), True, lambda m: None)["critic"]
    ref_lm = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    ref_head = torch.nn.Linear(ref_lm.config.hidden_size, 1)
    ref_head.load_state_dict(models.value_head.proj.state_dict())
    ref_params = [p for p in ref_lm.parameters()] + list(ref_head.parameters())
    ref_opt = torch.optim.AdamW(ref_params, lr=3e-3, weight_decay=0.1)
    traj = _trajectory(models)
    b, m, R = traj.batch, traj.mask, traj.mask.shape[1]

    def ref_values():  # [B, R]: the state BEFORE response token t predicts its return
        h = ref_lm.model(input_ids=b.input_ids, attention_mask=b.attention_mask, position_ids=b.position_ids,
                         use_cache=False).last_hidden_state
        return ref_head(h[:, -R - 1:-1, :]).squeeze(-1)

    def own_values():
        with torch.no_grad(), models.role(Role.CRITIC):
            return models.values(b).float()

    with torch.no_grad():
        torch.testing.assert_close(own_values() * m, ref_values() * m, rtol=1e-4, atol=1e-5)
    start = own_values()
    for _ in range(4):
        models.train(False)
        traj.values = own_values()  # the trainer's FORWARD phase: the values the clip is around
        models.train(True)
        learner.update(traj, generator=torch.Generator().manual_seed(0))
        loss = 0.5 * (((ref_values() - traj.returns) ** 2) * m).sum() / m.sum()
        ref_opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ref_params, 0.5)
        ref_opt.step()
    own, ref = own_values(), ref_values().detach()
    assert float(((own - start).abs() * m).max()) > 0.05, "the critic's values moved"
    torch.testing.assert_close(own * m, ref * m, rtol=1e-3, atol=2e-4)


def test_rl_update_passes_run_without_lora_dropout_so_the_first_ratio_is_one(tiny_model_dir):
    """model.lora_dropout = 0.5: the old log-probs (eval mode, no dropout) and the update's
    (train mode) differed before any optimizer step, so PPO's ratio was not 1 and clipping was
    biased. RL builds its adapters without dropout; SFT keeps it."""
    cfg = _config("lora", checkpointing=False, **{"model.lora_dropout": 0.5})
    batch = make_batch([[5, 9, 7, 6], [8, 3]], [[4, 11, 2], [8, 12, 30, 7]], pad_id=0)

    def eval_and_train_logprobs(models):
        with torch.no_grad():
            for name, p in models.actor.named_parameters():
                if "lora_B" in name:  # B starts at zero: dropout before A would change nothing
                    p.normal_(0, 0.5)
            out = []
            for mode in (False, True):
                models.train(mode)
                torch.manual_seed(0)
                with models.role(Role.ACTOR):
                    out.append(models.token_logprobs(Role.ACTOR, batch))
            return out

    old, update = eval_and_train_logprobs(_models(cfg, tiny_model_dir))
    assert torch.equal(old, update)  # ratio exp(update - old) is exactly 1
    torch.manual_seed(0)
    sft = PolicyModels(cfg.model, str(tiny_model_dir), torch.device("cpu"), actor_only=True)
    old, update = eval_and_train_logprobs(sft)
    assert not torch.allclose(old, update)  # SFT's dropout is on in train mode


@pytest.mark.parametrize("finetune", ["lora", "full"])
def test_rl_runs_every_role_without_the_models_own_dropout(tiny_model_dir, monkeypatch, finetune):
    """A model with attention_dropout = 0.5 in its config (transformers' attention passes that
    float to the kernel in train mode: no nn.Dropout) and an nn.Dropout(0.5) in every MLP. RL's
    update passes run in train mode, its old log-probs, reference log-probs and values in eval
    mode: RL turns both kinds off in every role, so train-mode passes agree with each other and
    with eval mode (the first PPO ratio is 1, the values are not noise). SFT keeps them."""
    import copy

    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(tiny_model_dir)
    config.attention_dropout = 0.5
    load = AutoModelForCausalLM.from_pretrained

    def load_with_dropout(path, **kw):
        model = load(path, config=copy.deepcopy(config), **kw)
        for layer in model.model.layers:
            layer.mlp.act_fn = torch.nn.Sequential(layer.mlp.act_fn, torch.nn.Dropout(0.5))
        return model

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", load_with_dropout)
    cfg = _config(finetune, checkpointing=False)
    batch = make_batch([[5, 9, 7, 6], [8, 3]], [[4, 11, 2], [8, 12, 30, 7]], pad_id=0)

    def passes(models, read):
        """read(models) in eval mode, then twice in train mode under different seeds."""
        out = []
        with torch.no_grad():
            for mode, seed in ((False, 0), (True, 1), (True, 2)):
                models.train(mode)
                torch.manual_seed(seed)
                out.append(read(models))
        return out

    def actor(models):
        with models.role(Role.ACTOR):
            return models.token_logprobs(Role.ACTOR, batch)

    def critic(models):
        with models.role(Role.CRITIC):
            return models.values(batch)

    rl = _models(cfg, tiny_model_dir)  # every role: actor, critic, value head, reference
    for read in (actor, critic, lambda m: m.token_logprobs(Role.REFERENCE, batch)):
        old, update, again = passes(rl, read)
        assert torch.equal(update, again) and torch.equal(old, update)
    sft = PolicyModels(cfg.model, str(tiny_model_dir), torch.device("cpu"), actor_only=True)
    old, update, again = passes(sft, actor)
    assert not torch.allclose(update, again) and not torch.allclose(old, update)  # SFT trains with dropout


def test_without_dropout_zeroes_modules_and_float_attributes_and_replaces_neither():
    """Both kinds of dropout a transformers model keeps: float attributes (Qwen2's
    attention_dropout, Starcoder2's residual_dropout) and nn.Dropout modules, one of them named
    attention_dropout (Bloom, Falcon): it stays a module. A flag (ESM's token_dropout) stays."""
    from tinyrl.models import _without_dropout

    layer = torch.nn.Module()
    layer.attention_dropout, layer.residual_dropout, layer.token_dropout = 0.5, 0.1, True
    layer.inner = torch.nn.Module()
    layer.inner.attention_dropout = torch.nn.Dropout(0.3)
    _without_dropout(layer)
    assert (layer.attention_dropout, layer.residual_dropout, layer.token_dropout) == (0.0, 0.0, True)
    assert isinstance(layer.inner.attention_dropout, torch.nn.Dropout) and layer.inner.attention_dropout.p == 0.0
