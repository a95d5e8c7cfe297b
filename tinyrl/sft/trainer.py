"""`tinyrl sft`'s trainer: the RL Trainer's loop with a supervised step.

Shared with `tinyrl train` (inherited, not copied): the loop with checkpoints, resume, signals
and validation (Trainer.train), the run log (metrics.jsonl, timeline, parquet), the seeded data
order per epoch (a resumed run replays the same rows), the models (PolicyModels, actor only:
LoRA adapter "actor" or full weights), the Learner (optimizer, warm-up, gradient clip, skipped
non-finite steps) with the BudgetKeeper's micro-batches and OOM halving, and the checkpoint
format, which `tinyrl export`, `tinyrl eval` and model.init_from read.

A step: trainer.train_batch_size rows -> one optimizer step on the token-mean NLL over the loss
mask (tinyrl.rl.losses.sft_loss), in the ACTOR_UPDATE phase under actor.* settings. Validation
(every trainer.test_every steps): the same loss on data.test_path, no grad, as val/loss; with
sft.val_generate also the RL trainer's own validation (greedy completions of the same file's
prompts from the hf engine on the actor, scored by the task: val/score), so an SFT run and an
RL run from it report accuracy on the same held-out prompts the same way.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import time
from pathlib import Path

import torch

from tinyrl.config import DEFAULT_MICRO_TOKENS, Config, prompt_room, resolve_path
from tinyrl.learners import Learner, sft_loss_fn
from tinyrl.memory.from_config import row_width
from tinyrl.microbatch import BudgetKeeper
from tinyrl.models import PolicyModels
from tinyrl.phases import Phase
from tinyrl.roles import Role
from tinyrl.runlog import memory_reading
from tinyrl.sft.data import SFTRows, load_sft, start_notes
from tinyrl.trainer import PhaseTimer, Trainer


def sft_learner_config(cfg: Config):
    """actor.* with what SFT fixes: one optimizer step per step over the whole batch, and the
    token mean (the micro-batch weights then make accumulation exact, tinyrl.microbatch)."""
    return dataclasses.replace(cfg.actor, ppo_epochs=1, ppo_mini_batch_size=0, loss_agg_mode="token-mean")


class SFTTrainer(Trainer):
    def __init__(self, cfg: Config, run_dir: Path, resume: bool = False, dashboard=None):
        from tinyrl.init_from import describe, model_path_of
        from tinyrl.setup import load_tokenizer, pick_device

        self._open_run(cfg, run_dir, resume, dashboard)
        self.device = pick_device(cfg.trainer.device)
        train_path = ensure_sft_data(cfg, run_dir if resume else None)
        self.model_path = model_path_of(cfg, run_dir)  # model.init_from works here too (SFT on SFT)
        if cfg.model.init_from:
            self._notice(describe(self.model_path, resume))
        self.tokenizer = load_tokenizer(self.model_path, cfg.model.custom_chat_template)
        self.pad_id = self.tokenizer.pad_token_id
        self.train_rows: SFTRows = load_sft(train_path, self.tokenizer, cfg)
        for note in start_notes(self.train_rows, train_path, cfg.sft.tools_key):
            self._notice(note)
        self.val_rows: SFTRows | None = None
        if cfg.trainer.test_every:
            self.val_rows = load_sft(resolve_path(cfg.data.test_path), self.tokenizer, cfg,
                                     max_rows=cfg.data.max_test_prompts)
        torch.manual_seed(cfg.trainer.seed)
        random.seed(cfg.trainer.seed)
        self.models = PolicyModels(cfg.model, self.model_path, self.device, actor_only=True)
        self.engine = self._validation_engine(run_dir) if cfg.trainer.test_every and cfg.sft.val_generate else None
        tokens = cfg.actor.micro_batch_tokens or DEFAULT_MICRO_TOKENS
        self.budgets = BudgetKeeper({Phase.ACTOR_UPDATE: tokens,
                                     Phase.FORWARD: cfg.actor.forward_micro_batch_tokens or 2 * tokens},
                                    row_width=row_width(cfg))  # packed: no more rows than the plan priced
        self.learners = {Role.ACTOR: Learner(Role.ACTOR, Phase.ACTOR_UPDATE, sft_learner_config(cfg), self.models,
                                          self.models.actor_parameters(), sft_loss_fn(), self.budgets,
                                          self._notice)}
        self._start_run(run_dir, resume, len(self.train_rows), "rows")

    def _validation_engine(self, run_dir: Path):
        """sft.val_generate: what Trainer.validate needs, the test prompts rendered as `train`
        renders them, the task's reward, and the hf engine sampling from the actor itself."""
        from tinyrl.rollout.factory import make_engine
        from tinyrl.setup import RunInputs, tokenize_rows
        from tinyrl.tasks.rewards import build_rewards

        cfg = self.cfg
        test_path = resolve_path(cfg.data.test_path)
        prompts, rows = tokenize_rows(test_path, self.tokenizer, cfg.data.max_prompt_length,
                                      max_rows=cfg.data.max_test_prompts, chat=cfg.data.chat_template,
                                      room=prompt_room(cfg))
        self.inputs = RunInputs(self.device, self.model_path, self.tokenizer, self.pad_id, [], [], prompts, rows,
                                build_rewards(cfg, run_dir), test_file=test_path)
        return make_engine("hf", model=self.models.actor, tokenizer=self.tokenizer, device=self.device)

    # ------------------------------------------------------------------ the Trainer's hooks

    def _before_training(self) -> None:
        pass  # no rollout engine

    def _extra_state(self) -> dict:
        return {}

    def _restored(self, state: dict) -> None:
        pass

    def train_step(self) -> dict:
        step, timings = self.step, {}
        t_step = time.perf_counter()
        self._phase_memory = {}
        rows = self._prompt_rows(step)
        part = self.train_rows.batch(rows, self.pad_id).to(self.device)
        self._phase(Phase.ACTOR_UPDATE)
        with PhaseTimer(timings, str(Phase.ACTOR_UPDATE)):
            self.models.train(True)
            g = torch.Generator().manual_seed(self.cfg.trainer.seed * 31 + step)
            stats = self.learners[Role.ACTOR].update(part, generator=g)
        self.step += 1
        timings["step"] = time.perf_counter() - t_step
        n_tokens = int(part.batch.attention_mask.sum())
        metrics = {**self._step_ids(),
                   **{k.replace("actor/", "sft/", 1): v for k, v in stats.items()},
                   "sft/loss_tokens": float(part.loss_mask.sum()),
                   **{f"timing/{k}": v for k, v in timings.items()},
                   "perf/tokens_per_s": n_tokens / max(timings["step"], 1e-9),
                   **memory_reading(self.device), **self._phase_memory,
                   "data/rows_sha1": hashlib.sha1(json.dumps(rows).encode()).hexdigest()[:16]}
        return metrics

    def validate(self) -> dict:
        """val/loss: the token-mean NLL over data.test_path's loss masks (no grad); with
        sft.val_generate first the RL trainer's validation (val/score, val/reward_mean)."""
        out = super().validate() if self.engine is not None else {}  # it opens the VALIDATE phase
        if self.engine is None:
            self._phase(Phase.VALIDATE)
        rows = self.val_rows
        everything = rows.batch(list(range(len(rows))), self.pad_id).to(self.device)
        self.models.train(False)
        sums = []

        def attempt(slices):
            sums.clear()
            for s in slices:
                part = everything.rows(s)
                lp = self.models.token_logprobs(Role.ACTOR, part.batch)
                sums.append((float((-lp * part.mask).sum()), float(part.mask.sum())))
            return {}

        with torch.no_grad():
            self.budgets.run_accumulating(Phase.FORWARD, len(everything), everything.batch.input_ids.shape[1], attempt)
        nll, tokens = sum(s for s, _ in sums), sum(t for _, t in sums)
        return {**out, "val/loss": nll / max(tokens, 1.0)}


def ensure_sft_data(cfg: Config, resume_dir: Path | None = None) -> Path:
    """data.train_path; the preset's own file is generated on first use when the task can write
    SFT data (Countdown's reference solutions), as `tinyrl train` generates its prompts."""
    from tinyrl.setup import ensure_train_data

    from tinyrl.config import check_command

    check_command(cfg, "sft")  # an RL preset's file holds prompts without responses
    return ensure_train_data(cfg, resume_dir)
