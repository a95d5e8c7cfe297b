"""Memory of one training step, traced on fake tensors: no GPU, no weights, seconds per trace.

The step mirrors tinyrl.models / tinyrl.trainer: Qwen2 built from its config in bf16 (via
torch.set_default_dtype), the roles the algorithm has (tinyrl.roles; Step.critic, Step.reference):
LoRA adapters "actor" (and "critic") on one frozen base (peft keeps adapters in fp32) or a full
model per role, a fp32 value head (critic only), gradient checkpointing, token
log-probs over the response chunked through the LM head, AdamW (foreach, as on CUDA) with
its state already created and gradients already allocated (the second micro-batch of a
mini-batch: the worst case), grad clipping and the optimizer step.

How: the models are built on the meta device, their parameters swapped for FakeTensors on
"cpu" (fake "cuda" tensors cannot run backward without a GPU), and the step runs under
FakeTensorMode with torch's MemTracker, which records bytes by category (PARAM, BUFFER, GRAD,
ACT, TEMP, OPT) at the peak of each region: forward, backward, optimizer. Tracing the full
depth is slow (Qwen2.5-0.5B, 24 layers: ~52 s), so 1 and 2 layers are traced and every
category is extrapolated linearly per layer; each region's peak extrapolates separately and
the largest wins. Results are cached on disk, keyed by everything they depend on.

Not modelled: the CUDA caching allocator's rounding and fragmentation, kernels' internal
scratch (plan.py's margin covers them), LoRA dropout (tinyrl uses 0). cuBLAS workspaces are not
traced either: plan.py counts them in every phase (formulas.CUBLAS_WORKSPACES_BYTES).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType

from tinyrl.errors import TinyRLError
from tinyrl.memory.formulas import ALL_LINEAR
from tinyrl.phases import BUDGETED_PHASES, Phase
from tinyrl.rl.logprobs import chunked_token_logprobs  # the trainer's own chunked log-probs
from tinyrl.roles import Role

# The phases a step is traced for (tinyrl.phases: FORWARD is old + reference log-probs and values).
PHASES = tuple(str(p) for p in BUDGETED_PHASES)

_TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True)
class Step:
    """Everything one traced step depends on besides the model config."""

    phase: str
    micro_batch: int
    seq_len: int                       # prompt + response tokens per sequence
    response_len: int                  # tokens that go through the LM head / value head
    finetune: str = "lora"             # lora | full
    lora_rank: int = 32
    lora_targets: tuple[str, ...] = ALL_LINEAR
    gradient_checkpointing: bool = True
    dtype: str = "bf16"
    logprob_chunk: int = 1024
    with_entropy: bool = True          # PPO's entropy bonus needs the softmax of every chunk
    # Each row's real (prompt, response) tokens in the padded [micro_batch, seq_len] batch; None:
    # every token real, the packed pass's worst case at this row count and width (the plan's).
    rows: tuple[tuple[int, int], ...] | None = None
    critic: bool = True                # the estimator reads values (GAE): critic adapter/copy, head, Adam
    reference: bool = True             # a KL term reads reference log-probs (full: a frozen copy)
    # Each row's prompt as a number (tinyrl.packing.prompt_groups): rows with the same number share
    # one prompt, which the packed pass computes once (GRPO's n answers); None: every prompt distinct.
    groups: tuple[int, ...] | None = None
    # `tinyrl sft`'s step (the actor alone): its update's loss is tinyrl.learners.sft_loss_fn's
    # (log-probs without entropy, NLL over the mask) instead of PPO's policy loss.
    sft: bool = False
    # model.padding_free: the trainer's packed passes (its default), or transformers' padded ones,
    # which compute every pad and build a [rows, 1, width, width] attention mask.
    padding_free: bool = True

    def prompt_sources(self) -> list[int]:
        """[micro_batch] the row whose prompt each row carries: its group's first row."""
        first = {g: i for i, g in reversed(list(enumerate(self.groups)))}
        return [first[g] for g in self.groups]

    def roles(self) -> frozenset[Role]:
        return frozenset({Role.ACTOR} | ({Role.CRITIC} if self.critic else set())
                         | ({Role.REFERENCE} if self.reference else set()))

    def validate(self) -> None:
        if self.phase not in PHASES:
            raise TinyRLError(f"unknown phase {self.phase!r}", hint=f"choose from {PHASES}")
        if self.phase == Phase.CRITIC_UPDATE and not self.critic:
            raise TinyRLError("a critic_update phase without a critic", hint="critic=True, or another phase")
        if self.sft and (self.critic or self.reference):
            raise TinyRLError("an SFT step trains the actor alone", hint="critic=False, reference=False")
        if self.finetune not in ("lora", "full"):
            raise TinyRLError(f"unknown finetune {self.finetune!r}", hint="use lora or full")
        if not 1 <= self.response_len < self.seq_len or self.micro_batch < 1:
            raise TinyRLError(f"bad step shape: micro_batch={self.micro_batch}, seq_len={self.seq_len}, "
                              f"response_len={self.response_len}",
                              hint="need micro_batch >= 1 and 1 <= response_len < seq_len")
        prompt_width = self.seq_len - self.response_len
        if self.rows is not None and (len(self.rows) != self.micro_batch or not all(
                1 <= p <= prompt_width and 0 <= r <= self.response_len for p, r in self.rows)):
            raise TinyRLError(f"bad rows for a [{self.micro_batch}, {self.seq_len}] batch: {self.rows}",
                              hint=f"micro_batch (prompt, response) pairs, 1 <= prompt <= {prompt_width}, "
                                   f"0 <= response <= {self.response_len}")
        if self.groups is not None:
            prompts = [p for p, _ in self.rows] if self.rows is not None else [prompt_width] * self.micro_batch
            if len(self.groups) != self.micro_batch or any(prompts[i] != prompts[first]
                                                           for i, first in enumerate(self.prompt_sources())):
                raise TinyRLError(f"bad groups for a batch of {self.micro_batch} rows: {self.groups}",
                                  hint="one number per row; rows that share a prompt have its length")


