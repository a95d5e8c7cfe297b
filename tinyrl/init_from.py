"""model.init_from: start a run from another run's latest weights (`tinyrl sft`, then RL).

verl's recipe, once per run: SFT, merge the SFT model into plain weights (verl's model_merger),
then RL with that model as the actor's starting point AND as the reference. Here the source
run's latest actor is exported as `tinyrl export` writes it (a LoRA adapter merged into its
base, or the full weights) into RUN_DIR/init_model, and that directory is the new run's model:
the trainer loads it as the base (LoRA adapters go on top of it, so "adapters off", the
reference, is the SFT model), the vLLM engine loads the same files, and `tinyrl export` /
`tinyrl eval` of the new run merge its adapter into it. A resumed run reuses the directory, so
its starting point and reference stay what they were even if the source run trained on.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

from tinyrl.errors import TinyRLError
from tinyrl.export_info import MARKER, read_export

log = logging.getLogger(__name__)

INIT_DIR = "init_model"


def source_problems(cfg, not_made_yet_ok: bool = False) -> list[str]:
    """model.init_from's problems (config.problems_of): a run directory with a checkpoint, made
    on the same base model. `not_made_yet_ok`: a run not made (or saved) yet is none (a plan)."""
    from tinyrl import checkpoint as ckpt

    setting = cfg.model.init_from
    src = Path(setting).expanduser()
    if not (src / "config.json").is_file():
        if not_made_yet_ok:
            return []
        what = "no config.json" if src.exists() else "no such directory"
        return [f"model.init_from = {setting} is not a run directory ({what}); "
                + (_made_by(src, cfg.trainer.out_dir) or _near_run(src)
                   or "give the --out directory of a `tinyrl sft` (or `tinyrl train`) run")]
    try:
        saved = json.loads((src / "config.json").read_text())
        base = saved["model"]["name"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return [f"model.init_from = {setting}: cannot read its config.json ({type(exc).__name__}: {exc})"]
    out = []
    if not same_model(base, src, cfg.model.name):
        out.append(f"model.init_from = {setting} was trained on {base}, but model.name = {cfg.model.name}; "
                   f"set model.name={_as_seen_from_here(base, src)}")
    if not ckpt.list_checkpoints(src / "checkpoints") and not not_made_yet_ok:
        out.append(f"model.init_from = {setting} has no checkpoint yet; let it run until its first save "
                   "(trainer.save_every, and always at its last step)")
    return out


def resumes_from_own_copy(cfg, run_dir: Path) -> bool:
    """--resume of a run that holds a finished export of model.init_from (model_path_of reuses it)."""
    return _made_from(Path(run_dir) / INIT_DIR, Path(cfg.model.init_from).expanduser())


def _as_seen_from_here(name: str, run_dir: Path) -> str:
    """A run's model.name as this directory reaches it, relative to here: a relative local
    directory is relative to where that run started (rundir.seen_from_here), which need not be here."""
    from tinyrl.rundir import seen_from_here

    seen = seen_from_here(name, run_dir)
    return name if seen == name else os.path.relpath(seen)


def same_model(run_name: str, run_dir: Path, name: str) -> bool:
    """Whether run_dir's model.name (`run_name`, as that run read it) is `name` as read here: the
    same local directory, however reached (`mymodel` from where the SFT run started is
    `../mymodel` from here, and `mymodel` here is another or none), else the same Hub id."""
    same = same_directory(name, _as_seen_from_here(run_name, run_dir))
    return run_name == name if same is None else same  # None: a Hugging Face id


def same_directory(a: str, b: str) -> bool | None:
    """Two model.name values as read from here: whether they are the same local directory,
    whatever the spelling; None when neither is a directory (Hugging Face ids: compare names)."""
    here, there = Path(a).expanduser(), Path(b).expanduser()
    if here.is_dir() or there.is_dir():
        return here.is_dir() and there.is_dir() and here.resolve() == there.resolve()
    return None


def _near_run(src: Path) -> str | None:
    """A mistyped run directory (runs/sfft): the run beside it with the nearest name."""
    from tinyrl.rundir import is_run_dir
    from tinyrl.writable import nearest_sibling

    if src.exists():
        return None
    near = nearest_sibling(src, lambda p: p.is_dir() and is_run_dir(p))
    return f"did you mean {near}?" if near else None


def _made_by(src: Path, out_dir: str) -> str | None:
    """'runs/NAME' is where preset NAME's run goes by default (--out): the command that makes it,
    so a user following a demo's chain of presets learns which step is missing."""
    from tinyrl.config import list_presets, read_preset

    preset = list_presets().get(src.name)
    if preset is None or src.parent != Path(out_dir):
        return None
    command = "sft" if "sft" in read_preset(preset) else "train"
    return f"it is what `tinyrl {command} --preset {src.name}` writes: run that first"


