"""One learner per trainable role: the actor (policy) and the critic (value function).

A learner owns its parameters, optimizer, learning-rate schedule, gradient clip, micro-batch
budget (its Phase in the BudgetKeeper), its loss and its config section (`actor.*` or
`critic.*`; nothing is borrowed from the other role). Its whole update runs inside
`models.role(role)`, so with shared-base LoRA the role's adapter is the active one for every
forward AND backward, gradient-checkpoint recomputation included (see PolicyModels.role).

The losses are tinyrl.rl.losses functions; this file only feeds them a Trajectory's slices.
"""

from __future__ import annotations

from typing import Callable

import torch

from tinyrl.config import Config, LearnerConfig
from tinyrl.microbatch import BudgetKeeper, by_prompt, loss_normaliser, loss_weight, mini_batches
from tinyrl.models import PolicyModels
from tinyrl.optim import AdamW
from tinyrl.phases import Phase
from tinyrl.rl import losses
from tinyrl.rl.grad import clip_grad_norm_or_skip
from tinyrl.roles import Role
from tinyrl.trajectory import Trajectory

LossFn = Callable[[PolicyModels, Trajectory], tuple[torch.Tensor, dict[str, torch.Tensor]]]


def actor_loss_fn(cfg: Config) -> LossFn:
    a, alg = cfg.actor, cfg.algorithm

    def loss(models: PolicyModels, part: Trajectory):
        lp, entropy = models.token_logprobs(Role.ACTOR, part.batch, cfg.rollout.temperature, with_entropy=True)
        # No old log-probs: the trainer skipped their pass (trainer.one_pass_update), this one
        # optimizer step starts from the parameters that would have computed them.
        old_lp = lp.detach() if part.old_lp is None else part.old_lp
        return losses.actor_objective(
            lp, entropy, old_lp, part.advantages, part.mask,
            ref_logprob=part.ref_lp if alg.use_kl_loss else None, is_weights=part.is_weights,
            eps_low=a.clip_ratio_low, eps_high=a.clip_ratio_high, clip_ratio_c=a.clip_ratio_c,
            agg_mode=a.loss_agg_mode, max_len=cfg.rollout.max_response_length,
            entropy_coef=a.entropy_coeff, kl_coef=alg.kl_loss_coef, kl_type=alg.kl_loss_type)
    return loss


def critic_loss_fn(cfg: Config) -> LossFn:
    c = cfg.critic

    def loss(models: PolicyModels, part: Trajectory):
        values = models.values(part.batch)
        vf, stats = losses.value_loss(values, part.values, part.returns, part.mask, cliprange_value=c.cliprange_value,
                                      agg_mode=c.loss_agg_mode, max_len=cfg.rollout.max_response_length)
        return vf, {"vf_loss": vf.detach(), **stats}
    return loss


def sft_loss_fn() -> LossFn:
    """`tinyrl sft`'s loss: log-probs at temperature 1, no entropy, the token-mean NLL over the
    loss mask (losses.sft_loss). Here, beside the RL losses, so that the memory simulation traces
    this very function without importing the SFT trainer."""
    def loss(models: PolicyModels, part):
        lp = models.token_logprobs(Role.ACTOR, part.batch)  # [B, R], temperature 1
        return losses.sft_loss(lp, part.mask)
    return loss


