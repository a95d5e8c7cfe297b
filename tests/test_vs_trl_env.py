"""benchmarks/vs_trl.py measures in the user's environment (issue 29 item 8): it used to set
OMP_WAIT_POLICY=PASSIVE for every run when the shell had none, which slows TRL's step (1.00 s
against 0.44-0.80 s unset) and made README's headline a figure no user gets."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _vs_trl():
    spec = importlib.util.spec_from_file_location("vs_trl", ROOT / "benchmarks" / "vs_trl.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_runs_get_the_callers_environment_and_set_no_thread_policy_of_their_own():
    env = _vs_trl().child_env({"HOME": "/h", "PATH": "/bin"})
    assert "OMP_WAIT_POLICY" not in env and "OMP_NUM_THREADS" not in env
    assert env["HOME"] == "/h" and env["PATH"] == "/bin"
    assert env["PYTHONPATH"] == str(ROOT)           # the runs import this checkout's tinyrl


def test_a_policy_in_the_shell_is_kept_and_the_options_override_it():
    vs_trl = _vs_trl()
    assert vs_trl.child_env({"OMP_WAIT_POLICY": "ACTIVE"})["OMP_WAIT_POLICY"] == "ACTIVE"
    env = vs_trl.child_env({"OMP_WAIT_POLICY": "ACTIVE"}, threads=1, wait_policy="PASSIVE")
    assert env["OMP_WAIT_POLICY"] == "PASSIVE" and env["OMP_NUM_THREADS"] == "1"
