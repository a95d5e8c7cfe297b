"""bf16 weights learn at small learning rates with stochastic rounding; plain bf16 AdamW does not."""

from __future__ import annotations

import torch

from tinyrl.optim import AdamW, stochastic_round_to_bf16


def test_stochastic_rounding_is_unbiased():
    x = torch.full((200_000,), 1.0 + 2**-10)  # a quarter of the way between two bf16 neighbours
    rounded = stochastic_round_to_bf16(x, torch.Generator().manual_seed(0)).float()
    assert set(rounded.unique().tolist()) == {1.0, 1.0078125}  # the two bf16 neighbours
    assert abs(rounded.mean().item() - (1.0 + 2**-10)) < 2e-4  # unbiased: 1/8 of them round up


def _train(optimizer_cls, steps: int = 200) -> float:
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.full((4096,), 1.0, dtype=torch.bfloat16))
    opt = optimizer_cls([w], lr=1e-4, weight_decay=0.0)
    for _ in range(steps):
        w.grad = torch.ones_like(w)  # constant gradient: Adam moves each weight by ~lr per step
        opt.step()
    return w.float().mean().item()


def test_small_updates_accumulate_on_bf16_weights():
    # 200 steps of ~1e-4 should move 1.0 to ~0.98; bf16's spacing at 1.0 is 2**-8 = 0.0039 below it.
    assert _train(torch.optim.AdamW) == 1.0            # plain bf16 AdamW: every update rounds away
    assert abs(_train(AdamW) - 0.98) < 2e-3            # stochastic rounding: the expected path


def test_fp32_parameters_match_torch_adamw():
    torch.manual_seed(0)
    a = torch.nn.Parameter(torch.randn(64))
    b = torch.nn.Parameter(a.detach().clone())
    oa, ob = torch.optim.AdamW([a], lr=1e-2), AdamW([b], lr=1e-2)
    for _ in range(5):
        for p, o in ((a, oa), (b, ob)):
            p.grad = torch.sin(p.detach() * 3)
            o.step()
    torch.testing.assert_close(a, b)


def test_resume_keeps_fp32_moments_of_bf16_weights_and_matches_an_uninterrupted_run():
    # torch's load_state_dict casts state to the parameter's dtype: bf16 moments after resume
    # would make a resumed bf16 run drift from the uninterrupted one.
    import copy

    def grad(step: int, w: torch.Tensor) -> torch.Tensor:
        return torch.sin(torch.arange(w.numel(), dtype=torch.float32) * 0.37 + step).to(w.dtype) * 1e-3

    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(512).to(torch.bfloat16))
    opt = AdamW([w], lr=1e-3, weight_decay=0.01)
    for t in range(3):
        w.grad = grad(t, w)
        opt.step()
    saved_w, saved_opt = w.detach().clone(), copy.deepcopy(opt.state_dict())
    saved_rng = torch.get_rng_state()
    for t in range(3, 6):
        w.grad = grad(t, w)
        opt.step()

    resumed = torch.nn.Parameter(saved_w.clone())
    opt2 = AdamW([resumed], lr=1e-3, weight_decay=0.01)
    opt2.load_state_dict(saved_opt)
    assert opt2.state[resumed]["exp_avg"].dtype == torch.float32
    torch.testing.assert_close(opt2.state[resumed]["exp_avg_sq"], saved_opt["state"][0]["exp_avg_sq"], rtol=0, atol=0)
    torch.set_rng_state(saved_rng)  # the checkpoint restores the RNG too (stochastic rounding draws from it)
    for t in range(3, 6):
        resumed.grad = grad(t, resumed)
        opt2.step()
    assert torch.equal(resumed.detach(), w.detach())
    assert torch.equal(opt2.state[resumed]["exp_avg"], opt.state[w]["exp_avg"])


def _bf16_steps(monkeypatch, slice_elems: int, shape=(96, 130), steps: int = 3):
    import tinyrl.optim

    monkeypatch.setattr(tinyrl.optim, "STEP_SLICE", slice_elems)
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(shape).to(torch.bfloat16))
    opt = AdamW([w], lr=1e-2, weight_decay=0.01)
    for t in range(steps):
        w.grad = torch.cos(w.detach().float() * 5 + t).to(torch.bfloat16)
        opt.step()
    return w.detach().float(), opt.state[w]


def test_a_sliced_bf16_step_is_the_whole_tensor_step(monkeypatch):
    # 12,480 elements in slices of 1,000 (the last one short) against one slice of everything.
    whole_w, whole = _bf16_steps(monkeypatch, 1 << 30)
    sliced_w, sliced = _bf16_steps(monkeypatch, 1000)
    for key in ("exp_avg", "exp_avg_sq"):
        torch.testing.assert_close(sliced[key], whole[key], rtol=0, atol=0)  # no rounding in them
    # the weights differ only by where each element's rounding noise fell: one bf16 step at most
    step = torch.finfo(torch.bfloat16).eps * whole_w.abs().clamp(min=2**-126)
    assert ((sliced_w - whole_w).abs() <= step * 1.01).all()


def test_the_bf16_step_holds_one_slice_of_temporaries_not_the_whole_parameter(monkeypatch):
    """Issue 20 item 2: whole-tensor, the step held ~6 fp32 copies of the parameter (3 GiB for
    Qwen2.5-0.5B's embedding). Measured with the CPU allocator's events (probe.measure_peak)."""
    import tinyrl.optim
    from tinyrl.memory.probe import measure_peak

    monkeypatch.setattr(tinyrl.optim, "STEP_SLICE", 1 << 14)          # 64 KiB per fp32 slice
    w = torch.nn.Parameter(torch.randn(1 << 20).to(torch.bfloat16))   # 4 MiB per fp32 copy
    opt = AdamW([w], lr=1e-3)
    w.grad = torch.randn_like(w)
    opt.step()                                                         # moments exist from here on
    peak = measure_peak(opt.step)
    assert peak < 1 << 20, f"{peak / 2**20:.1f} MiB of temporaries for a 4 MiB (fp32) parameter"
