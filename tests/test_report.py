"""`tinyrl report` on fake run directories, and the optional TensorBoard / wandb sinks."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import hold_run_lock
from tinyrl.errors import TinyRLError
from tinyrl.report import REPORT_MARK, load_metrics, write_report
from tinyrl.sinks import TensorBoardSink, WandbSink, make_sinks

GIB = 1024**3
PHASE_SECONDS = {"rollout": 4.0, "reward": 0.05, "forward": 0.9, "actor_update": 2.0, "sync": 0.4}


def make_run(run_dir: Path, steps: int = 12, critic: bool = True, val_every: int = 5,
             kind: str = "cuda") -> Path:
    """A run directory as the trainer writes it, with numbers a person can check by hand:
    reward/mean = 0.05 * step, memory peak = (10 + step) GiB, step time = 7.35 s (+ 1 s values)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "metrics.jsonl", "w") as f:
        for s in range(1, steps + 1):
            m = {"step": s, "epoch": 0, "reward/mean": 0.05 * s, "reward/min": 0.0, "reward/max": 1.0,
                 "kl/mean": 0.001 * s, "kl/coef": 0.001, "response_length/mean": 200.0 - s,
                 "response_length/max": 256, "response_length/clip_ratio": 0.02,
                 **{f"timing/{p}": t for p, t in PHASE_SECONDS.items()},
                 "perf/tokens_per_s": 2000.0, "memory/used_bytes": 8 * GIB,
                 "memory/peak_bytes": (10 + s) * GIB, "memory/total_bytes": 24 * GIB, "memory/kind": kind}
            if critic:
                # the critic's values are part of the forward phase: +0.5 s there
                m.update({"timing/forward": 0.9 + 0.5, "timing/critic_update": 0.5, "critic/vf_loss": 1.0 / s})
            if s % val_every == 0:
                m["val/score"] = 0.1 * s
            m["timing/step"] = sum(v for k, v in m.items() if k.startswith("timing/"))
            f.write(json.dumps(m) + "\n")
    (run_dir / "config.json").write_text(json.dumps({"preset": "countdown-4090",
                                                      "model": {"name": "Qwen/Qwen2.5-0.5B"}}))
    return run_dir


