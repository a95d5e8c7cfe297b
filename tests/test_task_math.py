"""The maths task: answer extraction, math-verify equivalence under a hard time limit, data
conversion (problem/answer tables, GSM8K's '####', verl schema as is), generated problems."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import venv
from importlib import metadata
from pathlib import Path

import pandas as pd
import pytest

from tinyrl.data.io import ground_truth, load_prompts, prompt_text
from tinyrl.errors import TinyRLError
from tinyrl.tasks import math as mt
from tinyrl.tasks.math import compute_score, extract_answer
from tinyrl.tasks.verify import Verifier

A = "Let me think.\nAnswer: "
HUGE = "1" * 200_000
# (completion, ground truth, expected score with DAPO's +1 / -1)
CASES = [
    # equivalent forms
    (A + "0.5", "\\frac{1}{2}", 1.0),
    (A + "1/2", "0.5", 1.0),
    (A + "\\frac12", "1/2", 1.0),
    (A + "\\dfrac{3}{4}", "0.75", 1.0),
    (A + "$\\frac{7}{8}$", "\\frac{7}{8}", 1.0),
    (A + "3.0", "3", 1.0),
    (A + "5 apples", "5", 1.0),
    (A + "3 cm", "3", 1.0),
    (A + "x = 3", "3", 1.0),
    (A + "1,000", "1000", 1.0),
    (A + "10^{2}", "100", 1.0),
    (A + "2\\sqrt{2}", "\\sqrt{8}", 1.0),
    (A + "x^2+2x+1", "(x+1)^2", 1.0),
    (A + "\\{1,2\\}", "\\{2,1\\}", 1.0),
    (A + "[0,1)", "[0,1)", 1.0),
    (A + "-3", "-3", 1.0),
    (A + "42.", "42", 1.0),
    ("so the result is \\boxed{42}.", "42", 1.0),
    ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("first \\boxed{1} then \\boxed{2}", "2", 1.0),
    ("nested \\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{\\sqrt{2}}{2}", 1.0),
    ("\\fbox{7}", "7", 1.0),
    ("\\boxed 9", "9", 1.0),
    ("Answer: \\boxed{5}", "5", 1.0),
    ("answer:12", "12", 1.0),
    ("ANSWER : 12", "12", 1.0),
    ("Answer: 3\nso\nAnswer: 4", "4", 1.0),            # the last Answer line counts
    ("\\boxed{3} ... Answer: 4", "4", 1.0),            # auto: whichever comes last
    ("Answer: 4 ... \\boxed{3}", "3", 1.0),
    (A + "5", 5, 1.0),                                   # a numeric ground truth
    # near misses
    (A + "4", "5", -1.0),
    (A + "0.33", "1/3", -1.0),
    (A + "\\pi", "3.14159", -1.0),
    (A + "[0,1]", "[0,1)", -1.0),
    (A + "-5", "5", -1.0),
    (A + "x^2+1", "(x+1)^2", -1.0),
    ("Answer: 3\nso\nAnswer: 4", "3", -1.0),
    ("\\boxed{2} then \\boxed{1}", "2", -1.0),
    # malformed and missing
    ("no answer here", "5", -1.0),
    ("", "5", -1.0),
    (A, "5", -1.0),
    ("\\boxed{", "5", -1.0),
    ("\\boxed{5", "5", -1.0),
    (A + "}}}{{{", "5", -1.0),
    (A + "\\frac{", "5", -1.0),
    (A + "abc", "5", -1.0),
    ("<answer>5</answer>", "5", -1.0),                  # Countdown's tags are not a maths answer
    # huge and hostile inputs: bounded, never hang
    (A + HUGE, "5", -1.0),
    ("\\boxed{" * 50_000, "5", -1.0),
    ("Answer: " * 20_000 + "5", "5", 1.0),
    ("x" * 500_000 + "\\boxed{5}", "5", 1.0),
]


def test_table_has_enough_cases():
    assert len(CASES) >= 40


@pytest.mark.parametrize("completion,truth,expected", CASES, ids=range(len(CASES)))
def test_dapo_score_table(completion, truth, expected):
    assert compute_score(completion, truth) == expected


def test_reward_values_and_format_are_configurable():
    assert compute_score(A + "5", "5", correct_score=2.0, wrong_score=0.0) == 2.0
    assert compute_score(A + "4", "5", correct_score=2.0, wrong_score=0.0) == 0.0
    assert compute_score("\\boxed{5}", "5", answer_format="dapo") == -1.0   # no Answer line
    assert compute_score("Answer: 5", "5", answer_format="boxed") == -1.0   # no \boxed{}
    assert extract_answer("\\boxed{3} Answer: 4", "boxed") == "3"


def test_time_limit_kills_the_worker_and_scores_wrong():
    v = Verifier(timeout_s=1.0)
    try:
        start = time.monotonic()
        assert not v.equivalent("9" * 5 + "^" + "9" * 5 + "^" + "9" * 5, "1")  # sympy would run for ages
        assert time.monotonic() - start < 30  # far under "forever"; the limit is 1 s plus a kill
        assert v.timeouts == 1
        # A fresh worker answers the next call. Its first answer parses and compares for the
        # first time: 0.07-0.12 s on 2 quiet cores but 0.41-0.61 s with both cores busy, too
        # close to the 1 s limit above, so this call gets 30 s: a limit that only catches a hang.
        v.timeout_s = 30.0
        assert v.equivalent("1/2", "0.5")
    finally:
        v.close()


def test_safe_in_worker_threads():
    """math-verify's own timeout raises off the main thread; ours works in any thread."""
    results, errors = [], []

    def work(i):
        try:
            results.append(compute_score(f"Answer: {i}/2", str(i / 2)))
        except Exception as e:  # noqa: BLE001 - collected for the assertion below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(1, 9)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and results == [1.0] * 8


