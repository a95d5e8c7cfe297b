"""`tinyrl export-verl`: every override is a key of the pinned verl's real config, bash hands
verl the arguments intact, nothing is dropped silently, and reward_fn.py scores exactly as
tinyrl's reward does.

verl is installed with `pip install --no-deps verl==X` (README's test command): its YAML is
read from the package files, never imported (`import verl` needs ray). Outside CI a missing
verl skips the key checks; in CI it fails them.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from tinyrl.config import list_presets, load_config
from tinyrl.errors import TinyRLError
from tinyrl.data.countdown import generate_countdown
from tinyrl.data.io import load_prompts
from tinyrl.eval import parse_data_args
from tinyrl.export_verl import export_verl
from tinyrl.export_verl.mapping import VERL_VERSION, Context, map_config
from tinyrl.rewards.registry import load_reward_fn

SMALL = ["data.generate_train_size=256",  # the same keys, without generating 327,680 rows
         "model.init_from="]  # countdown-demo starts from an SFT run that a test machine does not have


def verl_root() -> Path:
    """The installed verl package's directory. Outside CI a missing verl skips the test (a card's
    Python has none), in CI it fails."""
    spec = importlib.util.find_spec("verl")
    if spec is None:
        if os.environ.get("CI"):
            pytest.fail(f"verl is not installed: pip install --no-deps verl=={VERL_VERSION}")
        pytest.skip(f"verl not installed (pip install --no-deps verl=={VERL_VERSION})")
    assert importlib.metadata.version("verl") == VERL_VERSION, "the export names another verl version"
    return Path(spec.submodule_search_locations[0])


@pytest.fixture(scope="module")
def verl_yaml() -> dict:
    return yaml.safe_load((verl_root() / "trainer" / "config" / "_generated_ppo_trainer.yaml").read_text())


def script_args(script: Path) -> list[str]:
    """The arguments after `python3 -m verl.trainer.main_ppo`, as bash passes them (no expansion)."""
    text = script.read_text().split("python3 -m verl.trainer.main_ppo \\\n", 1)[1]
    return [a for a in shlex.split(text.replace("\\\n", " ")) if a != "$@"]


def lookup(tree: dict, key: str):
    node = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return KeyError
        node = node[part]
    return node


# verl/workers/config/model.py: `target_modules: Optional[Any] = "all-linear"  # ... and ["q_proj","k_proj"]`
# verl/utils/dataset/rl_dataset.py (RLHFDataset): `if not isinstance(data_files, list | ListConfig): data_files = [data_files]`
STR_OR_LIST = {"actor_rollout_ref.model.target_modules", "critic.model.target_modules", "data.train_files",
               "data.val_files"}


def same_kind(default, text: str, key: str = "") -> bool:
    """A Hydra value that fits the YAML default's type (null and interpolated defaults take any)."""
    if default is None or isinstance(default, str) and "${" in default or key in STR_OR_LIST:
        return True
    if isinstance(default, bool):
        return text in ("true", "false")
    if isinstance(default, (int, float)):
        try:
            float(text)
            return True
        except ValueError:
            return False
    if isinstance(default, list):
        return text.startswith("[")
    return isinstance(default, str) and not text.startswith("[")


def downloaded_data(preset: str, tmp_path: Path) -> list[str]:
    """A preset whose data is downloaded (math-grpo-4090): small generated files of its task instead."""
    from tinyrl.config import resolve_path
    from tinyrl.tasks import get_task

    cfg = load_config(preset, check=False)
    if cfg.data.generate or resolve_path(cfg.data.train_path).exists():
        return []
    train, test = get_task(cfg.task.name).generate(tmp_path / "data", 64, 16, progress=False)
    val = [f"{name}={test}" for name, _ in parse_data_args(cfg.data.val_files)]  # e.g. aime: downloaded too
    return [f"data.train_path={train}", f"data.test_path={test}", f"data.val_files={json.dumps(val)}"]


VARIANTS = [[], ["algorithm.adv_estimator=dr_grpo", "rollout.n=4", "algorithm.kl_in_reward=false"],
            ["trainer.wandb=true", "trainer.tensorboard=true", "actor.micro_batch_tokens=4096",
             "critic.micro_batch_tokens=4096", "rollout.vllm.gpu_memory_utilization=0.6",
             "rollout.vllm.max_num_seqs=64", "model.finetune=full", "model.dtype=fp16",
             "algorithm.kl_ctrl=adaptive", "algorithm.kl_in_reward=true", "algorithm.use_kl_loss=false",
             "trainer.max_steps=7", "rollout.engine=hf"]]  # the adaptive controller is the in-reward KL's


RL_PRESETS = [name for name in list_presets() if load_config(name, check=False).command == "train"]


@pytest.mark.parametrize("variant", VARIANTS, ids=["preset", "dr_grpo", "options"])
@pytest.mark.parametrize("preset", RL_PRESETS)
def test_every_override_is_a_key_of_verls_config(preset, variant, tmp_path, verl_yaml):
    cfg = load_config(preset, SMALL + variant + downloaded_data(preset, tmp_path))
    out = export_verl(cfg, tmp_path / "out", gpus=8, nodes=2)
    args = script_args(out / "run_verl.sh")
    assert len(args) > 40
    for arg in args:
        key, value = arg.split("=", 1)
        default = lookup(verl_yaml, key)
        assert default is not KeyError, f"{key} is not in verl {VERL_VERSION}'s config"
        assert same_kind(default, value, key), f"{key}={value} does not fit verl's default {default!r}"
    assert "not known to this exporter" not in (out / "run_verl.sh").read_text()  # every key handled
    keys = dict(a.split("=", 1) for a in args)
    assert keys["trainer.n_gpus_per_node"] == "8" and keys["trainer.nnodes"] == "2"
    assert keys["algorithm.adv_estimator"] in ("gae", "grpo")
    assert ("critic.optim.lr" in keys) == (keys["algorithm.adv_estimator"] == "gae")


@pytest.mark.parametrize("preset", sorted(set(list_presets()) - set(RL_PRESETS)))
def test_an_sft_preset_is_refused_before_anything_is_written(preset, tmp_path):
    """export-verl maps RL settings to verl's main_ppo; an SFT preset exported so would be an RL
    recipe over supervised rows, with a critic."""
    with pytest.raises(TinyRLError) as exc:
        export_verl(load_config(preset, check=False), tmp_path / "out", gpus=8)
    assert "SFT preset" in exc.value.message and "verl.trainer.sft_trainer" in exc.value.hint
    assert not (tmp_path / "out").exists()


def test_bash_hands_verl_the_arguments_intact(tmp_path):
    cfg = load_config("countdown-grpo-4090", SMALL + ["trainer.wandb=true"])
    out = export_verl(cfg, tmp_path / "my out", gpus=4)  # a space in the path
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python3").write_text(f"#!/bin/sh\nexec {sys.executable} -c 'import json,os,sys; "
                                  "print(json.dumps([os.environ.get(\"WANDB_MODE\")] + sys.argv[1:]))' \"$@\"\n")
    (fake / "python3").chmod(0o755)
    done = subprocess.run(["bash", str(out / "run_verl.sh"), "trainer.total_epochs=3"], capture_output=True,
                          text=True, env={**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}, timeout=60)
    assert done.returncode == 0, done.stderr
    wandb_mode, *argv = json.loads(done.stdout)
    assert wandb_mode == "offline" and argv[:2] == ["-m", "verl.trainer.main_ppo"]
    args = dict(a.split("=", 1) for a in argv[2:])
    here = (tmp_path / "my out").resolve()
    assert args["data.train_files"] == f"'{here}/data/train.parquet'"
    assert args["reward.custom_reward_function.path"] == f"'{here}/reward_fn.py'"
    assert args["actor_rollout_ref.model.custom_chat_template"] == "'{{ messages[0].content }}'"
    assert args["actor_rollout_ref.rollout.n"] == "8" and args["trainer.total_epochs"] == "3"  # "$@" last
    assert args["algorithm.norm_adv_by_std_in_grpo"] == "true"
    assert args["trainer.save_freq"] == "50" and args["actor_rollout_ref.actor.use_kl_loss"] == "true"


