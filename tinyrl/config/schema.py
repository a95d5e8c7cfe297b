"""The settings: one dataclass per preset section, their defaults, and the facts derived from them
(the roles a run builds, the rollout importance sampling an engine gets).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from tinyrl.roles import Role, run_roles


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
    # your own tools, offered after the task's: path/to/file.py:NAME, NAME a tinyrl.tools.Tool there
    extra_tools: list[str] = field(default_factory=list)


# [task] keys every task reads; the others are options of the tasks that list them (Task.options)
EVERY_TASKS_KEYS = ("name", "template", "extra_tools")


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


def resolve_rollout_is(setting: str, engine_name: str) -> str:
    """algorithm.rollout_is -> "off" | "token" | "sequence". auto: token-level for vLLM (its
    kernels differ from the trainer's); off for hf, which samples from the trainer's own model."""
    if setting == "auto":
        return "token" if engine_name == "vllm" else "off"
    return setting


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
