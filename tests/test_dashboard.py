"""The dashboard in-process: plain lines, the live frame, ETA ticking, sample colours."""

import io
import re
import subprocess
import sys

import pytest
from rich.console import Console

import tinyrl.dashboard as dashboard
from tinyrl.dashboard import Dashboard, fmt, highlight_completion, plain_line, sparkline
from tinyrl.errors import TinyRLError

GIB = 1024**3
INFO = dict(preset="countdown-tiny", model="tinyrl/tiny-qwen2", algorithm="ppo", engine="hf",
            total_steps=40, steps_per_epoch=20, run_dir="runs/countdown-tiny", device="cpu")


def metrics(step: int, **extra) -> dict:
    m = {"step": step, "epoch": 1, "reward/mean": 0.083, "reward/max": 1.0, "reward/min": 0.0,
         "kl/mean": 0.0012, "kl/coef": 0.001, "actor/pg_loss": -0.0123, "actor/pg_clipfrac": 0.031,
         "actor/ppo_kl": 0.00031, "actor/entropy": 1.234, "actor/grad_norm": 3.21,
         "critic/vf_loss": 0.456, "critic/vf_clipfrac": 0.1, "critic/explained_var": 0.12,
         "response_length/mean": 31.2, "response_length/max": 64, "response_length/clip_ratio": 0.05,
         "timing/rollout": 1.2, "timing/actor_update": 0.3, "timing/step": 1.9,
         "perf/tokens_per_s": 512.3, "memory/used_bytes": int(1.2 * GIB),
         "memory/peak_bytes": int(1.4 * GIB), "memory/total_bytes": int(15.6 * GIB), "memory/kind": "ram"}
    m.update(extra)
    return m


SAMPLE = {"prompt": "User: Using the numbers [44, 19, 35], create an equation that equals 98. You can",
          "completion": " 44+35=79, 79+19=98 [ok]</think>\n<answer> 44 + 35 + 19 </answer>",
          "reward": 1.0, "step": 3}


def plain_dash(**info) -> tuple[Dashboard, io.StringIO]:
    buf = io.StringIO()
    return Dashboard({**INFO, **info}, console=Console(file=buf, width=80)), buf


def frame(d: Dashboard, width: int = 120) -> str:
    c = Console(file=io.StringIO(), width=width, record=True, color_system=None)
    c.print(d.render())
    return c.export_text()


def test_auto_mode_is_plain_off_a_terminal_and_live_on_one():
    assert plain_dash()[0].mode == "plain"
    term = Console(file=io.StringIO(), force_terminal=True)
    assert Dashboard(INFO, console=term).mode == "live"


def test_unknown_mode_is_an_error_naming_the_choices():
    with pytest.raises(TinyRLError) as exc:
        Dashboard(INFO, mode="fancy")
    assert "fancy" in exc.value.message and "plain" in exc.value.hint


def test_plain_mode_prints_one_stable_line_per_step_even_past_80_columns():
    d, buf = plain_dash()
    with d:
        d.update(metrics(1))
        d.update(metrics(2, **{"val/score": 0.05}))
        d.update(metrics(3))
    lines = buf.getvalue().splitlines()
    assert len(lines) == 3 and all(len(line) > 80 for line in lines)
    assert lines[0].startswith("step 1/40 | epoch 1 | reward 0.083 [0.000, 1.000] | kl 0.0012 (coef 0.0010)")
    assert "| len 31.2 (max 64) |" in lines[0] and "| pg_clip 0.031 |" in lines[0]
    assert "| vf_loss 0.4560 |" in lines[0] and "| 1.90s |" in lines[0] and "| 512 tok/s |" in lines[0]
    # the PPO demo's bar is the critic's explained variance: piped, it was in metrics.jsonl only
    assert "| vf_loss 0.4560 | ev +0.120 |" in lines[0]
    assert lines[0].endswith("| RAM 1.20/15.60 GiB")
    assert "| val – |" in lines[0]
    # the last validation score stays on the lines after the validation step
    assert "| val 0.050 |" in lines[1] and "| val 0.050 |" in lines[2]
    # same fields in the same order every step
    assert [re.sub(r"[-–\d.,]+", "N", x) for x in lines[1:]] == [re.sub(r"[-–\d.,]+", "N", lines[0])] * 2


