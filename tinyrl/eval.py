"""`tinyrl eval`: greedy accuracy, mean@n, pass@k, maj@k, response length and tokens/s of a model
on a task's parquet files, with every sample written down.

A run directory is evaluated at its latest checkpoint (the actor merged into its base, as
`tinyrl export` writes it, in a temporary directory); anything else is a Hugging Face model
directory or id. Writes OUT/eval.json and OUT/eval_samples.jsonl (one line per sample: data
file, problem id, sample index, completion, extracted answer, correct); the metrics are
tinyrl.eval_metrics over exactly those lines. `score_prompts` is shared with train's validation.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tinyrl.errors import TinyRLError
from tinyrl.eval_metrics import summarize
from tinyrl.export_info import read_export
from tinyrl.rollout.base import SamplingSettings, response_texts
from tinyrl.rollout.transcript import transcript
from tinyrl.writable import check_writable, make_dir, staged

log = logging.getLogger(__name__)

CHUNK_PROMPTS = 16  # prompts per generate() call: the progress bar moves, memory stays flat


@dataclass
class FileResult:
    name: str
    metrics: dict[str, float] = field(default_factory=dict)
    samples: list[dict] = field(default_factory=list)


def score_prompts(engine, tokenizer, prompts: list[list[int]], rows: list[Any], task, task_cfg, *, n: int,
                  ks: list[int], temperature: float, top_p: float, greedy: bool, max_new_tokens: int,
                  seed: int = 0, name: str = "data", tick: Callable[[int], None] = lambda k: None,
                  tool_rollout=None, judge=None, data: Path | None = None) -> FileResult:
    """Greedy (optional) and n sampled episodes per prompt, judged by the task. -> FileResult
    `tool_rollout` (tinyrl.rollout.turns.ToolRollout): episodes with tools; each sample then
    keeps its turns (role + text) and tool calls, and the metrics add the tool counts.
    `judge` (a tinyrl.tasks.rewards.RewardSet of one user function): judges instead of the task
    (solved: its solved_at); it extracts no answer, so there is no maj@k to vote. `data`: the
    file the rows were read from, named in the judge's error on one of them (as in train)."""
    from tinyrl.rewards.registry import reads_episode

    reward = judge if judge is not None else task.make_reward(task_cfg)
    solved_at = judge.solved_at if judge is not None else task.solved_at(task_cfg)
    with_episode = judge is None and reads_episode(reward)
    result = FileResult(name)
    kinds = ([("greedy", SamplingSettings(n=1, greedy=True, max_new_tokens=max_new_tokens))] if greedy else []) + \
        ([("sample", SamplingSettings(n=n, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
                                      seed=seed))] if n > 0 else [])
    per_kind: dict[str, list[list[dict]]] = {}
    tokens, seconds, lengths, all_episodes = 0, 0.0, [], []
    for kind, settings in kinds:
        groups: list[list[dict]] = [[] for _ in prompts]
        for start in range(0, len(prompts), CHUNK_PROMPTS):
            chunk = prompts[start:start + CHUNK_PROMPTS]
            t0 = time.perf_counter()
            if tool_rollout is None:
                episodes = engine.generate(chunk, settings).episodes
            else:
                episodes = tool_rollout.run(engine, chunk, settings, rows[start:start + len(chunk)]).episodes
                all_episodes += episodes
            seconds += time.perf_counter() - t0
            texts = response_texts(tokenizer, episodes)
            chunk_rows = [rows[start + e.prompt_index] for e in episodes]
            # a reward that reads `episode` gets it, as in train and validation (RewardSet.score_batch)
            scores = (judge.score_batch(texts, chunk_rows, episodes=episodes, data=data).total if judge is not None
                      else [float(reward(t, r, episode=e) if with_episode else reward(t, r))
                            for t, r, e in zip(texts, chunk_rows, episodes)])
            for e, text, score in zip(episodes, texts, scores):
                i = start + e.prompt_index
                groups[i].append({"data": name, "problem": i, "kind": kind, "sample": len(groups[i]),
                                  "completion": text,
                                  "answer": None if judge is not None else task.extract_answer(text, task_cfg),
                                  "correct": score >= solved_at, "reward": score,
                                  "response_tokens": len(e.response_ids)})
                if tool_rollout is not None:
                    groups[i][-1].update(transcript(tokenizer, e))
                tokens += len(e.response_ids)
                lengths.append(len(e.response_ids))
            tick(len(chunk) * settings.n)  # completions: a sampled pass is n times a greedy one's work
        per_kind[kind] = groups
        result.samples += [s for g in groups for s in g]
    if "greedy" in per_kind:
        result.metrics["greedy_acc"] = sum(g[0]["correct"] for g in per_kind["greedy"]) / len(prompts)
    if "sample" in per_kind:
        result.metrics.update(summarize([([s["answer"] for s in g], [s["correct"] for s in g])
                                         for g in per_kind["sample"]], ks))
        if judge is not None:  # no answers to vote on: maj@k would read 0 whatever the samples
            result.metrics = {k: v for k, v in result.metrics.items() if not k.startswith("maj@")}
    result.metrics["response_length"] = sum(lengths) / max(len(lengths), 1)
    result.metrics["tokens_per_s"] = tokens / max(seconds, 1e-9)
    if tool_rollout is not None:
        from tinyrl.rollout.turns import episode_metrics

        result.metrics.update(episode_metrics(all_episodes))
    return result


