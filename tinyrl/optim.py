"""AdamW that can train bf16 weights at small learning rates.

bf16 keeps 8 bits of mantissa: a weight of 0.02 moves only in steps of ~1e-4, so an update of
lr 1e-6 rounds back to the same weight and full fine-tuning in pure bf16 silently learns nothing.
For bf16 parameters the step is computed in fp32 and written back with stochastic rounding:
rounded up with probability equal to the remainder, so the expected weight is the fp32 one and
small updates accumulate. fp32 parameters (LoRA adapters, value head) take the ordinary step.
The moments are fp32 either way; no fp32 master copy of the weights is kept (it would cost
4 bytes/param more).
"""

from __future__ import annotations

import torch

# Elements per slice of a bf16 step: 2^22 -> ~16 MiB per fp32 temporary, ~0.1 GiB at the peak.
STEP_SLICE = 1 << 22


def stochastic_round_to_bf16(x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """fp32 -> bf16, rounding up with probability equal to the dropped fraction."""
    bits = x.contiguous().view(torch.int32)
    noise = torch.randint(0, 1 << 16, bits.shape, dtype=torch.int32, device=x.device, generator=generator)
    # Adding noise below the kept bits and truncating them is unbiased rounding.
    return ((bits + noise) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)


class AdamW(torch.optim.AdamW):
    """torch's AdamW, plus fp32 math and stochastic rounding for bf16 parameters."""

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        low = [(g, p) for g in self.param_groups for p in g["params"]
               if p.grad is not None and p.dtype == torch.bfloat16]
        if not low:
            super().step()
            return loss
        skip = {id(p) for _, p in low}
        for group in self.param_groups:  # ordinary step for the others
            kept, group["params"] = group["params"], [p for p in group["params"] if id(p) not in skip]
            group["_all"] = kept
        try:
            super().step()
        finally:
            for group in self.param_groups:
                group["params"] = group.pop("_all")
        for group, p in low:
            self._bf16_step(group, p)
        return loss

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's load_state_dict casts floating-point state to its parameter's dtype (torch 2.13
        optim/optimizer.py, `_process_value_according_to_param_policy`, called by class name so
        it cannot be overridden): a bf16 parameter's fp32 moments would come back as bf16 and
        a resumed run would differ from an uninterrupted one. Put the saved fp32 moments back."""
        saved = state_dict["state"]
        ids = [i for group in state_dict["param_groups"] for i in group["params"]]
        super().load_state_dict(state_dict)
        params = [p for group in self.param_groups for p in group["params"]]
        for i, p in zip(ids, params):
            if p.dtype != torch.bfloat16 or i not in saved:
                continue
            for key in ("exp_avg", "exp_avg_sq"):
                if key in saved[i]:
                    self.state[p][key] = saved[i][key].to(device=p.device, dtype=torch.float32)

    def _bf16_step(self, group: dict, p: torch.Tensor) -> None:
        beta1, beta2 = group["betas"]
        state = self.state[p]
        if not state:
            state["step"] = torch.tensor(0.0)
            state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
            state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
        state["step"] += 1
        t = float(state["step"])
        # In slices: each slice's fp32 temporaries (grad, denominator, weight, rounding noise and
        # bits: ~6 copies) are freed before the next. Whole-tensor, Qwen2.5-0.5B's embedding
        # (136M params) made the step's peak 3.0 GiB above the moments (issue 20, item 2).
        m, v = state["exp_avg"], state["exp_avg_sq"]
        if not all(x.is_contiguous() for x in (p, m, v)):  # no flat view to write through: whole
            self._bf16_update(group, p, p.grad, m, v, beta1, beta2, t)
            return
        flat_p, flat_g, m, v = p.view(-1), p.grad.reshape(-1), m.view(-1), v.view(-1)
        for start in range(0, flat_p.numel(), STEP_SLICE):
            part = slice(start, start + STEP_SLICE)
            self._bf16_update(group, flat_p[part], flat_g[part], m[part], v[part], beta1, beta2, t)

    @staticmethod
    def _bf16_update(group: dict, p: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor,
                     exp_avg_sq: torch.Tensor, beta1: float, beta2: float, t: float) -> None:
        """AdamW on one 1-D slice (views of the parameter, its gradient and its moments)."""
        g = grad.float()
        exp_avg.mul_(beta1).add_(g, alpha=1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        del g
        denom = (exp_avg_sq / (1 - beta2 ** t)).sqrt_().add_(group["eps"])
        w = p.float().mul_(1 - group["lr"] * group["weight_decay"])
        w.addcdiv_(exp_avg, denom, value=-group["lr"] / (1 - beta1 ** t))
        del denom
        p.copy_(stochastic_round_to_bf16(w))
