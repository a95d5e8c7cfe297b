"""The probe's step must keep every tensor on its inputs' device (issue 20, item 1: on the first
CUDA card, run_phase made `adv` on the CPU and the real probe crashed with "Expected all tensors
to be on the same device"). Reproduced here without a GPU: the step runs on fake tensors of a
second device type ("meta"), so any tensor the step creates on the CPU meets them and fails."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.overrides import TorchFunctionMode

import tinyrl  # noqa: F401  (before transformers/peft)
from tinyrl.memory import simulate as sim
from tinyrl.phases import BUDGETED_PHASES

SPEC = dict(model_type="qwen2", vocab_size=512, hidden_size=64, intermediate_size=128,
            num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
            tie_word_embeddings=True, max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=10000.0)


class _Reached(Exception):
    pass


def _stop_at_backward(region: str) -> None:
    if region == "backward":  # forward and loss ran on the device: enough (meta has no backward kernels for all ops)
        raise _Reached


@pytest.mark.parametrize("finetune", ["lora", "full"])
@pytest.mark.parametrize("phase", [str(p) for p in BUDGETED_PHASES])
def test_the_probe_step_runs_on_a_non_cpu_device(phase, finetune):
    step = sim.Step(phase, 2, 32, 16, finetune, 4, logprob_chunk=16, dtype="bf16")
    models = sim.build_models(SPEC, step, device="meta")
    # Padded passes (model.padding_free=false, still a user's option): the packed layout is host
    # index work on the batch's values (tinyrl.packing), which meta tensors do not have; the
    # packed passes run on real CPU tensors in tests/test_memory_packed_plan.py, on one device.
    models.cfg.padding_free = False
    with FakeTensorMode():
        sim.to_fake(sim.all_modules(models), "meta")
        batch = sim.make_inputs(step, SPEC["vocab_size"], "meta")
        assert batch.input_ids.device.type == "meta"
        try:
            sim.run_phase(models, {}, step, batch, mark=_stop_at_backward)
        except _Reached:
            assert phase != "forward"


def test_refusing_another_card_for_the_real_probe_points_to_budget(monkeypatch):
    from tinyrl import hardware
    from tinyrl.config import load_config
    from tinyrl.errors import TinyRLError
    from tinyrl.memory import from_config as mp

    monkeypatch.setattr(hardware, "detect_gpu", lambda: hardware.get_gpu("h100"))
    with pytest.raises(TinyRLError) as caught:
        mp.resolve_gpu("rtx4090", load_config("countdown-tiny"), "cuda")
    assert "--budget" in caught.value.hint


class _AmbientCard(TorchFunctionMode):
    """What `with torch.device("cuda")` (the real probe builds its models inside it) does to a
    factory call that names no device: the tensor goes to the card, and a host generator given to
    it fails ("Expected a 'cuda' device type for generator but found 'cpu'", issue 31: every
    critic preset's `probe-memory --device cuda` crashed so on an H100). Without a card the same
    failure is raised here for a call given a generator and no device."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if kwargs.get("generator") is not None and kwargs.get("device") is None:
            raise RuntimeError(f"{func.__name__}: a host generator under a card's default device")
        return func(*args, **kwargs)


@pytest.mark.parametrize("finetune", ["lora", "full"])
def test_every_role_builds_under_a_cards_default_device(finetune):
    from transformers import Qwen2ForCausalLM

    from tinyrl.models import PolicyModels

    step = sim.Step("critic_update", 2, 32, 16, finetune, 4, logprob_chunk=16, dtype="bf16")
    make = lambda: Qwen2ForCausalLM(sim.qwen2_config(SPEC))  # noqa: E731
    full = finetune == "full"
    base, critic, reference = make(), make() if full else None, make() if full else None
    with _AmbientCard():
        models = PolicyModels.from_modules(sim.model_config(step), base, torch.device("cpu"), critic, reference,
                                           roles=step.roles())
    assert models.value_head is not None  # a critic run: the head the crash came from was built
