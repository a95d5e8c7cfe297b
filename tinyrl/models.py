"""Actor, critic and reference on one device: the roles the run's algorithm needs, no others.

LoRA (default): ONE frozen base in memory; adapter "actor" on it, adapter "critic" and a scalar
value head when the estimator reads values (GAE; tinyrl.roles), and the reference is the same
base with adapters disabled — no second copy.
Full: the actor is the whole model, the critic (GAE only) a separate model + value head, the
reference a frozen copy loaded only when a KL term reads it (only sensible for small models).
A critic-free run (GRPO, RLOO, ...) has no critic adapter, value head, copy or parameters.

What it knows: how to get hidden states, token log-probs (chunked over the sequence, never a full
fp32 [B, T, V] logits tensor) and values for a padded batch; with model.padding_free (default)
the bodies see only the batch's real tokens, packed in one row (a prompt shared by several rows
once: tinyrl.packing), and the LM head only real response tokens; results come back padded,
[B, R]. It knows nothing of RL losses.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

import torch
from torch import nn

from tinyrl.attention import guard_attention_kernels
from tinyrl.config import ModelConfig
from tinyrl.errors import TinyRLError
from tinyrl.packing import host_index_work, pack, prompt_groups, real_places, unpack, use_packed_attention
from tinyrl.rl.logprobs import chunked_token_logprobs
from tinyrl.roles import Role

ALL_ROLES = frozenset(Role)

log = logging.getLogger(__name__)

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    # CPU bf16 matmuls are slow and lossy on most CPUs: fp32 there unless asked explicitly.
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    """pick_dtype's inverse: the model.dtype value that names `dtype` (bf16, fp16, fp32)."""
    return {v: k for k, v in _DTYPES.items()}[dtype]