def metrics_from_samples(path: Path, ks: list[int]) -> dict[str, dict[str, float]]:
    """The metrics recomputed from an eval_samples.jsonl alone (the test's cross-check)."""
    by_file: dict[str, dict[int, list[dict]]] = {}
    for line in path.read_text().splitlines():
        s = json.loads(line)
        if s["kind"] == "sample":
            by_file.setdefault(s["data"], {}).setdefault(s["problem"], []).append(s)
    return {name: summarize([([s["answer"] for s in sorted(g, key=lambda s: s["sample"])],
                              [s["correct"] for s in sorted(g, key=lambda s: s["sample"])])
                             for _, g in sorted(probs.items())], ks)
            for name, probs in by_file.items()}


def _sampling_problems(n: int, ks: list[int] | None, greedy: bool, temperature: float, top_p: float,
                       max_new_tokens: int | None) -> list[str]:
    import math

    out = []
    if n < 0:
        out.append(f"--n {n} must be 0 (greedy only) or more")
    elif n == 0 and not greedy:
        out.append("--n 0 with --no-greedy evaluates nothing")
    if any(k < 1 for k in ks or []):
        out.append(f"--k {','.join(map(str, ks))}: every k must be at least 1")
    if n > 0 and not (math.isfinite(temperature) and temperature > 0):  # transformers refuses it after the merge
        out.append(f"--temperature {temperature:g} must be > 0 for the --n {n} samples")
    if n > 0 and not 0 < top_p <= 1:
        out.append(f"--top-p {top_p:g} must be in (0, 1]")
    if max_new_tokens is not None and max_new_tokens < 1:  # 0 meant "the run's" and -5 crashed the decode loop
        out.append(f"--max-tokens {max_new_tokens} must be at least 1 (leave it out for the run's limit)")
    return out


EVAL_DEVICES = ("auto", "cpu", "cuda")
# Why --device, and why auto follows a run pinned to the CPU (eval_device): a run's validation
# (train's val/score, and `tinyrl sft`'s with sft.val_generate) generates on trainer.device, and
# eval on `auto` used to take the GPU whenever there was one: a run pinned
# to the CPU (the tiny and demo presets) was validated in fp32 on the CPU and evaluated in bf16 on
# the card, a different model numerically, so a greedy answer or two came out otherwise (found on
# an H100: test_sft's val_generate test, 22 vs 21 of 24 answers in the format). Same device: the
# same figures on the CPU (fp32, tested). On a GPU they can still differ by a few answers, the
# code being the same: eval loads a LoRA run's checkpoint merged in fp32 and rounded to bf16 once
# (the trainer adds the adapter to its bf16 weights: rounded twice), generates 16 prompts per
# call (validation: up to 256), and defaults to vLLM; bf16 greedy decoding follows such differences.