# ------------------------------------------------------------------------------- tracker

_CATEGORY = {"Parameter": "param", "Buffer": "buffer", "Gradient": "grad", "Activation": "act",
             "Temp": "temp", "Optstate": "opt", "Other": "other", "Total": "total"}


class _NoHook:
    def remove(self) -> None:
        pass


# Ops whose kernel allocates a temporary the size of a tensor of its own, which no dispatch-level
# tracker sees (the op is one call): input -> bytes. aten::logsumexp (ReduceOps.cpp,
# logsumexp_out_impl) computes `(self - amax(self)).exp_()` before its sum: one input-sized tensor,
# on the CPU and on CUDA alike (torch.profiler's memory events show it as aten::sub inside
# aten::logsumexp). On log-probs that is one fp32 [chunk, vocab] tensor beside the fp32 logits: the
# 0.36 GiB an H100's 0.5B forward allocated beyond the plan's traced tensors (issue 31).
HIDDEN_WORKSPACE: dict = {torch.ops.aten.logsumexp.default: lambda t: t.numel() * t.element_size()}


class RegionTracker(MemTracker):
    """torch's MemTracker, plus: the peak of each region (mark() starts the next one), frozen
    parameters (MemTracker would register a grad hook on them, which torch refuses), and a
    top-level module called more than once per step (old log-probs, then the reference)."""

    def __init__(self) -> None:
        super().__init__()
        self._region: str | None = None
        self.regions: dict[str, dict[str, int]] = {}
        self.largest_alloc = 0  # bytes of the largest fresh (non-view, non-in-place) op output

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self._count_workspace(func, args)
        out = super().__torch_dispatch__(func, types, args, kwargs)
        # Returns without alias info are fresh allocations; views and in-place ops are not.
        outs = out if isinstance(out, (tuple, list)) else (out,)
        for ret, t in zip(func._schema.returns, outs):
            if isinstance(t, torch.Tensor) and ret.alias_info is None:
                self.largest_alloc = max(self.largest_alloc, t.untyped_storage().nbytes())
        return out

    def _count_workspace(self, func, args) -> None:
        """An op whose kernel allocates a temporary of its own (HIDDEN_WORKSPACE) peaks at what is
        alive before it plus that temporary: the op's outputs are tracked, its workspace is not."""
        size = HIDDEN_WORKSPACE.get(func)
        if size is None or not args or not isinstance(args[0], torch.Tensor):
            return
        dev, extra = args[0].device, size(args[0])
        snap = self._curr_mem_snap.get(dev, {})
        if snap.get("Total", 0) + extra > self._peak_mem.get(dev, 0):
            peak = {**snap, "Total": snap.get("Total", 0) + extra}
            peak[_MemRefType.TEMP] = peak.get(_MemRefType.TEMP, 0) + extra
            self._peak_mem[dev], self._peak_mem_snap[dev] = peak["Total"], peak

    def _track_module_params_and_buffers(self, module, install_grad_hooks=True):
        for p in module.parameters():
            if not p.requires_grad and self._param_to_grad_hook_handles.get(p) is None:
                self._param_to_grad_hook_handles[p] = (_NoHook(), _NoHook())
        return super()._track_module_params_and_buffers(module, install_grad_hooks)

    def _pre_fw_hook(self, module, inputs) -> None:
        if module in self.memory_tracking and not self._mod_tracker.is_bw:
            name = self._mod_tracker.get_known_fqn(module)
            if set(self._mod_tracker.parents) - {name} == {"Global"}:
                self.reset_mod_stats()  # per-module stats are not used; the totals are kept
        super()._pre_fw_hook(module, inputs)

    def _update_peak_stats(self, peak_state) -> None:
        # Global peak only: MemTracker also updates every active module's peak on each op,
        # which costs O(modules) per op and is not used here.
        for dev, snap in self._curr_mem_snap.items():
            if self._peak_mem.get(dev, 0) < snap["Total"]:
                self._peak_mem[dev] = snap["Total"]
                self._peak_mem_snap[dev] = dict(snap)

    def current_total(self) -> int:
        return sum(snap.get("Total", 0) for snap in self._curr_mem_snap.values())

    def mark(self, region: str) -> None:
        """Closes the current region (keeping its peak snapshot) and starts `region`."""
        if self._region is not None:
            self.regions[self._region] = _flatten(self.get_tracker_snapshot("peak"))
        self._region = region
        self._peak_mem_snap = self.get_tracker_snapshot()
        self._peak_mem = {dev: snap["Total"] for dev, snap in self._peak_mem_snap.items()}

    def finish(self) -> dict[str, dict[str, int]]:
        self.mark("")
        return self.regions


def _flatten(snapshot: dict) -> dict[str, int]:
    """{device: {_MemRefType: bytes}} -> {"param": bytes, ...} summed over devices."""
    out = dict.fromkeys(_CATEGORY.values(), 0)
    for dev_snap in snapshot.values():
        for key, value in dev_snap.items():
            out[_CATEGORY[getattr(key, "value", key)]] += value
    return out


def to_fake(modules: list[nn.Module], device: str = "cpu") -> None:
    """Swap meta parameters and buffers for empty fake "cpu" tensors (call inside FakeTensorMode).
    Module.to() cannot convert to fake tensors (swap_tensors refuses), hence the manual swap;
    the memo keeps tied weights (embedding = lm_head) tied."""
    memo: dict[int, torch.Tensor] = {}
    for module in modules:
        for mod in module.modules():
            for name, p in list(mod._parameters.items()):
                if p is not None:
                    if id(p) not in memo:
                        memo[id(p)] = nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device=device),
                                                   requires_grad=p.requires_grad)
                    mod._parameters[name] = memo[id(p)]
            for name, b in list(mod._buffers.items()):
                if b is not None:
                    mod._buffers[name] = memo.setdefault(id(b), torch.empty(b.shape, dtype=b.dtype, device=device))


# ------------------------------------------------------------------------------- models