def run_script(script: Path, tmp_path: Path) -> dict[str, str]:
    """The script's arguments as verl receives them (bash expanded $HERE), through a fake python3."""
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "python3").write_text(f"#!/bin/sh\nexec {sys.executable} -c 'import json,sys; "
                                  "print(json.dumps(sys.argv[1:]))' \"$@\"\n")
    (fake / "python3").chmod(0o755)
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True,
                          env={**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}, timeout=60)
    assert done.returncode == 0, done.stderr
    return dict(a.split("=", 1) for a in json.loads(done.stdout)[2:])


def test_validation_files_are_copied_and_listed_in_verls_data_val_files(tmp_path, verl_yaml):
    from tinyrl.tasks import math as mt

    data = tmp_path / "data"
    train, test = mt.generate(data, 64, 40, seed=1, progress=False)
    aime, _ = mt.generate(tmp_path / "aime", 4, 30, seed=2, progress=False)  # its test file: 30 rows
    gsm = mt.generate(tmp_path / "gsm", 4, 8, seed=3, progress=False)[1]
    cfg = load_config("math-tiny", [f"data.train_path={train}", f"data.test_path={test}", "data.max_test_prompts=20",
                                    f'data.val_files=["aime={tmp_path / "aime" / "test.parquet"}", "gsm 8k={gsm}"]'])
    out = export_verl(cfg, tmp_path / "my out")
    args = run_script(out / "run_verl.sh", tmp_path)
    value = args["data.val_files"]
    assert value.startswith("[") and value.endswith("]")
    assert same_kind(lookup(verl_yaml, "data.val_files"), value, "data.val_files")
    listed = [Path(x) for x in re.findall(r"'([^']*)'", value)]
    here = (tmp_path / "my out").resolve()
    assert listed == [here / "data" / "test.parquet", here / "data" / "val_aime.parquet",
                      here / "data" / "val_gsm_8k.parquet"]
    # each file holds the rows tinyrl validates on: its first data.max_test_prompts (20) rows
    for copied, source, rows in zip(listed[1:], [tmp_path / "aime" / "test.parquet", gsm], [20, 8]):
        assert pq.read_table(copied).to_pylist() == pq.read_table(source).to_pylist()[:rows]
    script = (out / "run_verl.sh").read_text()
    assert "data.val_files = " in script and "per data_source" in script  # what verl does with them: said
    cfg.data.val_files = [f"aime={tmp_path / 'nowhere.parquet'}"]
    with pytest.raises(TinyRLError, match="aime = .*nowhere.parquet does not exist"):
        export_verl(cfg, tmp_path / "out2")


def test_settings_verl_lacks_are_listed_not_dropped(tmp_path, monkeypatch):
    cfg = load_config("countdown-tiny", ["model.quantize=nf4", "algorithm.overlong_buffer=16"])
    ctx = Context(model_path="m", train_files="t", val_files="v", reward_path="r", steps_per_epoch=10)
    real = type(cfg).to_dict
    monkeypatch.setattr(type(cfg), "to_dict", lambda self: {**real(self), "trainer": {
        **real(self)["trainer"], "new_knob": 3}})
    notes = "\n".join(map_config(cfg, ctx).notes)
    for dotted in ("model.quantize = 'nf4'", "algorithm.overlong_buffer = 16", "trainer.new_knob = 3",
                   "trainer.memory_budget_gib", "model.logprob_chunk"):
        assert dotted in notes


@pytest.mark.parametrize("mode,verl_mode", [("off", None), ("token", "token"), ("sequence", "sequence"),
                                            ("auto", "token")])
def test_rollout_is_maps_to_verls_rollout_correction(mode, verl_mode):
    cfg = load_config("countdown-4090", SMALL)
    cfg.algorithm.rollout_is, cfg.algorithm.rollout_is_cap = mode, 3.0  # works before and after issue 10
    ctx = Context(model_path="m", train_files="t", val_files="v", reward_path="r", steps_per_epoch=10)
    o = map_config(cfg, ctx).overrides
    assert o["algorithm.rollout_correction.rollout_is"] == verl_mode
    assert o["algorithm.rollout_correction.rollout_is_threshold"] == 3.0


USER_REWARD = '''
def score(completion, example):  # reads the prompt and a top-level column, as a user's reward may
    return len(completion) % 7 + example["target"] % 3 + len(example["prompt"][0]["content"]) % 5 / 10
'''


