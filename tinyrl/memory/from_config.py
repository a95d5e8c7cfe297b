"""A run's Config -> its memory plan: build_plan's arguments, the plan cache, the settings a plan
fills in, what to change when it does not fit, and the real probes driven by a Config.

Knows: which Config fields change memory (they key the cache), how the trainer reads budgets
(0 = "from the plan"), the phases' names. Does not know: how a plan is computed (plan.py,
simulate.py), how a card is found (hardware.py), or how anything is shown (render.py).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import time
from pathlib import Path

from tinyrl.config import Config, get_setting, roles_of
from tinyrl.errors import TinyRLError
from tinyrl.hardware import GPU
from tinyrl.memory import formulas as fm
from tinyrl.memory.plan import MemoryPlan, PhasePlan, build_plan
from tinyrl.model_specs import load_spec, param_count
from tinyrl.phases import BUDGETED_PHASES, PLANNED_PHASES, Phase
from tinyrl.roles import Role
from tinyrl.tasks import calls_tools

GiB = fm.GiB

# Every Config field that plan_for_config reads: a change to any of them is another plan.
MEMORY_FIELDS = ("model.name", "model.finetune", "model.lora_rank", "model.lora_targets",
                 "model.quantize", "model.gradient_checkpointing", "model.logprob_chunk", "model.padding_free",
                 "data.max_prompt_length", "rollout.max_response_length", "rollout.n",
                 "rollout.engine", "trainer.train_batch_size", "actor.ppo_mini_batch_size",
                 "algorithm.adv_estimator", "algorithm.kl_in_reward", "algorithm.use_kl_loss",
                 "trainer.memory_budget_gib", "task.name", "command", "sft.max_length")

# The plan's training phases and the trace phase each one is searched with.
TRAINING_PHASES = {str(p): str(p) for p in BUDGETED_PHASES}
# How a plan's note from the real probe's own search begins (a step-down: benchmarks/gpu_check.py lists them)
PROBE_NOTE = "real probe, "


def role_flags(cfg: Config) -> dict[str, bool]:
    """simulate.Step's / build_plan's `critic` and `reference`: the roles this run builds."""
    roles = roles_of(cfg)
    return {"critic": Role.CRITIC in roles, "reference": Role.REFERENCE in roles}


def step_flags(cfg: Config) -> dict[str, bool]:
    """simulate.Step's flags for this config's step, as build_plan takes them: the roles, whether
    the actor's pass computes PPO's entropy (an SFT step's does not), whether it is SFT's, and
    whether its passes are packed or padded (model.padding_free)."""
    sft = cfg.command == "sft"
    return {**role_flags(cfg), "with_entropy": not sft, "sft": sft, "padding_free": cfg.model.padding_free}


def rows_per_prompt(cfg: Config) -> int:
    """Rows of a step that answer each prompt: rollout.n for RL, 1 for SFT (a row per example).
    An RL run's packed passes compute each such prompt once, so the plan and the probes price its
    micro-batches at the worse of the two layouts (simulate.simulate_phase's shared_by)."""
    return 1 if cfg.command == "sft" else cfg.rollout.n


def planned_phases(cfg: Config) -> list[str]:
    """The phases build_plan plans for this config, in a step's order: an SFT step's update and
    validation forward; an RL step's rollout, forward, actor update and, with a critic, its update."""
    if cfg.command == "sft":
        return [str(Phase.FORWARD), str(Phase.ACTOR_UPDATE)]
    return [str(p) for p in PLANNED_PHASES if p != Phase.CRITIC_UPDATE or role_flags(cfg)["critic"]]


def _engine(cfg: Config) -> str:
    # "auto" means vLLM on CUDA, and a card plan is only ever made for CUDA.
    return "hf" if cfg.rollout.engine == "hf" else "vllm"


def row_shape(cfg: Config) -> tuple[int, int]:
    """(prompt, response) tokens every row is planned at. RL: the longest prompt and response.
    SFT: a whole row of sft.max_length tokens, log-probs over all but its first (the loss mask
    is narrower; the log-probs are computed over the whole response region, so this is the most)."""
    if cfg.command == "sft":
        return 1, cfg.sft.max_length - 1
    return cfg.data.max_prompt_length, cfg.rollout.max_response_length


def row_width(cfg: Config) -> int:
    """The padded row width every phase is planned at; the trainer caps a packed micro-batch's
    rows at budget // row_width (tinyrl.microbatch) so that no micro-batch outgrows the plan."""
    return sum(row_shape(cfg))


def plan_for_config(cfg: Config, gpu: GPU, *, simulate: bool = True,
                    budget_bytes: int | None = None) -> MemoryPlan:
    """build_plan for this run on `gpu`; `budget_bytes` caps every phase below the card's
    default budget (90% of it), e.g. to leave room for a desktop on the same card."""
    m = cfg.model
    if budget_bytes is None and cfg.trainer.memory_budget_gib > 0:
        budget_bytes = int(cfg.trainer.memory_budget_gib * GiB)
    if budget_bytes is not None and gpu.memory_bytes < budget_bytes < gpu.memory_bytes + 0.005 * GiB:
        budget_bytes = gpu.memory_bytes  # the card's size as printed (23.99 GiB of 23.988): the whole card
    if budget_bytes is not None and budget_bytes > gpu.memory_bytes:  # its plan "fits" with negative margins
        raise TinyRLError(
            f"a memory budget of {budget_bytes / GiB:.2f} GiB (--budget or trainer.memory_budget_gib) is more than "
            f"the {gpu.name}'s {gpu.memory_bytes / GiB:.2f} GiB: a plan under it would not fit the card; "
            "nothing was planned",
            hint=f"give at most the card's memory, e.g. --budget {gpu.memory_bytes * 0.9 / GiB:.2f}GiB (90% of it, "
                 "the default without a budget), or plan for a bigger card with --gpu")
    prompt_len, response_len = row_shape(cfg)
    flags = step_flags(cfg)
    sft = flags["sft"]
    return build_plan(
        load_spec(m.name), gpu=gpu, model=m.name, prompt_len=prompt_len, response_len=response_len,
        prompts_per_step=cfg.trainer.train_batch_size, rollout_n=rows_per_prompt(cfg),
        mini_batch_prompts=0 if sft else cfg.actor.ppo_mini_batch_size, **flags,
        finetune=m.finetune, lora_rank=m.lora_rank, lora_targets=tuple(m.lora_targets),
        quantize=None if m.quantize == "none" else m.quantize,
        gradient_checkpointing=m.gradient_checkpointing, logprob_chunk=m.logprob_chunk,
        engine=_engine(cfg), budget_bytes=budget_bytes, simulate=simulate,
        multi_turn=not sft and calls_tools(cfg.task))  # a task with tools: episodes of turns


# ------------------------------------------------------------------------------- settings

def apply_plan(cfg: Config, plan: MemoryPlan) -> list[str]:
    """Fill the settings the user left at 0 from the plan (in place); one line per setting set,
    kept, or worth a warning."""
    lines = []
    settings = [("actor.micro_batch_tokens", cfg.actor, "micro_batch_tokens",
                 _budget(plan, Phase.ACTOR_UPDATE), "tokens"),
                ("critic.micro_batch_tokens", cfg.critic, "micro_batch_tokens",
                 _budget(plan, Phase.CRITIC_UPDATE), "tokens"),
                ("actor.forward_micro_batch_tokens", cfg.actor, "forward_micro_batch_tokens",
                 _budget(plan, Phase.FORWARD), "tokens")]
    if _engine(cfg) == "vllm":
        settings += [("rollout.vllm.gpu_memory_utilization", cfg.rollout.vllm, "gpu_memory_utilization",
                      plan.vllm_gpu_memory_utilization, "of the card"),
                     ("rollout.vllm.max_num_seqs", cfg.rollout.vllm, "max_num_seqs",
                      plan.vllm_max_num_seqs, "sequences at once")]
    for dotted, obj, attr, planned, unit in settings:
        current = getattr(obj, attr)
        if not planned:
            continue  # the phase is absent (no critic) or nothing fits: the plan's verdict says so
        if not current:
            setattr(obj, attr, planned)
            lines.append(f"{dotted} = {planned} {unit} (from the memory plan)")
        elif current > planned:
            lines.append(f"{dotted} = {current} {unit} kept as set, above the plan's {planned}: that phase "
                         "may run out of memory (set it to 0 to take the plan's)")
    return lines


def _budget(plan: MemoryPlan, phase: str) -> int:
    ph = plan.phases.get(phase)
    return ph.token_budget if ph is not None else 0


def advice(cfg: Config, plan: MemoryPlan) -> list[str]:
    """What to change, for a plan that does not fit: the failing phases, by how much, and the
    settings that shrink what they hold most of. A phase whose bytes before any token (weights,
    adapters, gradients, optimizer state, runtime) are already over the budget is said, and the
    settings that shrink only what grows with tokens (lengths, the log-prob chunk, checkpointing)
    come last, marked as unable to close that gap alone (the 7B LoRA's rollout, 32.7 GiB before
    any token on a 21.59 GiB budget, was told first to halve the response length)."""
    out = []
    cats = categories(cfg, plan)
    stuck = {}  # failing phase -> its bytes before any token, where they alone exceed the budget
    for name, ph in plan.phases.items():
        if ph.fits:
            continue
        over = ph.peak - plan.budget_bytes
        why = ("not even one sequence per micro-batch fits" if name in TRAINING_PHASES and ph.micro_batch < 1
               else "vLLM cannot hold one whole sequence" if name == Phase.ROLLOUT and plan.vllm_max_num_seqs < 1
               else "")
        if over > 0:
            said = (f"{name} needs {ph.peak / GiB:.2f} GiB, {over / GiB:.2f} GiB over the budget of "
                    f"{plan.budget_bytes / GiB:.2f} GiB")
        else:  # measured on the card (cuda_probe keeps the simulated bytes): it ran out where they fit
            said = (f"{name} did not fit the budget of {plan.budget_bytes / GiB:.2f} GiB when run on the card, "
                    f"though simulated at {ph.peak / GiB:.2f} GiB")
        out.append(said + (f" ({why})" if why else ""))
        fixed = fixed_bytes(cats[name])
        if fixed > plan.budget_bytes:
            stuck[name] = fixed
    if not out:
        return out
    failing = {name for name, ph in plan.phases.items() if not ph.fits}
    lead, weights, tokens = _tips(cfg, failing)
    if not stuck:
        return out + ["try: " + "; or ".join(lead + weights + tokens)]
    out += [f"{name} holds {fixed / GiB:.2f} GiB before any token (weights, gradients, optimizer state, "
            f"runtime): over the budget on its own, so shorter sequences cannot make it fit"
            for name, fixed in stuck.items()]
    weights.append(f"a smaller model.name (now {cfg.model.name}), or a card with more memory (--gpu)")
    return out + ["try: " + "; or ".join(weights),
                  "not enough alone (they shrink only what grows with tokens): " + "; or ".join(lead + tokens)]


# What a phase holds whatever its lengths and micro-batch: the categories() not in this list.
TOKEN_CATEGORIES = ("activations", "log-prob chunk", "HF engine KV cache", "vLLM KV cache", "vLLM other",
                    "allocator headroom", "other")


def fixed_bytes(phase_categories: dict[str, int]) -> int:
    """A phase's bytes before any token: its categories less those that grow with tokens (a lower
    bound: vLLM's activations and CUDA graphs are counted as if they could shrink)."""
    return sum(v for k, v in phase_categories.items() if k not in TOKEN_CATEGORIES)


def _tips(cfg: Config, failing: set[str]) -> tuple[list[str], list[str], list[str]]:
    """The settings that shrink what the failing phases hold, the largest lever first: (the
    engine and lengths, those that shrink the weights and their optimizer state, the other ones
    that shrink what grows with tokens)."""
    m, resp = cfg.model, cfg.rollout.max_response_length
    shorter = max(64, resp // 2) if resp > 64 else resp // 2  # half, not below 64 unless already under it
    lead = ([f"lower sft.max_length (now {cfg.sft.max_length}: a longer row is an error, so drop or split the longest "
             "rows first)"] if cfg.command == "sft"
            else [f"lower rollout.max_response_length (now {resp})" + (f", e.g. {shorter}" if shorter >= 1 else "")])
    if Phase.ROLLOUT in failing and cfg.rollout.engine == "hf" and m.quantize == "none":
        # the HF engine holds every episode's whole context at once; vLLM pages what decodes
        lead.insert(0, "rollout.engine=vllm (its paged KV cache holds only the sequences decoding at once; "
                       "the HF engine holds all of them whole)")
    weights, tokens = [], []
    if m.finetune == "full":
        weights.append("model.finetune=lora (one frozen base + adapters instead of three full models)")
    if m.quantize == "none" and m.finetune == "lora":
        weights.append("model.quantize=nf4 (4-bit base, QLoRA: about a quarter of the base weights)"
                       + ("" if cfg.rollout.engine == "hf" else " with rollout.engine=hf (vLLM cannot load an NF4 base)"))
    if m.finetune == "lora" and m.lora_rank > 16:
        weights.append(f"a smaller model.lora_rank (now {m.lora_rank}), e.g. {m.lora_rank // 2}")
    # a chunk spans the micro-batch's response tokens: a phase that barely fits one row holds
    # min(chunk, one response), so below a 512-token response the smaller chunk saves nothing;
    # the rollout holds no chunk, so the tip is for a failing training phase only
    in_effect = min(m.logprob_chunk, row_shape(cfg)[1])
    if in_effect > 512 and failing & set(TRAINING_PHASES):
        chunk = fm.logprob_chunk_bytes(in_effect, _vocab(cfg), backward=True)
        tokens.append(f"model.logprob_chunk=512 (now {m.logprob_chunk}: {chunk / GiB:.2f} GiB of "
                      "logits and their gradients per chunk)")
    if not m.gradient_checkpointing:
        tokens.append("model.gradient_checkpointing=true")
    return lead, weights, tokens


def _vocab(cfg: Config) -> int:
    return load_spec(cfg.model.name)["vocab_size"]


# categories() of a full fine-tune: what its "base_weights" and "adapters" parts are
FULL_FINETUNE_NAMES = {"base weights": "reference weights", "adapters": "trained weights"}


def categories(cfg: Config, plan: MemoryPlan) -> dict[str, dict[str, int]]:
    """Each phase's bytes in the categories people ask about (they add up to the phase's peak):
    the rollout's trainer weights split like the training phases', vLLM's reservation split
    into its weights, KV cache and the rest, and the log-prob chunk (formula) taken out of the
    activations it is part of. A full fine-tune has no adapters: its trained weights (the actor,
    and the critic) and the frozen reference's are named so (they read "adapters" and "base
    weights", 1.84 GiB of "adapters" on countdown-0.5b-4090)."""
    spec = load_spec(cfg.model.name)
    names = FULL_FINETUNE_NAMES if cfg.model.finetune == "full" else {}
    ref = plan.phases.get(Phase.FORWARD)
    base_w = ref.parts.get("base_weights", 0) if ref else 0
    out = {}
    for name, ph in plan.phases.items():
        p = dict(ph.parts)
        c = {"base weights": p.pop("base_weights", 0), "adapters": p.pop("adapters", 0),
             "gradients": p.pop("gradients", 0), "optimizer state": p.pop("optimizer", 0)
             + p.pop("trainer_optimizer", 0)}
        trainer_w = p.pop("trainer_weights", 0)
        if trainer_w:
            c["base weights"] += min(base_w, trainer_w)
            c["adapters"] += trainer_w - min(base_w, trainer_w)
        act = p.pop("activations", 0) + p.pop("hf_decode_transient", 0) + p.pop("hf_merge_fixes", 0) \
            + p.pop("trainer_measured", 0) + p.pop("hf_turn_prefill_transient", 0)
        chunk = 0
        if name in (Phase.FORWARD, Phase.ACTOR_UPDATE) and "activations" in ph.parts:
            # parts are for max(micro_batch, 1): a phase where nothing fits shows one sequence
            tokens = min(cfg.model.logprob_chunk, max(ph.micro_batch, 1) * row_shape(cfg)[1])
            chunk = min(act, fm.logprob_chunk_bytes(tokens, spec["vocab_size"],
                                                    backward=name == Phase.ACTOR_UPDATE))
        c["activations"], c["log-prob chunk"] = act - chunk, chunk
        c["HF engine KV cache"] = p.pop("hf_kv_cache", 0)  # rollout.engine=hf: its own, not vLLM's
        reserved = p.pop("vllm_reserved", 0)
        share = plan.vllm_share if reserved else {}
        c["vLLM weights"] = share.get("weights", 0)
        c["vLLM KV cache"] = share.get("kv_cache", 0)
        c["vLLM other"] = reserved - c["vLLM weights"] - share.get("kv_cache", 0)
        c["runtime context"] = p.pop("cuda_context", 0) + p.pop("vllm_asleep", 0) + p.pop("cublas_workspaces", 0)
        c["allocator headroom"] = p.pop("allocator", 0)  # one largest transient block (simulate.py)
        c["other"] = sum(p.values())  # nothing today; kept so the rows always add up
        out[name] = {names.get(k, k): v for k, v in c.items()}
    return out


def plan_dict(cfg: Config, plan: MemoryPlan) -> dict:
    """The plan as probe-memory's --json prints it."""
    cats = categories(cfg, plan)
    return {
        "fits": plan.fits, "model": plan.model, "gpu": plan.gpu, "card_bytes": plan.card_bytes,
        "budget_bytes": plan.budget_bytes, "simulated": plan.simulated,
        "phases": {name: {"peak_bytes": ph.peak, "fits": ph.fits, "micro_batch": ph.micro_batch,
                          "token_budget": ph.token_budget, "parts": ph.parts, "categories": cats[name]}
                   for name, ph in plan.phases.items()},
        "vllm": {"gpu_memory_utilization": plan.vllm_gpu_memory_utilization,
                 "max_num_seqs": plan.vllm_max_num_seqs, "share": plan.vllm_share},
        "notes": plan.notes, "advice": advice(cfg, plan),
    }


# ------------------------------------------------------------------------------- cache

def config_digest(cfg: Config, gpu: GPU) -> str:
    """A short hash of what the plan depends on: the memory fields, the model's shape (a local
    directory's config.json may change), the card's memory, tinyrl's code and the versions of
    the libraries whose code the plan traced. The code is all of tinyrl's, not the planner's
    three files: the simulation runs the trainer's own passes (packing, models, the losses), so
    a change there changes the bytes, and until 2026-11-28 a plan cached before such a change
    (or before a torch or transformers upgrade) was read as still true."""
    import importlib.metadata as md

    package = Path(__file__).resolve().parents[1]
    code = hashlib.sha256()
    for source in sorted(package.rglob("*.py")):
        code.update(source.relative_to(package).as_posix().encode() + b"\0" + source.read_bytes())
    versions = {}
    for lib in ("torch", "transformers", "peft"):
        try:
            versions[lib] = md.version(lib)
        except md.PackageNotFoundError:  # peft is optional for a full fine-tune
            versions[lib] = None
    key = json.dumps({"fields": {f: get_setting(cfg, f) for f in MEMORY_FIELDS},
                      "spec": load_spec(cfg.model.name), "card": gpu.memory_bytes,
                      "code": code.hexdigest(), "versions": versions}, sort_keys=True, default=str)
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def plan_path(cfg: Config, gpu: GPU) -> Path:
    from tinyrl.tiny_model import default_cache_root

    gpu_name = "".join(ch if ch.isalnum() or ch in "-." else "_" for ch in gpu.name)
    return default_cache_root() / "plans" / f"{cfg.preset or 'config'}-{gpu_name}-{config_digest(cfg, gpu)}.json"


def save_plan(plan: MemoryPlan, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")  # per process: two probes may save at once
    tmp.write_text(plan.to_json())
    tmp.replace(path)  # atomic: a killed write never leaves half a plan for train to read
    return path


def read_plan(path: Path) -> MemoryPlan | None:
    """The plan at `path`, or None when there is none or it is from an older format."""
    try:
        return MemoryPlan.from_json(path.read_text())
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, TypeError, KeyError):
        return None  # written by another tinyrl version: planned again, then overwritten


def load_or_build_plan(cfg: Config, gpu: GPU) -> tuple[MemoryPlan, Path, bool]:
    """(plan, its file, whether it came from the cache): the cached plan (probe-memory's last
    answer for this config and card), else a simulated one, which is then cached."""
    path = plan_path(cfg, gpu)
    plan = read_plan(path)
    if plan is not None:
        return plan, path, True
    plan = plan_for_config(cfg, gpu, simulate=True)
    return plan, save_plan(plan, path), False


# ------------------------------------------------------------------------------- real probes

CPU_PROBE_MAX_RESIDENT = 2 * GiB  # beyond this, a CPU twin run costs minutes and many GB of RAM


def parse_size(text: str) -> int:
    """'3GiB', '512MiB', '2GB', '1.5 gib' -> bytes."""
    import re

    units = {"b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
             "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([a-zA-Z]+)\s*", text or "")
    if m is None or m.group(2).lower() not in units or float(m.group(1)) <= 0:
        raise TinyRLError(f"cannot read the size {text!r}",
                          hint="a positive number with a unit, e.g. 3GiB, 512MiB or 2GB")
    return int(float(m.group(1)) * units[m.group(2).lower()])


def _step(cfg: Config, phase: str, dtype: str):
    from tinyrl.memory.simulate import Step

    m = cfg.model
    return Step(phase, 1, row_width(cfg), row_shape(cfg)[1], m.finetune, m.lora_rank,
                tuple(m.lora_targets), m.gradient_checkpointing, dtype, m.logprob_chunk, **step_flags(cfg))


def _resident_bytes(spec: dict, cfg: Config, dtype_bytes: int) -> int:
    """Weights + trainable weights + Adam state of the trainer, before any micro-batch."""
    n, roles = param_count(spec), role_flags(cfg)
    trained = 1 + roles["critic"]  # the actor, and the critic when the estimator has one
    if cfg.model.finetune == "full":
        return (trained + roles["reference"]) * n * dtype_bytes + trained * 2 * n * dtype_bytes
    lora = trained * fm.lora_param_count(spec, cfg.model.lora_rank, tuple(cfg.model.lora_targets))
    return n * dtype_bytes + lora * 12


def _cpu_twin(tries: dict) -> dict:
    """In the memory-limited child: the search with its evidence, and the child's ceiling."""
    import resource

    from tinyrl.memory import probe

    t0 = time.perf_counter()
    out = probe.search_with_proof(tries["try_step"], 1, tries["hi"])
    out["seconds"] = time.perf_counter() - t0
    out["rlimit_as_bytes"] = resource.getrlimit(resource.RLIMIT_AS)[0]
    return out


def _cpu_twin_prepare(spec: dict, step, hi: int, shared_by: int) -> dict:
    from tinyrl.memory import probe

    return {"try_step": probe.real_try_step(spec, step, "cpu", shared_by), "hi": hi}


def cpu_probe(cfg: Config, limit_bytes: int, phase: str = Phase.ACTOR_UPDATE) -> dict:
    """The GPU probe's CPU twin: the same doubling + bisection over tinyrl's real micro-step, in a
    child process whose address space may grow by `limit_bytes` beyond what it holds once the
    model is built (RAM, not VRAM). The largest micro-batch that ran, whether it runs again, and
    the allocator's real error at twice that size."""
    from tinyrl.memory import probe

    spec = load_spec(cfg.model.name)
    dtype = "fp32" if cfg.model.dtype == "auto" else cfg.model.dtype  # what CPU training uses
    resident = _resident_bytes(spec, cfg, fm.dtype_bytes(dtype))
    if resident > CPU_PROBE_MAX_RESIDENT:
        raise TinyRLError(
            f"a real CPU probe of {cfg.model.name} needs ~{resident / GiB:.1f} GiB of RAM for its "
            f"{dtype} weights and optimizer state alone, before the first try, and minutes per try",
            hint="plan it on fake tensors instead: --simulate --gpu rtx4090 (or the card you have)")
    step = _step(cfg, phase, dtype)
    # Searched up to what the trainer can use (the sequences of one optimizer step, or of the
    # whole step for the no-grad phase): beyond that an answer is of no use and, single-threaded
    # in the child, costs minutes (countdown-tiny at 3 GiB: ~150 s up to 404 sequences).
    cap = _caps(cfg)[phase]
    t0 = time.perf_counter()
    out = probe.run_under_memory_limit(_cpu_twin, limit_bytes, spec, step, cap, rows_per_prompt(cfg),
                                       prepare=_cpu_twin_prepare)
    b = out["max_micro_batch"]
    return {"device": "cpu", "simulated": False, "model": cfg.model.name, "phase": phase,
            "dtype": dtype, "memory_limit_bytes": limit_bytes, "seq_len": row_width(cfg),
            "max_micro_batch": b, "token_budget": b * row_width(cfg), "searched_up_to": cap,
            "reruns": out["reruns"], "stepped_down": out["stepped_down"], "double_error": out["double_error"],
            "search_seconds": out["seconds"], "total_seconds": time.perf_counter() - t0,
            "child_baseline_vm_bytes": out["rlimit_as_bytes"] - limit_bytes}


def _caps(cfg: Config) -> dict[str, int]:
    """Sequences per micro-batch worth trying: one optimizer step's, or the whole step's."""
    if cfg.command == "sft":  # one optimizer step over the whole batch of rows
        return {Phase.FORWARD: cfg.trainer.train_batch_size, Phase.ACTOR_UPDATE: cfg.trainer.train_batch_size}
    per_update = cfg.actor.ppo_mini_batch_size * cfg.rollout.n
    return {Phase.FORWARD: cfg.trainer.train_batch_size * cfg.rollout.n,
            Phase.ACTOR_UPDATE: per_update, Phase.CRITIC_UPDATE: per_update}


def cuda_probe(cfg: Config, gpu: GPU, plan: MemoryPlan) -> MemoryPlan:
    """The real probe on this machine's card: each training phase of the plan searched with real
    passes (random weights, the real architecture, bf16) under an allocator ceiling of the
    plan's budget less what sits beside the trainer (CUDA context, vLLM asleep). Returns the plan
    with those phases measured; the rollout phase stays planned (vLLM is not started here).
    Not run on a card yet: no GPU where this was written."""
    import torch

    if not torch.cuda.is_available():
        raise TinyRLError("the real probe needs a CUDA card and torch sees none",
                          hint="--simulate --gpu rtx4090 plans without one")
    spec = load_spec(cfg.model.name)
    total = torch.cuda.get_device_properties(0).total_memory
    plan = copy.deepcopy(plan)
    said = []
    try:
        for name, trace_phase in TRAINING_PHASES.items():
            if name in plan.phases:
                plan.phases[name], note = _measure_phase(cfg, spec, plan, name, trace_phase, total)
                said += [note] if note else []
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    plan.fits = all(p.fits for p in plan.phases.values())
    plan.simulated = False
    plan.notes.append("training phases MEASURED on this card by the real probe (random weights, bf16); "
                      "the rollout phase is planned from formulas")
    plan.notes += [PROBE_NOTE + note for note in said]
    if cfg.model.quantize == "nf4":
        plan.notes.append("the real probe ran a bf16 base, not NF4: its micro-batches are on the safe side")
    return plan


def _measure_phase(cfg: Config, spec: dict, plan: MemoryPlan, name: str, trace_phase: str,
                   total: int) -> tuple[PhasePlan, str | None]:
    """One training phase searched and measured on the card. -> its plan, and a note when the
    answer is not simply what the search found."""
    import torch

    from tinyrl.memory import probe

    planned = plan.phases[name]
    beside = {k: v for k, v in planned.parts.items() if k in ("cuda_context", "vllm_asleep")}
    # The caching allocator may hold the budget less what sits beside the trainer on the card.
    allowed = plan.budget_bytes - sum(beside.values())
    # cuBLAS's workspaces are the allocator's, so the ceiling above already holds them. Made by
    # the first passes (this search's or an earlier phase's), they are in measure_peak's baseline
    # and in no measured figure: the planned part is carried into the measured phase.
    workspaces = {k: v for k, v in planned.parts.items() if k == "cublas_workspaces"}
    torch.cuda.set_per_process_memory_fraction(max(0.0, min(1.0, allowed / total)))
    before = torch.cuda.memory_allocated()
    try:
        try_step = probe.real_try_step(spec, _step(cfg, trace_phase, "bf16"), "cuda", rows_per_prompt(cfg))
    except (RuntimeError, MemoryError) as exc:
        if not probe.is_oom(exc):
            raise
        probe.free_memory()  # the weights and Adam state alone did not fit under the ceiling
        return PhasePlan(planned.peak, planned.parts, 0, 0, fits=False), f"{name}: the weights and optimizer state alone did not fit"
    resident = torch.cuda.memory_allocated() - before
    found = probe.find_max_micro_batch(try_step, 1, _caps(cfg)[trace_phase])
    # The search ends on a size that ran once, right at the ceiling. On the H100 (2026-11-27,
    # countdown-4090's 3B update under 21.59 GiB) the size found then ran out of memory when run
    # again to measure it -- 1.43 GiB sat reserved in pieces after the failed tries -- and the
    # probe died with the OOM. So it is measured again as the CPU probe does (search_with_proof),
    # stepping down, then halving, until a size runs: the answer is a size that ran twice.
    measured = None if found < 1 else probe.first_that_runs(
        lambda b: probe.measure_peak(lambda: try_step(b), "cuda"),
        probe.step_down_sizes(found, 1, probe.STEP_DOWNS, then_halve=True))
    del try_step
    probe.free_memory()
    if measured is None:  # keep the planned bytes for one sequence: they say how far over it is
        why = "not even one sequence ran" if found < 1 else f"{found} ran once, then no size down to 1 ran again"
        return PhasePlan(planned.peak, planned.parts, 0, 0, fits=False), f"{name}: {why}"
    b, peak = measured
    parts = {"trainer_measured": resident + peak, **workspaces, **beside}
    note = None if b == found else f"{name}: {found} sequences ran once, then ran out of memory; {b} ran again"
    return (PhasePlan(sum(parts.values()), parts, b, b * row_width(cfg), fits=sum(parts.values()) <= plan.budget_bytes),
            note)


# ------------------------------------------------------------------------------- the command

def choose_mode(simulate: bool, device: str | None, memory_limit: str | None, cuda: bool) -> str:
    """probe-memory's mode from its flags: "simulate", "cuda" (real passes on this card) or
    "cpu" (the CPU twin). `cuda`: whether torch sees a card."""
    if device not in (None, "cuda", "cpu"):
        raise TinyRLError(f"--device {device!r} is not cuda or cpu", hint="--device cuda, or --device cpu --memory-limit 3GiB")
    if simulate and device is not None:
        raise TinyRLError(f"--simulate and --device {device} ask for two different probes",
                          hint="--simulate plans on fake tensors; --device runs real passes: give one")
    if memory_limit is not None and device != "cpu":
        raise TinyRLError("--memory-limit is for the CPU probe only",
                          hint="add --device cpu (on a CUDA card the card's memory is the limit)")
    if device == "cpu":
        if memory_limit is None:
            raise TinyRLError("--device cpu needs --memory-limit: without a ceiling the search would "
                              "grow until the machine itself runs out of memory",
                              hint="e.g. --device cpu --memory-limit 3GiB")
        return "cpu"
    if device == "cuda" and not cuda:
        raise TinyRLError("--device cuda: torch sees no CUDA card here",
                          hint="plan without one: --gpu rtx4090 --simulate")
    return "cuda" if device == "cuda" or (cuda and not simulate) else "simulate"


def resolve_gpu(name: str | None, cfg: Config, mode: str) -> GPU:
    """The card to plan for: --gpu from the table, "auto" (this machine's), else cfg.cost.gpu.
    The real probe measures this machine's card, so it must be that one."""
    from tinyrl.hardware import detect_gpu, get_gpu

    if mode == "cuda" or name == "auto":
        found = detect_gpu()
        if found is None:
            raise TinyRLError("--gpu auto: torch sees no CUDA card on this machine",
                              hint="name the card to plan for: --gpu rtx4090 --simulate")
        if name not in (None, "auto") and get_gpu(name).name != found.name:
            raise TinyRLError(f"the real probe measures this machine's card ({found.name}), not {name}",
                              hint=f"to measure {name}'s share on this bigger card, cap the probe with "
                                   f"--budget (e.g. --device cuda --budget 21.59GiB for a 24 GB card); "
                                   f"or plan for {name} on fake tensors: --gpu {name} --simulate")
        return found
    return get_gpu(name or cfg.cost.gpu)
