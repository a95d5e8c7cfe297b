"""A preset file (or a run's saved config.json) plus --set items -> a validated Config.
"""

from __future__ import annotations

from pathlib import Path

from tinyrl.config.checks import problems_of
from tinyrl.config.files import _preset_path, list_presets, read_preset
from tinyrl.config.notes import _setting_or_none, role_rate_notes, unread_setting_notes
from tinyrl.config.overrides import _apply_dict, _migrate, apply_overrides, set_key
from tinyrl.config.schema import Config
from tinyrl.errors import TinyRLError
from tinyrl.words import counted


def load_config(preset: str, overrides: list[str] | None = None, check: bool = True,
                notes: list[str] | None = None, resume_dir: Path | None = None, planning: bool = False) -> Config:
    """Preset file (or a path to a .toml) + `key.sub=value` overrides, validated. Warnings that
    are not errors (role_rate_notes, unread_setting_notes) are appended to `notes` when the
    caller passes a list.
    `resume_dir`: the run `--resume` continues (its own starting model stands for model.init_from).
    `planning`: planned or priced, not run (probe-memory, estimate-cost): model.init_from's run
    need not exist yet, as a plan reads only model.name's shapes, which init_from must share."""
    path = _preset_path(preset)
    raw = read_preset(path)
    if not raw:  # every setting at its default is no run anyone chose (an empty file, a slip of the editor)
        raise TinyRLError(f"preset file {path} has no settings (it is empty or only comments)",
                          hint=f"start it from a shipped preset: `tinyrl presets show countdown-tiny >> {path}`, "
                               "then change what differs (`tinyrl presets` lists them; a preset cannot "
                               "name another to start from)")
    cfg = Config(preset=path.stem)  # the stem names the run directory (runs/NAME)
    cfg.given_preset = preset
    problems = _named_preset_problems(raw, overrides or [])
    problems += _apply_dict(cfg, {k: v for k, v in raw.items() if k != "preset"}, prefix="")
    problems += apply_overrides(cfg, overrides)
    if check or problems:  # a parse problem raises below: with every other problem, not the first kind only
        problems += problems_of(cfg, resume_dir, planning)
    if notes is not None:
        in_file = {f"{sec}.{k}" for sec, keys in raw.items() if isinstance(keys, dict) for k in keys}
        typed = {set_key(item) for item in overrides or []}
        # a preset file's key at its default changes nothing, read or not: `presets show P > mine.toml`
        # (README's way to make a preset) writes every key, and mine.toml started with 19 notes. A
        # --set is said even at its default: it was typed to change something.
        default = Config()
        changed = {d for d in in_file if _setting_or_none(cfg, d) != _setting_or_none(default, d)}
        notes += role_rate_notes(cfg, in_file | typed) + unread_setting_notes(cfg, changed | typed)
    if problems:
        shipped = path in list_presets().values()  # not the user's to edit: a copy of their own is
        where = (f"or in a preset of your own (`tinyrl presets show {preset} > mine.toml`, then --preset "
                 f"mine.toml)" if shipped else f"or in {path}")
        raise TinyRLError(
            f"preset {cfg.preset!r} has {counted(len(problems), 'problem')}:\n" + "\n".join(f"  - {p}" for p in problems),
            hint=f"fix each as it says (a setting: with --set key.sub=value, {where}); `tinyrl presets show {preset}` "
                 "lists every key",
        )
    return cfg


def _named_preset_problems(raw: dict, overrides: list[str]) -> list[str]:
    """`preset = "countdown-tiny"` in a file (or --set preset=...) reads as "start from that
    preset", but presets do not include each other: it only renamed the run (and its default
    --out, runs/countdown-tiny) while every other setting stayed at its default."""
    given = ([f"preset = {raw['preset']!r} in the file"] if "preset" in raw else [])
    given += [f"--set {item.strip()}" for item in overrides if set_key(item) == "preset"]
    return [f"{what}: a preset cannot name another preset to start from (its name is the file's, "
            "runs go to runs/NAME); copy that preset's file (presets/NAME.toml) and change what differs"
            for what in given]


def check_command(cfg: Config, command: str) -> None:
    """`tinyrl train` on an SFT preset would run RL on supervised rows (and build a critic for
    them), `tinyrl sft` on an RL preset would fine-tune on prompts without responses: refuse both.
    The hint repeats the --preset argument as given (cfg.preset_arg)."""
    if cfg.command == command:
        return
    given = cfg.preset_arg
    if command == "train":
        raise TinyRLError(f"preset {cfg.preset!r} is an SFT preset (command = \"sft\"): `tinyrl train` runs RL, "
                          "not supervised fine-tuning on its rows",
                          hint=f"fine-tune with `tinyrl sft --preset {given}`; RL from that run is a train "
                          "preset with model.init_from=RUN_DIR (the SFT preset's description names it)")
    sft_presets = [name for name, path in list_presets().items() if read_preset(path).get("command") == "sft"]
    raise TinyRLError(f"preset {cfg.preset!r} is an RL preset (command = \"train\"): `tinyrl sft` fine-tunes on "
                      "prompt/response or messages rows, which its data does not hold",
                      hint=f"run RL with `tinyrl train --preset {given}`; for SFT use an SFT preset "
                      f"({', '.join(sft_presets)}) or set command = \"sft\" in your own (--set command=sft)")


def config_from_dict(raw: dict) -> Config:
    """A run's saved config.json back into a Config (same checks as a preset file)."""
    cfg = Config()
    problems = _apply_dict(cfg, _migrate(raw), prefix="")
    if problems:
        raise TinyRLError("the saved config does not match this tinyrl version:\n"
                          + "\n".join(f"  - {p}" for p in problems),
                          hint="export/resume with the tinyrl version that wrote the run")
    return cfg
