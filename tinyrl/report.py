"""`tinyrl report RUN_DIR`: PNG plots and a summary.txt from a run's metrics.jsonl.

Reads (written by the trainer): RUN_DIR/metrics.jsonl (one JSON object per step, the dashboard's
keys), optional RUN_DIR/config.json, RUN_DIR/timeline.jsonl ({"t", "phase", "memory_bytes", peaks})
and RUN_DIR/memory_plan.json (a CUDA run's plan: planned vs measured per phase, tinyrl.memory.versus).
Writes RUN_DIR/report/*.png and summary.txt unless told another directory.
A plot whose metrics are absent is skipped (and named in the summary), never drawn empty.
train's data.val_files figures (`val/<name>/<metric>`) get one plot per metric family (greedy_acc,
pass@k, maj@k, mean@n, response_length; a line per file) and a summary line per file.
A run whose episodes call tools (`tools/*`, `episode/turns` metrics) gets tools.png and a
summary line per tool metric; a run without them gets nothing about tools, not even "skipped".
Uses matplotlib's object API (Figure + Agg), not pyplot: no global backend switch, no GUI.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any, Callable

from tinyrl.dashboard import PHASES, TOOL_METRICS, memory_label, val_files, val_metric_order
from tinyrl.errors import TinyRLError
from tinyrl.jsonl import read_records
from tinyrl.memory import versus
from tinyrl.rundir import other_holder
from tinyrl.writable import make_dir, staged
from tinyrl.words import counted, step_ranges

GIB = 1024**3
# What val/score is (trainer.validate): the task's "solved" share of greedy completions of the
# test prompts, not their mean reward (that is val/reward_mean).
VAL_SCORE_MEANS = "greedy accuracy (share of test prompts solved)"
_STYLE = {"font.size": 11, "axes.titlesize": 13, "axes.labelsize": 11, "legend.fontsize": 9,
          "xtick.labelsize": 10, "ytick.labelsize": 10, "axes.grid": True, "grid.alpha": 0.3}


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def _refuse_a_model_directory(path: Path) -> None:
    """`tinyrl export`'s output was said to be a run with no step logged yet."""
    from tinyrl.export_info import read_export

    info = read_export(path)
    if info is None:
        return
    raise TinyRLError(f"{path} is a model directory (`tinyrl export` of the run {info.run_dir}), not a run: "
                      "it holds no metrics", hint=f"report the run it came from: tinyrl report {info.run_dir} "
                      "(as written at the export, relative to where it ran)")


def _who(holder: str) -> str:
    """A lock file's "12345 tinyrl train since ..." said as "pid 12345, tinyrl train since ..."."""
    pid, _, what = holder.partition(" ")
    return f"pid {pid}, {what}" if what else f"pid {pid}"


def _under_way(run_dir: Path, holder: str) -> TinyRLError:
    return TinyRLError(f"{run_dir} is a run under way ({_who(holder)}) with no finished step yet",
                       hint="a run logs each step as it ends: try again after step 1")