def _device_problems(device: str) -> list[str]:
    import torch

    if device not in EVAL_DEVICES:
        return [f"--device {device} is not {', '.join(EVAL_DEVICES[:-1])} or {EVAL_DEVICES[-1]}"]
    if device == "cuda" and not torch.cuda.is_available():
        return ["--device cuda but torch sees no CUDA GPU (--device auto or cpu evaluates on the CPU)"]
    return []


def _warn_if_cores_shared() -> None:
    """What train says once per run (tinyrl.contention), said before eval's long CPU work: eval of
    the demo with its 32 samples a problem took 5:45 for the first 10% beside another run, 0:08
    for each 10% after it ended, with nothing said."""
    import torch

    from tinyrl.contention import cpu_contention_now

    threads = torch.get_num_threads()
    if threads <= 1:  # on one thread already: nothing to set (train says so once, eval is short)
        return
    found = cpu_contention_now(threads, command="eval")
    if found is not None:
        log.warning(found.notice())


def eval_device(asked: str, run_device: str | None, engine: str = "auto"):
    """--device (EVAL_DEVICES) -> torch.device. `auto` follows a run's trainer.device where the run
    was pinned to the CPU (validated there in fp32: the demo and tiny presets) even on a machine with
    a GPU, unless --engine vllm was asked for (a CUDA build of vLLM runs on the card only);
    otherwise CUDA when torch sees one. A run trained on a card evaluates on the CPU of a machine
    without one rather than refusing."""
    import torch

    if asked == "auto" and run_device == "cpu" and engine != "vllm":
        return torch.device("cpu")
    return torch.device("cuda" if asked == "cuda" or (asked == "auto" and torch.cuda.is_available()) else "cpu")


def parse_data_args(items: list[str]) -> list[tuple[str, Path]]:
    """`name=path` or `path` (named after the file) -> [(name, path)]."""
    out = []
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or "/" in name:
            name, path = Path(item).stem, item
        if not name or not path:
            raise TinyRLError(f"--data {item!r} needs a name and a file: name=FILE, or FILE alone",
                              hint="e.g. --data aime=data/math/aime_2024.parquet")
        out.append((name, Path(path).expanduser()))
    if len({n for n, _ in out}) != len(out):
        raise TinyRLError("two --data files have the same name", hint="name them: --data aime=FILE --data math500=FILE")
    return out


def run_config(run_dir: Path):
    """The Config a run directory was trained with (its config.json), its relative paths read from
    the directory the run was started in, whatever this one holds under their names (rebase_paths)."""
    from tinyrl.config import config_from_dict
    from tinyrl.rundir import rebase_paths

    cfg = config_from_dict(json.loads((run_dir / "config.json").read_text()))
    rebase_paths(cfg, run_dir)
    return cfg


def run_data(cfg) -> list[str]:
    """--data's default for a run (its run_config): the held-back files its validation scored, as
    `name=path`: data.test_path (named `test`) and data.val_files, resolved as the run did."""
    from tinyrl.config import resolve_path

    return [f"test={resolve_path(cfg.data.test_path)}",
            *(f"{name}={resolve_path(str(path))}" for name, path in parse_data_args(cfg.data.val_files))]


def _merged_run(run_dir: Path, tmp: Path) -> tuple[str, str]:
    """A run's latest actor merged into a model directory under `tmp` -> (its path, a label)."""
    from tinyrl.export import export_run

    merged = export_run(run_dir, tmp / "model")  # a run with no checkpoint yet: its own message
    return str(merged), f"{run_dir} (step {read_export(merged).step})"


def _another_out(run_dir: Path, taken: Path) -> str:
    """The refusal's example for a run evaluated again (typically after it trained on): a
    directory named after the step eval would now read, and what the kept eval was of."""
    from tinyrl.checkpoint import list_checkpoints, step_of

    saved = list_checkpoints(run_dir / "checkpoints")
    if not saved:
        return ""
    try:
        earlier = json.loads((taken / "eval.json").read_text()).get("model", "")
    except (OSError, ValueError, AttributeError):
        earlier = ""
    step = step_of(saved[-1])
    was = f" ({taken} holds the eval of {earlier})" if earlier else ""
    return f", e.g. --out {run_dir / f'eval-step{step}'} for the latest checkpoint, step {step}{was}"