@pytest.mark.parametrize("reward", ["countdown", "countdown-strict", "user-file"])
def test_reward_fn_scores_exactly_like_tinyrl(reward, tmp_path):
    data = tmp_path / "data"
    generate_countdown(data, 8, 8, seed=3, progress=False)
    overrides = [f"data.train_path={data / 'train.parquet'}", f"data.test_path={data / 'test.parquet'}",
                 "trainer.train_batch_size=4", "actor.ppo_mini_batch_size=4", "task.format_score=0.25"]
    if reward == "countdown-strict":
        overrides.append("task.strict=true")
    if reward == "user-file":
        (tmp_path / "mine.py").write_text(USER_REWARD)
        overrides.append(f"reward.fn={tmp_path / 'mine.py'}:score")
    cfg = load_config("countdown-tiny", overrides)
    out = export_verl(cfg, tmp_path / "out")
    spec = importlib.util.spec_from_file_location(f"exported_reward_{reward.replace('-', '_')}",
                                                  out / "reward_fn.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    spec = "countdown" if cfg.reward.fn == "task" else cfg.reward.fn  # the [task] options moved in issue 13
    ours = load_reward_fn(spec, format_score=0.25, strict=cfg.task.strict)
    original = load_prompts(data / "train.parquet").to_dict("records")  # what tinyrl train hands the reward
    exported = pq.read_table(out / "data" / "train.parquet").to_pylist()  # what verl's dataset holds
    scores = set()
    for row, verl_row in zip(original, exported, strict=True):
        solution = row["extra_info"]["solution"]
        for completion in (f"<answer>{solution}</answer>", f" <answer>{solution}</answer>\n",
                           f"<answer>{solution} + 0</answer>", "no answer", "<answer>9**9**9</answer>",
                           f"Assistant: <answer>{solution}</answer>", f"<answer>1</answer><answer>{solution}</answer>"):
            expected = ours(completion, row)
            got = module.compute_score(verl_row["data_source"], completion,
                                       verl_row["reward_model"]["ground_truth"], verl_row["extra_info"])
            assert got == expected, (completion, row["extra_info"])
            scores.add(expected)
    assert len(scores) >= 3  # the table reaches several different scores


def wrote_line_names(stdout: str, out: Path) -> list[str]:
    """The names export-verl's last line says it wrote in `out` ('wrote OUT/a, b and data/: run ...')."""
    line = next(x for x in stdout.splitlines() if x.startswith("wrote "))
    listed = line.removeprefix(f"wrote {out}/").partition(": run bash ")[0]
    return re.split(r", | and ", listed)


def test_out_dir_is_never_overwritten_without_flag(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    (tmp_path / "mine.py").write_text("def score(completion, example):\n    return 1.0\n")
    cmd = [sys.executable, "-m", "tinyrl.cli", "export-verl", "--preset", "countdown-tiny", "--out", str(out)]
    env = {**os.environ, "COLUMNS": "300"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2 and "not empty" in done.stderr and "--overwrite" in done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]
    done = subprocess.run(cmd + ["--overwrite", "--set", "data.generate_train_size=64", "--gpus", "3",
                                 "--set", f"reward.fn={tmp_path / 'mine.py'}:score"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert (out / "keep.txt").read_text() == "mine" and (out / "run_verl.sh").is_file()
    # the last line names what the export wrote (it said run_verl.sh, reward_fn.py and data/ only:
    # not tinyrl_config.json, nor user_reward/ with a user's reward), and not the user's keep.txt
    names = wrote_line_names(done.stdout, out)
    assert names[0] == "run_verl.sh" and "user_reward/" in names and "tinyrl_config.json" in names, done.stdout
    assert sorted(names) == sorted(p.name + "/" * p.is_dir() for p in out.iterdir() if p.name != "keep.txt")
    # 32 prompts over 3 GPUs: said on the console, not only in the script's header (where it alone was)
    uneven = "WARNING: trainer.train_batch_size = 32 x rollout.n = 1 sequences do not split evenly over 3 GPUs"
    assert uneven in done.stderr and uneven in (out / "run_verl.sh").read_text()
    both = subprocess.run(cmd[:-2] + ["--from-run", str(tmp_path), "--out", str(tmp_path / "x")],
                          capture_output=True, text=True, timeout=120, env=env)
    assert both.returncode == 2 and "exactly one of" in both.stderr
    script = subprocess.run(cmd[:-1] + [str(tmp_path / "run_verl.sh")], capture_output=True, text=True, timeout=120,
                            env=env)  # a file's name: it made a directory called run_verl.sh
    assert script.returncode == 2 and "looks like a file name" in script.stderr and "--out " in script.stderr
    assert not (tmp_path / "run_verl.sh").exists()


def test_from_run_can_start_from_the_exported_actor(tmp_path):
    cfg = load_config("countdown-4090", SMALL + ["trainer.train_batch_size=128"])
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(cfg.to_dict()))
    actor = tmp_path / "actor"
    actor.mkdir()
    (actor / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    done = subprocess.run([sys.executable, "-m", "tinyrl.cli", "export-verl", "--from-run", str(run),
                           "--actor", str(actor), "--set", "trainer.total_epochs=2", "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    script = tmp_path / "o" / "run_verl.sh"
    args = dict(a.split("=", 1) for a in script_args(script))
    assert args["actor_rollout_ref.model.path"] == f"'{actor.resolve()}'"
    assert args["critic.model.path"] == "'Qwen/Qwen2.5-3B'"  # the value head is not in the export
    assert args["data.train_batch_size"] == "128" and args["trainer.total_epochs"] == "2"
    assert "also verl's KL reference" in script.read_text()
    assert json.loads((tmp_path / "o" / "tinyrl_config.json").read_text())["trainer"]["total_epochs"] == 2
    # a `tinyrl export` of a run on another base: verl's critic (this base) would not match its actor
    (actor / "tinyrl_export.json").write_text(json.dumps({"run_dir": "r", "step": 3, "base": "Qwen/Qwen2.5-0.5B"}))
    other = subprocess.run([sys.executable, "-m", "tinyrl.cli", "export-verl", "--from-run", str(run),
                            "--actor", str(actor), "--out", str(tmp_path / "o2")], capture_output=True, text=True,
                           timeout=120)
    said = " ".join(other.stderr.replace("│", " ").split())
    assert other.returncode == 2 and "exported from a run on Qwen/Qwen2.5-0.5B" in said, other.stderr
    assert "--set model.name=Qwen/Qwen2.5-0.5B" in said and not (tmp_path / "o2").exists()


def test_actor_must_be_a_model_that_verl_can_load_not_a_run_directory(tmp_path):
    """--actor was checked for a config.json only, and a tinyrl run directory has one (tinyrl's own
    settings): `--from-run runs/x --actor runs/x` exited 0 with model.path = the run directory,
    and verl failed at start on the rented GPUs. A run, or a config.json without a model_type, is
    refused with exit 2, the way to export it said, nothing written."""
    cfg = load_config("countdown-4090", SMALL + ["trainer.train_batch_size=128"])
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(cfg.to_dict()))
    (run / "run.json").write_text(json.dumps({"run_id": "r1", "cwd": str(tmp_path)}))
    not_a_model = tmp_path / "notes"
    not_a_model.mkdir()
    (not_a_model / "config.json").write_text(json.dumps({"lr": 1e-6}))
    env = {**os.environ, "COLUMNS": "300"}
    for actor, said, hint in ((run, f"--actor {run} is a tinyrl run directory, not a Hugging Face model",
                               f"`tinyrl export {run} --out DIR`, then --actor DIR"),
                              (not_a_model, "its config.json has no model_type", "`tinyrl export RUN_DIR --out DIR`"),
                              (tmp_path / "missing", "is not a directory (not found)", "--actor DIR")):
        done = subprocess.run([sys.executable, "-m", "tinyrl.cli", "export-verl", "--from-run", str(run),
                               "--actor", str(actor), "--out", str(tmp_path / "o")], capture_output=True, text=True,
                              timeout=120, env=env)
        text = " ".join(done.stderr.replace("│", " ").split())
        assert done.returncode == 2 and said in text and hint in text, done.stderr
        assert "Traceback" not in done.stderr and not (tmp_path / "o").exists()
    # a `tinyrl export` directory is taken (its record), as is any model with a model_type
    export = tmp_path / "exported"
    export.mkdir()
    (export / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    (export / "tinyrl_export.json").write_text(json.dumps({"run_dir": str(run), "step": 3, "base": "Qwen/Qwen2.5-3B"}))
    export_verl(cfg, tmp_path / "o", actor=export, warn=lambda _: None)
    args = dict(a.split("=", 1) for a in script_args(tmp_path / "o" / "run_verl.sh"))
    assert args["actor_rollout_ref.model.path"] == f"'{export.resolve()}'"


def test_an_export_never_writes_over_its_own_inputs(tmp_path):
    """Issue 29 item 3: with --overwrite, data.test_path = OUT/data/test.parquet was cut from the
    user's 200 rows to 64, and data.train_path there raised SameFileError. Now: exit 2, every
    clash named, nothing in OUT changed."""
    out = tmp_path / "out"
    train, test = generate_countdown(out / "data", 256, 200, progress=False)  # the user's own files, inside OUT
    (out / "run_verl.sh").write_text("an older export")
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    cmd = [sys.executable, "-m", "tinyrl.cli", "export-verl", "--preset", "countdown-tiny", "--out", str(out),
           "--overwrite", "--set", f"data.train_path={train}", "--set", f"data.test_path={test}"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "300"})
    err = " ".join(done.stderr.split())
    assert done.returncode == 2 and "Traceback" not in err, done.stderr[-3000:]
    assert "write over files it reads" in err and "data.train_path" in err and "data.test_path" in err
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert pq.ParquetFile(test).metadata.num_rows == 200

    # test file alone inside OUT; then reached through a hard link and a symlink from outside
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "train.parquet").write_bytes(train.read_bytes())
    os.link(test, elsewhere / "hard.parquet")
    (elsewhere / "soft.parquet").symlink_to(test)
    for given in (test, elsewhere / "hard.parquet", elsewhere / "soft.parquet"):
        cfg = load_config("countdown-tiny", [f"data.train_path={elsewhere / 'train.parquet'}",
                                             f"data.test_path={given}"])
        with pytest.raises(TinyRLError, match="data.test_path") as info:
            export_verl(cfg, out, overwrite=True)
        assert "data.train_path" not in info.value.message
        assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    # a user's reward file inside OUT/user_reward/ would be copied onto itself
    mine = out / "user_reward" / "mine.py"
    mine.parent.mkdir()
    mine.write_text("def score(c, e):\n    return 1.0\n")
    cfg = load_config("countdown-tiny", [f"data.train_path={elsewhere / 'train.parquet'}",
                                         f"data.test_path={elsewhere / 'hard.parquet'}", f"reward.fn={mine}:score"])
    with pytest.raises(TinyRLError, match="reward.fn"):
        export_verl(cfg, out, overwrite=True)
    # inputs outside OUT: the export goes through and the user's files keep their rows
    test_copy = elsewhere / "test.parquet"
    test_copy.write_bytes(test.read_bytes())
    cfg = load_config("countdown-tiny", [f"data.train_path={elsewhere / 'train.parquet'}", f"data.test_path={test_copy}"])
    export_verl(cfg, out, overwrite=True)
    assert pq.ParquetFile(test_copy).metadata.num_rows == 200
    assert pq.ParquetFile(out / "data" / "test.parquet").metadata.num_rows == cfg.data.max_test_prompts < 200


def test_critic_warmup_goes_to_verl_under_its_own_name_and_meaning():
    # the same number: tinyrl follows verl 0.9.1's reading (the actor waits while
    # critic_warmup > the 1-based step), so nothing is shifted by one on the way
    ctx = Context(model_path="m", train_files="t", val_files="v", reward_path="r", steps_per_epoch=10)
    for warmup in (0, 4):
        cfg = load_config("countdown-tiny", [f"trainer.critic_warmup={warmup}"])
        assert map_config(cfg, ctx).overrides["trainer.critic_warmup"] == warmup


# ------------------------------------------------------------------ a task with tools (issue 28)


def retool_export(tmp_path, *extra: str) -> Path:
    from tinyrl.tasks import get_task

    train, test = get_task("retool").generate(tmp_path / "data", 16, 8, progress=False)
    cfg = load_config("retool-4090", [f"data.train_path={train}", f"data.test_path={test}", "trainer.train_batch_size=8",
                                      "actor.ppo_mini_batch_size=8", "rollout.tool_timeout_s=2",
                                      "rollout.tool_memory_mb=512", "rollout.tool_workers=2", *extra])
    return export_verl(cfg, tmp_path / "out", gpus=8)


def multi_turn_fields() -> set[str]:
    """The fields of verl's MultiTurnConfig dataclass, read from its source (importing it needs ray)."""
    import ast

    source = verl_root() / "workers" / "config" / "rollout.py"
    cls = next(n for n in ast.walk(ast.parse(source.read_text())) if isinstance(n, ast.ClassDef)
               and n.name == "MultiTurnConfig")
    return {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign)}


def verls_kl_functions() -> tuple[list[set[str]], dict]:
    """verl's kl_penalty and kl_penalty_forward, run from verl/trainer/ppo/core_algos.py's own
    source (importing the module needs ray), and the names kl_penalty_forward accepts, one set
    per branch (one estimator each)."""
    import ast

    import torch

    source = verl_root() / "trainer" / "ppo" / "core_algos.py"
    fns = {n.name: n for n in ast.walk(ast.parse(source.read_text())) if isinstance(n, ast.FunctionDef)
           and n.name in ("kl_penalty", "kl_penalty_forward")}
    tests = [n.test for n in fns["kl_penalty_forward"].body if isinstance(n, ast.If) and isinstance(n.test, ast.Compare)]
    space = {"torch": torch}
    exec(compile(ast.Module(body=list(fns.values()), type_ignores=[]), str(source), "exec"), space)
    return [{c.value for c in ast.walk(t.comparators[0]) if isinstance(c, ast.Constant)} for t in tests], space


def test_every_kl_name_means_the_same_estimator_in_tinyrl_and_verl(verl_yaml, tmp_path):
    """algorithm.kl_penalty = kl (verl's name for k1) was refused; the export passes the name
    through, so each of ours must be verl's for the same estimator, and verl's ours."""
    from tinyrl.rl.kl_names import KL_ALIASES, KL_REFUSED

    verls, _ = verls_kl_functions()
    branches = [names - set(KL_REFUSED) for names in verls]  # full: NotImplementedError in verl
    branches = [names for names in branches if names]
    assert set().union(*branches) == set(KL_ALIASES)
    for names in branches:  # one verl branch, one estimator of ours
        assert len({KL_ALIASES[name] for name in names}) == 1, names
    for name in ("kl", "low_var_kl", "mse", "k3+"):
        cfg = load_config("countdown-tiny", [f"algorithm.kl_penalty={name}"])
        assert map_config(cfg, Context(model_path="m", train_files="t", val_files="v",
                                       reward_path="r", steps_per_epoch=1)).overrides["algorithm.kl_penalty"] == name


def test_every_kl_name_has_verls_value_and_gradient(verl_yaml):
    """verl's "+" names (k3+: k3's value, k2's gradient) are taken and computed as verl's own
    kl_penalty does; the names tinyrl refuses ("full") are the ones verl cannot compute either."""
    import torch

    from tinyrl.rl.kl import kl_penalty
    from tinyrl.rl.kl_names import KL_NAMES, KL_REFUSED

    names, verl = verls_kl_functions()
    every = set().union(*names)
    assert set(KL_NAMES) | set(KL_REFUSED) == every | {name + "+" for name in every}
    lp, ref = torch.tensor([-1.0, -2.0, -1.0, 0.0]), torch.tensor([-2.0, -1.0, -6.0, -40.0])
    for name in KL_NAMES:
        ours, theirs = lp.clone().requires_grad_(True), lp.clone().requires_grad_(True)
        value, expected = kl_penalty(ours, ref, name), verl["kl_penalty"](theirs, ref, name)
        torch.testing.assert_close(value, expected, msg=name)
        value.sum().backward()
        expected.sum().backward()
        torch.testing.assert_close(ours.grad, theirs.grad, msg=name)
    for name in KL_REFUSED:
        with pytest.raises(NotImplementedError):
            verl["kl_penalty"](lp, ref, name)


def test_a_task_with_tools_exports_verls_multi_turn_rollout(tmp_path, verl_yaml):
    out = retool_export(tmp_path)
    keys = dict(a.split("=", 1) for a in script_args(out / "run_verl.sh"))
    mt = "actor_rollout_ref.rollout.multi_turn."
    assert {k[len(mt):] for k in keys if k.startswith(mt)} <= multi_turn_fields()  # the dataclass takes them
    assert keys[mt + "enable"] == "true" and keys[mt + "format"] == "hermes"
    assert keys[mt + "max_assistant_turns"] == "8" and keys[mt + "max_user_turns"] == "8"
    assert keys[mt + "max_tool_response_length"] == "1024"  # 256 tokens, in characters
    assert keys[mt + "tool_config_path"] == "'$HERE/tool_config.yaml'"  # Hydra-quoted, bash expands $HERE
    loop = keys["actor_rollout_ref.rollout.agent.default_agent_loop"]
    agent_loops = verl_root() / "experimental" / "agent_loop"
    assert f'@register("{loop}")' in (agent_loops / "tool_agent_loop.py").read_text()  # verl's tool loop's name
    text = (out / "run_verl.sh").read_text()
    assert 'export PYTHONPATH="$HERE' in text and "rollout.max_tool_calls = 8" in text
    # the command's last line lists the tool files too (it named run_verl.sh, reward_fn.py and data/ only)
    done = subprocess.run([sys.executable, "-m", "tinyrl.cli", "export-verl", "--preset", "retool-4090",
                           "--set", f"data.train_path={tmp_path / 'data' / 'train.parquet'}",
                           "--set", f"data.test_path={tmp_path / 'data' / 'test.parquet'}",
                           "--set", "trainer.train_batch_size=8", "--set", "actor.ppo_mini_batch_size=8",
                           "--out", str(tmp_path / "cli")], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "300"})
    assert done.returncode == 0, done.stderr
    names = wrote_line_names(done.stdout, tmp_path / "cli")
    assert "tool_config.yaml" in names and "tinyrl_tool.py" in names, done.stdout
    assert sorted(names) == sorted(p.name + "/" * p.is_dir() for p in (tmp_path / "cli").iterdir())
    # a task without tools: no multi-turn keys, and the tool settings are still handled (no note)
    plain = export_verl(load_config("countdown-tiny", SMALL), tmp_path / "plain")
    assert "multi_turn" not in (plain / "run_verl.sh").read_text() and not (plain / "tool_config.yaml").exists()


def verl_tool_loader(monkeypatch):
    """verl 0.9.1's own tool loader (tools/tool_registry.py) and its real BaseTool, schemas and
    function_tool modules, loaded from the installed files. Not importable here: `verl` itself
    (its __init__ imports ray), verl.utils.rollout_trace (ray; its decorator only traces, so it is
    replaced by the identity) and omegaconf (not installed: OmegaConf.load is yaml.safe_load with
    attribute access, to_container a plain copy)."""
    import types

    root = verl_root()

    class Node(dict):
        def __getattr__(self, key):
            value = self[key]
            return Node(value) if isinstance(value, dict) else [Node(v) if isinstance(v, dict) else v
                                                                  for v in value] if isinstance(value, list) else value

    omegaconf = types.ModuleType("omegaconf")
    omegaconf.OmegaConf = types.SimpleNamespace(load=lambda p: Node(yaml.safe_load(Path(p).read_text())),
                                                to_container=lambda node, resolve=True: json.loads(json.dumps(node)))
    trace = types.ModuleType("verl.utils.rollout_trace")
    trace.rollout_trace_op = lambda fn: fn
    for name, module in (("verl", types.ModuleType("verl")), ("verl.tools", types.ModuleType("verl.tools")),
                         ("verl.utils", types.ModuleType("verl.utils")), ("verl.utils.rollout_trace", trace),
                         ("omegaconf", omegaconf)):
        module.__path__ = []
        monkeypatch.setitem(sys.modules, name, module)
    for name in ("schemas", "base_tool", "function_tool", "tool_registry"):
        spec = importlib.util.spec_from_file_location(f"verl.tools.{name}", root / "tools" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, f"verl.tools.{name}", module)
        spec.loader.exec_module(module)
    monkeypatch.delitem(sys.modules, "tinyrl_tool", raising=False)  # each test imports its own export's
    return sys.modules["verl.tools.tool_registry"]


def test_verls_tool_loader_builds_the_exported_tool_and_it_runs_tinyrls_sandbox(tmp_path, monkeypatch):
    import asyncio

    from tinyrl.tools import TOOLS, render
    from tinyrl.tools.python import run_code

    out = retool_export(tmp_path)
    registry = verl_tool_loader(monkeypatch)
    monkeypatch.syspath_prepend(str(out))  # what run_verl.sh's PYTHONPATH does
    tools = registry.initialize_tools_from_config(str(out / "tool_config.yaml"))
    assert [type(t).__name__ for t in tools] == ["TinyRLTool"] and tools[0].name == "code_interpreter"
    tool = tools[0]
    assert tool.tool_schema.model_dump(exclude_unset=True) == TOOLS["code_interpreter"].schema  # verl's pydantic
    assert (tool.timeout_s, tool.memory_mb, tool._pool._max_workers) == (2.0, 512, 2)

    async def call(parameters, **create):
        instance, _ = await tool.create(**create)
        try:
            return await tool.execute(instance, parameters)
        finally:
            await tool.release(instance)

    response, reward, metrics = asyncio.run(call({"code": "print(6 * 7)"}))
    assert (response.text, reward, metrics["status"]) == ("42", 0.0, "ok")
    response, _, metrics = asyncio.run(call({"code": "1 / 0"}))
    assert response.text == render(run_code("1 / 0")) and metrics["status"] == "error"  # tinyrl's own tool turn
    assert "ZeroDivisionError" in response.text
    response, _, metrics = asyncio.run(call({"code": "import time\ntime.sleep(6)\nprint('late')"}))
    assert metrics["status"] == "timeout" and "late" not in response.text  # rollout.tool_timeout_s = 2
    response, _, metrics = asyncio.run(call({"program": "print(1)"}))
    assert metrics["status"] == "bad_call" and "code" in response.text
    # a row's extra_info.tools_kwargs: verl's agent loop calls create(create_kwargs=...) (verl 0.9.1
    # experimental/agent_loop/tool_agent_loop.py), its older sglang rollout create(id, **entries)
    response, _, _ = asyncio.run(call({"code": "print(n ** 2)"}, create_kwargs={"setup": "n = 12"}))
    assert response.text == "144"
    response, _, _ = asyncio.run(call({"code": "print(n ** 2)"}, instance_id="row-7", setup="n = 3"))
    assert response.text == "9" and tool._create_kwargs == {}  # released with the instance
    response, _, _ = asyncio.run(call({"code": "print(n ** 2)"}))
    assert "NameError" in response.text  # another row's state never leaks into a call without one


def calculator_tool():
    """A tool a user registers in tinyrl.tools.TOOLS (the bug report's): `expression` evaluated in
    this process with the episode's `names` (create_kwargs), not in the sandbox."""
    from tinyrl.tools import Tool, ToolResult

    def run(arguments, create_kwargs=None, **limits):
        if arguments["expression"] == "backend down":  # a tool that breaks its contract: it raises
            raise RuntimeError("the calculator's backend is down")
        names = dict((create_kwargs or {}).get("names") or {})
        try:
            value = eval(str(arguments["expression"]), {"__builtins__": {}}, names)
        except Exception as e:  # a tool's run never raises: the error is its result
            why = f"{type(e).__name__}: {e}"
            return ToolResult("", why + "\n", 1, False, None, False, 0.0, f"exit code 1: {why}", "isolated", False)
        return ToolResult(f"{value}\n", "", 0, False, None, False, 0.0, "exit code 0", "isolated", False)

    schema = {"type": "function", "function": {
        "name": "calculator", "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "required": ["expression"],
                       "properties": {"expression": {"type": "string", "description": "e.g. 12*34"}}}}}
    return Tool("calculator", schema, run)


def test_the_exported_tool_runs_every_tool_the_task_offers_as_tinyrls_turn_loop_does(tmp_path, monkeypatch,
                                                                                      tiny_model_dir):
    """A task offering a tool of the user's besides code_interpreter: each call through the exported
    verl tool answers with the text and status tinyrl's own turn loop gives the same call. It answered
    every call of another tool '[bad call: calculator takes one string argument, code]'."""
    import asyncio

    from helpers.hermes_template import HERMES_TEMPLATE
    from helpers.scripted_engine import ScriptedEngine
    from helpers.tool_task import give_tools
    from transformers import AutoTokenizer

    from tinyrl.rollout.base import SamplingSettings
    from tinyrl.rollout.chat import ToolChat
    from tinyrl.rollout.turns import EpisodeLimits, run_episodes
    from tinyrl.tools import TOOLS, render

    monkeypatch.setitem(TOOLS, "calculator", calculator_tool())
    give_tools(monkeypatch, "retool", ("code_interpreter", "calculator"))
    assert render(TOOLS["calculator"].run({"expression": "12*34"})) == "408"
    out = retool_export(tmp_path)
    registry = verl_tool_loader(monkeypatch)
    monkeypatch.syspath_prepend(str(out))
    tools = {t.name: t for t in registry.initialize_tools_from_config(str(out / "tool_config.yaml"))}
    assert sorted(tools) == ["calculator", "code_interpreter"]
    assert tools["calculator"].tool_schema.model_dump(exclude_unset=True) == TOOLS["calculator"].schema
    # a row's extra_info.tools_kwargs, for both (verl and tinyrl hand each tool its own create_kwargs)
    kwargs = {"calculator": {"create_kwargs": {"names": {"n": 21}}},
              "code_interpreter": {"create_kwargs": {"setup": "n = 5"}}}
    calls = [("calculator", {"expression": "12*34"}), ("calculator", {"expression": "n * 2"}),
             ("calculator", {"expression": "1 / 0"}), ("calculator", {"code": "12*34"}),
             ("calculator", {"expression": 12}), ("calculator", '{"expression": "2 + 2"}'),  # double-encoded
             ("calculator", ["12*34"]), ("code_interpreter", {"code": "print(n * 7)"}),
             ("code_interpreter", {"expression": "1"}), ("calculator", {"expression": "backend down"})]

    async def verl_call(name, parameters):  # what verl 0.9.1's ToolAgentLoop._call_tool does
        tool = tools[name]
        instance, _ = await tool.create(create_kwargs=kwargs[name]["create_kwargs"])
        try:
            response, reward, metrics = await tool.execute(instance, parameters)
        finally:
            await tool.release(instance)
        return response.text, metrics["status"]

    theirs = [asyncio.run(verl_call(name, parameters)) for name, parameters in calls]

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = HERMES_TEMPLATE
    offered = {name: TOOLS[name] for name in ("code_interpreter", "calculator")}
    chat = ToolChat(tok, [t.schema for t in offered.values()], [tok.eos_token_id])

    def script(context, j):  # sample j makes call j, then ends
        if "<tool_response>" in context:
            return "done"
        name, parameters = calls[j]
        return "<tool_call>\n" + json.dumps({"name": name, "arguments": parameters}) + "\n</tool_call>"

    messages = [{"role": "user", "content": "compute"}]
    res = run_episodes(ScriptedEngine(tok, script), [chat.render(messages, generation_prompt=True)],
                       SamplingSettings(n=len(calls), max_new_tokens=600, seed=1), chat=chat, tools=offered,
                       limits=EpisodeLimits(tool_timeout_s=2.0, tool_memory_mb=512), tools_kwargs=[kwargs])
    ours = []
    for e in res.episodes:
        turn = next(t for t in e.turns if t.role == "tool")
        text = tok.decode(e.response_ids[turn.start:turn.end], skip_special_tokens=False)
        ours.append((text.split("<tool_response>\n", 1)[1].split("\n</tool_response>", 1)[0],
                     e.tool_calls[0].status))
    assert theirs == ours
    assert theirs[:3] == [("408", "ok"), ("42", "ok"), ("ZeroDivisionError: division by zero\n"
                                                        "[exit code 1: ZeroDivisionError: division by zero]", "error")]
    # a bad call names the calculator's own argument and types, not the Python tool's
    assert theirs[3:5] == [("[error: missing argument(s): expression]", "bad_call"),
                           ("[error: argument 'expression' must be a string, got int]", "bad_call")]
    assert theirs[5:7] == [("4", "ok"), ('[error: "arguments" must be a JSON object]', "bad_call")]
    assert theirs[7:9] == [("35", "ok"), ("[error: missing argument(s): code]", "bad_call")]
    # a tool that raises: the same error turn in verl (call_tool), not an exception out of execute
    assert theirs[9:] == [("[error: tool 'calculator' raised RuntimeError: the calculator's backend is down]", "error")]


def test_the_exported_reward_scores_episodes_exactly_like_tinyrl(tmp_path):
    """verl hands compute_score the whole decoded episode, tool turns included: the exported reward
    reads the model's last turn as tinyrl does, so an answer the tool printed never scores."""
    from tinyrl.tasks import get_task

    out = retool_export(tmp_path, "task.answer_format=boxed")
    spec = importlib.util.spec_from_file_location("exported_reward_retool", out / "reward_fn.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    ours = get_task("retool").make_reward(load_config("retool-4090", ["task.answer_format=boxed"]).task)
    row = pq.read_table(out / "data" / "train.parquet").to_pylist()[0]
    truth = row["reward_model"]["ground_truth"]
    tool = "\nuser\n<tool_response>\n{}\n</tool_response>\nassistant\n"
    call = '<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(1)"}}\n</tool_call>'
    scores = []
    for completion in (f"\\boxed{{{truth}}}", "x" + call + tool.format(truth) + f"So \\boxed{{{truth}}}",
                       "x" + call + tool.format(f"\\boxed{{{truth}}}") + "done", "no answer",
                       f"\\boxed{{{truth}}}" + call + tool.format("1") + "\\boxed{-99999}"):
        expected = ours(completion, row)
        assert module.compute_score(row["data_source"], completion, truth, row["extra_info"]) == expected
        scores.append(expected)
    assert scores == [1.0, 1.0, -1.0, -1.0, -1.0]  # the third: the tool printed the right answer


def _tree(root: Path) -> dict[str, bytes | None]:
    """Every path under root (hidden ones too): file bytes, None for a directory."""
    return {str(p.relative_to(root)): None if p.is_dir() else p.read_bytes() for p in root.rglob("*")}


def test_an_export_that_fails_after_writing_files_leaves_nothing_behind(tmp_path):
    # The batch check fails after data/ is written (fewer rows than one batch): before, the
    # two parquet files stayed in --out, and the re-run refused it as "not empty".
    cmd = [sys.executable, "-m", "tinyrl.cli", "export-verl", "--preset", "countdown-tiny",
           "--set", "data.generate_train_size=64", "--set", "trainer.train_batch_size=128"]
    env = {**os.environ, "COLUMNS": "300"}
    # a working directory of its own: the preset's data is generated under ./runs on first use,
    # and a checkout where countdown-tiny already ran holds a larger file there
    work = tmp_path / "work"
    work.mkdir()
    new = tmp_path / "new" / "out"
    done = subprocess.run(cmd + ["--out", str(new)], capture_output=True, text=True, timeout=120, env=env, cwd=work)
    assert done.returncode == 2 and "fewer rows than one batch" in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "new").exists()  # not even the directories --out needed
    # --overwrite into a user's directory: their file and an older export stay byte for byte
    out = tmp_path / "out"
    generate_countdown(out / "data", 64, 16, progress=False)
    (out / "run_verl.sh").write_text("an older export")
    (out / "keep.txt").write_text("mine")
    before = _tree(tmp_path)
    done = subprocess.run(cmd + ["--out", str(out), "--overwrite"], capture_output=True, text=True, timeout=120,
                          env=env, cwd=work)
    assert done.returncode == 2 and "fewer rows than one batch" in done.stderr, done.stderr[-2000:]
    assert _tree(tmp_path) == before


def test_an_export_that_fails_while_moving_its_files_in_puts_out_back(tmp_path, monkeypatch):
    # A disk or permission error on the last file moved into --out (tinyrl_config.json; sorted
    # after data/, reward_fn.py and run_verl.sh, which were already in place and had replaced
    # the older export's files): every replaced file comes back, every new one goes.
    import errno

    from tinyrl.export_verl import staging

    out = tmp_path / "out"
    generate_countdown(out / "data", 64, 16, progress=False)
    (out / "run_verl.sh").write_text("an older export")
    (out / "keep.txt").write_text("mine")
    before = _tree(tmp_path)
    replace = os.replace
    placed = []

    def failing(src, dst):
        if Path(dst) == out.resolve() / "tinyrl_config.json":
            raise OSError(errno.ENOSPC, "No space left on device", str(dst))
        replace(src, dst)
        placed.append(Path(dst).name)

    monkeypatch.setattr(staging.os, "replace", failing)
    cfg = load_config("countdown-tiny", ["data.generate_train_size=64"])
    with pytest.raises(TinyRLError, match="No space left on device.*nothing was changed"):
        export_verl(cfg, out, overwrite=True)
    assert {"test.parquet", "train.parquet", "reward_fn.py", "run_verl.sh"} <= set(placed)  # it got that far
    assert _tree(tmp_path) == before
    # a directory where the export puts a file is refused before anything moves
    monkeypatch.setattr(staging.os, "replace", replace)
    (out / "reward_fn.py").mkdir()
    before = _tree(tmp_path)
    with pytest.raises(TinyRLError, match="(?s)replace directories.*reward_fn.py"):
        export_verl(cfg, out, overwrite=True)
    assert _tree(tmp_path) == before
    (out / "reward_fn.py").rmdir()
    export_verl(cfg, out, overwrite=True)  # and with nothing in the way it is written
    assert (out / "keep.txt").read_text() == "mine" and (out / "run_verl.sh").read_text() != "an older export"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging directory left


def test_from_run_reads_the_runs_relative_paths_from_where_it_was_started(tmp_path, monkeypatch):
    """A run started in ~/proj with model.init_from=runs/sft and data.train_path=data/train.parquet:
    `export-verl --from-run ~/proj/runs/rl` from another directory said the SFT run did not exist
    ("run that first"). run.json keeps the directory a run starts in; the paths are read from there."""
    import pandas as pd

    from tinyrl.rundir import start_run

    proj = tmp_path / "proj"
    sft = proj / "runs" / "sft"
    (sft / "checkpoints" / "step_0000001").mkdir(parents=True)
    (sft / "checkpoints" / "step_0000001" / "state.pt").write_bytes(b"")
    shipped = Path(__file__).resolve().parent.parent / "data" / "countdown" / "test.parquet"
    (proj / "data").mkdir()
    pd.read_parquet(shipped)[:64].to_parquet(proj / "data" / "train.parquet")
    cfg = load_config("countdown-tiny", ["data.train_path=data/train.parquet", "trainer.test_every=0"])
    (sft / "config.json").write_text(json.dumps(cfg.to_dict()))
    cfg.model.init_from = "runs/sft"
    run = proj / "runs" / "rl"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(cfg.to_dict()))
    monkeypatch.chdir(proj)  # where `tinyrl train` ran
    start_run(run)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run([sys.executable, "-m", "tinyrl.cli", "export-verl", "--from-run", str(run), "--out", "o"],
                          capture_output=True, text=True, timeout=120, cwd=elsewhere, env={**os.environ, "COLUMNS": "300"})
    assert done.returncode == 0, done.stderr
    assert len(pd.read_parquet(elsewhere / "o" / "data" / "train.parquet")) == 64
    saved = json.loads((elsewhere / "o" / "tinyrl_config.json").read_text())
    assert saved["model"]["init_from"] == str(sft) and saved["data"]["train_path"] == str(proj / "data" / "train.parquet")
    # without --actor the recipe starts verl from the bare base: said on the console, not only in a
    # comment inside the script (a new user ran it as printed)
    said = " ".join(done.stderr.replace("│", " ").split())
    assert f"WARNING: model.init_from = {sft}: this recipe starts verl from the base model" in said
    assert f"`tinyrl export {sft} --out DIR`" in said
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": i, "timing/step": 2.0}) + "\n" for i in range(1, 5)))
    done = subprocess.run([sys.executable, "-m", "tinyrl.cli", "estimate-cost", "--from-run", str(run), "--json"],
                          capture_output=True, text=True, timeout=120, cwd=elsewhere)
    assert done.returncode == 0 and json.loads(done.stdout)["prompts_per_epoch"] == 64, done.stderr  # not 8,192 made


