"""Warnings that are not errors: settings this run never reads, one learner's rate given without
the other's. Said once at start; the run goes on.
"""

from __future__ import annotations

from typing import Any

from tinyrl.config.schema import EVERY_TASKS_KEYS, Config, get_setting, has_critic, resolve_rollout_is
from tinyrl.roles import ESTIMATOR_NAMES as ADV_ESTIMATORS
from tinyrl.roles import ESTIMATORS


def role_rate_notes(cfg: Config, given: set[str]) -> list[str]:
    """A run with a critic whose preset/--set gave one role's learning rate but not the other's:
    the other stays at a default tuned for another model size (actor 1e-6 and critic 1e-5 are
    a 3B's). The countdown demo's PPO did so (actor 2e-3, critic 1e-5): its value head hardly
    moved in 60 steps, explained variance stayed 0, and "PPO" was REINFORCE with whitening."""
    if cfg.algorithm.adv_estimator not in ADV_ESTIMATORS or not has_critic(cfg):
        return []
    out = []
    for role, other in (("actor", "critic"), ("critic", "actor")):
        if f"{role}.lr" in given and f"{other}.lr" not in given:
            value = get_setting(cfg, f"{role}.lr")
            out.append(f"{role}.lr = {value:g} is set but {other}.lr is left at its default "
                       f"{get_setting(cfg, f'{other}.lr'):g} (a 3B model's rate), so the two learners may "
                       f"move at very different speeds; set {other}.lr too (e.g. --set {other}.lr={value:g})")
    return out


IN_REWARD_KL = ("algorithm.kl_penalty", "algorithm.kl_coef", "algorithm.kl_ctrl", "algorithm.kl_target",
                "algorithm.kl_horizon")


def unread_setting_notes(cfg: Config, given: set[str]) -> list[str]:
    """Settings the preset or --set gave that this RL run never reads, each with why: they used
    to be taken without a word (algorithm.lam under GRPO, critic.lr without a critic, a KL
    coefficient with the KL in neither the reward nor the loss), and the run trained as if they
    had not been given. Notes, not problems: a preset may carry keys for other algorithms.
    `tinyrl sft`: the RL-only sections and task.extra_tools (_unread_by_sft)."""
    if cfg.command == "sft":
        return [f"{dotted} is given but `tinyrl sft` does not read it: {why}"
                for dotted in sorted(given) if (why := _unread_by_sft(dotted))]
    if cfg.command != "train" or cfg.algorithm.adv_estimator not in ADV_ESTIMATORS:
        return []
    return [f"{dotted} is given but this run does not read it: {why}"
            for dotted in sorted(given) if (why := _unread_because(cfg, dotted))]


def _unread_by_sft(dotted: str) -> str | None:
    """Why SFT never reads `dotted`, for the settings that are surely RL's alone: it has no
    advantages and no critic, and its rows bring their own tools. (Its validation samples with
    the rollout.* and reward.* settings, so those are not said.)"""
    section = dotted.partition(".")[0]
    if section in ("algorithm", "critic"):
        return f"[{section}] is RL's (`tinyrl train`): SFT trains the actor on its rows' tokens alone"
    if dotted == "task.extra_tools":
        return ("SFT's rows carry their own tools (the column sft.tools_key names); offer the tool to RL "
                "with `tinyrl train --set task.extra_tools=[...]`")
    return None


def _setting_or_none(cfg: Config, dotted: str) -> Any:
    try:
        return get_setting(cfg, dotted)
    except AttributeError:  # a key this version does not have (reported as unknown elsewhere)
        return None