def _exported_task(model_dir: Path):
    """The task of the run a `tinyrl export` came from (its tinyrl_export.json), or None: another
    model directory, a Hub id, or an export written before it recorded one."""
    from dataclasses import fields

    from tinyrl.config import TaskConfig

    info = read_export(model_dir)
    if info is None or info.task is None:
        return None
    known = {f.name for f in fields(TaskConfig)}  # every one has a default; a key of an older tinyrl is dropped
    return TaskConfig(**{k: v for k, v in info.task.items() if k in known})


def _check_model_target(target: str) -> None:
    """A target that is not a run directory: a model directory, or what can be a Hugging Face id."""
    from tinyrl.rundir import starting_run

    path = Path(target).expanduser()
    if path.exists() and (starting := starting_run(path)):
        raise starting
    if path.exists() and not (path / "config.json").is_file():
        raise TinyRLError(f"{target} is neither a run directory nor a model directory (no config.json)",
                          hint="give a `tinyrl train` --out directory, a Hugging Face model directory or id")
    if not path.exists() and _looks_local(target):
        from tinyrl.writable import nearest_sibling

        near = nearest_sibling(path, Path.is_dir)
        raise TinyRLError(f"{target}: no such directory ({path.absolute()}); nothing was evaluated",
                          hint=(f"did you mean {near}? Or give" if near else "give")
                               + " the --out directory of a `tinyrl train` or `tinyrl sft` run, a model "
                               "directory, or a Hugging Face model id (org/name, with --task)")


def _looks_local(target: str) -> bool:
    """A target that cannot be a Hugging Face id (org/name): an absolute or ./ ~ path, more than
    one '/', or an org part that is a directory here (runs/NAME when runs/ exists)."""
    if target.startswith((".", "/", "~", "\\")) or target.count("/") > 1:
        return True
    return "/" in target and Path(target).parent.is_dir()


def _engine(kind: str, model_path: str, tokenizer, device, dtype, max_model_len: int, seed: int):
    from tinyrl.rollout.factory import make_engine

    if kind == "hf":
        from transformers import AutoModelForCausalLM

        from tinyrl._compat import loading_bars_only_on_a_terminal

        from tinyrl.model_specs import hub_load_options

        loading_bars_only_on_a_terminal()
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype,
                                                     **hub_load_options(model_path, weights=True)[0])
        model = model.to(device).eval()
        return make_engine("hf", model=model, tokenizer=tokenizer, device=device)
    extra = {"gpu_memory_utilization": 0.85} if device.type == "cuda" else {"kv_cache_memory_bytes": 256 * 2**20}
    return make_engine(kind, model=None, tokenizer=tokenizer, model_path=model_path, device=device,
                       max_model_len=max_model_len, seed=seed, **extra)


DEFAULT_KS = (1, 8, 32)  # eval's --k: those up to --n


