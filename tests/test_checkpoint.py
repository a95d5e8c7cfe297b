"""Checkpoints: atomic, keep the last N, and a full disk keeps the previous one."""

from __future__ import annotations

import pytest
import torch

from helpers import small_disk as small_disk_helpers
from tinyrl import checkpoint as ckpt


def _state(step: int) -> dict:
    return {"step": step, "w": torch.full((256,), float(step)), "nested": {"m": [torch.ones(8)]}}


def test_save_load_and_keep_last(tmp_path):
    for step in (1, 2, 3, 4):
        result = ckpt.save_checkpoint(tmp_path, step, _state(step), keep_last=2)
        assert result.saved and result.size_bytes > 256 * 4
    names = [p.name for p in ckpt.list_checkpoints(tmp_path)]
    assert names == ["step_0000003", "step_0000004"]
    state = ckpt.load_latest(tmp_path)
    assert state["step"] == 4 and torch.equal(state["w"], torch.full((256,), 4.0))


def test_half_written_checkpoint_is_ignored(tmp_path):
    ckpt.save_checkpoint(tmp_path, 1, _state(1), keep_last=2)
    # What a kill mid-write leaves behind: a temporary dir, and a step dir without its state file.
    (tmp_path / ".tmp-step_0000002").mkdir()
    (tmp_path / ".tmp-step_0000002" / "state.pt").write_bytes(b"truncated")
    (tmp_path / "step_0000003").mkdir()
    assert ckpt.load_latest(tmp_path)["step"] == 1


def test_full_disk_keeps_previous_checkpoint(tmp_path, monkeypatch):
    ckpt.save_checkpoint(tmp_path, 1, _state(1), keep_last=1)
    size = ckpt.path_size(tmp_path / "step_0000001")
    monkeypatch.setattr(ckpt, "free_disk_bytes", lambda path: size - 1)  # one byte short, no margin
    result = ckpt.save_checkpoint(tmp_path, 2, _state(2), keep_last=1)
    assert not result.saved
    assert "not enough disk" in result.message and "the last checkpoint (step 1) is kept" in result.message
    assert ckpt.human_bytes(size) in result.message and "0.00" not in result.message
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step_0000001"]
    assert ckpt.load_latest(tmp_path)["step"] == 1
    monkeypatch.setattr(ckpt, "free_disk_bytes", lambda path: size)  # exactly enough: it saves
    assert ckpt.save_checkpoint(tmp_path, 2, _state(2), keep_last=1).saved


def test_human_bytes_never_rounds_small_sizes_to_zero():
    assert ckpt.human_bytes(900) == "900 B"
    assert ckpt.human_bytes(1536) == "1.5 KiB"
    assert ckpt.human_bytes(5 * 2**20) == "5.0 MiB"
    assert ckpt.human_bytes(3 * 2**30) == "3.0 GiB"


@pytest.fixture
def small_disk(tmpfs):
    return tmpfs(512 * 1024)


def _big_state(step: int) -> dict:
    return {"step": step, "w": torch.full((24_000,), float(step))}  # ~94 KiB


def test_real_full_disk_prunes_older_checkpoints_first(small_disk):
    d = small_disk / "checkpoints"
    for step in (1, 2):
        assert ckpt.save_checkpoint(d, step, _big_state(step), keep_last=2).saved
    size = ckpt.path_size(d / "step_0000002")
    small_disk_helpers.fill(small_disk, leave_bytes=size // 2)  # room for half a checkpoint
    result = ckpt.save_checkpoint(d, 3, _big_state(3), keep_last=2)
    # step 1 would be pruned after this save anyway: deleting it first makes the room
    assert result.saved, result.message
    assert [p.name for p in ckpt.list_checkpoints(d)] == ["step_0000002", "step_0000003"]
    assert ckpt.load_latest(d)["step"] == 3


def test_real_full_disk_never_deletes_the_last_good_checkpoint(small_disk):
    d = small_disk / "checkpoints"
    assert ckpt.save_checkpoint(d, 1, _big_state(1), keep_last=1).saved
    size = ckpt.path_size(d / "step_0000001")
    small_disk_helpers.fill(small_disk, leave_bytes=size // 2)
    result = ckpt.save_checkpoint(d, 2, _big_state(2), keep_last=1)
    assert not result.saved
    assert f"needs {ckpt.human_bytes(size)}" in result.message and "step 1) is kept" in result.message
    assert ckpt.load_latest(d)["step"] == 1


def test_real_enospc_while_writing_leaves_no_temporary_files(small_disk, monkeypatch):
    d = small_disk / "checkpoints"
    assert ckpt.save_checkpoint(d, 1, _big_state(1), keep_last=2).saved
    small_disk_helpers.fill(small_disk, leave_bytes=20_000)
    monkeypatch.setattr(ckpt, "needed_bytes", lambda *a: (1, "a wrong estimate"))  # pass the check
    result = ckpt.save_checkpoint(d, 2, _big_state(2), keep_last=2)
    assert not result.saved and "No space left" in result.message
    assert sorted(p.name for p in d.iterdir()) == ["step_0000001"]


def test_damaged_newest_checkpoint_falls_back_to_the_previous(tmp_path):
    for step in (1, 2):
        ckpt.save_checkpoint(tmp_path, step, _state(step), keep_last=2)
    state_file = tmp_path / "step_0000002" / "state.pt"
    state_file.write_bytes(state_file.read_bytes()[:200])  # a real torn file
    loaded = ckpt.load_latest_good(tmp_path)
    assert loaded.state["step"] == 1 and [p.name for p, _ in loaded.damaged] == ["step_0000002"]
    assert "bytes" in loaded.damaged[0][1]


def test_leftovers_of_kills_are_cleaned(tmp_path):
    ckpt.save_checkpoint(tmp_path, 1, _state(1), keep_last=2)
    for name in ("step_0000002", ".tmp-step_0000003", ".trash-step_0000000"):
        (tmp_path / name).mkdir()
    removed = sorted(p.name for p in ckpt.clean_leftovers(tmp_path))
    assert removed == [".tmp-step_0000003", ".trash-step_0000000", "step_0000002"]
    assert [p.name for p in tmp_path.iterdir()] == ["step_0000001"]


def test_write_error_keeps_previous_checkpoint(tmp_path, monkeypatch):
    ckpt.save_checkpoint(tmp_path, 1, _state(1), keep_last=1)

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ckpt.torch, "save", fail)
    result = ckpt.save_checkpoint(tmp_path, 2, _state(2), keep_last=1)
    assert not result.saved and "No space left" in result.message
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step_0000001"]
    assert not any(p.name.startswith(".tmp") for p in tmp_path.iterdir())


def test_tensor_bytes_counts_nested():
    assert ckpt.tensor_bytes({"a": torch.zeros(10), "b": [torch.zeros(2, dtype=torch.float64)]}) == 40 + 16
