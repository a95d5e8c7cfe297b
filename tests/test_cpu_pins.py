"""Tests of the CPU path say so: on a CUDA machine they must still train on the CPU (issue 20,
item 7), so each pins trainer.device=cpu instead of trusting the preset's default. Checked here
with a card faked in: every CPU-path test's configuration must resolve to the CPU, fp32 and the
transformers engine, whatever countdown-tiny's own [trainer] device says."""

from __future__ import annotations

import pytest
import torch

from tinyrl.config import load_config
from tinyrl.models import pick_dtype
from tinyrl.setup import pick_device

import test_faults
import test_learning
import test_trainer
from helpers.oom_child import child_overrides


def sets_of(args: list[str]) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args) if a == "--set"]


# The --set lists the CPU-path tests train with (test_export trains with test_trainer's).
CPU_PATH = {
    "test_learning[ppo]": lambda tmp: test_learning.COMMON + test_learning.ALGOS["ppo"],
    "test_learning[grpo]": lambda tmp: test_learning.COMMON + test_learning.ALGOS["grpo"],
    "test_faults": lambda tmp: sets_of(test_faults.command(tmp / "train.parquet", tmp / "run")),
    "test_oom (oom_child)": lambda tmp: child_overrides(tmp / "train.parquet", "tinyrl/tiny-qwen2", 4096),
    "test_trainer, test_export": None,  # tiny_config() below
}


@pytest.mark.parametrize("name", list(CPU_PATH))
def test_cpu_path_tests_pin_the_cpu_even_where_cuda_is_there(name, monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a CUDA machine
    # countdown-tiny's own device must not decide: as if the preset said "auto".
    as_auto = lambda preset, overrides=(): load_config(preset, ["trainer.device=auto", *overrides])  # noqa: E731
    if CPU_PATH[name] is None:
        monkeypatch.setattr(test_trainer, "load_config", as_auto)
        cfg = test_trainer.tiny_config(tmp_path)
    else:
        cfg = as_auto("countdown-tiny", CPU_PATH[name](tmp_path))
    device = pick_device(cfg.trainer.device)
    assert device.type == "cpu", f"{name} would train on {device}: add trainer.device=cpu to its settings"
    assert pick_dtype(cfg.model.dtype, device) == torch.float32
    assert cfg.rollout.engine == "hf"
