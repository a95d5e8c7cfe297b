"""The tiny model builds offline and deterministically, and loads in transformers."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import subprocess
import sys
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tinyrl.data.templates import countdown_prompt
from tinyrl.tiny_model import TINY_MODEL_NAME, build_tiny_model, resolve_model_path


def _digest(path) -> str:
    h = hashlib.sha256()
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        h.update((path / name).read_bytes())
    return h.hexdigest()


def test_two_builds_are_identical(tmp_path):
    a = build_tiny_model(tmp_path / "a", warmup_steps=3)
    b = build_tiny_model(tmp_path / "b", warmup_steps=3)
    assert _digest(a) == _digest(b)
    # no leftover temporary or old builds (the build's lock file stays, as lock files must)
    assert not [p for p in (tmp_path / "a").iterdir() if p.name.startswith(".") and not p.name.endswith(".lock")]


def test_reuses_a_finished_build_and_force_rebuilds(tmp_path):
    first = build_tiny_model(tmp_path, warmup_steps=0)
    marker = first / "tinyrl_build.json"
    stamp = marker.stat().st_mtime_ns
    assert build_tiny_model(tmp_path, warmup_steps=0) == first
    assert marker.stat().st_mtime_ns == stamp
    assert build_tiny_model(tmp_path, force=True, warmup_steps=0) == first
    assert marker.stat().st_mtime_ns != stamp


def test_a_second_process_waits_for_the_running_build_instead_of_building_again(tmp_path):
    """Two pytest-xdist workers (or two `tinyrl train`s) that start at once share one build.
    Deterministic: this test holds the build lock, sees the child blocked on it in /proc/locks
    (a '->' line: a waiting request), builds, releases; the child must then reuse that build."""
    child_code = ("import logging, sys; logging.basicConfig(level=logging.INFO); "
                  "from tinyrl.tiny_model import build_tiny_model; "
                  "print(build_tiny_model(sys.argv[1], warmup_steps=0))")
    from tinyrl import tiny_model as tm

    first = build_tiny_model(tmp_path / "probe", warmup_steps=0)  # learn the lock's name for this recipe
    lock_name = f".{first.name}.lock"
    assert (tmp_path / "probe" / lock_name).exists()
    root = tmp_path / "shared"
    root.mkdir()
    with open(root / lock_name, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        child = subprocess.Popen([sys.executable, "-c", child_code, str(root)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        inode = os.fstat(held.fileno()).st_ino
        deadline = time.monotonic() + 300  # only catches a child that never waits (torch import: ~3 s)
        while not any("->" in line and f":{inode} " in line for line in open("/proc/locks")):
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < deadline, "the child never waited for the build lock"
            time.sleep(0.05)
        # flock is per open file, so build_tiny_model here would wait for our own lock: build directly
        ours = tm._build_and_rename(root, root / first.name, tm.TinyRecipe(warmup_steps=0), force=False)
        stamp = (ours / "tinyrl_build.json").stat().st_mtime_ns
    out, err = child.communicate(timeout=300)
    assert child.returncode == 0, err
    assert out.strip() == str(ours)
    assert "built tiny model" not in err
    assert (ours / "tinyrl_build.json").stat().st_mtime_ns == stamp


def test_a_build_another_process_finished_meanwhile_is_kept(tmp_path, monkeypatch):
    """Two processes sharing $TINYRL_CACHE (pytest-xdist workers on a clean clone) both build
    where there is no build lock (no fcntl: Windows). The one that finishes second must keep the
    first one's directory, which that process is already loading from, rather than swap it for
    its own identical build (issue 19)."""
    import contextlib

    from tinyrl import tiny_model as tm

    monkeypatch.setattr(tm, "_build_lock", lambda path: contextlib.nullcontext())

    real, theirs = tm._build_into, {}

    def racing(out, recipe):
        monkeypatch.setattr(tm, "_build_into", real)
        theirs["dir"] = build_tiny_model(tmp_path, warmup_steps=0)  # the other process, done first
        theirs["inode"] = theirs["dir"].stat().st_ino
        real(out, recipe)

    monkeypatch.setattr(tm, "_build_into", racing)
    final = build_tiny_model(tmp_path, warmup_steps=0)
    assert final == theirs["dir"] and final.stat().st_ino == theirs["inode"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # ours went away (and no lock)


def test_resolve_model_path_passes_other_names_through():
    assert resolve_model_path("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"
    assert TINY_MODEL_NAME == "tinyrl/tiny-qwen2"


def test_loads_in_transformers_and_runs_forward(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert 200_000 <= sum(p.numel() for p in model.parameters()) <= 1_000_000
    assert model.config.model_type == "qwen2" and model.config.head_dim == 64
    assert tok.eos_token == tok.pad_token == "<|endoftext|>"
    assert 512 <= len(tok) <= 1024
    text = countdown_prompt([19, 36, 55, 7], 98, "qwen-instruct")
    ids = tok(text, return_tensors="pt").input_ids
    assert tok.decode(ids[0]) == text  # byte-level BPE round-trips, special tokens included
    assert tok.convert_tokens_to_ids("<|im_start|>") in ids[0].tolist()
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], model.config.vocab_size)
    assert torch.isfinite(logits).all()
    info = json.loads((tiny_model_dir / "tinyrl_build.json").read_text())
    assert info["warmup_loss_last"] < info["warmup_loss_first"] / 3


def test_warmed_model_answers_in_format_only_sometimes(tiny_model_dir):
    # The RL demo needs room to improve: some samples in the answer format, not all.
    tok = AutoTokenizer.from_pretrained(tiny_model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    prompts = [
        countdown_prompt([3 + i, 17, 40 + i], 60 + i, ("base", "qwen-instruct")[i % 2])
        for i in range(16)
    ]
    batch = tok(prompts, return_tensors="pt", padding=True)
    torch.manual_seed(0)
    with torch.no_grad():
        out = model.generate(
            **batch, do_sample=True, temperature=1.0, top_p=1.0, max_new_tokens=64,
            num_return_sequences=4, pad_token_id=tok.pad_token_id,
        )
    texts = tok.batch_decode(out[:, batch.input_ids.shape[1]:], skip_special_tokens=True)
    rate = sum(bool(re.search(r"<answer>.*?</answer>", t)) for t in texts) / len(texts)
    # Seed 0 gives 0.36; seeds 0-5 gave 0.33-0.41, the same on 1 and 2 OpenMP threads: at least
    # 0.28 (18 of the 64 samples) inside either bound, so another seed or thread count won't cross one.
    assert 0.05 <= rate <= 0.7, rate