def load_metrics(run_dir: Path, notes: list[str]) -> list[dict]:
    """Step records sorted by step; a step logged twice (a resumed run redoes it) keeps the last.
    A run still under way (another process holds its lock) and without a step is said so."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        _refuse_a_model_directory(run_dir)  # its config.json is the model's, not a run's
        if holder := other_holder(run_dir):
            raise _under_way(run_dir, holder)
        if (run_dir / "config.json").is_file():  # a run that has not finished a step yet
            raise TinyRLError(f"{run_dir} has no step logged yet (no metrics.jsonl)",
                              hint="a run logs each step as it ends: report it after its first step")
        raise TinyRLError(f"no metrics file: {path}",
                          hint="give the run directory that `tinyrl train` or `tinyrl sft` wrote (it holds metrics.jsonl)")
    records = read_records(path, notes)
    if not records and (holder := other_holder(run_dir)):
        raise _under_way(run_dir, holder)
    if not records:
        raise TinyRLError(f"{path} has no step records",
                          hint="the run stopped before its first step finished; train for at least one step")
    by_step: dict[float, dict] = {}
    for i, rec in enumerate(records):
        step = _number(rec.get("step"))
        by_step[step if step is not None else float(i + 1)] = rec
    if len(by_step) < len(records):
        notes.append(f"metrics.jsonl: {len(records) - len(by_step)} repeated step record(s) "
                     "(a resumed run?), kept the last of each")
    return [dict(by_step[s], step=s) for s in sorted(by_step)]


def series(records: list[dict], key: str, scale: float = 1.0) -> tuple[list[float], list[float]]:
    """(steps, values) where `key` holds a finite number."""
    xs, ys = [], []
    for rec in records:
        v = _number(rec.get(key))
        if v is not None:
            xs.append(rec["step"])
            ys.append(v * scale)
    return xs, ys


def _test_prompts(recs: list[dict]) -> str:
    """The prompts val/score is out of: their number from the last validation's val/prompts (a run
    from before 2026-11-29 has none)."""
    _, counts = series(recs, "val/prompts")
    return f"{counts[-1]:g} held-back test prompts" if counts else "the held-back test prompts"


def accuracy_change(recs: list[dict]) -> str | None:
    """val/score at step 0 (trainer.val_before_train: the starting model) against the last
    validation, on the same test prompts; None when the run has no step-0 validation."""
    xs, ys = series(recs, "val/score")
    if len(xs) < 2 or xs[0] != 0:
        return None
    on = _test_prompts(recs)
    line = (f"greedy accuracy (val/score) on {on}: {ys[0]:.1%} before training -> {ys[-1]:.1%} after "
            f"step {xs[-1]:g} ({100 * (ys[-1] - ys[0]):+.1f} points)")
    tx, ts = series(recs, "val/tools/ok_share")  # a task with tools: how many episodes used one
    if len(tx) >= 2 and tx[0] == 0:
        line += (f"\nepisodes with a successful tool call (val/tools/ok_share), same prompts: {ts[0]:.1%} before "
                 f"training -> {ts[-1]:.1%} after step {tx[-1]:g}")
    return line


def judged_by(config: dict | None) -> str | None:
    """Who judged a run's val/score when it is not its task's reward (a user's reward.fn): said
    beside the figure, which read "greedy accuracy ... 100.0%" for README's has-a-tag reward."""
    if not isinstance(config, dict) or not isinstance(config.get("reward"), dict):
        return None
    fn, task = config["reward"].get("fn"), (config.get("task") or {}).get("name")
    from tinyrl.tasks.rewards import is_task_reward

    if not isinstance(fn, str) or fn == task or is_task_reward(fn):
        return None
    return f"val/score judged by reward.fn = {fn} (solved: a score >= 1), not the {task} task's reward"


def last_validation(recs: list[dict]) -> str | None:
    """The run's last validation in a line, for a run with no step-0 one to compare with (an SFT
    run: its figures were only in the dashboard's last frame): val/score, else val/loss."""
    xs, ys = series(recs, "val/score")
    if xs:
        return f"greedy accuracy (val/score) on {_test_prompts(recs)}: {ys[-1]:.1%} at step {xs[-1]:g}"
    xs, ys = series(recs, "val/loss")
    return f"validation loss (val/loss) at step {xs[-1]:g}: {ys[-1]:.4f}" if xs else None


def _marker(xs: list) -> str:
    return "o" if len(xs) <= 30 else ""  # few steps: show the points, or a 2-step run looks empty


def _plot_reward(ax, recs: list[dict]) -> None:
    xs, mean = series(recs, "reward/mean")
    lo_x, lo = series(recs, "reward/min")
    hi_x, hi = series(recs, "reward/max")
    if lo_x == xs and hi_x == xs:
        ax.fill_between(xs, lo, hi, alpha=0.2, color="tab:green", label="min–max over the batch")
    ax.plot(xs, mean, color="tab:green", marker=_marker(xs), label="mean")
    ax.set(title="Reward per step", xlabel="step", ylabel="reward (score per response)")
    ax.legend(loc="upper left")


def _legend_below(ax, twin=None) -> None:
    """One legend for both y axes, under the plot, where it cannot hide a line."""
    handles, labels = ax.get_legend_handles_labels()
    if twin is not None:
        h2, l2 = twin.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=len(labels), frameon=False)


