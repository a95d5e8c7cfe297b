"""What a person watches while `tinyrl train` runs: a Rich Live view, or one plain line per step.

Knows: the trainer's per-step metric keys (verl-style: `reward/mean`, `actor/pg_loss`,
`timing/<phase>`, `memory/used_bytes` ...), how to lay them out and how to colour a sample.
Does not know: how they were computed, or where they are stored (the trainer writes
RUN_DIR/metrics.jsonl; `tinyrl report` reads it).

Cost to training: `update()` only copies numbers under a lock. In live mode Rich's own refresh
thread draws at 4 frames/s, so a 10 s step pays for the drawing a few milliseconds at a time,
and elapsed/ETA/phase time keep ticking while a long rollout runs. Any key may be missing:
it shows as "–".
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections import deque
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from tinyrl.config import ADV_ESTIMATORS
from tinyrl.interrupts import stop_on_closed_stdout
from tinyrl.phases import Phase
from tinyrl.roles import needs_critic
from tinyrl.tasks import answer_patterns, task_line
from tinyrl.words import counted

# Shown in this order: the trainer's phases of one step, then the ones between steps.
PHASES = tuple(str(p) for p in Phase)
MODES = ("auto", "live", "plain", "off")
DASH = "–"
GIB = 1024**3
_SPARK = "▁▂▃▄▅▆▇█"
# Per-step tool metrics of runs whose episodes call tools (issue 28); a run without them shows
# none of these anywhere (plain line, live view, `tinyrl report`).
TOOL_METRICS = ("tools/calls", "tools/errors", "tools/timeouts", "tools/seconds", "episode/turns",
                "episode/tokenization_mismatch", "episode/text_mismatch")
COUNT = ".0f"  # counts logged as floats (metrics.jsonl holds floats): "9", not "9.0000"
MAX_TURNS_SHOWN = 6  # the sample panel's last turns; the live view crops what does not fit
# C0 controls but tab and newline, DEL, C1: an ESC would let a sample recolour or move the cursor
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_clock = time.monotonic  # module-level so tests can drive time without sleeping


def fmt(value: Any, spec: str = "") -> str:
    """A metric for display: "–" when absent, `spec` for numbers, a short general form otherwise."""
    if value is None:
        return DASH
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # "nan" / "inf": a diverging loss must stay visible, not become "–"
    if spec:
        return format(value, spec)
    if isinstance(value, int):
        return str(value)
    if value == 0:
        return "0"             # a KL of exactly 0 at step 1 read "kl 0.0 (coef 0.0010)"
    mag = abs(value)
    if mag < 1e-3:
        return f"{value:.2e}"   # KL and ppo_kl live down here; fixed point would print 0.0000
    if mag < 10:
        return f"{value:.4f}"
    if mag < 1000:
        return f"{value:.2f}"
    return f"{value:,.0f}"


def fmt_duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return DASH
    seconds = max(0, int(round(seconds)))
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}"


def fmt_gib(n: Any) -> str:
    return fmt(n / GIB, ".2f") if isinstance(n, (int, float)) and not isinstance(n, bool) else DASH


def memory_label(kind: Any) -> str:
    return {"cuda": "VRAM", "ram": "RAM"}.get(kind, "mem")


def val_files(metrics: dict) -> dict[str, dict[str, Any]]:
    """train's data.val_files figures, `val/<name>/<metric>` (Trainer._validate_files), by file:
    {name: {metric: value}}. `val/score` and `val/reward_mean` (data.test_path) name no file."""
    out: dict[str, dict[str, Any]] = {}
    for key, value in metrics.items():
        parts = key.split("/", 2)
        if len(parts) == 3 and parts[0] == "val" and parts[1] and parts[2]:
            out.setdefault(parts[1], {})[parts[2]] = value
    return out


_VAL_RANK = {"greedy_acc": 0, "pass": 1, "maj": 2, "mean": 3, "response_length": 5}


def val_metric_order(metric: str) -> tuple:
    """Sort key: greedy_acc, pass@k (k rising), maj@k, mean@n, others, response_length last."""
    family, _, k = metric.partition("@")
    return _VAL_RANK.get(family, 4), int(k) if k.isdigit() else 0, metric


def val_line(name: str, figures: dict, step: Any) -> str:
    """One plain line per validation file on the steps that validate (same order every time)."""
    parts = [f"val {name} @{fmt(step)}"]
    for metric in sorted(figures, key=val_metric_order):
        parts.append(f"{metric} {fmt(figures[metric], '.1f' if metric == 'response_length' else '.3f')}")
    return " | ".join(parts)


def sparkline(values: list[float], width: int) -> str:
    """Unicode block chart of the last `width` values, scaled to their own min..max."""
    vals = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)][-width:]
    if not vals:
        return ""
    lo, hi = min(vals), max(vals)
    if hi == lo:
        return _SPARK[3] * len(vals)  # flat: a mid-height line reads as "no change", not "zero"
    return "".join(_SPARK[min(7, int((v - lo) / (hi - lo) * 8))] for v in vals)


def safe_text(text: str) -> str:
    """Untrusted text (a completion, a tool's output) made inert on a terminal: each control
    character is shown as `\\xNN`, never sent. (Rich markup needs no escaping: samples are drawn
    as Text objects, which do not parse it.)"""
    return _CONTROL.sub(lambda c: f"\\x{ord(c.group()):02x}", text)


def tail(text: str, chars: int, lines: int | None = None) -> str:
    """The end of `text`, at most `chars` characters and `lines` lines; "…" marks a cut."""
    cut = text[-chars:] if len(text) > chars else text
    if lines is not None and cut.count("\n") >= lines:
        cut = cut.split("\n")[-lines:]
        cut = "\n".join(cut)
    return cut if cut == text else "…" + cut


def tool_metrics_seen(m: dict) -> bool:
    return any(k in m for k in TOOL_METRICS)


def reward_style(reward: Any) -> str:
    """green: solved (>= 1); yellow: format-only partial credit (0 < r < 1); red: nothing."""
    if not isinstance(reward, (int, float)) or not math.isfinite(reward):
        return "cyan"
    return "green" if reward >= 1 else "yellow" if reward > 0 else "red"


def highlight_completion(text: str, reward: Any) -> Text:
    """The completion with <think> tags and the <answer>...</answer> span styled by reward."""
    out = Text(safe_text(text))  # Text, not markup: completions are full of [brackets]
    out.highlight_regex(r"</?think>", "bold magenta")
    out.highlight_regex(answer_patterns(), f"bold {reward_style(reward)}")  # each task's answer span
    return out


def task_of(prompt: str) -> str:
    """Prompts are mostly boilerplate: the task knows the line that differs per sample."""
    return safe_text(task_line(prompt))


def sample_turns(sample: dict) -> tuple[list[dict], list[dict]]:
    """(turns, tool calls) of a samples.jsonl record (tinyrl.rollout.transcript); none in a
    record written before episodes had turns."""
    turns = [t for t in sample.get("turns") or [] if isinstance(t, dict)]
    calls = [c for c in sample.get("tool_calls") or [] if isinstance(c, dict)]
    return turns, calls


def episode_view(turns: list[dict], calls: list[dict], reward: Any, width: int) -> list:
    """The conversation after the prompt, its last MAX_TURNS_SHOWN turns: the policy's turns as
    text (answer highlighted as in a single-turn sample), each inserted turn (a tool's reply) in
    a box of its own titled with its role and the calls it answers (name, status, seconds), red
    when one of them did not end "ok". Each turn keeps its tail: the live view crops the bottom."""
    out: list = []
    first = max(0, len(turns) - MAX_TURNS_SHOWN)
    if first:
        out.append(Text(f"… {counted(first, 'earlier turn')}", style="dim"))
    for i in range(first, len(turns)):
        role, text = str(turns[i].get("role", "?")), str(turns[i].get("text", "")).strip()
        if role == "assistant":  # the last one holds the answer: as much room as a single-turn sample
            last = i == len(turns) - 1
            said = highlight_completion(tail(text, max(200, width * (5 if last else 3)), 8 if last else 4), reward)
            out.append(Text.assemble(("assistant ▸ ", "bold cyan"), said))
            replied = i + 1 < len(turns) and turns[i + 1].get("role") != "assistant"
            if not replied:  # calls that ran but whose reply did not fit the budget: no box says them
                out += [_unanswered_call(c) for c in calls if c.get("turn") == i]
            continue
        # a tool turn answers the calls of the assistant turn before it (ToolCall.turn)
        made = [c for c in calls if c.get("turn") == i - 1]
        label = Text(role, style="bold")  # roles are tinyrl's own (Turn.role)
        for c in made:
            label.append(f" · {safe_text(str(c.get('name') or '?'))} {safe_text(str(c.get('status')))} "
                         f"{fmt(c.get('seconds'), '.2f')}s")
        failed = any(c.get("status") != "ok" for c in made)
        out.append(Panel(Text(safe_text(tail(text, max(120, width * 3), 6))), title=label, title_align="left",
                         border_style="red" if failed else "bright_black", padding=(0, 1)))
    return out


def _unanswered_call(call: dict) -> Text:
    """One line for a call whose tool turn was not appended (the budget ended the episode): its
    name, status and seconds, and for one that failed its message (ToolCall.message)."""
    ok = call.get("status") == "ok"
    line = Text(f"  ↳ {safe_text(str(call.get('name') or '?'))} {safe_text(str(call.get('status')))} "
                f"{fmt(call.get('seconds'), '.2f')}s, no reply: it did not fit the token budget",
                style="dim" if ok else "red")
    if not ok and call.get("message"):
        line.append(f" · {safe_text(str(call['message']))}")
    return line


def plain_line(m: dict, total_steps: Any, val: Any, critic: bool, tools: bool = False, val_loss: Any = None) -> str:
    """One stable, greppable line per step (same fields in the same order every step).
    `val`, `val_loss`: the last validation's score and (SFT) loss.
    `tools`: the run's episodes call tools (a TOOL_METRICS key was seen), so the tool fields
    are on every line from then on."""
    kind = m.get("memory/kind")
    if "sft/loss" in m:
        return sft_line(m, total_steps, val_loss, val)
    parts = [
        f"step {fmt(m.get('step'))}/{fmt(total_steps)}",
        f"epoch {fmt(m.get('epoch'))}",
        f"reward {fmt(m.get('reward/mean'), '.3f')} "
        f"[{fmt(m.get('reward/min'), '.3f')}, {fmt(m.get('reward/max'), '.3f')}]",
        f"kl {fmt(m.get('kl/mean'))} (coef {fmt(m.get('kl/coef'))})",
        f"len {fmt(m.get('response_length/mean'), '.1f')} (max {fmt(m.get('response_length/max'), '.0f')})",
        f"pg_loss {fmt(m.get('actor/pg_loss'))}",
        f"pg_clip {fmt(m.get('actor/pg_clipfrac'), '.3f')}",
        f"entropy {fmt(m.get('actor/entropy'), '.3f')}",
    ]
    if critic:  # the explained variance is how a PPO run shows its critic learning (README's PPO demo)
        parts += [f"vf_loss {fmt(m.get('critic/vf_loss'))}", f"ev {fmt(m.get('critic/explained_var'), '+.3f')}"]
    if tools:
        parts += tool_fields(m)
    parts += [
        f"val {fmt(val, '.3f')}",
        f"{fmt(m.get('timing/step'), '.2f')}s",
        f"{fmt(m.get('perf/tokens_per_s'), ',.0f')} tok/s",
        f"{memory_label(kind)} {fmt_gib(m.get('memory/used_bytes'))}/{fmt_gib(m.get('memory/total_bytes'))} GiB",
    ]
    return " | ".join(parts)


def tool_fields(m: dict) -> list[str]:
    """The plain line's tool fields, TOOL_METRICS in order."""
    return [f"tools {fmt(m.get('tools/calls'), COUNT)} (errors {fmt(m.get('tools/errors'), COUNT)}, "
            f"timeouts {fmt(m.get('tools/timeouts'), COUNT)}, {fmt(m.get('tools/seconds'), '.2f')}s)",
            f"turns {fmt(m.get('episode/turns'), '.2f')}",
            f"tok_mismatch {mismatch_label(m)}"]


def mismatch_label(m: dict) -> str:
    """Episodes unlike a re-render of their conversation, and how many of them in text too (the
    ones that are a fault: Episode.rerender): "3 (text 0)"."""
    return f"{fmt(m.get('episode/tokenization_mismatch'), COUNT)} (text {fmt(m.get('episode/text_mismatch'), COUNT)})"


def sft_line(m: dict, total_steps: Any, val_loss: Any, val_score: Any = None) -> str:
    """`tinyrl sft`'s line: losses instead of rewards, no rollout. The validation fields appear
    once there is a figure (an SFT run validates every trainer.test_every steps, the demo only
    at its end: 299 lines of `val loss – | val score –` said nothing), and hold until the next."""
    kind = m.get("memory/kind")
    val = ([f"val loss {fmt(val_loss, '.4f')}"] if val_loss is not None else []) + \
        ([f"val score {fmt(val_score, '.3f')}"] if val_score is not None else [])
    return " | ".join([
        f"step {fmt(m.get('step'))}/{fmt(total_steps)}", f"epoch {fmt(m.get('epoch'))}",
        f"loss {fmt(m.get('sft/loss'), '.4f')}", *val,
        f"lr {fmt(m.get('sft/lr'), '.2e')}", f"grad_norm {fmt(m.get('sft/grad_norm'))}",
        f"{fmt(m.get('timing/step'), '.2f')}s", f"{fmt(m.get('perf/tokens_per_s'), ',.0f')} tok/s",
        f"{memory_label(kind)} {fmt_gib(m.get('memory/used_bytes'))}/{fmt_gib(m.get('memory/total_bytes'))} GiB",
    ])


class Dashboard:
    """Live Rich view (terminal) or plain lines (pipes, CI); the trainer's only output channel.

    mode: "auto" (live on a terminal, plain otherwise), "live", "plain", "off" (silent).
    """

    def __init__(self, run_info: dict, mode: str = "auto", console: Console | None = None):
        if mode not in MODES:
            from tinyrl.errors import TinyRLError

            raise TinyRLError(f"unknown dashboard mode {mode!r}", hint=f"use one of: {', '.join(MODES)}")
        self.info = dict(run_info)
        self.console = console or stop_on_closed_stdout(Console())
        if mode == "auto":
            terminal = self.console.is_terminal and not self.console.is_dumb_terminal
            mode = "live" if terminal else "plain"
        self.mode = mode
        algo = str(self.info.get("algorithm", "")).lower()
        # Estimators that train no value model never report critic/* keys.
        self._critic_expected = needs_critic(algo) if algo in ADV_ESTIMATORS else algo != "sft"
        self._sft = algo == "sft"  # its panels from the first frame, before any step has logged sft/loss
        self._tools_seen = False  # set by the first step with a TOOL_METRICS key; never unset
        self._lock = threading.Lock()
        self._start = _clock()
        self._metrics: dict = {}
        self._sample: dict | None = None
        self._val: tuple[Any, Any] = (None, None)          # (score, step) of the last validation
        self._val_loss: tuple[Any, Any] = (None, None)     # (loss, step): `tinyrl sft`'s
        self._val_files: dict[str, tuple[dict, Any]] = {}  # data.val_files: name -> (figures, step)
        self._probs_diff: tuple[Any, Any] = (None, None)   # (value, step): reported only sometimes
        self._rewards: deque = deque(maxlen=240)
        self._step_time_sum, self._step_count = 0.0, 0
        self._last_update = self._start
        self._phase, self._phase_start = "starting", self._start
        self._live: Live | None = None

    # -- the trainer's side --------------------------------------------------------------

    def __enter__(self) -> "Dashboard":
        self._start = self._last_update = self._phase_start = _clock()
        if self.mode == "live":
            self._live = Live(get_renderable=self.render, console=self.console, auto_refresh=True,
                              refresh_per_second=4, transient=False, vertical_overflow="crop")
            self._live.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.stop()  # draws one last frame with the final numbers, and leaves it on screen
            self._live = None

    def set_phase(self, name: str) -> None:
        with self._lock:
            self._phase, self._phase_start = name, _clock()

    def update(self, metrics: dict, sample: dict | None = None) -> None:
        now = _clock()
        with self._lock:
            self._metrics = dict(metrics)
            if sample is not None:
                self._sample = dict(sample)
            step = metrics.get("step")
            by_file = self._take_validation(metrics)
            if metrics.get("training/rollout_probs_diff") is not None:
                self._probs_diff = (metrics["training/rollout_probs_diff"], step)
            if any(k.startswith("critic/") for k in metrics):
                self._critic_expected = True
            self._tools_seen = self._tools_seen or tool_metrics_seen(metrics)
            self._rewards.append(metrics.get("reward/mean", metrics.get("sft/loss")))
            # The trainer's own step time excludes dashboard and logging; wall time is the fallback.
            took = metrics.get("timing/step")
            if not isinstance(took, (int, float)) or not math.isfinite(took):
                took = now - self._last_update
            self._step_time_sum += took
            self._step_count += 1
            self._last_update = now
            line = plain_line(self._metrics, self.info.get("total_steps"), self._val[0], self._critic_expected,
                              self._tools_seen, self._val_loss[0]) if self.mode == "plain" else None
        if line is not None:
            self._print_plain(line)
            for name, figures in by_file.items():
                self._print_plain(val_line(name, figures, step))

    def validated(self, metrics: dict) -> None:
        """A validation that is not a step: trainer.val_before_train's step 0, or the last one a
        resumed run logged before (tinyrl.cli). `val` shows it until the next one, where it
        said "–" for the whole run (the demo validates at step 0 and at its last step only)."""
        with self._lock:
            self._take_validation(metrics)

    def _take_validation(self, metrics: dict) -> dict[str, dict[str, Any]]:
        """Keeps the validation figures in `metrics` (held until the next ones; the caller holds
        the lock); returns data.val_files' figures by file."""
        step = metrics.get("step")
        if metrics.get("val/score") is not None:
            self._val = (metrics["val/score"], step)
        by_file = val_files(metrics)
        for name, figures in by_file.items():
            self._val_files[name] = (figures, step)
        if metrics.get("val/loss") is not None:  # `tinyrl sft`
            self._val_loss = (metrics["val/loss"], step)
        return by_file

    def log(self, message: str) -> None:
        if self.mode == "off":
            return
        if self.mode == "plain":
            self._print_plain(f"note | {message}")
            return
        stamp = fmt_duration(_clock() - self._start)
        self.console.print(Text(f"[{stamp}] {message}", style="dim"))  # Live prints it above the view

    def _print_plain(self, line: str) -> None:
        # soft_wrap: one step stays one line at any width, so `grep`/`tail -f` see whole records.
        self.console.print(line, markup=False, highlight=False, soft_wrap=True)
        self.console.file.flush()  # `| tee` block-buffers stdout; a step should show up when done

    # -- rendering (Rich's refresh thread) -----------------------------------------------

    def _snapshot(self) -> dict:
        with self._lock:
            return {
                "m": dict(self._metrics), "sample": self._sample, "val": self._val, "val_loss": self._val_loss,
                "val_files": dict(self._val_files),
                "probs_diff": self._probs_diff, "rewards": list(self._rewards),
                "mean_step": self._step_time_sum / self._step_count if self._step_count else None,
                "last_update": self._last_update, "phase": self._phase,
                "phase_start": self._phase_start, "critic": self._critic_expected,
                "tools": self._tools_seen,
            }

    def eta_seconds(self, snap: dict, now: float) -> float | None:
        """Remaining steps x mean step time, less the part of the current step already run."""
        total, step = self.info.get("total_steps"), snap["m"].get("step")
        if snap["mean_step"] is None or not isinstance(total, int) or not isinstance(step, int):
            return None
        remaining = max(0, total - step)
        if remaining == 0:
            return 0.0
        return max(0.0, remaining * snap["mean_step"] - (now - snap["last_update"]))

    def render(self) -> Group:
        """One frame of the live view (Rich's refresh thread calls this 4 times a second)."""
        snap, now = self._snapshot(), _clock()
        width = self.console.width
        top = Table.grid(expand=True, padding=(0, 1))
        for _ in range(3):
            top.add_column(ratio=1)
        sft = self._sft or "sft/loss" in snap["m"]
        top.add_row(self._sft_panel(snap, width) if sft else self._reward_panel(snap, width),
                    self._sft_optimizer_panel(snap) if sft else self._policy_panel(snap),
                    self._memory_panel(snap, lengths=not sft))
        bottom = Table.grid(expand=True, padding=(0, 1))
        bottom.add_column(ratio=2)
        # A run without a critic (SFT, GRPO and the other critic-free estimators: tinyrl.roles)
        # shows no critic panel; its timings take the row.
        panels = [self._timing_panel(snap)] + ([self._critic_panel(snap)] if snap["critic"] else []) + \
            ([self._tools_panel(snap)] if snap["tools"] else [])
        for _ in panels[1:]:
            bottom.add_column(ratio=1)
        bottom.add_row(*panels)
        val = [self._val_files_panel(snap)] if snap["val_files"] else []
        # SFT samples nothing: its sample panel said "waiting for the first step" to the end
        sample = [] if sft else [self._sample_panel(snap, width)]
        return Group(self._header(snap, now), top, bottom, *val, *sample)

    def _header(self, snap: dict, now: float) -> Panel:
        i, m = self.info, snap["m"]
        total, step = i.get("total_steps"), m.get("step")
        title = Text.assemble(("tinyrl ", "bold"), (f"{i.get('preset', DASH)}", "bold cyan"),
                              f" · {i.get('model', DASH)} · {i.get('algorithm', DASH)}"
                              f" · engine {i.get('engine', DASH)} · {i.get('device', DASH)}")
        done = step if isinstance(step, int) else 0
        bar = ProgressBar(total=total if isinstance(total, int) and total > 0 else None,
                          completed=done, width=24)
        progress = Table.grid(padding=(0, 1))
        progress.add_row(bar, f"step {fmt(step)}/{fmt(total)} · epoch {fmt(m.get('epoch'))}"
                              f" ({fmt(i.get('steps_per_epoch'))} steps/epoch)")
        clock = Text.assemble(
            f"elapsed {fmt_duration(now - self._start)} · ETA {fmt_duration(self.eta_seconds(snap, now))}"
            " · phase ", (snap["phase"], "bold yellow"), f" {now - snap['phase_start']:.1f}s")
        return Panel(Group(title, progress, clock), subtitle=str(i.get("run_dir", "")),
                     subtitle_align="right", border_style="blue")

    @staticmethod
    def _kv(rows: list[tuple[str, str]]) -> Table:
        t = Table.grid(padding=(0, 1))
        t.add_column(style="dim", no_wrap=True)
        t.add_column(justify="right", no_wrap=True)
        for k, v in rows:
            t.add_row(k, v)
        return t

    def _reward_panel(self, snap: dict, width: int) -> Panel:
        m, (val, val_step) = snap["m"], snap["val"]
        mean = m.get("reward/mean")
        rows = self._kv([
            ("mean", fmt(mean, ".3f")), ("min", fmt(m.get("reward/min"), ".3f")),
            ("max", fmt(m.get("reward/max"), ".3f")),
            ("val score", fmt(val, ".3f") + (f" @{val_step}" if val_step is not None else "")),
        ])
        spark = Text(sparkline(snap["rewards"], max(8, width // 3 - 6)), style=reward_style(mean))
        return Panel(Group(rows, spark), title="reward", border_style="green")

    def _sft_panel(self, snap: dict, width: int) -> Panel:
        m, (loss, loss_step), (score, score_step) = snap["m"], snap["val_loss"], snap["val"]
        rows = self._kv([("loss", fmt(m.get("sft/loss"), ".4f")),
                         ("val loss", fmt(loss, ".4f") + (f" @{loss_step}" if loss_step is not None else "")),
                         ("val score", fmt(score, ".3f") + (f" @{score_step}" if score_step is not None else "")),
                         ("tokens", fmt(m.get("sft/loss_tokens"), ",.0f"))])
        spark = Text(sparkline(snap["rewards"], max(8, width // 3 - 6)), style="green")  # the losses
        return Panel(Group(rows, spark), title="sft loss", border_style="green")

    def _sft_optimizer_panel(self, snap: dict) -> Panel:
        m = snap["m"]
        return Panel(self._kv([("lr", fmt(m.get("sft/lr"), ".2e")), ("grad_norm", fmt(m.get("sft/grad_norm"))),
                               ("skipped", fmt(m.get("sft/skipped_steps"), ".0f"))]),
                     title="optimizer", border_style="magenta")

    def _policy_panel(self, snap: dict) -> Panel:
        m, (diff, diff_step) = snap["m"], snap["probs_diff"]
        return Panel(self._kv([
            ("kl", fmt(m.get("kl/mean"))), ("kl coef", fmt(m.get("kl/coef"))),
            ("ppo_kl", fmt(m.get("actor/ppo_kl"))), ("pg_loss", fmt(m.get("actor/pg_loss"))),
            ("clipfrac", fmt(m.get("actor/pg_clipfrac"), ".3f")),
            ("entropy", fmt(m.get("actor/entropy"), ".3f")),
            ("grad_norm", fmt(m.get("actor/grad_norm"))),
            ("rollout Δp", fmt(diff) + (f" @{diff_step}" if diff_step is not None else "")),
        ]), title="KL · policy", border_style="magenta")

    def _memory_panel(self, snap: dict, lengths: bool = True) -> Panel:
        """`lengths`: the rollout's response lengths too (an SFT run has no rollout)."""
        m = snap["m"]
        label = memory_label(m.get("memory/kind"))
        used, total = m.get("memory/used_bytes"), m.get("memory/total_bytes")
        clip = m.get("response_length/clip_ratio")
        ok = isinstance(used, (int, float)) and isinstance(total, (int, float)) and total > 0
        rows = self._kv([
            (f"{label} used", f"{fmt_gib(used)} GiB"), (f"{label} peak", f"{fmt_gib(m.get('memory/peak_bytes'))} GiB"),
            (f"{label} total", f"{fmt_gib(total)} GiB"),
        ] + ([
            ("len mean", fmt(m.get("response_length/mean"), ".1f")),
            ("len max", fmt(m.get("response_length/max"), ".0f")),
            ("clipped", fmt(clip * 100, ".1f") + "%" if isinstance(clip, (int, float)) else DASH),
        ] if lengths else []))
        rows.add_row(f"{label} use", ProgressBar(total=total if ok else None, completed=used if ok else 0, width=12))
        for phase, planned in self._planned_phases():
            measured = m.get(f"memory/phase/{phase}_peak_bytes")
            rows.add_row(phase.replace("_update", " upd"), f"{fmt_gib(measured)}/{fmt_gib(planned)} GiB plan")
        title = "memory (process RAM)" if label == "RAM" else "memory"
        return Panel(rows, title=f"{title} · length" if lengths else title, border_style="cyan")

    def _planned_phases(self) -> list[tuple[str, int]]:
        """(phase, planned peak allocated bytes) from run_info["memory_plan"] (a CUDA run's
        RUN_DIR/memory_plan.json, tinyrl.memory.versus); none on the CPU."""
        plan = self.info.get("memory_plan") or {}
        phases = plan.get("phases") if isinstance(plan, dict) else None
        if not isinstance(phases, dict):
            return []
        return [(name, ph.get("planned_allocated_bytes")) for name, ph in phases.items() if isinstance(ph, dict)]

    def _timing_panel(self, snap: dict) -> Panel:
        m = snap["m"]
        shown = [p for p in PHASES if m.get(f"timing/{p}") is not None]
        t = Table.grid(padding=(0, 1))
        for _ in range(2):
            t.add_column(no_wrap=True)
            t.add_column(justify="right", no_wrap=True)
        cells = [(Text(p, style="bold yellow" if p == snap["phase"] else "dim"),
                  fmt(m.get(f"timing/{p}"), ".2f") + "s") for p in shown]
        half = (len(cells) + 1) // 2  # two columns keep ten phases to five lines
        for left, right in zip(cells[:half], cells[half:] + [("", "")]):
            t.add_row(*left, *right)
        footer = Text.assemble(("step ", "dim"), (fmt(m.get("timing/step"), ".2f") + "s", "bold"),
                               ("  ·  ", "dim"), (fmt(m.get("perf/tokens_per_s"), ",.0f"), "bold"),
                               (" tokens/s", "dim"))
        return Panel(Group(t, footer), title="timings", border_style="yellow")

    def _critic_panel(self, snap: dict) -> Panel:
        m = snap["m"]
        return Panel(self._kv([
            ("vf_loss", fmt(m.get("critic/vf_loss"))),
            ("vf_clipfrac", fmt(m.get("critic/vf_clipfrac"), ".3f")),
            ("explained var", fmt(m.get("critic/explained_var"), ".3f")),
        ]), title="critic", border_style="blue")

    def _tools_panel(self, snap: dict) -> Panel:
        m = snap["m"]
        return Panel(self._kv([
            ("calls", fmt(m.get("tools/calls"), COUNT)), ("errors", fmt(m.get("tools/errors"), COUNT)),
            ("timeouts", fmt(m.get("tools/timeouts"), COUNT)), ("seconds", fmt(m.get("tools/seconds"), ".2f")),
            ("model turns/ep", fmt(m.get("episode/turns"), ".2f")),
            ("tok mismatch", mismatch_label(m)),
        ]), title="tools", border_style="bright_blue")

    def _val_files_panel(self, snap: dict) -> Panel:
        """One row per data.val_files file: its latest figures and the step they are from."""
        files = snap["val_files"]
        metrics = sorted({k for figures, _ in files.values() for k in figures}, key=val_metric_order)
        t = Table(box=None, padding=(0, 1), show_edge=False, header_style="dim")
        t.add_column("file", no_wrap=True)
        t.add_column("step", justify="right", no_wrap=True)
        for metric in metrics:
            t.add_column("greedy" if metric == "greedy_acc" else "len" if metric == "response_length" else metric,
                         justify="right", no_wrap=True)
        for name, (figures, step) in files.items():
            t.add_row(name, f"@{fmt(step)}", *(fmt(figures.get(k), ".1f" if k == "response_length" else ".3f")
                                               for k in metrics))
        return Panel(t, title="validation files", border_style="green")

    def _sample_panel(self, snap: dict, width: int) -> Panel:
        s = snap["sample"]
        if not s:
            return Panel(Text("waiting for the first step", style="dim"), title="latest sample")
        reward = s.get("reward")
        task = Text(task_of(str(s.get("prompt", ""))), style="dim", no_wrap=True, overflow="ellipsis")
        title = f"latest sample · step {fmt(s.get('step'))} · reward {fmt(reward, '.2f')}"
        turns, calls = sample_turns(s)
        if len(turns) > 1 or calls:
            # the model's turns, as episode/turns counts them (the tools panel's turns/episode): it
            # said "3 turns" of 2 model turns and a tool reply beside a turns/episode of 1.58
            said = sum(t.get("role") == "assistant" for t in turns)
            title += f" · {counted(said, 'model turn')} · {counted(len(calls), 'tool call')}"
            if s.get("stop_reason") not in (None, "stop"):
                title += f" · stopped: {safe_text(str(s['stop_reason']))}"
            body = Group(task, *episode_view(turns, calls, reward, width))
        else:
            # The answer is at the end: keep the tail, about five lines' worth at this width.
            body = Group(task, highlight_completion(tail(str(s.get("completion", "")), max(200, width * 5)), reward))
        return Panel(body, title=Text(title), border_style=reward_style(reward))
