"""The tiny model builds offline and deterministically, and loads in transformers."""

from __future__ import annotations

import hashlib
import json
import re

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
    assert not [p for p in (tmp_path / "a").iterdir() if p.name.startswith(".")]  # no leftovers


def test_reuses_a_finished_build_and_force_rebuilds(tmp_path):
    first = build_tiny_model(tmp_path, warmup_steps=0)
    marker = first / "tinyrl_build.json"
    stamp = marker.stat().st_mtime_ns
    assert build_tiny_model(tmp_path, warmup_steps=0) == first
    assert marker.stat().st_mtime_ns == stamp
    assert build_tiny_model(tmp_path, force=True, warmup_steps=0) == first
    assert marker.stat().st_mtime_ns != stamp


def test_a_build_another_process_finished_meanwhile_is_kept(tmp_path, monkeypatch):
    """Two processes sharing $TINYRL_CACHE (pytest-xdist workers on a clean clone) both build.
    The one that finishes second must keep the first one's directory, which that process is
    already loading from, rather than swap it for its own identical build (issue 19)."""
    from tinyrl import tiny_model as tm

    real, theirs = tm._build_into, {}

    def racing(out, recipe):
        monkeypatch.setattr(tm, "_build_into", real)
        theirs["dir"] = build_tiny_model(tmp_path, warmup_steps=0)  # the other process, done first
        theirs["inode"] = theirs["dir"].stat().st_ino
        real(out, recipe)

    monkeypatch.setattr(tm, "_build_into", racing)
    final = build_tiny_model(tmp_path, warmup_steps=0)
    assert final == theirs["dir"] and final.stat().st_ino == theirs["inode"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # ours went away


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