def _plot_kl(ax, recs: list[dict]) -> None:
    xs, kl = series(recs, "kl/mean")
    cx, coef = series(recs, "kl/coef")
    fixed = bool(cx) and max(coef) == min(coef)
    # A fixed coefficient is one number: say it in the legend; a twin axis would draw a flat line
    # against a made-up scale. An adaptive one moves, so it gets its own axis.
    label = f"KL to reference (β = {coef[0]:g}, fixed)" if fixed else "KL to reference"
    ax.plot(xs, kl, color="tab:purple", marker=_marker(xs), label=label)
    ax.set(title="KL divergence to the reference policy", xlabel="step", ylabel="KL (nats per token)")
    twin = None
    if cx and not fixed:
        twin = ax.twinx()
        twin.plot(cx, coef, color="tab:gray", linestyle="--", label="KL coefficient β (adaptive)")
        twin.set_ylabel("KL coefficient β")
        twin.grid(False)
    _legend_below(ax, twin)


def _plot_length(ax, recs: list[dict]) -> None:
    xs, mean = series(recs, "response_length/mean")
    ax.plot(xs, mean, color="tab:blue", marker=_marker(xs), label="mean")
    mx, mxv = series(recs, "response_length/max")
    if mx:
        ax.plot(mx, mxv, color="tab:blue", linestyle="--", alpha=0.6, label="max")
    ax.set(title="Response length", xlabel="step", ylabel="response length (tokens)")
    ax.set_ylim(bottom=0)
    cx, clip = series(recs, "response_length/clip_ratio", scale=100)
    twin = None
    if cx:
        twin = ax.twinx()
        twin.plot(cx, clip, color="tab:red", alpha=0.7, label="cut at max length (%)")
        twin.set_ylabel("responses cut at max length (%)")
        twin.set_ylim(bottom=0)
        twin.grid(False)
    _legend_below(ax, twin)


def _plot_memory(ax, recs: list[dict]) -> None:
    kind = next((r["memory/kind"] for r in recs if r.get("memory/kind")), None)
    label = memory_label(kind)
    highest = 0.0
    for key, name, style in (("memory/used_bytes", "used", "-"), ("memory/peak_bytes", "peak", "--")):
        xs, ys = series(recs, key, scale=1 / GIB)
        if xs:
            ax.plot(xs, ys, linestyle=style, marker=_marker(xs), label=f"{label} {name}")
            highest = max(highest, max(ys))
    _, total = series(recs, "memory/total_bytes", scale=1 / GIB)
    what = "GPU memory (VRAM)" if label == "VRAM" else "Process memory (RAM)" if label == "RAM" else "Memory"
    title = f"{what} per step"
    top = highest
    if total and highest >= 0.25 * max(total):
        top = max(total)
        ax.axhline(max(total), color="tab:red", linestyle=":", label=f"{label} total {max(total):.1f} GiB")
    elif total:
        # A small process on a big machine: a line at the total would flatten the curves to the floor.
        title += f" (of {max(total):.1f} GiB total)"
    ax.set(title=title, xlabel="step", ylabel="GiB")
    ax.set_ylim(0, top * 1.12 or 1.0)  # headroom so the highest line does not sit on the frame
    ax.legend(loc="best")


def _phase_keys(recs: list[dict]) -> list[str]:
    return [p for p in PHASES if any(_number(r.get(f"timing/{p}")) is not None for r in recs)]


def timing_stacks(recs: list[dict]) -> tuple[list[str], list[float], list[list[float]]]:
    """(phases, steps, seconds per phase at each step) over the steps that timed a phase: a
    record without timings (trainer.val_before_train's step 0) is no step of 0 s, which the
    stacked plot drew as a ramp from 0 up to the first step."""
    phases = _phase_keys(recs)
    timed = [r for r in recs if any(_number(r.get(f"timing/{p}")) is not None for p in phases)]
    # A phase a step did not run (validate, checkpoint) counts 0 s there, so the stack stays aligned.
    return phases, [r["step"] for r in timed], [[_number(r.get(f"timing/{p}")) or 0.0 for r in timed]
                                                for p in phases]


def _plot_timings(ax, recs: list[dict]) -> None:
    phases, xs, stacks = timing_stacks(recs)
    if len(xs) <= 60:
        bottom = [0.0] * len(xs)
        for p, ys in zip(phases, stacks):
            ax.bar(xs, ys, bottom=bottom, label=p, width=0.8)
            bottom = [b + y for b, y in zip(bottom, ys)]
    else:
        ax.stackplot(xs, stacks, labels=phases)
    sx, total = series(recs, "timing/step")
    if sx:
        ax.plot(sx, total, color="black", marker=_marker(sx), markersize=3, label="whole step")
    ax.set(title="Time per step by phase", xlabel="step", ylabel="seconds")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))


