"""What a new user sees on a first run (issue 29 item 6): progress while the tiny model builds,
first-use data generation as an info line, SFT lines without empty fields, the help's demo,
the validation plot's axis, a disk warning printed once."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd

from helpers import small_disk
from tinyrl.config import list_presets, load_config

ENV = {**os.environ, "COLUMNS": "160"}
TEST_DATA = Path(__file__).resolve().parent.parent / "data" / "countdown" / "test.parquet"


def test_tiny_model_build_shows_its_progress_through_the_cli_logging(tmp_path):
    """The CLI's own log setup, a real (short) build: the user sees what runs, step by step;
    the trainer's INFO lines (which the dashboard shows) stay hidden."""
    code = textwrap.dedent(f"""
        import logging
        from tinyrl.cli.common import log_to_stderr
        from tinyrl.tiny_model import PROGRESS_LINES, build_tiny_model
        log_to_stderr()
        build_tiny_model({str(tmp_path)!r}, warmup_steps=8)
        logging.getLogger("tinyrl.trainer").info("TRAINER-INFO")
        print(PROGRESS_LINES)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=300)
    assert done.returncode == 0, done.stderr
    text = done.stderr
    assert "building the tiny model (first use" in text and "tokenizer trained" in text
    assert text.count("warm-up step") == int(done.stdout.split()[-1]) and "warm-up step 8/8" in text
    assert "built tiny model in" in text and "TRAINER-INFO" not in text
    assert "WARNING" not in text
    assert "Writing model shards" not in text and "\r" not in text  # transformers' bar, piped: a raw \r line


def test_a_hub_retry_warning_is_printed_once_through_the_cli_logging():
    """Offline, a Hub model's load retries ten times; each "Retrying in" line came out twice (the
    hub's own handler, then ours). A real retry of huggingface_hub's HTTP layer, to a closed port."""
    code = textwrap.dedent("""
        from tinyrl.cli.common import log_to_stderr
        log_to_stderr()
        from huggingface_hub.utils._http import http_backoff
        try:
            http_backoff("HEAD", "http://127.0.0.1:9/config.json", max_retries=1, base_wait_time=0.01)
        except Exception as exc:
            print(type(exc).__name__)
    """)
    online = {k: v for k, v in ENV.items() if k != "HF_HUB_OFFLINE"}  # set, the hub refuses before any retry
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=online, timeout=120)
    assert done.returncode == 0 and done.stdout.strip(), done.stderr
    assert done.stderr.count("Retrying in") == 1, done.stderr
    assert "WARNING" in done.stderr  # through the CLI's handler, not only the hub's raw one


def test_first_use_data_generation_is_an_info_line(tmp_path, monkeypatch, caplog):
    from tinyrl import setup

    path = tmp_path / "data" / "train.parquet"
    monkeypatch.setattr(setup, "generated_paths", lambda: {str(path)})  # as a preset's own path
    cfg = load_config("countdown-tiny", [f"data.train_path={path}", "data.generate_train_size=32"])
    with caplog.at_level(logging.INFO, logger="tinyrl.setup"):
        assert setup.ensure_train_data(cfg) == path and len(pd.read_parquet(path)) == 32
    said = [r for r in caplog.records if r.name == "tinyrl.setup" and "generating" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.INFO]
    from tinyrl.cli.common import PROGRESS_LOGGERS

    assert "tinyrl.setup" in PROGRESS_LOGGERS  # and the CLI shows it



def test_piped_first_use_data_generation_is_one_plain_line(tmp_path):
    """`tinyrl train ... 2>&1 | cat`: the CLI's log line came out through Rich, padded with spaces
    to the console's width and wrapped there ('INFO     generating 32 countdown tasks into' and
    the path on a second line)."""
    path = tmp_path / "data" / "train.parquet"
    code = textwrap.dedent(f"""
        from pathlib import Path
        from tinyrl import setup
        from tinyrl.cli.common import log_to_stderr
        from tinyrl.config import load_config
        log_to_stderr()
        path = Path({str(path)!r})
        setup.generated_paths = lambda: {{str(path)}}  # as a preset's own path
        setup.ensure_train_data(load_config("countdown-tiny", [f"data.train_path={{path}}", "data.generate_train_size=32"]))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**ENV, "COLUMNS": "80"})
    assert done.returncode == 0, done.stderr
    # and nothing else: the tasks' progress bar, a terminal's alone, left an empty line in a pipe
    assert done.stderr == f"INFO generating 32 countdown tasks into {path} (first use, once)\n", repr(done.stderr)

