"""Maths with a final answer (DAPO recipe of verl): DAPO-Math-17k, MATH-500, AIME, GSM8K.

Data: verl's maths parquet read as it is (DAPO-Math-17k: `prompt` = chat messages asking for an
"Answer:" line, `reward_model.ground_truth` a string, `data_source` "math_dapo"); `tinyrl data
math --from` keeps each repeated prompt once (DAPO-Math-17k repeats each 100 times). Plain
problem/answer tables (parquet, jsonl, json, csv, or `hf:NAME[:split]` through `datasets`) are
converted into that schema by `tinyrl data math --from ...`; without --from it generates small
arithmetic/algebra problems with known answers (tests and the math-tiny demo; no benchmark text).
Templates: dapo ("Answer: $Answer" on the last line, data_source math_dapo) or boxed (Qwen's
"\\boxed{}" instruction, data_source lighteval/MATH), matching verl's reward dispatch.
Reward: the answer of the last "Answer:" line or the last \\boxed{} (answer_format auto: whichever
comes last), checked against the ground truth with math-verify in a killable worker process
(tinyrl.tasks.verify); +1 / -1 as DAPO by default. Solved: the correct score.
"""

from __future__ import annotations

import contextlib
import random
import re
from fractions import Fraction
from pathlib import Path
from typing import Any, Iterator, Optional

from tinyrl.errors import TinyRLError
from tinyrl.model_specs import hub_unreachable
from tinyrl.tasks.base import RewardFn, Task, option, say_wrote
from tinyrl.writable import ANOTHER_OUT, check_writable, make_dir, refuse_existing, staged

ANSWER_FORMATS = ("auto", "dapo", "boxed")
TEMPLATES = {
    # DAPO-Math-17k's instruction, so converted sets read like the training set.
    "dapo": ("Solve the following math problem step by step. The last line of your response should be of "
             "the form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
             "{problem}\n\nRemember to put your answer on its own line after \"Answer:\"."),
    # Qwen2.5-Math's chain-of-thought instruction.
    "boxed": "{problem}\nPlease reason step by step, and put your final answer within \\boxed{{}}.",
}
DATA_SOURCE = {"dapo": "math_dapo", "boxed": "lighteval/MATH"}  # verl's default_compute_score keys
_ANSWER_LINE = re.compile(r"answer\s*:[ \t]*([^\n]*)", re.I)
_ANSWER_WORD = re.compile(r"answer\s*:", re.I)
_DAPO_PROBLEM = re.compile(r"answer to the problem\.\n\n(.+?)\n\nRemember", re.S)
_BOX = ("\\boxed", "\\fbox")


# ------------------------------------------------------------------------------- answers

def last_boxed(text: str) -> tuple[int, str] | None:
    """(position, content) of the last \\boxed{...} (balanced braces), or None. Linear time."""
    # An unclosed box leaves every later prefix with more "{" than "}", so an earlier box can
    # only close before it: each scan stops where the previous (later) one started.
    limit = len(text)
    found = {b: text.rfind(b) for b in _BOX}  # each marker's last place before `limit`
    pos = max(found.values())
    while pos != -1:
        start = text.find("{", pos, limit)
        head = text[pos:start] if start != -1 else ""
        if start != -1 and head in _BOX:
            depth = 0
            for i in range(start, limit):
                depth += {"{": 1, "}": -1}.get(text[i], 0)
                if depth == 0:
                    return pos, text[start + 1:i]
        elif text.startswith("\\boxed ", pos):  # "\boxed 5": up to the next space or "$"
            rest = text[pos + len("\\boxed "):limit]
            return pos, re.split(r"[\s$]", rest, maxsplit=1)[0]
        limit = pos  # unclosed: try the one before (only the marker found here moves back)
        found = {b: text.rfind(b, 0, pos) if at == pos else at for b, at in found.items()}
        pos = max(found.values())
    return None


def last_answer_line(text: str) -> tuple[int, str] | None:
    """(position, content) of the last "Answer: ..." line, as DAPO's reward reads it."""
    found = None
    for m in _ANSWER_LINE.finditer(text):
        found = m
    if found is None:
        return None
    content = _ANSWER_WORD.split(found.group(1))[-1].strip()  # "Answer: Answer: 5": after the last
    boxed = last_boxed(content)  # "Answer: \boxed{5}"
    return found.start(), (boxed[1] if boxed else content).strip().rstrip(".").strip()


