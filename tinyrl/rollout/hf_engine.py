"""Rollouts with a transformers model: works everywhere, the CPU default.

The engine holds the trainer's own actor model object (a peft model with the "actor" adapter
active, or a plain model), so syncing weights, sleeping and waking are no-ops. Each sampled
token comes with its log-prob under the distribution it was drawn from: logits / temperature,
then top_p truncation when top_p < 1 (the same as vLLM's "processed_logprobs"); greedy
decoding reports log_softmax of the raw logits. Sampling is tinyrl's own loop
(tinyrl.rollout.decode: generate's distribution and RNG draws, less its per-step overhead);
log-probs are gathered step by step, so no [steps, batch, vocab] score tensor is ever kept
(Qwen's vocabulary makes that tens of GB for an ordinary rollout batch).

Speed (issue 20.5, benchmarks/hf_engine_speed.py): decoding a small batch is bound by per-op
launch and Python overhead, so the actor adapter is merged into the base weights for the
rollout (`merged_adapter`: half the ops per decode step with the 7 default targets, the base
restored bit for bit after). Measured and not taken: a static KV cache alone (more ops per
step, ~0.94x on CPU; on CUDA transformers 5.19 would also auto-compile the forward,
generation/utils.py `_valid_auto_compile_criteria`, which needs a GPU to judge).

What this file does not know: vLLM, the RL loss, how prompts are built.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from tinyrl.memory.formulas import MERGE_FIX_DENOMINATOR
from tinyrl.roles import Role
from tinyrl.rollout.base import Episode, RolloutResult, SamplingSettings
from tinyrl.rollout.decode import can_keep_cache, sample_tokens
from tinyrl.rollout.kept_cache import KeptCacheSession


class HFEngine:
    name = "hf"
    sleep_supported = False
    # Episodes with tools (rollout/turns.py): `episode_session()` keeps each episode's KV cache
    # across turns (decode.sample_tokens_kept), so a turn after the first prefills only the
    # tokens added since (the stop token and the tool turn); without it (a model whose attention
    # the kept cache does not support, or keep_context_cache=False) each turn re-prefills.
    multi_turn = True

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer,
        device: str | torch.device = "cpu",
        *,
        max_batch_sequences: int = 256,
        adapter_name: str = str(Role.ACTOR),
        merge_adapter: bool = True,
        keep_context_cache: bool = True,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.max_batch_sequences = max_batch_sequences  # sequences per generate() call
        self.adapter_name = adapter_name
        self.merge_adapter = merge_adapter  # off: sample through peft's LoRA layers (the slow path)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.stop_ids = _stop_ids(model, tokenizer)
        self.keep_context_cache = keep_context_cache  # off: every later turn re-prefills (the reference path)

    @property
    def keeps_context_cache(self) -> bool:
        """Whether episode_session() keeps the KV cache across turns for this model."""
        return self.keep_context_cache and can_keep_cache(self.model)

    def episode_session(self) -> KeptCacheSession | None:
        """What the turn loop generates through (KeptCacheSession); None: re-prefill each turn."""
        return KeptCacheSession(self) if self.keeps_context_cache else None

    # -- the interface ------------------------------------------------------------------

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingSettings) -> RolloutResult:
        """`sampling.n` single-turn episodes per prompt, grouped by prompt; greedy means n = 1."""
        self._check_adapter()
        n = 1 if sampling.greedy else sampling.n
        per_call = max(1, self.max_batch_sequences // n)
        result = RolloutResult()
        with self._sampling_mode(sampling.seed):
            for start in range(0, len(prompt_ids), per_call):
                chunk = prompt_ids[start : start + per_call]
                result.episodes.extend(self._generate_chunk(chunk, start, n, sampling))
        return result

    def sync_weights(self, model: torch.nn.Module) -> None:
        # The engine samples from the trainer's model object itself: nothing to copy.
        self.model = model

    def sleep(self) -> None:
        pass

    def wake(self, model: torch.nn.Module | None = None) -> None:
        if model is not None:
            self.sync_weights(model)

    def close(self) -> None:
        self.model = None

    # -- internals -------------------------------------------------------------------------

    def _generate_chunk(
        self, prompts: list[list[int]], offset: int, n: int, sampling: SamplingSettings
    ) -> list[Episode]:
        ids, mask = self._left_padded(prompts)
        tokens, logprobs = sample_tokens(self.model, ids, mask, n=n, max_new_tokens=sampling.max_new_tokens,
                                         stop_ids=self.stop_ids, pad_id=self.pad_id, warpers=self._warpers(sampling),
                                         greedy=sampling.greedy,
                                         generators=self._generators(sampling, offset, len(prompts), n))
        return self._episodes(prompts, offset, n, tokens, logprobs)

    def _generators(self, sampling: SamplingSettings, offset: int, count: int, n: int) -> list | None:
        """A generator per row seeded from sampling.seeds_per_prompt (None when not given)."""
        if sampling.seeds_per_prompt is None or sampling.greedy:
            return None
        if n != 1:
            raise ValueError("seeds_per_prompt needs n = 1")
        return [torch.Generator(self.device).manual_seed(s) for s in sampling.seeds_per_prompt[offset:offset + count]]

    def _left_padded(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """-> ids, mask [P, W] on the engine's device, each prompt left-padded to the longest."""
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[self.pad_id] * (width - len(p)) + p for p in prompts])   # [P, W]
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])  # [P, W]
        return ids.to(self.device), mask.to(self.device)

    def _episodes(self, prompts: list[list[int]], offset: int, n: int, tokens: torch.Tensor,
                  logprobs: torch.Tensor) -> list[Episode]:
        """tokens, logprobs [P*n, steps] -> one episode per row, cut after its stop token."""
        generated, logprobs = tokens.cpu(), logprobs.cpu()  # [P*n, steps]
        episodes = []
        stops = set(self.stop_ids)
        for row in range(generated.shape[0]):
            tokens = generated[row].tolist()
            end = next((i for i, t in enumerate(tokens) if t in stops), None)
            finished = end is not None
            length = end + 1 if finished else len(tokens)
            prompt_index = offset + row // n
            episodes.append(Episode.single_turn(prompt_index, prompts[row // n], tokens[:length],
                                                logprobs[row, :length].tolist(), finished))
        return episodes

    @contextlib.contextmanager
    def _sampling_mode(self, seed: int | None) -> Iterator[None]:
        """What every sampling call runs in (generate, KeptCacheSession): generation mode, the
        actor adapter merged into the base (merge_adapter), the seeded RNG."""
        merged = merged_adapter(self.model, self.adapter_name) if self.merge_adapter else contextlib.nullcontext()
        with self._generation_mode(), merged, self._seeded(seed):
            yield

    @staticmethod
    def _warpers(sampling: SamplingSettings) -> list:
        """Temperature, then top_p: transformers' warpers, so the semantics are generate's; the
        recorded log-probs are those of the distribution actually sampled from."""
        from transformers import TemperatureLogitsWarper, TopPLogitsWarper

        warpers: list = []
        if not sampling.greedy:
            if sampling.temperature != 1.0:
                warpers.append(TemperatureLogitsWarper(sampling.temperature))
            if sampling.top_p < 1.0:
                warpers.append(TopPLogitsWarper(sampling.top_p))
        return warpers

    @contextlib.contextmanager
    def _generation_mode(self) -> Iterator[None]:
        """Eval mode (no dropout, and checkpointing layers keep the KV cache) and no autograd;
        restores the mode. The model's own generation_config (e.g. Qwen's top_k=20,
        repetition_penalty=1.05) is never read: the decode loop applies only our warpers."""
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                yield
        finally:
            self.model.train(was_training)

    @contextlib.contextmanager
    def _seeded(self, seed: int | None) -> Iterator[None]:
        """With a seed, sample from a forked RNG so the same seed gives the same rollouts
        (a resumed run) and the trainer's own RNG stream is left as it was."""
        if seed is None:
            yield
            return
        devices = []
        if self.device.type == "cuda":
            devices = [self.device.index if self.device.index is not None else torch.cuda.current_device()]
        with torch.random.fork_rng(devices=devices, device_type=self.device.type):
            torch.manual_seed(seed)
            yield

    def _check_adapter(self) -> None:
        peft_config = getattr(self.model, "peft_config", None)
        if peft_config and self.adapter_name in peft_config:
            active = getattr(self.model, "active_adapter", None)
            if active != self.adapter_name:
                raise RuntimeError(
                    f"rollouts must sample from the {self.adapter_name!r} adapter, but "
                    f"{active!r} is active: call model.set_adapter({self.adapter_name!r}) first"
                )


@contextlib.contextmanager
def merged_adapter(model: torch.nn.Module, adapter_name: str) -> Iterator[int]:
    """Fold `adapter_name` into the base weights for the block, then put every base weight
    back bit for bit; yields how many layers were merged (0: nothing to do or not mergeable).

    Why: an unmerged peft LoRA linear runs base + dropout + A + B + scale + add every decode
    step (peft 0.21.2 tuners/lora/layer.py `Linear.forward`), i.e. ~4 extra kernels and 4
    extra module calls per adapted linear; for Qwen2.5-3B with the 7 default targets that is
    252 linears and ~1,000 extra launches per token, and decoding a 32-row batch is launch-
    bound. Merged, each is one plain matmul (peft's own `merged` branch: base_layer only).

    Exact restore, on the weights' own device: peft's unmerge subtracts the delta again
    (`weight.data -= delta`), which in bf16 does not always give the original weight back and
    would drift the frozen base (shared with the critic and the reference) a little every
    rollout. So at merge time each layer computes (W + d) - d with the same d, finds the few
    elements where that is not W bit for bit (a rounding of W + d that crossed into the next
    binade, or a tie), and keeps only those: their flat indices and original values, on the
    weight's device (`_merge_layer`). The unmerge subtracts d (recomputed from the unchanged
    adapter: the same kernels on the same inputs give the same d) and writes those elements
    back. Nothing goes through host memory (the earlier version copied every adapted weight,
    ~5.5 GB for a 3B model, to pageable host memory and back on every rollout), and the
    transients are one layer's d, W + d and (W + d) - d. A layer whose fixes would exceed
    1/MERGE_FIX_DENOMINATOR of its elements is left unmerged (peft's own exact path), so the
    fixes stay within the plan's `hf_merge_fixes` (memory/formulas.py `merge_fix_bytes`).

    While merged the weights are W + B A * scale rounded once to W's dtype, so in bf16 the
    sampler's log-probs differ from the trainer's unmerged forward by bf16 rounding; the
    trainer's probs-diff guard (rollout.max_probs_diff) watches exactly that gap.
    """
    layers = _mergeable_lora_layers(model, adapter_name)
    saved: list[tuple[torch.nn.Module, torch.Tensor, torch.Tensor]] = []  # (layer, indices, originals)
    try:
        with torch.no_grad():
            for layer in layers:
                fixes = _merge_layer(layer, adapter_name)
                if fixes is not None:
                    saved.append((layer, *fixes))
                    layer.merged_adapters.append(adapter_name)  # peft's forward: base layer only
        yield len(saved)
    finally:
        with torch.no_grad():
            for layer, where, original in reversed(saved):
                weight = layer.get_base_layer().weight
                weight.sub_(layer.get_delta_weight(adapter_name).to(weight.dtype))
                weight.view(-1)[where] = original
                layer.merged_adapters.remove(adapter_name)


def _merge_layer(layer: torch.nn.Module, adapter_name: str) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Add the adapter's delta to the base weight in place -> (flat indices [F], original values
    [F]) of the elements that subtracting the delta again would not restore exactly; None (and
    the weight untouched) when more than 1/MERGE_FIX_DENOMINATOR of them would need it."""
    weight = layer.get_base_layer().weight
    delta = layer.get_delta_weight(adapter_name).to(weight.dtype)
    merged = weight + delta
    bits = _BITS[weight.element_size()]  # compare bits: -0.0 == 0.0 and NaN != NaN as floats
    wrong = ((merged - delta).view(bits) != weight.view(bits)).view(-1).nonzero()[:, 0]
    if wrong.numel() * MERGE_FIX_DENOMINATOR > weight.numel():
        return None
    fixes = (wrong, weight.view(-1)[wrong])
    weight.copy_(merged)
    return fixes


_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _mergeable_lora_layers(model: torch.nn.Module, adapter_name: str) -> list[torch.nn.Module]:
    """Plain LoRA linears holding `adapter_name` as the one active adapter, or [] when any
    adapted layer is something else (a quantized base, DoRA or another variant, a LoRA bias,
    already merged, adapters disabled): those keep peft's unmerged path."""
    try:
        from peft.tuners.lora.layer import Linear as LoraLinear, LoraLayer
    except ImportError:
        return []
    layers = [m for m in model.modules() if isinstance(m, LoraLayer) and adapter_name in m.lora_A]
    for m in layers:
        weight = getattr(m.get_base_layer(), "weight", None)
        plain = (type(m) is LoraLinear and adapter_name not in m.lora_variant
                 and not m.lora_bias.get(adapter_name, False) and not m.merged and not m.disable_adapters
                 and list(m.active_adapters) == [adapter_name]
                 and isinstance(weight, torch.Tensor) and weight.dtype.is_floating_point)
        if not plain:
            return []
    return layers


def _stop_ids(model, tokenizer) -> list[int]:
    """EOS of the tokenizer plus any EOS ids the model's generation config lists
    (Qwen instruct models also stop on <|im_end|>). vLLM stops on the same set."""
    ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    config = getattr(model, "generation_config", None)
    extra = getattr(config, "eos_token_id", None) if config is not None else None
    if isinstance(extra, int):
        extra = [extra]
    for i in extra or []:
        if i not in ids:
            ids.append(i)
    return ids