# math-verify and what it imports, as `pip install --target DIR` lays them out in DIR
_MATH_VERIFY_DISTS = ("math-verify", "latex2sympy2_extended", "antlr4-python3-runtime", "sympy", "mpmath")
_CHILD = r"""
import importlib.util, json, sys
from tinyrl.tasks.verify import Verifier
if sys.argv[1] == "sys.path.insert":
    sys.path.insert(0, sys.argv[2])
found = importlib.util.find_spec("math_verify")
v = Verifier(timeout_s=60.0)
try:
    print(json.dumps([found and found.origin, v.equivalent("1/2", "\\frac{1}{2}"), v.equivalent("1/3", "0.5")]))
finally:
    v.close()
"""


@pytest.mark.parametrize("how", ["PYTHONPATH", "sys.path.insert"])
def test_worker_imports_math_verify_from_where_the_parent_found_it(tmp_path, how):
    """math-verify importable only through PYTHONPATH (a `pip install --target DIR` install) or
    a run-time sys.path entry: the parent's check passed, and the worker, started with `-I`
    (no PYTHONPATH, no user site), "did not start" (40 tests on an H100). Here a real worker
    starts in a child interpreter of a bare venv whose site-packages have no math-verify."""
    target = tmp_path / "target"
    target.mkdir()
    for name in _MATH_VERIFY_DISTS:
        dist = metadata.distribution(name)
        if not dist.files:
            pytest.skip(f"{name} was installed without a RECORD: its files are not known")
        for top in {f.parts[0] for f in dist.files} - {"..", "__pycache__"}:
            (target / top).symlink_to(dist.locate_file(top))
    venv.create(tmp_path / "bare", with_pip=False, symlinks=True)
    python = str(tmp_path / "bare" / "bin" / "python")
    repo = str(Path(__file__).resolve().parents[1])     # tinyrl: verify.py needs only the stdlib
    bare = subprocess.run([python, "-c", "import math_verify"], capture_output=True, timeout=60,
                          env={"PATH": os.environ["PATH"]})
    assert bare.returncode != 0, "the bare venv must not provide math-verify itself"
    path = os.pathsep.join([str(target), repo] if how == "PYTHONPATH" else [repo])
    done = subprocess.run([python, "-c", _CHILD, how, str(target)], capture_output=True, text=True,
                          timeout=120, env={"PATH": os.environ["PATH"], "PYTHONPATH": path})
    assert done.returncode == 0, done.stderr[-2000:]
    origin, right, wrong = json.loads(done.stdout)
    assert origin == str(target / "math_verify" / "__init__.py")
    assert (right, wrong) == (True, False)