def extract_answer(completion: str, answer_format: str = "auto") -> str | None:
    if not isinstance(answer_format, str):  # the Task hook passes a TaskConfig
        answer_format = answer_format.answer_format
    found = [f for f in ((last_answer_line(completion) if answer_format in ("auto", "dapo") else None),
                         (last_boxed(completion) if answer_format in ("auto", "boxed") else None)) if f]
    if not found:
        return None
    answer = max(found)[1].strip()
    return answer.strip("$").strip() or None


def compute_score(solution_str: str, ground_truth: Any, answer_format: str = "auto",
                  correct_score: float = 1.0, wrong_score: float = -1.0, timeout_s: float = 5.0) -> float:
    """verl's argument order: `correct_score` when the completion's final answer equals the
    ground truth (math-verify), else `wrong_score` (no answer, unparsable, time out included)."""
    from tinyrl.tasks.verify import shared_verifier

    answer = extract_answer(solution_str, answer_format)
    if answer is None:
        return wrong_score
    truth = str(ground_truth.item() if hasattr(ground_truth, "item") else ground_truth)
    return correct_score if shared_verifier(timeout_s).equivalent(answer, truth) else wrong_score


def row_problem(row: Any) -> str | None:
    """The reward compares str(ground truth) with the answer: a dict or a list (another task's
    truth, several answers) would be compared as its repr and never match."""
    from tinyrl.data.io import ground_truth

    try:
        truth = ground_truth(row)
    except TinyRLError as exc:
        return exc.message
    if isinstance(truth, bool) or not isinstance(truth, (str, int, float)) or not str(truth).strip():
        return f"reward_model.ground_truth is {truth!r:.120}, not a maths answer (a string or a number)"
    return None


def reward(task_cfg: Any) -> RewardFn:
    from tinyrl.data.io import ground_truth

    def score(completion: str, example: Any) -> float:
        return compute_score(completion, ground_truth(example), task_cfg.answer_format,
                             task_cfg.correct_score, task_cfg.wrong_score, task_cfg.verify_timeout_s)
    return score


# ------------------------------------------------------------------------------- data

def prompt_of(problem: str, template: str) -> str:
    if template not in TEMPLATES:
        raise TinyRLError(f"unknown maths template {template!r}", hint=f"use one of: {', '.join(TEMPLATES)}")
    return TEMPLATES[template].format(problem=problem.strip())


