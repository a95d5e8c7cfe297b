"""The CLI as a new user meets it: help, presets, data, and one-screen errors with exit code 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pandas as pd
import pytest

ENV = {**os.environ, "COLUMNS": "160"}


def tinyrl(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tinyrl.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=ENV)


def test_help_teaches_the_commands():
    done = tinyrl("--help")
    assert done.returncode == 0
    for command in ("presets", "data", "train", "probe-memory", "estimate-cost", "report", "export"):
        assert command in done.stdout, command


def test_help_shows_flags_bare_and_names_what_an_argument_is():
    """Typer 0.29 printed `--resume <bool>`, read as taking a value (`--resume true` failed), and
    `Usage: tinyrl eval [OPTIONS] {target}`; a paragraph kept its source line breaks."""
    said = {command: " ".join(tinyrl(*command.split(), "--help").stdout.replace("│", " ").split())
            for command in ("train", "sft", "eval", "doctor", "presets show", "report")}
    for command, text in said.items():
        assert "<bool>" not in text and "--help Show this message" in text, command
    assert "--resume Continue from the latest checkpoint" in said["train"]
    assert "--greedy --no-greedy Also one greedy" in said["eval"]
    assert "<int>" in said["eval"]  # an option that takes a value keeps its type
    assert "eval [OPTIONS] {RUN_DIR|MODEL}" in said["eval"] and "{RUN_DIR}" in said["report"]
    assert "{NAME}" in said["presets show"]


def test_tasks_prints_each_data_command_whole_on_an_80_column_terminal():
    """retool's command was cut to "hf:BytedTsinghua-SI…" at 80 columns: not a command to copy."""
    from tinyrl.tasks import all_tasks

    done = subprocess.run([sys.executable, "-m", "tinyrl.cli", "tasks"], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "COLUMNS": "80"})
    assert done.returncode == 0 and "…" not in done.stdout
    rows = [line.split("│") for line in done.stdout.splitlines() if line.count("│") == 5]
    cells = "".join("".join(row[4].split()) for row in rows)  # the data column, read down
    for task in all_tasks().values():
        assert "".join(task.data_hint.split()) in cells, task.data_hint
    assert "--set 'task.extra_tools=[\"file.py:NAME\"]'" in done.stdout  # a tool of one's own, with the shell's quotes


def test_readmes_commands_table_has_every_data_command():
    """`tinyrl data arith` (the tool demo's data) was missing from README's Commands table."""
    from pathlib import Path

    from tinyrl.tasks import all_tasks

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    table = readme.split("## Commands", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `tinyrl data ")]
    assert [name for name in all_tasks() if not any(r.startswith(f"| `tinyrl data {name} ") for r in rows)] == []


def test_readme_names_every_task_field_a_new_task_must_give():
    """A user writing a task had to read tasks/base.py and arith.py to learn which fields it must set."""
    import dataclasses
    from pathlib import Path

    from tinyrl.tasks.base import Task

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = " ".join(readme.split("\n## Tasks", 1)[1].split("\n## ", 1)[0].split())
    required = [f.name for f in dataclasses.fields(Task)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    said = section.split("these fields have no default:", 1)[1].split("the rest", 1)[0]
    assert [name for name in required if f"`{name}`" not in said] == [] and len(required) >= 7, required


def test_train_help_names_every_estimator_and_where_the_keys_are():
    """It said "PPO (+ critic) or GRPO": dr_grpo, rloo and reinforce_pp, and the key that picks
    one, were nowhere in it."""
    from tinyrl.roles import ESTIMATORS

    done = tinyrl("train", "--help")
    assert done.returncode == 0
    text = " ".join(done.stdout.replace("│", " ").split())
    assert "algorithm.adv_estimator" in text and "tinyrl presets show NAME" in text
    for name in ESTIMATORS:
        assert name in text, name


def test_presets_list_and_show():
    listed = tinyrl("presets")
    assert listed.returncode == 0
    for name in ("countdown-tiny", "countdown-4090", "countdown-0.5b-4090", "countdown-grpo-4090"):
        assert name in listed.stdout
    # each preset with its command: the footer said `tinyrl train --preset NAME` of SFT presets too
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in listed.stdout.splitlines()
            if line.startswith("│") and line.split("│")[1].strip()}
    assert rows["countdown-demo-sft"] == "tinyrl sft" and rows["countdown-demo"] == "tinyrl train"
    assert rows["retool-sft-4090"] == "tinyrl sft"
    shown = tinyrl("presets", "show", "countdown-4090", "--json", "--set", "actor.lr=3e-6")
    cfg = json.loads(shown.stdout)
    assert cfg["model"]["name"] == "Qwen/Qwen2.5-3B" and cfg["actor"]["lr"] == 3e-6
    text = tinyrl("presets", "show", "countdown-4090").stdout
    assert "[rollout.vllm]" in text and "sleep_level = 1" in text


def test_wrong_set_key_is_one_screen_and_exit_2():
    done = tinyrl("presets", "show", "countdown-4090", "--set", "actor.lrr=1e-6")
    assert done.returncode == 2
    assert "actor.lrr" in done.stderr and "did you mean actor.lr" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) < 25
    train = tinyrl("train", "--preset", "countdown-tiny", "--set", "rollout.nn=2")
    assert train.returncode == 2 and "rollout.n" in train.stderr
    # every problem at once, a wrong key's and a wrong value's together (presets show listed the
    # first kind only until 2026-11-26, so a user fixed them in two rounds)
    both = tinyrl("presets", "show", "countdown-4090", "--set", "actor.lrr=1e-6", "--set", "trainer.max_steps=-1")
    assert both.returncode == 2 and "2 problems" in both.stderr and "trainer.max_steps = -1" in both.stderr
    # a value problem alone: the config printed in full, its problems said, exit 2 (was 0), JSON too
    for fmt in ([], ["--json"]):
        bad = tinyrl("presets", "show", "countdown-4090", *fmt, "--set", "trainer.max_steps=-1")
        assert bad.returncode == 2 and "trainer.max_steps = -1" in bad.stderr, bad.stderr
        assert "refuses this config" in bad.stderr and "what to do: fix each as it says (a setting: with --set" in bad.stderr
        assert ('"rollout": {' if fmt else "[rollout.vllm]") in bad.stdout