def _plot_val(ax, recs: list[dict]) -> None:
    xs, ys = series(recs, "val/score")
    ax.plot(xs, ys, color="tab:orange", marker="o", label="val/score")
    ax.set(title="Validation: greedy accuracy", xlabel="step", ylabel=VAL_SCORE_MEANS)
    # a share of prompts: 0..1 always (one point drew -0.04..0.04 around itself, a flat line 0.49..0.51)
    ax.set_ylim(-0.02, 1.02)
    ax.legend(loc="upper left")


def _plot_sft_loss(ax, recs: list[dict]) -> None:
    xs, loss = series(recs, "sft/loss")
    ax.plot(xs, loss, color="tab:blue", marker=_marker(xs), markersize=3, label="training loss (batch)")
    vx, val = series(recs, "val/loss")
    if vx:
        ax.plot(vx, val, color="tab:orange", marker="o", label="validation loss")
    ax.set(title="SFT loss", xlabel="step", ylabel="token-mean NLL (nats)")
    ax.legend(loc="upper right")


def _plot_tools(ax, recs: list[dict]) -> None:
    """tools/calls, tools/errors and tools/timeouts per step (left axis), episode/turns (right), as
    the trainer logged them (their definitions are the turn loop's, tinyrl.rollout)."""
    for key, color in (("tools/calls", "tab:blue"), ("tools/errors", "tab:red"), ("tools/timeouts", "tab:orange")):
        xs, ys = series(recs, key)
        if xs:
            ax.plot(xs, ys, color=color, marker=_marker(xs), label=key)
    ax.set(title="Tool use per step", xlabel="step", ylabel="tool calls / errors / timeouts")
    ax.set_ylim(bottom=0)
    tx, turns = series(recs, "episode/turns")
    twin = None
    if tx:
        twin = ax.twinx()
        twin.plot(tx, turns, color="tab:gray", linestyle="--", label="episode/turns")
        twin.set_ylabel("episode/turns")
        twin.set_ylim(bottom=0)
        twin.grid(False)
    _legend_below(ax, twin)


# name -> (metric keys, any one of which makes the plot worth drawing; how to draw it)
PLOTS: dict[str, tuple[tuple[str, ...], Callable]] = {
    "reward.png": (("reward/mean",), _plot_reward),
    "kl.png": (("kl/mean",), _plot_kl),
    "response_length.png": (("response_length/mean",), _plot_length),
    "memory.png": (("memory/used_bytes", "memory/peak_bytes"), _plot_memory),
    "timings.png": (tuple(f"timing/{p}" for p in PHASES), _plot_timings),
    "val_score.png": (("val/score",), _plot_val),
    "sft_loss.png": (("sft/loss",), _plot_sft_loss),
    "tools.png": (("tools/calls", "tools/errors", "tools/timeouts", "episode/turns"), _plot_tools),
}
# Plots of one kind of run only: not listed as skipped for the other kind (`tinyrl sft` or `train`).
SFT_ONLY = {"sft_loss.png"}
RL_ONLY = {"reward.png", "kl.png", "response_length.png", "val_score.png"}
# Plots of runs whose episodes call tools: a run without tool metrics does not hear of them.
TOOLS_ONLY = {"tools.png"}


_VAL_TITLES = {"greedy_acc": "greedy accuracy", "pass": "pass@k (unbiased estimator)",
               "maj": "maj@k (majority vote of k samples)", "mean": "mean@n (share of samples correct)",
               "response_length": "mean response length (tokens)"}


def val_families(recs: list[dict]) -> dict[str, list[tuple[str, str]]]:
    """data.val_files figures by metric family (pass@1 and pass@8 are one: `pass`), each a list of
    (file name, metric), in val_metric_order. -> {family: [(file, metric), ...]}"""
    seen = {(name, metric) for r in recs for name, figures in val_files(r).items() for metric in figures
            if _number(figures[metric]) is not None}
    out: dict[str, list[tuple[str, str]]] = {}
    for name, metric in sorted(seen, key=lambda nm: (val_metric_order(nm[1]), nm[0])):
        out.setdefault(metric.partition("@")[0], []).append((name, metric))
    return out


