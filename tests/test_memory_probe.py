import os

import pytest
import torch

import tinyrl  # noqa: F401  (before transformers/peft)
from tinyrl.errors import TinyRLError
from tinyrl.memory import probe
from tinyrl.memory.simulate import Step

CPU_OOM = ("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
           "memory: you tried to allocate 1048576 bytes. Error code 12 (Cannot allocate memory)")

# Small enough that a real CPU step takes milliseconds; the vocabulary makes the log-prob
# chunk the big allocation, as in real models.
PROBE_SPEC = dict(model_type="qwen2", vocab_size=8192, hidden_size=128, intermediate_size=384,
                  num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                  tie_word_embeddings=True, max_position_embeddings=2048, rms_norm_eps=1e-6,
                  rope_theta=10000.0)


def test_only_allocator_failures_count_as_oom():
    assert probe.is_oom(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert probe.is_oom(RuntimeError(CPU_OOM))
    assert probe.is_oom(MemoryError())
    assert not probe.is_oom(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not probe.is_oom(ValueError("out of memory"))


@pytest.mark.parametrize("limit", [1, 2, 3, 7, 100, 511, 512])
def test_search_finds_the_largest_size_that_runs(limit, monkeypatch):
    monkeypatch.setattr(probe, "free_memory", lambda: None)  # nothing to free; gc per try took seconds
    tried = []

    def try_step(b):
        tried.append(b)
        if b > limit:
            raise RuntimeError(CPU_OOM)

    assert probe.find_max_micro_batch(try_step, 1, 512) == limit
    assert len(tried) <= 2 * 10 + 1  # doubling then bisecting: logarithmic in the range


def test_search_below_lo_and_other_errors():
    def never(b):
        raise torch.OutOfMemoryError("CUDA out of memory")

    assert probe.find_max_micro_batch(never, 4, 64) == 3

    def broken(b):
        raise RuntimeError("expected scalar type Float but found BFloat16")

    with pytest.raises(RuntimeError, match="scalar type"):
        probe.find_max_micro_batch(broken)


def test_a_size_that_ran_once_at_the_ceiling_is_measured_again_and_stepped_down_from(monkeypatch):
    """The CPU twin's flake (issue 19): the search ended on 8, which ran once, then failed each
    time after (the edge moved by ~1 MiB). The answer must be a size that runs again."""
    monkeypatch.setattr(probe, "free_memory", lambda: None)  # nothing to free here
    ran = []

    def edge(b):  # 8 runs once, later only 7 and below
        if b > 8 or (b == 8 and 8 in ran):
            raise RuntimeError(CPU_OOM)
        ran.append(b)

    out = probe.search_with_proof(edge, 1, 16)
    assert (out["max_micro_batch"], out["reruns"], out["stepped_down"]) == (7, True, 1)
    assert "DefaultCPUAllocator" in out["double_error"]  # 14, twice the answer

    def never_again(b):  # after the search nothing runs: the evidence says so, no wrong answer
        ran.append(b)
        if b > 8 or 16 in ran:
            raise RuntimeError(CPU_OOM)

    ran.clear()
    out = probe.search_with_proof(never_again, 1, 16, step_downs=2)
    assert (out["reruns"], out["stepped_down"]) == (False, 2)


def test_cpu_peak_is_measured_from_allocator_events():
    def fn():
        a = torch.empty(4_000_000)       # 16 MB
        b = torch.empty(2_000_000)       # + 8 MB: the peak
        del a, b
        torch.empty(1_000_000)

    assert probe.measure_peak(fn) == pytest.approx(24_000_000, rel=0.01)


def _needs(n_bytes):
    torch.empty(n_bytes, dtype=torch.uint8).fill_(1)
    return "ran"


def test_the_memory_limit_is_real_and_errors_come_back():
    assert probe.run_under_memory_limit(_needs, 64 * 2**20, 16 * 2**20) == "ran"
    with pytest.raises(TinyRLError, match="DefaultCPUAllocator"):
        probe.run_under_memory_limit(_needs, 64 * 2**20, 256 * 2**20)


def _cuda_seen():
    return os.environ.get("CUDA_VISIBLE_DEVICES"), torch.cuda.is_available()


def test_the_memory_limited_child_hides_any_card(monkeypatch):
    """On a machine with a card the child's first backward (or torch.cuda.is_available) started
    the CUDA driver after the baseline was read, and its gigabytes of address space were charged
    to the headroom (H100, 2026-11-27). The child sees no card; the parent keeps its own."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # as a user's shell on a card machine may say
    assert probe.run_under_memory_limit(_cuda_seen, 64 * 2**20) == ("", False)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0"


def test_probe_meets_real_allocator_failures_under_a_cpu_limit():
    """The same search the GPU probe uses, on tinyrl's real LoRA training micro-step (real
    weights on CPU, forward + backward + AdamW), in a child whose address space may grow by
    64 MiB: B must run (again), and 2B must fail in torch's CPU allocator."""
    step = Step("actor_update", 1, 128, 64, "lora", 8, logprob_chunk=128, dtype="fp32")
    out = probe.run_under_memory_limit(probe.search_with_proof, 64 * 2**20, PROBE_SPEC, step,
                                       prepare=probe.real_try_step)
    assert out["max_micro_batch"] >= 2
    assert out["reruns"]
    assert "DefaultCPUAllocator: can't allocate memory" in out["double_error"]