def _unread_because(cfg: Config, dotted: str) -> str | None:
    alg, est = cfg.algorithm, cfg.algorithm.adv_estimator
    section, _, key = dotted.partition(".")
    if section == "critic" and not has_critic(cfg):
        return f"algorithm.adv_estimator = {est} trains no critic (only gae does)"
    if dotted in ("algorithm.gamma", "algorithm.lam") and key not in ESTIMATORS[est].discount:
        readers = [name for name, e in ESTIMATORS.items() if key in e.discount]
        return (f"algorithm.adv_estimator = {est} does not discount (only {' and '.join(readers)} "
                f"{'reads' if len(readers) == 1 else 'read'} algorithm.{key})")
    if dotted in IN_REWARD_KL and not alg.kl_in_reward:
        return ("algorithm.kl_in_reward is false (a KL loss, algorithm.use_kl_loss, reads "
                "algorithm.kl_loss_coef and algorithm.kl_loss_type)")
    if dotted in ("algorithm.kl_target", "algorithm.kl_horizon") and alg.kl_ctrl != "adaptive":
        return "only algorithm.kl_ctrl = adaptive reads it"
    if dotted in ("algorithm.kl_loss_coef", "algorithm.kl_loss_type") and not alg.use_kl_loss:
        return "algorithm.use_kl_loss is false"
    if dotted == "algorithm.max_gen_rounds" and not alg.dynamic_sampling:
        return "algorithm.dynamic_sampling is false"
    if dotted == "algorithm.dynamic_sampling" and alg.dynamic_sampling and cfg.rollout.n < 2:
        return "with rollout.n = 1 each group is one sample, and a group of one is always kept; set rollout.n=8"
    if dotted == "algorithm.overlong_penalty_factor" and not alg.overlong_buffer:
        return "algorithm.overlong_buffer is 0 (off)"
    engine = "vllm" if cfg.rollout.engine == "auto" else cfg.rollout.engine  # auto may pick vLLM: not known off
    if dotted == "algorithm.rollout_is_cap" and resolve_rollout_is(alg.rollout_is, engine) == "off":
        why = " (auto is off with rollout.engine = hf)" if alg.rollout_is == "auto" else ""
        return (f"no rollout importance sampling runs: algorithm.rollout_is = {alg.rollout_is}{why}; "
                "set algorithm.rollout_is=token to use it")
    if dotted == "trainer.total_epochs" and cfg.trainer.max_steps:
        return (f"trainer.max_steps = {cfg.trainer.max_steps} sets the run's length; set trainer.max_steps=0 "
                "to run the epochs")
    if dotted == "trainer.val_n" and cfg.trainer.val_n and not cfg.data.val_files:
        return "it samples the data.val_files problems, and there are none"
    if dotted == "trainer.val_before_train" and cfg.trainer.val_before_train and not cfg.trainer.test_every:
        return "trainer.test_every is 0 (no validation); set trainer.test_every"
    if dotted == "model.lora_dropout" and cfg.model.lora_dropout:
        return ("RL trains its adapters without dropout (tinyrl.models: the PPO ratio to the old "
                "log-probs, computed without it, must start at 1); `tinyrl sft` reads it")
    if dotted in TOOL_SETTINGS and not cfg.task.extra_tools:
        return _no_tools(cfg.task.name)
    if section == "task" and key not in EVERY_TASKS_KEYS:
        from tinyrl.tasks import option_unread  # local: the task modules import this one

        return option_unread(cfg, key)
    return None


def _ignored_by_sft(cfg: Config, dotted: str) -> bool:
    """A `tinyrl sft` config's setting that SFT never reads (_unread_by_sft): no check asks of it.
    False for every `tinyrl train` config, whose checks stay as they are."""
    return cfg.command == "sft" and _unread_by_sft(dotted) is not None


def _read_by_run(cfg: Config, dotted: str) -> bool:
    """Whether this run reads `dotted` (an unknown estimator: assume so, it is a problem of its own).
    `tinyrl sft` reads no [algorithm] or [critic] setting (_unread_by_sft): the config check asks
    nothing of them there (until 2026-11-29 it refused, e.g., rollout.n = 1 under a grouped
    estimator, neither of which SFT uses)."""
    if _ignored_by_sft(cfg, dotted):
        return False
    return cfg.algorithm.adv_estimator not in ADV_ESTIMATORS or _unread_because(cfg, dotted) is None


# Settings that bound episodes with tools (rollout/turns.py): a task that declares no tools never
# reads them. (The [task] options: each task lists its own, Task.options.)
TOOL_SETTINGS = ("rollout.max_turns", "rollout.max_tool_calls", "rollout.max_tool_response_tokens",
                 "rollout.tool_timeout_s", "rollout.tool_memory_mb", "rollout.tool_workers")


def _no_tools(task_name: str) -> str | None:
    from tinyrl.tasks import all_tasks  # local: the task modules import this one

    tasks = all_tasks()
    if task_name not in tasks or tasks[task_name].tools:
        return None  # an unknown task is a problem of its own, said by the config check
    with_tools = ", ".join(name for name, task in tasks.items() if task.tools)
    return f"task {task_name!r} calls no tools (tasks with tools: {with_tools}; or offer your own: task.extra_tools)"
