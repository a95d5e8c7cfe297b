"""Actor, critic and reference on one device.

LoRA (default): ONE frozen base in memory; adapters "actor" and "critic" on it, a scalar value
head for the critic, and the reference is the same base with adapters disabled — no second copy.
Full: the actor is the whole model, the critic a separate model + value head, the reference a
frozen copy (only sensible for small models).

What it knows: how to get hidden states, token log-probs (chunked over the sequence, never a full
fp32 [B, T, V] logits tensor) and values for a padded batch. It knows nothing of RL losses.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

import torch
from torch import nn

from tinyrl.config import ModelConfig
from tinyrl.errors import TinyRLError
from tinyrl.rl.logprobs import chunked_token_logprobs

log = logging.getLogger(__name__)

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    # CPU bf16 matmuls are slow and lossy on most CPUs: fp32 there unless asked explicitly.
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[name]


@dataclass
class Batch:
    """A padded batch: prompt left-padded, response right-padded, concatenated.

    input_ids, attention_mask, position_ids: [B, P + R]; response_mask: [B, R] (1 = real token).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    response_mask: torch.Tensor

    @property
    def response_len(self) -> int:
        return self.response_mask.shape[1]

    def rows(self, index: torch.Tensor | slice) -> "Batch":
        return Batch(self.input_ids[index], self.attention_mask[index], self.position_ids[index],
                     self.response_mask[index])

    def to(self, device: torch.device) -> "Batch":
        return Batch(*(t.to(device) for t in (self.input_ids, self.attention_mask, self.position_ids,
                                               self.response_mask)))


def make_batch(prompts: list[list[int]], responses: list[list[int]], pad_id: int) -> Batch:
    """Left-pad prompts, right-pad responses (lists of token ids) into one Batch."""
    p_len = max(len(p) for p in prompts)
    r_len = max(1, max(len(r) for r in responses))
    rows, masks, resp_masks = [], [], []
    for p, r in zip(prompts, responses):
        rows.append([pad_id] * (p_len - len(p)) + list(p) + list(r) + [pad_id] * (r_len - len(r)))
        masks.append([0] * (p_len - len(p)) + [1] * (len(p) + len(r)) + [0] * (r_len - len(r)))
        resp_masks.append([1] * len(r) + [0] * (r_len - len(r)))
    attention = torch.tensor(masks, dtype=torch.long)
    # Positions count real tokens only, so left padding does not shift RoPE positions.
    position_ids = (attention.cumsum(-1) - 1).clamp(min=0)
    return Batch(torch.tensor(rows, dtype=torch.long), attention, position_ids,
                 torch.tensor(resp_masks, dtype=torch.float32))


