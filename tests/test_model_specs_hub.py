"""A Hugging Face id tinyrl ships no config for (Qwen2.5-Math-1.5B, a fine-tune of a shipped
size, ...) is planned and priced from its own config.json: from the Hugging Face cache, else
downloaded (that file alone). Until 2026-11-26 every such id was refused by probe-memory,
estimate-cost and, on a card, by `train`'s memory plan ("not shipped").

The download runs huggingface_hub's real code against a local stand-in for the Hub
(HF_ENDPOINT, a small HTTP server answering HEAD and GET of resolve/main/config.json as the Hub
does); the real Hub was not reached (this machine has no network)."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tinyrl.errors import TinyRLError
from tinyrl.model_specs import load_spec

REPO = "someone/Qwen2.5-Math-1.5B-half"
SHIPPED = Path(__file__).resolve().parent.parent / "tinyrl" / "model_specs" / "qwen2.5-1.5b.json"


def served_config() -> dict:
    """A shape no shipped spec has (the 1.5B at half depth), so its figures are its own."""
    return {**json.loads(SHIPPED.read_text()), "num_hidden_layers": 14}


class FakeHub:
    """GET/HEAD {endpoint}/REPO/resolve/main/config.json with the headers huggingface_hub reads
    (X-Repo-Commit, ETag, Content-Length); anything else 404 (EntryNotFound)."""

    def __init__(self, body: bytes):
        hub = self
        self.requests: list[str] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def answer(self) -> bool:
                hub.requests.append(f"{self.command} {self.path}")
                found = self.path == f"/{REPO}/resolve/main/config.json"
                self.send_response(200 if found else 404)
                if found:
                    self.send_header("X-Repo-Commit", "c" * 40)
                    self.send_header("ETag", f'"{hashlib.sha256(body).hexdigest()}"')
                else:
                    self.send_header("X-Error-Code", "EntryNotFound")
                self.send_header("Content-Length", str(len(body) if found else 0))
                self.end_headers()
                return found

            def do_HEAD(self):
                self.answer()

            def do_GET(self):
                if self.answer():
                    self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def config_requests(self) -> list[str]:
        return [r for r in self.requests if "config.json" in r]


@pytest.fixture
def hub():
    fake = FakeHub(json.dumps(served_config()).encode())
    yield fake
    fake.server.shutdown()


def price(model: str, cache: Path, endpoint: str | None, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HUB_CACHE=str(cache), COLUMNS="160", **({"HF_ENDPOINT": endpoint} if endpoint else
                                                             {"HF_HUB_OFFLINE": "1"}))
    return subprocess.run([sys.executable, "-m", "tinyrl.cli", "estimate-cost", "--preset", "countdown-4090",
                           "--set", f"model.name={model}", "--prompts-per-epoch", "1024", "--json"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=cwd)


def test_an_unshipped_hub_model_is_priced_from_its_downloaded_config_then_from_the_cache(tmp_path, hub):
    cache = tmp_path / "hf"
    local = tmp_path / "local-model"  # the same config.json as a model directory: the reference
    local.mkdir()
    (local / "config.json").write_text(json.dumps(served_config()))
    want = json.loads(price(str(local), cache, None, tmp_path).stdout)["sec_per_step"]
    shipped = json.loads(price("Qwen/Qwen2.5-1.5B", cache, None, tmp_path).stdout)["sec_per_step"]
    assert want < 0.75 * shipped  # half the layers: the served shape, not a shipped one, is priced

    done = price(REPO, cache, hub.endpoint, tmp_path)  # not cached: downloaded
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["sec_per_step"] == want
    assert hub.config_requests() == [f"HEAD /{REPO}/resolve/main/config.json",
                                      f"GET /{REPO}/resolve/main/config.json"]
    assert [p.name for p in (cache / f"models--{REPO.replace('/', '--')}" / "snapshots").glob("*/*")] \
        == ["config.json"]  # that file alone, in the Hugging Face cache

    for endpoint in (hub.endpoint, None):  # online: no request once cached; offline (HF_HUB_OFFLINE=1) too
        again = price(REPO, cache, endpoint, tmp_path)
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout)["sec_per_step"] == want
    assert len(hub.config_requests()) == 2


def test_an_id_that_cannot_be_found_is_one_screen_naming_why_and_what_to_do(tmp_path, hub):
    done = price("someone/no-such-model", tmp_path / "hf", hub.endpoint, tmp_path)
    text = " ".join(done.stderr.replace("│", " ").split())
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "no model config for 'someone/no-such-model': not shipped with tinyrl, not in the Hugging Face " \
           "cache, and its config.json could not be downloaded (RemoteEntryNotFoundError: 404" in text, text
    assert "hf download someone/no-such-model config.json" in text and "qwen2.5-3b" in text
    offline = price("someone/no-such-model", tmp_path / "hf", None, tmp_path)
    assert offline.returncode == 2 and "(HF_HUB_OFFLINE is set)" in offline.stderr.replace("│", " ")


def test_a_hub_host_that_does_not_resolve_is_said_at_once(tmp_path):
    """No network: huggingface_hub retried the name lookup ~25 s (5 tries, backing off) before
    saying LocalEntryNotFoundError. A real lookup of a name that cannot exist (.invalid, RFC 2606)."""
    done = price("someone/no-such-model", tmp_path / "hf", "https://hub.tinyrl.invalid", tmp_path)
    text = " ".join(done.stderr.replace("│", " ").split())
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "could not be downloaded (hub.tinyrl.invalid cannot be resolved: " in text and "no network?" in text


def test_a_missing_local_path_is_not_looked_up_on_the_hub():
    for path in ("/models/mine", "./mine", "~/mine", "a/b/c"):
        with pytest.raises(TinyRLError, match="not a directory with config.json"):
            load_spec(path)


def test_validation_never_waits_on_the_network(monkeypatch):
    """load_config reads a context length from the spec when it can: cache only (download=False)."""
    import tinyrl.model_specs as specs

    def no_download(name, download, shipped):
        assert not download, "config validation went to the network"
        raise TinyRLError("not cached")

    monkeypatch.setattr(specs, "_hub_spec", no_download)
    from tinyrl.config import load_config

    load_config("countdown-4090", ["model.name=someone/not-cached"])


def test_a_cached_hub_model_loads_at_once_when_the_hub_cannot_be_resolved(tmp_path, tiny_model_dir):
    """No network, a model in the Hugging Face cache: eval (tokenizer, then weights) waited through
    huggingface_hub's retries of every file, ten "Retrying in" warnings, before the cache was read.
    A real `tinyrl eval` of an id cached here (the tiny model in the cache's layout), a Hub name
    that cannot resolve (.invalid), and then an id that is not cached: one line, at once."""
    import pandas as pd

    snapshot = tmp_path / "hf" / "models--someone--tiny" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("a" * 40)
    for f in tiny_model_dir.iterdir():
        (snapshot / f.name).symlink_to(f)
    data = tmp_path / "few.parquet"
    pd.read_parquet(Path(__file__).resolve().parent.parent / "data" / "countdown" / "test.parquet")[:4].to_parquet(data)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HUB_CACHE=str(tmp_path / "hf"), HF_ENDPOINT="https://hub.tinyrl.invalid", COLUMNS="160")

    def evaluate(model: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "tinyrl.cli", "eval", model, "--data", str(data), "--task",
                               "countdown", "--n", "1", "--device", "cpu", "--out", str(tmp_path / "evals" / model.replace("/", "-"))],
                              capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)

    done = evaluate("someone/tiny")
    assert done.returncode == 0, done.stderr
    assert "Retrying" not in done.stderr and "WARNING" not in done.stderr, done.stderr
    assert json.loads((tmp_path / "evals" / "someone-tiny" / "eval.json").read_text())["n"] == 1
    # the trainer's load (tokenizer, then PolicyModels' weights), as `tinyrl train` makes it
    code = ("import torch; from tinyrl.config import load_config; from tinyrl.models import PolicyModels; "
            "from tinyrl.setup import load_tokenizer; cfg = load_config('countdown-tiny', []).model; "
            "load_tokenizer('someone/tiny'); PolicyModels(cfg, 'someone/tiny', torch.device('cpu'), actor_only=True)")
    trainer = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env,
                             cwd=tmp_path)
    assert trainer.returncode == 0 and "Retrying" not in trainer.stderr, trainer.stderr
    # vLLM takes no local_files_only: it is given the cached snapshot's directory instead, when that
    # holds weights (a snapshot with only the config.json a plan fetched is left to vLLM's message)
    (tmp_path / "hf" / "models--someone--config-only" / "snapshots" / ("b" * 40)).mkdir(parents=True)
    (tmp_path / "hf" / "models--someone--config-only" / "refs").mkdir()
    (tmp_path / "hf" / "models--someone--config-only" / "refs" / "main").write_text("b" * 40)
    (tmp_path / "hf" / "models--someone--config-only" / "snapshots" / ("b" * 40) / "config.json").write_text("{}")
    code = ("from tinyrl.model_specs import cached_snapshot; "
            "print([cached_snapshot(m) for m in ('someone/tiny', 'someone/other', 'someone/config-only')])")
    paths = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert paths.returncode == 0, paths.stderr
    assert eval(paths.stdout) == [str(snapshot), "someone/other", "someone/config-only"]
    online = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env={**env, "HF_ENDPOINT": "http://127.0.0.1:9"})  # resolves: vLLM asks the Hub
    assert eval(online.stdout) == ["someone/tiny", "someone/other", "someone/config-only"], online.stderr
    missing = evaluate("someone/other")
    text = " ".join(missing.stderr.replace("│", " ").split())
    assert missing.returncode == 2 and "Retrying" not in missing.stderr, missing.stderr
    assert "not in the Hugging Face cache, and hub.tinyrl.invalid cannot be resolved" in text, text