def _val_plot(family: str, lines: list[tuple[str, str]]) -> Callable:
    """One plot of a family: a colour per file, a line style per k (pass@1 solid, pass@8 dashed ...)."""
    def draw(ax, recs: list[dict]) -> None:
        files = sorted({name for name, _ in lines})
        ks = sorted({metric for _, metric in lines}, key=val_metric_order)
        for name, metric in lines:
            xs, ys = series(recs, f"val/{name}/{metric}")
            ax.plot(xs, ys, color=f"C{files.index(name) % 10}", marker="o",
                    linestyle=("-", "--", ":", "-.")[ks.index(metric) % 4],
                    label=name if len(ks) == 1 else f"{name} {metric}")
        what = _VAL_TITLES.get(family, family)
        ax.set(title=f"Validation files: {what}", xlabel="step",
               ylabel="tokens" if family == "response_length" else "share of problems")
        if family != "response_length":
            ax.set_ylim(-0.02, 1.02)  # shares of problems: a fixed 0..1 axis keeps files comparable
        ax.legend(loc="best")
    return draw


def val_summary(recs: list[dict]) -> list[str]:
    """Per data.val_files file: its last validation's figures."""
    last: dict[str, tuple[float, dict]] = {}
    for r in recs:
        for name, figures in val_files(r).items():
            last[name] = (r["step"], figures)
    return [f"val {name} (step {step:g}): " + ", ".join(
            f"{k} {figures[k]:.1f}" if k == "response_length" else f"{k} {figures[k]:.4f}"
            for k in sorted(figures, key=val_metric_order) if _number(figures[k]) is not None)
            for name, (step, figures) in sorted(last.items())]


def _plot_timeline(ax, points: list[dict]) -> None:
    pts = [(_number(p.get("t")), str(p.get("phase", "?")), _number(p.get("memory_bytes"))) for p in points]
    pts = sorted((t, ph, m) for t, ph, m in pts if t is not None)
    minutes = pts[-1][0] > 600  # long runs read better in minutes
    unit = 60.0 if minutes else 1.0
    ts = [t / unit for t, _, _ in pts]
    mem = [(m or 0.0) / GIB for _, _, m in pts]
    colors: dict[str, Any] = {}
    start = 0
    for i in range(1, len(pts) + 1):  # shade each run of one phase
        if i == len(pts) or pts[i][1] != pts[start][1]:
            ph = pts[start][1]
            end = ts[i] if i < len(pts) else ts[-1]
            color = colors.setdefault(ph, f"C{len(colors) % 10}")
            ax.axvspan(ts[start], end, color=color, alpha=0.25, lw=0,
                       label=ph if ph not in ax.get_legend_handles_labels()[1] else None)
            start = i
    ax.step(ts, mem, where="post", color="black", lw=1.2, label="memory")
    ax.set(title="Memory over time by phase", xlabel="minutes since start" if minutes else "seconds since start",
           ylabel="GiB")
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))


def _figure_module():
    try:
        import matplotlib
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise TinyRLError("tinyrl report draws its plots with matplotlib, which is not installed",
                          hint="pip install -e '.[plots]'") from exc
    return matplotlib, Figure


def _save(Figure, matplotlib, draw: Callable, data: Any, path: Path, wide: bool = False,
          by_step: bool = True) -> None:
    from matplotlib.ticker import MaxNLocator

    with matplotlib.rc_context(_STYLE):
        fig = Figure(figsize=(10 if wide else 8, 4.5), dpi=120)
        ax = fig.add_subplot()
        draw(ax, data)
        if by_step:  # steps are whole numbers; a 2-step run must not get ticks at 1.25, 1.5 ...
            low, high = ax.get_xlim()
            if high - low < 2:  # one step: MaxNLocator falls back to 2.96, 2.98 ... on a narrower axis
                middle = (low + high) / 2
                ax.set_xlim(middle - 1, middle + 1)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        fig.savefig(path, bbox_inches="tight")  # "tight" keeps legends placed outside the axes


def tools_summary(recs: list[dict]) -> list[str]:
    """A line per tool metric the run logged (TOOL_METRICS): its first, last and mean per step."""
    lines = []
    for key in TOOL_METRICS:
        xs, ys = series(recs, key)
        if xs:
            # one precision for the three (first 3.83524 beside mean 8.234 read as different kinds of figure)
            lines.append(f"{key} per step: first {ys[0]:.4g} (step {xs[0]:g}), last {ys[-1]:.4g} (step {xs[-1]:g}), "
                         f"mean {statistics.fmean(ys):.4g}")
    return lines


