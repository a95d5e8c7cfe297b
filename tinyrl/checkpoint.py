"""Checkpoints that survive kills, full disks and torn files.

A checkpoint holds only what training changes (adapters or trainable weights, value head,
optimizers, schedulers, KL controller, RNG states, the step — the data position follows from the
step because the data order is a seeded permutation per epoch).

    checkpoints/step_0000012/state.pt    torch.save of the state
    checkpoints/step_0000012/meta.json   {"step", "bytes", "run_id"}: state.pt's size once fsync'ed,
                                         and the run that wrote it (tinyrl.rundir)

Written into a hidden temporary directory, fsync'ed, then renamed into place, so a kill mid-write
leaves the previous one intact. Loading checks state.pt against meta.json and falls back to the
previous checkpoint when the newest is damaged (a truncated copy, a bad disk).
Before writing, free disk is compared with what the checkpoint needs (the previous checkpoint's
real size, else its tensors plus headers). When it does not fit, the older checkpoints that
keep_last would delete after this save anyway are deleted first if that makes room — never the
newest complete one; otherwise nothing is deleted and training goes on. `before_write` (the run
log's flush) runs after any pruning and before the checkpoint is written: the few KB of log lines
a full disk kept in memory get the freed room first, so a checkpoint of step N is not on disk
while the records of the steps before it exist nowhere but in memory (--resume would skip them).
Pruning renames a directory to a hidden name before deleting it, so a kill while deleting leaves
nothing that looks like a checkpoint; leftovers are cleaned by `clean_leftovers`.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import random
import re
import shutil
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

log = logging.getLogger(__name__)

PREFIX = "step_"
_NAME = re.compile(r"^step_(\d+)$")
HEADER_BYTES_PER_TENSOR = 1024   # zip entry + pickle record per tensor (measured: ~300-600 B)
HEADER_BYTES = 64 * 1024         # the pickle of the rest: RNG states, numbers


@dataclass
class SaveResult:
    saved: bool
    path: Path | None
    size_bytes: int
    message: str
    pruned: list[Path] = field(default_factory=list)


def human_bytes(n: float) -> str:
    """1.5 KiB, 612.0 KiB, 3.2 GiB: never "0.00 GiB" for a small size."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # unreachable; keeps type checkers quiet