def evaluate(target: str, data: list[str] | None = None, *, task_name: str | None = None, n: int = 32,
             ks: list[int] | None = None, temperature: float = 0.6, top_p: float = 1.0, greedy: bool = True,
             engine: str = "auto", max_new_tokens: int | None = None, out_dir: Path | None = None,
             chat_template: bool | None = None, seed: int = 0, progress: bool = True,
             tools: bool | None = None, device: str = "auto", reward: str | None = None,
             extra_tools: list[str] | None = None) -> tuple[dict, Path]:
    """Evaluate; write OUT/eval.json and OUT/eval_samples.jsonl. -> (eval.json's dict, OUT)
    `data`: `name=path` or `path` items (None: a run directory's own held-back files, run_data).
    `device`: auto (a run's trainer.device when that is the CPU; else CUDA when torch sees a GPU,
    else the CPU), cpu or cuda. The hf engine runs a run's model.dtype (auto: bf16 on CUDA, fp32
    on the CPU; a model directory: auto): a run's val/score is this greedy accuracy on the device
    and dtype it validated with (EVAL_DEVICES: why a GPU can differ).
    `tools` (default: on when the task declares tools or task.extra_tools offers one): episodes
    with the task's tools, then `extra_tools` (path/to/file.py:NAME; None: the run's or the
    export's task.extra_tools), with the run's rollout limits (rollout.max_turns ...; the
    defaults for a model directory).
    `reward`: judge by a user's function instead of the task's reward: "run" (the run's
    reward.fn, which judged its val/score) or path/to/file.py:func / module:func (solved: a
    score >= 1, as in train); the rows are then not checked against the task's reward."""
    from tinyrl.config import TaskConfig
    from tinyrl.data.io import chat_text, check_one_message, load_prompts, prompt_text
    from tinyrl.models import dtype_name, pick_dtype
    from tinyrl.rundir import start_dir
    from tinyrl.setup import load_tokenizer
    from tinyrl.tasks import check_rows, get_task, offered_tools, table_hint

    sampling, on = _sampling_problems(n, ks, greedy, temperature, top_p, max_new_tokens), _device_problems(device)
    if sampling or on:  # all at once, before a run is merged or a model loads (a bad temperature crashed after both)
        hints = ["e.g. --n 32 --k 1,8,32 --temperature 0.6 --top-p 1.0 (greedy accuracy: --n 0)"] if sampling else []
        hints += ["--device auto picks the GPU when torch sees one, else the CPU"] if on else []
        raise TinyRLError("; ".join(sampling + on) + "; nothing was evaluated", hint="; ".join(hints))
    beyond = sorted(k for k in ks or [] if k > n)
    if beyond:  # an asked-for pass@k was left out of the results without a word
        raise TinyRLError(f"--k {','.join(map(str, beyond))}: pass@k and maj@k need k of the --n {n} samples per "
                          "problem; nothing was evaluated",
                          hint=f"raise --n to {beyond[-1]}"
                               + (f", or ask only for k <= {n}: --k {','.join(str(k) for k in ks if k <= n)}"
                                  if any(k <= n for k in ks) else ", or leave --k out"))
    ks = sorted(set(ks or [k for k in DEFAULT_KS if k <= n]))
    path = Path(target).expanduser()
    from tinyrl.rundir import is_run_dir

    cfg = run_config(path) if is_run_dir(path) else None
    exported_task = _exported_task(path) if cfg is None else None
    if cfg is None:  # a mistyped run directory is said as such, not as "--data and --task are needed"
        _check_model_target(target)
    if cfg is None and not data:  # --task too when it is missing: both at once, not one per try
        need, also = ("--data is", "") if task_name or exported_task else ("--data and --task are", " and no task")
        raise TinyRLError(f"{need} needed for {target}: only a run directory has held-back files{also} of its own",
                          hint="e.g. --data data/countdown/test.parquet --task countdown (a test file tinyrl "
                               "ships; `tinyrl tasks`: each task's data command)")
    files = parse_data_args(data or run_data(cfg))

    def whose(name: str) -> str:  # a defaulted file is the run's setting, and eval is not its only reader
        return "" if data else f" (the run's {'data.test_path' if name == 'test' else 'data.val_files'})"

    for name, file in files:
        if not file.is_file():
            raise TinyRLError(f"--data {name}: {file} not found{whose(name)}; nothing was evaluated",
                              hint="make it with `tinyrl data TASK ...`" if data else
                              f"it is neither here nor in {start_dir(path) or 'the directory the run was started in'}"
                              ": make it again there, or give the file: --data FILE")
    out = out_dir or (path / "eval" if cfg is not None else Path("eval") / path.name)
    there = [p for p in (out / "eval.json", out / "eval_samples.jsonl") if p.exists()]
    if there:  # said before a run's checkpoint is merged and a model loaded
        raise TinyRLError(f"{there[0]} exists; nothing was changed",
                          hint="give another --out directory" + (_another_out(path, out) if cfg is not None else ""))
    check_writable(out, lost="nothing was evaluated", example="eval/mine")  # not after the evaluation
    task_cfg = TaskConfig(**vars(cfg.task)) if cfg is not None else exported_task or TaskConfig()
    if task_name:
        task_cfg.name = task_name
    elif cfg is None and exported_task is None:
        what = "a model directory" if path.exists() else \
            f"{target}, which is no directory here and is taken as a Hugging Face model id"
        # a run directory mistyped where no runs/ is either reads as an id: say where none was found
        raise TinyRLError(f"--task is needed for {what}", hint="e.g. --task math (`tinyrl tasks`)" + (
            "" if path.exists() else f"; if you meant a run or model directory: none is at {path.absolute()}"))
    task = get_task(task_cfg.name)
    judge_spec = _judge_spec(reward, cfg)
    own_fn = cfg is not None and cfg.reward.fn not in ("task", task_cfg.name) and judge_spec is None
    rows_of = {}
    # a run's own files: the rows its validation scored (tinyrl.setup.load_inputs), so that eval's
    # greedy_acc is the run's val/score; until 2026-11-29 every row (the tool demo: 1,024 against
    # its 128, 5 minutes on a CPU for another figure than the one the run had printed)
    first = None if data else cfg.data.max_test_prompts
    for name, file in files:  # another task's file: said before a run is merged and a model loads
        try:
            make = f"give --data a file of the {task.name} task's prompts; make one with {task.data_hint}"
            rows_of[name] = load_prompts(file, first, make=make, convert=table_hint(task, file)).to_dict("records")
            if judge_spec is None:  # a user's function reads its rows its own way
                check_rows(task, rows_of[name], file)
        except TinyRLError as exc:
            # a run trained on its own data with its own reward.fn: the task cannot read those rows
            or_run = f"; or judge by the run's reward.fn = {cfg.reward.fn}, as its val/score was: --reward run" \
                if own_fn else ""
            if data:
                raise TinyRLError(exc.message, hint=exc.hint + or_run) from exc
            raise TinyRLError(f"--data {name}{whose(name)}: {exc.message}; nothing was evaluated",
                              hint=f"give the {task.name} task's prompts: --data FILE (an SFT run's test file "
                                   f"holds conversations, scored by their loss, not by the task){or_run}") from exc
    max_new = max_new_tokens if max_new_tokens is not None else (cfg.rollout.max_response_length if cfg is not None else 1024)
    if extra_tools is not None:  # --extra-tool: in place of the run's (or the export's) task.extra_tools
        task_cfg.extra_tools = list(extra_tools)
    offered = offered_tools(task_cfg)  # the task's, then task.extra_tools' (registered in tinyrl.tools.TOOLS)
    with_tools = bool(offered) if tools is None else tools
    if with_tools and not offered:
        raise TinyRLError(f"--tools: the {task.name} task declares no tools", hint="leave --tools out")
    chat = chat_template if chat_template is not None else (
        with_tools or bool(cfg is not None and cfg.data.chat_template))
    if with_tools and not chat:
        raise TinyRLError("--tools needs prompts rendered by the chat template (it lists the tools)",
                          hint="drop --no-chat-template, or evaluate without tools: --no-tools")
    if not chat:  # a system + user prompt was scored on its first message alone
        for name, file in files:
            check_one_message(rows_of[name], file, hint="give --chat-template so the tokenizer's chat template "
                              "renders every message, or make each prompt one message",
                              fed_as_text="without --chat-template (the run's data.chat_template = false, or "
                              "--no-chat-template)" if cfg is not None or chat_template is False else
                              "without --chat-template")
    device = eval_device(device, cfg.trainer.device if cfg is not None else None, engine)
    if device.type == "cpu":
        _warn_if_cores_shared()
    dtype = pick_dtype(cfg.model.dtype if cfg is not None else "auto", device)
    from tinyrl.rollout.factory import resolve_engine

    engine = resolve_engine(engine, device.type == "cuda")
    judge = None
    if judge_spec is not None:  # its worker starts (and an import error is said) before a model loads
        from tinyrl.tasks.rewards import reward_set

        judge = reward_set([judge_spec], [], task_cfg, cfg.reward.timeout_s if cfg is not None else 60.0)
    with tempfile.TemporaryDirectory(prefix="tinyrl-eval-") as tmp:
        if cfg is not None:
            model_path, label = _merged_run(path, Path(tmp))
        else:
            from tinyrl.tiny_model import resolve_model_path

            model_path, label = resolve_model_path(target), target
        try:
            tokenizer = load_tokenizer(model_path)
        except TinyRLError as exc:
            if path.exists():
                raise
            raise TinyRLError(f"{target}: no such directory here, and no Hugging Face model of that id could be "
                              f"loaded ({exc.message})", hint="give a run directory, a model directory, or a "
                              "Hugging Face id (org/name) with network access or in the local cache (HF_HUB_OFFLINE=1: "
                              "the cache alone, no network tried)") from exc
        from tinyrl.setup import tool_schemas

        schemas = tool_schemas(offered if with_tools else ())
        loaded = []
        for name, file in files:
            rows = rows_of[name]
            texts = [chat_text(r, tokenizer, schemas) if chat else prompt_text(r) for r in rows]
            loaded.append((name, tokenizer(texts, add_special_tokens=False)["input_ids"], rows, file))
        longest = max(len(p) for _, prompts, _, _ in loaded for p in prompts)
        eng = _engine(engine, model_path, tokenizer, device, dtype, longest + max_new, seed)
        try:
            tool_rollout = None
            if with_tools:
                from tinyrl.config import RolloutConfig
                from tinyrl.rollout.turns import ToolRollout

                # what a tool prints: stderr (prints_to None), so that --json's stdout is the JSON alone
                tool_rollout = ToolRollout(offered, tokenizer, eng, cfg.rollout if cfg is not None else RolloutConfig())
            results = _run(eng, tokenizer, loaded, task, task_cfg, n, ks, temperature, top_p, greedy, max_new,
                           seed, progress, tool_rollout, judge)
        finally:
            eng.close()
    summary = {"model": label, "task": task_cfg.name, "engine": engine, "device": device.type,
               **({"dtype": dtype_name(dtype)} if engine == "hf" else {}), "n": n, "k": ks,
               "temperature": temperature, "top_p": top_p, "greedy": greedy, "max_new_tokens": max_new,
               "files": {r.name: {"path": str(p), "problems": len(rows), **r.metrics}
                         for r, (_, p), (_, _, rows, _) in zip(results, files, loaded)}}
    if first is not None:
        summary["rows"] = (f"the first {first:,} rows of each file at most (the run's data.max_test_prompts), "
                           "the rows its validation scored; --data FILE: every row")
    if with_tools:
        summary["tools"] = list(offered)
    elif offered:  # a tool-trained run read 0% here, every completion a bare "</answer>", nothing said
        summary["tools_left_out"] = (f"the {task.name} task's tools ({', '.join(offered)}) were left out "
                                     "(--no-tools): its prompts list none and no tool output comes back, so a "
                                     "model trained to call them can score near 0")
    if judge_spec is not None:
        summary["judged_by"] = (f"{judge_spec} (--reward{' run' if reward == 'run' else ''}; solved: a score >= 1; "
                                "no maj@k: a reward function extracts no answer to vote on)")
    elif own_fn:
        # a user's reward.fn judged the run's val/score (solved: its score >= 1); eval judges by the
        # task: README's `<answer>`-present reward read 100% there and 0% here, with nothing said
        summary["judged_by"] = (f"the {task_cfg.name} task's reward; the run's val/score was judged by its "
                                f"reward.fn = {cfg.reward.fn} (solved: a score >= 1), so the two can differ "
                                "(--reward run judges as it did)")
    _write(out, summary, results)
    return summary, out


