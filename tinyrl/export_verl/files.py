"""The files of a verl export: the data as verl reads it, reward_fn.py, and run_verl.sh.

Data: tinyrl's parquet already has verl's schema (`data_source`, `prompt`, `reward_model`,
`extra_info`), so the files are copied as they are, except that rewards which need the whole row
(TinyZero-strict reads the prompt; a user's function gets the row) carry it as JSON in
`extra_info.tinyrl_row`: verl hands compute_score only data_source, the decoded response,
ground_truth and extra_info (verl 0.9.1 experimental/reward_loop/reward_manager/naive.py).
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tinyrl.config import REPO_ROOT, Config, resolve_path
from tinyrl.errors import TinyRLError
from tinyrl.export_verl import tools
from tinyrl.export_verl.mapping import CMDLINE_SAFE

HERE = "$HERE/"  # values starting with this are paths relative to run_verl.sh
_SIMPLE = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*")
_SAFE = CMDLINE_SAFE  # safe inside bash "..." and Hydra '...'


def _plain(x: Any) -> Any:
    """Parquet's numpy arrays and scalars as JSON-able Python values."""
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, np.ndarray)):
        return [_plain(v) for v in x]
    return x.item() if isinstance(x, np.generic) else x


def write_data(cfg: Config, data_dir: Path, with_row: bool) -> tuple[Path, Path]:
    """train.parquet (copied, or generated exactly as `tinyrl train` would) and test.parquet (the
    first data.max_test_prompts rows: the ones tinyrl validates on)."""
    from tinyrl.data.io import load_prompts
    from tinyrl.tasks import data_hint

    data_dir.mkdir(parents=True, exist_ok=True)
    train, test = data_dir / "train.parquet", data_dir / "test.parquet"
    from tinyrl.setup import settle_train_path

    settle_train_path(cfg)  # a generated file made with other settings is not this config's data
    source = resolve_path(cfg.data.train_path)
    if source.exists():
        shutil.copyfile(source, train)
    else:  # what tinyrl.setup.ensure_train_data makes on first use: same sizes, seed, template
        from tinyrl.tasks import get_task, template_of

        task = get_task(cfg.task.name)
        if task.generate is None or not cfg.data.generate or cfg.data.generate_train_size < 1:
            raise TinyRLError(f"data.train_path = {cfg.data.train_path} does not exist",
                              hint=f"make it with {data_hint(cfg)}")
        task.generate(data_dir, cfg.data.generate_train_size, 1024, seed=cfg.data.generate_seed,
                      template=template_of(cfg.task), progress=False, **task.generate_options(cfg.task))
    test_source = resolve_path(cfg.data.test_path)
    if not test_source.exists():
        raise TinyRLError(f"data.test_path = {cfg.data.test_path} does not exist",
                          hint=f"verl needs validation files: make it with {data_hint(cfg, cfg.data.test_path)}, "
                          "or set data.test_path to a parquet file")
    load_prompts(test_source, max_rows=1)  # the same checks (and errors) as training
    pq.write_table(pq.read_table(test_source).slice(0, cfg.data.max_test_prompts), test)
    if with_row:
        for path in (train, test):
            _add_rows(path)
    return train, test


def write_val_files(cfg: Config, data_dir: Path, with_row: bool) -> list[Path]:
    """data.val_files (`name=path` each) as data/val_<name>.parquet, each cut to its first
    data.max_test_prompts rows as tinyrl validates (tinyrl.setup.load_inputs); verl reads the
    list in data.val_files (verl 0.9.1 utils/dataset/rl_dataset.py: a str or a list of files)."""
    from tinyrl.data.io import load_prompts
    from tinyrl.tasks import data_hint

    out = []
    for name, path, source, target in val_targets(cfg, data_dir):
        if not source.is_file():
            raise TinyRLError(f"data.val_files: {name} = {path} does not exist; nothing for verl to validate on",
                              hint=f"make or download it ({data_hint(cfg, path)}), or drop it from data.val_files")
        load_prompts(source, max_rows=1)  # the same checks (and errors) as training
        pq.write_table(pq.read_table(source).slice(0, cfg.data.max_test_prompts), target)
        if with_row:
            _add_rows(target)
        out.append(target)
    return out