def qwen2_config(spec: dict, layers: int | None = None):
    from transformers import Qwen2Config

    fields = {k: v for k, v in spec.items() if k not in ("architectures", "torch_dtype", "dtype")}
    if layers is not None:
        fields["num_hidden_layers"] = layers
        fields["max_window_layers"] = layers
        fields.pop("layer_types", None)  # derived from num_hidden_layers when absent
    config = Qwen2Config(**fields)
    config._attn_implementation = "sdpa"  # what tinyrl runs with on CUDA and CPU
    config.use_cache = False
    return config


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def model_config(step: Step):
    """The ModelConfig the trainer would run this step with."""
    from tinyrl.config import ModelConfig

    return ModelConfig(name="", finetune=step.finetune, lora_rank=step.lora_rank,
                       lora_alpha=2 * step.lora_rank, lora_dropout=0.0, lora_targets=list(step.lora_targets),
                       dtype=step.dtype, gradient_checkpointing=step.gradient_checkpointing,
                       logprob_chunk=step.logprob_chunk,
                       # Traced as the trainer runs them: packed (the default), their layout found
                       # from the batch's real mask (tinyrl.packing), or padded.
                       padding_free=step.padding_free)


def build_models(spec: dict, step: Step, layers: int | None = None, device: str = "meta"):
    """The trainer's own tinyrl.models.PolicyModels around Qwen2 built from `spec` on `device`
    ("meta" for tracing, "cpu"/"cuda" for a real run), weights in step.dtype, nothing loaded."""
    from transformers import Qwen2ForCausalLM

    from tinyrl.models import PolicyModels

    config = qwen2_config(spec, layers)
    with torch.device(device):
        with default_dtype(_TORCH_DTYPES[step.dtype]):
            base = Qwen2ForCausalLM(config)
            full = step.finetune == "full"
            critic = Qwen2ForCausalLM(config) if full and step.critic else None
            reference = Qwen2ForCausalLM(config) if full and step.reference else None
        # Outside the bf16 default: the value head is fp32, peft keeps adapters in fp32.
        models = PolicyModels.from_modules(model_config(step), base, torch.device(device), critic, reference,
                                           roles=step.roles())
    models.train(True)
    return models


def all_modules(models) -> list[nn.Module]:
    others = (models.value_head, models.critic_backbone, models.reference)
    return [models.actor] + [m for m in others if m is not None and m is not models.actor]


def make_inputs(step: Step, vocab_size: int, device: str | torch.device = "cpu"):
    """The Batch tinyrl.models.make_batch builds (prompts left-padded to seq_len - response_len,
    responses right-padded to response_len, positions counting real tokens) with step.rows' real
    tokens, or every token real: at a given row count and width the packed pass is largest so
    (N = every token; tensors of rows x width are that size whatever the lengths). Prompts are
    distinct (random ids, a fixed seed): no prompt shared, the packed layout computing the most
    tokens; with step.groups, rows of a group get their first row's prompt, which the packed pass
    then computes once, as it does for the trainer's rows. Real tensors, made outside any
    FakeTensorMode: the packed layout is host index work on their values (tinyrl.packing); a few
    bytes per token."""
    from tinyrl.models import Batch

    B, T, R = step.micro_batch, step.seq_len, step.response_len
    rows = torch.tensor(step.rows if step.rows is not None else [(T - R, R)] * B).view(B, 2)
    col = torch.arange(T)
    mask = ((col >= T - R - rows[:, :1]) & (col < T - R + rows[:, 1:])).long()       # [B, T]
    ids = torch.randint(1, vocab_size, (B, T), generator=torch.Generator().manual_seed(0)) * mask
    if step.groups is not None:
        ids[:, :T - R] = ids[step.prompt_sources(), :T - R]  # validate(): a group's prompts are one length
    return Batch(ids, mask, (mask.cumsum(-1) - 1).clamp(min=0),
                 (torch.arange(R) < rows[:, 1:]).float()).to(torch.device(device))


def batch_tensors(batch) -> list[torch.Tensor]:
    return [batch.input_ids, batch.attention_mask, batch.position_ids, batch.response_mask]


def make_optimizers(models) -> dict[str, torch.optim.Optimizer]:
    """The trainer's optimizer (tinyrl.optim.AdamW: fp32 moments even for bf16 weights, which
    a full fine-tune pays 8 bytes/param for). foreach=True: what torch picks by default for CUDA
    tensors (its temporaries count); on CPU tensors the default would be the per-tensor loop."""
    from tinyrl.optim import AdamW

    opts = {Role.ACTOR: AdamW(models.actor_parameters(), lr=1e-6, foreach=True)}
    if models.with_critic:  # a critic-free run builds no critic optimizer (tinyrl.learners)
        opts[Role.CRITIC] = AdamW(models.critic_parameters(), lr=1e-5, foreach=True)
    return opts