def write_rows(rows: list[tuple[str, str]], path: Path, template: str, split: str) -> Path:
    """(problem, answer) pairs -> verl maths parquet at `path` (never over an existing file)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    refuse_existing([path])
    n = len(rows)
    message = pa.StructArray.from_arrays([pa.array(["user"] * n), pa.array([prompt_of(p, template) for p, _ in rows])],
                                         ["role", "content"])
    table = pa.table({
        "data_source": pa.array([DATA_SOURCE[template]] * n),
        "prompt": pa.ListArray.from_arrays(pa.array(range(n + 1), pa.int32()), message),
        "ability": pa.array(["MATH"] * n),
        "reward_model": pa.StructArray.from_arrays([pa.array(["rule"] * n), pa.array([a for _, a in rows])],
                                                   ["style", "ground_truth"]),
        "extra_info": pa.StructArray.from_arrays([pa.array([split] * n), pa.array(range(n), pa.int64())],
                                                 ["split", "index"]),
    })
    try:
        with staged(make_dir(path.parent)) as stage:
            pq.write_table(table, stage / path.name)
    except OSError as e:
        raise TinyRLError(f"cannot write {path}: {e}", hint="check free disk space and permissions") from e
    return path


def _problem(rng: random.Random) -> tuple[str, str]:
    """One generated problem with its exact answer (arithmetic, fractions, linear equations)."""
    kind = rng.randrange(4)
    a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 12)
    if kind == 0:
        return f"What is {a} + {b} * {c}?", str(a + b * c)
    if kind == 1:
        return f"What is {a} - {b}?", str(a - b)
    if kind == 2:  # 3x + 7 = 22 with an integer root
        x = rng.randint(-20, 20)
        return f"Solve for $x$: ${c}x + {a} = {c * x + a}$.", str(x)
    f = Fraction(a % 9 + 1, c) + Fraction(b % 7 + 1, c + 1)
    ans = str(f.numerator) if f.denominator == 1 else f"\\frac{{{f.numerator}}}{{{f.denominator}}}"
    return f"Compute $\\frac{{{a % 9 + 1}}}{{{c}}} + \\frac{{{b % 7 + 1}}}{{{c + 1}}}$ as a fraction in lowest terms.", ans


def generated_problems(train_size: int, test_size: int, seed: int = 0) -> tuple[list, list]:
    """(train, test) lists of generated (problem, answer); no test problem is in train."""
    for name, size in (("--train-size", train_size), ("--test-size", test_size)):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise TinyRLError(f"{name} must be a positive integer, got {size!r}", hint=f"e.g. {name} 1000")
    test_rng, train_rng = random.Random(f"tinyrl-math:{seed}:test"), random.Random(f"tinyrl-math:{seed}:train")
    test = [_problem(test_rng) for _ in range(test_size)]
    held_out = {p for p, _ in test}
    train = []
    while len(train) < train_size:
        row = _problem(train_rng)
        if row[0] not in held_out:
            train.append(row)
    return train, test


def generate(out_dir, train_size: int, test_size: int, seed: int = 0, template: str = "dapo",
             progress: bool = True) -> tuple[Path, Path]:
    """Generated problems into out_dir/train.parquet and test.parquet (test held out from train)."""
    prompt_of("", template)
    out = Path(out_dir).expanduser()
    refuse_existing([out / "train.parquet", out / "test.parquet"], hint=ANOTHER_OUT)  # before any work
    train, test = generated_problems(train_size, test_size, seed)
    return (write_rows(train, out / "train.parquet", template, "train"),
            write_rows(test, out / "test.parquet", template, "test"))


_PROBLEM_KEYS = ("problem", "question", "Problem", "Question")
_ANSWER_KEYS = ("answer", "Answer", "final_answer", "ground_truth", "solution", "Solution")


def cell_text(value: Any) -> str:
    """A table cell as text; a missing one (None, or the NaN pandas reads for an empty CSV or
    JSON cell) is "", not the text "nan" or "None", which became a problem or an answer."""
    value = value.item() if hasattr(value, "item") else value
    if value is None or (isinstance(value, float) and value != value):
        return ""
    return str(value).strip()


def _answer_text(value: Any, key: str) -> str | None:
    text = cell_text(value)
    if "####" in text:  # GSM8K: reasoning, then "#### 72"
        text = text.rsplit("####", 1)[1].strip().replace(",", "")
    elif key.lower() == "solution":  # MATH-style worked solution: its last \boxed{}
        boxed = last_boxed(text)
        text = boxed[1].strip() if boxed else ""
    return text or None


@contextlib.contextmanager
def _hub_cache_only(datasets) -> Iterator[None]:
    """`datasets` and huggingface_hub in offline mode for the block: a set already downloaded loads
    from the cache, one that is not fails at once. Without it, a host that does not resolve cost
    ~24 s of huggingface_hub's retries (5, backing off) before the same error. Both read their
    module flag at call time (datasets 5.2 load.py, huggingface_hub constants.is_offline_mode)."""
    from huggingface_hub import constants

    saved = datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE = saved


def read_table(source: str) -> tuple[Any, str]:
    """(pandas frame, a name for it) from a file or `hf:NAME[:split]` (`hf:NAME:CONFIG:SPLIT` for a
    set with configurations, e.g. hf:openai/gsm8k:main:test)."""
    import pandas as pd

    if source.startswith("hf:"):
        name, _, split = source[3:].partition(":")
        config, _, split = split.rpartition(":")
        try:
            import datasets
        except ImportError as e:
            raise TinyRLError(f"--from {source} needs the `datasets` package", hint="pip install 'tinyrl[datasets]' "
                              "(or download the file yourself and give --from FILE)") from e
        unreachable = hub_unreachable()
        try:
            with _hub_cache_only(datasets) if unreachable else contextlib.nullcontext():
                ds = datasets.load_dataset(name, config or None, split=split or "train")
        except Exception as e:  # noqa: BLE001 - network, auth, unknown name: all the user's to fix
            read = f" (only the local cache was read: {unreachable})" if unreachable else ""
            raise TinyRLError(f"could not load {name!r} (split {split or 'train'}) from the Hugging Face Hub: "
                              f"{type(e).__name__}: {str(e)[:300]}{read}",
                              hint="check the name and split and the network (HF_HUB_OFFLINE unset); a set with "
                              "configurations needs hf:NAME:CONFIG:SPLIT; or download the file and give --from FILE") from e
        return ds.to_pandas(), f"{name.split('/')[-1]}-{split or 'train'}".lower()
    path = Path(source).expanduser()
    if not path.is_file():
        raise TinyRLError(f"--from {source}: file not found", hint="give a .parquet, .jsonl, .json or .csv file, "
                          "or hf:NAME[:split]")
    # text tables are read as written: type inference made the answer "2" of a CSV (or of a JSON
    # column with a null) 2.0, and "007" 7
    readers = {".parquet": pd.read_parquet, ".jsonl": lambda p: pd.read_json(p, lines=True, dtype=False),
               ".json": lambda p: pd.read_json(p, dtype=False), ".csv": lambda p: pd.read_csv(p, dtype=str)}
    if path.suffix not in readers:
        raise TinyRLError(f"--from {source}: cannot read {path.suffix or 'files without a suffix'}",
                          hint=f"give one of: {', '.join(readers)}")
    rowless = "give a file with one row per problem (or conversation), or check that it is the file you meant"
    if _is_blank(path):  # pandas said "No columns to parse from file" (CSV) or found "columns: " (JSON lines)
        raise TinyRLError(f"--from {source}: the file is empty", hint=rowless)
    try:
        frame = readers[path.suffix](path)
    except (ValueError, OSError) as e:
        where = _bad_json_line(path) if path.suffix in (".jsonl", ".json") else None
        raise TinyRLError(f"cannot read {path}: {where or e}", hint="check the file") from e
    if len(frame) == 0:  # a CSV header alone: "no row has both a problem and an answer ... check --answer-key"
        raise TinyRLError(f"--from {source}: the file has no rows (columns: {', '.join(map(str, frame.columns))})",
                          hint=rowless)
    return frame, path.stem


def _is_blank(path: Path) -> bool:
    """Nothing but white space in the file (only a small file is read to say so)."""
    try:
        return path.stat().st_size < 65_536 and not path.read_bytes().strip()
    except OSError:
        return False


def _bad_json_line(path: Path) -> str | None:
    """Where a JSON-lines (or JSON) file stops being JSON, by line: pandas names a byte position."""
    import json

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    lines = text.splitlines()
    try:
        if path.suffix == ".json":
            json.loads(text)
        else:
            for number, line in enumerate(lines, start=1):
                if line.strip():
                    json.loads(line)
        return None
    except json.JSONDecodeError as exc:
        at = exc.lineno if path.suffix == ".json" else number  # a .jsonl line is parsed alone: its own count
        text_there = lines[at - 1] if at <= len(lines) else ""  # an empty file: no line 1
        return f"line {at} is not JSON ({exc.msg}): {text_there[:80]!r}"


def problem_rows(frame: Any, source: str, problem_key: str | None = None,
                 answer_key: str | None = None) -> list[tuple[str, str]]:
    """(problem, answer) of each row of a plain problem/answer table that has both (the caller
    says how many rows had not: len(frame) - len(rows))."""
    cols = list(frame.columns)
    pkey = problem_key or next((k for k in _PROBLEM_KEYS if k in cols), None)
    akey = answer_key or next((k for k in _ANSWER_KEYS if k in cols), None)
    if pkey not in cols or akey not in cols:
        given = [f"--{what}-key {key}" for what, key, asked in (("problem", pkey, problem_key), ("answer", akey, answer_key))
                 if asked and key not in cols]  # a named column that is not there, rather than "none found"
        have = ", ".join(map(str, cols))
        if given:
            raise TinyRLError(f"{source}: no column {', '.join(given)} (columns: {have})",
                              hint="name them with --problem-key and --answer-key")
        # which one is missing, and the names looked for ("no problem/answer columns found" said neither)
        lacking = [(kind, keys) for kind, key, keys in (("problem", pkey, _PROBLEM_KEYS), ("answer", akey, _ANSWER_KEYS))
                   if key not in cols]
        kinds = " or ".join(kind for kind, _ in lacking)
        looked = " and ".join(", ".join(keys) for _, keys in lacking)
        raise TinyRLError(f"{source}: no {kinds} column (looked for {looked}; the file has: {have})",
                          hint=f"name {'them' if len(lacking) > 1 else 'it'} with "
                               + " and ".join(f"--{kind}-key" for kind, _ in lacking))
    rows = []
    for problem, value in zip(frame[pkey], frame[akey]):
        answer = _answer_text(value, akey)
        if answer is not None and cell_text(problem):
            rows.append((str(problem), answer))
    if not rows:
        raise TinyRLError(f"{source}: no row has both a problem and an answer", hint="check --answer-key")
    return rows


def check_name(name: str | None) -> None:
    """--name is a file name, not a path: `--name ../../escape` wrote outside --out until
    2026-11-27. Checked before the source is read (a download may take minutes)."""
    if name is not None and (Path(name).name != name or name in ("", ".", "..")):
        raise TinyRLError(f"--name {name!r} is not a file name: the file goes into --out, and --name only names it",
                          hint="give --name a plain name (e.g. --name aime24) and --out the directory")


def output_name(name: str | None, default: str) -> str:
    """--name, or the input's name; "x.parquet" is taken as "x" (it wrote x.parquet.parquet)."""
    check_name(name)
    return (name or default).removesuffix(".parquet")


