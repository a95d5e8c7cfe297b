"""`tinyrl export-verl`: hand a preset or a run to verl (multi-GPU) with the same settings.

Writes OUT/run_verl.sh (`python3 -m verl.trainer.main_ppo key=value ...`, the settings verl cannot
take listed at its top), OUT/data/{train,test}.parquet (and val_<name>.parquet per data.val_files entry), OUT/reward_fn.py (tinyrl's reward behind
verl's compute_score signature), OUT/tinyrl_config.json (the resolved tinyrl config) and, for a
task with tools, OUT/tool_config.yaml + OUT/tinyrl_tool.py (tinyrl/export_verl/tools.py).
All or nothing (tinyrl/export_verl/staging.py): OUT changes only once every file is written.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tinyrl.config import Config, has_critic
from tinyrl.errors import TinyRLError
from tinyrl.export_info import read_export
from tinyrl.export_verl import files, tools
from tinyrl.export_verl.mapping import VERL_VERSION, Context, map_config
from tinyrl.export_verl.staging import staged
from tinyrl.words import counted
from tinyrl.writable import check_writable


def check_out_dir(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise TinyRLError(f"--out {out} is a file; nothing was changed", hint="give a directory path")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise TinyRLError(f"--out {out} is not empty; nothing was changed",
                          hint="choose a new directory, or add --overwrite to replace the exported files there")
    check_writable(out, lost="nothing was changed", example="verl-job")  # `--out run.sh` made a directory run.sh


def model_path(cfg: Config, actor: Path | None) -> tuple[str, list[str]]:
    """What verl loads as the actor (and reference): the base model, or a `tinyrl export` of a run."""
    from tinyrl.tiny_model import TINY_MODEL_NAME, TinyRecipe, _build_dir_name, default_cache_root

    if actor is not None:
        check_actor(actor)
        _check_actor_base(actor, cfg.model.name)
        reference = f"the run's start, model.init_from = {cfg.model.init_from}" if cfg.model.init_from \
            else f"the base {cfg.model.name}"
        critic = ", and the critic starts afresh from the base" if has_critic(cfg) else ""
        return str(actor.resolve()), [
            f"verl starts from the exported actor {actor.resolve()}: it is also verl's KL reference "
            f"(tinyrl's reference was {reference}){critic}"]
    if cfg.model.name == TINY_MODEL_NAME:
        path = default_cache_root() / _build_dir_name(TinyRecipe())
        return str(path), [f"model.name = {TINY_MODEL_NAME!r} is built locally by tinyrl (at {path}); "
                           "run `tinyrl train --preset countdown-tiny` once to build it, copy it where verl runs"]
    local = Path(cfg.model.name).expanduser()
    if local.exists():
        return str(local.resolve()), [f"model.name is a local directory: copy {local.resolve()} where verl runs"]
    return cfg.model.name, []


def check_actor(actor: Path) -> None:
    """--actor is what verl loads as actor_rollout_ref.model.path: a Hugging Face model directory
    (config.json with a model_type) or a `tinyrl export`. A tinyrl run directory has a
    config.json too (tinyrl's own settings), and was taken: verl failed at start, on rented GPUs."""
    from tinyrl.rundir import is_run_dir

    export_hint = "write one with `tinyrl export RUN_DIR --out DIR`, then pass --actor DIR"
    if not actor.is_dir():
        raise TinyRLError(f"--actor {actor} is not a directory ({'a file' if actor.exists() else 'not found'}); "
                          "nothing was written", hint=export_hint)
    if is_run_dir(actor):
        raise TinyRLError(f"--actor {actor} is a tinyrl run directory, not a Hugging Face model: verl cannot load "
                          "it; nothing was written",
                          hint=f"export its actor first: `tinyrl export {actor} --out DIR`, then --actor DIR")
    if read_export(actor) is not None:
        return
    try:
        raw = json.loads((actor / "config.json").read_text())
    except FileNotFoundError:
        raise TinyRLError(f"--actor {actor} is not a Hugging Face model directory (no config.json); nothing was written",
                          hint=export_hint) from None
    except (OSError, ValueError) as e:
        raise TinyRLError(f"--actor {actor}: its config.json cannot be read ({type(e).__name__}: {e}); nothing was "
                          "written", hint=export_hint) from None
    if not isinstance(raw, dict) or not isinstance(raw.get("model_type"), str):
        raise TinyRLError(f"--actor {actor} is not a Hugging Face model directory (its config.json has no "
                          "model_type); nothing was written", hint=export_hint)


def _check_actor_base(actor: Path, base: str) -> None:
    """A `tinyrl export` names the base its run trained on: verl's critic starts from this
    config's base, so another base (a 0.5B actor beside a 3B critic) would run, mismatched."""
    info = read_export(actor)
    if info is None or info.base is None:  # not a tinyrl export (or an older one): nothing to compare
        return
    exported_from = info.base
    from tinyrl.init_from import same_directory

    same = same_directory(exported_from, base)
    if (exported_from == base) if same is None else same:
        return
    raise TinyRLError(f"--actor {actor} was exported from a run on {exported_from}, and this config's base "
                      f"(model.name) is {base}: verl's critic would start from another model than its actor",
                      hint=f"export that run's own settings (--from-run RUN_DIR), or --set model.name={exported_from}")


def export_verl(cfg: Config, out: Path, gpus: int = 1, nodes: int = 1, overwrite: bool = False,
                actor: Path | None = None, source: str = "", warn: Callable[[str], None] | None = None,
                wrote: Callable[[list[str]], None] | None = None) -> Path:
    """Write the verl recipe into `out`; `warn` hears what would stop or mislead verl (it is in the
    script's header too), `wrote` the names this export put at the top of `out` (folders end in /):
    run_verl.sh first, then the other files, then the folders, each in name order."""
    if gpus < 1 or nodes < 1:
        raise TinyRLError(f"--gpus {gpus} --nodes {nodes}: both must be at least 1", hint="e.g. --gpus 8 --nodes 1")
    if cfg.command == "sft":  # the mapping is of RL settings (main_ppo); verl's SFT trainer is another program
        raise TinyRLError(f"{source or cfg.preset} is an SFT preset (command = \"sft\"): export-verl writes verl's "
                          "RL recipe (verl.trainer.main_ppo), and SFT settings are not mapped; nothing was written",
                          hint=f"verl {VERL_VERSION} fine-tunes with `torchrun -m verl.trainer.sft_trainer` "
                          "(config sft_trainer_engine.yaml), which reads this preset's parquet as it is; "
                          "export the RL preset that follows it instead")
    check_out_dir(out, overwrite)
    files.check_inputs_kept(cfg, out)  # --overwrite never writes over the export's own inputs
    path, model_notes = model_path(cfg, actor)
    with staged(out) as stage:  # all or nothing: --out changes only once every file is written
        spec, whole_row = files.reward_spec(cfg, stage)
        train, _ = files.write_data(cfg, stage / "data", with_row=whole_row)
        extra_val = files.write_val_files(cfg, stage / "data", with_row=whole_row)
        steps = files.row_count(train) // cfg.trainer.train_batch_size
        if steps < 1:
            raise TinyRLError(f"{cfg.data.train_path} has fewer rows than one batch "
                              f"(trainer.train_batch_size = {cfg.trainer.train_batch_size})",
                              hint="lower trainer.train_batch_size or use more data")
        files.write_reward_fn(cfg, stage, spec, whole_row, VERL_VERSION)
        tool_files = tools.write_tool_files(cfg, stage, VERL_VERSION)
        val_files = [files.HERE + "data/test.parquet"] + [files.HERE + f"data/{p.name}" for p in extra_val]
        ctx = Context(model_path=path, train_files=files.HERE + "data/train.parquet",
                      val_files=val_files if extra_val else val_files[0], reward_path=files.HERE + "reward_fn.py",
                      steps_per_epoch=steps, gpus=gpus, nodes=nodes,
                      critic_model_path=model_path(cfg, None)[0],  # the value head is not in an export
                      tool_config_path=files.HERE + tools.TOOL_CONFIG if tool_files else "",
                      actor_given=actor is not None)
        mapping = map_config(cfg, ctx)
        header = [f"verl {VERL_VERSION} recipe exported by `tinyrl export-verl` from {source or cfg.preset}",
                  f"{gpus} GPU(s) per node x {nodes} node(s); keys are verl {VERL_VERSION}'s "
                  "(verl/trainer/config/_generated_ppo_trainer.yaml); other verl versions may rename some.",
                  *install_lines(cfg),
                  "Extra arguments are passed to verl: ./run_verl.sh trainer.total_epochs=3",
                  f"Data: data/ ({counted(steps, 'step')} per epoch at this batch size); reward: reward_fn.py ({cfg.reward.fn})."]
        if whole_row:
            header.append("The reward reads whole rows: they ride along as JSON in extra_info.tinyrl_row.")
        if tool_files:
            header.append(f"Tools ({', '.join(tools.task_tools(cfg))}): multi-turn rollouts with {tools.TOOL_CONFIG}, "
                          f"whose class ({tools.TOOL_MODULE}.py) runs tinyrl's Python sandbox"
                          + (f" and your task.extra_tools, copied into {tools.USER_TOOLS}/." if cfg.task.extra_tools else "."))
        for one in spec:
            if ":" in one and not one.startswith("user_reward/"):
                header.append(f"reward.fn = {one}: that module must be importable where verl runs.")
        files.write_script(stage, mapping.overrides, header, model_notes + mapping.notes, cfg.trainer.wandb,
                           pythonpath=bool(tool_files), warnings=mapping.warnings)
        (stage / "tinyrl_config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
        names = [p.name + "/" * p.is_dir() for p in stage.iterdir()]  # all of it moves into --out
    for w in mapping.warnings if warn else ():
        warn(f"WARNING: {w}")
    if wrote is not None:
        wrote(sorted(names, key=lambda n: (n != "run_verl.sh", n.endswith("/"), n)))
    return out


def install_lines(cfg: Config) -> list[str]:
    """What to install where verl runs. tinyrl goes in without its dependencies: its pins
    (transformers>=5.17) and verl's (transformers<5.11) cannot share one environment, and
    reward_fn.py's import chain needs none of them (tests/test_export_verl.py runs it without
    them), only what the task's reward requires (math-verify for the maths rewards)."""
    from tinyrl.config import REPO_ROOT
    from tinyrl.tasks.rewards import task_of

    used = [task for spec in [cfg.reward.fn, *cfg.reward.extra_fns] if (task := task_of(spec, cfg.task))]
    requires = sorted({r for task in used for r in task.reward_requires})
    lines = [f"Needs: pip install verl=={VERL_VERSION} (with its dependencies), then tinyrl WITHOUT its dependencies "
             "(reward_fn.py imports it; its pins, transformers>=5.17, and verl's, <5.11, cannot share one environment):",
             f"  pip install --no-deps /path/to/tinyrl   (a copy of the checkout this export came from, {REPO_ROOT})"]
    if requires:
        lines.append("  pip install " + " ".join(f"'{r}'" for r in requires) + "   (the reward's own requirement)")
    return lines


def config_of_run(run_dir: Path, overrides: list[str] | None) -> Config:
    """A run's saved config.json, with --set overrides applied and checked like a preset."""
    from tinyrl.config import apply_overrides, config_from_dict, problems_of
    from tinyrl.rundir import rebase_paths

    path = run_dir / "config.json"
    if not path.is_file():
        raise TinyRLError(f"{run_dir} is not a run directory (no config.json)",
                          hint="pass the --out directory of a `tinyrl train` run")
    try:
        cfg = config_from_dict(json.loads(path.read_text()))
    except json.JSONDecodeError as e:
        raise TinyRLError(f"{path} is not valid JSON: {e}", hint="the run's config.json is damaged") from e
    rebase_paths(cfg, run_dir)  # its relative paths, from where it was started
    problems = apply_overrides(cfg, overrides) + problems_of(cfg)
    if problems:
        raise TinyRLError(f"the run's config has {counted(len(problems), 'problem')}:\n"
                          + "\n".join(f"  - {p}" for p in problems), hint="fix each as it says (a setting: with --set key.sub=value)")
    return cfg
