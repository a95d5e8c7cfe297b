"""Reward specs: builtin names, user files and modules, and the errors a user sees."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tinyrl.data.templates import countdown_prompt
from tinyrl.errors import TinyRLError
from tinyrl.rewards.registry import BUILTIN_REWARDS, load_reward_fn, missing_function

EXAMPLE = {
    "prompt": [{"role": "user", "content": countdown_prompt([2, 3, 4], 24)}],
    "reward_model": {"style": "rule", "ground_truth": {"target": 24, "numbers": np.array([2, 3, 4])}},
}


def write(tmp_path, body: str, name: str = "my_reward.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def test_builtin_countdown():
    assert "countdown" in BUILTIN_REWARDS
    fn = load_reward_fn("countdown")
    assert fn("<answer>2 * 3 * 4</answer>", EXAMPLE) == 1.0
    assert fn("<answer>2 + 3 + 4</answer>", EXAMPLE) == 0.1
    assert fn("no answer", EXAMPLE) == 0.0
    assert load_reward_fn("countdown", format_score=0.0)("<answer>2+3+4</answer>", EXAMPLE) == 0.0


def test_builtin_countdown_strict_reads_prompt_plus_response():
    fn = load_reward_fn("countdown", strict=True)
    assert fn(" 2*3*4 works.</think>\n<answer>2 * 3 * 4</answer>", EXAMPLE) == 1.0
    assert fn(" 2*3*4 works.</think>\n<answer>2 * 3 * 4</answer>\n", EXAMPLE) == 0.0  # TinyZero's trap


def test_custom_file(tmp_path):
    path = write(tmp_path, """
        import numpy as np
        def length(completion, example):
            return np.float32(len(completion) + example["bonus"])
    """)
    fn = load_reward_fn(f"{path}:length")
    assert fn("abc", {"bonus": 2}) == 5.0
    assert type(fn("abc", {"bonus": 2})) is float


def test_dotted_module(tmp_path, monkeypatch):
    write(tmp_path, "def one(completion, example):\n    return 1\n", name="tinyrl_test_mod.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_reward_fn("tinyrl_test_mod:one")("x", {}) == 1.0
    with pytest.raises(TinyRLError, match="cannot import reward module"):
        load_reward_fn("tinyrl_no_such_module_xyz:one")


def test_a_module_that_is_a_file_here_is_named_in_the_import_error(tmp_path, monkeypatch):
    """module:func imports by name; the working directory is not on the console script's path."""
    import sys

    write(tmp_path, "def score(completion, example):\n    return 1\n", name="tinyrl_here_mod.py")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    with pytest.raises(TinyRLError, match="cannot import reward module 'tinyrl_here_mod'") as info:
        load_reward_fn("tinyrl_here_mod:score")
    assert info.value.hint.startswith("tinyrl_here_mod.py is a file here: give reward.fn=tinyrl_here_mod.py:score")


def test_a_reward_functions_prints_go_to_the_runs_file_not_the_trainers_stdout(tmp_path, capfd):
    """A reward's print went to the trainer's stdout, where the live dashboard draws (100 kB a call
    in a user's log). Now RUN_DIR/reward_prints.log (appended), or stderr without a run directory."""
    path = write(tmp_path, "import os\ndef score(completion, example):\n    print('looking at', completion)\n"
                           "    os.write(1, b'from C\\n')\n    return 1.0\n")
    log = tmp_path / "run" / "reward_prints.log"
    log.parent.mkdir()
    assert load_reward_fn(f"{path}:score", prints_to=log)("abc", {}) == 1.0
    assert load_reward_fn(f"{path}:score", prints_to=log)("xyz", {}) == 1.0  # a resumed run: appended
    assert log.read_text() == "looking at abc\nfrom C\nlooking at xyz\nfrom C\n"
    assert load_reward_fn(f"{path}:score")("plain", {}) == 1.0
    seen = capfd.readouterr()
    assert "looking at" not in seen.out and "from C" not in seen.out
    assert "looking at plain" in seen.err and "from C" in seen.err


def test_reward_prints_are_bounded():
    import io

    from tinyrl.printsink import BoundedText

    kept = io.StringIO()
    stream = BoundedText(lambda: kept, 10, "the reward function")
    for _ in range(3):
        print("x" * 6, file=stream)
    assert kept.getvalue().startswith("xxxxxx\nxxx\n[tinyrl: the reward function printed more than 10 characters")
    assert kept.getvalue().count("[tinyrl") == 1


def test_user_exception_is_named_and_chained(tmp_path):
    path = write(tmp_path, """
        def reward(completion, example):
            raise ValueError("boom on " + completion)
    """)
    fn = load_reward_fn(f"{path}:reward")
    with pytest.raises(TinyRLError) as info:
        fn("row 7", {})
    msg = str(info.value)
    assert f"{path}:reward" in msg and "ValueError" in msg and "boom on row 7" in msg
    assert isinstance(info.value.__cause__, ValueError)


@pytest.mark.parametrize("returned,shown", [("'1.0'", "'1.0'"), ("None", "None"),
                                            ("[1.0]", "[1.0]"), ("float('nan')", "nan")])
def test_non_number_return(tmp_path, returned, shown):
    path = write(tmp_path, f"def reward(completion, example):\n    return {returned}\n")
    with pytest.raises(TinyRLError) as info:
        load_reward_fn(f"{path}:reward")("x", {})
    assert f"{path}:reward" in str(info.value) and shown in str(info.value)


def test_missing_function_lists_what_is_there(tmp_path):
    path = write(tmp_path, "def score_it(c, e):\n    return 0.0\n")
    with pytest.raises(TinyRLError, match="no function 'reward'") as info:
        load_reward_fn(f"{path}:reward")
    assert "score_it" in info.value.hint


@pytest.mark.parametrize("body", [
    "def reward(c, e):\n    return 0.0\n",
    "from functools import partial\nreward = partial(max, 0.0)\n",
    "import os.path as reward\n",
    "try:\n    from fast import reward\nexcept ImportError:\n    def reward(c, e):\n        return 0.0\n",
    "class reward:\n    pass\n",
    "def make():\n    global reward\n    reward = max\n",
    "from os.path import *\n",                                   # a star import may bring it
    "def __getattr__(name):\n    return max\n",                 # so may a module __getattr__
    "globals()['reward'] = max\n",
])
def test_a_function_bound_in_any_way_the_file_can_is_not_said_missing(tmp_path, body):
    """The config check reads the file's text; where it cannot know, the import in the worker says."""
    assert missing_function(write(tmp_path, body), "reward") is None


def test_a_missing_function_or_a_syntax_error_is_read_from_the_text(tmp_path):
    path = write(tmp_path, "import os\nscale = 2\ndef score(c, e):\n    def reward(): pass\n    return 0\n"
                           "class R:\n    def reward(self): pass\n")
    assert missing_function(path, "reward") == f"{path} defines no function 'reward'; its functions: score"
    assert missing_function(path, "scor") == f"{path} defines no function 'scor' (did you mean 'score'?); " \
                                             "its functions: score"
    path = write(tmp_path, "x = 1\ndef reward(:\n")
    assert missing_function(path, "reward") == f"{path} has a SyntaxError at line 2: invalid syntax"


def test_not_callable(tmp_path):
    path = write(tmp_path, "reward = 3\n")
    with pytest.raises(TinyRLError, match="not a function"):
        load_reward_fn(f"{path}:reward")


def test_missing_file_and_broken_file(tmp_path):
    with pytest.raises(TinyRLError, match="reward file not found") as info:
        load_reward_fn(f"{tmp_path}/nope.py:reward")
    assert "nope.py" in str(info.value)
    path = write(tmp_path, "def reward(:\n")
    with pytest.raises(TinyRLError, match="SyntaxError") as info:
        load_reward_fn(f"{path}:reward")
    assert str(path) in str(info.value)


@pytest.mark.parametrize("spec", ["math", "countdown2", ":f", "file.py:"])
def test_unknown_spec(spec):
    with pytest.raises(TinyRLError, match="unknown reward") as info:
        load_reward_fn(spec)
    assert "countdown" in info.value.hint and "file.py:func" in info.value.hint


def test_a_huge_integer_is_said_as_out_of_bounds_not_as_a_dead_worker(tmp_path):
    """10**400 made math.isfinite raise OverflowError in the worker, which died with a traceback
    and was reported as 'os._exit(), a crash in C code'."""
    path = write(tmp_path, "def reward(completion, example):\n    return 10 ** 400\n")
    with pytest.raises(TinyRLError) as info:
        load_reward_fn(f"{path}:reward")("x", {})
    assert "an integer of 1329 bits, beyond the bound of +-1e+06" in info.value.message, info.value.message


@pytest.mark.parametrize("body, said", [("raise RuntimeError('needs a GPU')", "RuntimeError: needs a GPU"),
                                        ("import sys; sys.exit('no args')", "SystemExit: no args")])
def test_a_module_whose_import_fails_is_said_at_load_as_the_modules_error(tmp_path, monkeypatch, body, said):
    """A `module:func` whose body raised anything but ImportError killed the worker: a traceback,
    then 'ended its worker process ... call it on that row ... --resume' with no row and no run."""
    write(tmp_path, body + "\n", name="tinyrl_test_badmod.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(TinyRLError) as info:
        load_reward_fn("tinyrl_test_badmod:f")
    assert "importing reward module 'tinyrl_test_badmod' failed" in info.value.message and said in info.value.message
    path = write(tmp_path, body + "\n", name="badfile.py")  # the file form: sys.exit too
    with pytest.raises(TinyRLError) as info:
        load_reward_fn(f"{path}:f")
    assert f"importing reward file {path} failed" in info.value.message and said in info.value.message


def test_a_reward_file_that_imports_a_module_beside_it_is_told_it_stands_alone(tmp_path):
    """`python my_reward.py` runs it (a script's directory is on the path); tinyrl imports the file
    alone, as export-verl copies it. The refusal says so instead of "run it with python"."""
    write(tmp_path, "def score(c):\n    return float(c == 'x')\n", name="helper.py")
    path = write(tmp_path, "import helper\n\n\ndef f(c, e):\n    return helper.score(c)\n")
    with pytest.raises(TinyRLError) as info:
        load_reward_fn(f"{path}:f")
    assert "ModuleNotFoundError: No module named 'helper'" in info.value.message
    assert info.value.hint.startswith(f"my_reward.py imports 'helper', which is beside it in {tmp_path}: tinyrl "
                                      "imports my_reward.py alone"), info.value.hint
    assert "put what it uses from helper into my_reward.py" in info.value.hint
    assert subprocess.run([sys.executable, str(path)]).returncode == 0  # what the user saw work

    # not beside it: the hint's command shows the error as tinyrl met it
    path = write(tmp_path, "import helper_nowhere\n", name="other.py")
    with pytest.raises(TinyRLError) as info:
        load_reward_fn(f"{path}:f")
    command = f"python -P {path}"
    assert command in info.value.hint
    shown = subprocess.run([sys.executable, *command.split()[1:]], capture_output=True, text=True)
    assert "No module named 'helper_nowhere'" in shown.stderr


def test_a_files_module_has_one_name_in_every_process_and_its_objects_travel(tmp_path):
    """Two processes (each with its own str hash seed) import a user's file under one module
    name, so an object of a class the file defines, pickled in one, unpickles in the other."""
    path = write(tmp_path, "class Verdict:\n    def __init__(self, ok):\n        self.ok = ok\n", name="verdicts.py")
    code = ("import pickle, sys; from pathlib import Path; from tinyrl.pyfile import import_file; "
            f"m = import_file(Path({str(path)!r}), 'tinyrl_user_reward'); "
            "sys.stdout.buffer.write(pickle.dumps(m.Verdict(True))) if sys.argv[1] == 'dump' else "
            "print(pickle.loads(sys.stdin.buffer.read()).ok)")
    dumped = subprocess.run([sys.executable, "-c", code, "dump"], capture_output=True, check=True,
                            env={**os.environ, "PYTHONHASHSEED": "1"}).stdout
    loaded = subprocess.run([sys.executable, "-c", code, "load"], input=dumped, capture_output=True,
                            env={**os.environ, "PYTHONHASHSEED": "2"})
    assert loaded.returncode == 0 and loaded.stdout.strip() == b"True", loaded.stderr.decode()[-800:]


@pytest.mark.parametrize("signature", ["c", "c, e, extra", "c, e, *, episode"])
def test_a_function_that_cannot_take_a_sample_is_refused_when_it_loads(tmp_path, signature):
    """Said before any model loads, not at the first reward of step 1; a required keyword-only
    `episode` is fine (it is given), a third positional parameter is not."""
    path = write(tmp_path, f"def reward({signature}):\n    return 1.0\n")
    if signature.endswith("episode"):
        assert load_reward_fn(f"{path}:reward")("x", {}, episode=None) == 1.0
        return
    with pytest.raises(TinyRLError, match=r"cannot be called as reward\(completion, example\)") as info:
        load_reward_fn(f"{path}:reward")
    assert "episode=None" in info.value.hint
    # a callable object (no __name__): the same refusal, not an AttributeError that killed the worker
    path = write(tmp_path, f"class Scorer:\n    def __call__(self, {signature}):\n        return 1.0\nscore = Scorer()\n",
                 name="scorer.py")
    with pytest.raises(TinyRLError, match=r"cannot be called as score\(completion, example\)"):
        load_reward_fn(f"{path}:score")


def test_a_users_function_gets_the_episode_when_it_asks(tmp_path):
    """README: 'A reward function that takes an `episode` keyword gets the sample's episode'. A
    user's function runs in a worker process, whose wrapper had no such keyword: it got None."""
    from tinyrl.rollout.base import Episode, ToolCall, Turn
    from tinyrl.tasks.rewards import reward_set

    path = write(tmp_path, """
        def tools_used(completion, example, episode=None):
            return float(len(episode.tool_calls)) if episode is not None else -1.0
        def plain(completion, example):
            return 0.5
    """)
    episode = Episode(prompt_index=0, prompt_ids=[1], response_ids=[5, 6, 7], policy_mask=[1, 0, 1],
                      logprobs=None, turns=[Turn("assistant", 0, 1), Turn("tool", 1, 2), Turn("assistant", 2, 3)],
                      stop_reason="stop", tool_calls=[ToolCall("code_interpreter", "ok", 0.1, 0)] * 2)
    rs = reward_set([f"{path}:tools_used", f"{path}:plain"], [], None)
    assert rs.fns[0][1].wants_episode and not rs.fns[1][1].wants_episode
    scores = rs.score_batch(["a", "b"], [{}, {}], [episode, None])
    assert scores.parts["tools_used"] == [2.0, -1.0] and scores.parts["plain"] == [0.5, 0.5]


def test_a_reward_error_on_a_row_names_the_file_the_row_is_in(tmp_path):
    """'reward function raises.py:score on row index 3294 (train) ... call it on that row of the
    data': which data? score_batch is given the file the trainer read the rows from."""
    from tinyrl.tasks.rewards import reward_set

    path = write(tmp_path, "def score(completion, example):\n    raise ValueError('no')\n")
    rs = reward_set([f"{path}:score"], [], None)
    row = {"extra_info": {"index": 3294, "split": "train"}}
    data = tmp_path / "runs" / "data" / "train.parquet"
    with pytest.raises(TinyRLError) as info:
        rs.score_batch(["x"], [row], data=data)
    assert "on row index 3294 (train)" in info.value.message and info.value.message.endswith(f"(the row is in {data})")
    assert isinstance(info.value.__cause__, ValueError) and info.value.hint.startswith(f"fix {path}:score")
    with pytest.raises(TinyRLError) as info:  # no file known (a direct call): said as before
        rs.score_batch(["x"], [row])
    assert "the row is in" not in info.value.message


class _Unrebuildable:
    """A value whose unpickling raises (ZeroDivisionError) in the process that receives it."""

    def __reduce__(self):
        import operator

        return operator.truediv, (1, 0)


def test_a_failure_in_the_workers_own_code_is_said_as_such_and_the_worker_lives_on(tmp_path, capfd):
    """Only TinyRLErrors became replies: anything else raised in the worker's own code (as a bug
    in its call-shape check once did) ended the worker, reported as the user's crash ('os._exit(),
    a crash in C code'). Now the error and its traceback, and the same worker answers the next call."""
    path = write(tmp_path, """
        class Odd:
            @property
            def __signature__(self):
                raise RuntimeError("no signature here")
            def __call__(self, completion, example):
                return 1.0
        odd = Odd()
        def reward(completion, example):
            return 0.25
    """)
    with pytest.raises(TinyRLError) as info:  # inspect.signature raises through the load's own checks
        load_reward_fn(f"{path}:odd")
    assert f"loading {path}:odd failed in its worker process: RuntimeError: no signature here" in info.value.message
    assert "ended its worker" not in info.value.message and "tinyrl bug" in info.value.hint
    assert "--resume" not in info.value.hint  # loading precedes every step: no checkpoint to speak of
    assert "Traceback" in capfd.readouterr().err

    fn = load_reward_fn(f"{path}:reward")
    pid = fn._proc.pid
    with pytest.raises(TinyRLError, match="could not receive a sample for .*ZeroDivisionError"):
        fn("x", {"row": _Unrebuildable()})
    assert fn("x", EXAMPLE) == 0.25 and fn._proc is not None and fn._proc.pid == pid


def test_a_reward_that_does_not_load_writes_no_prints_file(tmp_path, capfd):
    """The prints file was opened before the module imported: a start stopped by an import error
    (or a function of the wrong shape) left an empty reward_prints.log in the run directory, which
    then was not removed (tinyrl.rundir.claim removes one holding only its lock). It is opened once
    the function has loaded; what the module prints while it imports goes to stderr."""
    log = tmp_path / "run" / "reward_prints.log"
    log.parent.mkdir()
    broken = write(tmp_path, "print('importing broken')\nimport tinyrl_no_such_module_xyz\n", name="broken.py")
    shape = write(tmp_path, "def score(x):\n    return 1.0\n", name="shape.py")
    for spec in (f"{broken}:score", f"{shape}:score"):
        with pytest.raises(TinyRLError):
            load_reward_fn(spec, prints_to=log)
        assert not log.exists()
    assert "importing broken" in capfd.readouterr().err
    loud = write(tmp_path, "print('importing loud')\ndef score(completion, example):\n    return 1.0\n", name="loud.py")
    assert load_reward_fn(f"{loud}:score", prints_to=log)("x", {}) == 1.0
    assert "importing loud" in capfd.readouterr().err