def test_from_run_takes_the_runs_own_files_whatever_this_directory_holds_under_their_names(tmp_path, monkeypatch):
    """A run started in dp with data.train_path=mydata/train.parquet and reward.fn=my_reward.py:score,
    read by `--from-run ../dp/runs/dp` from a sibling dp2 holding its OWN mydata/train.parquet and
    my_reward.py: export-verl exported dp2's 100 rows and copied dp2's reward, and estimate-cost
    counted dp2's rows, exit 0 without a word (a relative path went to run.json's cwd only when it
    was not found from here). Generated data (runs/data/...) the same. A run's file that is no
    longer where the run started is taken from here only with a note naming the file used."""
    import pandas as pd

    from tinyrl.rundir import start_run

    shipped = pd.read_parquet(Path(__file__).resolve().parent.parent / "data" / "countdown" / "test.parquet")
    generated = "runs/data/countdown-tiny/settings-0123456789ab/train.parquet"
    dp, dp2 = tmp_path / "dp", tmp_path / "dp2"
    for where, rows, score in ((dp, 64, "1.0"), (dp2, 100, "0.0")):
        for name in ("mydata/train.parquet", generated):
            (where / name).parent.mkdir(parents=True, exist_ok=True)
            shipped[:rows].to_parquet(where / name)
        (where / "my_reward.py").write_text(f"def score(completion, row):\n    return {score}\n")
    runs = {}
    for name, train in (("dp", "mydata/train.parquet"), ("gen", generated)):
        cfg = load_config("countdown-tiny", [f"data.train_path={dp / train}", f"reward.fn={dp / 'my_reward.py'}:score",
                                             "trainer.test_every=0"])
        cfg.data.train_path, cfg.reward.fn = train, "my_reward.py:score"  # as `--set` gave them in dp
        run = runs[name] = dp / "runs" / name
        run.mkdir(parents=True)
        (run / "config.json").write_text(json.dumps(cfg.to_dict()))
        steps = (json.dumps({"step": i, "timing/step": 2.0}) + "\n" for i in range(1, 5))
        (run / "metrics.jsonl").write_text("".join(steps))
        monkeypatch.chdir(dp)  # where `tinyrl train` ran
        start_run(run)
    monkeypatch.chdir(tmp_path)

    def tinyrl(*args):
        done = subprocess.run([sys.executable, "-m", "tinyrl.cli", *args], capture_output=True, text=True, timeout=120,
                              cwd=dp2, env={**os.environ, "COLUMNS": "300"})
        assert done.returncode == 0, done.stderr
        return done.stdout, " ".join(done.stderr.split())

    for name in runs:
        _, said = tinyrl("export-verl", "--from-run", f"../dp/runs/{name}", "--gpus", "2", "--out", f"verl-{name}")
        assert len(pd.read_parquet(dp2 / f"verl-{name}" / "data" / "train.parquet")) == 64, name  # dp's, not dp2's 100
        assert (dp2 / f"verl-{name}" / "user_reward" / "my_reward.py").read_text() == (dp / "my_reward.py").read_text()
        assert "instead" not in said, said  # the run's own files: nothing to say
        out, _ = tinyrl("estimate-cost", "--from-run", f"../dp/runs/{name}", "--json")
        assert json.loads(out)["prompts_per_epoch"] == 64, name
    # the run's data file is gone from where it started (its directory moved to another machine, say):
    # this directory's file of that name is used, and said
    (dp / "mydata" / "train.parquet").unlink()
    _, said = tinyrl("export-verl", "--from-run", "../dp/runs/dp", "--out", "verl-moved")
    assert len(pd.read_parquet(dp2 / "verl-moved" / "data" / "train.parquet")) == 100
    assert (f"data.train_path = mydata/train.parquet is not in {dp}, where the run was started: read "
            f"{dp2 / 'mydata' / 'train.parquet'} from here instead") in said, said
    out, said = tinyrl("estimate-cost", "--from-run", "../dp/runs/dp", "--json")
    assert json.loads(out)["prompts_per_epoch"] == 100 and f"read {dp2 / 'mydata' / 'train.parquet'}" in said, said


def test_an_actor_given_for_a_run_that_started_from_another_says_which_reference_tinyrl_had(tmp_path):
    """With --actor, the script's header said "tinyrl's reference was the base" of a run whose
    reference was its model.init_from, "the critic starts afresh" of GRPO, which has none, and
    still asked for `--actor DIR`, which had been given."""
    import pandas as pd

    data = tmp_path / "train.parquet"
    pd.read_parquet(Path(__file__).resolve().parent.parent / "data" / "countdown" / "test.parquet")[:64].to_parquet(data)
    cfg = load_config("countdown-tiny", [f"data.train_path={data}", "trainer.test_every=0",
                                         "algorithm.adv_estimator=grpo", "rollout.n=4"])
    cfg.model.init_from = "runs/sft"  # set after the check: no such run here, and none is read
    actor = tmp_path / "actor"
    actor.mkdir()
    (actor / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    warned: list[str] = []
    export_verl(cfg, tmp_path / "o", actor=actor, warn=warned.append)
    text = " ".join(line.lstrip("# ") for line in (tmp_path / "o" / "run_verl.sh").read_text().splitlines())
    assert "tinyrl's reference was the run's start, model.init_from = runs/sft)" in text
    assert "critic" not in text.split("verl starts from the exported actor")[1].split(" - ")[0]
    assert "model.init_from = 'runs/sft': verl starts from --actor (model.path) instead" in text
    assert "pass `--actor DIR`" not in text and "export again with `--actor DIR`" not in text and warned == []


def test_a_template_the_command_line_cannot_carry_is_said_to_ride_in_the_actor_when_it_does(tmp_path):
    """A template with newlines or quotes is not passed on verl's command line. Without --actor the
    recipe says to put it into the model's tokenizer_config.json; with an --actor whose tokenizer
    already carries it (`tinyrl export` saves chat_template.jinja) it said the same, a needless step."""
    import pandas as pd

    from tinyrl.setup import read_chat_template

    data = tmp_path / "train.parquet"
    pd.read_parquet(Path(__file__).resolve().parent.parent / "data" / "countdown" / "test.parquet")[:64].to_parquet(data)
    template = "presets/chat_templates/tiny-hermes.jinja"
    cfg = load_config("countdown-tiny", [f"data.train_path={data}", "trainer.test_every=0", "data.chat_template=true",
                                         f"model.custom_chat_template={template}"])
    text = read_chat_template(template)
    assert "\n" in text  # what keeps it off the command line

    def script(out, actor=None):
        export_verl(cfg, tmp_path / out, actor=actor, warn=lambda _: None)
        return " ".join(line.lstrip("# ") for line in (tmp_path / out / "run_verl.sh").read_text().splitlines())

    said_to_copy = "put its text in the model directory's tokenizer_config.json"
    assert said_to_copy in script("bare") and "custom_chat_template=" not in script("bare2")
    actor = tmp_path / "actor"
    actor.mkdir()
    (actor / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    (actor / "chat_template.jinja").write_text(text)
    carried = script("with-actor", actor)
    assert "the --actor directory's tokenizer carries it" in carried and said_to_copy not in carried
    (actor / "chat_template.jinja").unlink()  # an actor exported from a run with another template
    (actor / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ other }}"}))
    assert said_to_copy in script("other-actor", actor)
    (actor / "tokenizer_config.json").write_text(json.dumps({"chat_template": text}))  # transformers 4's place
    assert "the --actor directory's tokenizer carries it" in script("tf4-actor", actor)


def tinyrl_dependencies() -> list[str]:
    """The import names of tinyrl's own dependencies (pyproject.toml), but for what a task's reward
    requires (Task.reward_requires: math-verify), which run_verl.sh's header says to install, as
    pyproject pins it."""
    import tomllib

    from tinyrl.tasks import all_tasks

    project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]
    required = {r for task in all_tasks().values() for r in task.reward_requires}
    assert required and required <= set(project["dependencies"])  # the same pins
    name = lambda dep: re.match(r"[A-Za-z0-9_.-]+", dep).group(0).lower().replace("-", "_")  # noqa: E731
    return sorted({name(dep) for dep in project["dependencies"]} - {name(dep) for dep in required})


# A sitecustomize that makes each name unimportable (sys.modules[name] = None: `import name`
# raises ImportError), in the child and in every Python it starts (the maths verifier's worker).
BLOCKER = "import sys\nfor name in {names!r}:\n    sys.modules[name] = None\n"

SCORE_IN_VERLS_ENV = '''
import importlib, importlib.util, json, sys
for name in {names!r}:
    try:
        importlib.import_module(name)
    except ImportError:
        continue
    raise SystemExit(f"{{name}} is importable: the test would prove nothing")
spec = importlib.util.spec_from_file_location("reward_fn", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
cases = json.loads(sys.stdin.read())
scores = [module.compute_score(c["data_source"], c["completion"], c["ground_truth"], c["extra_info"]) for c in cases]
tool = None
if len(sys.argv) > 2:  # what tinyrl_tool.py imports from tinyrl (verl's own modules need ray), and a call
    from tinyrl.rollout.hermes import check_call
    from tinyrl.tools import TOOLS, render

    call = check_call(sys.argv[2], {{"code": "print(6 * 7)"}}, {{n: t.schema for n, t in TOOLS.items()}})
    tool = render(TOOLS[call.name].run(call.arguments, {{}}, timeout_s=10, memory_mb=512))
print(json.dumps({{"scores": scores, "tool": tool}}))
'''