def tensor_bytes(obj) -> int:
    """Bytes of every tensor in a nested dict/list (what torch.save will mostly write)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def _tensor_count(obj) -> int:
    if isinstance(obj, torch.Tensor):
        return 1
    if isinstance(obj, dict):
        return sum(_tensor_count(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_count(v) for v in obj)
    return 0


def free_disk_bytes(path: Path) -> int:
    return shutil.disk_usage(path).free


def step_of(path: Path) -> int:
    return int(_NAME.match(path.name).group(1))


def needed_bytes(ckpt_dir: Path, state: dict) -> tuple[int, str]:
    """What the next checkpoint will take on disk, and where that number comes from."""
    done = list_checkpoints(ckpt_dir)
    if done:  # the same structure as last time: its real size is the best measure
        return path_size(done[-1]), f"the size of the step-{step_of(done[-1])} checkpoint"
    tensors = tensor_bytes(state)
    need = tensors + HEADER_BYTES_PER_TENSOR * _tensor_count(state) + HEADER_BYTES
    return need, f"{human_bytes(tensors)} of tensors plus headers"


def save_checkpoint(ckpt_dir: Path, step: int, state: dict, keep_last: int, run_id: str | None = None,
                    before_write: Callable[[], object] | None = None) -> SaveResult:
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    clean_leftovers(ckpt_dir)
    need, why = needed_bytes(ckpt_dir, state)
    done = list_checkpoints(ckpt_dir)
    # Deleted after this save anyway (keep_last counts the new one); the newest complete
    # checkpoint is never among them, so a failed save still leaves one to resume from.
    others = [p for p in done if step_of(p) != step]
    doomed = others[:max(0, len(others) - max(keep_last - 1, 1))]
    free = free_disk_bytes(ckpt_dir)
    pruned: list[Path] = []
    if free < need:
        doomed_bytes = sum(path_size(p) for p in doomed)
        if doomed and free + doomed_bytes >= need:
            for old in doomed:
                _remove(old)
            pruned = doomed
            free = free_disk_bytes(ckpt_dir)
        else:
            older = sum(path_size(p) for p in done[:-1])
            if done[:-1] and free + older >= need:
                hint = (f"trainer.keep_last=1 would make room (set it on --resume), or free "
                        f"{human_bytes(need - free)}")
            else:
                hint = f"free at least {human_bytes(need - free)} there"
            return SaveResult(False, None, need, (
                f"not enough disk for the step-{step} checkpoint: it needs {human_bytes(need)} ({why}), "
                f"{human_bytes(free)} is free in {ckpt_dir}; "
                + (f"the last checkpoint (step {step_of(done[-1])}) is kept. " if done else "no checkpoint exists yet. ")
                + f"To save again: {hint}"))
    if before_write is not None:  # the log lines first: small, and lost for good if a resume skips them
        before_write()
    final = ckpt_dir / f"{PREFIX}{step:07d}"
    tmp = ckpt_dir / f".tmp-{PREFIX}{step:07d}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        path = tmp / "state.pt"
        with open(path, "wb") as fh:
            torch.save(state, fh)
            fh.flush()
            os.fsync(fh.fileno())
        (tmp / "meta.json").write_text(json.dumps({"step": step, "bytes": path.stat().st_size, "run_id": run_id}))
    except (OSError, RuntimeError) as exc:  # ENOSPC and friends: the previous checkpoint is untouched
        # torch.save turns a write's OSError into a RuntimeError of its zip writer (torch 2.13,
        # torch/serialization.py _open_zipfile_writer_buffer.__exit__); report the OS error.
        if isinstance(exc, RuntimeError):
            if not isinstance(exc.__context__, OSError):
                raise
            exc = exc.__context__
        shutil.rmtree(tmp, ignore_errors=True)
        kept = f"the last checkpoint (step {step_of(done[-1])}) is kept" if done else "no checkpoint exists yet"
        return SaveResult(False, None, need, f"could not write the step-{step} checkpoint ({exc}); {kept}")
    if final.exists():
        _remove(final)
    os.replace(tmp, final)
    size = path_size(final)
    for old in list_checkpoints(ckpt_dir)[:-keep_last]:
        _remove(old)
        pruned.append(old)
    return SaveResult(True, final, size, f"checkpoint step {step} saved: {human_bytes(size)} at {final}", pruned)


def _remove(path: Path) -> None:
    """Rename to a hidden name, then delete: a kill in between leaves no half checkpoint."""
    trash = path.with_name(f".trash-{path.name}")
    shutil.rmtree(trash, ignore_errors=True)
    os.replace(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def clean_leftovers(ckpt_dir: Path) -> list[Path]:
    """Remove what kills leave: temporary and half-deleted directories, and step directories
    without a state file (e.g. emptied by an older tinyrl's pruning). Returns what it removed."""
    removed = []
    if not ckpt_dir.exists():
        return removed
    for p in ckpt_dir.iterdir():
        if not p.is_dir():
            continue
        if p.name.startswith((".tmp-", ".trash-")) or (_NAME.match(p.name) and not (p / "state.pt").exists()):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


def list_checkpoints(ckpt_dir: Path) -> list[Path]:
    """Complete-looking checkpoints (with a state file), oldest first."""
    if not ckpt_dir.exists():
        return []
    done = [p for p in ckpt_dir.iterdir() if _NAME.match(p.name) and (p / "state.pt").is_file()]
    return sorted(done, key=step_of)


class DamagedCheckpoint(Exception):
    pass


def load_checkpoint(path: Path) -> dict:
    """One checkpoint directory's state; DamagedCheckpoint when it cannot be read whole."""
    state_file = path / "state.pt"
    meta_file = path / "meta.json"
    try:
        if meta_file.exists():
            want = json.loads(meta_file.read_text())["bytes"]
            have = state_file.stat().st_size
            if have != want:
                raise DamagedCheckpoint(f"state.pt has {have} bytes, {want} were written")
        # weights_only=False: the state holds python RNG state tuples and numbers, written by us.
        state = torch.load(state_file, map_location="cpu", weights_only=False)
    except DamagedCheckpoint:
        raise
    except (OSError, RuntimeError, EOFError, ValueError, KeyError, pickle.UnpicklingError,
            zipfile.BadZipFile) as exc:
        raise DamagedCheckpoint(f"{type(exc).__name__}: {str(exc)[:200]}") from exc
    if not isinstance(state, dict) or "step" not in state:
        raise DamagedCheckpoint("state.pt does not hold a tinyrl state")
    return state


@dataclass
class Loaded:
    state: dict
    path: Path
    damaged: list[tuple[Path, str]]  # newer checkpoints that could not be read, with why


def load_latest_good(ckpt_dir: Path) -> Loaded | None:
    """The newest checkpoint that loads; damaged newer ones are reported, not touched."""
    damaged: list[tuple[Path, str]] = []
    for path in reversed(list_checkpoints(ckpt_dir)):
        try:
            return Loaded(load_checkpoint(path), path, damaged)
        except DamagedCheckpoint as exc:
            damaged.append((path, str(exc)))
    if damaged:
        from tinyrl.errors import TinyRLError

        raise TinyRLError("no checkpoint in " + str(ckpt_dir) + " can be read:\n"
                          + "\n".join(f"  {p.name}: {why}" for p, why in damaged),
                          hint="move the damaged step_* directories away to start over from step 0 "
                               "with --resume, or restore them from a copy")
    return None


def load_latest(ckpt_dir: Path) -> dict | None:
    loaded = load_latest_good(ckpt_dir)
    if loaded is None:
        return None
    for path, why in loaded.damaged:
        log.warning("checkpoint %s is damaged (%s); using %s", path, why, loaded.path.name)
    return loaded.state


def set_aside(path: Path) -> Path:
    """Rename a damaged checkpoint out of the way (kept for inspection, safe to delete)."""
    target = path.with_name(f"damaged-{path.name}")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"damaged{n}-{path.name}")
    os.replace(path, target)
    return target