def test_a_key_set_twice_is_refused_naming_both_values():
    """`--set rollout.n=-1 --set rollout.n=abc` reported a problem for each value, as if both
    were set; which one the user meant is not ours to guess. Then it was refused alone, hiding
    every other problem of the command line: now said with them."""
    done = tinyrl("presets", "show", "countdown-tiny", "--set", "rollout.n=-1", "--set", "rollout.n=abc",
                  "--set", "trainer.max_steps=-1", "--set", "actor.lrr=1")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    text = " ".join(done.stderr.replace("│", " ").split())
    assert "rollout.n is given 2 times: --set rollout.n=-1, --set rollout.n=abc" in text, text
    assert "must be int" not in text and "rollout.n = -1" not in text  # neither value is judged
    assert "3 problems" in text and "trainer.max_steps = -1" in text and "actor.lr" in text, text
    assert "a key given twice is refused" in " ".join(tinyrl("train", "--help").stdout.replace("│", " ").split())


def test_a_program_layers_its_settings_over_a_users_without_repeating_a_key():
    from tinyrl.config import layered, repeated_sets

    merged = layered(["trainer.max_steps=9", "actor.lr=1e-3"], ["trainer.max_steps=2", "trainer.test_every=0"])
    assert merged == ["actor.lr=1e-3", "trainer.max_steps=2", "trainer.test_every=0"]
    assert repeated_sets(merged) == []
    from pathlib import Path

    from tinyrl.doctor.bench import bench_command  # its child `tinyrl train` gets each key once

    args = bench_command("countdown-tiny", ["trainer.test_every=5"], 2, Path("run"), [])
    sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    assert repeated_sets(sets) == [] and "trainer.test_every=0" in sets


def test_debug_shows_the_traceback():
    done = subprocess.run([sys.executable, "-m", "tinyrl.cli", "presets", "show", "nope"], capture_output=True,
                          text=True, env={**ENV, "TINYRL_DEBUG": "1"})
    assert done.returncode == 2 and "Traceback" in done.stderr


def test_data_countdown_writes_tinyzero_parquet(tmp_path):
    done = tinyrl("data", "countdown", "--out", str(tmp_path), "--train-size", "50", "--test-size", "10",
                  "--template", "qwen-instruct")
    assert done.returncode == 0, done.stderr
    train = pd.read_parquet(tmp_path / "train.parquet")
    assert len(train) == 50 and len(pd.read_parquet(tmp_path / "test.parquet")) == 10
    assert train.iloc[0]["prompt"][0]["content"].startswith("<|im_start|>system")


@pytest.mark.parametrize("task", ["countdown", "arith", "math", "retool"])
def test_wrote_lines_name_each_path_whole_in_a_narrow_terminal(tmp_path, task):
    """`tinyrl data NAME` says where it wrote. Rich wrapped that line at the console's width, inside a
    long path ("dapo-math-17k.par" / "quet"), and read "[...]" in a path as markup and dropped it: the
    path the user copies from the line was not the file."""
    from typer.testing import CliRunner

    from tinyrl.cli import app

    out = tmp_path / "a-rather-long-directory-name-for-the-data" / "[run 1]"
    sft = ["--sft"] if task in ("countdown", "arith") else []
    done = CliRunner().invoke(app, ["data", task, "--out", str(out), "--train-size", "8", "--test-size", "4", *sft],
                              env={"COLUMNS": "40"})
    assert done.exit_code == 0, done.output
    names = ["train.parquet", "test.parquet"] + (["sft_train.parquet", "sft_test.parquet"] if sft else [])
    wrote = [line for line in done.output.splitlines() if line.startswith("wrote ")]
    assert len(wrote) == (2 if sft else 1), done.output
    for name in names:
        assert (out / name).is_file()
        assert any(f"{out / name} (" in line or f"{out / name} and" in line for line in wrote), (name, done.output)


def test_export_verl_names_its_bracketed_out_whole(tmp_path, monkeypatch):
    """The line export-verl ends with is markup ([bold] around the command); --out "[v 1]" vanished
    from it, so the command it told the user to run named another directory."""
    from typer.testing import CliRunner

    from tinyrl.cli import app

    monkeypatch.chdir(tmp_path)
    done = CliRunner().invoke(app, ["export-verl", "--preset", "countdown-tiny", "--out", "[v 1]"],
                              env={"COLUMNS": "40"})
    assert done.exit_code == 0, done.output
    assert (tmp_path / "[v 1]" / "run_verl.sh").is_file()
    assert "wrote [v 1]/run_verl.sh" in done.output and "run bash [v 1]/run_verl.sh where" in done.output, done.output


def test_broken_training_data_is_exit_2_and_names_the_file(tmp_path):
    bad = tmp_path / "train.parquet"
    bad.write_bytes(b"not a parquet file")
    done = tinyrl("train", "--preset", "countdown-tiny", "--out", str(tmp_path / "run"),
                  "--set", f"data.train_path={bad}", "--no-dashboard")
    assert done.returncode == 2 and "train.parquet" in done.stderr and "Traceback" not in done.stderr
    pd.DataFrame({"prompt": ["x"]}).to_parquet(bad)
    done = tinyrl("train", "--preset", "countdown-tiny", "--out", str(tmp_path / "run2"),
                  "--set", f"data.train_path={bad}", "--no-dashboard")
    assert done.returncode == 2 and "reward_model" in done.stderr


