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

MIN_NUMBER, MAX_NUMBER, MAX_TARGET = 1, 100, 1000
# Tasks are built in memory (~0.5 KB each with the prompt) before writing: 4M rows per split is
# ~2 GB and 12x TinyZero's 327,680; the (numbers, target) space holds a few million distinct tasks.
MAX_ROWS = 4_000_000
_ATOM, _MUL, _ADD = 3, 2, 1  # precedence of a literal, of * and /, of + and -
_PROGRESS_EVERY = 4096
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


def make_task(rng: random.Random, n_numbers: int) -> tuple[list[int], int, str]:
    """(numbers, target, reference solution) using every number exactly once."""
    while True:  # about half the draws land in 1..MAX_TARGET
        nums = [rng.randint(MIN_NUMBER, MAX_NUMBER) for _ in range(n_numbers)]
        pool = [(n, str(n), _ATOM) for n in nums]
        while len(pool) > 1:
            a = pool.pop(rng.randrange(len(pool)))
            pool.append(_combine(rng, a, pool.pop(rng.randrange(len(pool)))))
        target, solution, _ = pool[0]
        if target <= MAX_TARGET:
            return nums, target, solution


def _tasks(rng: random.Random, size: int, exclude: set, tick) -> list[tuple]:
    tasks = []
    while len(tasks) < size:
        nums, target, solution = make_task(rng, rng.choice((3, 4)))
        if (tuple(sorted(nums)), target) in exclude:
            continue
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


def _progress_bar(enabled: bool):
    if not enabled:
        return nullcontext(None)
    from rich.console import Console
    from rich.progress import Progress

    return Progress(console=Console(stderr=True), transient=True)


def _with_responses(table: pa.Table, tasks: list[tuple]) -> pa.Table:
    return table.append_column("response", pa.array([countdown_response(t[2], t[1]) for t in tasks], pa.string()))


def generate_countdown(out_dir: str | Path, train_size: int, test_size: int, seed: int = 0,
                       template: str = "base", progress: bool = True, sft: bool = False) -> tuple[Path, Path]:
    """Write `train.parquet` and `test.parquet` under `out_dir` (with `sft`, also
    `sft_train.parquet` and `sft_test.parquet`); return the paths of the first two."""
    for name, size in (("train_size", train_size), ("test_size", test_size)):
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_ROWS:
            raise TinyRLError(f"{name} must be an integer from 1 to {MAX_ROWS:,}, got {size!r}",
                              hint="TinyZero uses train_size=327680, test_size=1024")
    countdown_prompt([1, 2, 3], 6, template)  # unknown template: fail before any work
    out = Path(out_dir).expanduser()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TinyRLError(f"cannot create {out}: {e}", hint="choose a writable output directory") from e
    paths = out / "train.parquet", out / "test.parquet"
    with _progress_bar(progress) as bar:
        job = bar.add_task("countdown tasks", total=train_size + test_size) if bar else None
        tick = (lambda k: bar.advance(job, k)) if bar else (lambda k: None)
        # String seeds are hashed with sha512: stable across runs, and the streams differ.
        test = _tasks(random.Random(f"tinyrl-countdown:{seed}:test"), test_size, set(), tick)
        held_out = {(tuple(sorted(t[0])), t[1]) for t in test}
        train = _tasks(random.Random(f"tinyrl-countdown:{seed}:train"), train_size, held_out, tick)
    try:
        for path, tasks, split in ((paths[0], train, "train"), (paths[1], test, "test")):
            table = _table(tasks, split, template)
            pq.write_table(table, path, compression="zstd")
            if sft:
                pq.write_table(_with_responses(table, tasks), out / f"sft_{path.name}", compression="zstd")
    except OSError as e:
        raise TinyRLError(f"cannot write countdown data to {out}: {e}",
                          hint="check free disk space and permissions") from e
    return paths