def test_a_worker_that_does_not_start_says_why(monkeypatch):
    """On the H100 the error said only "did not start": the worker's stderr went nowhere. A real
    worker process that fails as it starts (an import it cannot make) has its last lines in it."""
    from tinyrl.tasks import verify

    monkeypatch.setattr(verify, "worker_command", lambda: [sys.executable, "-c", "import no_such_module_for_tinyrl"])
    v = Verifier(timeout_s=5.0)
    try:
        with pytest.raises(TinyRLError, match="did not start: .*No module named 'no_such_module_for_tinyrl'"):
            v.equivalent("1/2", "0.5")
    finally:
        v.close()


def test_worker_never_imports_from_its_own_directory(monkeypatch):
    """The worker takes the parent's sys.path, but not tinyrl/tasks (its own directory) even
    when the parent has it: tasks/math.py there would shadow the stdlib's `math` that sympy needs."""
    import math_verify  # noqa: F401 - imported before the path below can shadow anything

    monkeypatch.syspath_prepend(str(Path(mt.__file__).parent))
    v = Verifier(timeout_s=60.0)
    try:
        assert v.equivalent("1/2", "0.5")
    finally:
        v.close()


def test_generated_data_is_verl_schema_with_correct_answers(tmp_path):
    train, test = mt.generate(tmp_path, 64, 16, seed=1, template="dapo")
    rows = load_prompts(train).to_dict("records")
    assert len(rows) == 64 and rows[0]["data_source"] == "math_dapo"
    assert rows[0]["prompt"][0]["role"] == "user" and "Answer:" in prompt_text(rows[0])
    test_problems = {prompt_text(r) for r in load_prompts(test).to_dict("records")}
    assert not test_problems & {prompt_text(r) for r in rows}  # held out
    for row in rows:  # the stored answer is what a correct solver would write
        assert compute_score(f"Answer: {ground_truth(row)}", ground_truth(row)) == 1.0
    # every kind of problem is checked by the verifier, not only by string equality
    assert compute_score("\\boxed{" + str(eval("3/4 + 1/8")) + "}", "\\frac{7}{8}") == 1.0
    with pytest.raises(TinyRLError, match="train.parquet, .*test.parquet already exist; nothing was written"):
        mt.generate(tmp_path, 4, 4)


def test_generated_answers_are_right(tmp_path):
    """Problems parse back to their answer: a + b * c, a - b, cx + a = d, fraction sums."""
    import random
    from fractions import Fraction

    rng = random.Random(0)
    for _ in range(200):
        problem, answer = mt._problem(rng)
        if problem.startswith("What is"):
            assert str(eval(problem[len("What is "):-1])) == answer
        elif problem.startswith("Solve"):
            lhs, rhs = problem.split("$")[3].rstrip("$").split(" = ")
            c, a = lhs.split("x + ")
            assert Fraction(int(rhs) - int(a), int(c)) == int(answer)
        else:
            nums = [int(x) for x in problem.replace("}", "{").split("{") if x.isdigit()]
            f = Fraction(nums[0], nums[1]) + Fraction(nums[2], nums[3])
            assert compute_score(f"Answer: {f.numerator}/{f.denominator}", answer) == 1.0


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl", ".csv"])
def test_convert_problem_answer_tables(tmp_path, suffix):
    frame = pd.DataFrame({"problem": ["What is 2 + 2?", "Half of 1?", "   "], "answer": ["4", "\\frac{1}{2}", "1"]})
    src = tmp_path / f"bench{suffix}"
    {".parquet": lambda: frame.to_parquet(src), ".jsonl": lambda: frame.to_json(src, orient="records", lines=True),
     ".csv": lambda: frame.to_csv(src, index=False)}[suffix]()
    path, n, _, skipped = mt.convert(str(src), tmp_path / "out", "boxed")
    assert path == tmp_path / "out" / "bench.parquet" and (n, skipped) == (2, 1)  # the blank problem is skipped
    rows = load_prompts(path).to_dict("records")
    assert rows[0]["data_source"] == "lighteval/MATH" and "\\boxed{}" in prompt_text(rows[0])
    assert [ground_truth(r) for r in rows] == ["4", "\\frac{1}{2}"]
    with pytest.raises(TinyRLError, match="already exists"):
        mt.convert(str(src), tmp_path / "out", "boxed")


def test_convert_skips_missing_cells_and_keeps_answers_as_written(tmp_path, capsys):
    # an empty CSV cell or a JSON null read as NaN: it became the problem "nan" or the ground
    # truth "nan" (no answer could score), and type inference made the answer "2" into "2.0"
    (tmp_path / "t.csv").write_text("question,answer\nWhat is 1+1?,2\nWhat is 2+2?,\n,5\nLeading zero?,007\n")
    (tmp_path / "j.jsonl").write_text('{"question": "a?", "answer": null}\n{"question": "b?", "answer": "3"}\n'
                                      '{"question": null, "answer": "4"}\n')
    for name, truths in (("t.csv", ["2", "007"]), ("j.jsonl", ["3"])):
        path, n, _, skipped = mt.convert(str(tmp_path / name), tmp_path / "out", "boxed")
        assert [ground_truth(r) for r in load_prompts(path).to_dict("records")] == truths
        assert (n, skipped) == (len(truths), 2)
    mt.data_command(out_dir=tmp_path / "cli", source=str(tmp_path / "t.csv"), template="boxed", name=None,
                    problem_key=None, answer_key=None, train_size=1, test_size=1, seed=0)
    assert "(2 rows; 2 rows without a problem or an answer skipped)" in " ".join(capsys.readouterr().out.split())


def test_convert_gsm8k_and_aime_style_columns(tmp_path):
    gsm = tmp_path / "gsm.jsonl"
    gsm.write_text("\n".join(json.dumps(r) for r in [
        {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = 7\n#### 7"},
        {"question": "A big sum?", "answer": "so\n#### 1,234"}]))
    path, *_ = mt.convert(str(gsm), tmp_path / "out", "dapo")
    assert [ground_truth(r) for r in load_prompts(path).to_dict("records")] == ["7", "1234"]
    aime = tmp_path / "aime.parquet"
    pd.DataFrame({"ID": ["x-1"], "Problem": ["Find n."], "Answer": [204]}).to_parquet(aime)
    path, *_ = mt.convert(str(aime), tmp_path / "out", "dapo")
    assert ground_truth(load_prompts(path).to_dict("records")[0]) == "204"
    worked = tmp_path / "worked.parquet"
    pd.DataFrame({"problem": ["p"], "solution": ["so it is \\boxed{\\frac{1}{3}}."]}).to_parquet(worked)
    path, *_ = mt.convert(str(worked), tmp_path / "out", "boxed")
    assert ground_truth(load_prompts(path).to_dict("records")[0]) == "\\frac{1}{3}"


def test_convert_keeps_verl_files_and_asks_for_unknown_columns(tmp_path):
    train, _ = mt.generate(tmp_path / "g", 4, 4)
    path, n, *_ = mt.convert(str(train), tmp_path / "copy", "boxed")  # verl's schema: kept as it is
    assert n == 4 and pd.read_parquet(path).equals(pd.read_parquet(train))
    odd = tmp_path / "odd.csv"
    pd.DataFrame({"q": ["x"], "a": ["1"]}).to_csv(odd, index=False)
    with pytest.raises(TinyRLError, match="--problem-key") as info:
        mt.convert(str(odd), tmp_path, "dapo")
    assert info.value.message == (f"{odd}: no problem or answer column (looked for problem, question, Problem, Question "
                                  "and answer, Answer, final_answer, ground_truth, solution, Solution; the file has: q, a)")
    # the one that is missing is named ("no problem/answer columns found (columns: problem)" named neither)
    half = tmp_path / "half.jsonl"
    half.write_text('{"problem": "What is 2+2?"}\n')
    with pytest.raises(TinyRLError) as info:
        mt.convert(str(half), tmp_path / "half", "dapo")
    assert info.value.message.startswith(f"{half}: no answer column (looked for answer, Answer,"), info.value.message
    assert "the file has: problem)" in info.value.message and info.value.hint == "name it with --answer-key"
    # an empty file, or a CSV header alone, is said to be so: it was "no problem/answer columns found
    # (columns: )", pandas' "No columns to parse from file", or "... check --answer-key"
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "empty.csv").write_text("\n")
    (tmp_path / "header.csv").write_text("problem,answer\n")
    for name, said in (("empty.jsonl", "the file is empty"), ("empty.csv", "the file is empty"),
                       ("header.csv", "the file has no rows (columns: problem, answer)")):
        with pytest.raises(TinyRLError) as info:
            mt.convert(str(tmp_path / name), tmp_path / "none", "dapo")
        assert info.value.message == f"--from {tmp_path / name}: {said}", info.value.message
    path, *_ = mt.convert(str(odd), tmp_path / "out", "dapo", problem_key="q", answer_key="a")
    assert path.name == "odd.parquet"
    # a named column that is not there is said as such ("no problem/answer columns" while they were)
    with pytest.raises(TinyRLError, match=r"no column --answer-key nope \(columns: q, a\)"):
        mt.convert(str(odd), tmp_path / "nope", "dapo", problem_key="q", answer_key="nope")
    # --name x.parquet is the file x.parquet, not x.parquet.parquet
    path, *_ = mt.convert(str(odd), tmp_path / "named", "dapo", name="x.parquet", problem_key="q", answer_key="a")
    assert path.name == "x.parquet"
    with pytest.raises(TinyRLError, match="--test-size must be a positive integer, got 0") as info:
        mt.generated_problems(8, 0)
    assert info.value.hint == "e.g. --test-size 1000"


def test_hf_source_without_network_or_package_says_what_to_do(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "datasets", None)  # the optional extra is not installed
    with pytest.raises(TinyRLError) as e:
        mt.convert("hf:someone/some-set:test", tmp_path, "dapo")
    assert "datasets" in e.value.message and "--from FILE" in e.value.hint

    class Offline:  # installed, its host resolves (a proxy), but the Hub cannot be reached
        @staticmethod
        def load_dataset(path, name=None, split=None):
            raise ConnectionError("Couldn't reach the Hub")

    monkeypatch.setitem(sys.modules, "datasets", Offline)
    monkeypatch.setattr(mt, "hub_unreachable", lambda: None)
    with pytest.raises(TinyRLError, match="could not load 'someone/some-set' .split test.*ConnectionError"):
        mt.convert("hf:someone/some-set:test", tmp_path, "dapo")


def test_hf_source_whose_hub_host_does_not_resolve_reads_the_cache_alone_at_once(tmp_path):
    """No network: huggingface_hub retried the name lookup 5 times, backing off (~24 s), before the
    same error. A real lookup of a name that cannot exist (.invalid, RFC 2606), real `datasets`."""
    import os
    import subprocess
    import sys

    pytest.importorskip("datasets")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT="https://hub.tinyrl.invalid", COLUMNS="200")
    done = subprocess.run([sys.executable, "-m", "tinyrl.cli", "data", "math", "--from", "hf:someone/some-set:test",
                           "--out", str(tmp_path / "data")], capture_output=True, text=True, timeout=300, env=env)
    text = " ".join(done.stderr.replace("│", " ").split())
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "could not load 'someone/some-set' (split test)" in text and "(OfflineModeIsEnabled)" in text, text
    assert "(only the local cache was read: hub.tinyrl.invalid cannot be resolved: " in text, text
    assert "Retrying" not in done.stderr and not (tmp_path / "data").exists()