def val_targets(cfg: Config, data_dir: Path) -> list[tuple[str, str, Path, Path]]:
    """(name, path as given, source, data/val_<name>.parquet) of each data.val_files entry."""
    from tinyrl.eval import parse_data_args

    out: list[tuple[str, str, Path, Path]] = []
    for name, path in parse_data_args(cfg.data.val_files):
        target = data_dir / f"val_{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}.parquet"
        if target in [t for *_, t in out] or target.name == "test.parquet":
            target = data_dir / f"val_{len(out)}_{target.name[4:]}"
        out.append((name, str(path), resolve_path(str(path)), target))
    return out


def _reward_file(spec: str) -> Path | None:
    """The file of a `file.py:func` reward spec (None: a task, or module:func)."""
    target = spec.rpartition(":")[0]
    return Path(target).expanduser() if target.endswith(".py") or "/" in target or "\\" in target else None


def check_inputs_kept(cfg: Config, out: Path) -> None:
    """Nothing the export writes may be a file it reads (issue 29): with --overwrite and
    data.test_path = OUT/data/test.parquet the user's file was cut to the exported rows, and
    data.train_path there failed with shutil's SameFileError. Checked before anything is written;
    every clash is reported. Paths compare resolved (symlinks), and by inode (hard links)."""
    data = out / "data"
    inputs = [("data.train_path", resolve_path(cfg.data.train_path), data / "train.parquet"),
              ("data.test_path", resolve_path(cfg.data.test_path), data / "test.parquet")]
    inputs += [(f"data.val_files ({name})", source, target) for name, _, source, target in val_targets(cfg, data)]
    for key, spec in [("reward.fn", cfg.reward.fn), *(("reward.extra_fns", s) for s in cfg.reward.extra_fns)]:
        source = _reward_file(spec)
        if source is not None:
            inputs.append((key, source, out / "user_reward" / source.name))
    inputs += [("task.extra_tools", source, target) for source, target in tools.extra_tool_copies(cfg, out)]
    written = [target for *_, target in inputs] + [out / n for n in (
        "run_verl.sh", "reward_fn.py", "tinyrl_config.json", tools.TOOL_CONFIG, f"{tools.TOOL_MODULE}.py")]
    clashes = []
    for key, source, _ in inputs:
        if not source.is_file():
            continue  # a missing input has its own error later; generated data is written, not read
        for target in written:
            if source.resolve() == target.resolve() or (target.is_file() and source.samefile(target)):
                clashes.append(f"{key} = {source} would be overwritten by the export's {target}")
    if clashes:
        raise TinyRLError("export-verl would write over files it reads; nothing was changed:\n"
                          + "\n".join(f"  - {c}" for c in clashes),
                          hint="keep inputs outside --out: copy them elsewhere and point the setting there "
                               "(e.g. --set data.test_path=/elsewhere/test.parquet), or export to another --out")


def _add_rows(path: Path) -> None:
    frame = pq.read_table(path).to_pandas()
    rows = [_plain(r) for r in frame.to_dict("records")]
    extra = frame["extra_info"] if "extra_info" in frame else [None] * len(frame)
    frame["extra_info"] = [{**(_plain(e) or {}), "tinyrl_row": json.dumps(r)} for e, r in zip(extra, rows)]
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path)


def row_count(path: Path) -> int:
    return pq.ParquetFile(path).metadata.num_rows


def reward_spec(cfg: Config, out: Path) -> tuple[str, bool]:
    """The reward spec reward_fn.py loads, and whether it needs the whole row. A user's
    `file.py:func` is copied beside reward_fn.py (so the export directory is all verl needs)."""
    from tinyrl.tasks.rewards import is_task_reward

    specs = [_copied(spec, out) for spec in [cfg.reward.fn, *cfg.reward.extra_fns]]
    builtin = all(is_task_reward(s) for s in specs)
    # TinyZero-strict reads the prompt; a user's function may read any column
    return specs, cfg.task.strict if builtin else True


def _copied(spec: str, out: Path) -> str:
    """A reward spec as reward_fn.py loads it: a user's file is copied into out/user_reward/."""
    source, func = _reward_file(spec), spec.rpartition(":")[2]
    if source is not None:
        if not source.is_file():
            raise TinyRLError(f"reward file not found: {source}", hint="give reward.fn=path/to/file.py:func")
        (out / "user_reward").mkdir(exist_ok=True)
        shutil.copyfile(source, out / "user_reward" / source.name)
        return f"user_reward/{source.name}:{func}"
    return spec  # a task, or module:func imported by name where verl runs


