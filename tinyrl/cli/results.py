"""After a run, what it learned: `tinyrl eval` and `tinyrl report`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from tinyrl.cli.common import app, log_to_stderr, out, said_if_stopped
from tinyrl.errors import TinyRLError


@app.command("eval")
def eval_cmd(
    target: str = typer.Argument(..., metavar="RUN_DIR|MODEL", help="A run directory (its latest checkpoint), or a Hugging Face model directory or id."),
    data: Optional[list[str]] = typer.Option(None, "--data", help="Parquet file(s) of the task, name=FILE or FILE (repeatable). Default for a run directory: the rows its validation scored (the first data.max_test_prompts of data.test_path as `test` and of data.val_files; give the file for every row)."),
    task: Optional[str] = typer.Option(None, "--task", help="Task (`tinyrl tasks`); default: the run's."),
    n: int = typer.Option(32, "--n", help="Sampled completions per problem (0: greedy only)."),
    k: Optional[str] = typer.Option(None, "--k", help="pass@k / maj@k for these k, each <= n (default: 1,8,32, those <= n)."),
    temperature: float = typer.Option(0.6, "--temperature", help="Sampling temperature of the n samples."),
    top_p: float = typer.Option(1.0, "--top-p", help="Nucleus sampling of the n samples."),
    greedy: bool = typer.Option(True, "--greedy/--no-greedy", help="Also one greedy completion per problem (greedy accuracy)."),
    engine: str = typer.Option("auto", "--engine", help="auto (vllm on CUDA, else hf) | hf | vllm."),
    device: str = typer.Option("auto", "--device", help="auto (a run pinned to the CPU by trainer.device: the CPU; else CUDA when torch sees a GPU, else the CPU) | cpu | cuda. A run's val/score is this greedy accuracy on the device and model.dtype it validated with (on a GPU, bf16, the two can differ by a few answers)."),
    max_tokens: Optional[int] = typer.Option(None, "--max-tokens", help="Response limit (default: the run's, else 1024)."),
    chat_template: Optional[bool] = typer.Option(None, "--chat-template/--no-chat-template", help="Render prompts with the tokenizer's chat template (default: the run's data.chat_template)."),
    tools: Optional[bool] = typer.Option(None, "--tools/--no-tools", help="Episodes with the task's tools (default: on when the task declares tools or --extra-tool gives one; limits: the run's rollout.max_turns ...)."),
    extra_tools: Optional[list[str]] = typer.Option(None, "--extra-tool", help="A tool of yours offered after the task's: path/to/file.py:NAME, NAME a tinyrl.tools.Tool (repeatable; default: the run's or the exported model's task.extra_tools)."),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Where eval.json and eval_samples.jsonl go (default: RUN_DIR/eval or eval/MODEL)."),
    seed: int = typer.Option(0, "--seed", help="Sampling seed."),
    reward: Optional[str] = typer.Option(None, "--reward", help="Judge by a reward function instead of the task's reward: 'run' (the run's reward.fn, as its val/score was judged) or path/to/file.py:func (solved: a score >= 1; no maj@k)."),
    as_json: bool = typer.Option(False, "--json", help="Print eval.json instead of the table."),
) -> None:
    """Greedy accuracy, mean@n, pass@k (unbiased), maj@k, response length and tokens/s on a task's data.

    Example (after the CPU demo): tinyrl eval runs/countdown-demo --n 4

    Example: tinyrl eval runs/math-grpo-4090 --data aime=data/math/aime_2024-train.parquet --k 1,8,32
    """
    from tinyrl.eval import evaluate

    try:
        ks = [int(x) for x in k.split(",") if x.strip()] if k is not None else None
    except ValueError as e:
        raise TinyRLError(f"--k {k!r} is not a list of integers", hint="e.g. --k 1,8,32") from e
    if engine not in ("auto", "hf", "vllm"):
        raise TinyRLError(f"--engine {engine!r} is not auto, hf or vllm", hint="e.g. --engine hf")
    log_to_stderr()
    # SIGTERM killed eval outright, leaving the run's merged model (a 3B: ~12 GB) in TMPDIR; as
    # Interrupted it unwinds through the temporary directory. Ctrl-C ended silently (Typer's exit 130).
    with said_if_stopped("; nothing was written"):
        summary, where = evaluate(target, data, task_name=task, n=n, ks=ks, temperature=temperature, top_p=top_p,
                                  greedy=greedy, engine=engine, max_new_tokens=max_tokens, out_dir=out_dir,
                                  chat_template=chat_template, seed=seed, progress=not as_json, tools=tools,
                                  device=device, reward=reward, extra_tools=extra_tools)
    if as_json:
        print(json.dumps(summary, indent=2))
        return
    out.print(eval_table(summary))
    if "rows" in summary:
        out.print(f"rows: {summary['rows']}", highlight=False, soft_wrap=True, markup=False)
    if "judged_by" in summary:
        out.print(f"judged by {summary['judged_by']}", highlight=False, soft_wrap=True, markup=False)
    if "tools_left_out" in summary:
        out.print(f"note: {summary['tools_left_out']}", highlight=False, soft_wrap=True, markup=False)
    out.print(f"wrote {where / 'eval.json'} and {where / 'eval_samples.jsonl'}",
              highlight=False, soft_wrap=True, markup=False)


def eval_table(summary: dict) -> Table:
    """eval.json's metrics as a table: rates to 4 places, lengths to 1, counts and tokens/s whole; the title
    says "greedy only" for --n 0 (no sample was drawn at T)."""
    sampled = f"n={summary['n']} T={summary['temperature']}" if summary["n"] else "greedy only"
    title = f"tinyrl eval · {summary['model']} · task {summary['task']} · {summary['engine']} on " \
            f"{summary['device']} · {sampled}"
    # as wide as its title (the console caps it): a three-column table's width wrapped it in three lines
    table = Table(title=title, min_width=len(title))
    table.add_column("data", style="bold cyan")
    table.add_column("metric")
    table.add_column("value", justify="right")
    places = {"tokens_per_s": ",.0f", "response_length": ".1f", "tools/seconds": ".1f", "episode/turns": ".2f",
              **dict.fromkeys(("tools/calls", "tools/errors", "tools/timeouts", "episode/tokenization_mismatch",
                               "episode/text_mismatch"), ",.0f")}  # counts
    for name, metrics in summary["files"].items():
        for key, value in metrics.items():
            if key != "path":
                table.add_row(name, key, format(value, places.get(key, ".4f")) if isinstance(value, float)
                              else f"{value:,}" if isinstance(value, int) else str(value))
    return table



@app.command("report")
def report(
    run_dir: Path = typer.Argument(..., metavar="RUN_DIR", help="A run directory written by `tinyrl train` or `tinyrl sft` (holds metrics.jsonl)."),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Where to write (default: RUN_DIR/report)."),
) -> None:
    """PNG plots (reward, KL, length, memory, phase timings, validation, tool use) and summary.txt of a run.

    Example: tinyrl report runs/countdown-demo
    """
    from tinyrl.report import write_report

    where = out_dir or run_dir / "report"  # plots and summary.txt move in together (write_report)
    with said_if_stopped(f" while writing the report of {run_dir}; no plot or summary in {where} was changed"):
        files = write_report(run_dir, out_dir)
    for path in files:
        out.print(str(path), highlight=False, soft_wrap=True, markup=False)
    out.print()
    out.print(files[-1].read_text(), markup=False, highlight=False, soft_wrap=True)  # summary.txt