def model_path_of(cfg, run_dir: Path | None) -> str:
    """The model a run starts from: model.name (the tiny model built on first use), or with
    model.init_from the source run's latest actor, written to RUN_DIR/init_model once."""
    from tinyrl.tiny_model import resolve_model_path

    if not cfg.model.init_from:
        return resolve_model_path(cfg.model.name)
    if run_dir is None:
        raise TinyRLError("model.init_from needs the run directory to write the starting model into",
                          hint="pass run_dir (the CLI does)")
    from tinyrl import checkpoint as ckpt

    source, dest = Path(cfg.model.init_from).expanduser(), Path(run_dir) / INIT_DIR
    if ckpt.list_checkpoints(Path(run_dir) / "checkpoints") and not _made_from(dest, source):
        # Its checkpoints are deltas of the model it started from; the source may have trained on.
        raise TinyRLError(f"{run_dir} has checkpoints but its starting model {dest} is missing or was made from "
                          f"another run than model.init_from = {cfg.model.init_from}; writing it again could "
                          "give another starting point and reference than the checkpoints were trained against",
                          hint=f"restore {dest} from a copy, or start a new run in another --out directory")
    return str(materialize(source, dest))


def base_of_run(cfg, run_dir: Path) -> str:
    """The base a run's checkpoints are deltas of (export and eval merge into it)."""
    from tinyrl.tiny_model import resolve_model_path

    if not cfg.model.init_from:
        return resolve_model_path(cfg.model.name)
    path = Path(run_dir) / INIT_DIR
    if not (path / MARKER).is_file():
        raise TinyRLError(f"{run_dir} started from model.init_from = {cfg.model.init_from}, but its starting "
                          f"model {path} is missing or unfinished",
                          hint=f"restore {path} from a copy; it was written from the source run when this run began")
    return str(path)


def describe(model_dir: str | Path, resume: bool = False) -> str:
    """One line: which run and step a starting model came from. On --resume the run goes on
    from its own checkpoint: "starting from RUN at step N" read as if it resumed there."""
    info = read_export(model_dir)
    source = f"{info.run_dir} at step {info.step} ({model_dir})" if info else str(model_dir)
    if resume:
        return (f"model.init_from: the base of this run is {source}, written when it began; "
                "it resumes from its own latest checkpoint")
    return f"model.init_from: starting from {source}"


def _made_from(dest: Path, source: Path) -> bool:
    """A finished export of `source` is at `dest`."""
    info = read_export(dest)
    return info is not None and Path(info.run_dir).expanduser().resolve() == source.resolve()


def materialize(source: Path, dest: Path) -> Path:
    """Export `source`'s latest actor to `dest` unless a finished export of it is there already.
    Written aside and renamed into place, so a kill leaves no half model that looks finished."""
    from tinyrl.export import export_run

    if _made_from(dest, source):
        return dest
    if (dest / MARKER).is_file():
        log.warning("%s was made from another run than %s: writing it again", dest, source)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".tmp-{dest.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        export_run(source, tmp, dtype="base")  # bf16 bases stay bf16 on disk (the GPU trainer loads bf16)
        if dest.exists():
            shutil.rmtree(dest)  # tinyrl's own directory: unfinished, or made from another run
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest
