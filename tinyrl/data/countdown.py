"""Generate Countdown tasks and write them in TinyZero's parquet schema (shared/ALGORITHMS.md).

Every task is solvable by construction: draw 3 or 4 numbers in 1..100 (as TinyZero), combine
them in random order with random operators until one value remains, and keep it as the target
when it is an integer in 1..1000 (TinyZero's max_target). Every intermediate value is a positive
integer (exact division only), so the stored reference expression reads like a human answer.
Train and test come from separate seeded streams, and train skips every (numbers, target) that
is in test. With `sft=True`, sft_train.parquet and sft_test.parquet hold the same rows plus a
`response` column, the reference solution in the answer format (`tinyrl sft` reads them). Pure Python plus columnar pyarrow: 327,680 rows take seconds, not minutes.
"""

from __future__ import annotations

import operator
import random
from contextlib import nullcontext
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tinyrl.data.templates import countdown_prompt, countdown_response
from tinyrl.errors import TinyRLError
from tinyrl.writable import ANOTHER_OUT, make_dir, refuse_existing, staged

MIN_NUMBER, MAX_NUMBER, MAX_TARGET = 1, 100, 1000
# Tasks are built in memory (~0.5 KB each with the prompt) before writing: 4M rows per split is
# ~2 GB and 12x TinyZero's 327,680; the (numbers, target) space holds a few million distinct tasks.
MAX_ROWS = 4_000_000
_ATOM, _MUL, _ADD = 3, 2, 1  # precedence of a literal, of * and /, of + and -
_PROGRESS_EVERY = 4096
OPERANDS = (3, 4)  # how many numbers a task has (TinyZero: 3 or 4), drawn uniformly
_MAX_MISSES = 100_000
_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.floordiv}  # exact


def _combine(rng: random.Random, a: tuple, b: tuple) -> tuple:
    """Join two (value, text, precedence) terms with an operator that keeps a positive integer."""
    if a[0] < b[0]:
        a, b = b, a
    ops = ["+", "*"]
    if a[0] != b[0]:
        ops.append("-")
    if b[0] > 1 and a[0] % b[0] == 0:
        ops.append("/")
    op = rng.choice(ops)
    value = _OPS[op](a[0], b[0])
    prec = _ADD if op in "+-" else _MUL
    left = a[1] if a[2] >= prec else f"({a[1]})"
    # a - (b + c) and a / (b * c) need their parentheses; a + (b - c) and a * (b / c) do not
    right = b[1] if b[2] > prec or (b[2] == prec and op in "+*") else f"({b[1]})"
    return value, f"{left} {op} {right}", prec


def make_task(rng: random.Random, n_numbers: int, max_number: int = MAX_NUMBER) -> tuple[list[int], int, str]:
    """(numbers, target, reference solution) using every number exactly once."""
    while True:  # about half the draws land in 1..MAX_TARGET
        nums = [rng.randint(MIN_NUMBER, max_number) for _ in range(n_numbers)]
        pool = [(n, str(n), _ATOM) for n in nums]
        while len(pool) > 1:
            a = pool.pop(rng.randrange(len(pool)))
            pool.append(_combine(rng, a, pool.pop(rng.randrange(len(pool)))))
        target, solution, _ = pool[0]
        if target <= MAX_TARGET:
            return nums, target, solution


def _tasks(rng: random.Random, size: int, exclude: set, tick, operands=OPERANDS, max_number=MAX_NUMBER) -> list[tuple]:
    tasks, misses = [], 0
    while len(tasks) < size:
        nums, target, solution = make_task(rng, rng.choice(tuple(operands)), max_number)
        if (tuple(sorted(nums)), target) in exclude:
            misses += 1  # a small task space (few, small numbers) can be nearly all held out
            if misses > _MAX_MISSES:
                raise TinyRLError(f"cannot draw training tasks outside the test split: {_MAX_MISSES:,} draws in a "
                                  f"row were test tasks ({operands} numbers up to {max_number})",
                                  hint="use more or larger numbers (task.operands, task.max_number) or fewer test tasks")
            continue
        misses = 0
        tasks.append((nums, target, solution))
        if len(tasks) % _PROGRESS_EVERY == 0:
            tick(_PROGRESS_EVERY)
    tick(len(tasks) % _PROGRESS_EVERY)
    return tasks