# task -> the preset exported for it, and its overrides
VERL_ENV_TASKS = {
    "countdown": ("countdown-tiny", ["task.strict=true"]),  # strict: the whole row rides along as JSON
    "math": ("math-tiny", []),
    "retool": ("retool-4090", ["rollout.tool_timeout_s=2", "rollout.tool_memory_mb=512", "rollout.tool_workers=2"]),
    "arith": ("countdown-tools-demo", ["model.init_from="]),
}


@pytest.mark.parametrize("task", sorted(VERL_ENV_TASKS))
def test_the_exported_reward_runs_where_tinyrls_dependencies_cannot_be_imported(task, tmp_path):
    """verl 0.9.1 needs transformers<5.11 and tinyrl transformers>=5.17: one environment holds both
    only with tinyrl installed --no-deps (README, "When one GPU is not enough"). reward_fn.py's
    import chain then finds none of tinyrl's dependencies (typer was imported by every task module,
    pandas and pyarrow by the rows' reader): it must score exactly as tinyrl does without them."""
    from tinyrl.tasks import get_task

    train, test = get_task(task).generate(tmp_path / "data", 8, 8, progress=False)
    preset, extra = VERL_ENV_TASKS[task]
    cfg = load_config(preset, [f"data.train_path={train}", f"data.test_path={test}", "trainer.train_batch_size=4",
                               "actor.ppo_mini_batch_size=4", *extra])
    out = export_verl(cfg, tmp_path / "out", warn=lambda _: None)
    header = " ".join(line.lstrip("# ") for line in (out / "run_verl.sh").read_text().split("set -euo")[0].splitlines())
    assert "then tinyrl WITHOUT its dependencies" in header and "pip install --no-deps /path/to/tinyrl" in header
    assert ("pip install 'math-verify>=0.9,<0.10'" in header) == (task in ("math", "retool"))
    ours = get_task(task).make_reward(cfg.task)
    original = load_prompts(train).to_dict("records")
    cases, expected = [], []
    for row, verl_row in zip(original, pq.read_table(out / "data" / "train.parquet").to_pylist(), strict=True):
        truth = row["reward_model"]["ground_truth"]
        answer = row["extra_info"]["solution"] if task == "countdown" else truth["answer"] if task == "arith" else truth
        for completion in (f"<answer>{answer}</answer>", f"Assistant: <answer>{answer}</answer>",
                           f"Answer: {answer}", f"\\boxed{{{answer}}}", "no answer", "<answer>1</answer>"):
            expected.append(ours(completion, row))
            cases.append({"completion": completion, "data_source": verl_row["data_source"],
                          "ground_truth": verl_row["reward_model"]["ground_truth"], "extra_info": verl_row["extra_info"]})
    assert max(expected) > min(expected)  # the table reaches more than one score
    blocked = tinyrl_dependencies()
    assert {"transformers", "torch", "typer", "rich", "pandas", "pyarrow"} <= set(blocked)
    site = tmp_path / "verl-env"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER.format(names=blocked))
    repo = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), repo])}
    tools = ["code_interpreter"] if (out / "tinyrl_tool.py").is_file() else []
    assert bool(tools) == (task in ("retool", "arith"))
    done = subprocess.run([sys.executable, "-c", SCORE_IN_VERLS_ENV.format(names=blocked), str(out / "reward_fn.py"),
                           *tools], input=json.dumps(cases), capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout) == {"scores": expected, "tool": "42" if tools else None}