def convert(source: str, out_dir: Path, template: str, name: str | None = None,
            problem_key: str | None = None, answer_key: str | None = None) -> tuple[Path, int, int, int]:
    """A problem/answer table -> out_dir/NAME.parquet in verl's maths schema; a file in verl's
    schema already (DAPO-Math-17k) keeps its rows as they are. Repeated prompts are kept once, as
    `tinyrl data retool` does: DAPO-Math-17k holds each of its 17,917 prompts 100 times (verl's
    recipe trains on it by steps), and tinyrl counts epochs, which math-grpo-4090 and
    estimate-cost price at 17,917 prompts.
    -> (path, rows written, repeated rows dropped, rows skipped for a missing problem or answer)"""
    import json

    import pandas as pd

    from tinyrl.data.io import _plain

    prompt_of("", template)
    check_name(name)
    frame, default_name = read_table(source)
    name = output_name(name, default_name)
    cols = list(frame.columns)
    if "prompt" in cols and "reward_model" in cols:  # verl's schema already (DAPO-Math-17k): kept as it is
        path = Path(out_dir).expanduser() / f"{name}.parquet"
        refuse_existing([path])
        prompts = pd.Series([json.dumps(_plain(p), sort_keys=True, default=str) for p in frame["prompt"]],
                            index=frame.index)
        kept = frame[~prompts.duplicated()]  # the first row of each prompt, in the file's order
        with staged(make_dir(path.parent)) as stage:
            kept.to_parquet(stage / path.name, index=False)
        return path, len(kept), len(frame) - len(kept), 0
    usable = problem_rows(frame, source, problem_key, answer_key)
    rows = first_of_each_problem(usable)
    path = write_rows(rows, Path(out_dir).expanduser() / f"{name}.parquet", template, name)
    return path, len(rows), len(usable) - len(rows), len(frame) - len(usable)


def first_of_each_problem(rows: list[tuple]) -> list[tuple]:
    """`rows` (problem first) with each problem's first row only, in order: DAPO-Math-17k holds
    each of its prompts 100 times (`data math` and `data retool` keep one)."""
    seen, kept = set(), []
    for row in rows:
        if row[0] not in seen:
            seen.add(row[0])
            kept.append(row)
    return kept


def data_command(
    out_dir: Path = option(..., "--out", help="Output directory."),
    source: Optional[str] = option(None, "--from", help="A problem/answer table (.parquet/.jsonl/.json/.csv) "
                                   "or hf:NAME[:split] (hf:NAME:CONFIG:SPLIT, e.g. hf:openai/gsm8k:main:test); "
                                   "without it, generated problems (train + test)."),
    template: str = option("dapo", help="Prompt template: dapo (\"Answer:\" line) | boxed (\\boxed{})."),
    name: Optional[str] = option(None, help="Output file name without .parquet (default: the input's name)."),
    problem_key: Optional[str] = option(None, help="Column holding the problem (default: problem/question)."),
    answer_key: Optional[str] = option(None, help="Column holding the answer (default: answer, then solution's "
                                       "last \\boxed{}; GSM8K's '#### x' is understood)."),
    train_size: int = option(4096, help="Generated training problems (without --from)."),
    test_size: int = option(256, help="Generated test problems (without --from)."),
    seed: int = option(0, help="Seed of the generated problems."),
) -> None:
    """Convert a maths table into verl's parquet (DAPO-Math-17k's schema), or generate problems.

    Example (math-grpo-4090's test file): tinyrl data math --from hf:HuggingFaceH4/MATH-500:test --out data/math

    Example (generated problems, no download): tinyrl data math --out data/math-gen --train-size 1024
    """
    check_writable(out_dir, lost="nothing was read or written", example="data/math")  # before a download
    if source is None:
        train, test = generate(out_dir, train_size, test_size, seed=seed, template=template)
        say_wrote(f"wrote {train} ({train_size:,} rows) and {test} ({test_size:,} rows)")
        return
    path, n, dropped, skipped = convert(source, out_dir, template, name, problem_key, answer_key)
    from tinyrl.words import counted

    said = ([f"{counted(dropped, 'repeated row')} kept once"] if dropped else []) + \
        ([skipped_rows(skipped)] if skipped else [])
    say_wrote(f"wrote {path} ({counted(n, 'row')}" + "".join(f"; {s}" for s in said) + ")")


def skipped_rows(n: int) -> str:
    """How a conversion says the rows it left out (a user counting rows asks where they went)."""
    from tinyrl.words import counted

    return f"{counted(n, 'row')} without a problem or an answer skipped"


# the reward's verifier (pyproject.toml's pin): export-verl's run_verl.sh says to install it
REWARD_REQUIRES = ("math-verify>=0.9,<0.10",)
OPTIONS = ("answer_format", "correct_score", "wrong_score", "verify_timeout_s")  # the [task] options read here


def _config_problems(t: Any) -> list[str]:
    out = []
    if t.answer_format not in ANSWER_FORMATS:
        out.append(f"task.answer_format = {t.answer_format!r} is not one of {', '.join(ANSWER_FORMATS)}")
    if not t.correct_score > t.wrong_score:
        out.append(f"task.correct_score = {t.correct_score} must be above task.wrong_score = {t.wrong_score}")
    if not t.verify_timeout_s > 0:
        out.append(f"task.verify_timeout_s = {t.verify_timeout_s} must be > 0 (seconds per math-verify call)")
    return out


def dapo_problem(prompt: str) -> str | None:
    """The problem inside DAPO-Math-17k's instruction (None: not that instruction)."""
    match = _DAPO_PROBLEM.search(prompt)
    return match.group(1) if match else None


TASK = Task(
    name="math",
    description="Maths with a final answer (DAPO): \"Answer:\" line or \\boxed{}, math-verify, +1 / -1",
    templates=tuple(TEMPLATES),
    make_reward=reward,
    solved_at=lambda t: t.correct_score,
    extract_answer=extract_answer,
    data_command=data_command,
    generate=generate,
    data_hint="`tinyrl data math --from FILE|hf:NAME[:split] --out DIR` (or no --from: generated problems)",
    converts_tables=True,
    task_line=dapo_problem,
    answer_patterns=(r"(?i:answer)\s*:[^\n]*", r"\\boxed\{[^\n]*?\}"),
    config_problems=_config_problems,
    options=OPTIONS,
    reward_requires=REWARD_REQUIRES,
    row_problem=row_problem,
)