def test_hf_source_cache_only_mode_is_undone_after_the_load(hub, tmp_path, monkeypatch):
    """The offline flags are module globals of datasets and huggingface_hub: set for the load
    alone, then as they were (a later download in the same process must not be refused)."""
    from huggingface_hub import constants

    datasets, served, calls = hub
    seen = []
    served_load = datasets.load_dataset

    def load_dataset(*args, **kwargs):
        seen.append((datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE))
        return served_load(*args, **kwargs)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    served[("someone/some-set", None, "test")] = datasets.Dataset.from_dict(MATH500_LIKE)
    before = datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE
    for reason in ("hub.example cannot be resolved", None):
        monkeypatch.setattr(mt, "hub_unreachable", lambda reason=reason: reason)
        frame, name = mt.read_table("hf:someone/some-set:test")
        assert len(frame) == 3 and name == "some-set-test"
        assert (datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE) == before
    assert seen == [(True, True), before]


@pytest.fixture
def hub(monkeypatch):
    """The real `datasets` package with load_dataset answering from Datasets built here (no network):
    {(path, config, split): Dataset}. The call must fit load_dataset's real signature."""
    import inspect
    import os

    try:
        import datasets
    except ImportError:
        if os.environ.get("CI"):  # the [test] extra installs it
            pytest.fail("datasets is not installed: pip install -e '.[test]'")
        pytest.skip("datasets not installed (pip install -e '.[test]')")
    served, calls = {}, []
    real = inspect.signature(datasets.load_dataset)

    def load_dataset(*args, **kwargs):
        bound = real.bind(*args, **kwargs).arguments
        key = (bound["path"], bound.get("name"), bound.get("split"))
        calls.append(key)
        return served[key]

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return datasets, served, calls


# Made-up problems in the published column layouts (no benchmark text is copied).
MATH500_LIKE = {"problem": ["What is $1/4 + 1/4$?", "Compute $2^{10}$.", "Give the point $(1+2, 2+2)$."],
                "solution": ["It is $\\boxed{\\frac{1}{2}}$.", "$\\boxed{1024}$", "$\\boxed{(3, 4)}$"],
                "answer": ["\\frac{1}{2}", "1024", "(3, 4)"], "subject": ["Algebra"] * 3, "level": [1, 2, 3],
                "unique_id": ["a/1.json", "a/2.json", "a/3.json"]}
GSM8K_LIKE = {"question": ["Ann has 3 pens and buys 4. How many?", "What is 1,000 + 234?"],
              "answer": ["3 + 4 = <<3+4=7>>7\n#### 7", "1000 + 234 = 1234\n#### 1,234"]}
# (a correct completion, a completion with the same value written otherwise, a wrong one) per row
MATH500_ANSWERS = [("Answer: \\frac{1}{2}", "Answer: 0.5", "Answer: 1/3"), ("Answer: 1024", "Answer: 1024.0", "Answer: 1000"),
                   ("Answer: (3, 4)", "Answer: (3,4)", "Answer: (4, 3)")]