class ValueHead(nn.Module):
    """hidden [B, T, H] -> value [B, T]; kept in fp32 (tiny, and the regression target is fp32)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.proj = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.proj(hidden.float()).squeeze(-1)


class PolicyModels:
    """The three roles on one device. Methods take a Batch and return response-aligned tensors."""

    def __init__(self, cfg: ModelConfig, model_path: str, device: torch.device):
        from transformers import AutoModelForCausalLM

        self.cfg = cfg
        self.device = device
        self.dtype = pick_dtype(cfg.dtype, device)
        load_kwargs = {"dtype": self.dtype}
        if cfg.quantize == "nf4":
            load_kwargs["quantization_config"] = _nf4_config(device)
        try:
            base = AutoModelForCausalLM.from_pretrained(model_path, **load_kwargs)
        except OSError as exc:
            raise TinyRLError(f"could not load model {model_path!r}: {exc}",
                              hint="check model.name (an HF id, a local directory, or tinyrl/tiny-qwen2)") from exc
        if cfg.quantize != "nf4":
            base.to(device)
        critic = reference = None
        if cfg.finetune != "lora":
            critic = AutoModelForCausalLM.from_pretrained(model_path, **load_kwargs).to(device)
            reference = AutoModelForCausalLM.from_pretrained(model_path, **load_kwargs).to(device)
        self._setup(base, critic, reference)

    @classmethod
    def from_modules(cls, cfg: ModelConfig, base: nn.Module, device: torch.device,
                     critic: nn.Module | None = None, reference: nn.Module | None = None) -> "PolicyModels":
        """Wrap causal LMs that are already built (nothing loaded from disk): the memory
        simulation builds them on the meta device and traces THIS class's forward passes.
        LoRA: `base` only; full: `critic` and `reference` too (separate copies)."""
        self = cls.__new__(cls)
        self.cfg, self.device = cfg, torch.device(device)
        self.dtype = next(base.parameters()).dtype
        self._setup(base, critic, reference)
        return self

    def _setup(self, base: nn.Module, critic: nn.Module | None, reference: nn.Module | None) -> None:
        cfg, device = self.cfg, self.device
        self._held: str | None = None  # the role held by role(), if any
        hidden = base.config.hidden_size
        self.lora = cfg.finetune == "lora"
        if self.lora:
            self.actor = self._with_adapters(base)
            self.critic_backbone = self.actor
            self.reference = None
        else:
            self.actor = base
            self.critic_backbone = critic
            self.reference = reference
            self.reference.requires_grad_(False).eval()
        self.value_head = ValueHead(hidden).to(device)
        if cfg.gradient_checkpointing:
            for m in {id(self.actor): self.actor, id(self.critic_backbone): self.critic_backbone}.values():
                m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
                m.config.use_cache = False

    def _with_adapters(self, base: nn.Module) -> nn.Module:
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(r=self.cfg.lora_rank, lora_alpha=self.cfg.lora_alpha, lora_dropout=self.cfg.lora_dropout,
                          target_modules=list(self.cfg.lora_targets), task_type="CAUSAL_LM")
        model = get_peft_model(base, lora, adapter_name="actor")
        model.add_adapter("critic", lora)
        model.set_adapter("actor")
        return model

    # ----------------------------------------------------------------- parameters

    def actor_parameters(self) -> list[nn.Parameter]:
        if self.lora:
            return [p for n, p in self.actor.named_parameters() if ".actor." in n and "lora_" in n]
        return [p for p in self.actor.parameters()]

    def critic_parameters(self) -> list[nn.Parameter]:
        head = list(self.value_head.parameters())
        if self.lora:
            return [p for n, p in self.actor.named_parameters() if ".critic." in n and "lora_" in n] + head
        return list(self.critic_backbone.parameters()) + head

    def use(self, role: str) -> None:
        """Switch the shared base to a role's adapter (LoRA) before a forward pass."""
        if self.lora and role in ("actor", "critic"):
            self.actor.set_adapter(role)

    @contextlib.contextmanager
    def role(self, name: str):
        """Hold `name`'s adapter active for a forward AND its backward (LoRA): peft's
        set_adapter marks the inactive adapter requires_grad=False, so autograd drops its
        gradients, and checkpointed layers recompute with whichever adapter is active during
        backward. Restores the actor's adapter on exit."""
        prev, self._held = self._held, name
        self.use(name)
        try:
            yield self
        finally:
            self._held = prev
            self.use(prev or "actor")

    # ----------------------------------------------------------------- forward passes

    def _causal_lm(self, model: nn.Module) -> nn.Module:
        return model.get_base_model() if self.lora and hasattr(model, "get_base_model") else model

    def _hidden(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        # The transformer body only: logits are computed in chunks from these hidden states.
        body = self._causal_lm(model).model
        out = body(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                   position_ids=batch.position_ids, use_cache=False)
        return out.last_hidden_state  # [B, P + R, H]

    def token_logprobs(self, role: str, batch: Batch, temperature: float = 1.0,
                       with_entropy: bool = False):
        """Log-prob of each response token under `role` ('actor' or 'reference'): [B, R]
        (and entropy [B, R] when asked)."""
        if role == "reference":
            model, ctx = (self.actor, self.actor.disable_adapter()) if self.lora else (self.reference, contextlib.nullcontext())
        else:
            if self._held is None:
                self.use("actor")
            model, ctx = self.actor, contextlib.nullcontext()
        with ctx:
            hidden = self._hidden(model, batch)
            R = batch.response_len
            # The token at position t is predicted from the hidden state at t - 1.
            h = hidden[:, -R - 1:-1, :]                      # [B, R, H]
            labels = batch.input_ids[:, -R:]                  # [B, R]
            lm_head = self._causal_lm(model).lm_head.weight   # [V, H]
            return chunked_token_logprobs(h, lm_head, labels, chunk_size=self.cfg.logprob_chunk,
                                          temperature=temperature, with_entropy=with_entropy)

    def values(self, batch: Batch) -> torch.Tensor:
        """V(s) before each response token: [B, R] (verl: values[:, -R-1:-1])."""
        held = self._held is not None  # inside role("critic"): the caller switches adapters
        if not held:
            self.use("critic")
        hidden = self._hidden(self.critic_backbone, batch)
        R = batch.response_len
        values = self.value_head(hidden[:, -R - 1:-1, :])
        if not held:
            self.use("actor")
        return values

    def train(self, mode: bool = True) -> None:
        for m in (self.actor, self.critic_backbone, self.value_head):
            m.train(mode)

    def base_weight_storages(self) -> set[int]:
        """Data pointers of every base (non-adapter) weight: the test that LoRA keeps one copy."""
        models = [self.actor, self.critic_backbone] + ([self.reference] if self.reference is not None else [])
        return {p.data_ptr() for m in models for n, p in m.named_parameters() if "lora_" not in n}

    # ----------------------------------------------------------------- state

    def trainable_state(self) -> dict[str, dict[str, torch.Tensor]]:
        """Only what training changes: adapters (or full weights) + value head."""
        if self.lora:
            from peft import get_peft_model_state_dict

            state = {"actor": get_peft_model_state_dict(self.actor, adapter_name="actor"),
                     "critic": get_peft_model_state_dict(self.actor, adapter_name="critic")}
        else:
            state = {"actor": self.actor.state_dict(), "critic": self.critic_backbone.state_dict()}
        state["value_head"] = self.value_head.state_dict()
        return state

    def load_trainable_state(self, state: dict[str, dict[str, torch.Tensor]]) -> None:
        if self.lora:
            from peft import set_peft_model_state_dict

            for name in ("actor", "critic"):
                set_peft_model_state_dict(self.actor, state[name], adapter_name=name)
            self.actor.set_adapter("actor")
        else:
            self.actor.load_state_dict(state["actor"])
            self.critic_backbone.load_state_dict(state["critic"])
        self.value_head.load_state_dict(state["value_head"])


def _nf4_config(device: torch.device):
    if device.type != "cuda":
        raise TinyRLError("model.quantize = nf4 needs a CUDA GPU (bitsandbytes 4-bit kernels)",
                          hint="set model.quantize=none on this machine")
    try:
        from transformers import BitsAndBytesConfig
        import bitsandbytes  # noqa: F401
    except ImportError as exc:
        raise TinyRLError("model.quantize = nf4 needs bitsandbytes", hint="pip install -e '.[cuda]'") from exc
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                              bnb_4bit_compute_dtype=torch.bfloat16, bnb_4bit_use_double_quant=True)
