"""Every problem of a Config at once (`problems_of`), each saying what to set, before any model
loads.
"""

from __future__ import annotations

import difflib
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

from tinyrl.config.files import resolve_path
from tinyrl.config.notes import _ignored_by_sft, _read_by_run
from tinyrl.config.schema import Config, get_setting, has_critic
from tinyrl.errors import TinyRLError
from tinyrl.rl.kl_names import KL_NAMES, KL_REFUSED
from tinyrl.roles import ESTIMATORS, ESTIMATOR_NAMES


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
        if _ignored_by_sft(cfg, f"{role}.ppo_mini_batch_size"):
            continue  # an RL preset's critic section copied into an SFT one
        if mini < 0:
            out.append(f"{role}.ppo_mini_batch_size = {mini} must be >= 0 (0 = the whole batch)")
        elif mini > t.train_batch_size:
            out.append(f"{role}.ppo_mini_batch_size = {mini} is larger than "
                       f"trainer.train_batch_size = {t.train_batch_size}; set it to at most that")
        elif mini >= 1 and t.train_batch_size % mini:
            out.append(f"{role}.ppo_mini_batch_size = {mini} does not divide "
                       f"trainer.train_batch_size = {t.train_batch_size}; pick a divisor")
    est = ESTIMATORS.get(cfg.algorithm.adv_estimator)  # an unknown name is reported above
    if est is not None and est.grouped and r.n < 2 and _read_by_run(cfg, "algorithm.adv_estimator"):
        out.append(f"algorithm.adv_estimator = {cfg.algorithm.adv_estimator} compares samples of one "
                   f"prompt, so rollout.n must be at least 2 (got {r.n}); set rollout.n=8")
    out += _critic_warmup_problems(cfg)
    if cfg.algorithm.kl_in_reward and cfg.algorithm.use_kl_loss and _read_by_run(cfg, "algorithm.use_kl_loss"):
        out.append("algorithm.kl_in_reward and algorithm.use_kl_loss are both true: the KL would be "
                   "counted twice; set one of them to false")
    if a.clip_ratio_c <= 1.0:
        out.append(f"actor.clip_ratio_c = {a.clip_ratio_c} must be > 1 (dual clip); set 3.0")
    if not 0 < r.top_p <= 1:
        out.append(f"rollout.top_p = {r.top_p} must be in (0, 1]")
    if r.temperature <= 0:
        out.append(f"rollout.temperature = {r.temperature} must be > 0 (validation is greedy anyway)")
    # RL reads it only with rollout IS on, but checks the value whatever it is; SFT never reads it
    if cfg.algorithm.rollout_is_cap <= 1.0 and not _ignored_by_sft(cfg, "algorithm.rollout_is_cap"):
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
    if (w > 1 and cfg.algorithm.adv_estimator in ADV_ESTIMATORS and not has_critic(cfg)
            and not _ignored_by_sft(cfg, "algorithm.adv_estimator")):  # SFT: no estimator, no critic
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
    if (alg.kl_ctrl == "adaptive" and alg.kl_in_reward and alg.kl_target <= 0
            and _read_by_run(cfg, "algorithm.kl_target")):
        out.append(f"algorithm.kl_target = {alg.kl_target} must be > 0 for algorithm.kl_ctrl = adaptive; set 0.1")
    dropout = cfg.model.lora_dropout  # read by `tinyrl sft` alone (RL: a note); torch took 5 only at the model load
    if cfg.command == "sft" and cfg.model.finetune == "lora" and math.isfinite(dropout) and not 0 <= dropout < 1:
        out.append(f"model.lora_dropout = {dropout} must be in [0, 1) (the share of adapter inputs zeroed "
                   "in training); set 0.05, or 0 for none")
    if alg.overlong_buffer > cfg.rollout.max_response_length and _read_by_run(cfg, "algorithm.overlong_buffer"):
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