def test_hf_source_converts_a_real_dataset_and_the_parquet_scores_with_the_math_reward(tmp_path, hub):
    from typer.testing import CliRunner

    from tinyrl.cli import app
    from tinyrl.config import TaskConfig

    datasets, served, calls = hub
    served[("HuggingFaceH4/MATH-500", None, "test")] = datasets.Dataset.from_dict(MATH500_LIKE)
    served[("openai/gsm8k", "main", "test")] = datasets.Dataset.from_dict(GSM8K_LIKE)
    runner = CliRunner()
    done = runner.invoke(app, ["data", "math", "--from", "hf:HuggingFaceH4/MATH-500:test", "--out", str(tmp_path)])
    assert done.exit_code == 0, done.output
    done = runner.invoke(app, ["data", "math", "--from", "hf:openai/gsm8k:main:test", "--out", str(tmp_path),
                               "--template", "boxed"])
    assert done.exit_code == 0, done.output
    assert calls == [("HuggingFaceH4/MATH-500", None, "test"), ("openai/gsm8k", "main", "test")]
    score = mt.reward(TaskConfig(name="math"))  # DAPO values: +1 / -1
    rows = load_prompts(tmp_path / "math-500-test.parquet").to_dict("records")
    assert [ground_truth(r) for r in rows] == MATH500_LIKE["answer"]
    assert [prompt_text(r) for r in rows] == [mt.prompt_of(p, "dapo") for p in MATH500_LIKE["problem"]]
    for row, (right, same, wrong) in zip(rows, MATH500_ANSWERS, strict=True):
        assert (score(right, row), score(same, row), score(wrong, row)) == (1.0, 1.0, -1.0)
    rows = load_prompts(tmp_path / "gsm8k-test.parquet").to_dict("records")
    assert [ground_truth(r) for r in rows] == ["7", "1234"]
    boxed = mt.reward(TaskConfig(name="math", answer_format="boxed"))
    assert [boxed("so \\boxed{7}", rows[0]), boxed("\\boxed{1234}", rows[1]), boxed("\\boxed{1243}", rows[1])] == \
        [1.0, 1.0, -1.0]


def test_hf_source_in_verls_schema_is_kept_and_scores(tmp_path, hub):
    """DAPO-Math-17k's layout through `datasets` (nested prompt messages and reward_model)."""
    from tinyrl.config import TaskConfig

    datasets, served, calls = hub
    served[("BytedTsinghua-SIA/DAPO-Math-17k", None, "train")] = datasets.Dataset.from_dict({
        "data_source": ["math_dapo"] * 2, "ability": ["MATH"] * 2,
        "prompt": [[{"role": "user", "content": mt.prompt_of(q, "dapo")}] for q in ("What is 6 * 7?", "Half of 3?")],
        "reward_model": [{"style": "rule", "ground_truth": "42"}, {"style": "rule", "ground_truth": "\\frac{3}{2}"}],
        "extra_info": [{"index": "u-1"}, {"index": "u-2"}]})
    path, n, *_ = mt.convert("hf:BytedTsinghua-SIA/DAPO-Math-17k", tmp_path, "dapo", name="dapo-math-17k")
    assert (path.name, n) == ("dapo-math-17k.parquet", 2)
    rows = load_prompts(path).to_dict("records")
    assert prompt_text(rows[0]) == mt.prompt_of("What is 6 * 7?", "dapo")
    score = mt.reward(TaskConfig(name="math"))
    assert [score("Answer: 42", rows[0]), score("Answer: 1.5", rows[1]), score("Answer: 3/4", rows[1])] == \
        [1.0, 1.0, -1.0]


def test_verl_dapo_parquet_reads_as_is(tmp_path):
    """DAPO-Math-17k's layout (prompt messages, ground_truth string, data_source math_dapo)."""
    path = tmp_path / "dapo.parquet"
    pd.DataFrame({"data_source": ["math_dapo"], "ability": ["MATH"],
                  "prompt": [[{"role": "user", "content": mt.prompt_of("What is 6 * 7?", "dapo")}]],
                  "reward_model": [{"style": "rule", "ground_truth": "42"}],
                  "extra_info": [{"index": "a-uuid"}]}).to_parquet(path)
    row = load_prompts(path).to_dict("records")[0]
    from tinyrl.config import TaskConfig

    score = mt.reward(TaskConfig(name="math"))
    assert score("6 * 7 = 42\nAnswer: 42", row) == 1.0 and score("Answer: 41", row) == -1.0


