"""Model configs: shipped with tinyrl, so memory plans and cost estimates work offline, or any
other Hugging Face id's config.json from the Hugging Face cache or downloaded (that file alone).

The JSON files are the config.json of the Hugging Face checkpoints Qwen/Qwen2.5-{0.5B,1.5B,3B,7B}
(the -Instruct variants share the architecture). Knows: shapes and parameter counts of
Qwen2-style decoders. Does not know: weights, tokenizers, or any other architecture's layout.
"""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path

from tinyrl.errors import TinyRLError

TINY_MODEL_NAME = "tinyrl/tiny-qwen2"


def shipped_names() -> list[str]:
    """Shipped spec names, e.g. "qwen2.5-3b"."""
    files = resources.files(__package__).iterdir()
    return sorted(f.name.removesuffix(".json") for f in files if f.name.endswith(".json"))


def _shipped_key(name: str) -> str:
    """ "Qwen/Qwen2.5-3B-Instruct" -> "qwen2.5-3b" (instruct and base share a config shape)."""
    base = name.strip().rstrip("/").split("/")[-1].lower()
    return re.sub(r"-instruct$", "", base)


def load_spec(name_or_path: str, build: bool = True, download: bool = True) -> dict:
    """The config dict of a model: a local dir with config.json, the tiny model, a shipped HF id,
    or another HF id's config.json from the Hugging Face cache, else downloaded (`download`).

    `build=False` never builds the tiny model (which takes seconds): then its spec is only
    returned if it was built before, else TinyRLError. `download=False` never goes to the network.
    """
    path = Path(name_or_path).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return _read_json(path / "config.json")
    if name_or_path == TINY_MODEL_NAME:
        return _tiny_spec(build)
    key = _shipped_key(name_or_path)
    if key in shipped_names():
        return _read_json(resources.files(__package__) / f"{key}.json")
    shipped = ", ".join(shipped_names()) + f", {TINY_MODEL_NAME}"
    if not _looks_like_hub_id(name_or_path):
        raise TinyRLError(f"no model config for {name_or_path!r}: not a directory with config.json",
                          hint=f"give model.name a model directory (with config.json), a Hugging Face id "
                               f"(org/name), or one of: {shipped}")
    return _hub_spec(name_or_path.strip(), download, shipped)


def _looks_like_hub_id(name: str) -> bool:
    """org/name (huggingface_hub validates the rest): not a path that starts at / . or ~."""
    name = name.strip()
    return name.count("/") == 1 and not name.startswith(("/", ".", "~")) and all(name.split("/"))


# A failed download, said once per process: the plan and the price read a spec many times, and
# without a network each try costs huggingface_hub's ~20 s of retries.
_hub_failures: dict[str, TinyRLError] = {}


def _hub_spec(name: str, download: bool, shipped: str) -> dict:
    """config.json of a Hugging Face id: the cache first (offline, and no request once fetched),
    then a download of that one file (a gated model needs the user's token: `hf auth login`)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError  # not an OSError in huggingface_hub 1.x/2.x

    try:
        return _read_json(Path(hf_hub_download(name, "config.json", local_files_only=True)))
    except (OSError, EntryNotFoundError, ValueError) as cached_miss:
        reason = cached_miss
    if download and name not in _hub_failures:
        why = hub_unreachable()
        if why is None:
            try:
                return _read_json(Path(hf_hub_download(name, "config.json")))
            except (OSError, EntryNotFoundError, ValueError) as exc:
                why = _why(exc)
        _hub_failures[name] = TinyRLError(
            f"no model config for {name!r}: not shipped with tinyrl, not in the Hugging Face cache, "
            f"and its config.json could not be downloaded ({why})",
            hint="check model.name (org/name as on huggingface.co) and the network (a gated model needs "
                 f"`hf auth login`); offline, fetch it where there is a network (`hf download {name} "
                 f"config.json`) or give model.name a local model directory; shipped: {shipped}")
    if name in _hub_failures:
        raise _hub_failures[name]
    raise TinyRLError(f"no model config for {name!r}: not shipped with tinyrl and not in the Hugging Face "
                      f"cache ({type(reason).__name__})",
                      hint=f"run a command that plans or prices it once with a network (`tinyrl estimate-cost "
                           f"--set model.name={name}`), fetch it (`hf download {name} config.json`), or give "
                           f"model.name a local model directory; shipped: {shipped}")


def hub_unreachable() -> str | None:
    """Why the Hub's host cannot be reached at all, or None. A name that does not resolve (no
    network) is certain in milliseconds, where huggingface_hub retries it for ~25 s (5 tries,
    backing off). Behind a proxy the local resolver may not know the host, and HF_HUB_OFFLINE
    has its own message (_why): no check then."""
    import os
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    if constants.is_offline_mode() or any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy",
                                                                      "ALL_PROXY", "all_proxy")):
        return None
    host = urlparse(constants.ENDPOINT).hostname
    if not host:
        return None
    try:
        socket.getaddrinfo(host, 443)
    except OSError as exc:  # socket.gaierror: no such name, or no resolver reachable
        return f"{host} cannot be resolved: {exc.strerror or exc}; no network?"
    return None


def hub_load_options(model_path: str, weights: bool = False) -> tuple[dict, str]:
    """from_pretrained's options for `model_path`, and why they are set ('' when not): a Hub id
    whose host does not resolve (no network) is read from the Hugging Face cache alone
    (`local_files_only`). A cached model then loads at once, and one not cached fails at once;
    without it huggingface_hub retried each file ~25 s, ten warnings, before either. `weights`:
    for AutoModel*, whose look for a PEFT adapter does not get local_files_only (transformers
    5.19 models/auto/auto_factory.py: only `adapter_kwargs` reach find_adapter_config_file)."""
    if Path(model_path).expanduser().exists() or not _looks_like_hub_id(model_path):
        return {}, ""
    why = hub_unreachable()
    if not why:
        return {}, ""
    return {"local_files_only": True, **({"adapter_kwargs": {"local_files_only": True}} if weights else {})}, why


def cached_snapshot(model_path: str) -> str:
    """`model_path`, or its directory in the Hugging Face cache when hub_load_options reads the
    cache alone (no network) and the cached snapshot holds weights: for a loader that takes no
    local_files_only (vLLM), which would otherwise retry the Hub before failing. A snapshot
    without weights (only the config.json a plan fetched) is left to the loader's own message."""
    if not hub_load_options(model_path)[0]:
        return model_path
    from huggingface_hub import snapshot_download

    try:
        snapshot = Path(snapshot_download(model_path, local_files_only=True))
    except (OSError, ValueError):  # LocalEntryNotFoundError is an OSError: not cached
        return model_path
    has_weights = any(snapshot.glob("*.safetensors")) or any(snapshot.glob("*.bin"))
    return str(snapshot) if has_weights else model_path