def test_plain_line_shows_a_dash_for_every_missing_key_and_drops_vf_loss_for_grpo():
    line = plain_line({"step": 5}, 40, None, critic=False)
    assert line.startswith("step 5/40 | epoch – | reward – [–, –] | kl – (coef –)")
    assert "vf_loss" not in line and line.endswith("| mem –/– GiB")
    d, buf = plain_dash(algorithm="grpo")
    gpu = {k: v for k, v in metrics(1, **{"memory/kind": "cuda"}).items() if not k.startswith("critic/")}
    d.update(gpu)
    assert "vf_loss" not in buf.getvalue() and "VRAM 1.20/15.60 GiB" in buf.getvalue()


def test_log_is_a_plain_line_in_plain_mode_and_silent_when_off():
    d, buf = plain_dash()
    d.log("vLLM sleep mode unsupported on CPU")
    assert buf.getvalue() == "note | vLLM sleep mode unsupported on CPU\n"
    buf2 = io.StringIO()
    off = Dashboard(INFO, mode="off", console=Console(file=buf2))
    with off:
        off.update(metrics(1))
        off.log("checkpoint saved 12 MB")
    assert buf2.getvalue() == ""


def test_update_stores_and_never_renders(monkeypatch):
    # Drawing belongs to Rich's refresh thread; the training thread only hands over numbers.
    d = Dashboard(INFO, mode="live", console=Console(file=io.StringIO(), force_terminal=True))
    monkeypatch.setattr(d, "render", lambda: pytest.fail("update() rendered on the training thread"))
    d.update(metrics(1), SAMPLE)
    d.set_phase("rollout")
    assert d._snapshot()["m"]["step"] == 1


def test_live_frame_shows_every_panel_with_its_numbers():
    d = Dashboard(INFO, mode="off")
    d.update(metrics(3, **{"val/score": 0.05, "training/rollout_probs_diff": 0.0021}), SAMPLE)
    d.update(metrics(4))  # no validation, no probs diff this step: the last ones stay
    d.set_phase("actor_update")
    text = frame(d)
    for title in ("tinyrl countdown-tiny", "reward", "KL · policy", "memory (process RAM)", "timings",
                  "critic", "latest sample · step 3 · reward 1.00"):
        assert title in text
    assert "step 4/40" in text and "phase actor_update" in text and "runs/countdown-tiny" in text
    assert re.search(r"mean\s+0\.083", text) and re.search(r"val score\s+0\.050 @3", text)
    assert re.search(r"kl\s+0\.0012", text) and re.search(r"ppo_kl\s+3\.10e-04", text)
    assert re.search(r"rollout Δp\s+0\.0021 @3", text)
    assert re.search(r"RAM used\s+1\.20 GiB", text) and re.search(r"RAM total\s+15\.60 GiB", text)
    assert re.search(r"clipped\s+5\.0%", text) and re.search(r"vf_loss\s+0\.4560", text)
    assert re.search(r"rollout\s+1\.20s", text) and "512 tokens/s" in text
    assert "Using the numbers [44, 19, 35], create an equation that equals 98" in text
    assert "<answer> 44 + 35 + 19 </answer>" in text


def test_live_frame_survives_missing_and_odd_values():
    d = Dashboard({"preset": "x"}, mode="off")
    text = frame(d)  # before any step
    assert "waiting for the first step" in text and "step –/–" in text
    d.update({"step": 1, "reward/mean": float("nan"), "actor/pg_loss": "oops", "memory/kind": "cuda",
              "memory/used_bytes": None})
    text = frame(d, width=80)
    assert re.search(r"mean\s+nan", text) and re.search(r"pg_loss\s+oops", text)
    assert re.search(r"VRAM used\s+– GiB", text) and re.search(r"kl coef\s+–", text)


def val_figures(name: str, greedy: float, pass8: float) -> dict:
    """What Trainer._validate_files logs for one data.val_files file with trainer.val_n = 8."""
    return {f"val/{name}/greedy_acc": greedy, f"val/{name}/pass@1": pass8 / 4, f"val/{name}/pass@8": pass8,
            f"val/{name}/maj@8": pass8 / 2, f"val/{name}/mean@8": pass8 / 4,
            f"val/{name}/response_length": 123.4}