def _trained(recs: list[dict]) -> list[float]:
    """The steps that trained: not trainer.val_before_train's step 0 (validation figures only)."""
    return [r["step"] for r in recs if any(not k.startswith("val/") for k in r if k != "step")]


def steps_line(recs: list[dict]) -> str:
    """How many steps the run trained: trainer.val_before_train's step-0 record (validation
    figures only) is said apart, where it made the demo's 60 steps "61 recorded, step 0 to 60"."""
    steps = _trained(recs)
    before = " (and a validation before training, step 0)" if any(r["step"] == 0 for r in recs) else ""
    if not steps:
        return f"steps: none trained{before}"
    # steps with no record (a full disk kept their lines out until a run ended): said, not hidden
    # in "3 recorded, step 1 to 9"
    have = {int(s) for s in steps if float(s).is_integer()}
    gap = [s for s in range(int(min(steps)), int(max(steps)) + 1) if s not in have]
    gap_text = f" (no record of steps {step_ranges(gap)})" if gap else ""
    span = f"step {steps[0]:g}" if len(steps) == 1 else f"step {steps[0]:g} to {steps[-1]:g}"
    return f"steps: {len(steps)} recorded, {span}{gap_text}{before}"


def steady_timing(run_dir: Path | None):
    """The run's timing as `estimate-cost --from-run` prices it (tinyrl.cost.read_run: the first
    step, and the first after each resume, left out as warm-up); None when too few steps are left
    (or no run directory): then the report's medians are over every step, said so. The one rule
    for which steps the report's medians (step time, throughput) leave out."""
    from tinyrl.cost import read_run

    if run_dir is None:
        return None
    try:
        return read_run(run_dir)
    except TinyRLError:
        return None


def _over_all(n: int) -> str:
    """'over all 3 steps', 'over 1 step' (too few to leave out warm-up)."""
    return f"over {'all ' if n > 1 else ''}{counted(n, 'step')} (too few to leave out warm-up)"


def step_time_line(recs: list[dict], timing: Any) -> str:
    """The median step time `estimate-cost --from-run` prices an epoch with: one figure, where the
    report gave the median of every step beside it. `timing`: steady_timing(run_dir)."""
    if timing is not None:
        warm = ", ".join(map(str, timing.warmup_steps))
        return (f"median step time: {timing.sec_per_step:.2f} s over {counted(timing.steady_steps, 'step')} "
                f"(warm-up step{'s' if len(timing.warmup_steps) > 1 else ''} {warm} left out, as "
                "estimate-cost --from-run does)")
    _, st = series(recs, "timing/step")
    if not st:
        return "median step time: not recorded"
    return f"median step time: {statistics.median(st):.2f} s {_over_all(len(st))}"


def throughput_line(recs: list[dict], timing: Any) -> str | None:
    """The median tokens/s over the same steps as the median step time: the warm-up steps that
    steady_timing left out are left out here too (a slow first step's low figure is no steady one)."""
    warm = set(timing.warmup_steps) if timing is not None else set()
    _, tps = series([r for r in recs if r["step"] not in warm], "perf/tokens_per_s")
    if not tps:
        return None
    over = "(warm-up left out, as for the step time)" if timing is not None else _over_all(len(tps))
    return f"median throughput: {statistics.median(tps):,.0f} tokens/s {over}"