def test_existing_run_is_not_overwritten(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    done = tinyrl("train", "--preset", "countdown-tiny", "--out", str(run), "--no-dashboard")
    said = " ".join(done.stderr.split())
    assert done.returncode == 2 and "--resume" in said and "it has no checkpoint" in said
    assert (run / "metrics.jsonl").read_text() == '{"step": 1}\n'
    # a finished run met again (the demos' shared SFT run): what it holds, and how to use it as it is
    for step in (300, 30):
        (run / "checkpoints" / f"step_{step:07d}").mkdir(parents=True)
        (run / "checkpoints" / f"step_{step:07d}" / "state.pt").write_bytes(b"kept")
    done = tinyrl("sft", "--preset", "countdown-demo-sft", "--out", str(run), "--no-dashboard")
    said = " ".join(done.stderr.split())
    assert done.returncode == 2 and "its last checkpoint is step 300" in said
    assert f"--set model.init_from={run}" in said
    assert (run / "checkpoints" / "step_0000300" / "state.pt").read_bytes() == b"kept"
    assert sorted(p.name for p in run.rglob("*")) == [  # as it was: not even a lock file left
        "checkpoints", "metrics.jsonl", "state.pt", "state.pt", "step_0000030", "step_0000300"]


def test_prompts_longer_than_the_limit_are_exit_2(tmp_path, countdown_train):
    done = tinyrl("train", "--preset", "countdown-tiny", "--out", str(tmp_path / "run"), "--no-dashboard",
                  "--set", f"data.train_path={countdown_train(64)}",
                  "--set", "data.max_prompt_length=50")
    assert done.returncode == 2
    assert "longer than data.max_prompt_length = 50" in " ".join(done.stderr.split())
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_library_deprecation_notices_are_hidden_in_every_command_ours_are_not(tmp_path):
    """transformers 5.24 (what README's first command installs) warns when peft merges a run for
    `tinyrl export` and `tinyrl eval`: a FutureWarning no user can act on. The CLI's entry point
    hides transformers' own FutureWarnings for every command, and only those."""
    code = textwrap.dedent("""
        import sys, warnings
        import tinyrl.export

        def merged(run_dir, out_dir, overwrite=False, dtype="float32"):  # where peft's merge warns through transformers
            warnings.warn_explicit("LIBRARY-NOTICE", FutureWarning, "modeling_utils.py", 1,
                                   module="transformers.modeling_utils")
            warnings.warn_explicit("TINYRL-NOTICE", FutureWarning, "export.py", 1, module="tinyrl.export")
            return out_dir

        tinyrl.export.export_run = merged
        tinyrl.export.weights_on_disk = lambda model_dir: "no weights"
        from tinyrl.cli import main
        sys.argv = ["tinyrl", "export", "some-run", "--out", "some-out"]
        main()
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=ENV,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "TINYRL-NOTICE" in done.stderr and "LIBRARY-NOTICE" not in done.stderr


def test_a_preset_runs_only_under_its_own_command_and_nothing_is_written(tmp_path):
    """`tinyrl train` on an SFT preset ran PPO with a critic on its supervised rows (and wrote an RL
    prompt file where `tinyrl sft` then expects prompt/response rows); `tinyrl sft` on an RL preset
    fine-tuned on prompts without responses. Each is refused, exit 2, before anything is written."""
    from tinyrl.config import list_presets, load_config

    commands = {name: load_config(name, check=False).command for name in list_presets()}
    assert {"countdown-demo-sft", "countdown-tiny-sft", "countdown-tools-demo-sft", "retool-sft-4090"} == \
        {name for name, command in commands.items() if command == "sft"}
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    for command, preset, says in (("train", "countdown-tiny-sft", "tinyrl sft --preset countdown-tiny-sft"),
                                  ("sft", "countdown-tiny", "tinyrl train --preset countdown-tiny")):
        done = subprocess.run([sys.executable, "-m", "tinyrl.cli", command, "--preset", preset, "--out",
                               str(tmp_path / command), "--no-dashboard", "--max-steps", "1"],
                              capture_output=True, text=True, timeout=300, env=ENV, cwd=cwd)
        assert done.returncode == 2, done.stderr
        assert says in " ".join(done.stderr.split()) and "Traceback" not in done.stderr
        assert not (tmp_path / command).exists() and not any(cwd.iterdir())  # no run dir, no generated data


def test_max_steps_ends_the_run_there_before_or_past_the_presets_end(tmp_path):
    """--max-steps N ends at step N even past trainer.max_steps, and `--resume --max-steps M` takes
    a finished run further (it ended at once, silently, until 2026-11-26)."""
    from tinyrl import jsonl

    run = tmp_path / "run"
    base = ["train", "--preset", "countdown-tiny", "--out", str(run), "--no-dashboard",
            "--set", "trainer.max_steps=1", "--set", "trainer.test_every=0", "--set", "trainer.train_batch_size=8",
            "--set", "actor.ppo_mini_batch_size=8", "--set", "critic.ppo_mini_batch_size=8",
            "--set", "rollout.max_response_length=16"]
    first = tinyrl(*base, "--max-steps", "2")
    assert first.returncode == 0, first.stderr
    assert "run finished at step 2" in first.stdout
    # piped, the waits are said in lines; a CPU run has no card or memory plan to check
    assert "checking the disk and RAM ..." in first.stderr and "checking the card" not in first.stderr
    assert "preparing countdown-tiny: model tinyrl/tiny-qwen2" in first.stderr
    more = tinyrl(*base, "--resume", "--max-steps", "3")
    assert more.returncode == 0, more.stderr
    assert [m["step"] for m in jsonl.read_records(run / "metrics.jsonl")] == [1, 2, 3]
    logs = ("metrics.jsonl", "samples.jsonl", "timeline.jsonl", "metrics.parquet")
    before = {name: (run / name).read_bytes() for name in logs}
    behind = tinyrl(*base, "--resume", "--max-steps", "2")  # an end behind the checkpoint: said, not silent
    assert behind.returncode == 0 and "run finished at step 3 (it was there already: the end, step 2, is behind " \
        "it; nothing was trained)" in " ".join(behind.stdout.split()), behind.stdout
    assert {name: (run / name).read_bytes() for name in logs} == before  # nothing trained, no log changed
    # each saved step's checkpoint keeps its row through both resumes (a resume from step N cut the
    # row of N's checkpoint, filed under N + 1, until 2026-11-28)
    timeline = jsonl.read_records(run / "timeline.jsonl")
    assert [r["step"] for r in timeline if r["phase"] == "checkpoint"] == [2, 3]
    assert {r["step"] for r in timeline if r["phase"] == "rollout"} == {1, 2, 3}


def test_resume_of_a_directory_without_a_run_writes_nothing(tmp_path):
    """`--resume --out NEW` (a mistyped run directory) was refused only after NEW was created and
    claimed: NEW/.tinyrl.lock stayed behind, and the next look at NEW found a directory."""
    new = tmp_path / "NEW"
    for command, preset in (("train", "countdown-tiny"), ("sft", "countdown-tiny-sft")):
        done = tinyrl(command, "--preset", preset, "--resume", "--out", str(new), "--no-dashboard")
        assert done.returncode == 2 and "holds no run (no such directory)" in done.stderr, done.stderr
        assert not new.exists()