def warm_start(models, opts: dict[str, torch.optim.Optimizer], phase: str) -> None:
    """Create Adam state (one step on zero grads) and leave the phase's grads allocated."""
    for opt in opts.values():
        params = [p for g in opt.param_groups for p in g["params"]]
        for p in params:
            p.grad = torch.zeros_like(p)
        opt.step()
        opt.zero_grad(set_to_none=True)
    role = {Phase.ACTOR_UPDATE: Role.ACTOR, Phase.CRITIC_UPDATE: Role.CRITIC}.get(phase)
    if role:
        for p in (models.actor_parameters() if role == Role.ACTOR else models.critic_parameters()):
            p.grad = torch.zeros_like(p)


# ------------------------------------------------------------------------------- the step

def run_phase(models, opts: dict, step: Step, batch,
              mark: Callable[[str], None] = lambda region: None) -> None:
    """One micro-step of `step.phase` through the trainer's own code (PolicyModels' forward
    passes, tinyrl.learners' loss functions, the trainer's AdamW); calls mark(region) as each
    region starts."""
    from tinyrl.learners import actor_loss_fn, critic_loss_fn, sft_loss_fn
    from tinyrl.trajectory import Trajectory

    mark("forward")
    if step.phase == Phase.FORWARD:
        with torch.no_grad():
            models.token_logprobs(Role.ACTOR, batch)                          # old log-probs
            if step.reference:
                models.token_logprobs(Role.REFERENCE, batch)                  # reference
            if step.critic:
                with models.role(Role.CRITIC):
                    models.values(batch)
        return
    mask = batch.response_mask                                             # [B, R]
    role = Role.ACTOR if step.phase == Phase.ACTOR_UPDATE else Role.CRITIC
    with models.role(role):  # held through backward: the critic adapter's grads count
        if step.sft:
            from tinyrl.sft.data import SFTBatch

            loss, _ = sft_loss_fn()(models, SFTBatch(batch, mask))         # the SFT trainer's own loss
        else:  # the trainer's own loss functions on a trajectory of this batch
            ones = torch.ones_like(mask, dtype=torch.float32)              # [B, R], on the batch's device
            part = Trajectory(batch=batch, group_ids=torch.zeros_like(mask[:, 0]), advantages=ones,
                              returns=ones, values=torch.zeros_like(ones))
            loss_fn = actor_loss_fn if role == Role.ACTOR else critic_loss_fn
            loss, _ = loss_fn(_loss_config(step))(models, part)
        params = models.actor_parameters() if role == Role.ACTOR else models.critic_parameters()
        mark("backward")
        loss.backward()
    mark("optimizer")
    # tinyrl.rl.grad.clip_grad_norm_or_skip's work without its host sync (a fake tensor has no value)
    torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
    opts[role].step()
    opts[role].zero_grad(set_to_none=True)


def _loss_config(step: Step):
    """The settings the traced losses read: the defaults, with the entropy bonus in the actor's
    graph when the step has one (its backward through every chunk's softmax)."""
    from tinyrl.config import Config

    cfg = Config()
    cfg.actor.entropy_coeff = 0.001 if step.with_entropy else 0.0
    cfg.rollout.temperature = 1.0
    return cfg


# ------------------------------------------------------------------------------- tracing

def trainable_bytes(models) -> int:
    seen, total = set(), 0
    for p in models.actor_parameters() + models.critic_parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel() * p.element_size()
    return total