def summarize(recs: list[dict], config: dict | None, run_dir: Path | None = None,
              live: str | None = None) -> list[str]:
    """The summary's lines; `live`: the lock holder of a run still under way (rundir.other_holder),
    whose figures are its latest so far, not final."""
    lines = []
    if config:
        lines.append(f"preset: {config.get('preset', '–')}  model: {config.get('model', {}).get('name', '–')}"
                     if isinstance(config.get("model"), dict) else f"preset: {config.get('preset', '–')}")
    if live:
        lines.append(f"run in progress ({_who(live)}): {counted(len(_trained(recs)), 'step')} so far; "
                     "the figures below are its latest, not final")
    lines.append(steps_line(recs))
    final = "latest" if live else "final"
    xs, rw = series(recs, "reward/mean")
    sx, sl = series(recs, "sft/loss")
    if sl:  # `tinyrl sft`: losses, not rewards
        vx, vl = series(recs, "val/loss")
        lines.append(f"sft/loss: first {sl[0]:.4f} (step {sx[0]:g}), last {sl[-1]:.4f} (step {sx[-1]:g})")
        lines.append(f"{final} val loss: {vl[-1]:.4f} (step {vx[-1]:g})" if vl else f"{final} val loss: none")
    elif rw:
        best = max(range(len(rw)), key=rw.__getitem__)
        lines.append(f"reward/mean: first {rw[0]:.4f} (step {xs[0]:g}), last {rw[-1]:.4f} (step {xs[-1]:g}), "
                     f"best {rw[best]:.4f} (step {xs[best]:g})")
    else:
        lines.append("reward/mean: not recorded")
    vx, val = series(recs, "val/score")
    if val:  # an SFT run's too (sft.val_generate: the demo's accuracy before RL)
        lines.append(f"{final} val score: {val[-1]:.4f} (step {vx[-1]:g})")
    elif not sl:
        lines.append(f"{final} val score: none (no validation step{' so far' if live else 's'})")
    lines += val_summary(recs)
    lines += tools_summary(recs)
    change = accuracy_change(recs)
    if change:
        lines.append(change)
    if val and (judge := judged_by(config)):
        lines.append(judge)
    timing = steady_timing(run_dir)
    lines.append(step_time_line(recs, timing))
    if throughput := throughput_line(recs, timing):
        lines.append(throughput)
    _, peak = series(recs, "memory/peak_bytes")
    _, used = series(recs, "memory/used_bytes")
    _, total = series(recs, "memory/total_bytes")
    kind = memory_label(next((r["memory/kind"] for r in recs if r.get("memory/kind")), None))
    if peak or used:
        of = f" of {max(total) / GIB:.1f} GiB" if total else ""
        lines.append(f"peak memory: {max(peak or used) / GIB:.2f} GiB {kind}{of}")
    else:
        lines.append("peak memory: not recorded")
    phases = _phase_keys(recs)
    sums = {p: sum(series(recs, f"timing/{p}")[1]) for p in phases}
    whole = sum(sums.values())
    if whole > 0:
        lines.append("time by phase: " + ", ".join(f"{p} {100 * s / whole:.0f}%" for p, s in
                                                   sorted(sums.items(), key=lambda kv: -kv[1])))
    return lines


def memory_vs_plan(run_dir: Path, timeline: list[dict]) -> tuple[list[str], list[dict]]:
    """summary.txt lines and plot rows: each phase's planned vs measured peak (tinyrl.memory.versus)."""
    plan = versus.read_run_plan(run_dir)
    measured = versus.measured_peaks(timeline)
    rows = versus.compare(plan, measured) if plan else []
    if not plan:
        why = "a CPU run: no plan is made" if any(m["kind"] == "ram" for m in measured.values()) else "no memory_plan.json"
        return ["", f"memory vs plan: none ({why})"], []
    head = (f"memory vs plan (GiB; planned on {plan.get('gpu')}, budget "
            f"{(plan.get('budget_bytes') or 0) / GIB:.2f}; measured: peak allocated per phase, reserved beside it):")
    return ["", head] + versus.table_lines(rows), rows


def _plot_memory_vs_plan(ax, rows: list[dict]) -> None:
    names = [r["phase"] for r in rows]
    xs = range(len(rows))
    planned = [(r["planned"] or 0) / GIB for r in rows]
    measured = [(r["measured"] or 0) / GIB for r in rows]
    ax.bar([x - 0.2 for x in xs], planned, width=0.4, label="planned (allocated)", color="#9ecae1")
    ax.bar([x + 0.2 for x in xs], measured, width=0.4, label="measured peak allocated", color="#08519c")
    for x, r in zip(xs, rows):
        if r["ratio"] is not None:
            ax.annotate(f"{r['ratio']:.2f}x", (x + 0.2, measured[x]), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(xs), names, rotation=20)
    ax.set_ylabel("GiB")
    ax.set_title("Memory per phase: plan vs run")
    _legend_below(ax)


REPORT_MARK = ".tinyrl-report"  # in a directory report wrote: a rerun may replace its own files there


def check_not_replacing(out: Path) -> None:
    """--out: a directory of the user's keeps its own reward.png, summary.txt, ... (report wrote
    over them); one that report wrote before (its mark) is updated, as RUN_DIR/report is."""
    if not out.is_dir() or (out / REPORT_MARK).exists():
        return
    ours = set(PLOTS) | {"timeline.png", "memory_vs_plan.png", "summary.txt"}
    taken = sorted(p.name for p in out.iterdir() if p.name in ours or (p.name.startswith("val_") and p.suffix == ".png"))
    if taken:
        raise TinyRLError(f"--out {out} already holds {', '.join(taken)}, which tinyrl report did not write; "
                          "nothing was written",
                          hint="give a new or empty directory, or leave --out out (RUN_DIR/report)")