def _write(out: Path, summary: dict, results: list) -> None:
    """eval_samples.jsonl and eval.json, both or neither: a full disk after the whole evaluation was
    a traceback that lost its figures and left the samples without the summary."""
    make_dir(out, example="eval/mine")
    try:
        with staged(out) as stage:
            with open(stage / "eval_samples.jsonl", "w") as f:
                for r in results:
                    for sample in r.samples:
                        f.write(json.dumps(sample) + "\n")
            (stage / "eval.json").write_text(json.dumps(summary, indent=2))
    except OSError as exc:
        figures = "; ".join(f"{name}: " + ", ".join(f"{k} {v:.4g}" for k, v in m.items() if isinstance(v, (int, float)))
                            for name, m in summary["files"].items())
        raise TinyRLError(f"could not write eval.json and eval_samples.jsonl into {out}: {exc.strerror or exc}; "
                          f"nothing was written there. The evaluation's figures: {figures}",
                          hint="free disk space, or give --out a directory on a disk with room, and evaluate "
                               "again") from exc


def plain_progress(total: int, say: Callable[[str], None], parts: int = 10,
                   unit: str = "prompts") -> Callable[[int], None]:
    """A tick(k) that says `evaluating: done/total UNIT (P%), elapsed` each time another
    1/`parts` of the work is done: progress off a terminal, a few lines in all."""
    start, done, said = time.monotonic(), 0, 0

    def tick(k: int) -> None:
        nonlocal done, said
        done += k
        reached = done * parts // max(total, 1)
        if reached > said:
            said = reached
            elapsed = int(time.monotonic() - start)
            say(f"evaluating: {done:,}/{total:,} {unit} ({100 * done // max(total, 1)}%), "
                f"{elapsed // 60}:{elapsed % 60:02d} elapsed")
    return tick