REWARD_FN = '''"""verl reward for a tinyrl export: verl's compute_score signature, tinyrl's own reward code,
so verl scores every completion exactly as `tinyrl train` does.
Written by `tinyrl export-verl` for verl {verl}. Needs tinyrl importable where verl runs, installed
without its dependencies (`pip install --no-deps /path/to/tinyrl`: its pins and verl's cannot share
one environment, and this file needs none of them), or TINYRL_SRC pointing at a checkout."""

import json
import sys
from pathlib import Path

SPECS = {spec!r}  # tinyrl's [reward.fn, *reward.extra_fns] (a copied file is relative to this one)
WEIGHTS = {weights!r}
TIMEOUT_S = {timeout_s!r}  # a user function's time per call (tinyrl's reward.timeout_s)
TASK = {task!r}  # tinyrl's [task] section
WHOLE_ROW = {whole_row!r}  # the reward reads the row (prompt, columns): kept in extra_info.tinyrl_row
TINYRL_SRC = {src!r}

try:
    import tinyrl  # noqa: F401
except ImportError:
    sys.path.insert(0, TINYRL_SRC)
from tinyrl.config import TaskConfig
from tinyrl.tasks.rewards import reward_set

_HERE = Path(__file__).resolve().parent
_reward = None


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    global _reward
    if _reward is None:
        specs = [str(_HERE / s) if s.startswith("user_reward/") else s for s in SPECS]
        _reward = reward_set(specs, WEIGHTS, TaskConfig(**TASK), TIMEOUT_S)
    if WHOLE_ROW:
        row = json.loads((extra_info or {{}})["tinyrl_row"])
    else:
        row = {{"data_source": data_source, "reward_model": {{"ground_truth": ground_truth}},
               "extra_info": extra_info}}
    return _reward(solution_str, row)
'''


def write_reward_fn(cfg: Config, out: Path, spec: str, whole_row: bool, verl: str) -> Path:
    path = out / "reward_fn.py"
    path.write_text(REWARD_FN.format(verl=verl, spec=spec, weights=list(cfg.reward.weights), timeout_s=cfg.reward.timeout_s,
                                     task=dataclasses.asdict(cfg.task), whole_row=whole_row, src=str(REPO_ROOT)))
    return path


def hydra_arg(key: str, value: Any) -> str:
    """One `key=value` argument as bash text: Hydra's override grammar inside bash quoting."""
    text = _hydra_value(key, value)
    return f'"{key}={text}"' if not _SIMPLE.fullmatch(text) and not _number(text) else f"{key}={text}"


def _number(text: str) -> bool:
    return re.fullmatch(r"-?\d+(\.\d+)?(e-?\d+)?", text) is not None


def _hydra_value(key: str, value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ",".join(_hydra_value(key, v) for v in value) + "]"
    value = str(value)
    if _SIMPLE.fullmatch(value) and value.lower() not in ("true", "false", "null", "nan", "inf"):
        return value
    body = value[len(HERE):] if value.startswith(HERE) else value
    if not _SAFE.fullmatch(body):
        raise TinyRLError(f"{key} = {value!r} has a quote, $, backtick, backslash or newline that the "
                          "exported script cannot pass to verl safely",
                          hint="rename or move it (e.g. a model directory) to a plain path and export again")
    return f"'{value}'"


def write_script(out: Path, overrides: dict[str, Any], header: list[str], notes: list[str],
                 wandb: bool, pythonpath: bool = False, warnings: list[str] = ()) -> Path:
    lines = ["#!/usr/bin/env bash"] + [f"# {h}" if h else "#" for h in header]
    if warnings:  # what would stop or mislead verl (the CLI prints them too)
        lines += ["#"] + [f"# WARNING: {w}" for w in warnings]
    lines += ["#", "# tinyrl settings verl cannot take as they are (every other setting is mapped below):"]
    lines += [f"#   - {n}" for n in notes] or ["#   (none)"]
    lines += ["", "set -euo pipefail", 'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"']
    if pythonpath:  # verl imports the tool class by module name (tools/tool_registry.py get_tool_class)
        lines.append('export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}"')
    if wandb:  # tinyrl logs to wandb in offline mode
        lines.append('export WANDB_MODE="${WANDB_MODE:-offline}"')
    lines += ["", "python3 -m verl.trainer.main_ppo \\"]
    lines += [f"    {hydra_arg(k, v)} \\" for k, v in overrides.items()]
    lines.append('    "$@"')
    path = out / "run_verl.sh"
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o755)
    return path
