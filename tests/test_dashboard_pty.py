"""The dashboard in a real terminal: a pty made by tmux, read back with `capture-pane`.

Each test starts its own tmux server on a private socket (`-S`, `-f` a two-line config), so it
never touches anyone's sessions, and `remain-on-exit` keeps the pane readable after the command
exits. Needs the `tmux` binary (apt-get install -y tmux).
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# Rich reads these; a CI runner's values must not leak into the pane's size or colour choice.
END_MARK = "TMUX-COMMAND-ENDED"  # printed by the pane's shell after the command (Tmux.wait_exit)
RICH_ENV = ("COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "JUPYTER_COLUMNS")

FEED = textwrap.dedent('''
    """Feeds the dashboard three realistic steps, the way the trainer will."""
    from tinyrl.dashboard import Dashboard

    GIB = 1024 ** 3
    info = dict(preset="countdown-tiny", model="tinyrl/tiny-qwen2", algorithm="gae", engine="hf",
                total_steps=40, steps_per_epoch=20, run_dir="runs/countdown-tiny", device="cpu")
    with Dashboard(info) as dash:  # mode "auto": must find the tmux pty is a terminal
        dash.log("vLLM sleep mode unsupported on CPU")
        for step in (1, 2, 3):
            for phase in ("rollout", "reward", "actor_update"):
                dash.set_phase(phase)
            dash.update({
                "step": step, "epoch": 1, "reward/mean": 0.0417 * step, "reward/min": 0.0,
                "reward/max": 1.0, "kl/mean": 0.0012, "kl/coef": 0.001, "actor/pg_loss": -0.0123,
                "actor/pg_clipfrac": 0.031, "actor/entropy": 1.234, "critic/vf_loss": 0.456,
                "response_length/mean": 31.2, "response_length/max": 64,
                "timing/rollout": 1.25, "timing/actor_update": 0.5, "timing/step": 1.9,
                "perf/tokens_per_s": 512.0, "memory/used_bytes": int(1.2 * GIB),
                "memory/peak_bytes": int(1.4 * GIB), "memory/total_bytes": int(15.6 * GIB),
                "memory/kind": "ram", **({"val/score": 0.05} if step == 2 else {}),
            }, {"prompt": "User: Using the numbers [44, 19, 35], create an equation that equals 98.",
                "completion": " 44+35=79, 79+19=98</think>\\n<answer> 44 + 35 + 19 </answer>",
                "reward": 1.0, "step": step})
    print(f"FEED-DONE mode={dash.mode}")
''')


def clean_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in RICH_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


class Tmux:
    """One private tmux server holding one 120x50 pane that runs `command`."""

    def __init__(self, tmp: Path, command: str, width: int = 120, height: int = 50):
        conf = tmp / "tmux.conf"
        conf.write_text("set -g remain-on-exit on\nset -g history-limit 5000\n")
        self.base = ["tmux", "-S", str(tmp / "tmux.sock"), "-f", str(conf)]
        # The shell records the exit status itself: tmux's #{pane_dead_status} was seen to stay
        # empty after the command ended, now and then, here (tmux 3.3a).
        # The status file says the command ended, not that the tmux server has read its last
        # bytes from the pty (another process; on a loaded machine it may run later), so the shell
        # also prints END_MARK after the command: once the pane shows it, everything the command
        # wrote before it is on screen too (a pty delivers bytes in order).
        self.status_file = tmp / "exit_status"
        status = shlex.quote(str(self.status_file))
        wrapped = f"{command}; s=$?; echo; echo {END_MARK}; echo $s > {status}.part; mv {status}.part {status}"
        subprocess.run(self.base + ["new-session", "-d", "-s", "t", "-x", str(width), "-y", str(height),
                                    "sh -c " + shlex.quote(wrapped)], check=True, env=clean_env(), cwd=REPO)

    def tmux(self, *args: str) -> str:
        return subprocess.run(self.base + list(args), check=True, capture_output=True, text=True).stdout

    def wait_exit(self, limit_s: float) -> int:
        """The command's exit status. `limit_s` only stops a hung command from hanging the suite."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            # status: written whole by `mv`, never half; END_MARK on screen: the pane is complete
            if self.status_file.exists() and END_MARK in self.capture():
                return int(self.status_file.read_text())
            time.sleep(0.2)
        raise AssertionError(f"still running after {limit_s:.0f}s; the pane shows:\n{self.capture()}")

    def capture(self, escapes: bool = False) -> str:
        return self.tmux("capture-pane", "-p", "-t", "t", "-S", "-", *(["-e"] if escapes else []))

    def close(self) -> None:
        subprocess.run(self.base + ["kill-server"], capture_output=True)


@pytest.fixture
def tmux_run(tmp_path):
    if shutil.which("tmux") is None:
        # CI (.ci/run) installs tmux, so there a missing tmux is a broken CI, never a pass; a
        # developer's machine (a GPU box, say) may lack it and still run the rest of the suite.
        message = "tmux is not installed (apt-get install -y tmux): the dashboard's real-terminal test needs it"
        if os.environ.get("CI"):
            pytest.fail(message + "; CI is set, and .ci/run installs it")
        pytest.skip(message)
    started = []

    def start(command: str) -> Tmux:
        started.append(Tmux(tmp_path, command))
        return started[-1]

    yield start
    for t in started:
        t.close()


def fed_pane(tmp_path: Path, tmux_run, feed: str) -> Tmux:
    """A pane that ran the script `feed` to its end (exit status 0)."""
    script = tmp_path / "feed.py"
    script.write_text(feed)
    pane = tmux_run(f"{sys.executable} {script}")
    assert pane.wait_exit(limit_s=600) == 0, pane.capture()  # a hang guard: ~5 s when quiet
    return pane


def test_fed_dashboard_in_a_real_pty_shows_the_panels_with_real_values(tmp_path, tmux_run):
    pane = fed_pane(tmp_path, tmux_run, FEED)
    text = pane.capture()
    assert "FEED-DONE mode=live" in text  # "auto" took the pty for a terminal
    for title in ("tinyrl countdown-tiny", "reward", "KL · policy", "memory (process RAM)", "timings",
                  "critic", "latest sample · step 3 · reward 1.00"):
        assert title in text, title
    assert "step 3/40 · epoch 1 (20 steps/epoch)" in text
    assert re.search(r"mean\s+0\.125", text) and re.search(r"val score\s+0\.050 @2", text)
    assert re.search(r"RAM used\s+1\.20 GiB", text) and re.search(r"kl\s+0\.0012", text)
    assert re.search(r"vf_loss\s+0\.4560", text) and re.search(r"rollout\s+1\.25s", text)
    assert "<answer> 44 + 35 + 19 </answer>" in text
    # The notice went above the view, and the view was redrawn in place: one frame in the
    # scrollback, where a non-terminal console would have stacked a copy per refresh.
    assert text.index("vLLM sleep mode unsupported on CPU") < text.index("step 3/40")
    assert text.count("latest sample ·") == 1
    # reward 1.0: the answer is drawn green (SGR 32), the think tag magenta (35)
    coloured = pane.capture(escapes=True)
    assert re.search(r"\x1b\[[0-9;]*\b32m(\x1b\[[0-9;]*m)*<answer>", coloured)
    assert re.search(r"\x1b\[[0-9;]*\b35m(\x1b\[[0-9;]*m)*</think>", coloured)


def test_same_feed_through_a_pipe_prints_plain_lines(tmp_path):
    script = tmp_path / "feed.py"
    script.write_text(FEED)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=clean_env(),
                          cwd=REPO, timeout=600)  # a hang guard: ~5 s when quiet
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "note | vLLM sleep mode unsupported on CPU"
    assert [line.split(" | ")[0] for line in lines[1:4]] == ["step 1/40", "step 2/40", "step 3/40"]
    assert "| reward 0.125 [0.000, 1.000] |" in lines[3] and "| val 0.050 |" in lines[3]
    assert lines[4] == "FEED-DONE mode=plain"
    assert "\x1b[" not in proc.stdout  # no escape codes in a log file


