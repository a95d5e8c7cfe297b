"""The run's reward: the task's own (or a user's) function, plus optional extra functions with
weights (TRL's reward_funcs + reward_weights), and what counts as solved.

`reward.fn` picks the first function: "task" (the task's reward with the [task] options), a task
name, or a user's `file.py:func` / `module:func` (any parquet; solved = a score >= 1, as before).
`reward.extra_fns` adds more; the step's score is sum(w_i * f_i). Solved (reward/accuracy,
val/score, eval) is judged on the first function alone, so shaping terms never fake a solve.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tinyrl.errors import TinyRLError
from tinyrl.rewards.registry import missing_function, module_problem, not_a_function, parse_spec, reads_episode  # a user's WorkerReward takes episode, passes it on when wanted
from tinyrl.tasks import all_tasks, check_rows, get_task
from tinyrl.tasks.base import RewardFn


@dataclass
class Scores:
    total: list[float] = field(default_factory=list)              # weighted sum per sample
    solved: list[bool] = field(default_factory=list)              # first function >= solved_at
    parts: dict[str, list[float]] = field(default_factory=dict)   # each function's raw score

    def append(self, other: "Scores", i: int) -> None:
        """Add sample i of `other` (dynamic sampling keeps some samples of each round)."""
        if self.parts is None:
            self.parts = {name: [] for name in other.parts}
        self.total.append(other.total[i])
        self.solved.append(other.solved[i])
        for name, values in other.parts.items():
            self.parts[name].append(values[i])

    def metrics(self, prefix: str = "reward") -> dict[str, float]:
        n = max(len(self.total), 1)
        out = {f"{prefix}/accuracy": sum(self.solved) / n}
        if self.parts and len(self.parts) > 1:
            out.update({f"{prefix}/fn/{name}": sum(v) / n for name, v in self.parts.items()})
        return out


class RewardSet:
    """Callable as one reward function (the weighted total), or per batch with the details."""

    def __init__(self, fns: list[tuple[str, RewardFn]], weights: list[float], solved_at: float):
        self.fns, self.weights, self.solved_at = fns, weights or [1.0] * len(fns), solved_at
        self._with_episode = [reads_episode(fn) for _, fn in fns]

    def __call__(self, completion: str, row: Any) -> float:
        return self.score(completion, row)[0]

    def score(self, completion: str, row: Any, episode: Any = None) -> tuple[float, bool, list[float]]:
        raw = [fn(completion, row, episode=episode) if wants else fn(completion, row)
               for (_, fn), wants in zip(self.fns, self._with_episode)]
        return sum(w * r for w, r in zip(self.weights, raw)), raw[0] >= self.solved_at, raw

    def score_batch(self, completions: list[str], rows: list[Any], episodes: list[Any] | None = None,
                    data: Path | None = None) -> Scores:
        """`episodes` (the rollout's, in the order of `completions`) reach rewards that read them;
        `data`: the file the rows were read from, named in a reward's error on one of them."""
        out = Scores(parts={name: [] for name, _ in self.fns})
        episodes = episodes if episodes is not None else [None] * len(completions)
        for completion, row, episode in zip(completions, rows, episodes):
            try:
                total, solved, raw = self.score(completion, row, episode)
            except TinyRLError as exc:  # "... on row index 3294 (train) ...": which data that row is in
                exc.resumable = True  # the function is fixed in its file; a run goes on from its checkpoint
                if data is None:
                    raise
                raise TinyRLError(f"{exc.message} (the row is in {data})", hint=exc.hint,
                                  exit_code=exc.exit_code, resumable=True) from exc.__cause__
            out.total.append(total)
            out.solved.append(solved)
            for (name, _), r in zip(self.fns, raw):
                out.parts[name].append(r)
        return out


def is_task_reward(spec: str) -> bool:
    """Whether a reward spec names a task's reward ("task": [task]'s, or a task name), not a user's function."""
    return spec == "task" or spec in all_tasks()


def task_of(spec: str, task_cfg: Any):
    """The Task whose reward a spec names (is_task_reward); None: a user's function."""
    if is_task_reward(spec):
        return get_task(task_cfg.name if spec == "task" else spec)
    return None


def spec_problem(spec: str, setting: str) -> str | None:
    """What is wrong with one reward spec, said at config validation (the function itself is
    imported later, in its worker): its shape, a `file.py:func`'s file and function, read from
    the file's text (a name bound to a literal is no function), a file that is not .py, and a
    `module:func` whose module cannot be found (its import is left to the worker)."""
    if is_task_reward(spec):
        return None
    parsed = parse_spec(spec)
    if parsed is None:
        return (f"{setting} = {spec!r} is not a reward: give task (the task's own), a task name "
                f"({', '.join(all_tasks())}), path/to/file.py:func or module:func")
    target, func_name, is_file = parsed
    path = Path(target).expanduser()
    if not target.endswith(".py") and path.is_file():  # notes.txt:score failed after the run directory was made
        return (f"{setting} = {spec}: {target} is not a .py file; a reward is read from a Python file: "
                f"put it in one (e.g. {path.with_suffix('.py')}) and give {path.with_suffix('.py')}:{func_name}")
    if not is_file:
        problem = module_problem(target, func_name)
        return f"{setting} = {spec}: {problem}" if problem else None
    if not path.is_file():
        return f"{setting} = {spec}: file {target} not found; give path/to/file.py:func"
    problem = missing_function(path, func_name) or not_a_function(path, func_name)
    return f"{setting} = {spec}: {problem}" if problem else None


def check_reward_rows(cfg, rows: list, path) -> None:
    """`rows` against every task reward of the run (reward.fn, reward.extra_fns): tinyrl.tasks.check_rows.
    A user's function reads rows its own way and is not checked."""
    for spec in (cfg.reward.fn, *cfg.reward.extra_fns):
        task = task_of(spec, cfg.task)
        if task is not None:
            check_rows(task, rows, path)


def _one(spec: str, task_cfg: Any, timeout_s: float, prints_to: Path | None = None) -> tuple[str, RewardFn, float]:
    """(metric name, function, solved_at) of one reward spec."""
    task = task_of(spec, task_cfg)
    if task is not None:
        return task.name, task.make_reward(task_cfg), task.solved_at(task_cfg)
    from tinyrl.rewards.registry import load_reward_fn

    return spec.rpartition(":")[2] or spec, load_reward_fn(spec, timeout_s=timeout_s, prints_to=prints_to), 1.0


def reward_set(specs: list[str], weights: list[float], task_cfg: Any, timeout_s: float = 60.0,
               prints_to: Path | None = None) -> RewardSet:
    """Reward specs (the first decides "solved"), their weights (empty = 1.0 each), the task
    options, a user function's time per call (reward.timeout_s, tinyrl.rewards.limits) and the
    file its prints go to (tinyrl.rewards.worker; None: stderr)."""
    built = [_one(spec, task_cfg, timeout_s, prints_to) for spec in specs]
    names = [b[0] if [x[0] for x in built].count(b[0]) == 1 else f"{b[0]}{i}" for i, b in enumerate(built)]
    return RewardSet([(n, b[1]) for n, b in zip(names, built)], list(weights), built[0][2])


PRINTS_FILE = "reward_prints.log"  # RUN_DIR/: what a user's reward function prints


def build_rewards(cfg, run_dir: Path | None = None) -> RewardSet:
    """The RewardSet of a config (reward.fn, reward.extra_fns, reward.weights, [task]); a user
    function's prints go to RUN_DIR/reward_prints.log (without a run directory: stderr)."""
    return reward_set([cfg.reward.fn, *cfg.reward.extra_fns], cfg.reward.weights, cfg.task, cfg.reward.timeout_s,
                      run_dir / PRINTS_FILE if run_dir is not None else None)