def test_live_frame_has_a_row_per_validation_file_with_its_latest_figures():
    d = Dashboard(INFO, mode="off")
    d.update(metrics(1))
    assert "validation files" not in frame(d)  # no data.val_files: no panel taking room
    d.update(metrics(5, **{"val/score": 0.2}, **val_figures("aime", 0.1, 0.4), **val_figures("math500", 0.3, 0.8)))
    d.update(metrics(6))  # not a validation step: the last figures stay
    d.update(metrics(10, **val_figures("aime", 0.125, 0.5)))  # only aime validated at 10
    text = frame(d, width=140)
    assert "validation files" in text
    header = next(line for line in text.splitlines() if "greedy" in line)
    assert re.search(r"file\s+step\s+greedy\s+pass@1\s+pass@8\s+maj@8\s+mean@8\s+len", header)
    assert re.search(r"aime\s+@10\s+0\.125\s+0\.125\s+0\.500\s+0\.250\s+0\.125\s+123\.4", text)
    assert re.search(r"math500\s+@5\s+0\.300\s+0\.200\s+0\.800\s+0\.400\s+0\.200\s+123\.4", text)
    assert re.search(r"val score\s+0\.200 @5", text)  # val/score is test_path's, not a file row
    assert not re.search(r"^\W*(score|reward_mean)\b", text, re.M)


def test_plain_mode_prints_a_line_per_validation_file_on_validation_steps_only():
    d, buf = plain_dash()
    with d:
        d.update(metrics(1))
        d.update(metrics(2, **val_figures("aime", 0.1, 0.4), **val_figures("gsm8k", 0.3, 0.8)))
        d.update(metrics(3))
    lines = buf.getvalue().splitlines()
    assert [x.split(" | ")[0] for x in lines] == ["step 1/40", "step 2/40", "val aime @2", "val gsm8k @2", "step 3/40"]
    assert lines[2] == ("val aime @2 | greedy_acc 0.100 | pass@1 0.100 | pass@8 0.400 | maj@8 0.200 | "
                        "mean@8 0.100 | response_length 123.4")


def test_val_files_groups_only_per_file_keys():
    got = dashboard.val_files({"val/score": 1, "val/reward_mean": 2, "val/aime/pass@8": 0.5,
                               "val/aime/greedy_acc": 0.25, "reward/mean": 3, "val/m/maj@8": 0.1})
    assert got == {"aime": {"pass@8": 0.5, "greedy_acc": 0.25}, "m": {"maj@8": 0.1}}
    order = ["response_length", "maj@16", "pass@16", "mean@16", "pass@2", "greedy_acc", "maj@2"]
    assert sorted(order, key=dashboard.val_metric_order) == [
        "greedy_acc", "pass@2", "pass@16", "maj@2", "maj@16", "mean@16", "response_length"]


def test_a_critic_free_frame_has_no_critic_panel():
    # GRPO and the other critic-free estimators (tinyrl.roles) build no critic: nothing to show
    for algo in ("grpo", "rloo", "reinforce_pp"):
        d = Dashboard({**INFO, "algorithm": algo}, mode="off")
        d.update({k: v for k, v in metrics(1).items() if not k.startswith("critic/")})
        text = frame(d)
        assert "timings" in text and "critic" not in text and "vf_loss" not in text
    ppo = Dashboard({**INFO, "algorithm": "gae"}, mode="off")
    ppo.update(metrics(1))
    assert re.search(r"─ critic ─", frame(ppo))


def test_elapsed_eta_and_phase_time_tick_while_a_phase_runs(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(dashboard, "_clock", lambda: now[0])
    d = Dashboard({**INFO, "total_steps": 10}, mode="off")
    with d:
        now[0] = 102.0
        d.update(metrics(1, **{"timing/step": 2.0}))
        now[0] = 104.0
        d.update(metrics(2, **{"timing/step": 2.0}))
        d.set_phase("rollout")
        first = frame(d)
        now[0] = 109.0  # five seconds into the next rollout, no update yet
        later = frame(d)
    # 8 steps left x 2.0 s mean, less the time already spent in the running step
    assert "elapsed 0:00:04 · ETA 0:00:16 · phase rollout 0.0s" in first
    assert "elapsed 0:00:09 · ETA 0:00:11 · phase rollout 5.0s" in later


def test_eta_falls_back_to_wall_time_between_updates_without_timing_step(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(dashboard, "_clock", lambda: now[0])
    d = Dashboard({**INFO, "total_steps": 4}, mode="off")
    with d:
        now[0] = 3.0
        d.update({"step": 1})
        assert d.eta_seconds(d._snapshot(), now[0]) == 9.0
        d.update({"step": 4})
        assert d.eta_seconds(d._snapshot(), now[0]) == 0.0


def test_real_live_view_leaves_the_final_frame_and_prints_notices_above_it():
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=120, color_system=None)
    with Dashboard(INFO, mode="live", console=console) as d:
        d.log("checkpoint saved 12 MB")
        d.update(metrics(7), SAMPLE)
    out = buf.getvalue()
    assert "checkpoint saved 12 MB" in out
    assert out.rfind("checkpoint saved 12 MB") < out.rfind("step 7/40")
    assert "latest sample · step 3 · reward 1.00" in out


@pytest.mark.parametrize("reward, colour", [(1.0, "green"), (0.1, "yellow"), (0.0, "red")])
def test_answer_is_coloured_by_reward_and_think_tags_are_styled(reward, colour):
    text = highlight_completion("a [b] </think> <answer> 1 + 2 </answer> tail", reward)
    styled = {text.plain[s.start:s.end]: str(s.style) for s in text.spans}
    assert styled["<answer> 1 + 2 </answer>"] == f"bold {colour}"
    assert styled["</think>"] == "bold magenta"
    assert text.plain.endswith("tail")


def test_formats_and_sparkline():
    assert fmt(None) == "–" and fmt(float("inf")) == "inf" and fmt(0.00031) == "3.10e-04" and fmt(0.0) == "0"
    assert fmt(12345.6) == "12,346" and fmt(3) == "3" and fmt(0.5, ".3f") == "0.500"
    assert sparkline([0.0, 0.5, 1.0], 10) == "▁▅█"
    assert sparkline([0.2, 0.2], 10) == "▄▄"
    assert sparkline([None, float("nan"), 0.0, 1.0, 2.0], 2) == "▁█"  # the last 2 finite values


def test_vram_panel_holds_each_phases_measured_peak_against_the_plan():
    """Issue 20 item 6: a CUDA run's memory panel shows measured / planned per phase (the plan
    from RUN_DIR/memory_plan.json, the peaks from the step's memory/phase/*_peak_bytes)."""
    plan = {"phases": {"forward": {"planned_allocated_bytes": 10 * GIB},
                       "actor_update": {"planned_allocated_bytes": 16 * GIB}}}
    d = Dashboard({**INFO, "memory_plan": plan}, mode="off")
    d.update(metrics(1, **{"memory/kind": "cuda", "memory/phase/actor_update_peak_bytes": 13.5 * GIB}))
    text = frame(d)
    assert re.search(r"actor upd\s+13\.50/16\.00 GiB plan", text)
    assert re.search(r"forward\s+–/10\.00 GiB plan", text)   # not measured yet this step
    assert "GiB plan" not in frame(Dashboard(INFO, mode="off"))  # a CPU run has no plan


# A tool episode as samples.jsonl keeps it (tinyrl.rollout.transcript): assistant, tool, assistant.
CALL = '<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(44 + 35 + 19)"}}\n</tool_call>'
EPISODE = {**SAMPLE, "completion": "(the turns joined)", "stop_reason": "stop",
           "turns": [{"role": "assistant", "text": " Let me add them.\n" + CALL, "tokens": 40},
                     {"role": "tool", "text": "\nuser\n<tool_response>\n98\n</tool_response>\nassistant\n", "tokens": 12},
                     {"role": "assistant", "text": " 98 it is</think>\n<answer> 44 + 35 + 19 </answer>", "tokens": 15}],
           "tool_calls": [{"name": "code_interpreter", "status": "ok", "seconds": 0.123, "turn": 0}]}


def sample_lines(d: Dashboard, width: int = 100) -> list[str]:
    text = frame(d, width)
    return text[text.index("latest sample ·"):].splitlines()


def test_a_tool_episode_is_drawn_as_a_conversation_with_the_tool_turn_boxed_apart():
    d = Dashboard(INFO, mode="off")
    d.update(metrics(3), EPISODE)
    lines = sample_lines(d)
    assert "latest sample · step 3 · reward 1.00 · 2 model turns · 1 tool call" in lines[0]
    body = "\n".join(lines)
    # in order: the call, the tool's reply, the answer
    at = [body.index(s) for s in ("Let me add them.", '"code": "print(44 + 35 + 19)"', "<tool_response>", "│ │ 98 ",
                                  "98 it is", "<answer> 44 + 35 + 19 </answer>")]
    assert at == sorted(at)
    # the tool turn sits in a box of its own (a second border inside the panel's), titled with the call
    inner = [x for x in lines if x.startswith("│ │")]
    assert any("<tool_response>" in x for x in inner) and any(x.split("│")[2].strip() == "98" for x in inner)
    assert any("╭─ tool · code_interpreter ok 0.12s" in x for x in lines)
    # the policy's turns are not in it
    assert not any("Let me add" in x or "<answer>" in x or "code_interpreter" in x for x in inner)
    assert sum("assistant ▸" in x for x in lines) == 2
    assert "(the turns joined)" not in body  # drawn from the turns, not the flat completion


def test_a_failed_tool_call_draws_its_box_red_and_a_cut_episode_says_why():
    failed = {**EPISODE, "stop_reason": "max_turns",
              "tool_calls": [{"name": "code_interpreter", "status": "timeout", "seconds": 10.0, "turn": 0}]}
    d = Dashboard(INFO, mode="off")
    d.update(metrics(3), failed)
    assert "2 model turns · 1 tool call · stopped: max_turns" in sample_lines(d)[0]
    c = Console(file=io.StringIO(), width=100, force_terminal=True, color_system="standard")
    c.print(d.render())
    # red (SGR 31) starts the box's top border; the ok box of EPISODE is not red
    assert re.search(r"\x1b\[31m╭─(\x1b\[[0-9;]*m)* tool · code_interpreter timeout 10.00s", c.file.getvalue())
    d.update(metrics(4), EPISODE)
    c = Console(file=io.StringIO(), width=100, force_terminal=True, color_system="standard")
    c.print(d.render())
    assert re.search(r"╭─(\x1b\[[0-9;]*m)* tool · code_interpreter ok", c.file.getvalue())
    assert not re.search(r"\x1b\[31m╭─", c.file.getvalue())


def test_a_call_whose_reply_did_not_fit_the_budget_is_still_drawn_with_its_message():
    """The budget can end an episode after its calls ran and before their tool turn: no box then,
    so the sample said "1 tool call" and showed none, nor why the call failed (ToolCall.message)."""
    cut = {**EPISODE, "stop_reason": "length", "turns": EPISODE["turns"][:1],
           "tool_calls": [{"name": "code_interpreter", "status": "error", "seconds": 0.5, "turn": 0,
                           "message": "error: tool 'code_interpreter' raised RuntimeError: boom"}]}
    d = Dashboard(INFO, mode="off")
    d.update(metrics(3), cut)
    lines = sample_lines(d, 160)
    assert "1 model turn · 1 tool call · stopped: length" in lines[0]
    said = [x for x in lines if "↳ code_interpreter error 0.50s, no reply" in x]
    assert len(said) == 1 and "raised RuntimeError: boom" in said[0], lines
    d.update(metrics(4), {**cut, "tool_calls": [{**cut["tool_calls"][0], "status": "ok", "message": ""}]})
    assert any("↳ code_interpreter ok 0.50s, no reply: it did not fit" in x for x in sample_lines(d, 160))
    d.update(metrics(5), EPISODE)  # answered by a tool turn: its box says it, no extra line
    assert not any("no reply" in x for x in sample_lines(d, 160))


def test_a_single_turn_sample_looks_as_it_did_before_turns_were_recorded(monkeypatch):
    # one instant for both frames: their elapsed and phase times are drawn too, and on a loaded
    # machine (a ci-soak run beside a demo, 2026-11-30) "starting 0.1s" met "starting 0.0s"
    monkeypatch.setattr(dashboard, "_clock", lambda: 100.0)
    old = Dashboard(INFO, mode="off")
    old.update(metrics(3), SAMPLE)  # a record without turns (samples.jsonl before episodes)
    new = Dashboard(INFO, mode="off")
    new.update(metrics(3), {**SAMPLE, "stop_reason": "stop", "tool_calls": [],
                            "turns": [{"role": "assistant", "text": SAMPLE["completion"], "tokens": 20}]})
    assert frame(new) == frame(old)
    assert "turns" not in sample_lines(new)[0] and "assistant ▸" not in frame(new)


def test_only_the_last_turns_of_a_long_episode_are_drawn_each_cut_to_its_tail():
    turns = []
    for k in range(5):
        turns += [{"role": "assistant", "text": f"try {k}\n" + CALL, "tokens": 40},
                  {"role": "tool", "text": "\n".join(f"out {k}.{j}" for j in range(50)), "tokens": 300}]
    turns.append({"role": "assistant", "text": "".join(f"check {j}\n" for j in range(6)) +
                  "<answer> 44 + 35 + 19 </answer>", "tokens": 60})
    calls = [{"name": "code_interpreter", "status": "ok", "seconds": 0.1, "turn": 2 * k} for k in range(5)]
    d = Dashboard(INFO, mode="off")
    d.update(metrics(3), {**SAMPLE, "turns": turns, "tool_calls": calls, "stop_reason": "stop"})
    body = "\n".join(sample_lines(d))
    shown = dashboard.MAX_TURNS_SHOWN
    assert f"… {len(turns) - shown} earlier turns" in body
    assert "try 2" not in body and "out 2.49" in body and "try 3" in body   # the 6th turn from the end is a reply
    assert body.rstrip("╯─╰│ \n").endswith("<answer> 44 + 35 + 19 </answer>")
    # a tool reply keeps its last lines; the first ones are cut, marked with "…"
    assert "out 4.49" in body and "out 4.0\n" not in body and "…out 4.4" in body
    # the last turn holds the answer: it keeps more lines (7 here, all) than an earlier one (4)
    assert "assistant ▸ check 0" in body


def test_tool_metrics_show_in_the_live_view_and_on_every_plain_line_once_seen():
    tools = {"tools/calls": 12.0, "tools/errors": 2.0, "tools/timeouts": 1.0, "tools/seconds": 3.456,  # as logged: floats
             "episode/turns": 2.5, "episode/tokenization_mismatch": 3.0, "episode/text_mismatch": 1.0}
    d = Dashboard(INFO, mode="off")
    d.update(metrics(1))
    assert "─ tools ─" not in frame(d)  # a run without tool metrics shows no tools panel
    d.update(metrics(2, **tools))
    text = frame(d)
    assert "─ tools ─" in text
    for label, value in (("calls", "12"), ("errors", "2"), ("timeouts", "1"), ("seconds", "3.46"),
                         ("model turns/ep", "2.50"), ("tok mismatch", "3 (text 1)")):
        assert re.search(rf"{re.escape(label)}\s+{re.escape(value)}(\s|$)", text, re.M), label
    p, buf = plain_dash()
    with p:
        p.update(metrics(1))
        p.update(metrics(2, **tools))
        p.update(metrics(3))  # a step without them: the fields stay, as dashes
    lines = buf.getvalue().splitlines()
    assert "tools" not in lines[0]
    assert "| vf_loss 0.4560 | ev +0.120 | tools 12 (errors 2, timeouts 1, 3.46s) | turns 2.50 | tok_mismatch 3 (text 1) | val" in lines[1]
    assert "| tools – (errors –, timeouts –, –s) | turns – | tok_mismatch – (text –) |" in lines[2]
    # without tools the line is exactly what it was
    assert plain_line(metrics(1), 40, None, critic=True) == lines[0]


HOSTILE = "\x1b[2J\x1b[H\x1b[31mRED [bold]not bold[/bold] [/nope] \x07\rover"


def test_hostile_tool_output_and_names_are_drawn_as_inert_text():
    """Tool output is untrusted: an ANSI escape must not reach the terminal (it could clear the
    screen or recolour the view) and Rich markup in it or in a tool's name must neither style
    nor crash the frame (a stray [/nope] is a MarkupError when parsed)."""
    said = {"role": "assistant", "text": "calling\x1b]0;owned\x07 [red]x[/red]", "tokens": 9}  # a model's bytes too
    ep = {**EPISODE, "stop_reason": "[/nope]", "prompt": "User: Using the numbers [1, 2], \x1b[5mmake 3.",
          "turns": [said, {"role": "tool", "text": HOSTILE, "tokens": 30}, EPISODE["turns"][2]],
          "tool_calls": [{"name": "[/nope]\x1b[2J", "status": "unknown_tool", "seconds": 0.0, "turn": 0}]}
    d = Dashboard(INFO, mode="off")
    d.update(metrics(3), ep)
    c = Console(file=io.StringIO(), width=100, force_terminal=True, color_system="standard")
    c.print(d.render())
    out = c.file.getvalue()
    assert "\x1b[2J" not in out and "\x1b[H" not in out and "\x07" not in out and "\r" not in out
    plain = re.sub(r"\x1b\[[0-9;]*m", "", out)  # the view's own colours only
    assert "\\x1b[2J\\x1b[H\\x1b[31mRED [bold]not bold[/bold] [/nope] \\x07\\x0dover" in plain
    assert "╭─ tool · [/nope]\\x1b[2J unknown_tool 0.00s" in plain and "stopped: [/nope]" in plain
    assert "assistant ▸ calling\\x1b]0;owned\\x07 [red]x[/red]" in plain and "\\x1b[5mmake 3" in plain
    assert "\x1b]" not in out and "\x1b[5m" not in out
    assert dashboard.safe_text("a\tb\nc é") == "a\tb\nc é"  # tabs, newlines and text untouched


def test_a_resumed_runs_dashboard_starts_from_the_validations_it_logged(tmp_path):
    """`--resume` of the demo (after a Ctrl-C) showed `val –` until its last step, though its
    step-0 validation was in metrics.jsonl: the CLI hands the logged ones to the dashboard."""
    import json

    from tinyrl.cli.run import _show_earlier_validations

    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (
        {"step": 0, "val/score": 0.164}, metrics(1), metrics(2, **{"val/score": 0.184}), metrics(3))))
    d, buf = plain_dash()
    _show_earlier_validations(d, tmp_path)
    d.update(metrics(4))
    assert "| val 0.184 |" in buf.getvalue()
    assert re.search(r"val score\s+0\.184 @2", frame(d))
    _show_earlier_validations(d, tmp_path / "none")  # a run resumed before its first step logged: nothing


def test_an_sft_frame_has_no_rollout_fields():
    """SFT samples nothing: its frame said "latest sample: waiting for the first step" and showed
    `len mean –`, `len max –`, `clipped –` from the first step to the last."""
    d = Dashboard({**INFO, "algorithm": "sft", "preset": "countdown-demo-sft"}, mode="off")
    first = frame(d)  # before step 1: it showed reward, KL · policy and rollout panels until then
    assert "sft loss" in first and "reward" not in first and "KL" not in first and "latest sample" not in first
    d.update({"step": 58, "epoch": 1, "sft/loss": 0.7551, "sft/lr": 3e-3, "sft/grad_norm": 0.43,
              "memory/kind": "ram", "memory/used_bytes": int(0.85 * GIB), "memory/total_bytes": int(23.6 * GIB)})
    text = frame(d)
    assert "sft loss" in text and re.search(r"RAM used\s+0\.85 GiB", text)
    assert "waiting for the first step" not in text and "latest sample" not in text
    assert "len mean" not in text and "clipped" not in text and "· length" not in text


def test_an_sft_frame_holds_its_val_score_like_its_val_loss():
    """With trainer.test_every=5 the SFT panel read `val loss 1.1658 @5` but `val score –` at step 9."""
    d = Dashboard({**INFO, "algorithm": "sft"}, mode="off")
    base = {"epoch": 1, "sft/loss": 1.0, "memory/kind": "ram"}
    d.update({**base, "step": 5, "val/loss": 1.1658, "val/score": 0.125})
    d.update({**base, "step": 9})
    text = frame(d)
    assert re.search(r"val loss\s+1\.1658 @5", text) and re.search(r"val score\s+0\.125 @5", text)


def test_counts_in_the_sample_panel_are_singular_for_one_and_the_render_thread_stays_light():
    """The sample title and the "earlier turns" line say counts as the data commands do (one
    `counted`); the dashboard module imports neither pandas nor torch (it draws on its own thread)."""
    turns = [{"role": "assistant", "text": f"try {k}", "tokens": 4} for k in range(dashboard.MAX_TURNS_SHOWN + 1)]
    console = Console(width=80, record=True, file=io.StringIO())
    console.print(*dashboard.episode_view(turns, [], 1.0, 80))
    body = console.export_text()
    assert "… 1 earlier turn" in body and "earlier turns" not in body
    d = Dashboard(INFO, mode="off")
    d.update(metrics(3), {**SAMPLE, "turns": turns[:1] + [{"role": "tool", "text": "1"}], "tool_calls":
                          [{"name": "code_interpreter", "status": "ok", "seconds": 0.1, "turn": 0}]})
    assert "1 model turn · 1 tool call" in sample_lines(d)[0]
    code = "import sys, tinyrl.dashboard; print(sorted({'pandas', 'torch'} & set(sys.modules)))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"
