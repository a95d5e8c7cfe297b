"""`tinyrl export` writes base + actor adapter merged into a plain Hugging Face model that
transformers loads and generates with, and that scores text exactly like the trained actor."""

from __future__ import annotations

import os
import subprocess
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tinyrl.models import make_batch
from tinyrl.trainer import Trainer
from test_trainer import tiny_config


def test_export_merges_the_actor(tmp_path, tiny_model_dir):
    run = tmp_path / "run"
    trainer = Trainer(tiny_config(tmp_path, "actor.lr=1e-2"), run)
    trainer.train()
    out = tmp_path / "exported"
    done = subprocess.run([sys.executable, "-m", "tinyrl.cli", "export", str(run), "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]

    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert not any("lora_" in n for n, _ in model.named_parameters())  # merged: no peft needed
    ids = tok("Using the numbers [1, 2, 3], create an equation", return_tensors="pt").input_ids
    generated = model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=tok.pad_token_id)
    assert generated.shape[1] > ids.shape[1]

    prompt, response = ids[0].tolist(), generated[0, ids.shape[1]:].tolist()
    batch = make_batch([prompt], [response], pad_id=tok.pad_token_id)
    with torch.no_grad():
        actor = trainer.models.token_logprobs("actor", batch)
        reference = trainer.models.token_logprobs("reference", batch)
        logits = model(batch.input_ids).logits[:, -len(response) - 1:-1]
        exported = torch.log_softmax(logits.float(), -1).gather(-1, batch.input_ids[:, -len(response):, None])[..., 0]
    torch.testing.assert_close(exported, actor, atol=1e-4, rtol=0)
    assert (exported - reference).abs().max() > 1e-3  # the adapter really moved away from the base


def test_export_of_a_directory_without_a_run_exits_2(tmp_path):
    done = subprocess.run([sys.executable, "-m", "tinyrl.cli", "export", str(tmp_path), "--out", str(tmp_path / "x")],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "300"})  # hang guard
    assert done.returncode == 2 and "not a run directory" in done.stderr