def trace_step(spec: dict, step: Step, layers: int) -> dict:
    """{region: {category: bytes}} at each region's peak, plus "trainable" bytes; cached."""
    step.validate()
    path = _cache_path(spec, step, layers)
    if path.is_file():
        return json.loads(path.read_text())
    models = build_models(spec, step, layers, device="meta")
    batch = make_inputs(step, spec["vocab_size"])  # real ids and masks (see make_inputs)
    with FakeTensorMode(allow_non_fake_inputs=True):
        to_fake(all_modules(models))
        opts = make_optimizers(models)
        warm_start(models, opts, step.phase)
        tracker = RegionTracker()
        tracker.track_external(*all_modules(models), *opts.values(), *batch_tensors(batch))
        with tracker:
            run_phase(models, opts, step, batch, mark=tracker.mark)
        result = {"regions": tracker.finish(), "trainable": trainable_bytes(models),
                  "largest_alloc": tracker.largest_alloc}
    _write_atomic(path, json.dumps(result))
    return result


def _cache_path(spec: dict, step: Step, layers: int) -> Path:
    import peft
    import transformers

    import tinyrl.models
    import tinyrl.optim
    import tinyrl.packing
    import tinyrl.rl.logprobs
    import tinyrl.rl.losses

    # The traced step is this file plus the trainer's model, loss, optimizer and log-prob code:
    # a change to any invalidates cached traces without anyone remembering to bump a version.
    import tinyrl.learners

    files = [__file__, tinyrl.rl.logprobs.__file__, tinyrl.models.__file__, tinyrl.optim.__file__,
             tinyrl.rl.losses.__file__, tinyrl.packing.__file__, tinyrl.learners.__file__]  # learners: the loss functions
    code = b"".join(Path(f).read_bytes() for f in files)
    key = json.dumps({"spec": spec, "step": asdict(step), "layers": layers,
                      "code": hashlib.sha256(code).hexdigest(), "torch": torch.__version__,
                      "transformers": transformers.__version__, "peft": peft.__version__},
                     sort_keys=True, default=str)
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    root = Path(os.environ.get("TINYRL_CACHE") or Path.home() / ".cache" / "tinyrl")
    return root / "memory-traces" / f"{step.phase}-L{layers}-{digest}.json"


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(text)
    tmp.replace(path)


# Layer 0 is unlike the others: its input IS the embedding output, which the model keeps
# referenced for the whole forward, so from layer 1 on one more [B, T, H] hidden state is alive
# at a layer-local peak. Extrapolating from 1 and 2 layers multiplied that one tensor by the depth
# (3B, no-grad forward, 32 sequences: +5.4 GB that no card ever saw); from 2 and 3 layers every
# step is a "typical" layer.
BASE_LAYERS = 2


def extrapolate(one: dict, two: dict, layers: int, base: int = BASE_LAYERS) -> dict:
    """Category bytes at `layers` from traces at `base` and `base + 1` layers:
    v0 + (layers - base) * (v1 - v0), per region; the region whose extrapolated total is largest
    is the phase's peak."""
    best = None
    for region in one["regions"]:
        a, b = one["regions"][region], two["regions"][region]
        cats = {k: a[k] + (layers - base) * (b[k] - a[k]) for k in a}
        if best is None or cats["total"] > best["total"]:
            best = cats
    trainable = one["trainable"] + (layers - base) * (two["trainable"] - one["trainable"])
    return {**best, "trainable": trainable, "largest_alloc": max(one["largest_alloc"], two["largest_alloc"])}


