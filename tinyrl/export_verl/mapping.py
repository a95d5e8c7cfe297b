"""tinyrl settings -> verl `main_ppo` overrides, for the verl version in VERL_VERSION.

Every key below was read from verl 0.9.1's `verl/trainer/config/_generated_ppo_trainer.yaml`
(tests/test_export_verl.py checks each one against the installed package). Every tinyrl setting
is either mapped, or explained in a note that run_verl.sh prints at its top: a setting this
module does not know (added to tinyrl after it) becomes a note too, so nothing is dropped silently.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from tinyrl.config import Config, has_critic  # tinyrl.roles: verl, too, builds a critic for gae only
from tinyrl.export_verl.tools import map_tools

VERL_VERSION = "0.9.1"
AR = "actor_rollout_ref"
# tinyrl name -> verl's AdvantageEstimator (verl/trainer/ppo/core_algos.py); dr_grpo is grpo
# without the std division (`algorithm.norm_adv_by_std_in_grpo=false`, verl's Dr.GRPO recipe).
# verl's name of each of tinyrl.roles.ESTIMATORS (tests/test_roles.py: every one is here)
ADV = {"gae": "gae", "grpo": "grpo", "dr_grpo": "grpo", "rloo": "rloo", "reinforce_pp": "reinforce_plus_plus"}
# algorithm.kl_penalty / kl_loss_type pass as they are: tinyrl.rl.kl_names is verl's names (tested).
DTYPE = {"bf16": "bfloat16", "fp16": "float16", "auto": "bfloat16"}
# tinyrl feeds the prompt text as it is (the template is already in the data); verl 0.9.1 always
# renders `prompt` through the tokenizer's chat template, so give it one that adds nothing.
RAW_CHAT_TEMPLATE = "{{ messages[0].content }}"
# What run_verl.sh can pass inside bash "..." and Hydra '...' (tinyrl.export_verl.files quotes it)
CMDLINE_SAFE = re.compile(r"[^'\"$`\\\n]*")
_MISSING = object()


@dataclass
class Context:
    """What the mapping needs beyond the config: where things are, from the script's view."""
    model_path: str                # HF id, or a path (e.g. $HERE/actor)
    train_files: Any               # value for data.train_files
    val_files: Any
    reward_path: Any               # value for reward.custom_reward_function.path
    steps_per_epoch: int           # rows // train_batch_size, as verl's dataloader (drop_last)
    gpus: int = 1
    nodes: int = 1
    critic_model_path: str = ""    # default: model_path
    tool_config_path: str = ""     # value for multi_turn.tool_config_path (a task with tools)
    actor_given: bool = False      # model_path is a `tinyrl export` passed as --actor, not the base


@dataclass
class Mapping:
    overrides: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)     # tinyrl settings verl cannot express as set
    warnings: list[str] = field(default_factory=list)  # what will stop or mislead verl: said on the console too
    used: set[str] = field(default_factory=set)

    def get(self, cfg: Config, dotted: str, default: Any = _MISSING) -> Any:
        """A tinyrl setting, marked as handled; `default` when this tinyrl has no such key."""
        obj: Any = cfg
        for part in dotted.split("."):
            obj = getattr(obj, part, _MISSING)
            if obj is _MISSING:
                if default is _MISSING:
                    raise AttributeError(dotted)
                return default
        self.used.add(dotted)
        return obj

    def note(self, cfg: Config, dotted: str, why: str) -> None:
        value = self.get(cfg, dotted, _MISSING)
        self.notes.append(f"{dotted} = {value!r}: {why}")