def progress_unit(greedy: bool, n: int) -> str:
    """What eval's progress counts: completions, a greedy one and n samples per problem. It
    counted prompt passes: 1,024 problems read "2,048" beside a table of 1,024, and a pass of 32
    samples a prompt weighed as much as a greedy one, so its ETA said 4 minutes of an hour."""
    return f"completions ({'1 greedy + ' if greedy else ''}{n} samples per problem)" if n else "completions (greedy)"


def _ticker(bar, total: int, console, unit: str = "prompts") -> Callable[[int], None]:
    """The bar's advance on a terminal; piped, where Rich draws no bar (the demo's eval said
    nothing for 100 s), plain_progress's lines."""
    if bar is not None:
        job = bar.add_task(f"evaluating ({unit})", total=total)
        return lambda k: bar.advance(job, k)
    return plain_progress(total, lambda line: console.print(line, highlight=False, soft_wrap=True), unit=unit)


def _judge_spec(reward: str | None, cfg) -> str | None:
    """--reward's function spec (None: the task judges), checked as train checks reward.fn."""
    from tinyrl.tasks.rewards import is_task_reward, spec_problem

    if reward is None or reward == "task":
        return None
    if reward == "run":
        if cfg is None:
            raise TinyRLError("--reward run needs a run directory (it names the run's reward.fn)",
                              hint="give the function itself: --reward path/to/file.py:func")
        if is_task_reward(cfg.reward.fn):
            raise TinyRLError(f"--reward run: the run's reward.fn = {cfg.reward.fn} is a task's reward, which eval "
                              "judges by already", hint="leave --reward out (or give --task NAME)")
        return cfg.reward.fn
    if is_task_reward(reward):  # "task" returned above: a task's name
        raise TinyRLError(f"--reward {reward} is a task: its reward judges when it is eval's task",
                          hint=f"--task {reward}")
    problem = spec_problem(reward, "--reward")
    if problem:
        raise TinyRLError(f"{problem}; nothing was evaluated",
                          hint="--reward run (the run's reward.fn), or path/to/file.py:func / module:func")
    return reward


def _run(eng, tokenizer, loaded, task, task_cfg, n, ks, temperature, top_p, greedy, max_new, seed, progress,
         tool_rollout=None, judge=None):
    from contextlib import nullcontext

    from rich.console import Console

    total = sum(len(prompts) for _, prompts, _, _ in loaded) * ((1 if greedy else 0) + n)  # completions
    console = Console(stderr=True)
    if progress and console.is_terminal:
        from rich.progress import Progress

        bar_ctx = Progress(console=console, transient=True)
    else:
        bar_ctx = nullcontext(None)
    with bar_ctx as bar:
        tick = _ticker(bar, total, console, progress_unit(greedy, n)) if progress else (lambda k: None)
        return [score_prompts(eng, tokenizer, prompts, rows, task, task_cfg, n=n, ks=ks, temperature=temperature,
                              top_p=top_p, greedy=greedy, max_new_tokens=max_new, seed=seed, name=name, tick=tick,
                              tool_rollout=tool_rollout, judge=judge, data=file)
                for name, prompts, rows, file in loaded]
