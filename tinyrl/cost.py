"""`tinyrl estimate-cost`: hours and price per epoch, before paying for them.

hours/epoch = steps/epoch x seconds/step; price = hours x the user's price per hour.
steps/epoch = ceil(prompts/epoch / trainer.train_batch_size), prompts/epoch from --prompts-per-epoch,
else the row count of data.train_path (parquet metadata only), else data.generate_train_size.

Seconds per step come from one source, always named in the output (best first):
  "run"      - the median of a run's steady steps (RUN_DIR/metrics.jsonl; the first step of the
               file and of every resume is warm-up: CUDA/vLLM start-up, graph capture, allocator
               growth, so it is left out),
  "given"    - a number the user gives (--sec-per-step),
  "roofline" - tinyrl.roofline's spec-sheet model of the step, with its constants stated.
The roofline is also shown beside the other two, for comparison, when the model and card are known.

Knows: the config, the GPU table (tinyrl.hardware), shipped model configs (tinyrl.model_specs).
Does not know prices: the price is the user's; a preset's price is an example, never a fact.
Builds Rich renderables but never prints (the CLI does).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

from tinyrl import rundir
from tinyrl.config import Config, DataConfig, has_critic, resolve_path
from tinyrl.errors import TinyRLError
from tinyrl.phases import Phase
from tinyrl.roofline import (Assumptions, Card, DoesNotFit, ModelShape, Roofline, Workload, estimate_sft_step,
                             estimate_step)

WARMUP_STEPS = 1          # per segment of metrics.jsonl (the start, and each resume)
MIN_STEADY_STEPS = 2      # a median of one step is a guess, not a measurement
DTYPE_BYTES = {"auto": 2.0, "bf16": 2.0, "fp16": 2.0, "fp32": 4.0}  # auto is bf16 on CUDA
NF4_BYTES_PER_PARAM = 0.5  # 4-bit weights in vLLM; scales ignored
PHASE_ORDER = (Phase.ROLLOUT, Phase.FORWARD, Phase.ACTOR_UPDATE, Phase.CRITIC_UPDATE, "overhead")  # + the fixed rest


# --------------------------------------------------------------------------- a run's own timings


@dataclass(frozen=True)
class RunTiming:
    run_dir: Path
    sec_per_step: float
    phases: dict[str, float]          # median seconds of each timing/<phase> key over steady steps
    steady_steps: int
    warmup_steps: list[int]           # the step numbers left out
    config: dict | None               # RUN_DIR/config.json when present
    memory_kind: str | None = None    # "vram": the run was on a card; "ram": on the CPU (metrics' memory/kind)
    memory_total: int | None = None   # that card's bytes (memory/total_bytes): which card it was


def steady_steps(rows: list[dict]) -> tuple[list[dict], list[int]]:
    """metrics.jsonl's step records (each with a step number) split into the steady ones and the
    step numbers of the warm-up left out: the first WARMUP_STEPS of the run and of each resume
    (compilation, allocator growth, first-use caches). `report`'s median step time uses it too.
    A record's run/process_step (Trainer._step_ids) says where its process started; a run
    written before it had one falls back to a step number that does not grow."""
    steady, warm, previous, left = [], [], None, 0
    for row in rows:
        here = row.get("run/process_step")
        if isinstance(here, int):
            is_warm = here <= WARMUP_STEPS
        else:
            # A step number that does not grow marks a resume: its first steps are warm-up again.
            if previous is None or row["step"] <= previous:
                left = WARMUP_STEPS
            is_warm, left = left > 0, left - 1
        previous = row["step"]
        if is_warm:
            warm.append(row["step"])
        else:
            steady.append(row)
    return steady, warm


def read_run(run_dir: str | Path) -> RunTiming:
    """Median seconds per step (and per phase) of a run's steady steps."""
    run = Path(run_dir).expanduser()
    if not run.is_dir():
        raise TinyRLError(f"run directory {run} does not exist",
                          hint="give the directory a `tinyrl train` run wrote (it holds metrics.jsonl)")
    metrics = run / "metrics.jsonl"
    is_run = rundir.is_run_dir(run) or (run / rundir.RUN_FILE).is_file()
    if not metrics.is_file():
        if is_run:  # it stopped before step 1: it is the run's directory, with nothing timed in it yet
            raise _no_steps_yet(run)
        raise TinyRLError(f"{metrics} not found", hint="pass the run's own directory (runs/NAME), "
                          "or use --sec-per-step S / the roofline (leave out --from-run)")
    rows = []
    for number, line in enumerate(metrics.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TinyRLError(f"{metrics} line {number} is not JSON: {exc}",
                              hint="a run killed mid-write can leave a torn last line; delete it") from exc
        # Records without a step time (e.g. validation-only lines) say nothing about a step.
        if isinstance(row, dict) and all(isinstance(row.get(k), (int, float)) for k in ("step", "timing/step")):
            rows.append(row)
    steady, warm = steady_steps(rows)
    if not rows and is_run:
        raise _no_steps_yet(run)
    if len(steady) < MIN_STEADY_STEPS:
        raise TinyRLError(
            f"{metrics} has {len(rows)} timed step(s); after leaving out {len(warm)} warm-up step(s) "
            f"{len(steady)} remain, and at least {MIN_STEADY_STEPS} are needed",
            hint=f"let the run go on for {WARMUP_STEPS + MIN_STEADY_STEPS}+ steps, or give --sec-per-step",
        )
    keys = sorted({k for row in steady for k in row if k.startswith("timing/") and k != "timing/step"})
    phases = {k.removeprefix("timing/"): statistics.median(r[k] for r in steady if k in r) for k in keys}
    config_path = run / "config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else None
    last = steady[-1]
    total = last.get("memory/total_bytes")
    return RunTiming(run, float(statistics.median(r["timing/step"] for r in steady)), phases,
                     len(steady), warm, config, last.get("memory/kind"),
                     int(total) if isinstance(total, (int, float)) else None)


def _no_steps_yet(run: Path) -> TinyRLError:
    return TinyRLError(
        f"the run {run} has no finished step yet (it stopped before step 1), so there is no step time to price",
        hint=f"let it train {WARMUP_STEPS + MIN_STEADY_STEPS}+ steps (the first is warm-up) and try again, or "
             "price without it: --sec-per-step S (seconds measured elsewhere), or --preset NAME alone (the roofline)")


def config_from_dict(raw: dict) -> Config:
    """A Config from a run's config.json (Config.to_dict() layout). Keys this version does not
    know are skipped: the run may come from another version, and only a few keys are used here."""
    cfg = Config()
    _fill(cfg, raw)
    return cfg


def _fill(obj: Any, raw: dict) -> None:
    names = {f.name for f in fields(obj)}
    for key, value in raw.items():
        if key not in names:
            continue
        if is_dataclass(getattr(obj, key)) and isinstance(value, dict):
            _fill(getattr(obj, key), value)
        else:
            setattr(obj, key, value)


def check_run_is_the_presets(run: RunTiming, ran: Config, cfg: Config) -> None:
    """--from-run RUN --preset P prices RUN's seconds as P's steps: refused where they cannot be P's,
    another model, or a CPU run for a preset that runs on a card (a tiny CPU run's steps priced
    countdown-4090's epoch at 1.5 h, exit 0, under a WARNING below the tables)."""
    why = (f"trained {ran.model.name}, not the preset's {cfg.model.name}" if ran.model.name != cfg.model.name
           else "ran on the CPU, and the preset runs on a card (trainer.device = cuda)"
           if run.memory_kind == "ram" and cfg.trainer.device == "cuda" else "")
    if why:
        raise TinyRLError(
            f"--from-run {run.run_dir} {why}: its seconds per step are not {cfg.preset}'s steps, so they cannot "
            "price its epoch",
            hint=f"leave out --preset to price the run's own epoch, or price {cfg.preset} with --sec-per-step S "
                 f"(seconds of one of its steps), its roofline (leave out --from-run), or --from-run a run of it")


# --------------------------------------------------------------------------- epoch size


def prompts_per_epoch(cfg: Config, given: int | None = None) -> tuple[int, str]:
    """(prompts, where the number came from)."""
    if given is not None:
        if given < 1:
            raise TinyRLError(f"--prompts-per-epoch {given} must be at least 1", hint="e.g. --prompts-per-epoch 327680")
        return given, "--prompts-per-epoch"
    from tinyrl.setup import settle_train_path

    settle_train_path(cfg)  # a generated file made with other settings is not this run's epoch
    path = resolve_path(cfg.data.train_path)
    if path.is_file():
        import pyarrow.parquet as pq  # local: only needed when the file exists

        try:
            return pq.read_metadata(path).num_rows, f"rows of {path}"
        except (OSError, ValueError) as exc:  # pyarrow raises ArrowInvalid (a ValueError) or OSError
            raise TinyRLError(f"data.train_path = {path} is not a readable parquet file: {exc}",
                              hint="point data.train_path at your parquet file, or give --prompts-per-epoch") from exc
    if not cfg.data.generate and cfg.data.generate_train_size == DataConfig().generate_train_size:
        # Never generated, and the preset does not say how many rows its download holds: the
        # default (TinyZero's 327,680 Countdown tasks) would price someone else's epoch.
        from tinyrl.tasks import data_hint

        raise TinyRLError(f"data.train_path = {cfg.data.train_path} does not exist yet and is never generated "
                          f"(data.generate = false), so the {unit_of(cfg)} per epoch are unknown",
                          hint=f"give --prompts-per-epoch N (its row count), set data.generate_train_size, or make "
                          f"the file first with {data_hint(cfg)}")
    # a file tinyrl never generates (data.generate = false) is made or downloaded by the user
    missing = "not generated yet" if cfg.data.generate else "not there yet: made with `tinyrl data`, or downloaded"
    return cfg.data.generate_train_size, f"data.generate_train_size ({path} {missing})"


def unit_of(cfg: Config) -> str:
    """What a step's batch counts: RL prompts, or SFT rows (prompt/response pairs, conversations)."""
    return "rows" if cfg.command == "sft" else "prompts"


# --------------------------------------------------------------------------- roofline glue


def roofline_for(cfg: Config, gpu: Any, assumptions: Assumptions = Assumptions()) -> Roofline:
    """The roofline step of a config on a tinyrl.hardware.GPU."""
    from tinyrl.model_specs import load_spec, param_count  # local: only the roofline needs them

    if not gpu.bandwidth_bytes_per_s or not gpu.bf16_tflops:
        raise TinyRLError(f"the GPU table has no bandwidth/TFLOPS for {gpu.name}, so the roofline cannot run",
                          hint="give --gpu NAME of a similar card, --sec-per-step S, or --from-run RUN_DIR")
    spec = load_spec(cfg.model.name, build=False)  # never build the tiny model just to price it
    dtype_bytes = DTYPE_BYTES.get(cfg.model.dtype, 2.0)
    shape = ModelShape.from_spec(spec, param_count(spec), dtype_bytes,
                                 NF4_BYTES_PER_PARAM if cfg.model.quantize == "nf4" else None)
    card = Card(gpu.memory_bytes, gpu.bandwidth_bytes_per_s, gpu.bf16_tflops * 1e12)
    if cfg.command == "sft":
        return estimate_sft_step(shape, card, cfg.trainer.train_batch_size, cfg.sft.max_length,
                                 cfg.model.finetune == "lora", cfg.model.gradient_checkpointing, assumptions)
    work = Workload(
        prompts=cfg.trainer.train_batch_size,
        n=cfg.rollout.n,
        prompt_tokens=cfg.data.max_prompt_length,
        response_tokens=cfg.rollout.max_response_length,
        lora=cfg.model.finetune == "lora",
        checkpointing=cfg.model.gradient_checkpointing,
        critic=has_critic(cfg),
        ppo_epochs=cfg.actor.ppo_epochs,
        vllm_memory_share=cfg.rollout.vllm.gpu_memory_utilization,
        max_num_seqs=cfg.rollout.vllm.max_num_seqs,
        **tool_work(cfg),
    )
    try:
        return estimate_step(shape, card, work, assumptions)
    except DoesNotFit as exc:
        raise TinyRLError(f"{cfg.model.name} on {gpu.name}: {exc}",
                          hint="set rollout.vllm.gpu_memory_utilization higher, or shorter lengths") from exc


def as_planned(cfg: Config, gpu: Any) -> tuple[Config, list[str]]:
    """The config with the vLLM settings `train` takes from this card's memory plan, when
    `tinyrl probe-memory` has made one for it (the plan's cache; nothing is planned here: that
    takes minutes): the roofline then sizes decoding as the run will, not with a guessed share."""
    import copy

    from tinyrl.memory.from_config import apply_plan, plan_path, read_plan

    vllm = cfg.rollout.vllm
    if vllm.gpu_memory_utilization and vllm.max_num_seqs:
        return cfg, []  # both set: the plan would keep them
    path = plan_path(cfg, gpu)
    plan = read_plan(path)
    if plan is None or not plan.vllm_gpu_memory_utilization:
        return cfg, []  # the roofline's own assumption, said in its lines
    if not plan.fits:  # train refuses it (preflight.check_memory): its settings are no run's
        return cfg, [f"roofline: the memory plan of this config on the {gpu.name} ({path}) DOES NOT FIT, and "
                     "`train` will not start on it: vLLM's share below is the roofline's guess, not a plan's"]
    planned = copy.deepcopy(cfg)
    apply_plan(planned, plan)
    taken = [f"rollout.vllm.{key} = {getattr(planned.rollout.vllm, key)}"
             for key in ("gpu_memory_utilization", "max_num_seqs")
             if getattr(planned.rollout.vllm, key) != getattr(vllm, key)]  # what the plan filled in
    return planned, [f"roofline: {'; '.join(taken)}: from the memory plan of this config on the {gpu.name} "
                     f"(probe-memory's, {path}), as `train` sets them"] if taken else []


def tool_work(cfg: Config) -> dict[str, int]:
    """A task with tools: calls per episode at most, and how many run at once (0 = this machine's cores)."""
    from tinyrl.contention import usable_cpus
    from tinyrl.tasks import calls_tools

    if not calls_tools(cfg.task):
        return {}
    return {"tool_calls": cfg.rollout.max_tool_calls, "tool_workers": cfg.rollout.tool_workers or usable_cpus()}


def _card_name(name: str) -> str:
    """The GPU table's name of a card as a config names it ("RTX 4090" is rtx4090)."""
    from tinyrl.hardware import get_gpu

    try:
        return get_gpu(name).name
    except TinyRLError:
        return name


def hours_text(hours: float, unit: str = "") -> str:
    """Hours as the table prints them: 1 decimal, and minutes below 0.1 h (a CPU demo's epoch of
    2 minutes read "hours / epoch 0.0"). `unit` (" h") goes after the hours, before the minutes
    (the total read "0.083 (5.0 min) h")."""
    return f"{hours:,.1f}{unit}" if hours >= 0.1 else f"{hours:.3f}{unit} ({hours * 60:.1f} min)"


def roofline_assumptions(cfg: Config, a: Assumptions, r: Roofline, gpu_flag: str = "") -> list[str]:
    """`gpu_flag`: ` --gpu NAME` when the card priced is not the preset's (the probe-memory the
    hint names must plan that card: without it, it planned the preset's)."""
    d = r.details
    if cfg.command == "sft":
        return [
            f"roofline: SFT step = one forward + backward of the actor over {cfg.trainer.train_batch_size} rows; "
            f"utilisation {a.train_mfu:.0%} of peak bf16",
            f"roofline: every row at sft.max_length x{a.sft_fill:g} ({cfg.sft.max_length} tokens; an upper bound: "
            "real rows are shorter; a few steps of `tinyrl sft`, then --from-run RUN_DIR, give the real figure)",
            f"roofline: FLOPs/param/token {d['update_flops_per_param_token']:g} ({cfg.model.finetune}, checkpointing "
            f"{'on' if cfg.model.gradient_checkpointing else 'off'}); attention scores at T/2 positions per token, "
            f"backward 2.5x: {d['attention_s']:.2f} s of the {d['attention_s'] + d['weights_s']:.2f} s",
            f"roofline: {a.sft_step_overhead_s:g} s fixed per step for the optimizer step and bookkeeping (a guess)",
        ]
    share = cfg.rollout.vllm.gpu_memory_utilization or a.vllm_memory_share
    guessed = "" if cfg.rollout.vllm.gpu_memory_utilization else \
        f" (a guess: `tinyrl probe-memory --preset {cfg.preset_arg or 'P'}{gpu_flag}` plans the run's share, then read here)"
    return [
        f"roofline: utilisation {a.train_mfu:.0%} of peak bf16 for trainer passes, {a.prefill_mfu:.0%} for "
        f"prefill, {a.decode_mfu:.0%} as the decode compute roof; {a.bandwidth_efficiency:.0%} of spec-sheet bandwidth",
        f"roofline: vLLM gets {share:.0%} of the card{guessed}, {a.vllm_non_kv_bytes / 2**30:.1f} GiB of it not KV cache; "
        f"{d['decode_concurrency']:.0f} sequences decode at once ({d['decode_bound']}-bound, "
        f"{d['decode_step_ms']:.1f} ms per decode step); max_num_seqs {cfg.rollout.vllm.max_num_seqs or a.max_num_seqs}",
        f"roofline: every prompt and response at full length x{a.prompt_fill:g}/x{a.response_fill:g} "
        f"({cfg.data.max_prompt_length}+{cfg.rollout.max_response_length} tokens; an upper bound)",
        f"roofline: FLOPs/param/token 2 forward, {d['update_flops_per_param_token']:g} per update "
        f"({cfg.model.finetune}, checkpointing {'on' if cfg.model.gradient_checkpointing else 'off'}); "
        "attention scores, optimizer step and value head ignored",
        f"roofline: {a.step_overhead_s:g} s fixed per step for vLLM sleep/wake, weight sync, reward, bookkeeping (a guess)",
    ] + ([f"roofline: tools: every episode makes rollout.max_tool_calls = {cfg.rollout.max_tool_calls} calls of "
          f"{a.tool_call_s:g} s, {tool_work(cfg)['tool_workers']} at once, none overlapping decoding: "
          f"{d['tools_s']:.1f} s of the rollout (an upper bound)"] if d["tools_s"] else [])


# --------------------------------------------------------------------------- the roofline against a real run

# The one real run the roofline has been set against (README, "Estimating cost"; the preset's header):
# verl on one RTX 4090 with countdown-0.5b-4090's settings, 9.35 s a step. The roofline's own
# seconds for that preset and card are computed, never written down: a change to the model moves
# the ratio with it.
MEASURED_RUN = {"what": "a real verl run", "preset": "countdown-0.5b-4090", "gpu": "rtx4090", "sec_per_step": 9.35}


def roofline_vs_measured(assumptions: Assumptions = Assumptions()) -> dict:
    """MEASURED_RUN's seconds per step against the roofline's for its preset and card (no memory
    plan read: the roofline as it stands): {what, preset, gpu, measured_sec_per_step,
    roofline_sec_per_step, ratio}. 2.01 with the shipped assumptions: the roofline was
    optimistic by about 2x."""
    from tinyrl.config import load_config
    from tinyrl.hardware import get_gpu

    cfg = load_config(MEASURED_RUN["preset"], planning=True)
    roofline = roofline_for(cfg, get_gpu(MEASURED_RUN["gpu"]), assumptions).sec_per_step
    measured = MEASURED_RUN["sec_per_step"]
    return {"what": MEASURED_RUN["what"], "preset": MEASURED_RUN["preset"], "gpu": MEASURED_RUN["gpu"],
            "measured_sec_per_step": measured, "roofline_sec_per_step": roofline, "ratio": measured / roofline}


def measured_text(check: dict, est: "CostEstimate") -> str:
    """The summary's line beside a roofline-only estimate: how far the roofline was from the one
    real run, and this epoch at that ratio (333.81 s a step, 118.7 h, was budgeted as it stood)."""
    ratio = check["ratio"]
    at_ratio = hours_text(est.total_hours * ratio, " h") + (
        f", {est.total_price * ratio:,.2f} {est.currency}" if est.total_price is not None else "")
    return (f"{check['what']} ({check['preset']} on {check['gpu']}) took {check['measured_sec_per_step']:g} s a step, "
            f"{ratio:.2f}x the roofline's {check['roofline_sec_per_step']:.2f}; at that ratio the total is {at_ratio} "
            "(one run of one model: a hint; a few steps of yours and --from-run give the real figure)")


# --------------------------------------------------------------------------- the estimate


@dataclass
class CostEstimate:
    preset: str
    gpu: dict
    prompts_per_epoch: int
    prompts_source: str
    train_batch_size: int
    steps_per_epoch: int
    sec_per_step: float
    source: str                        # run | given | roofline
    source_detail: str
    phases: dict[str, float]           # of the source (empty for "given": one number has no parts)
    hours_per_epoch: float
    price_per_hour: float | None
    price_source: str
    currency: str
    price_per_epoch: float | None
    epochs: int
    total_hours: float
    total_price: float | None
    roofline: dict | None              # {sec_per_step, phases, details, constants} when computable
    assumptions: list[str] = field(default_factory=list)
    unit: str = "prompts"              # what the batch counts: prompts (RL) or rows (SFT)
    # the roofline against the one real run (roofline_vs_measured), when the roofline prices an RL step
    roofline_vs_measured: dict | None = None

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def estimate_cost(
    cfg: Config | None,
    *,
    gpu_name: str | None = None,
    price: float | None = None,
    currency: str | None = None,
    epochs: int | None = None,
    run_dir: str | Path | None = None,
    sec_per_step: float | None = None,
    prompts: int | None = None,
    assumptions: Assumptions = Assumptions(),
) -> CostEstimate:
    from tinyrl.hardware import detect_gpu, get_gpu  # local: keeps `tinyrl --help` fast

    if sec_per_step is not None and run_dir is not None:
        raise TinyRLError("--sec-per-step and --from-run both say how long a step takes",
                          hint="give one of them")
    if sec_per_step is not None and not (sec_per_step > 0 and math.isfinite(sec_per_step)):
        raise TinyRLError(f"--sec-per-step {sec_per_step} must be a positive number", hint="e.g. --sec-per-step 9.35")
    if currency is not None and not currency.strip():  # it kept the preset's label (CNY) beside the user's price
        raise TinyRLError("--currency is empty", hint="give the label of your price, e.g. --price 2.18 --currency USD, "
                          "or leave out --currency (the preset's)")
    if price is not None and not (price >= 0 and math.isfinite(price)):
        raise TinyRLError(f"--price {price} must be zero (unknown) or positive", hint="your price per GPU-hour, e.g. --price 2.18")
    if epochs is not None and epochs < 1:
        raise TinyRLError(f"--epochs {epochs} must be at least 1", hint="e.g. --epochs 15 (TinyZero ran 15)")

    run = read_run(run_dir) if run_dir is not None else None
    notes: list[str] = []
    if cfg is None:
        if run is None or run.config is None:
            raise TinyRLError("no config to estimate: give --preset NAME, or --from-run RUN_DIR holding config.json",
                              hint="e.g. tinyrl estimate-cost --preset countdown-4090")
        cfg = config_from_dict(run.config)
        from tinyrl.rundir import rebase_paths

        rebase_paths(cfg, run.run_dir)  # its data file, read from where the run was started
        notes.append(f"config (batch size, data, cost defaults) from {run.run_dir / 'config.json'}")
    elif run is not None and run.config is not None:  # --preset P --from-run RUN: RUN's seconds priced as P's steps
        ran = config_from_dict(run.config)
        check_run_is_the_presets(run, ran, cfg)
        if ran.trainer.train_batch_size != cfg.trainer.train_batch_size:
            notes.append(f"WARNING: {run.run_dir} trained on batches of {ran.trainer.train_batch_size}, the preset "
                         f"{cfg.preset} on {cfg.trainer.train_batch_size}: the run's seconds per step do not carry "
                         "over; leave out --preset to price the run's own epoch")
    if currency and price is None and cfg.cost.price_per_hour and currency != cfg.cost.currency:
        raise TinyRLError(f"--currency {currency} without --price would show the preset's example, "
                          f"{cfg.cost.price_per_hour:g} {cfg.cost.currency} per hour, as {cfg.cost.price_per_hour:g} {currency}",
                          hint=f"give your price with it: --price P --currency {currency}")

    if gpu_name == "auto":
        gpu = detect_gpu()
        if gpu is None:
            raise TinyRLError("--gpu auto found no CUDA device here", hint="name the card, e.g. --gpu rtx4090")
    else:
        gpu = get_gpu(gpu_name or cfg.cost.gpu)

    on_cpu = run is not None and sec_per_step is None and run.memory_kind == "ram"
    if on_cpu:  # its seconds are a CPU's: priced as a card's, a 4090 epoch took the CPU's hours
        notes.append(f"{run.run_dir} ran on the CPU: the hours are that machine's, not a card's (no roofline "
                     "to compare" + (f", and --gpu {gpu_name} is not used" if gpu_name else "")
                     + "); for a card, leave out --from-run (the roofline) or give a run made on it")
    elif run is not None and sec_per_step is None and run.memory_kind == "vram" and run.memory_total \
            and abs(run.memory_total / gpu.memory_bytes - 1) > 0.1:
        notes.append(f"WARNING: {run.run_dir} ran on a card of {run.memory_total / 2**30:.1f} GiB, not a {gpu.name} "
                     f"({gpu.memory_bytes / 2**30:.1f} GiB): its seconds are that card's; give --gpu with the card "
                     "the run used, and its price")
    n_prompts, prompts_source = prompts_per_epoch(cfg, prompts)
    batch = cfg.trainer.train_batch_size
    if batch < 1:
        raise TinyRLError(f"trainer.train_batch_size = {batch} must be at least 1", hint="--set trainer.train_batch_size=256")
    steps = math.ceil(n_prompts / batch)

    roof, roof_error = None, ""
    try:
        if not on_cpu:  # a card's roofline says nothing of a CPU's seconds
            planned, plan_note = as_planned(cfg, gpu)
            notes += plan_note
            r = roofline_for(planned, gpu, assumptions)
            roof = {"sec_per_step": r.sec_per_step, "phases": r.phases, "details": r.details,
                    "constants": assumptions.to_dict()}
    except TinyRLError as exc:
        if sec_per_step is None and run is None:
            raise  # the roofline is the only source: its error is the answer
        roof_error = exc.message

    if sec_per_step is not None:
        seconds, source, detail, phases = sec_per_step, "given", "--sec-per-step", {}
    elif run is not None:
        seconds, source, phases = run.sec_per_step, "run", run.phases
        detail = (f"median of {run.steady_steps} steady steps in {run.run_dir / 'metrics.jsonl'}")
        notes.append(f"warm-up left out: step(s) {', '.join(map(str, run.warmup_steps))} "
                     f"(the first {WARMUP_STEPS} of the run and of each resume: start-up, graph capture)")
    else:
        seconds, source, phases = r.sec_per_step, "roofline", r.phases
        detail = f"spec-sheet model of {cfg.model.name} on {gpu.name}; assumptions below"
    if roof is not None:
        if source != "roofline":  # how far the model is from reality is worth seeing every time
            notes.append(f"{source} seconds/step are {seconds / r.sec_per_step:.2f}x the roofline's {r.sec_per_step:.2f}")
        notes += roofline_assumptions(planned, assumptions, r,
                                      f" --gpu {gpu.name}" if gpu.name != cfg.cost.gpu else "")
    elif roof_error:
        notes.append(f"no roofline for comparison: {roof_error}")

    if price is not None:
        per_hour, price_source = price, "--price"
    else:
        per_hour = 0.0 if on_cpu else cfg.cost.price_per_hour  # the preset's is a card's price
        price_source = (f"preset {cfg.preset or 'config'} cost.price_per_hour: an example, not a fact; set yours with --price"
                        if per_hour else "unknown: give --price")
        if per_hour and gpu.name != _card_name(cfg.cost.gpu):  # `--gpu h100` was priced at the 4090's example
            per_hour, price_source = 0.0, (f"unknown: the preset's example, {cfg.cost.price_per_hour:g} "
                                           f"{cfg.cost.currency}/h, is for its {cfg.cost.gpu}, not the {gpu.name}; "
                                           "give --price")
    if per_hour <= 0:
        per_hour = None
    n_epochs = epochs if epochs is not None else cfg.trainer.total_epochs
    hours = steps * seconds / 3600
    # The roofline alone prices the epoch: how far it was from the one real run is said beside the
    # figures (README said "optimistic by about 2x"; the output did not, and a user budgeted half).
    # An SFT step's roofline has no real run to set it against.
    check = roofline_vs_measured(assumptions) if source == "roofline" and cfg.command != "sft" else None
    if source == "roofline" and cfg.command == "sft":
        notes.insert(0, "roofline: the SFT step's roofline has not been set against a real run; a few steps of "
                        "`tinyrl sft`, then --from-run RUN_DIR, give the real figure")
    return CostEstimate(
        preset=cfg.preset,
        gpu={"name": "the CPU the run used", "memory_gib": None, "bandwidth_gb_per_s": None, "bf16_tflops": None}
        if on_cpu else {"name": gpu.name, "memory_gib": gpu.memory_bytes / 2**30,
                        "bandwidth_gb_per_s": gpu.bandwidth_bytes_per_s / 1e9, "bf16_tflops": gpu.bf16_tflops},
        prompts_per_epoch=n_prompts,
        prompts_source=prompts_source,
        train_batch_size=batch,
        steps_per_epoch=steps,
        sec_per_step=seconds,
        source=source,
        source_detail=detail,
        phases=phases,
        hours_per_epoch=hours,
        price_per_hour=per_hour,
        price_source=price_source,
        currency=currency or cfg.cost.currency,
        price_per_epoch=hours * per_hour if per_hour else None,
        epochs=n_epochs,
        total_hours=hours * n_epochs,
        total_price=hours * n_epochs * per_hour if per_hour else None,
        roofline=roof,
        assumptions=notes,
        unit=unit_of(cfg),
        roofline_vs_measured=check,
    )


# --------------------------------------------------------------------------- rendering (no printing)


def render(est: CostEstimate) -> list:
    """Rich renderables for the CLI: the summary table, the phase table, the assumptions."""
    from rich.table import Table
    from rich.text import Text

    money = (lambda x: f"{x:,.2f} {est.currency}")
    summary = Table(title=f"estimate-cost: {est.preset or 'run'} on {est.gpu['name']}", show_header=False)
    summary.add_column(style="bold")
    summary.add_column()
    rows = [
        (f"{est.unit} / epoch", f"{est.prompts_per_epoch:,}  ({est.prompts_source})"),
        ("steps / epoch", f"{est.steps_per_epoch:,}  (batch {est.train_batch_size} {est.unit})"),
        ("seconds / step", f"{est.sec_per_step:.2f}  (source: {est.source} — {est.source_detail})"),
        ("hours / epoch", hours_text(est.hours_per_epoch)),
        ("price / hour", f"{money(est.price_per_hour)}  ({est.price_source})" if est.price_per_hour
         else f"unknown — {est.price_source.removeprefix('unknown: ')}" if "example" in est.price_source
         else f"unknown — the price needs --price ({est.currency})"),
        ("price / epoch", money(est.price_per_epoch) if est.price_per_epoch is not None else "— (needs --price)"),
        (f"total, {est.epochs} epoch(s)", hours_text(est.total_hours, " h")
         + (f", {money(est.total_price)}" if est.total_price is not None else "")),
    ]
    if est.roofline_vs_measured:
        rows.append(("roofline vs a real run", measured_text(est.roofline_vs_measured, est)))
    for name, value in rows:
        summary.add_row(name, Text(value))  # Text: details contain [brackets] and paths

    phases = Table(title="seconds per step, by phase")
    phases.add_column("phase", style="bold")
    columns = []
    if est.phases:
        columns.append((est.source, est.phases))
    if est.roofline and est.source != "roofline":
        columns.append(("roofline (for comparison)", est.roofline["phases"]))
    for title, _ in columns:
        phases.add_column(title, justify="right")
    names = [p for p in PHASE_ORDER if any(p in c for _, c in columns)]
    names += sorted({p for _, c in columns for p in c} - set(names))
    for name in names:
        phases.add_row(name, *(f"{c[name]:.2f}" if name in c else "—" for _, c in columns))
    phases.add_row("sum of the phases", *(f"{sum(c.values()):.2f}" for _, c in columns), style="bold")
    under = []  # a line, not the table's caption: a caption wraps at the narrow table's width
    if est.source == "run" and est.phases and abs(sum(est.phases.values()) - est.sec_per_step) >= 0.005:
        # each phase's median is another step's: their sum is not the median step that prices the epoch
        under.append(Text(f"run: the median of each phase over the steady steps; the median step, "
                          f"{est.sec_per_step:.2f} s, prices the epoch", style="dim"))

    # a WARNING is said under the figures it is about, not last below the tables
    warnings = [line for line in est.assumptions if line.startswith("WARNING: ")]
    notes = Text("assumptions:\n", style="bold")
    for line in est.assumptions:
        if line not in warnings:
            notes.append(f"  - {line}\n", style="")
    return [summary] + [Text(line, style="bold yellow") for line in warnings] + \
        ([phases, *under] if columns else [Text("no phase breakdown: one given number has no parts")]) + [notes]
