"""`tinyrl export` writes base + actor adapter merged into a plain Hugging Face model that
transformers loads and generates with, and that scores text exactly like the trained actor."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tinyrl.models import make_batch
from tinyrl.roles import Role
from tinyrl.trainer import Trainer
from test_trainer import tiny_config


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_model_dir):
    """(trainer, run directory) of two tiny steps that move the adapter."""
    tmp = tmp_path_factory.mktemp("export")
    trainer = Trainer(tiny_config(tmp, "actor.lr=1e-2"), tmp / "run")
    trainer.train()
    return trainer, tmp / "run"


def test_export_merges_the_actor(tmp_path, trained):
    trainer, run = trained
    out = tmp_path / "exported"
    done = subprocess.run([sys.executable, "-m", "tinyrl.cli", "export", str(run), "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Loading weights" not in done.stderr  # piped: transformers' bar is not drawn (tinyrl._compat)

    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert not any("lora_" in n for n, _ in model.named_parameters())  # merged: no peft needed
    ids = tok("Using the numbers [1, 2, 3], create an equation", return_tensors="pt").input_ids
    generated = model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=tok.pad_token_id)
    assert generated.shape[1] > ids.shape[1]

    prompt, response = ids[0].tolist(), generated[0, ids.shape[1]:].tolist()
    batch = make_batch([prompt], [response], pad_id=tok.pad_token_id)
    with torch.no_grad():
        actor = trainer.models.token_logprobs(Role.ACTOR, batch)
        reference = trainer.models.token_logprobs(Role.REFERENCE, batch)
        logits = model(batch.input_ids).logits[:, -len(response) - 1:-1]
        exported = torch.log_softmax(logits.float(), -1).gather(-1, batch.input_ids[:, -len(response):, None])[..., 0]
    torch.testing.assert_close(exported, actor, atol=1e-4, rtol=0)
    assert (exported - reference).abs().max() > 1e-3  # the adapter really moved away from the base


def test_dtype_base_writes_a_bf16_base_in_half_the_disk(tmp_path, tiny_model_dir):
    """A 3B export is ~12 GB in fp32; `--dtype base` writes a bf16 base's merge in bf16 (~6 GB),
    the same function within bf16 rounding. The tiny model is fp32, so the run here trains on a
    bf16 copy of it."""
    from tinyrl.errors import TinyRLError
    from tinyrl.export import export_run

    base = tmp_path / "bf16-base"
    AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16).save_pretrained(base)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(base)
    trainer = Trainer(tiny_config(tmp_path, "actor.lr=1e-2", "trainer.max_steps=1", f"model.name={base}"),
                      tmp_path / "run")
    trainer.train()
    exact = export_run(tmp_path / "run", tmp_path / "fp32")
    done = subprocess.run([sys.executable, "-m", "tinyrl.cli", "export", str(tmp_path / "run"), "--out",
                           str(tmp_path / "half"), "--dtype", "base"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "300"})
    assert done.returncode == 0 and "of bfloat16 weights" in done.stdout, done.stderr[-2000:]

    def weights(d):
        return sum(f.stat().st_size for f in d.glob("*.safetensors"))

    assert weights(tmp_path / "half") < 0.55 * weights(exact)
    half = AutoModelForCausalLM.from_pretrained(tmp_path / "half", dtype="auto")
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    exact_model = AutoModelForCausalLM.from_pretrained(exact, dtype="auto")
    assert {p.dtype for p in exact_model.parameters()} == {torch.float32}
    moved = 0.0
    for (name, h), (_, e) in zip(half.state_dict().items(), exact_model.state_dict().items()):
        torch.testing.assert_close(h.float(), e, atol=0, rtol=2**-8, msg=name)  # one rounding to bf16
        moved = max(moved, (e - e.to(torch.bfloat16).float()).abs().max().item())
    assert moved > 0  # the fp32 export holds the adapter's merge, not the bf16 base alone

    with pytest.raises(TinyRLError, match="--dtype bf16 is not one of float32, base; nothing was written"):
        export_run(tmp_path / "run", tmp_path / "bad", dtype="bf16")
    assert not (tmp_path / "bad").exists()


def test_export_of_a_directory_without_a_run_exits_2(tmp_path):
    done = subprocess.run([sys.executable, "-m", "tinyrl.cli", "export", str(tmp_path), "--out", str(tmp_path / "x")],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "300"})  # hang guard
    assert done.returncode == 2 and "not a run directory" in done.stderr


def test_a_full_disk_is_said_before_writing_and_never_leaves_half_a_model(trained, tmpfs, monkeypatch):
    """A 3B export is 12 GB (fp32): on a full disk `tinyrl export` ended in a safetensors traceback
    and left config.json without weights in --out, which from_pretrained failed on and a rerun
    refused as not empty. Now the room is checked first, and a write that fails anyway (here:
    the check told there is room) leaves nothing behind."""
    from helpers.small_disk import fill

    from tinyrl.errors import TinyRLError
    from tinyrl.export import export_run

    _, run = trained
    disk = tmpfs(4 * 2**20)
    fill(disk, leave_bytes=2**20)  # 1 MiB free; the tiny model's weights take ~2 MiB
    done = subprocess.run([sys.executable, "-m", "tinyrl.cli", "export", str(run), "--out", str(disk / "m")],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "300"})
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    text = " ".join(done.stderr.replace("│", " ").split())
    assert "the merged model needs ~" in text and "are free; nothing was written" in text
    assert "`tinyrl export --dtype base` writes a bf16 base's merge in half the space" in text
    assert list((disk / "m").iterdir()) == []
    monkeypatch.setattr("tinyrl.export.shutil.disk_usage", lambda _: shutil_usage(10 * 2**30))
    for overwrite in (False, True):
        with pytest.raises(TinyRLError, match="No space left on device.*; nothing was written there"):
            export_run(run, disk / "m", overwrite=overwrite)
        assert list((disk / "m").iterdir()) == []


def shutil_usage(free: int):
    import shutil

    return shutil._ntuple_diskusage(free, 0, free)


def test_a_ctrl_c_mid_export_says_so_and_leaves_no_model_in_out(trained, tmp_path):
    """SIGINT once the weights are written and before the tokenizer: the export ended silently
    (Typer's exit 130); now one line, exit 130, and --out holds nothing that looks like a model
    (its files move in together), nor the hidden folder they were written in."""
    from helpers.busy_child import interrupt_when_busy

    _, run = trained
    out = tmp_path / "exported"
    done = interrupt_when_busy("transformers.modeling_utils:PreTrainedModel.save_pretrained", 1,
                               ["export", str(run), "--out", str(out)], tmp_path / "busy")
    assert done.returncode == 130, done.stderr[-3000:]
    assert "Traceback" not in done.stderr  # above the line: transformers' progress bars
    assert done.stderr.splitlines()[-1] == f"stopped by SIGINT (Ctrl-C) while exporting {run}; nothing was written in {out}"
    assert not out.exists() or list(out.iterdir()) == []