def test_a_broken_json_lines_file_is_named_by_its_line(tmp_path):
    """`data math --from bad.jsonl` said pandas' `Expected object or value at position 64`."""
    from tinyrl.tasks.math import read_table

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem": "1+1?", "answer": "2"}\n\n{"problem": "2+3?", "answer": \n{"problem": "x"}\n')
    with pytest.raises(TinyRLError, match=r"bad.jsonl: line 3 is not JSON \(Expecting value\): "
                                          r"'\{\"problem\": \"2\+3\?\", \"answer\": '"):
        read_table(str(bad))
    whole = tmp_path / "bad.json"
    whole.write_text('[{"problem": "1+1?",\n  "answer": }]\n')
    with pytest.raises(TinyRLError, match=r"bad.json: line 2 is not JSON"):
        read_table(str(whole))
    whole.write_text("")  # an empty file crashed the message itself (IndexError, a traceback), then
    with pytest.raises(TinyRLError, match=r"bad.json: the file is empty\n"):  # was "line 1 is not JSON"
        read_table(str(whole))


def test_repeated_prompts_are_kept_once_so_an_epoch_is_the_one_the_preset_prices(tmp_path, hub, capsys):
    """DAPO-Math-17k holds each of its 17,917 prompts 100 times. `tinyrl data math` kept the file as
    it was, so README's download made a 1.79M-prompt epoch where math-grpo-4090's
    generate_train_size and estimate-cost price 17,917: 100x the cost. Now, as `tinyrl data retool`
    does, the first row of each prompt is kept (columns as they were) and the repeats are counted."""
    datasets, served, _ = hub
    problems = [("What is 6 * 7?", "42"), ("Half of 3?", "\\frac{3}{2}"), ("What is 2 + 2?", "4")]
    repeated = [(q, a, f"u-{copy}-{i}") for copy in range(5) for i, (q, a) in enumerate(problems)]  # 5 times each
    served[("BytedTsinghua-SIA/DAPO-Math-17k", None, "train")] = datasets.Dataset.from_dict({
        "data_source": ["math_dapo"] * 15, "ability": ["MATH"] * 15,
        "prompt": [[{"role": "user", "content": mt.prompt_of(q, "dapo")}] for q, _, _ in repeated],
        "reward_model": [{"style": "rule", "ground_truth": a} for _, a, _ in repeated],
        "extra_info": [{"index": index} for _, _, index in repeated]})
    mt.data_command(out_dir=tmp_path / "data" / "math", source="hf:BytedTsinghua-SIA/DAPO-Math-17k", template="dapo",
                    name="dapo-math-17k", problem_key=None, answer_key=None, train_size=1, test_size=1, seed=0)
    out = " ".join(capsys.readouterr().out.split())
    assert "dapo-math-17k.parquet (3 rows; 12 repeated rows kept once)" in out, out
    frame = pd.read_parquet(tmp_path / "data" / "math" / "dapo-math-17k.parquet")
    assert list(frame.columns) == ["data_source", "ability", "prompt", "reward_model", "extra_info"]
    assert [r["index"] for r in frame["extra_info"]] == ["u-0-0", "u-0-1", "u-0-2"]  # the first of each
    assert [ground_truth(r) for r in frame.to_dict("records")] == [a for _, a in problems]
    # a plain problem/answer table: a repeated problem is kept once too, and said
    pd.DataFrame({"problem": ["p1", "p2", "p1", "p1"], "answer": ["1", "2", "1", "1"]}).to_parquet(tmp_path / "t.parquet")
    path, n, dropped, skipped = mt.convert(str(tmp_path / "t.parquet"), tmp_path / "plain", "dapo")
    assert (n, dropped, skipped) == (2, 2, 0)
    # the preset prices DAPO-Math-17k's distinct prompts: what this command writes
    from tinyrl.config import load_config

    assert load_config("math-grpo-4090").data.generate_train_size == 17_917