def edge_groups(micro_batch: int, shared_by: int) -> tuple[int, ...]:
    """Each row's prompt (Step.groups) in the micro-batch that holds the most prompts a trainer's
    micro-batch of `shared_by`-row groups can: its first row the last of a group, then whole
    groups (micro-batches are consecutive rows, a prompt's rows adjacent: microbatch.by_prompt)."""
    return tuple((i + shared_by - 1) // shared_by for i in range(micro_batch))


def priced_layouts(step: Step, shared_by: int) -> list[Step]:
    """The packed layouts a plan prices for `step` when its rows come `shared_by` to a prompt
    (simulate_phase's shared_by; the real probes try the same): the step itself and, when rows share
    prompts and the step names no groups of its own, its rows grouped as edge_groups says. A padded
    pass computes every row's prompt however many rows share it: one layout."""
    if shared_by > 1 and step.groups is None and step.micro_batch > 1 and step.padding_free:
        return [step, replace(step, groups=edge_groups(step.micro_batch, shared_by))]
    return [step]


def simulate_phase(spec: dict, phase: str, micro_batch: int, seq_len: int, *,
                   response_len: int | None = None, finetune: str = "lora", lora_rank: int = 32,
                   lora_targets: tuple[str, ...] = ALL_LINEAR, gradient_checkpointing: bool = True,
                   dtype: str = "bf16", logprob_chunk: int = 1024, with_entropy: bool = True,
                   critic: bool = True, reference: bool = True, layers: int | None = None,
                   rows: tuple[tuple[int, int], ...] | None = None,
                   groups: tuple[int, ...] | None = None, sft: bool = False,
                   shared_by: int = 1, padding_free: bool = True) -> dict[str, int]:
    """Bytes by category at the phase's peak, for the full depth (or `layers`):
    base_weights, adapters (all trainable weights: adapters + value head, or the full models),
    gradients, optimizer (state + step temporaries), activations (everything else, the
    log-prob chunk included), logprob_chunk (of which: one chunk's traced working set), peak.
    The passes are packed, as the trainer's (padded with `padding_free` False, model.padding_free's
    other setting); `rows` (Step.rows) gives each row's real tokens,
    else every token is real (the worst case the plan needs); `groups` (Step.groups) which rows
    share a prompt, else none does; `sft` (Step.sft) the SFT step.
    `shared_by` (the plan of a run whose rows come `shared_by` to a prompt, GRPO's rollout.n): the
    worse of the two packed layouts such a run's micro-batches take at most, each prompt distinct
    (the most tokens computed) and shared as edge_groups says (fewer tokens, plus the shared
    layout's [B, 1, Rq, Lk] attention mask, which wins when prompts are short beside responses:
    countdown-grpo-4090 with 32-token prompts and 4,096-token responses, +0.18 GiB in forward)."""
    step = Step(phase, micro_batch, seq_len, response_len or seq_len - 1, finetune, lora_rank,
                tuple(lora_targets), gradient_checkpointing, dtype, logprob_chunk, with_entropy,
                tuple(map(tuple, rows)) if rows is not None else None, critic, reference,
                tuple(groups) if groups is not None else None, sft, padding_free)
    return max((_simulate_step(spec, s, layers) for s in priced_layouts(step, shared_by)),
               key=lambda parts: parts["peak"])


def _simulate_step(spec: dict, step: Step, layers: int | None) -> dict[str, int]:
    """simulate_phase's bytes by category for one traced step."""
    depth = layers or spec["num_hidden_layers"]
    if depth <= BASE_LAYERS + 1:
        cats = extrapolate(trace_step(spec, step, depth), trace_step(spec, step, depth), depth, depth)
    else:
        cats = extrapolate(trace_step(spec, step, BASE_LAYERS), trace_step(spec, step, BASE_LAYERS + 1), depth)
    weights = cats["param"] + cats["buffer"]
    return {
        "base_weights": weights - cats["trainable"],
        "adapters": cats["trainable"],
        "gradients": cats["grad"],
        "optimizer": cats["opt"],
        "activations": cats["act"] + cats["temp"] + cats["other"],
        "allocator": allocator_headroom(cats["largest_alloc"], step.phase),
        "logprob_chunk": logprob_chunk_trace(spec, step),
        "peak": cats["total"] + allocator_headroom(cats["largest_alloc"], step.phase),
    }


# Blocks of the largest transient size the allocator needs beyond the traced tensors, per phase.
# A no-grad forward frees each layer's blocks before the next layer asks for the same sizes: one.
# A training phase asks for that size twice over per layer in backward -- the checkpointed
# layer's recomputed forward (for LoRA: peft's fp32 [B, T, intermediate] adapter output, the
# largest block of a 3B step) and its gradient -- while long-lived blocks (saved hidden states,
# weight gradients) are placed into the freed ones in between: two.
# Calibrated, not derived: the H100 of issue 20 held 19 sequences of the 3B preset's actor and
# critic update and not 20 under a 21.59 GiB budget, i.e. between 1.52 and 2.10 blocks of 1.0 GiB
# beyond the traced tensors (tests/test_memory_plan_vs_h100.py); its 3B forward (47 held, 48 not)
# fits one block. One measured card: re-measure with benchmarks/gpu_check.py.
HEADROOM_BLOCKS = {Phase.FORWARD: 1, Phase.ACTOR_UPDATE: 2, Phase.CRITIC_UPDATE: 2}


def allocator_headroom(largest_alloc: int, phase: str = Phase.FORWARD) -> int:
    """What the CUDA caching allocator needs beyond the bytes tensors hold: blocks as large as the
    step's largest transient allocation (HEADROOM_BLOCKS says how many per phase). The allocator
    serves a request from a single free cached block (best fit, split); once a step has freed and
    re-split its big blocks (the log-prob chunk's fp32 logits, a layer's fp32 LoRA output over the
    whole micro-batch), what is free is scattered in pieces, and a cap (the card, or
    set_per_process_memory_fraction in the probe) refuses the new segment. The fake trace counts
    tensors, never blocks. PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True would make most of it
    unnecessary, and is not assumed."""
    return int(largest_alloc) * HEADROOM_BLOCKS.get(Phase(phase), 1)


def logprob_chunk_trace(spec: dict, step: Step) -> int:
    """Traced bytes above its inputs of one log-prob chunk (forward + backward when training)."""
    if step.phase == Phase.CRITIC_UPDATE:
        return 0
    real = sum(r for _, r in step.rows) if step.rows is not None else step.micro_batch * step.response_len
    n = max(1, min(step.logprob_chunk, real))
    grad = step.phase == Phase.ACTOR_UPDATE
    with FakeTensorMode():
        dt = _TORCH_DTYPES[step.dtype]
        h = torch.empty(1, n, spec["hidden_size"], dtype=dt, requires_grad=grad)
        w = torch.empty(spec["vocab_size"], spec["hidden_size"], dtype=dt)
        y = torch.zeros(1, n, dtype=torch.long)
        tracker = RegionTracker()
        tracker.track_external(h, w, y)
        base = tracker.current_total()
        with tracker:
            tracker.mark("chunk")
            run_logprob_chunk(h, w, y, with_entropy=grad and step.with_entropy)
        return tracker.finish()["chunk"]["total"] - base


def run_logprob_chunk(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, with_entropy: bool) -> None:
    """One chunk of the trainer's chunked_token_logprobs: hidden [1, n, H], weight [V, H],
    labels [1, n]; with its backward when `hidden` requires grad (an actor update). The plan
    traces it on fake tensors; tests run it on real ones against the allocator."""
    grad = hidden.requires_grad
    with torch.set_grad_enabled(grad):
        out = chunked_token_logprobs(hidden, weight, labels, chunk_size=hidden.shape[1], with_entropy=with_entropy)
        loss = sum(o.sum() for o in out) if isinstance(out, tuple) else out.sum()
        if grad:
            loss.backward()


def fit_max_micro_batch(spec: dict, phase: str, budget_bytes: int, seq_len: int, *,
                        max_micro_batch: int = 1024, **kwargs) -> int:
    """The largest micro-batch (sequences, <= max_micro_batch) whose simulated peak fits
    `budget_bytes`; 0 if not even one sequence fits.

    Peak grows with the micro-batch, piecewise linearly (the log-prob chunk saturates, then the
    layer recompute takes over as the peak), so a two-point linear fit misleads: the search
    doubles to bracket the answer, then narrows it with chord (linear-interpolation) probes.
    Every answer is a traced size, never an extrapolated one."""
    peaks: dict[int, int] = {}

    def fits(b: int) -> bool:
        if b not in peaks:
            peaks[b] = simulate_phase(spec, phase, b, seq_len, **kwargs)["peak"]
        return peaks[b] <= budget_bytes

    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= max_micro_batch and fits(hi):
        lo, hi = hi, 2 * hi
    if hi > max_micro_batch:
        if fits(max_micro_batch):
            return max_micro_batch
        hi = max_micro_batch
    while hi - lo > 1:
        chord = lo + (budget_bytes - peaks[lo]) * (hi - lo) // max(1, peaks[hi] - peaks[lo])
        probe = min(max(chord, lo + 1), hi - 1)
        if fits(probe):
            lo = probe
            if probe + 1 < hi and not fits(probe + 1):  # the chord is usually right: confirm
                hi = probe + 1
        else:
            hi = probe
    return lo