class Learner:
    def __init__(self, role: Role, phase: Phase, cfg: LearnerConfig, models: PolicyModels,
                 params: list[torch.nn.Parameter], loss_fn: LossFn, budgets: BudgetKeeper,
                 on_skip: Callable[[str], None] = lambda msg: None):
        self.role, self.phase, self.cfg = role, phase, cfg
        self.models, self.params, self.loss_fn, self.budgets = models, params, loss_fn, budgets
        self.on_skip = on_skip
        self.skipped_steps = 0
        self.opt = AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)  # bf16-safe, see optim.py
        warm = max(0, cfg.warmup_steps)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0)

    def update(self, traj: Trajectory, *, generator: torch.Generator) -> dict[str, float]:
        """ppo_epochs passes over the trajectory in shuffled mini-batches of whole prompts
        (ppo_mini_batch_size prompts each: microbatch.mini_batches), one optimizer step each
        (skipped when the gradient norm is not finite); one scheduler step per call. A
        mini-batch's rows of one prompt go into its micro-batches together (by_prompt)."""
        n_rows = len(traj)
        group_ids = traj.group_ids  # None for SFT's rows: each its own prompt
        n_prompts = n_rows if group_ids is None else int(torch.unique(group_ids).numel())
        prompts_per_mini = self.cfg.ppo_mini_batch_size or n_prompts
        stats_all: list[dict[str, float]] = []
        with self.models.role(self.role):
            for _epoch in range(self.cfg.ppo_epochs):
                order = torch.randperm(n_rows, generator=generator).to(traj.mask.device)
                for rows in mini_batches(order, group_ids, prompts_per_mini):
                    # SFT's and padded passes share no prompt (and SFT's batches have no groups)
                    mini = traj.rows(by_prompt(rows, group_ids) if self.models.shares_prompts else rows)

                    def attempt(slices, mini=mini):
                        self.opt.zero_grad(set_to_none=True)
                        return self.accumulate_gradients(mini, slices)

                    acc = self.budgets.run_accumulating(self.phase, len(mini), mini.batch.input_ids.shape[1], attempt,
                                                        self.models.row_tokens(mini.batch),
                                                        self.models.row_groups(mini.batch))
                    acc["grad_norm"] = self._step()
                    stats_all.append(acc)
        # The rate these steps used, read before it moves on. verl 0.9.1 logs the next step's
        # (engine lr_scheduler_step: step(), then get_last_lr()): its curves lead ours by a step in warm-up.
        lr = self.sched.get_last_lr()[0]
        self.sched.step()
        keys = {k for s in stats_all for k in s}
        out = {f"{self.role}/{k}": sum(s.get(k, 0.0) for s in stats_all) / len(stats_all) for k in keys}
        out[f"{self.role}/lr"] = lr
        out[f"{self.role}/skipped_steps"] = float(self.skipped_steps)
        return out

    def accumulate_gradients(self, mini: Trajectory, slices: list[slice]) -> dict[str, float]:
        """Backward every micro-batch of a mini-batch; each loss is weighted by its share of the
        mini-batch's normaliser, so any split gives the same gradient as one big micro-batch.
        The caller holds `models.role(self.role)`."""
        agg = self.cfg.loss_agg_mode
        total_w = loss_normaliser(mini.mask, agg)
        acc: dict[str, float] = {}
        for s in slices:
            part = mini.rows(s)
            loss, stats = self.loss_fn(self.models, part)
            w = loss_weight(part.mask, agg) / total_w
            (loss * w).backward()
            for k, v in stats.items():
                acc[k] = acc.get(k, 0.0) + float(v) * w
        return acc

    def _step(self) -> float:
        norm, finite = clip_grad_norm_or_skip(self.params, self.cfg.grad_clip)
        if finite:
            self.opt.step()
        else:
            self.skipped_steps += 1
            self.on_skip(f"{self.phase}: gradient norm is not finite; skipped this optimizer step")
        self.opt.zero_grad(set_to_none=True)
        return norm

    def state_dict(self) -> dict:
        return {"opt": self.opt.state_dict(), "sched": self.sched.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.opt.load_state_dict(state["opt"])
        self.sched.load_state_dict(state["sched"])


def make_learners(cfg: Config, models: PolicyModels, budgets: BudgetKeeper, with_critic: bool,
                  on_skip: Callable[[str], None]) -> dict[Role, Learner]:
    learners = {Role.ACTOR: Learner(Role.ACTOR, Phase.ACTOR_UPDATE, cfg.actor, models, models.actor_parameters(),
                                    actor_loss_fn(cfg), budgets, on_skip)}
    if with_critic:
        learners[Role.CRITIC] = Learner(Role.CRITIC, Phase.CRITIC_UPDATE, cfg.critic, models, models.critic_parameters(),
                                        critic_loss_fn(cfg), budgets, on_skip)
    return learners