def test_piped_sft_lines_hold_only_the_figures_that_exist():
    from rich.console import Console

    from tinyrl.dashboard import Dashboard

    buffer = io.StringIO()
    base = {"sft/loss": 1.5, "sft/lr": 1e-3, "sft/grad_norm": 0.5, "timing/step": 0.2, "perf/tokens_per_s": 900.0,
            "memory/kind": "rss", "memory/used_bytes": 2**30, "memory/total_bytes": 2**32, "epoch": 0}
    with Dashboard({"algorithm": "sft", "total_steps": 3}, mode="plain",
                   console=Console(file=buffer, width=300)) as dash:
        dash.update({**base, "step": 1})
        dash.update({**base, "step": 2, "val/loss": 0.9, "val/score": 0.125})
        dash.update({**base, "step": 3})
    first, second, third = buffer.getvalue().splitlines()
    assert "val" not in first and "–" not in first  # nothing measured yet: nothing printed
    assert "val loss 0.9000 | val score 0.125" in second
    # both hold until the next validation (the score said "val score –" on the steps between, in
    # the live view too, where the RL line and the loss held theirs)
    assert "val loss 0.9000 | val score 0.125" in third


def test_help_and_presets_call_countdown_demo_the_cpu_demo():
    done = subprocess.run([sys.executable, "-m", "tinyrl.cli", "--help"], capture_output=True, text=True,
                          env=ENV, timeout=120)
    text = " ".join(done.stdout.replace("│", " ").split())
    assert "CPU demo" in text and "tinyrl sft --preset countdown-demo-sft && tinyrl train --preset countdown-demo" in text
    assert "--preset countdown-tiny" not in text
    for name in list_presets():  # only the demo README runs may call itself "the CPU demo"
        description = load_config(name, check=False).description
        assert not description.startswith("CPU demo") or name.startswith("countdown-demo"), (name, description)


def test_val_score_plot_says_what_val_score_is():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tinyrl import report

    fig, ax = plt.subplots()
    report._plot_val(ax, [{"step": 0, "val/score": 0.1}, {"step": 5, "val/score": 0.3}])
    label = ax.get_ylabel()
    plt.close(fig)
    assert label == report.VAL_SCORE_MEANS and "greedy accuracy" in label and "mean reward" not in label
    assert "greedy accuracy (val/score)" in report.accuracy_change([{"step": 0, "val/score": 0.1},
                                                                     {"step": 5, "val/score": 0.3}])


def test_a_disk_warning_is_printed_once(tmp_path):
    """Every file the run writes is capped below a checkpoint's size (a real EFBIG): the failed
    save is said once in all the run prints, stdout and stderr together."""
    train = tmp_path / "train.parquet"
    pd.read_parquet(TEST_DATA).head(16).to_parquet(train)
    args = ["train", "--preset", "countdown-tiny", "--out", str(tmp_path / "run"), "--max-steps", "1",
            "--no-dashboard", "--set", f"data.train_path={train}", "--set", "trainer.test_every=0",
            "--set", "trainer.train_batch_size=4", "--set", "actor.ppo_mini_batch_size=4"]
    done = subprocess.run([sys.executable, "-m", "tinyrl.cli", *args], capture_output=True, text=True, env=ENV,
                          timeout=600, preexec_fn=small_disk.limit_file_size(200_000))
    assert done.returncode == 1, done.stderr[-3000:]  # trained, but the checkpoint is not on disk
    everything = " ".join((done.stdout + done.stderr).split())
    assert everything.count("CHECKPOINT NOT SAVED") == 1, everything[-3000:]
    assert "step 1/1" in done.stdout