@dataclass
class Batch:
    """A padded batch: prompt left-padded, response right-padded, concatenated.

    input_ids, attention_mask, position_ids: [B, P + R]; response_mask: [B, R] (1 = real token
    after the prompt); policy_mask: [B, R] (1 = sampled by the policy; 0 = inserted context such
    as a tool's output, and padding). None means every real token is the policy's (a single-turn
    batch, the SFT and memory-simulation batches).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    response_mask: torch.Tensor
    policy_mask: torch.Tensor | None = None

    def __post_init__(self):
        if self.policy_mask is None:  # one representation from here on: always a tensor
            with host_index_work():   # masks hold real values, also in the memory simulation
                self.policy_mask = torch.ones_like(self.response_mask)

    @property
    def response_len(self) -> int:
        return self.response_mask.shape[1]

    @property
    def trained_mask(self) -> torch.Tensor:
        """[B, R] the tokens every RL term reads: real AND sampled by the policy. (Not named
        loss_mask: tinyrl.sft.data.SFTBatch.loss_mask is the SFT assistant-turn mask, which
        this Batch does not hold.) Real values also under the memory simulation's fake
        tensors: the packed passes find their places from it on the host (tinyrl.packing)."""
        with host_index_work():
            return self.response_mask * self.policy_mask

    def rows(self, index: torch.Tensor | slice) -> "Batch":
        return Batch(self.input_ids[index], self.attention_mask[index], self.position_ids[index],
                     self.response_mask[index], self.policy_mask[index])

    def to(self, device: torch.device) -> "Batch":
        return Batch(*(t.to(device) for t in (self.input_ids, self.attention_mask, self.position_ids,
                                               self.response_mask, self.policy_mask)))


def make_batch(prompts: list[list[int]], responses: list[list[int]], pad_id: int,
               policy_masks: list[list[int]] | None = None) -> Batch:
    """Left-pad prompts, right-pad responses (lists of token ids) into one Batch; policy_masks
    (one 0/1 per response token, tinyrl.rollout.base.Episode.policy_mask) default to all ones."""
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
    policy = None if policy_masks is None else torch.tensor(
        [list(m) + [0] * (r_len - len(m)) for m in policy_masks], dtype=torch.float32)
    return Batch(torch.tensor(rows, dtype=torch.long), attention, position_ids,
                 torch.tensor(resp_masks, dtype=torch.float32), policy)


class ValueHead(nn.Module):
    """hidden [B, T, H] -> value [B, T]; kept in fp32 (tiny, and the regression target is fp32).

    Initialised as verl's critic head: verl 0.9.1 loads the critic as
    AutoModelForTokenClassification(num_labels=1) (verl/utils/model.py load_valuehead_model),
    whose new `score` Linear gets transformers' _init_weights, weight ~ N(0, initializer_range),
    bias 0 (transformers 5.19 modeling_layers.py GenericForTokenClassification,
    modeling_utils.py _init_weights). Not zeros: with a zero head AND the critic's LoRA B at zero
    (peft's init) the adapter's gradient is exactly 0 until the head has grown: the critic
    starts as a linear probe of the base's last hidden state (README, "PPO with a critic on this
    demo"). A seeded generator of its own: the global RNG stream (LoRA inits, anything after)
    is the same as without a critic.
    """

    def __init__(self, hidden_size: int, init_std: float = 0.02, seed: int = 0):
        super().__init__()
        self.proj = nn.Linear(hidden_size, 1)
        with torch.no_grad():
            # Drawn on the host, named explicitly: under an ambient default device (the CUDA probe
            # builds its models inside `with torch.device("cuda")`) a host generator with no device
            # given raised "Expected a 'cuda' device type for generator" on the card.
            draw = torch.randn(self.proj.weight.shape, generator=torch.Generator().manual_seed(seed), device="cpu")
            self.proj.weight.copy_(draw * init_std)
            self.proj.bias.zero_()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.proj(hidden.float()).squeeze(-1)


class PolicyModels:
    """The three roles on one device. Methods take a Batch and return response-aligned tensors."""

    def __init__(self, cfg: ModelConfig, model_path: str, device: torch.device, actor_only: bool = False,
                 roles: frozenset[Role] = ALL_ROLES):
        """roles: what an RL run builds (tinyrl.config.roles_of); actor_only (`tinyrl sft`): the
        actor alone, and rows that share no prompt (see _hidden)."""
        from transformers import AutoModelForCausalLM

        from tinyrl._compat import loading_bars_only_on_a_terminal

        loading_bars_only_on_a_terminal()
        dtype = pick_dtype(cfg.dtype, device)
        from tinyrl.model_specs import hub_load_options

        load_kwargs = {"dtype": dtype, **hub_load_options(model_path, weights=True)[0]}
        if cfg.quantize == "nf4":
            load_kwargs["quantization_config"] = _nf4_config(device)

        def load() -> nn.Module:
            try:
                model = AutoModelForCausalLM.from_pretrained(model_path, **load_kwargs)
            except OSError as exc:
                raise TinyRLError(f"could not load model {model_path!r}: {exc}",
                                  hint="check model.name (an HF id, a local directory, or tinyrl/tiny-qwen2)") from exc
            return model if cfg.quantize == "nf4" else model.to(device)

        roles = frozenset({Role.ACTOR}) if actor_only else roles
        full = cfg.finetune != "lora"
        self._setup(cfg, device, dtype, load(), load() if full and Role.CRITIC in roles else None,
                    load() if full and Role.REFERENCE in roles else None, actor_only=actor_only, roles=roles)

    @classmethod
    def from_modules(cls, cfg: ModelConfig, base: nn.Module, device: torch.device,
                     critic_base: nn.Module | None = None, reference: nn.Module | None = None,
                     roles: frozenset[Role] = ALL_ROLES) -> "PolicyModels":
        """The same roles around causal LMs that are already built (the memory simulation builds
        them on fake tensors): LoRA needs only `base`; full fine-tuning a model per role."""
        self = cls.__new__(cls)
        self._setup(cfg, device, next(base.parameters()).dtype, base, critic_base, reference, roles=roles)
        return self

    def _setup(self, cfg: ModelConfig, device: torch.device, dtype: torch.dtype, base: nn.Module,
               critic_base: nn.Module | None, reference: nn.Module | None, actor_only: bool = False,
               roles: frozenset[Role] = ALL_ROLES) -> None:
        guard_attention_kernels(device)  # before any attention runs (tinyrl.attention: why)
        self.cfg = cfg
        self.device = device
        self.dtype = dtype
        self.lora = cfg.finetune == "lora"
        self.actor_only = actor_only
        self.roles = frozenset({Role.ACTOR}) if actor_only else frozenset(roles)
        self.with_critic = Role.CRITIC in self.roles
        self._role = Role.ACTOR
        self.token_counts = [0, 0]  # [tokens the bodies computed, real tokens]: perf/padding_ratio
        if not self.lora:
            for role, model in ((Role.CRITIC, critic_base), (Role.REFERENCE, reference)):
                if (role in self.roles) != (model is not None):
                    raise ValueError(f"full fine-tuning: the {role} role {'needs' if model is None else 'has no use for'} "
                                     "a model of its own")
        if self.lora:
            self.actor = self._with_adapters(base)
            self.critic_backbone = self.actor if self.with_critic else None
            self.reference = None  # the base with adapters off
        else:
            self.actor, self.critic_backbone, self.reference = base, critic_base, reference
            if reference is not None:
                reference.requires_grad_(False).eval()
            if critic_base is not None:
                # The critic reads hidden states only: an untied LM head of its copy gets no
                # gradient, so it is not a critic parameter (and allocates no gradient).
                head = self._causal_lm(critic_base).lm_head.weight
                if head is not self._causal_lm(critic_base).model.get_input_embeddings().weight:
                    head.requires_grad_(False)
        self.value_head = (ValueHead(base.config.hidden_size, getattr(base.config, "initializer_range", None) or 0.02)
                           .to(device) if self.with_critic else None)
        if not self._trains_with_dropout:
            for m in (self.actor, self.critic_backbone, self.reference, self.value_head):
                if m is not None:  # LoRA's reference and critic backbone are the actor's base
                    _without_dropout(m)
        if cfg.padding_free:
            for m in {id(x): x for x in (self.actor, self.critic_backbone, self.reference) if x is not None}.values():
                use_packed_attention(m)
        if cfg.gradient_checkpointing:
            backbones = [m for m in (self.actor, self.critic_backbone) if m is not None]
            for m in {id(m): m for m in backbones}.values():
                m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
                m.config.use_cache = False

    def _with_adapters(self, base: nn.Module) -> nn.Module:
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(r=self.cfg.lora_rank, lora_alpha=self.cfg.lora_alpha, lora_dropout=self._lora_dropout(),
                          target_modules=list(self.cfg.lora_targets), task_type="CAUSAL_LM")
        model = get_peft_model(base, lora, adapter_name=str(Role.ACTOR))
        if self.with_critic:
            model.add_adapter(str(Role.CRITIC), lora)
        model.set_adapter(str(Role.ACTOR))
        return model

    @property
    def _trains_with_dropout(self) -> bool:
        """The one rule: SFT (actor_only) trains with dropout, the model's own and
        model.lora_dropout; RL with none, in any role. RL's old log-probs (and values) come from
        an eval-mode pass, without dropout, and its update's from a train-mode pass (train mode
        because transformers checkpoints gradients only in training mode): with dropout the PPO
        ratio was not 1 at the first micro-step, the clipping biased, the KL inflated and the
        critic's values noisy (peft 0.21 applies lora_dropout's nn.Dropout in train mode only;
        transformers' attention its attention_dropout). TRL disables dropout for the same reason
        (trl.trainer.utils.disable_dropout_in_model: GRPO/RLOO/DPO with disable_dropout, its PPO
        trainer always, on policy, reference and value models); verl's FSDP engine builds its
        LoraConfig without dropout and zeroes its critic's config dropouts."""
        return self.actor_only

    def _lora_dropout(self) -> float:
        """model.lora_dropout for SFT; none in RL (_trains_with_dropout)."""
        return self.cfg.lora_dropout if self._trains_with_dropout else 0.0

    # ----------------------------------------------------------------- parameters

    def actor_parameters(self) -> list[nn.Parameter]:
        if self.lora:
            return [p for n, p in self.actor.named_parameters() if ".actor." in n and "lora_" in n]
        return [p for p in self.actor.parameters()]

    def critic_parameters(self) -> list[nn.Parameter]:
        """[] when the run has no critic."""
        if not self.with_critic:
            return []
        head = list(self.value_head.parameters())
        if self.lora:
            return [p for n, p in self.actor.named_parameters() if ".critic." in n and "lora_" in n] + head
        body = self._causal_lm(self.critic_backbone).model
        return [p for p in body.parameters() if p.requires_grad] + head

    @contextlib.contextmanager
    def role(self, name: Role):
        """Make `name` (Role.ACTOR or Role.CRITIC) the active role for everything inside: forward AND
        backward. With shared-base LoRA this matters twice: peft's set_adapter marks inactive
        adapters requires_grad=False (peft 0.21 tuners_utils.BaseTunerLayer.set_adapter), so
        switching away before backward drops that adapter's gradients; and activation
        checkpointing recomputes the forward during backward with whichever adapter is active
        then. So a role's micro-batch loop runs entirely inside one `with models.role(...)`.
        The actor is restored on exit (the engine and the reference expect it)."""
        _check_role_arg(name, (Role.ACTOR, Role.CRITIC), "role")
        if name == Role.CRITIC and not self.with_critic:
            raise ValueError(f"no critic in this run (roles: {sorted(map(str, self.roles))})")
        previous = self._role
        self._switch(name)
        try:
            yield self
        finally:
            self._switch(previous)

    def _switch(self, name: Role) -> None:
        if self.lora and self.actor.active_adapter != name:
            self.actor.set_adapter(str(name))
        self._role = name

    def _require_role(self, name: Role) -> None:
        if self._role != name:
            raise RuntimeError(f"{name} pass while the {self._role} role is active: wrap it in "
                               f"`with models.role(Role.{name.name})` (forward and backward)")

    # ----------------------------------------------------------------- forward passes

    def _causal_lm(self, model: nn.Module) -> nn.Module:
        return model.get_base_model() if self.lora and hasattr(model, "get_base_model") else model

    def _hidden(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        # The transformer body only: logits are computed in chunks from these hidden states.
        body = self._causal_lm(model).model
        if not self.cfg.padding_free:
            self.token_counts[0] += batch.input_ids.numel()
            # a tensor, read only by the trainer's metrics: no sync here, and fake tensors (the
            # memory simulation) have no value to read
            self.token_counts[1] = self.token_counts[1] + batch.attention_mask.sum()  # not +=: in place on a tensor
            out = body(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                       position_ids=batch.position_ids, use_cache=False)
            return out.last_hidden_state  # [B, P + R, H]
        # Padding-free (tinyrl.packing): the real tokens in one row (a prompt shared by several
        # rows once), attention per sequence.
        # SFT (actor_only) shares no prompts: its rows repeat a prompt only by chance (the demo's
        # 1,024 rows hold 943 prompts), and its end point is sensitive to float summation order
        # (README: the demo's SFT), so it keeps the one-part layout, bit for bit as before.
        ids, pos, layout, real = pack(batch.input_ids, batch.attention_mask, batch.position_ids,
                                      batch.input_ids.shape[1] - batch.response_len, share_prompts=not self.actor_only)
        self.token_counts[0] += ids.numel()
        self.token_counts[1] += real
        # A dict attention mask is used as is (Qwen2Model.forward: "It may already have been
        # prepared"): no [N, N] mask is built; the layout goes to every attention call.
        masks = {t: None for t in set(self._causal_lm(model).config.layer_types or ["full_attention"])}
        out = body(input_ids=ids, attention_mask=masks, position_ids=pos, use_cache=False, tinyrl_layout=layout)
        return unpack(out.last_hidden_state, layout)  # [B, P + R, H], zeros at padding

    def token_logprobs(self, role: Role, batch: Batch, temperature: float = 1.0,
                       with_entropy: bool = False):
        """Log-prob of each response token under `role` (Role.ACTOR or Role.REFERENCE): [B, R]
        (and entropy [B, R] when asked)."""
        _check_role_arg(role, (Role.ACTOR, Role.REFERENCE), "log-probs of role")
        if role == Role.REFERENCE:
            if not self.lora and self.reference is None:
                raise ValueError("no reference copy in this run: it is loaded only when a KL term reads it")
            model, ctx = (self.actor, self.actor.disable_adapter()) if self.lora else (self.reference, contextlib.nullcontext())
        else:
            self._require_role(Role.ACTOR)
            model, ctx = self.actor, contextlib.nullcontext()
        with ctx:
            hidden = self._hidden(model, batch)
            R = batch.response_len
            # The token at position t is predicted from the hidden state at t - 1.
            h = hidden[:, -R - 1:-1, :]                      # [B, R, H]
            labels = batch.input_ids[:, -R:]                  # [B, R]
            lm_head = self._causal_lm(model).lm_head.weight   # [V, H]
            if not self.cfg.padding_free:
                return chunked_token_logprobs(h, lm_head, labels, chunk_size=self.cfg.logprob_chunk,
                                              temperature=temperature, with_entropy=with_entropy)
            # The LM head on the policy's tokens only (with Qwen's 151,936-word vocabulary it
            # is the costliest matmul of the pass); 0 at padding and at inserted tokens, which
            # no loss reads (the padded path computes them and the mask drops them).
            # (gathers by index found on the host: the memory simulation traces this on fake tensors)
            B, T, H = hidden.shape
            real = real_places(batch.trained_mask)            # [n] into B * R
            at = real_places(batch.trained_mask, T, T - R - 1)  # [n] into B * T: the states before them
            out = chunked_token_logprobs(hidden.reshape(-1, H).index_select(0, at)[None], lm_head,
                                         batch.input_ids.reshape(-1).index_select(0, at + 1)[None],
                                         chunk_size=self.cfg.logprob_chunk, temperature=temperature,
                                         with_entropy=with_entropy)
            return tuple(_scatter(t[0], real, (B, R)) for t in out) if with_entropy else _scatter(out[0], real, (B, R))

    def values(self, batch: Batch) -> torch.Tensor:
        """V(s) before each response token: [B, R] (verl: values[:, -R-1:-1]).
        Call it inside `with models.role(Role.CRITIC)`, together with its backward."""
        self._require_role(Role.CRITIC)
        hidden = self._hidden(self.critic_backbone, batch)
        R = batch.response_len
        return self.value_head(hidden[:, -R - 1:-1, :])

    def row_tokens(self, batch: Batch) -> list[int] | None:
        """Tokens each row costs in a pass when padding-free (its real ones); None when padded
        (every row costs the batch width)."""
        return batch.attention_mask.sum(-1).tolist() if self.cfg.padding_free else None

    @property
    def shares_prompts(self) -> bool:
        """Whether a pass computes a prompt shared by several rows once (padding-free RL; SFT's
        passes keep one part, see _hidden)."""
        return self.cfg.padding_free and not self.actor_only

    def row_groups(self, batch: Batch) -> list[int] | None:
        """Each row's shared prompt when passes share prompts (tinyrl.packing), so that
        micro-batches are cut between prompts (microbatch.micro_slices); None otherwise."""
        if not self.shares_prompts:
            return None
        return prompt_groups(batch.input_ids, batch.attention_mask, batch.input_ids.shape[1] - batch.response_len)

    def train(self, mode: bool = True) -> None:
        for m in (self.actor, self.critic_backbone, self.value_head):
            if m is not None:
                m.train(mode)

    def base_weight_storages(self) -> set[int]:
        """Data pointers of every base (non-adapter) weight: the test that LoRA keeps one copy."""
        models = [m for m in (self.actor, self.critic_backbone, self.reference) if m is not None]
        return {p.data_ptr() for m in models for n, p in m.named_parameters() if "lora_" not in n}

    # ----------------------------------------------------------------- state

    def trainable_state(self) -> dict[str, dict[str, torch.Tensor]]:
        """Only what training changes: the actor's adapter (or full weights), and the critic's
        adapter (or weights) + value head when the run has a critic."""
        trained = self._trained_roles()
        if self.lora:
            from peft import get_peft_model_state_dict

            state = {str(r): get_peft_model_state_dict(self.actor, adapter_name=str(r)) for r in trained}
        else:
            state = {str(r): m.state_dict() for r, m in zip(trained, (self.actor, self.critic_backbone))}
        if self.with_critic:
            state["value_head"] = self.value_head.state_dict()
        return state

    def load_trainable_state(self, state: dict[str, dict[str, torch.Tensor]]) -> list[str]:
        """Loads what this run trains; -> the names of the checkpoint's parts it has no use for
        (a critic-free run resuming a checkpoint that an older tinyrl wrote with a critic)."""
        trained = self._trained_roles()
        parts = {str(r) for r in trained} | ({"value_head"} if self.with_critic else set())
        if not parts <= set(state):  # resume_check refuses a change of estimator before this
            raise KeyError(f"the checkpoint lacks {sorted(parts - set(state))}")
        if self.lora:
            from peft import set_peft_model_state_dict

            for role in trained:
                set_peft_model_state_dict(self.actor, state[str(role)], adapter_name=str(role))
            self.actor.set_adapter(str(self._role))
        else:
            for role, model in zip(trained, (self.actor, self.critic_backbone)):
                model.load_state_dict(state[str(role)])
        if self.with_critic:
            self.value_head.load_state_dict(state["value_head"])
        return sorted(set(state) - parts)

    def _trained_roles(self) -> list[Role]:
        return [Role.ACTOR] + ([Role.CRITIC] if self.with_critic else [])


def _check_role_arg(name, allowed: tuple[Role, ...], what: str) -> None:
    """One name per role: a Role member of `allowed`, never its string (a str equals its Role)."""
    if not isinstance(name, Role) or name not in allowed:
        raise ValueError(f"{what} {name!r}: pass {' or '.join(f'Role.{r.name}' for r in allowed)} (tinyrl.roles)")


def _without_dropout(model: nn.Module) -> None:
    """Dropout off in `model` whatever its mode (PolicyModels._trains_with_dropout: why), of both
    kinds, as setting eval mode would (train mode is kept for gradient checkpointing):
    - nn.Dropout modules (GPT-2's attn/resid/embd dropout; LoRA's, the value head's if they had
      one): p = 0, as TRL's disable_dropout_in_model does;
    - float probabilities that modules keep as plain attributes and apply only in training mode,
      which TRL's pass leaves on because they are no modules: `attention_dropout` in Qwen2's,
      Llama's, Mistral's attention (`dropout=0.0 if not self.training else
      self.attention_dropout`), `dropout` in OPT's, `residual_dropout`/`embedding_dropout` in
      Starcoder2's. Every float attribute named *dropout* is zeroed: an attribute of that name
      that IS an nn.Dropout (Bloom's, Falcon's attention_dropout) is the first kind, and is
      not replaced by a float; a flag (ESM's token_dropout: a bool) is no float.
    Not covered: a model that reads a probability from its config in forward (Falcon's
    dropout_add, GPT-Neo's flash path): the config is left as it is, so that a saved or exported
    model keeps the dropout it came with."""
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
        for name, value in list(vars(m).items()):
            if "dropout" in name and type(value) is float:
                setattr(m, name, 0.0)


def _scatter(values: torch.Tensor, places: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """values [n] at the flat `places` [n] of a [B, R] tensor; 0 elsewhere (differentiable)."""
    return values.new_zeros(shape[0] * shape[1]).index_copy(0, places, values).view(shape)


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