FEED_TOOLS = textwrap.dedent('''
    """A tool run's step: a three-turn episode whose tool output tries to clear the screen,
    move the cursor, recolour the rest and set the window title; tool metrics."""
    from tinyrl.dashboard import Dashboard

    info = dict(preset="countdown-tools-demo", model="tiny", algorithm="grpo", engine="hf", total_steps=40)
    call = '<tool_call>\\n{"name": "code_interpreter", "arguments": {"code": "print(44 + 35 + 19)"}}\\n</tool_call>'
    hostile = "98\\n\\x1b[2J\\x1b[H\\x1b[31mRED [bold]x[/bold] [/nope]\\x1b]0;owned\\x07"
    with Dashboard(info) as dash:
        dash.log("before the step")
        dash.update({"step": 1, "reward/mean": 1.0, "tools/calls": 8, "tools/errors": 1, "tools/timeouts": 0,
                     "tools/seconds": 0.5, "episode/turns": 2.25, "episode/tokenization_mismatch": 0},
                    {"prompt": "User: Using the numbers [44, 19, 35], create an equation that equals 98.",
                     "completion": "", "reward": 1.0, "step": 1, "stop_reason": "stop",
                     "turns": [{"role": "assistant", "text": "Let me add them.\\n" + call, "tokens": 40},
                               {"role": "tool", "text": hostile, "tokens": 30},
                               {"role": "assistant", "text": "</think>\\n<answer> 44 + 35 + 19 </answer>", "tokens": 12}],
                     "tool_calls": [{"name": "code_interpreter", "status": "ok", "seconds": 0.25, "turn": 0}]})
    print("FEED-DONE")
''')


def test_a_tool_episode_in_a_real_pty_is_a_conversation_and_its_hostile_output_stays_inert(tmp_path, tmux_run):
    pane = fed_pane(tmp_path, tmux_run, FEED_TOOLS)
    text = pane.capture()
    lines = text.splitlines()
    # nothing was cleared or overwritten: the notice is still above the one frame
    assert text.index("before the step") < text.index("latest sample ·") and text.count("latest sample ·") == 1
    assert "latest sample · step 1 · reward 1.00 · 2 model turns · 1 tool call" in text
    # the tool's reply in its own box, its escapes shown as text, in order between the two assistant turns
    assert any("╭─ tool · code_interpreter ok 0.25s" in x for x in lines)
    box = next(i for i, x in enumerate(lines) if "╭─ tool ·" in x)
    assert lines[box + 1].startswith("│ │ 98") and lines[box - 1].startswith("│ </tool_call>")
    assert "│ │ \\x1b[2J\\x1b[H\\x1b[31mRED [bold]x[/bold] [/nope]\\x1b]0;owned\\x07" in lines[box + 2]
    assert lines[box + 4].startswith("│ assistant ▸ </think>") and "<answer> 44 + 35 + 19 </answer>" in text
    assert re.search(r"calls\s+8\b", text) and re.search(r"model turns/ep\s+2\.25", text)
    # the answer after the reply is still drawn green (SGR 32): the reply's "red" reached no one
    assert re.search(r"\x1b\[[0-9;]*\b32m(\x1b\[[0-9;]*m)*<answer>", pane.capture(escapes=True))
    assert pane.tmux("display-message", "-p", "-t", "t", "#{pane_title}").strip() != "owned"


@pytest.mark.slow
def test_train_in_tmux_shows_panels(tmp_path, tmux_run, countdown_train):
    run_dir = tmp_path / "run"
    pane = tmux_run(f"{sys.executable} -m tinyrl.cli train --preset countdown-tiny --max-steps 2 --out {run_dir} "
                    f"--set data.train_path={countdown_train(256)} --set trainer.device=cpu")
    status = pane.wait_exit(limit_s=1500)
    text = pane.capture()
    assert status == 0, text
    for title in ("tinyrl countdown-tiny", "reward", "KL · policy", "memory", "timings", "latest sample"):
        assert title in text, title
    assert re.search(r"step 2/\d+", text)
    assert re.search(r"mean\s+\d\.\d{3}", text)            # a real reward, not "–"
    assert re.search(r"(RAM|VRAM) used\s+\d+\.\d\d GiB", text)
    assert re.search(r"rollout\s+\d+\.\d\ds", text)
    assert text.count("latest sample ·") == 1
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == 2
    report = subprocess.run([sys.executable, "-m", "tinyrl.cli", "report", str(run_dir)], capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr
    assert (run_dir / "report" / "reward.png").is_file() and (run_dir / "report" / "summary.txt").is_file()