def leaves(tree: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def map_config(cfg: Config, ctx: Context) -> Mapping:
    m = Mapping()
    o = m.overrides
    for part in (_model, _data, _rollout, _algorithm, _actor, _critic, _trainer):
        part(cfg, ctx, m, o)
    for dotted in ("reward.fn", "reward.extra_fns", "reward.weights", "reward.timeout_s",
                   *(f"task.{f.name}" for f in fields(cfg.task))):
        m.get(cfg, dotted, None)  # baked into reward_fn.py (the template and generation options: in the data)
    # verl 0.9.1 moved the top-level custom_reward_function.* (still accepted, migrated in
    # experimental/reward_loop/reward_loop.py) to reward.custom_reward_function.*: use the new home.
    o["reward.custom_reward_function.path"] = ctx.reward_path
    o["reward.custom_reward_function.name"] = "compute_score"
    for dotted in ("preset", "description", "command"):  # command: "train" here (export_verl refuses SFT presets)
        m.get(cfg, dotted, None)
    for dotted in ("cost.gpu", "cost.price_per_hour", "cost.currency"):
        m.get(cfg, dotted, None)  # tinyrl's cost estimate only; nothing to train with
    for key in cfg.sft.__dataclass_fields__:
        m.get(cfg, f"sft.{key}", None)  # `tinyrl sft`'s settings; an RL recipe has no SFT part
    m.overrides = dict(sorted(o.items()))  # grouped by verl section
    for dotted, value in leaves(cfg.to_dict()).items():
        if dotted not in m.used:
            m.notes.append(f"{dotted} = {value!r}: not known to this exporter (a newer tinyrl setting); "
                           "check whether verl has it")
    return m


def saved_chat_template(model_dir: Path) -> str | None:
    """The chat template a saved tokenizer carries: transformers 5 writes `chat_template.jinja`,
    older ones a `chat_template` key in tokenizer_config.json; None when it has neither."""
    jinja = model_dir / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    try:
        value = json.loads((model_dir / "tokenizer_config.json").read_text()).get("chat_template")
    except (OSError, ValueError):
        return None
    return value if isinstance(value, str) else None


def _model(cfg, ctx, m, o):
    g = lambda k, d=_MISSING: m.get(cfg, k, d)  # noqa: E731
    g("model.name")  # Context.model_path: the base, the built tiny model, or an exported actor
    o[f"{AR}.model.path"] = ctx.model_path
    start = g("model.init_from", "")
    if start and ctx.actor_given:
        m.note(cfg, "model.init_from", "verl starts from --actor (model.path) instead, its reference too: the "
               "export of that run, or of this one")
    elif start:  # the recipe runs as printed, from the bare base: said on the console, not only in the script
        m.warnings.append(f"model.init_from = {start}: this recipe starts verl from the base model "
                          f"({ctx.model_path}), not from that run; run `tinyrl export {start} --out DIR` and export "
                          "again with `--actor DIR` (it is then the actor's start and the KL reference)")
    custom = g("model.custom_chat_template", "")
    if not g("data.chat_template", False):  # with it, verl renders `prompt` as tinyrl does
        o[f"{AR}.model.custom_chat_template"] = RAW_CHAT_TEMPLATE
    elif custom:
        from tinyrl.setup import read_chat_template

        text = read_chat_template(custom)
        if CMDLINE_SAFE.fullmatch(text):
            o[f"{AR}.model.custom_chat_template"] = text
        elif ctx.actor_given and saved_chat_template(Path(ctx.model_path)) == text:
            m.note(cfg, "model.custom_chat_template", "not passed on the command line: the --actor directory's "
                   "tokenizer carries it (`tinyrl export` saved it), and verl uses the tokenizer's own")
        else:  # verl 0.9.1 takes the text itself (workers/config/model.py `custom_chat_template: Optional[str]`)
            m.note(cfg, "model.custom_chat_template", "not passed: the template has quotes, backslashes or "
                   "newlines that a command line cannot carry to verl safely; put its text in the model "
                   "directory's tokenizer_config.json as `chat_template` (verl then uses the tokenizer's own)")
    o[f"{AR}.model.enable_gradient_checkpointing"] = g("model.gradient_checkpointing")
    o[f"{AR}.model.use_remove_padding"] = g("model.padding_free")  # verl's packed (unpadded) passes
    lora = g("model.finetune") == "lora"
    if not lora:  # tinyrl ignores the LoRA settings of a full fine-tune, and so does verl at rank 0
        for dotted in ("model.lora_rank", "model.lora_alpha", "model.lora_targets", "model.lora_dropout"):
            g(dotted)
    prefixes = (f"{AR}.model", "critic.model") if has_critic(cfg) else (f"{AR}.model",)
    for prefix in prefixes:
        o[f"{prefix}.lora_rank"] = g("model.lora_rank") if lora else 0
        if lora:
            o[f"{prefix}.lora_alpha"] = g("model.lora_alpha")
            o[f"{prefix}.target_modules"] = list(g("model.lora_targets"))
    if lora:
        m.notes.append("model.finetune = 'lora': verl loads actor, critic and reference separately "
                       "(reference = the actor with its adapter off); tinyrl's one shared frozen base "
                       "is a memory layout, the maths is the same")
    if g("model.lora_dropout") and lora:
        m.note(cfg, "model.lora_dropout", "verl's FSDP engine builds LoraConfig without dropout (0.0)")
    dtype = g("model.dtype")
    if dtype in DTYPE:
        for key in (f"{AR}.actor.fsdp_config.dtype", f"{AR}.ref.fsdp_config.dtype", f"{AR}.rollout.dtype"):
            o[key] = DTYPE[dtype]
        if has_critic(cfg):
            o["critic.fsdp.dtype"] = DTYPE[dtype]
    else:
        m.note(cfg, "model.dtype", "verl computes in bfloat16 or float16 over fp32 master weights; "
                                   "bfloat16 kept")
    if g("model.quantize") != "none":
        m.note(cfg, "model.quantize", "verl's FSDP engine has no 4-bit (QLoRA) base; the base loads in full")
    m.note(cfg, "model.logprob_chunk", "tinyrl's lm_head chunking (memory only); verl uses its own kernels")


def _data(cfg, ctx, m, o):
    g = lambda k, d=_MISSING: m.get(cfg, k, d)  # noqa: E731
    g("data.train_path"), g("data.test_path"), g("data.max_test_prompts")  # copied by files.py
    o["data.train_files"], o["data.val_files"] = ctx.train_files, ctx.val_files
    o["data.max_prompt_length"] = g("data.max_prompt_length")
    o["data.truncation"] = "error"  # tinyrl: a longer prompt is an error, never cut
    for dotted in ("data.generate", "data.generate_train_size", "data.generate_seed"):
        g(dotted)  # the copied files already hold the rows these made
    if g("data.val_files", []):  # copied to data/val_<name>.parquet, listed in ctx.val_files after test.parquet
        m.note(cfg, "data.val_files", "copied beside test.parquet and listed in verl's data.val_files; verl "
               "reports validation per data_source (val-core/<data_source>/...), not per file, so files "
               "sharing a data_source are pooled (verl 0.9.1 trainer/ppo/ray_trainer.py _val_metrics_update)")


def _rollout(cfg, ctx, m, o):
    g = lambda k, d=_MISSING: m.get(cfg, k, d)  # noqa: E731
    r = f"{AR}.rollout"
    o[f"{r}.name"] = "vllm"
    if g("rollout.engine") == "hf":
        m.note(cfg, "rollout.engine", "verl rolls out with vLLM (or SGLang); vllm set")
    o[f"{r}.n"] = g("rollout.n")
    o[f"{r}.temperature"], o[f"{r}.top_p"] = g("rollout.temperature"), g("rollout.top_p")
    o["data.max_response_length"] = g("rollout.max_response_length")
    o[f"{r}.tensor_model_parallel_size"] = 1  # tinyrl's models fit one card; verl's default is 2
    if g("rollout.vllm.gpu_memory_utilization"):
        o[f"{r}.gpu_memory_utilization"] = g("rollout.vllm.gpu_memory_utilization")
    else:
        m.note(cfg, "rollout.vllm.gpu_memory_utilization", "0 = from tinyrl's memory plan of one card; "
               "verl's default (0.5) kept, tune it for your cards")
    if g("rollout.vllm.max_num_seqs"):
        o[f"{r}.max_num_seqs"] = g("rollout.vllm.max_num_seqs")
    else:
        m.note(cfg, "rollout.vllm.max_num_seqs", "0 = from the memory plan; verl's default (256) kept")
    o[f"{r}.enforce_eager"] = g("rollout.vllm.enforce_eager")
    o[f"{r}.free_cache_engine"] = True  # tinyrl always puts vLLM to sleep while training
    map_tools(cfg, m, o, r, ctx.tool_config_path)  # multi-turn episodes of a task with tools
    m.note(cfg, "rollout.vllm.sleep_level", "verl picks vLLM's sleep level itself (free_cache_engine=true)")
    if g("rollout.max_probs_diff", None) is not None:
        m.note(cfg, "rollout.max_probs_diff", "tinyrl's parity guard (re-sync, then stop); verl logs "
               "the engine/trainer gap but does not stop on it")


def _algorithm(cfg, ctx, m, o):
    g = lambda k, d=_MISSING: m.get(cfg, k, d)  # noqa: E731
    est = g("algorithm.adv_estimator")
    o["algorithm.adv_estimator"] = ADV[est]
    if est in ("grpo", "dr_grpo"):
        o["algorithm.norm_adv_by_std_in_grpo"] = est == "grpo"
    o["algorithm.gamma"], o["algorithm.lam"] = g("algorithm.gamma"), g("algorithm.lam")
    o["algorithm.use_kl_in_reward"] = g("algorithm.kl_in_reward")
    o["algorithm.kl_penalty"] = g("algorithm.kl_penalty")
    o["algorithm.kl_ctrl.type"] = g("algorithm.kl_ctrl")
    o["algorithm.kl_ctrl.kl_coef"] = g("algorithm.kl_coef")
    o["algorithm.kl_ctrl.target_kl"] = g("algorithm.kl_target")
    o["algorithm.kl_ctrl.horizon"] = g("algorithm.kl_horizon")
    o[f"{AR}.actor.use_kl_loss"] = g("algorithm.use_kl_loss")
    o[f"{AR}.actor.kl_loss_coef"] = g("algorithm.kl_loss_coef")
    o[f"{AR}.actor.kl_loss_type"] = g("algorithm.kl_loss_type")
    # DAPO dynamic sampling = verl's filter_groups on the pre-KL sequence reward.
    o["algorithm.filter_groups.enable"] = g("algorithm.dynamic_sampling", False)
    if o["algorithm.filter_groups.enable"]:
        o["algorithm.filter_groups.metric"] = "reward"
        o["algorithm.filter_groups.max_num_gen_batches"] = g("algorithm.max_gen_rounds")
    else:
        g("algorithm.max_gen_rounds", None)
    g("algorithm.overlong_penalty_factor")
    if g("algorithm.overlong_buffer"):
        m.note(cfg, "algorithm.overlong_buffer", "verl does DAPO overlong shaping in its `dapo` reward "
               "manager (reward.reward_manager.name=dapo plus reward_kwargs.overlong_buffer_cfg.*, keys "
               "its base config lacks); add them by hand (penalty factor "
               f"{cfg.algorithm.overlong_penalty_factor})")
    # Truncated IS for the engine/trainer gap: verl's algorithm.rollout_correction (decoupled mode,
    # token or sequence weights min(ratio, threshold)). The export always rolls out with vLLM, so
    # tinyrl's `auto` (token-level for vLLM) is token.
    mode = g("algorithm.rollout_is", None)
    if mode is not None:
        o["algorithm.rollout_correction.rollout_is"] = None if mode == "off" else \
            ("token" if mode == "auto" else mode)
        o["algorithm.rollout_correction.rollout_is_threshold"] = g("algorithm.rollout_is_cap", 2.0)


def _learner(cfg, m, o, role: str, prefix: str):
    """What actor.* and critic.* share (tinyrl's LearnerConfig; older tinyrl: a subset)."""
    g = lambda k, d=_MISSING: m.get(cfg, k, d)  # noqa: E731
    o[f"{prefix}.optim.lr"] = g(f"{role}.lr")
    o[f"{prefix}.optim.weight_decay"] = g(f"{role}.weight_decay", cfg.actor.weight_decay)
    o[f"{prefix}.optim.lr_warmup_steps"] = g(f"{role}.warmup_steps", cfg.actor.warmup_steps)
    o[f"{prefix}.optim.lr_scheduler_type"] = "constant"  # tinyrl: linear warm-up, then constant
    o[f"{prefix}.optim.clip_grad"] = g(f"{role}.grad_clip")
    mini = g(f"{role}.ppo_mini_batch_size", None)
    if mini is not None:  # 0 = the whole batch
        o[f"{prefix}.ppo_mini_batch_size"] = mini or cfg.trainer.train_batch_size
    if g(f"{role}.ppo_epochs", None) is not None:
        o[f"{prefix}.ppo_epochs"] = g(f"{role}.ppo_epochs")
    if g(f"{role}.loss_agg_mode", None) is not None:
        o[f"{prefix}.loss_agg_mode"] = g(f"{role}.loss_agg_mode")
    o[f"{prefix}.use_dynamic_bsz"] = True  # tinyrl packs micro-batches by tokens
    tokens = g(f"{role}.micro_batch_tokens")
    if tokens:
        o[f"{prefix}.ppo_max_token_len_per_gpu"] = max(tokens, _seq_len(cfg))
    else:
        m.note(cfg, f"{role}.micro_batch_tokens", "0 = from tinyrl's memory plan of one card; verl's "
               f"default {prefix}.ppo_max_token_len_per_gpu kept, tune it for your cards")
    return tokens


def _seq_len(cfg: Config) -> int:
    """verl's dynamic batching needs room for one whole sequence per micro-batch."""
    return cfg.data.max_prompt_length + cfg.rollout.max_response_length


def _actor(cfg, ctx, m, o):
    g = lambda k, d=_MISSING: m.get(cfg, k, d)  # noqa: E731
    a = f"{AR}.actor"
    tokens = _learner(cfg, m, o, "actor", a)
    o[f"{a}.clip_ratio_low"], o[f"{a}.clip_ratio_high"] = g("actor.clip_ratio_low"), g("actor.clip_ratio_high")
    o[f"{a}.clip_ratio_c"] = g("actor.clip_ratio_c")
    o[f"{a}.entropy_coeff"] = g("actor.entropy_coeff")
    forward = g("actor.forward_micro_batch_tokens") or 2 * tokens  # tinyrl: twice the update budget
    if forward:  # old log-probs (rollout worker), reference log-probs (ref worker)
        forward = max(forward, _seq_len(cfg))
        o[f"{AR}.rollout.log_prob_max_token_len_per_gpu"] = forward
        o[f"{AR}.ref.log_prob_max_token_len_per_gpu"] = forward
        if has_critic(cfg):
            o["critic.forward_max_token_len_per_gpu"] = forward


def _critic(cfg, ctx, m, o):
    if not has_critic(cfg):
        for dotted in leaves(cfg.to_dict()["critic"], "critic."):
            m.get(cfg, dotted)  # no critic in this algorithm, in tinyrl or in verl
        return
    o["critic.model.path"] = ctx.critic_model_path or ctx.model_path
    o["critic.model.enable_gradient_checkpointing"] = cfg.model.gradient_checkpointing
    o["critic.model.use_remove_padding"] = cfg.model.padding_free
    _learner(cfg, m, o, "critic", "critic")
    o["critic.cliprange_value"] = m.get(cfg, "critic.cliprange_value")


def _trainer(cfg, ctx, m, o):
    g = lambda k, d=_MISSING: m.get(cfg, k, d)  # noqa: E731
    o["data.train_batch_size"] = g("trainer.train_batch_size")
    o["trainer.total_epochs"] = g("trainer.total_epochs")
    total = g("trainer.max_steps") or ctx.steps_per_epoch * cfg.trainer.total_epochs
    if cfg.trainer.max_steps:
        o["trainer.total_training_steps"] = cfg.trainer.max_steps
    seed = g("trainer.seed")
    o["data.seed"] = o[f"{AR}.rollout.seed"] = o[f"{AR}.actor.data_loader_seed"] = seed
    m.notes.append(f"trainer.seed = {seed}: set as verl's data, rollout and data-loader seeds; "
                   "verl's random streams differ from tinyrl's, so runs match in distribution only")
    if g("trainer.device") == "cpu":
        m.note(cfg, "trainer.device", "verl trains on GPUs; cuda set")
    o["trainer.device"] = "cuda"
    m.note(cfg, "trainer.memory_budget_gib", "tinyrl's per-card memory plan; verl sizes by "
           "gpu_memory_utilization and the token budgets")
    # the same key and meaning (verl 0.9.1 trainer/ppo/ray_trainer.py: the actor waits while
    # critic_warmup > global_steps, which counts from 1)
    o["trainer.critic_warmup"] = g("trainer.critic_warmup")
    o["trainer.test_freq"] = g("trainer.test_every") or -1
    if g("trainer.val_n", 0):
        m.note(cfg, "trainer.val_n", "tinyrl samples val_n completions per validation problem for pass@k; "
               "verl validates with actor_rollout_ref.rollout.val_kwargs.n (set it by hand)")
    # verl's own key: validate the starting model once before the first step (as tinyrl does)
    o["trainer.val_before_train"] = bool(g("trainer.val_before_train") and g("trainer.test_every"))
    # tinyrl 0 = save at the end only; verl saves nothing unless save_freq > 0 (then also at the end)
    o["trainer.save_freq"] = g("trainer.save_every") or max(1, total)
    o["trainer.max_actor_ckpt_to_keep"] = o["trainer.max_critic_ckpt_to_keep"] = g("trainer.keep_last")
    g("trainer.out_dir")
    o["trainer.default_local_dir"] = "$HERE/checkpoints"
    loggers = ["console"] + (["tensorboard"] if g("trainer.tensorboard") else []) + \
        (["wandb"] if g("trainer.wandb") else [])
    o["trainer.logger"] = loggers
    m.note(cfg, "trainer.log_samples", "verl logs validation generations instead "
           "(trainer.log_val_generations)")
    o["trainer.project_name"], o["trainer.experiment_name"] = "tinyrl", cfg.preset or "run"
    o["trainer.n_gpus_per_node"], o["trainer.nnodes"] = ctx.gpus, ctx.nodes
    world, n = ctx.gpus * ctx.nodes, cfg.rollout.n
    for name, prompts in (("trainer.train_batch_size", cfg.trainer.train_batch_size),
                          ("actor.ppo_mini_batch_size", o[f"{AR}.actor.ppo_mini_batch_size"])):
        if prompts * n % world:
            m.warnings.append(f"{name} = {prompts} x rollout.n = {n} sequences do not split evenly over "
                           f"{world} GPUs; verl balances batches across GPUs, pick a multiple of {world}")