def path_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def rng_state() -> dict:
    return {"python": random.getstate(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class SaveLedger:
    """Which step is safely on disk. The first failed save is reported loudly (`warn`), later
    ones quietly (`note`); `unsaved(step)` says what a run ending at `step` would lose."""

    def __init__(self, warn, note, last_saved: int | None = None):
        self.warn, self.note = warn, note
        self.last_saved = last_saved
        self.failed: list[int] = []
        self.last_error = ""

    def record(self, step: int, result: SaveResult) -> None:
        if result.saved:
            self.last_saved, self.failed = step, []
            self.note(result.message)
            return
        self.failed.append(step)
        self.last_error = result.message
        if len(self.failed) == 1:
            self.warn(f"CHECKPOINT NOT SAVED: {result.message}. Training goes on; later saves will "
                      "try again.")
        else:
            self.note(f"step {step}: checkpoint not saved either ({result.message})")

    def unsaved(self, step: int) -> str | None:
        if self.last_saved == step:
            return None
        since = 0 if self.last_saved is None else self.last_saved
        where = f"the last checkpoint is step {self.last_saved}" if self.last_saved is not None \
            else "no checkpoint was saved"
        return (f"steps {since + 1}-{step} were not checkpointed ({where}); "
                f"last error: {self.last_error or 'none'}")