def is_png(path: Path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def write_plan(run: Path) -> None:
    """A CUDA run's plan as preflight keeps it: actor_update 18 GiB on the card, of which 0.5 CUDA
    context, 0.5 vLLM asleep, 1 allocator headroom -> 16 GiB of tensors planned; rollout 20 GiB,
    of which 0.5 context and 10 vLLM's reservation -> 9.5 GiB the trainer's."""
    from tinyrl.memory.versus import write_run_plan

    write_run_plan(run, {"gpu": "rtx4090", "budget_bytes": 21 * GIB, "simulated": True, "phases": {
        "rollout": {"peak_bytes": 20 * GIB, "micro_batch": 0,
                    "parts": {"cuda_context": GIB // 2, "vllm_reserved": 10 * GIB, "trainer_weights": 19 * GIB // 2}},
        "actor_update": {"peak_bytes": 18 * GIB, "micro_batch": 19,
                         "parts": {"cuda_context": GIB // 2, "vllm_asleep": GIB // 2, "allocator": GIB,
                                   "activations": 16 * GIB}}}})


def test_full_run_writes_every_plot_and_a_summary_with_hand_checked_numbers(tmp_path):
    run = make_run(tmp_path / "run")
    write_plan(run)
    with open(run / "timeline.jsonl", "w") as f:
        for i, phase in enumerate(["rollout", "rollout", "actor_update", "sync"]):
            f.write(json.dumps({"t": 2.0 * i, "phase": phase, "memory_bytes": (12 + i) * GIB,
                                "memory_kind": "cuda", "peak_allocated_bytes": (9 + 2 * i) * GIB,
                                "peak_reserved_bytes": (10 + 2 * i) * GIB}) + "\n")
    files = write_report(run)
    names = [p.name for p in files]
    assert names == ["reward.png", "kl.png", "response_length.png", "memory.png", "timings.png",
                     "val_score.png", "timeline.png", "memory_vs_plan.png", "summary.txt"]
    assert all(p.parent == run / "report" for p in files)
    assert all(is_png(p) for p in files[:-1])
    summary = (run / "report" / "summary.txt").read_text()
    assert "preset: countdown-4090  model: Qwen/Qwen2.5-0.5B" in summary
    assert "steps: 12 recorded, step 1 to 12" in summary
    assert "reward/mean: first 0.0500 (step 1), last 0.6000 (step 12), best 0.6000 (step 12)" in summary
    assert "final val score: 1.0000 (step 10)" in summary
    # steps 5 and 10 carry no extra time here, so every step is 4+0.05+0.9+2+0.4+0.5+0.5
    assert "median step time: 8.35 s" in summary
    assert "peak memory: 22.00 GiB VRAM of 24.0 GiB" in summary
    assert "time by phase: rollout 48%" in summary
    assert "plots skipped: none" in summary
    # planned vs measured: the larger of the two rollout records (9, 11 GiB) against 9.5 planned;
    # actor_update 13 GiB against 16 planned; sync was not planned
    table = summary[summary.index("memory vs plan"):].splitlines()
    assert "planned on rtx4090, budget 21.00" in table[0]
    assert table[2].split() == ["rollout", "9.50", "11.00", "1.16", "12.00", "9.50"]
    assert table[3].split() == ["actor_update", "16.00", "13.00", "0.81", "14.00", "17.00"]
    assert table[4].split() == ["sync", "-", "15.00", "-", "16.00", "-"]


def test_plots_without_metrics_are_skipped_and_named(tmp_path):
    run = make_run(tmp_path / "run", val_every=1000, kind="ram")
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    with open(run / "metrics.jsonl", "w") as f:
        for m in lines:
            f.write(json.dumps({k: v for k, v in m.items() if not k.startswith("kl/")}) + "\n")
    out = tmp_path / "elsewhere"
    names = [p.name for p in write_report(run, out)]
    assert "kl.png" not in names and "val_score.png" not in names and "timeline.png" not in names
    assert not (out / "kl.png").exists() and not (run / "report").exists()
    summary = (out / "summary.txt").read_text()
    assert "kl.png (no kl/mean in metrics.jsonl)" in summary
    assert "val_score.png (no val/score in metrics.jsonl)" in summary
    assert "timeline.png (no timeline.jsonl with points)" in summary
    assert "memory_vs_plan.png (no memory plan and no per-phase peaks)" in summary
    assert "memory vs plan: none (no memory_plan.json)" in summary
    assert "final val score: none" in summary and "GiB RAM of 24.0 GiB" in summary


def add_val_files(run: Path, every: int = 5) -> None:
    """data.val_files figures as Trainer._validate_files logs them (trainer.val_n = 4), every 5th step:
    aime's greedy_acc = 0.01 * step, math500's = 0.02 * step; pass@4 = 2 x greedy_acc."""
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    with open(run / "metrics.jsonl", "w") as f:
        for m in recs:
            if m["step"] % every == 0:
                for name, scale in (("aime", 0.01), ("math500", 0.02)):
                    g = scale * m["step"]
                    m.update({f"val/{name}/greedy_acc": g, f"val/{name}/pass@1": g / 2, f"val/{name}/pass@4": 2 * g,
                              f"val/{name}/maj@1": g / 2, f"val/{name}/maj@4": g, f"val/{name}/mean@4": g / 2,
                              f"val/{name}/response_length": 100.0 + m["step"]})
            f.write(json.dumps(m) + "\n")


def test_validation_files_get_a_plot_per_metric_family_and_a_summary_line_each(tmp_path):
    run = make_run(tmp_path / "run")
    add_val_files(run)
    names = [p.name for p in write_report(run)]
    assert names[names.index("val_score.png") + 1:names.index("summary.txt")] == [
        "val_greedy_acc.png", "val_pass_at_k.png", "val_maj_at_k.png", "val_mean_at_n.png",
        "val_response_length.png"]  # timeline.png skipped: no timeline.jsonl
    assert all(is_png(run / "report" / n) for n in names if n.startswith("val_"))
    summary = (run / "report" / "summary.txt").read_text()
    assert ("val aime (step 10): greedy_acc 0.1000, pass@1 0.0500, pass@4 0.2000, maj@1 0.0500, maj@4 0.1000, "
            "mean@4 0.0500, response_length 110.0") in summary
    assert "val math500 (step 10): greedy_acc 0.2000, pass@1 0.1000, pass@4 0.4000" in summary
    assert "val score (step" not in summary and "val reward_mean" not in summary  # test_path's, not a file


def test_a_validation_plot_draws_a_line_per_file_with_its_own_points(tmp_path):
    from matplotlib.figure import Figure

    from tinyrl.report import _val_plot, val_families

    run = make_run(tmp_path / "run")
    add_val_files(run)
    recs = load_metrics(run, [])
    families = val_families(recs)
    assert set(families) == {"greedy_acc", "pass", "maj", "mean", "response_length"}
    ax = Figure().add_subplot()
    _val_plot("pass", families["pass"])(ax, recs)
    lines = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()}
    assert set(lines) == {"aime pass@1", "aime pass@4", "math500 pass@1", "math500 pass@4"}
    assert lines["math500 pass@4"][0] == [5.0, 10.0]
    assert lines["math500 pass@4"][1] == pytest.approx([0.2, 0.4])
    assert lines["aime pass@1"][1] == pytest.approx([0.025, 0.05])
    ax = Figure().add_subplot()
    _val_plot("greedy_acc", families["greedy_acc"])(ax, recs)
    assert [line.get_label() for line in ax.get_lines()] == ["aime", "math500"]  # one k: the file names


def add_tool_metrics(run: Path) -> None:
    """A tool run's per-step figures: at step s, 2s calls of which s // 4 errors and s // 6 timeouts,
    0.1s seconds of tool time, 1 + s / 12 turns per episode, two tokenization mismatches at step 7,
    one of them in text."""
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    with open(run / "metrics.jsonl", "w") as f:
        for m in recs:
            s = m["step"]
            m.update({"tools/calls": 2 * s, "tools/errors": s // 4, "tools/timeouts": s // 6,
                      "tools/seconds": 0.1 * s, "episode/turns": 1 + s / 12,
                      "episode/tokenization_mismatch": 2 * int(s == 7), "episode/text_mismatch": int(s == 7)})
            f.write(json.dumps(m) + "\n")


def test_a_tool_run_gets_a_tool_use_plot_and_a_summary_line_per_tool_metric(tmp_path):
    run = make_run(tmp_path / "run")
    add_tool_metrics(run)
    names = [p.name for p in write_report(run)]
    assert "tools.png" in names and is_png(run / "report" / "tools.png")
    summary = (run / "report" / "summary.txt").read_text()
    assert [x for x in summary.splitlines() if x.startswith(("tools/", "episode/"))] == [
        "tools/calls per step: first 2 (step 1), last 24 (step 12), mean 13",
        "tools/errors per step: first 0 (step 1), last 3 (step 12), mean 1.25",
        "tools/timeouts per step: first 0 (step 1), last 2 (step 12), mean 0.6667",
        "tools/seconds per step: first 0.1 (step 1), last 1.2 (step 12), mean 0.65",
        "episode/turns per step: first 1.083 (step 1), last 2 (step 12), mean 1.542",
        "episode/tokenization_mismatch per step: first 0 (step 1), last 0 (step 12), mean 0.1667",
        "episode/text_mismatch per step: first 0 (step 1), last 0 (step 12), mean 0.08333"]
    assert "tools.png" not in summary[summary.index("plots skipped"):]


def test_the_tool_use_plot_draws_each_metric_at_its_steps(tmp_path):
    from matplotlib.figure import Figure

    from tinyrl.report import PLOTS

    run = make_run(tmp_path / "run", steps=6)
    add_tool_metrics(run)
    recs = load_metrics(run, [])
    ax = Figure().add_subplot()
    PLOTS["tools.png"][1](ax, recs)
    lines = {line.get_label(): list(line.get_ydata()) for line in ax.get_lines()}
    assert lines == {"tools/calls": [2, 4, 6, 8, 10, 12], "tools/errors": [0, 0, 0, 1, 1, 1],
                     "tools/timeouts": [0, 0, 0, 0, 0, 1]}
    twin = [a for a in ax.figure.axes if a is not ax][0]
    assert [list(line.get_ydata()) for line in twin.get_lines()] == [pytest.approx([1 + s / 12 for s in range(1, 7)])]


def test_a_run_without_tool_metrics_hears_nothing_of_tools(tmp_path):
    run = make_run(tmp_path / "run")
    names = [p.name for p in write_report(run)]
    summary = (run / "report" / "summary.txt").read_text()
    body = summary.split("\n", 1)[1]  # the first line names the run directory (this test's has "tool" in it)
    assert "tools.png" not in names and "tool" not in body and "episode/" not in body


def test_missing_run_dir_or_metrics_file_names_it(tmp_path):
    with pytest.raises(TinyRLError) as exc:
        write_report(tmp_path / "nope")
    assert str(tmp_path / "nope") in exc.value.message
    (tmp_path / "run").mkdir()
    with pytest.raises(TinyRLError) as exc:
        write_report(tmp_path / "run")
    assert str(tmp_path / "run" / "metrics.jsonl") in exc.value.message


def test_an_exported_model_directory_is_not_called_a_run_without_steps(tmp_path):
    # `tinyrl report EXPORT_DIR` said "has no step logged yet": its config.json is the model's
    model = tmp_path / "exp"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "qwen2"}')
    (model / "tinyrl_export.json").write_text('{"run_dir": "runs/base", "step": 2, "base": "tinyrl/tiny-qwen2"}')
    with pytest.raises(TinyRLError, match="is a model directory") as exc:
        write_report(model)
    assert "tinyrl report runs/base" in exc.value.hint and not (model / "report").exists()


def test_empty_metrics_file_is_an_error_naming_it(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("\n\n")
    with pytest.raises(TinyRLError) as exc:
        write_report(tmp_path)
    assert "metrics.jsonl has no step records" in exc.value.message and exc.value.hint
    (tmp_path / "metrics.jsonl").unlink()  # a run's directory before its first step ends
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(TinyRLError, match="has no step logged yet") as exc:
        write_report(tmp_path)
    assert "after its first step" in exc.value.hint
    with pytest.raises(TinyRLError, match="config.json is a file; give the run's directory") as exc:
        write_report(tmp_path / "config.json")
    assert exc.value.hint == "e.g. tinyrl report runs/<run name>"  # no metrics.jsonl beside it
    (tmp_path / "config.json").unlink()
    with pytest.raises(TinyRLError, match="no metrics file") as exc:  # not a run's directory at all
        write_report(tmp_path)
    assert "`tinyrl train` or `tinyrl sft`" in exc.value.hint  # both write reports


def test_bad_middle_line_is_an_error_but_a_cut_off_last_line_is_dropped(tmp_path):
    good = json.dumps({"step": 1, "reward/mean": 0.5})
    (tmp_path / "metrics.jsonl").write_text(f"{good}\n{{oops\n{good}\n")
    with pytest.raises(TinyRLError) as exc:
        load_metrics(tmp_path, [])
    assert "metrics.jsonl line 2 is not JSON" in exc.value.message
    (tmp_path / "metrics.jsonl").write_text(f'{good}\n{{"step": 2, "reward/me')
    notes: list[str] = []
    assert [r["step"] for r in load_metrics(tmp_path, notes)] == [1]
    assert notes == ["metrics.jsonl: dropped a cut-off last line (line 2)"]


def test_a_resumed_run_that_redoes_a_step_keeps_the_last_record(tmp_path):
    rows = [{"step": 1, "reward/mean": 0.1}, {"step": 2, "reward/mean": 0.2},
            {"step": 2, "reward/mean": 0.25}, {"step": 3, "reward/mean": float("nan")}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    notes: list[str] = []
    recs = load_metrics(tmp_path, notes)
    assert [(r["step"], r["reward/mean"]) for r in recs[:2]] == [(1, 0.1), (2, 0.25)]
    assert math.isnan(recs[2]["reward/mean"]) and "1 repeated step record" in notes[0]


def test_missing_matplotlib_says_how_to_install_it(tmp_path, monkeypatch):
    make_run(tmp_path, steps=2)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` raise ImportError
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(TinyRLError) as exc:
        write_report(tmp_path)
    assert exc.value.hint == "pip install -e '.[plots]'"


def test_cli_report_prints_the_files_written(tmp_path):
    from tinyrl.cli import app

    run = make_run(tmp_path / "run", steps=3, critic=False, val_every=3)
    result = CliRunner().invoke(app, ["report", str(run), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert str(tmp_path / "out" / "reward.png") in result.output
    assert str(tmp_path / "out" / "summary.txt") in result.output
    assert "final val score: 0.3000 (step 3)" in result.output


def test_report_never_replaces_a_users_files_in_out_but_updates_its_own(tmp_path):
    """`--out figures` wrote reward.png and summary.txt over the user's own files of those names."""
    run = make_run(tmp_path / "run", steps=3, critic=False, val_every=3)
    figures = tmp_path / "figures"
    figures.mkdir()
    for name in ("reward.png", "val_aime_at_k.png", "notes.txt"):
        (figures / name).write_text(f"the user's {name}")
    proc = subprocess.run([sys.executable, "-c", "from tinyrl.cli import main; main()", "report", str(run),
                           "--out", str(figures)], capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})
    said = " ".join(proc.stderr.replace("│", " ").split())
    assert proc.returncode == 2 and "already holds reward.png, val_aime_at_k.png" in said and "notes.txt" not in said
    assert sorted(p.name for p in figures.iterdir()) == ["notes.txt", "reward.png", "val_aime_at_k.png"]
    assert all((figures / n).read_text() == f"the user's {n}" for n in ("reward.png", "val_aime_at_k.png"))
    (figures / "reward.png").unlink()
    (figures / "val_aime_at_k.png").unlink()
    first = write_report(run, figures)  # beside the user's notes.txt, then again over its own files
    assert (figures / "notes.txt").read_text() == "the user's notes.txt"
    assert [p.name for p in write_report(run, figures)] == [p.name for p in first]
    assert write_report(run)  # RUN_DIR/report: its own, also when named and written before the mark was
    (run / "report" / REPORT_MARK).unlink()
    assert write_report(run, run / "report")


def test_cli_report_on_a_missing_run_is_one_error_screen_with_exit_code_2(tmp_path):
    proc = subprocess.run([sys.executable, "-c", "from tinyrl.cli import main; main()", "report",
                           str(tmp_path / "missing")], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "run directory not found" in proc.stderr and "Traceback" not in proc.stderr


# -- sinks -------------------------------------------------------------------------------


@pytest.mark.parametrize("flag, package", [("tensorboard", "tensorboard"), ("wandb", "wandb")])
def test_asking_for_a_sink_whose_package_is_missing_gives_the_pip_command(tmp_path, monkeypatch, flag, package):
    monkeypatch.setitem(sys.modules, package, None)  # find_spec then reports it as not installed
    with pytest.raises(TinyRLError) as exc:
        make_sinks(tmp_path, tensorboard=flag == "tensorboard", wandb=flag == "wandb")
    assert package in exc.value.message and exc.value.hint.startswith(f"pip install {package}")
    assert list(tmp_path.iterdir()) == []  # nothing opened before the check


def test_no_sinks_asked_for_is_an_empty_list(tmp_path):
    assert make_sinks(tmp_path, tensorboard=False, wandb=False) == []


class Recorder:
    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return lambda *a, **kw: self.calls.append((name, a, kw))


def test_sinks_pass_on_finite_numbers_only():
    m = {"reward/mean": 0.5, "step": 3, "memory/kind": "cuda", "actor/pg_loss": float("nan"), "flag": True}
    tb = Recorder()
    TensorBoardSink(tb).log(m, step=3)
    assert tb.calls == [("add_scalar", ("reward/mean", 0.5), {"global_step": 3}),
                        ("add_scalar", ("step", 3.0), {"global_step": 3})]
    run = Recorder()
    sink = WandbSink(run)
    sink.log(m, step=3)
    sink.close()
    assert run.calls == [("log", ({"reward/mean": 0.5, "step": 3.0},), {"step": 3}), ("finish", (), {})]


def test_a_run_validated_before_training_reports_the_accuracy_change(tmp_path):
    # trainer.val_before_train writes a step-0 record holding only the validation
    run = make_run(tmp_path / "run", steps=10, val_every=5)  # val/score 0.5 at step 5, 1.0 at step 10
    with open(run / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 0, "val/score": 0.125, "val/reward_mean": 0.2}) + "\n")
    write_report(run)
    summary = (run / "report" / "summary.txt").read_text()
    assert "greedy accuracy (val/score) on the held-back test prompts: 12.5% before training -> 100.0% " \
           "after step 10 (+87.5 points)" in summary
    assert "median step time: 8.35 s" in summary  # the step-0 record has no timings to skew it


def test_the_report_says_how_many_prompts_the_accuracy_is_out_of(tmp_path):
    """A run's validations record their prompt count (val/prompts): `tinyrl report` said "on the
    held-back test prompts" where the end of `train` said "on 64 held-back test prompts"."""
    run = make_run(tmp_path / "run", steps=10, val_every=5)
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    with open(run / "metrics.jsonl", "w") as f:
        for m in [{"step": 0, "val/score": 0.125, "val/reward_mean": 0.2, "val/prompts": 64}] + recs:
            f.write(json.dumps({**m, "val/prompts": 64} if "val/score" in m else m) + "\n")
    write_report(run)
    assert "greedy accuracy (val/score) on 64 held-back test prompts: 12.5% before training -> 100.0% " \
           "after step 10" in (run / "report" / "summary.txt").read_text()


def test_no_step_zero_validation_no_accuracy_change_line(tmp_path):
    from tinyrl.report import accuracy_change

    recs = load_metrics(make_run(tmp_path / "run", steps=10, val_every=5), [])
    assert accuracy_change(recs) is None  # first validation at step 5 is not "before training"
    assert accuracy_change([{"step": 0, "val/score": 0.5}]) is None  # nothing after it yet
    assert "(-25.0 points)" in accuracy_change([{"step": 0, "val/score": 0.5}, {"step": 3, "val/score": 0.25}])


def test_a_run_without_a_step_zero_validation_ends_with_its_last_one():
    """`tinyrl sft --preset countdown-demo-sft` ended with "run finished at step 300" alone: its
    accuracy was only in the dashboard's last frame (a new user's note)."""
    from tinyrl.report import last_validation

    recs = [{"step": 5, "val/score": 0.25, "val/loss": 1.5, "val/prompts": 256}, {"step": 6},
            {"step": 10, "val/score": 0.0859, "val/loss": 1.25, "val/prompts": 256}]
    assert last_validation(recs) == "greedy accuracy (val/score) on 256 held-back test prompts: 8.6% at step 10"
    assert last_validation([{"step": 3, "val/loss": 0.75}]) == "validation loss (val/loss) at step 3: 0.7500"
    assert last_validation([{"step": 3, "sft/loss": 0.75}]) is None


def test_the_timings_plot_leaves_out_the_step_zero_validation():
    """The demo's timings.png began with a step 0 of 0 s (its val_before_train record, which times
    nothing): a ramp from 0 up to step 1's seconds, at a step that trained nothing."""
    from tinyrl.report import timing_stacks

    recs = [{"step": 0, "val/score": 0.16},
            {"step": 1, "timing/rollout": 0.4, "timing/actor_update": 1.5, "timing/step": 2.0},
            {"step": 2, "timing/rollout": 0.5, "timing/actor_update": 1.2, "timing/step": 1.8, "val/score": 0.2}]
    phases, xs, stacks = timing_stacks(recs)
    assert phases == ["rollout", "actor_update"] and xs == [1, 2]
    assert stacks == [[0.4, 0.5], [1.5, 1.2]]


def test_an_sft_runs_summary_has_its_greedy_accuracy_when_it_measured_one():
    """countdown-demo-sft validates greedily (sft.val_generate): its val_score.png was drawn, but
    summary.txt gave the loss only, not the 16.4% that the RL demo then starts from."""
    from tinyrl.report import summarize

    recs = [{"step": 1, "sft/loss": 2.5}, {"step": 300, "sft/loss": 0.42, "val/loss": 0.39, "val/score": 0.164}]
    lines = summarize(recs, None)
    assert "final val loss: 0.3900 (step 300)" in lines
    assert "final val score: 0.1640 (step 300)" in lines
    assert not any("val score" in line for line in summarize(recs[:1] + [{"step": 2, "sft/loss": 1.0}], None))


def test_a_score_judged_by_a_users_reward_fn_says_so():
    """A user's reward.fn that gives 1.0 for any `<answer>` tag read "greedy accuracy ... 100.0%"
    at the run's end and in summary.txt, with nothing saying that it was not the task's judgement."""
    from tinyrl.report import judged_by, summarize

    recs = [{"step": 1, "reward/mean": 0.5, "val/score": 1.0}]
    own = {"preset": "countdown-tiny", "task": {"name": "countdown"}, "reward": {"fn": "my_reward.py:score"}}
    said = "val/score judged by reward.fn = my_reward.py:score (solved: a score >= 1), not the countdown task's reward"
    assert judged_by(own) == said and said in summarize(recs, own)
    for fn in ("task", "countdown", "math"):  # a task's own reward judges: nothing to say
        assert judged_by({**own, "reward": {"fn": fn}}) is None
    assert judged_by(None) is None and judged_by({"preset": "x"}) is None


def test_the_step_count_leaves_out_the_validation_before_training():
    """The demo's summary said "steps: 61 recorded, step 0 to 60" for its 60 steps."""
    from tinyrl.report import steps_line

    recs = [{"step": 0, "val/score": 0.16, "val/reward_mean": 0.2}] + \
        [{"step": s, "reward/mean": 0.1} for s in range(1, 61)]
    assert steps_line(recs) == "steps: 60 recorded, step 1 to 60 (and a validation before training, step 0)"
    assert steps_line(recs[1:]) == "steps: 60 recorded, step 1 to 60"
    assert steps_line(recs[:1]) == "steps: none trained (and a validation before training, step 0)"


def test_a_ctrl_c_while_plotting_leaves_the_last_report_whole(tmp_path):
    """SIGINT while the plots were drawn ended silently (Typer's exit 130) with the new first plot
    beside the last report's summary.txt; now it says so in one line and changes nothing there."""
    from helpers.busy_child import interrupt_when_busy

    run = make_run(tmp_path / "run")
    files = write_report(run)
    for path in files:  # the last report, told apart from anything this run would draw
        path.write_bytes(b"the last report")
    done = interrupt_when_busy("tinyrl.report:_save", 1, ["report", str(run)], tmp_path / "busy")
    assert done.returncode == 130, done.stderr[-3000:]
    said = done.stderr.strip()
    assert said == (f"stopped by SIGINT (Ctrl-C) while writing the report of {run}; no plot or summary "
                    f"in {run / 'report'} was changed"), said
    assert all(path.read_bytes() == b"the last report" for path in files)
    assert sorted(p.name for p in (run / "report").iterdir()) == sorted([REPORT_MARK] + [p.name for p in files])


def test_the_median_step_time_is_the_one_estimate_cost_prices_with(tmp_path):
    """report gave the median of every step, estimate-cost --from-run that of the steady ones (the
    first step, and the first after a resume, left out): two figures for one run. A slow first
    step and a resumed run whose first step after the resume is slow again."""
    import subprocess
    import sys

    from tinyrl.cost import read_run

    run = tmp_path / "run"
    run.mkdir()
    times = {1: 60.0, 2: 8.0, 3: 9.0, 4: 10.0, 5: 11.0}
    lines = [{"step": s, "timing/step": t, "reward/mean": 0.1} for s, t in times.items()]
    lines += [{"step": 5, "timing/step": 70.0, "reward/mean": 0.1},  # resumed from step 4: 5 again, slow
              {"step": 6, "timing/step": 12.0, "reward/mean": 0.1}]
    # steady: 8, 9, 10, 11, 12 -> 10.0; the report's old median of the steps it keeps (step 5's
    # last record): 60, 8, 9, 10, 70, 12 -> 11.0
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    (run / "config.json").write_text(json.dumps({"preset": "countdown-tiny"}))
    write_report(run)
    summary = (run / "report" / "summary.txt").read_text()
    assert read_run(run).sec_per_step == 10.0
    assert "median step time: 10.00 s over 5 steps (warm-up steps 1, 5 left out, as estimate-cost " \
           "--from-run does)" in summary, summary
    priced = subprocess.run([sys.executable, "-m", "tinyrl.cli", "estimate-cost", "--from-run", str(run),
                             "--prompts-per-epoch", "64", "--json"], capture_output=True, text=True, timeout=120)
    assert priced.returncode == 0 and json.loads(priced.stdout)["sec_per_step"] == 10.0, priced.stderr
    short = tmp_path / "short"
    short.mkdir()
    (short / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines[:2]))
    write_report(short)
    assert "median step time: 34.00 s over all 2 steps (too few to leave out warm-up)" in \
        (short / "report" / "summary.txt").read_text()


def test_a_closed_stdout_is_no_traceback(tmp_path):
    """`tinyrl report RUN | head -1`: the pipe's reader ends; the report is written all the same and
    nothing is said (a closed stdout stops a training loop, saved; other commands just go on)."""
    import subprocess
    import sys

    run = make_run(tmp_path / "run")
    proc = subprocess.Popen([sys.executable, "-m", "tinyrl.cli", "report", str(run)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # gone before the first line: every write to stdout meets EPIPE
    err = proc.communicate(timeout=300)[1]
    assert proc.returncode == 0 and "Traceback" not in err, err
    assert (run / "report" / "summary.txt").is_file()


def test_a_run_under_way_is_said_so_not_called_stopped_or_final(tmp_path):
    """A walk: `tinyrl report` on a run before its step 1 ended said "no metrics file ... give the
    run directory that tinyrl train wrote" (or, with an empty metrics.jsonl, that the run stopped
    before its first step); during the run, summary.txt said "final val score: none" and nothing
    said the run was still going. A real lock, held by another process's rundir.claim."""
    from tinyrl.rundir import other_holder

    run = tmp_path / "run"
    holder = hold_run_lock(run)
    try:
        assert other_holder(run).startswith(f"{holder.pid} tinyrl train since ")
        with pytest.raises(TinyRLError, match="is a run under way") as exc:
            write_report(run)  # no metrics.jsonl yet (nor config.json)
        assert f"pid {holder.pid}" in exc.value.message and "after step 1" in exc.value.hint
        (run / "metrics.jsonl").write_text("")
        with pytest.raises(TinyRLError, match="is a run under way") as exc:
            write_report(run)
        make_run(run, steps=3, val_every=5)  # 3 steps logged, no validation yet
        summary = (run / "report" / "summary.txt").read_text() if write_report(run) else ""
        assert f"run in progress (pid {holder.pid}, tinyrl train since " in summary
        assert "3 steps so far" in summary and "final val" not in summary
        assert "latest val score: none (no validation step so far)" in summary
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert other_holder(run) is None  # it ended: the lock file stays, held by no one
    summary = (run / "report" / "summary.txt").read_text() if write_report(run) else ""
    assert "in progress" not in summary and "final val score: none (no validation steps)" in summary


def test_median_throughput_leaves_out_the_warm_up_the_step_time_leaves_out(tmp_path):
    """summary.txt's median step time left out warm-up step 1 while its median throughput took
    every step, the slow first one's low tokens/s included: one rule for both now. Steps 1-5 at
    100, 1000, 1100, 1200, 1300 tokens/s: steady median 1150 (all five: 1100); one step: said so."""
    from tinyrl.report import summarize

    run = tmp_path / "run"
    run.mkdir()
    tps = {1: 100.0, 2: 1000.0, 3: 1100.0, 4: 1200.0, 5: 1300.0}
    recs = [{"step": s, "timing/step": 10.0 if s > 1 else 60.0, "perf/tokens_per_s": t} for s, t in tps.items()]
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in recs))
    lines = summarize(load_metrics(run, []), None, run)
    assert "median step time: 10.00 s over 4 steps (warm-up step 1 left out, as estimate-cost --from-run does)" \
        in lines, lines
    assert "median throughput: 1,150 tokens/s (warm-up left out, as for the step time)" in lines, lines
    (run / "metrics.jsonl").write_text(json.dumps(recs[0]) + "\n")
    lines = summarize(load_metrics(run, []), None, run)
    assert "median step time: 60.00 s over 1 step (too few to leave out warm-up)" in lines, lines
    assert "median throughput: 100 tokens/s over 1 step (too few to leave out warm-up)" in lines, lines


def test_val_score_axis_spans_0_to_1_and_step_axes_take_whole_steps(tmp_path):
    """val_score.png with one validation point had a y axis of -0.04..0.04 and x ticks at 2.96,
    2.98, ...: a share of prompts is drawn on 0..1, and a step axis (every plot by step, _save)
    ticks at whole steps only."""
    from matplotlib.figure import Figure

    from tinyrl import report

    drawn = []

    class Kept(Figure):  # the figure _save draws, kept to look at its axes
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            drawn.append(self)

    import matplotlib

    recs = [{"step": 3.0, "val/score": 0.0, "reward/mean": 0.5}]
    for name in ("val_score.png", "reward.png"):
        report._save(Kept, matplotlib, report.PLOTS[name][1], recs, tmp_path / name)
    val_ax, reward_ax = (fig.axes[0] for fig in drawn)
    low, high = val_ax.get_ylim()
    assert low < 0.0 < 1.0 < high and high - low < 1.1, (low, high)
    for ax in (val_ax, reward_ax):
        ticks = list(ax.get_xticks())
        assert ticks and all(float(t).is_integer() for t in ticks), ticks


def test_a_one_step_run_and_a_run_s_file_are_said_plainly(tmp_path):
    """A walk: "steps: 1 recorded, step 1 to 1", and `tinyrl report runs/x/metrics.parquet` said
    "run directory is a file, not a run directory" without naming the directory to give."""
    from tinyrl.report import steps_line

    assert steps_line([{"step": 1.0, "reward/mean": 0.5}]) == "steps: 1 recorded, step 1"
    assert steps_line([{"step": 1.0, "reward/mean": 0.5}, {"step": 2.0, "reward/mean": 0.5}]) == \
        "steps: 2 recorded, step 1 to 2"
    make_run(tmp_path / "run", steps=2)
    (tmp_path / "run" / "metrics.parquet").write_bytes(b"PAR1")
    with pytest.raises(TinyRLError, match="metrics.parquet is a file; give the run's directory") as exc:
        write_report(tmp_path / "run" / "metrics.parquet")
    assert exc.value.hint == f"tinyrl report {tmp_path / 'run'}"