def write_report(run_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Write the plots and summary.txt; returns the files written (summary.txt last)."""
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():  # a file of the run (metrics.parquet, say): its directory
        hint = (f"tinyrl report {run_dir.parent}" if (run_dir.parent / "metrics.jsonl").is_file()
                else "e.g. tinyrl report runs/<run name>")
        raise TinyRLError(f"{run_dir} is a file; give the run's directory", hint=hint)
    if not run_dir.is_dir():
        raise TinyRLError(f"run directory not found: {run_dir}", hint="e.g. tinyrl report runs/<run name>")
    notes: list[str] = []
    recs = load_metrics(run_dir, notes)
    live = other_holder(run_dir)  # a run under way: its figures are the latest, not final
    figures = _figure_module()  # no matplotlib: said before a directory is made
    own = run_dir / "report"
    if out_dir is not None and Path(out_dir).resolve() != own.resolve():
        check_not_replacing(Path(out_dir))
    out = make_dir(Path(out_dir) if out_dir is not None else own, example="report")
    (out / REPORT_MARK).touch()
    # Written aside and moved in together: a Ctrl-C halfway left new plots beside the last
    # report's summary.txt (or a truncated PNG); now `out` keeps the last report whole.
    with staged(out, replace=True) as stage:
        names = _write_files(run_dir, recs, notes, stage, figures, live)
    return [out / name for name in names]


def _write_files(run_dir: Path, recs: list[dict], notes: list[str], out: Path, figures: tuple,
                 live: str | None = None) -> list[str]:
    """The plots and summary.txt into `out`; their names, summary.txt last."""
    matplotlib, Figure = figures
    written, skipped = [], []
    other_kind = RL_ONLY if series(recs, "sft/loss")[0] else SFT_ONLY
    for name, (keys, draw) in PLOTS.items():
        if not any(series(recs, k)[0] for k in keys):
            if name in other_kind or name in TOOLS_ONLY:
                continue
            skipped.append(f"{name} (no {' / '.join(keys[:2])}{' ...' if len(keys) > 2 else ''} in metrics.jsonl)")
            continue
        _save(Figure, matplotlib, draw, recs, out / name, wide=name == "timings.png")
        written.append(out / name)
    for family, lines in val_families(recs).items():  # data.val_files: val/<name>/<metric>
        at = "_at_n" if family == "mean" else "_at_k" if "@" in lines[0][1] else ""
        path = out / f"val_{family}{at}.png"
        _save(Figure, matplotlib, _val_plot(family, lines), recs, path)
        written.append(path)
    timeline = run_dir / "timeline.jsonl"
    points = read_records(timeline, notes) if timeline.is_file() else []
    if any(_number(p.get("t")) is not None for p in points):
        _save(Figure, matplotlib, _plot_timeline, points, out / "timeline.png", wide=True, by_step=False)
        written.append(out / "timeline.png")
    else:
        skipped.append("timeline.png (no timeline.jsonl with points)")

    config = None
    if (run_dir / "config.json").is_file():
        try:
            config = json.loads((run_dir / "config.json").read_text())
        except json.JSONDecodeError:
            notes.append("config.json is not valid JSON; preset and model left out")
    lines = [f"tinyrl report for {run_dir}", ""] + summarize(recs, config if isinstance(config, dict) else None, run_dir,
                                                            live)
    vs_lines, vs_rows = memory_vs_plan(run_dir, points)
    lines += vs_lines
    if vs_rows:
        _save(Figure, matplotlib, _plot_memory_vs_plan, vs_rows, out / "memory_vs_plan.png", by_step=False)
        written.append(out / "memory_vs_plan.png")
    else:
        skipped.append("memory_vs_plan.png (no memory plan and no per-phase peaks)")
    lines += ["", "plots written: " + (", ".join(p.name for p in written) or "none")]
    lines += ["plots skipped: " + (", ".join(skipped) or "none")]
    lines += [f"note: {n}" for n in notes]
    summary = out / "summary.txt"
    summary.write_text("\n".join(lines) + "\n")
    return [p.name for p in written + [summary]]