def _why(exc: Exception) -> str:
    """huggingface_hub's reason, its first sentence (its messages run to several lines)."""
    from huggingface_hub import constants

    if constants.is_offline_mode():
        return "HF_HUB_OFFLINE is set"
    first = " ".join(str(exc).split()).split(". ")[0]
    return f"{type(exc).__name__}: " + (first if len(first) <= 160 else first[:157].rsplit(" ", 1)[0] + " ...")


def _tiny_spec(build: bool) -> dict:
    try:
        from tinyrl import tiny_model
    except ImportError as exc:  # the module lands separately; say so rather than guess a config
        raise TinyRLError(f"{TINY_MODEL_NAME} is not available in this install",
                          hint="update tinyrl, or give a model directory") from exc
    if build:
        model_dir = Path(tiny_model.resolve_model_path(TINY_MODEL_NAME))
    else:
        # Where build_tiny_model() puts the default build (its naming, not a copy of it).
        model_dir = tiny_model.default_cache_root() / tiny_model._build_dir_name(tiny_model.TinyRecipe())
    if not (model_dir / "config.json").is_file():
        raise TinyRLError(f"{TINY_MODEL_NAME} has not been built yet",
                          hint="run any tinyrl command on it once (it builds in seconds)")
    return _read_json(model_dir / "config.json")


def _read_json(path) -> dict:
    try:
        return json.loads(path.read_text())  # a Path, or a Traversable for shipped files
    except (OSError, json.JSONDecodeError) as exc:
        raise TinyRLError(f"cannot read model config {path}: {exc}",
                          hint="check that the file is a valid config.json") from exc


def head_dim(spec: dict) -> int:
    return int(spec.get("head_dim") or spec["hidden_size"] // spec["num_attention_heads"])


def linear_shapes(spec: dict) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each linear layer in one decoder layer."""
    h, i = spec["hidden_size"], spec["intermediate_size"]
    q = spec["num_attention_heads"] * head_dim(spec)
    kv = spec["num_key_value_heads"] * head_dim(spec)
    return {
        "q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
        "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h),
    }


def layer_param_count(spec: dict) -> int:
    """Parameters of one decoder layer: linears, q/k/v biases (Qwen2), two RMSNorms."""
    shapes = linear_shapes(spec)
    weights = sum(a * b for a, b in shapes.values())
    bias = 0
    if spec.get("model_type", "qwen2") == "qwen2" or spec.get("attention_bias"):
        bias = sum(shapes[k][1] for k in ("q_proj", "k_proj", "v_proj"))
    return weights + bias + 2 * spec["hidden_size"]


def embedding_param_count(spec: dict) -> int:
    """Input embedding plus the lm_head when it is not tied to it."""
    emb = spec["vocab_size"] * spec["hidden_size"]
    return emb if spec.get("tie_word_embeddings", False) else 2 * emb


def param_count(spec: dict) -> int:
    """All parameters, tied embeddings counted once (Qwen2.5-0.5B: 494,032,768)."""
    return (spec["num_hidden_layers"] * layer_param_count(spec)
            + embedding_param_count(spec) + spec["hidden_size"])