def dapo_rows(n: int) -> list[dict]:
    """Rows in DAPO-Math-17k's layout (verl's schema), each prompt once."""
    return [{"data_source": "math_dapo", "ability": "MATH", "extra_info": {"index": i},
             "prompt": [{"role": "user", "content": f"Solve: what is {i} + 1?\n\nAnswer: $Answer"}],
             "reward_model": {"style": "rule", "ground_truth": str(i + 1)}} for i in range(n)]


@pytest.mark.parametrize("preset, task", [("retool-4090", "retool"), ("math-grpo-4090", "math")])
def test_the_hint_for_a_missing_download_makes_the_very_file_the_preset_reads(preset, task, tmp_path):
    """The hint said `tinyrl data retool --from hf:BytedTsinghua-SIA/DAPO-Math-17k --out DIR`, which
    writes DIR/dapo-math-17k-train.parquet (the input's NAME-split), and the preset reads
    data/retool/dapo-math-17k.parquet: following it gave the same error again. Each hint is followed
    here (a local file standing in for the download) until the export succeeds."""
    import pyarrow as pa

    stand_in = tmp_path / "stand-in.parquet"  # another name than the preset's: --name must make it
    pq.write_table(pa.Table.from_pylist(dapo_rows(64)), stand_in)
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "COLUMNS": "400"}
    export = [sys.executable, "-m", "tinyrl.cli", "export-verl", "--preset", preset, "--out", "o"]
    cfg = load_config(preset)
    files = {"data.train_path": cfg.data.train_path, "data.test_path": cfg.data.test_path,
             **{f"data.val_files: {name}": str(path) for name, path in parse_data_args(cfg.data.val_files)}}
    sources = {"dapo-math-17k": "hf:BytedTsinghua-SIA/DAPO-Math-17k", "aime_2024": "hf:Maxwell-Jia/AIME_2024",
               "aime_2024-train": "hf:Maxwell-Jia/AIME_2024", "math-500-test": "hf:HuggingFaceH4/MATH-500:test"}
    for setting, path in files.items():  # in the order the export reads them
        done = subprocess.run(export, capture_output=True, text=True, timeout=120, env=env, cwd=work)
        said = " ".join(done.stderr.replace("│", " ").split())
        assert done.returncode == 2 and f"{setting} = {path} does not exist" in said, done.stderr
        command = re.search(r"(?:make it with |download it \()`(tinyrl data [^`]*)`", said).group(1)
        name, folder = Path(path).stem, Path(path).parent.as_posix()
        assert command == f"tinyrl data {task} --from {sources[name]} --name {name} --out {folder}"  # README's
        words = shlex.split(command)
        words[words.index("--from") + 1] = str(stand_in)
        made = subprocess.run([sys.executable, "-m", "tinyrl.cli", *words[1:]], capture_output=True, text=True,
                              timeout=120, env=env, cwd=work)
        assert made.returncode == 0, made.stderr
        assert (work / path).is_file()
    done = subprocess.run(export, capture_output=True, text=True, timeout=120, env=env, cwd=work)
    assert done.returncode == 0, done.stderr


def test_readme_names_every_file_an_export_writes(tmp_path):
    """README's "When one GPU is not enough" listed the export's files but for tinyrl_config.json."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme.split("## When one GPU is not enough", 1)[1].split("\n## ", 1)[0]
    out = retool_export(tmp_path)  # a task with tools: every file there is
    written = sorted(p.name + ("/" if p.is_dir() else "") for p in out.iterdir())
    assert {"run_verl.sh", "reward_fn.py", "tinyrl_config.json", "data/", "tinyrl_tool.py"} <= set(written)
    assert [name for name in written if f"`DIR/{name}" not in section] == []