def _table(tasks: list[tuple], split: str, template: str) -> pa.Table:
    """Build the columns directly: per-row dicts through pyarrow would cost several seconds."""
    n = len(tasks)
    nums = pa.array([t[0] for t in tasks], pa.list_(pa.int64()))
    target = pa.array([t[1] for t in tasks], pa.int64())
    content = pa.array([countdown_prompt(t[0], t[1], template) for t in tasks], pa.string())
    message = pa.StructArray.from_arrays([pa.array(["user"] * n), content], ["role", "content"])
    prompt = pa.ListArray.from_arrays(pa.array(range(n + 1), pa.int32()), message)
    truth = pa.StructArray.from_arrays([target, nums], ["target", "numbers"])
    reward = pa.StructArray.from_arrays([pa.array(["rule"] * n), truth], ["style", "ground_truth"])
    extra = pa.StructArray.from_arrays(
        [pa.array([split] * n), pa.array(range(n), pa.int64()), pa.array([t[2] for t in tasks])],
        ["split", "index", "solution"])
    return pa.table({"target": target, "nums": nums, "data_source": pa.array(["countdown"] * n),
                     "prompt": prompt, "ability": pa.array(["math"] * n), "reward_model": reward,
                     "extra_info": extra})


def option_problems(operands, max_number, flags: bool = False) -> list[str]:
    """The easier-setting options (task.operands, task.max_number), every problem at once; `flags`:
    named as `tinyrl data countdown` takes them (--operands 3,4, --max-number)."""
    out = []
    if not operands or any(isinstance(n, bool) or not isinstance(n, int) or not 2 <= n <= 6 for n in operands):
        given, example = ((f"--operands {','.join(map(str, operands))}", "3,4") if flags
                          else (f"task.operands = {list(operands)}", "[3, 4]"))
        out.append(f"{given} must list numbers-per-task counts from 2 to 6, e.g. {example}")
    if isinstance(max_number, bool) or not isinstance(max_number, int) or not 2 <= max_number <= MAX_NUMBER:
        out.append(f"{'--max-number ' if flags else 'task.max_number = '}{max_number!r} must be an integer from 2 "
                   f"to {MAX_NUMBER}")
    return out


def _progress_bar(enabled: bool):
    from rich.console import Console
    from rich.progress import Progress

    console = Console(stderr=True)
    if not enabled or not console.is_terminal:  # piped, a transient bar left only an empty line
        return nullcontext(None)
    return Progress(console=console, transient=True)


def _with_responses(table: pa.Table, tasks: list[tuple]) -> pa.Table:
    return table.append_column("response", pa.array([countdown_response(t[2], t[1]) for t in tasks], pa.string()))


def generate_countdown(out_dir: str | Path, train_size: int, test_size: int, seed: int = 0,
                       template: str = "base", progress: bool = True, sft: bool = False, operands=OPERANDS,
                       max_number: int = MAX_NUMBER) -> tuple[Path, Path]:
    """Write `train.parquet` and `test.parquet` under `out_dir` (with `sft`, also
    `sft_train.parquet` and `sft_test.parquet`); return the paths of the first two. `operands`:
    the numbers per task (one count drawn per task), `max_number`: the largest number (easier
    settings for small models; the defaults are TinyZero's)."""
    problems = option_problems(operands, max_number)
    if problems:
        raise TinyRLError("; ".join(problems), hint="e.g. operands (2, 3) and max_number 20")
    for name, size in (("train_size", train_size), ("test_size", test_size)):
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_ROWS:
            raise TinyRLError(f"{name} must be an integer from 1 to {MAX_ROWS:,}, got {size!r}",
                              hint="TinyZero uses train_size=327680, test_size=1024")
    countdown_prompt([1, 2, 3], 6, template)  # unknown template: fail before any work
    out = make_dir(Path(out_dir).expanduser())
    paths = out / "train.parquet", out / "test.parquet"
    refuse_existing([*paths, *((out / f"sft_{p.name}" for p in paths) if sft else ())], hint=ANOTHER_OUT)
    with _progress_bar(progress) as bar:
        job = bar.add_task("countdown tasks", total=train_size + test_size) if bar else None
        tick = (lambda k: bar.advance(job, k)) if bar else (lambda k: None)
        # String seeds are hashed with sha512: stable across runs, and the streams differ.
        draw = dict(tick=tick, operands=operands, max_number=max_number)
        test = _tasks(random.Random(f"tinyrl-countdown:{seed}:test"), test_size, set(), **draw)
        held_out = {(tuple(sorted(t[0])), t[1]) for t in test}
        train = _tasks(random.Random(f"tinyrl-countdown:{seed}:train"), train_size, held_out, **draw)
    try:
        with staged(out) as stage:  # an interrupted run leaves no half-written file
            for path, tasks, split in ((paths[0], train, "train"), (paths[1], test, "test")):
                table = _table(tasks, split, template)
                pq.write_table(table, stage / path.name, compression="zstd")
                if sft:
                    pq.write_table(_with_responses(table, tasks), stage / f"sft_{path.name}", compression="zstd")
    except OSError as e:
        raise TinyRLError(f"cannot write countdown data to {out}: {e}",
                          hint="check free disk space and permissions") from e
    return paths
