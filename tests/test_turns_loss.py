"""Tool tokens of REAL multi-turn episodes get exactly zero gradient and zero weight in every
loss term: episodes made by the turn loop (scripted policy, real sandbox, real chat template),
then the trainer's own code: trajectory_of -> Trainer._advantages (KL in the reward, GAE, the
rollout IS weights) -> the actor learner (PPO clip + KL loss + entropy) and the critic learner
(clipped value loss) on the real tiny model. The gradient is taken at the model's per-token
outputs (log-prob, entropy, value): a tool token is context for later tokens (parameters get
gradient through it), but its own output must not be trained.
(tests/test_episode_mask.py proves the same per estimator and aggregation on hand-made episodes.)"""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoTokenizer

from helpers.hermes_template import HERMES_TEMPLATE
from helpers.scripted_engine import ScriptedEngine
from tinyrl.config import load_config
from tinyrl.learners import Learner, actor_loss_fn, critic_loss_fn
from tinyrl.microbatch import BudgetKeeper
from tinyrl.models import PolicyModels
from tinyrl.phases import Phase
from tinyrl.rl import kl as klmod
from tinyrl.roles import Role
from tinyrl.rollout.base import SamplingSettings
from tinyrl.rollout.chat import ToolChat
from tinyrl.rollout.turns import EpisodeLimits, run_episodes
from tinyrl.tools import TOOLS
from tinyrl.trainer import Trainer
from tinyrl.trajectory import engine_logprobs, trajectory_of


def _call(code: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": "code_interpreter", "arguments": {"code": code}}) + "\n</tool_call>"


def _script(context: str, j: int) -> str:
    k = context.count("<tool_response>")
    if k == 0:
        return f"first {_call(f'print({j} + 40)')}"
    if k == 1 and "\n41\n</tool_response>" in context:  # sample 1's episodes call again (turns > 1: n = 1)
        return "again " + _call("print('x' * 9)") + _call("import sys; sys.exit(3)")
    return f"<answer> {k} </answer>"


class _Capture:
    """The real models, with every per-token output kept so its gradient can be read."""

    def __init__(self, models: PolicyModels):
        self.models, self.outs = models, {"lp": [], "entropy": [], "values": []}

    def __getattr__(self, name):
        return getattr(self.models, name)

    def token_logprobs(self, role, batch, temperature=1.0, with_entropy=False):
        out = self.models.token_logprobs(role, batch, temperature, with_entropy=with_entropy)
        for name, t in zip(("lp", "entropy"), out if with_entropy else (out,)):
            t.retain_grad()
            self.outs[name].append(t)
        return out

    def values(self, batch):
        v = self.models.values(batch)
        v.retain_grad()
        self.outs["values"].append(v)
        return v


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum-norm"])
def test_tool_tokens_get_no_gradient_in_any_loss_term(tiny_model_dir, agg):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = HERMES_TEMPLATE
    chat = ToolChat(tok, [TOOLS["code_interpreter"].schema], [tok.eos_token_id])
    msgs = [[{"role": "user", "content": f"task {i}"}] for i in range(2)]
    res = run_episodes(ScriptedEngine(tok, _script), [chat.render(m, True) for m in msgs],
                       SamplingSettings(n=2, max_new_tokens=600, seed=0), chat=chat,
                       tools={"code_interpreter": TOOLS["code_interpreter"]}, limits=EpisodeLimits(), messages=msgs)
    episodes = res.episodes
    assert [len(e.turns) for e in episodes] == [3, 5, 3, 5]  # real tool turns in every episode
    assert [c.status for c in episodes[1].tool_calls] == ["ok", "ok", "error"]
    g = torch.Generator().manual_seed(0)
    for e in episodes:  # engine log-probs (the scripted policy gives none): 0.0 at tool tokens, as engines do
        e.logprobs = [float(-torch.rand(1, generator=g)) if m else 0.0 for m in e.policy_mask]

    cfg = load_config("countdown-tiny", [
        "algorithm.adv_estimator=gae", "algorithm.kl_in_reward=true", "algorithm.kl_coef=0.1",
        "algorithm.use_kl_loss=true", "algorithm.kl_loss_coef=0.1", "algorithm.kl_loss_type=k3",
        "algorithm.rollout_is=token", f"actor.loss_agg_mode={agg}", f"critic.loss_agg_mode={agg}",
        "actor.entropy_coeff=0.01", "rollout.max_response_length=600", "trainer.train_batch_size=2",
        "rollout.n=2"], check=False)
    torch.manual_seed(0)
    models = PolicyModels(cfg.model, str(tiny_model_dir), torch.device("cpu"))
    with torch.no_grad():  # a trained-looking actor and critic: fresh LoRA B and value head are 0,
        for p in models.actor_parameters() + models.critic_parameters():  # which zeroes some gradients anyway
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    traj = trajectory_of(episodes, tok.pad_token_id, torch.device("cpu"))
    traj.rollout_lp = engine_logprobs(episodes, traj.mask)
    with torch.no_grad():  # FORWARD, as the trainer does it
        with models.role(Role.ACTOR):
            traj.old_lp = models.token_logprobs(Role.ACTOR, traj.batch, 1.0)
        traj.ref_lp = models.token_logprobs(Role.REFERENCE, traj.batch, 1.0)
        with models.role(Role.CRITIC):
            traj.values = models.values(traj.batch)
    traj.scores = torch.tensor([1.0, 0.0, 0.5, -1.0])
    trainer = Trainer.__new__(Trainer)  # only what ADVANTAGES reads
    trainer.cfg, trainer.rollout_is = cfg, "token"
    trainer.kl_ctrl = klmod.make_kl_controller("fixed", cfg.algorithm.kl_coef, 0.0, 1)
    trainer._advantages(traj)

    # tool positions of the [B, R] response block: exactly the tool turns' spans
    tool = torch.zeros_like(traj.mask, dtype=torch.bool)
    for i, e in enumerate(episodes):
        for t in e.turns:
            if t.role == "tool":
                tool[i, t.start:t.end] = True
    real = traj.batch.response_mask.bool()
    assert tool.sum() > 100 and (traj.mask.bool() == (real & ~tool)).all()
    for name in ("advantages", "returns", "is_weights"):
        assert getattr(traj, name)[tool].eq(0).all(), name

    capture = _Capture(models)
    budgets = BudgetKeeper({Phase.ACTOR_UPDATE: 1 << 20, Phase.CRITIC_UPDATE: 1 << 20})
    for role, phase, section, fn, params in (
            (Role.ACTOR, Phase.ACTOR_UPDATE, cfg.actor, actor_loss_fn(cfg), models.actor_parameters()),
            (Role.CRITIC, Phase.CRITIC_UPDATE, cfg.critic, critic_loss_fn(cfg), models.critic_parameters())):
        learner = Learner(role, phase, section, capture, params, fn, budgets)
        with models.role(role):
            learner.accumulate_gradients(traj, [slice(0, 1), slice(1, 4)])  # two micro-batches
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in params), role
    for name, outs in capture.outs.items():
        assert len(outs) == 2, name
        rows = [slice(0, 1), slice(1, 4)]
        for out, s in zip(outs, rows):
            grad = out.grad
            assert grad is not None, name
            assert grad[tool[s]].eq(0).all(), f"{name}: gradient at tool tokens"
            assert grad[traj.mask[s].bool()].ne(0).any(), f"{name}: policy tokens get a gradient"
