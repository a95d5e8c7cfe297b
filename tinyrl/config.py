"""Run configuration: dataclasses loaded from presets/*.toml plus `key.sub=value` overrides.

What it knows: the names, types and defaults of every setting, and which combinations make no
sense (`problems_of()` lists all of them at once, each with what to set). What it does not know:
models' real limits beyond their shipped config (see tinyrl.model_specs) or the card (memory plan).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import tomllib
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

from tinyrl.errors import TinyRLError
from tinyrl.rl.kl_names import KL_NAMES, KL_REFUSED
from tinyrl.roles import ESTIMATOR_NAMES, ESTIMATORS, Role, run_roles
from tinyrl.words import counted

REPO_ROOT = Path(__file__).resolve().parent.parent
PRESETS_DIR = REPO_ROOT / "presets"
DATA_DIR = REPO_ROOT / "data"


@dataclass
class ModelConfig:
    name: str = "tinyrl/tiny-qwen2"       # HF id, local dir, or the locally built tiny model
    finetune: str = "lora"                # lora: one frozen base + adapters; full: separate critic
    lora_rank: int = 32
    lora_alpha: int = 64
    lora_dropout: float = 0.0             # `tinyrl sft` only: RL trains without dropout (models.py)
    lora_targets: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    dtype: str = "auto"                   # auto: bf16 on CUDA, fp32 on CPU
    quantize: str = "none"                # none | nf4 (QLoRA base, CUDA + bitsandbytes only)
    gradient_checkpointing: bool = True
    logprob_chunk: int = 1024             # tokens per lm_head chunk when computing log-probs
    padding_free: bool = True             # training passes on the real tokens only (tinyrl.packing)
    # Start from a run's latest weights (a `tinyrl sft` run, usually): its actor merged into the
    # base, written to RUN_DIR/init_model once; that model is the new run's base AND reference.
    init_from: str = ""
    # A Jinja chat template (the text, or a path to a file holding it) used instead of the
    # tokenizer's own (verl: model.custom_chat_template): base models often have none.
    custom_chat_template: str = ""


@dataclass
class DataConfig:
    train_path: str = "runs/data/countdown/train.parquet"
    test_path: str = "data/countdown/test.parquet"
    # More validation files: `name=path` each, logged as val/<name>/... (e.g. aime=..., math500=...)
    val_files: list[str] = field(default_factory=list)
    generate: bool = True                 # generate train_path on first use when missing (if the task can)
    generate_train_size: int = 327_680    # rows generated; before the file exists, estimate-cost's epoch
    generate_seed: int = 0
    max_prompt_length: int = 256          # tokens; longer prompts are an error, not silently cut
    # Render `prompt` messages with the tokenizer's chat template (verl does; DAPO-Math-17k as
    # published needs it with an instruct model). false: the prompt text is fed as it is, so a
    # prompt must be text or one message (several are refused: tinyrl.data.io.check_one_message).
    chat_template: bool = False
    max_test_prompts: int = 1024          # validation uses the first N test prompts


@dataclass
class VLLMConfig:
    gpu_memory_utilization: float = 0.0   # 0: take it from the memory plan
    max_num_seqs: int = 0                 # 0: take it from the memory plan
    sleep_level: int = 1                  # 1: offload weights to CPU RAM; 2: discard, reload on wake
    enforce_eager: bool = False


@dataclass
class RolloutConfig:
    engine: str = "auto"                  # auto (vllm on CUDA, hf otherwise) | hf | vllm
    n: int = 1                            # samples per prompt (GRPO needs >= 2)
    temperature: float = 1.0
    top_p: float = 1.0
    max_response_length: int = 1024
    # Parity guard: mean |p_trainer - p_engine| of a step's sampled tokens above this re-syncs
    # the engine once, then stops the run (stale weights after a sync or wake).
    max_probs_diff: float = 0.05
    # Episodes with tools (a task that declares tools; tinyrl/rollout/turns.py). An episode is the
    # model's turns plus the tool turns between them; max_response_length bounds ALL its tokens
    # after the prompt, tool output included (verl: data.max_response_length in multi-turn).
    max_turns: int = 4                    # assistant turns per episode (verl: multi_turn.max_assistant_turns)
    max_tool_calls: int = 4               # tool calls per episode; calls beyond it get an error tool turn
    max_tool_response_tokens: int = 256   # a tool turn's output is cut to this (verl: max_tool_response_length)
    tool_timeout_s: float = 10.0          # wall clock per call (tinyrl.tools.python.run_code)
    tool_memory_mb: int = 1024            # address space per call
    tool_workers: int = 0                 # calls run at once; 0 = the usable cores
    vllm: VLLMConfig = field(default_factory=VLLMConfig)


@dataclass
class AlgorithmConfig:
    adv_estimator: str = "gae"            # tinyrl.roles.ESTIMATORS: gae | grpo | dr_grpo | rloo | reinforce_pp
    gamma: float = 1.0
    lam: float = 1.0
    kl_in_reward: bool = True             # TinyZero PPO: k1 penalty in the reward
    kl_penalty: str = "k1"                # k1 | abs | k2 | k3, or verl's kl | mse | low_var_kl (in-reward KL)
    kl_ctrl: str = "fixed"                # fixed | adaptive
    kl_coef: float = 0.001
    kl_target: float = 0.1                # adaptive controller only
    kl_horizon: int = 10_000              # adaptive controller only
    use_kl_loss: bool = False             # GRPO: KL as a loss term instead
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "k3"
    overlong_buffer: int = 0              # DAPO overlong shaping; 0 = off
    overlong_penalty_factor: float = 1.0
    # DAPO dynamic sampling: drop prompt groups whose rewards are all equal (no GRPO signal) and
    # roll out more prompts until train_batch_size groups are kept, at most max_gen_rounds rounds.
    dynamic_sampling: bool = False
    max_gen_rounds: int = 4
    # Truncated importance sampling for the engine/trainer probability gap (ALGORITHMS.md):
    # auto = token-level for the vLLM engine, off for hf (it samples from the trainer's own model).
    rollout_is: str = "auto"              # auto | off | token | sequence
    rollout_is_cap: float = 2.0           # C: weights are min(ratio, C)


DEFAULT_MICRO_TOKENS = 8192  # a micro_batch_tokens of 0 when no memory plan gives one (a CPU run)


@dataclass
class LearnerConfig:
    """What every trainable role owns: its optimizer, schedule, batching and loss aggregation.
    ActorConfig and CriticConfig each have their own copy (`actor.*`, `critic.*`)."""

    lr: float = 1e-6
    weight_decay: float = 0.0
    warmup_steps: int = 0
    ppo_mini_batch_size: int = 0          # prompts per optimizer step, each with all its samples; 0 = the whole batch
    ppo_epochs: int = 1
    loss_agg_mode: str = "token-mean"
    grad_clip: float = 1.0
    micro_batch_tokens: int = 0           # token budget per micro-batch; 0 = from the memory plan


@dataclass
class ActorConfig(LearnerConfig):
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0             # dual clip; must be > 1
    entropy_coeff: float = 0.001
    forward_micro_batch_tokens: int = 0   # no-grad passes (old/ref log-probs, values); 0 = plan or 2x the above


@dataclass
class CriticConfig(LearnerConfig):
    lr: float = 1e-5
    cliprange_value: float = 0.5


@dataclass
class TaskConfig:
    """The task (`tinyrl tasks`) and its options; each task reads the ones it knows."""

    name: str = "countdown"               # countdown | math | ... (tinyrl/tasks/)
    template: str = ""                    # prompt template of generated/converted data; "" = the task's first
    # countdown
    format_score: float = 0.1             # an <answer> that is found but wrong
    strict: bool = False                  # TinyZero's last-line rule, for curve comparisons
    # generated countdown data: numbers per task (one count drawn per task) and the largest number;
    # TinyZero's [3, 4] and 100 by default, fewer and smaller for a tiny model (countdown-tiny)
    operands: list[int] = field(default_factory=lambda: [3, 4])
    max_number: int = 100
    # math
    answer_format: str = "auto"           # auto | dapo ("Answer:" line) | boxed (last \boxed{})
    correct_score: float = 1.0            # DAPO: +1
    wrong_score: float = -1.0             # DAPO: -1 (wrong, missing or unparsable answer)
    verify_timeout_s: float = 5.0         # hard limit per math-verify call (a killed worker process)
    # retool (the maths options above, plus): subtracted once from an episode's score when any
    # of its tool calls failed (error, timeout, malformed, unknown tool, over the limit)
    tool_error_penalty: float = 0.0


@dataclass
class RewardConfig:
    fn: str = "task"                      # task (the task's own reward), a task name, path/to/file.py:func, module:func
    extra_fns: list[str] = field(default_factory=list)  # more reward functions, summed (TRL's reward_funcs)
    weights: list[float] = field(default_factory=list)  # one per [fn, *extra_fns]; empty = all 1.0
    timeout_s: float = 60.0               # a user reward function's time per call (tinyrl.rewards.limits)


@dataclass
class TrainerConfig:
    train_batch_size: int = 256           # prompts per step
    total_epochs: int = 1
    max_steps: int = 0                    # 0 = run the epochs
    seed: int = 1
    device: str = "auto"                  # auto | cpu | cuda
    memory_budget_gib: float = 0.0        # cap for every phase on the card; 0 = 90% of the card
    test_every: int = 0                   # 0 = no validation; the last step always validates when > 0
    val_before_train: bool = False        # verl's key: also validate the starting model (logged as step 0)
    val_n: int = 0                        # data.val_files: samples per problem besides greedy (pass@k, k = 1 and val_n)
    save_every: int = 0                   # 0 = only at the end
    # verl's trainer.critic_warmup, same meaning (verl 0.9.1 ray_trainer.py: the actor updates
    # only once critic_warmup <= the 1-based step): N > 1 gives N - 1 critic-only steps first.
    critic_warmup: int = 0
    keep_last: int = 2
    out_dir: str = "runs"
    log_samples: int = 4                  # sample completions kept per step
    tensorboard: bool = False             # also log to RUN_DIR/tensorboard (needs tensorboard)
    wandb: bool = False                   # also log to wandb in offline mode (needs wandb)


@dataclass
class SFTConfig:
    """`tinyrl sft`: the columns of its parquet files (verl's SFT formats) and their length.
    The rest comes from the usual sections: data.train_path / data.test_path (the validation
    loss), actor.* (lr, warmup, clip, micro-batch budget), trainer.* (batch = rows per step)."""

    format: str = "auto"                  # auto (by the columns) | single (prompt/response) | multiturn (messages)
    prompt_key: str = "prompt"            # verl data.prompt_key: text, or [{'role', 'content'}] as RL data
    response_key: str = "response"        # verl data.response_key: the target completion (text)
    messages_key: str = "messages"        # verl data.multiturn.messages_key: the whole conversation
    tools_key: str = "tools"              # verl data.multiturn.tools_key: handed to the chat template if present
    max_length: int = 1024                # tokens of prompt + response (or a conversation); longer rows are an error
    # Validation also generates greedily from data.test_path's prompts and scores them with the
    # task's reward (val/score, as `tinyrl train`): needs RL columns there (prompt, reward_model).
    val_generate: bool = False


@dataclass
class CostConfig:
    gpu: str = "rtx4090"
    price_per_hour: float = 0.0           # the user's price; 0 = unknown
    currency: str = "USD"


@dataclass
class Config:
    preset: str = ""
    description: str = ""
    # The command the preset is for: train (RL: rollouts, rewards, the algorithm's roles) or sft
    # (`tinyrl sft`: the actor alone on prompt/response or messages rows). probe-memory,
    # estimate-cost, doctor and export-verl plan, price, try or export that command's step.
    command: str = "train"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    cost: CostConfig = field(default_factory=CostConfig)
    # The --preset argument as the user gave it (load_config sets it): a name, or the path of a
    # file of theirs, whose stem `preset` is. No annotation, so not a field: never a setting, never
    # in config.json or `presets show`.
    given_preset = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def preset_arg(self) -> str:
        """--preset for a command line printed for the user to copy: what they gave. `--preset STEM`
        of their mine.toml is an unknown preset. A run's config.json has only the stem."""
        return self.given_preset or self.preset


# --------------------------------------------------------------------------- loading


def list_presets() -> dict[str, Path]:
    return {p.stem: p for p in sorted(PRESETS_DIR.glob("*.toml"))}


def presets_starting_from(run_dir: Path) -> list[str]:
    """`tinyrl CMD --preset NAME` for each shipped preset whose model.init_from is `run_dir` (read
    from here, as a run reads it): the demos' SFT run is met again by a second demo."""
    found = []
    for name, path in list_presets().items():
        raw = tomllib.loads(path.read_text())
        start = raw.get("model", {}).get("init_from", "")
        if start and Path(start).resolve() == run_dir.resolve():
            found.append(f"tinyrl {raw.get('command', 'train')} --preset {name}")
    return found


def load_config(preset: str, overrides: list[str] | None = None, check: bool = True,
                notes: list[str] | None = None, resume_dir: Path | None = None, planning: bool = False) -> Config:
    """Preset file (or a path to a .toml) + `key.sub=value` overrides, validated. Warnings that
    are not errors (role_rate_notes, unread_setting_notes) are appended to `notes` when the
    caller passes a list.
    `resume_dir`: the run `--resume` continues (its own starting model stands for model.init_from).
    `planning`: planned or priced, not run (probe-memory, estimate-cost): model.init_from's run
    need not exist yet, as a plan reads only model.name's shapes, which init_from must share."""
    path = _preset_path(preset)
    raw = read_preset(path)
    if not raw:  # every setting at its default is no run anyone chose (an empty file, a slip of the editor)
        raise TinyRLError(f"preset file {path} has no settings (it is empty or only comments)",
                          hint=f"start it from a shipped preset: `tinyrl presets show countdown-tiny >> {path}`, "
                               "then change what differs (`tinyrl presets` lists them; a preset cannot "
                               "name another to start from)")
    cfg = Config(preset=path.stem)  # the stem names the run directory (runs/NAME)
    cfg.given_preset = preset
    problems = _named_preset_problems(raw, overrides or [])
    problems += _apply_dict(cfg, {k: v for k, v in raw.items() if k != "preset"}, prefix="")
    problems += apply_overrides(cfg, overrides)
    if check or problems:  # a parse problem raises below: with every other problem, not the first kind only
        problems += problems_of(cfg, resume_dir, planning)
    if notes is not None:
        in_file = {f"{sec}.{k}" for sec, keys in raw.items() if isinstance(keys, dict) for k in keys}
        typed = {set_key(item) for item in overrides or []}
        # a preset file's key at its default changes nothing, read or not: `presets show P > mine.toml`
        # (README's way to make a preset) writes every key, and mine.toml started with 19 notes. A
        # --set is said even at its default: it was typed to change something.
        default = Config()
        changed = {d for d in in_file if _setting_or_none(cfg, d) != _setting_or_none(default, d)}
        notes += role_rate_notes(cfg, in_file | typed) + unread_setting_notes(cfg, changed | typed)
    if problems:
        shipped = path in list_presets().values()  # not the user's to edit: a copy of their own is
        where = (f"or in a preset of your own (`tinyrl presets show {preset} > mine.toml`, then --preset "
                 f"mine.toml)" if shipped else f"or in {path}")
        raise TinyRLError(
            f"preset {cfg.preset!r} has {counted(len(problems), 'problem')}:\n" + "\n".join(f"  - {p}" for p in problems),
            hint=f"fix them with --set key.sub=value, {where}; `tinyrl presets show {preset}` lists every key",
        )
    return cfg


def _named_preset_problems(raw: dict, overrides: list[str]) -> list[str]:
    """`preset = "countdown-tiny"` in a file (or --set preset=...) reads as "start from that
    preset", but presets do not include each other: it only renamed the run (and its default
    --out, runs/countdown-tiny) while every other setting stayed at its default."""
    given = ([f"preset = {raw['preset']!r} in the file"] if "preset" in raw else [])
    given += [f"--set {item.strip()}" for item in overrides if set_key(item) == "preset"]
    return [f"{what}: a preset cannot name another preset to start from (its name is the file's, "
            "runs go to runs/NAME); copy that preset's file (presets/NAME.toml) and change what differs"
            for what in given]


def check_command(cfg: Config, command: str) -> None:
    """`tinyrl train` on an SFT preset would run RL on supervised rows (and build a critic for
    them), `tinyrl sft` on an RL preset would fine-tune on prompts without responses: refuse both.
    The hint repeats the --preset argument as given (cfg.preset_arg)."""
    if cfg.command == command:
        return
    given = cfg.preset_arg
    if command == "train":
        raise TinyRLError(f"preset {cfg.preset!r} is an SFT preset (command = \"sft\"): `tinyrl train` runs RL, "
                          "not supervised fine-tuning on its rows",
                          hint=f"fine-tune with `tinyrl sft --preset {given}`; RL from that run is a train "
                          "preset with model.init_from=RUN_DIR (the SFT preset's description names it)")
    sft_presets = [name for name, path in list_presets().items() if read_preset(path).get("command") == "sft"]
    raise TinyRLError(f"preset {cfg.preset!r} is an RL preset (command = \"train\"): `tinyrl sft` fine-tunes on "
                      "prompt/response or messages rows, which its data does not hold",
                      hint=f"run RL with `tinyrl train --preset {given}`; for SFT use an SFT preset "
                      f"({', '.join(sft_presets)}) or set command = \"sft\" in your own (--set command=sft)")


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


def resolve_rollout_is(setting: str, engine_name: str) -> str:
    """algorithm.rollout_is -> "off" | "token" | "sequence". auto: token-level for vLLM (its
    kernels differ from the trainer's); off for hf, which samples from the trainer's own model."""
    if setting == "auto":
        return "token" if engine_name == "vllm" else "off"
    return setting


IN_REWARD_KL = ("algorithm.kl_penalty", "algorithm.kl_coef", "algorithm.kl_ctrl", "algorithm.kl_target",
                "algorithm.kl_horizon")


def unread_setting_notes(cfg: Config, given: set[str]) -> list[str]:
    """Settings the preset or --set gave that this RL run never reads, each with why: they used
    to be taken without a word (algorithm.lam under GRPO, critic.lr without a critic, a KL
    coefficient with the KL in neither the reward nor the loss), and the run trained as if they
    had not been given. Notes, not problems: a preset may carry keys for other algorithms."""
    if cfg.command != "train" or cfg.algorithm.adv_estimator not in ADV_ESTIMATORS:
        return []
    return [f"{dotted} is given but this run does not read it: {why}"
            for dotted in sorted(given) if (why := _unread_because(cfg, dotted))]


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
    if dotted in TOOL_SETTINGS:
        return _no_tools(cfg.task.name)
    if section == "task" and key not in ("name", "template"):
        from tinyrl.tasks import option_unread  # local: the task modules import this one

        return option_unread(cfg, key)
    return None


def _read_by_run(cfg: Config, dotted: str) -> bool:
    """Whether this run reads `dotted` (an unknown estimator: assume so, it is a problem of its own)."""
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
    return f"task {task_name!r} calls no tools (tasks with tools: {with_tools})"


# Keys that moved to the task section (issue 13): old presets get a pointer, old runs are migrated.
MOVED = {"data.template": "task.template", "reward.format_score": "task.format_score",
         "reward.strict": "task.strict"}


def _migrate(raw: dict) -> dict:
    """A config.json written before the task section: move its keys to their new homes."""
    raw = {k: dict(v) if isinstance(v, dict) else v for k, v in raw.items()}
    for old, new in MOVED.items():
        section, key = old.split(".")
        if isinstance(raw.get(section), dict) and key in raw[section]:
            raw.setdefault("task", {}).setdefault(new.split(".")[1], raw[section].pop(key))
    return raw


def config_from_dict(raw: dict) -> Config:
    """A run's saved config.json back into a Config (same checks as a preset file)."""
    cfg = Config()
    problems = _apply_dict(cfg, _migrate(raw), prefix="")
    if problems:
        raise TinyRLError("the saved config does not match this tinyrl version:\n"
                          + "\n".join(f"  - {p}" for p in problems),
                          hint="export/resume with the tinyrl version that wrote the run")
    return cfg


def _preset_path(preset: str) -> Path:
    candidate = Path(preset).expanduser()
    looks_like_path = candidate.suffix == ".toml" or "/" in preset or "\\" in preset or candidate.exists()
    presets = list_presets()
    if preset in presets:
        return presets[preset]
    if looks_like_path:
        if candidate.is_dir():
            raise TinyRLError(f"--preset {preset}: is a directory, not a .toml file",
                              hint=f"give a preset file inside it, or a preset name: {', '.join(presets)}")
        if not candidate.exists():
            raise TinyRLError(f"--preset {preset}: file not found ({candidate.absolute()})",
                              hint=f"check the path, or give a preset name: {', '.join(presets)}")
        return candidate
    near = difflib.get_close_matches(preset, presets, n=1)
    raise TinyRLError(
        f"unknown preset {preset!r}",
        hint=(f"did you mean {near[0]!r}? " if near else "")
        + f"available: {', '.join(presets)} (or a path to a .toml file)",
    )


def read_preset(path: Path) -> dict:
    """A preset file's TOML as a dict (a one-screen error when it cannot be read or parsed)."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TinyRLError(f"preset file {path} is not text (not UTF-8 at byte {exc.start}); is it a TOML file?",
                          hint="give a .toml preset, e.g. a copy of presets/countdown-tiny.toml") from exc
    except OSError as exc:
        raise TinyRLError(f"cannot read preset file {path}: {exc.strerror or exc}", hint="check the path") from exc
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TinyRLError(f"preset file {path} is not valid TOML: {exc}", hint="fix the file") from exc


def _apply_dict(obj: Any, raw: dict, prefix: str) -> list[str]:
    problems = []
    for key, value in raw.items():
        dotted = f"{prefix}{key}"
        if key not in _field_names(obj):
            problems.append(_unknown_key(obj, key, dotted))
            continue
        current = getattr(obj, key)
        if is_dataclass(current):
            if not isinstance(value, dict):
                problems.append(f"{dotted} is a section; write [{dotted}] with keys under it")
            else:
                problems += _apply_dict(current, value, prefix=dotted + ".")
            continue
        problem = _set_typed(obj, key, value, dotted)
        if problem:
            problems.append(problem)
    return problems


def _apply_override(cfg: Config, item: str) -> list[str]:
    if "=" not in item:
        return [f"--set {item!r} is not key=value (example: --set actor.lr=1e-6)"]
    dotted, text = item.split("=", 1)
    dotted = dotted.strip()
    obj: Any = cfg
    parts = dotted.split(".")
    for depth, part in enumerate(parts):
        if part not in _field_names(obj):
            return [_unknown_key(obj, part, ".".join(parts[: depth + 1]))]
        if depth < len(parts) - 1:
            obj = getattr(obj, part)
            if not is_dataclass(obj):
                return [f"{'.'.join(parts[:depth + 1])} is a value, not a section"]
    if is_dataclass(getattr(obj, parts[-1])):
        keys = ", ".join(f"{dotted}.{k}" for k in _field_names(getattr(obj, parts[-1])))
        return [f"{dotted} is a section; set one of its keys: {keys}"]
    problem = _set_typed(obj, parts[-1], _parse_value(text.strip()), dotted)
    return [problem] if problem else []


def set_key(item: str) -> str:
    """The dotted key of a --set item: 'actor.lr=1e-6' -> 'actor.lr'."""
    return item.split("=", 1)[0].strip()


class TypedSets(list):
    """--set items as the user typed them (the CLI's --set option): a key given twice is a problem
    load_config says with the others. A program's own list (a test's, the doctor's layered one)
    is a plain list, whose last item for a key wins."""


def apply_overrides(cfg: Config, overrides: list[str] | None) -> list[str]:
    """--set items onto `cfg` -> their problems. A key the user typed twice (TypedSets): which
    value was meant is not ours to guess, so neither is applied or judged, and it is said with
    the config's other problems (it was refused alone, hiding them, until 2026-11-28)."""
    typed = overrides if isinstance(overrides, TypedSets) else []
    problems = [f"{line}: give it once, with the value you mean" for line in repeated_sets(typed)]
    keys = [set_key(item) for item in typed]
    twice = {key for key in keys if keys.count(key) > 1}
    for item in overrides or []:
        problems += _apply_override(cfg, item) if set_key(item) not in twice | {"preset"} else []
    return problems


def repeated_sets(items: list[str]) -> list[str]:
    """One line per key that a --set list gives more than once, naming every value. The CLI
    refuses them (which one did the user mean?) instead of letting the last win: the config
    check used to report a problem for each value, as if both were set."""
    by_key: dict[str, list[str]] = {}
    for item in items:
        by_key.setdefault(set_key(item), []).append(item.strip())
    return [f"{key} is given {len(values)} times: " + ", ".join(f"--set {v}" for v in values)
            for key, values in by_key.items() if len(values) > 1]


def layered(user: list[str] | None, own: list[str]) -> list[str]:
    """A program's settings on top of a user's --set list (the doctor's small batch): the
    user's items for a key that `own` sets are dropped, so a command line built from the
    result names each key once, and the program's value is the one that runs."""
    mine = {set_key(item) for item in own}
    return [item for item in user or [] if set_key(item) not in mine] + list(own)


def _parse_value(text: str) -> Any:
    """TOML literal when it parses (1e-6, true, [1, 2], "x"), else the bare string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _field_names(obj: Any) -> list[str]:
    return [f.name for f in fields(obj)]


def _unknown_key(obj: Any, key: str, dotted: str) -> str:
    if dotted in MOVED:
        return f"{dotted} moved to {MOVED[dotted]} (the task section); write it there"
    prefix = dotted[: -len(key)]
    near = difflib.get_close_matches(key, _field_names(obj), n=1, cutoff=0.5)
    # a section's key given without its section (`max_steps=3`): listing the sections did not say which
    within = [f"{f.name}.{key}" for f in fields(obj) if is_dataclass(getattr(obj, f.name))
              and key in _field_names(getattr(obj, f.name))]
    hint = (f"did you mean {prefix}{near[0]}?" if near else f"did you mean {' or '.join(prefix + w for w in within)}?"
            if within else f"valid keys: {', '.join(prefix + n for n in _field_names(obj))}")
    return f"unknown key {dotted!r}; {hint}"


def _set_typed(obj: Any, key: str, value: Any, dotted: str) -> str | None:
    expected = get_type_hints(type(obj))[key]
    current = getattr(obj, key)
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if get_origin(expected) is list:  # each element too: [1, 2] as reward functions crashed later
        (element,) = get_args(expected)
        if not isinstance(value, list):
            return f"{dotted} must be a list of {element.__name__}, got {value!r}{_as_list_hint(dotted, value)}"
        if element is float:
            value = [float(v) if isinstance(v, int) and not isinstance(v, bool) else v for v in value]
        wrong = [v for v in value if not isinstance(v, element) or isinstance(v, bool)]
        if wrong:
            return f"{dotted} must be a list of {element.__name__}, got {value!r} ({wrong[0]!r} is not)"
        setattr(obj, key, value)
        return None
    ok = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, float),
        str: isinstance(value, str),
    }.get(expected, isinstance(value, type(current)))
    if not ok:
        quoted = isinstance(value, str) and expected in (int, float, bool) and isinstance(_parse_value(value), expected)
        unquote = f" (quoted, it is text: write {key} = {value} without the quotes)" if quoted else ""
        return f"{dotted} must be {getattr(expected, '__name__', str(expected))}, got {value!r}{unquote}"
    setattr(obj, key, value)
    return None


def _as_list_hint(dotted: str, value: Any) -> str:
    """How to write the list that a single value (or "a,b" text) was given for."""
    if isinstance(value, str):  # `[a.py:f]` unquoted in a shell is text too: its brackets are not the item's
        inner = value.strip()
        inner = inner[1:-1] if inner.startswith("[") and inner.endswith("]") else inner
        items = [v.strip().strip("'\"") for v in inner.split(",") if v.strip().strip("'\"")]
    else:
        items = [value]
    text = json.dumps(items)  # a JSON list of strings or numbers is a TOML list too
    return f"; write {dotted.rsplit('.', 1)[-1]} = {text} (with --set: '{dotted}={text}')"


# --------------------------------------------------------------------------- validation

ADV_ESTIMATORS = ESTIMATOR_NAMES  # tinyrl.roles: the one table
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
CHOICES = {
    "command": ("train", "sft"),
    "model.finetune": ("lora", "full"),
    "model.dtype": ("auto", "bf16", "fp16", "fp32"),
    "model.quantize": ("none", "nf4"),
    "rollout.engine": ("auto", "hf", "vllm"),
    "algorithm.adv_estimator": ADV_ESTIMATORS,
    "algorithm.kl_penalty": KL_NAMES,     # tinyrl.rl.kl_names: ours and verl's (kl = k1, mse = k2, ...)
    "algorithm.kl_loss_type": KL_NAMES,
    "algorithm.kl_ctrl": ("fixed", "adaptive"),
    "actor.loss_agg_mode": LOSS_AGG_MODES,
    "critic.loss_agg_mode": LOSS_AGG_MODES,
    "algorithm.rollout_is": ("auto", "off", "token", "sequence"),
    "trainer.device": ("auto", "cpu", "cuda"),
    "sft.format": ("auto", "single", "multiturn"),
}
# Values a user may bring from verl that tinyrl refuses: each says why, in place of the list.
ESTIMATOR_NAMES_ELSEWHERE = {  # what a user types for an estimator tinyrl has under another name
    "ppo": 'is the algorithm, not an advantage estimator: PPO with a critic is adv_estimator = "gae" '
           "(verl's name too; the presets that say PPO use it)",
    "reinforce_plus_plus": 'is verl\'s name for REINFORCE++: tinyrl\'s is "reinforce_pp" (export-verl maps it back)',
    "reinforce++": 'is REINFORCE++: set "reinforce_pp"',
}
FINETUNE_NAMES_ELSEWHERE = {  # QLoRA is LoRA on a 4-bit base: two settings, not a third mode
    "qlora": 'is LoRA on a 4-bit base: set model.finetune = "lora" and model.quantize = "nf4" (a CUDA card, '
             "with rollout.engine = hf)",
}
REFUSED_CHOICES = {"algorithm.kl_penalty": KL_REFUSED, "algorithm.kl_loss_type": KL_REFUSED,
                   "algorithm.adv_estimator": ESTIMATOR_NAMES_ELSEWHERE, "model.finetune": FINETUNE_NAMES_ELSEWHERE}


def get_setting(cfg: Config, dotted: str) -> Any:
    obj: Any = cfg
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def roles_of(cfg: Config) -> frozenset[Role]:
    """The roles this run builds, trains, plans, saves and shows (tinyrl.roles.run_roles); an SFT
    run trains the actor alone."""
    if cfg.command == "sft":
        return frozenset({Role.ACTOR})
    alg = cfg.algorithm
    return run_roles(alg.adv_estimator, alg.kl_in_reward or alg.use_kl_loss)


def has_critic(cfg: Config) -> bool:
    return Role.CRITIC in roles_of(cfg)


def problems_of(cfg: Config, resume_dir: Path | None = None, planning: bool = False) -> list[str]:
    """Every problem at once, each saying what to set."""
    out = []
    for dotted, allowed in CHOICES.items():
        value = get_setting(cfg, dotted)
        why = REFUSED_CHOICES.get(dotted, {}).get(value)
        if why:
            out.append(f"{dotted} = {value!r} {why}")
        elif value not in allowed:
            near = difflib.get_close_matches(str(value), allowed, n=1)
            guess = f" (did you mean {near[0]!r}?)" if near else ""
            out.append(f"{dotted} = {value!r} is not one of {', '.join(allowed)}{guess}")
    t, a, r = cfg.trainer, cfg.actor, cfg.rollout
    out += _count_problems(cfg)
    out += _number_problems(cfg)
    out += _algorithm_range_problems(cfg)
    for role in ("actor", "critic"):
        mini = get_setting(cfg, f"{role}.ppo_mini_batch_size")
        if mini < 0:
            out.append(f"{role}.ppo_mini_batch_size = {mini} must be >= 0 (0 = the whole batch)")
        elif mini > t.train_batch_size:
            out.append(f"{role}.ppo_mini_batch_size = {mini} is larger than "
                       f"trainer.train_batch_size = {t.train_batch_size}; set it to at most that")
        elif mini >= 1 and t.train_batch_size % mini:
            out.append(f"{role}.ppo_mini_batch_size = {mini} does not divide "
                       f"trainer.train_batch_size = {t.train_batch_size}; pick a divisor")
    est = ESTIMATORS.get(cfg.algorithm.adv_estimator)  # an unknown name is reported above
    if est is not None and est.grouped and r.n < 2:
        out.append(f"algorithm.adv_estimator = {cfg.algorithm.adv_estimator} compares samples of one "
                   f"prompt, so rollout.n must be at least 2 (got {r.n}); set rollout.n=8")
    out += _critic_warmup_problems(cfg)
    if cfg.algorithm.kl_in_reward and cfg.algorithm.use_kl_loss:
        out.append("algorithm.kl_in_reward and algorithm.use_kl_loss are both true: the KL would be "
                   "counted twice; set one of them to false")
    if a.clip_ratio_c <= 1.0:
        out.append(f"actor.clip_ratio_c = {a.clip_ratio_c} must be > 1 (dual clip); set 3.0")
    if not 0 < r.top_p <= 1:
        out.append(f"rollout.top_p = {r.top_p} must be in (0, 1]")
    if r.temperature <= 0:
        out.append(f"rollout.temperature = {r.temperature} must be > 0 (validation is greedy anyway)")
    if cfg.algorithm.rollout_is_cap <= 1.0:
        out.append(f"algorithm.rollout_is_cap = {cfg.algorithm.rollout_is_cap} must be > 1 (a cap of 1 "
                   "zeroes every token the engine found likelier than the trainer); set 2.0")
    if r.max_probs_diff <= 0:
        out.append(f"rollout.max_probs_diff = {r.max_probs_diff} must be > 0; set 0.05")
    if r.vllm.sleep_level not in (1, 2):
        out.append(f"rollout.vllm.sleep_level = {r.vllm.sleep_level} must be 1 or 2")
    if not 0 <= r.vllm.gpu_memory_utilization < 1:
        out.append(f"rollout.vllm.gpu_memory_utilization = {r.vllm.gpu_memory_utilization} must be in [0, 1)")
    if cfg.model.quantize == "nf4" and cfg.model.finetune == "full":
        out.append("model.quantize = nf4 freezes a 4-bit base; it needs model.finetune = lora")
    if cfg.model.quantize == "nf4" and r.engine in ("vllm", "auto"):
        # vLLM 0.32/0.33 have no bitsandbytes method (vllm/model_executor/layers/quantization/
        # __init__.py `QuantizationMethods`), so it cannot sample from the trainer's 4-bit base;
        # "auto" needs CUDA for nf4, and on CUDA it picks vLLM (rollout/factory.py `_auto`).
        out.append(f"model.quantize = nf4 with rollout.engine = {r.engine}: vLLM cannot load a bitsandbytes "
                   "4-bit base (vLLM 0.32/0.33 have no such quantization method); set rollout.engine=hf "
                   "(transformers samples from the NF4 base) or model.quantize=none")
    out += _length_problems(cfg)
    out += _data_problems(cfg)
    out += _init_from_problems(cfg, resume_dir, planning)
    out += _reward_problems(cfg)
    from tinyrl.tasks import task_problems  # local: the task modules import their own libraries lazily

    out += task_problems(cfg)
    return out


def _critic_warmup_problems(cfg: Config) -> list[str]:
    w = cfg.trainer.critic_warmup
    if w < 0:
        return [f"trainer.critic_warmup = {w} must be >= 0 (0 = the actor updates from the first step)"]
    if w > 1 and cfg.algorithm.adv_estimator in ADV_ESTIMATORS and not has_critic(cfg):
        return [f"trainer.critic_warmup = {w} holds the actor back for a critic, but algorithm.adv_estimator = "
                f"{cfg.algorithm.adv_estimator} has none; set trainer.critic_warmup=0"]
    return []


def _float_settings(obj: Any, prefix: str = "") -> dict[str, float]:
    return _settings_of_type(obj, float, prefix)


def _settings_of_type(obj: Any, kind: type, prefix: str = "") -> dict[str, Any]:
    """Every setting of type `kind` (bool is not an int here), by dotted name."""
    out = {}
    for f in fields(obj):
        value = getattr(obj, f.name)
        if is_dataclass(value):
            out.update(_settings_of_type(value, kind, f"{prefix}{f.name}."))
        elif isinstance(value, kind) and not isinstance(value, bool):
            out[prefix + f.name] = value
    return out


# Integer settings: counts, sizes and steps. Those below must be at least 1; seeds may be negative
# (trainer.seed within +-SEED_LIMIT, data.generate_seed any integer); a few have their own rule
# further down (or in their task). Every other integer is a
# count or a step where 0 means "off" / "from the plan" / "the default", so it must be >= 0:
# a new integer key is covered without being listed (trainer.max_steps = -3 used to run on).
AT_LEAST_ONE = ("algorithm.max_gen_rounds", "algorithm.kl_horizon", "trainer.train_batch_size", "rollout.n",
                "rollout.max_response_length", "data.max_prompt_length", "actor.ppo_epochs", "critic.ppo_epochs",
                "trainer.total_epochs", "model.lora_rank", "model.lora_alpha", "model.logprob_chunk",
                "trainer.keep_last", "data.max_test_prompts", "sft.max_length", "rollout.max_turns",
                "rollout.max_tool_response_tokens")
ANY_INTEGER = ("trainer.seed", "data.generate_seed")
SEED_LIMIT = 2**32  # the trainer derives generator seeds as seed * 1_000_033 + ...: torch takes 64 bits
MAX_CALL_S = 86_400.0  # per call of a reward, a tool or math-verify: setitimer raised OverflowError at 1e10
# rollout.tool_workers' bound: each is a Python process; past the cores of the largest single
# machines (~256), more at once only queue for the cores and each holds its own memory.
MAX_TOOL_WORKERS = 256
OWN_RULE = ("actor.ppo_mini_batch_size", "critic.ppo_mini_batch_size", "rollout.vllm.sleep_level", "task.max_number",
            "rollout.tool_memory_mb")


def _count_problems(cfg: Config) -> list[str]:
    out = []
    for dotted, value in _settings_of_type(cfg, int).items():
        if dotted in AT_LEAST_ONE and value < 1:
            out.append(f"{dotted} = {value} must be at least 1")
        elif dotted not in AT_LEAST_ONE + ANY_INTEGER + OWN_RULE and value < 0:
            out.append(f"{dotted} = {value} must be >= 0")
    from tinyrl.tools.python import MIN_MEMORY_MB  # the sandbox's own floor, said before a model loads

    if cfg.rollout.tool_memory_mb < MIN_MEMORY_MB:
        out.append(f"rollout.tool_memory_mb = {cfg.rollout.tool_memory_mb} must be at least {MIN_MEMORY_MB} "
                   "(MiB of address space per tool call; below it `import numpy` can hang until the call times out)")
    out += _tool_worker_problems(cfg)
    seed = cfg.trainer.seed  # (data.generate_seed seeds by its text: any integer does)
    if not -SEED_LIMIT < seed < SEED_LIMIT:
        out.append(f"trainer.seed = {seed} is out of range for a seed; set one between -{SEED_LIMIT - 1:,} and "
                   f"{SEED_LIMIT - 1:,} (e.g. 1)")
    return out


def _tool_worker_problems(cfg: Config) -> list[str]:
    """rollout.tool_workers: each call at once is a sandboxed Python process (100000 was taken).
    The bound is fixed, not this machine's cores: estimate-cost and export-verl check a config
    for another machine, and a resumed run may change it (resume_check.CHANGEABLE)."""
    workers = cfg.rollout.tool_workers
    if workers <= MAX_TOOL_WORKERS or not _read_by_run(cfg, "rollout.tool_workers"):
        return []
    from tinyrl.contention import usable_cpus

    return [f"rollout.tool_workers = {workers} is more than {MAX_TOOL_WORKERS} sandboxed tool calls at once; set "
            f"rollout.tool_workers=0 (one a usable core: {usable_cpus()} here), or a count up to a few a core"]


def _number_problems(cfg: Config) -> list[str]:
    """nan/inf anywhere, and rates that must be positive: caught here, before a model loads."""
    import math

    out = [f"{k} = {v} is not a finite number" for k, v in _float_settings(cfg).items() if not math.isfinite(v)]
    out += [f"reward.weights = {cfg.reward.weights} holds {w}, not a finite number"
            for w in cfg.reward.weights if not math.isfinite(w)][:1]  # nan made every step's reward nan
    for dotted in ("actor.lr", "critic.lr", "reward.timeout_s", "rollout.tool_timeout_s"):
        value = get_setting(cfg, dotted)
        if math.isfinite(value) and value <= 0:
            out.append(f"{dotted} = {value} must be > 0")
    if cfg.trainer.memory_budget_gib < 0:  # -1 planned at the default, where --budget -1 was refused
        out.append(f"trainer.memory_budget_gib = {cfg.trainer.memory_budget_gib} must be >= 0 (0: 90% of the card)")
    for dotted in ("reward.timeout_s", "rollout.tool_timeout_s", "task.verify_timeout_s"):
        value = get_setting(cfg, dotted)
        if math.isfinite(value) and value > MAX_CALL_S:
            out.append(f"{dotted} = {value:g} s is more than a day ({MAX_CALL_S:g} s) per call; the timers "
                       "that enforce it overflow past ~1e9 s: give a limit you would wait for")
    return out


def _algorithm_range_problems(cfg: Config) -> list[str]:
    """Values that run without an error but train wrongly: a gradient clip of 0 zeroes every
    update (a negative one reverses it), a clip range below 0 swaps clamp's bounds, a negative
    KL coefficient rewards drifting from the reference. Each would run to the end silently."""
    import math

    alg, out = cfg.algorithm, []
    for dotted in ("actor.grad_clip", "critic.grad_clip", "critic.cliprange_value"):
        value = get_setting(cfg, dotted)
        if math.isfinite(value) and value <= 0 and _read_by_run(cfg, dotted):
            out.append(f"{dotted} = {value} must be > 0 (0 scales every gradient to zero); set 1.0"
                       if dotted.endswith("grad_clip") else f"{dotted} = {value} must be > 0; set 0.5")
    low, high = cfg.actor.clip_ratio_low, cfg.actor.clip_ratio_high  # nan/inf: said by _number_problems
    if math.isfinite(low) and not 0 <= low < 1:
        out.append(f"actor.clip_ratio_low = {cfg.actor.clip_ratio_low} must be in [0, 1) (the ratio is clipped "
                   "below at 1 - clip_ratio_low); set 0.2")
    if math.isfinite(high) and high < 0:
        out.append(f"actor.clip_ratio_high = {cfg.actor.clip_ratio_high} must be >= 0 (the ratio is clipped above "
                   "at 1 + clip_ratio_high); set 0.2, or 0.28 for DAPO's clip-higher")
    for dotted in ("algorithm.gamma", "algorithm.lam"):
        value = get_setting(cfg, dotted)
        if math.isfinite(value) and not 0 <= value <= 1 and _read_by_run(cfg, dotted):
            out.append(f"{dotted} = {value} must be in [0, 1]; set 1.0")
    for dotted in ("algorithm.kl_coef", "algorithm.kl_loss_coef", "actor.weight_decay", "critic.weight_decay",
                   "algorithm.overlong_penalty_factor"):
        value = get_setting(cfg, dotted)  # nan/inf: said by _number_problems
        if math.isfinite(value) and value < 0 and _read_by_run(cfg, dotted):
            out.append(f"{dotted} = {value} must be >= 0")
    # (kl_ctrl = adaptive without the KL in the reward: a note, unread_setting_notes; verl's
    # controller too is the in-reward KL's. A refusal stopped runs started before it from resuming.)
    if alg.kl_ctrl == "adaptive" and alg.kl_in_reward and alg.kl_target <= 0:
        out.append(f"algorithm.kl_target = {alg.kl_target} must be > 0 for algorithm.kl_ctrl = adaptive; set 0.1")
    dropout = cfg.model.lora_dropout  # read by `tinyrl sft` alone (RL: a note); torch took 5 only at the model load
    if cfg.command == "sft" and cfg.model.finetune == "lora" and math.isfinite(dropout) and not 0 <= dropout < 1:
        out.append(f"model.lora_dropout = {dropout} must be in [0, 1) (the share of adapter inputs zeroed "
                   "in training); set 0.05, or 0 for none")
    if alg.overlong_buffer > cfg.rollout.max_response_length:
        out.append(f"algorithm.overlong_buffer = {alg.overlong_buffer} tokens is longer than rollout.max_response_length "
                   f"= {cfg.rollout.max_response_length}; set it below that (DAPO: a quarter of it), or 0 for off")
    return out


def _length_problems(cfg: Config) -> list[str]:
    limit = _max_positions(cfg.model.name)
    total = cfg.data.max_prompt_length + cfg.rollout.max_response_length
    out = []
    if limit is not None and total > limit:
        out.append(f"data.max_prompt_length + rollout.max_response_length = {total} tokens is longer than "
                   f"{cfg.model.name} allows ({limit}); lower rollout.max_response_length")
    if limit is not None and cfg.sft.max_length > limit:
        out.append(f"sft.max_length = {cfg.sft.max_length} tokens is longer than {cfg.model.name} allows ({limit}); "
                   f"set sft.max_length={limit} or less")
    return out


def prompt_room(cfg: Config) -> int | None:
    """The longest data.max_prompt_length this model takes beside rollout.max_response_length
    (None when its context length is unknown here)."""
    limit = _max_positions(cfg.model.name)
    return None if limit is None else limit - cfg.rollout.max_response_length


def _max_positions(name: str) -> int | None:
    """The model's context length from its shipped or local config; None when unknown here
    (an HF id neither shipped nor in the Hugging Face cache is checked when the model loads)."""
    from tinyrl import model_specs  # local: keeps `tinyrl --help` fast
    from tinyrl.tiny_model import TINY_MODEL_NAME

    if name == TINY_MODEL_NAME:
        return 2048  # its recipe's max_position_embeddings; checked without building it
    try:
        spec = model_specs.load_spec(name, download=False)  # validation never waits on the network
    except TinyRLError:
        return None
    return spec.get("max_position_embeddings")


def _data_problems(cfg: Config) -> list[str]:
    out = []
    test = resolve_path(cfg.data.test_path)
    if cfg.trainer.test_every and not test.exists():
        from tinyrl.tasks import all_tasks, data_hint  # local: the task modules import this one

        make = data_hint(cfg, cfg.data.test_path) if cfg.task.name in all_tasks() else \
            f"`tinyrl data {cfg.task.name} --out DIR`"  # an unknown task is a problem of its own
        out.append(f"data.test_path = {cfg.data.test_path} does not exist; make it with {make} "
                   "or set trainer.test_every=0")
    seen: set[str] = set()
    for item in cfg.data.val_files:
        name, sep, path = item.partition("=")
        if not sep or not name or not path or "/" in name:
            out.append(f"data.val_files entry {item!r} is not name=path (e.g. aime=data/aime.parquet)")
            continue
        if name in seen:  # their metrics (val/NAME/...) would be one; said as eval's --data error before
            out.append(f"data.val_files names {name!r} twice; give each file its own name (e.g. aime=..., math500=...)")
        seen.add(name)
        if cfg.trainer.test_every and not resolve_path(path).exists():
            out.append(f"data.val_files: {name} = {path} does not exist")
    return out  # a missing data.train_path is generated (when the task can) on first use


def _init_from_problems(cfg: Config, resume_dir: Path | None, planning: bool = False) -> list[str]:
    """model.init_from: a run directory with a checkpoint, made on the same base model. A resumed
    run reads only its own copy (RUN/init_model), so the source may have moved or gone; a plan
    or a price needs none yet (`planning`)."""
    if not cfg.model.init_from:
        return []
    from tinyrl.init_from import resumes_from_own_copy, source_problems  # local: keeps `tinyrl --help` fast

    if resume_dir is not None and resumes_from_own_copy(cfg, resume_dir):
        return []
    return source_problems(cfg, not_made_yet_ok=planning)


def _reward_problems(cfg: Config) -> list[str]:
    from tinyrl.tasks.rewards import spec_problem  # local: the task modules import their libraries lazily

    settings = [("reward.fn", cfg.reward.fn)] + [(f"reward.extra_fns[{i}]", spec)
                                                 for i, spec in enumerate(cfg.reward.extra_fns)]
    out = [problem for setting, spec in settings if (problem := spec_problem(spec, setting))]
    n = 1 + len(cfg.reward.extra_fns)
    if cfg.reward.weights and len(cfg.reward.weights) != n:
        out.append(f"reward.weights has {len(cfg.reward.weights)} values for {n} reward functions "
                   "([fn, *extra_fns]); give one weight each, or none for all 1.0")
    return out


def resolve_path(path: str) -> Path:
    """Relative paths are relative to the working directory, or to the repo for shipped files
    (data/..., presets/...: test sets, chat templates). Only those: a generated file
    (runs/data/...) belongs to the directory the command runs in, and one that a run in the
    checkout left must not stand in for it."""
    p = Path(path).expanduser()
    if p.is_absolute() or p.exists():
        return p
    return shipped_path(p) or p


def shipped_path(path: str | Path) -> Path | None:
    """The file tinyrl ships under this relative path (REPO_ROOT/data/..., REPO_ROOT/presets/...),
    as resolve_path finds it where the path is not found from the working directory; else None."""
    shipped = REPO_ROOT / Path(path).expanduser()
    found = shipped.exists() and any(shipped.resolve().is_relative_to(d.resolve()) for d in (DATA_DIR, PRESETS_DIR))
    return shipped if found else None
