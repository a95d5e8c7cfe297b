"""The memory plan bounds the packed micro-batches the trainer forms (issue 31, item 2).

The trainer packs rows (model.padding_free) and fills a micro-batch by real tokens, but several
tensors of a packed pass are rows x padded width (the unpacked hidden states, the value head's
fp32 input, the attention's per-row gathers): short rows at the planned token budget used to
make 4x the rows the plan traced, and more bytes than it promised. Here the trainer's own
micro-batch former (BudgetKeeper, as trainer.py builds it) cuts a mini-batch of mixed short rows
at the planned budget, each micro-batch runs the traced step for real (simulate.run_phase: the
models' packed passes, the losses, AdamW) on the tiny model's shape, and its live tensor bytes,
counted by the simulation's own tracker (as `tinyrl doctor` counts them on CPU), must stay
within the simulated plan for that budget. Fails without the row cap (row_width=None: what
main did): 16 rows where the plan traced 4.
"""

import os
from dataclasses import replace

import pytest
import torch

import tinyrl  # noqa: F401  (before transformers/peft)
from tinyrl.doctor.cpu_memory import _totals_tracker
from tinyrl.errors import TinyRLError
from tinyrl.memory import simulate as sim
from tinyrl.microbatch import BudgetKeeper
from tinyrl.models import Batch

# The tiny model's shape (tinyrl.tiny_model), as in test_memory_sim_vs_real.py.
TINY = dict(model_type="qwen2", max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=10000.0,
            vocab_size=768, hidden_size=128, intermediate_size=384, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, head_dim=64, tie_word_embeddings=True)
PROMPT, RESPONSE = 128, 128                # the planned width: data.max_prompt_length + max_response_length
WIDTH = PROMPT + RESPONSE
PLANNED_ROWS = 4
BUDGET = PLANNED_ROWS * WIDTH              # the plan's token_budget for that phase
COMMON = dict(response_len=RESPONSE, finetune="lora", lora_rank=16, dtype="fp32", logprob_chunk=256)


@pytest.fixture(scope="module")
def trace_cache(tmp_path_factory):
    old = os.environ.get("TINYRL_CACHE")
    os.environ["TINYRL_CACHE"] = str(tmp_path_factory.mktemp("traces"))  # traced afresh by this code
    yield
    if old is None:
        del os.environ["TINYRL_CACHE"]
    else:
        os.environ["TINYRL_CACHE"] = old


def planned_bytes(phase: str) -> int:
    """The plan's tensor bytes for the phase at PLANNED_ROWS rows of WIDTH (no CUDA allocator
    headroom: the CPU has no caching allocator; doctor compares the same quantity)."""
    parts = sim.simulate_phase(TINY, phase, PLANNED_ROWS, WIDTH, **COMMON)
    return parts["peak"] - parts["allocator"]


def tracked_bytes(models, opts, step, batch) -> int:
    """Live tensor bytes at the peak of one real micro-step, the tracker counting as in doctor."""
    tracker = _totals_tracker()
    tracker.track_external(*sim.all_modules(models), *opts.values(), *sim.batch_tensors(batch))
    with tracker:
        tracker.mark("step")
        sim.run_phase(models, opts, step, batch)
    sim.warm_start(models, {}, step.phase)  # the phase's grads back, as for the next micro-batch
    return tracker.finish()["step"]["total"]


def mixed_short_rows(n: int, seed: int) -> list[tuple[int, int]]:
    """(prompt, response) real tokens per row: short and mixed, as a step's rows are."""
    g = torch.Generator().manual_seed(seed)
    return [(int(p), int(r)) for p, r in zip(torch.randint(8, 48, (n,), generator=g),
                                             torch.randint(1, 64, (n,), generator=g))]


@pytest.mark.parametrize("phase", ["forward", "actor_update", "critic_update"])
def test_no_packed_micro_batch_the_trainer_forms_exceeds_the_plan(phase, trace_cache):
    planned = planned_bytes(phase)
    step = sim.Step(phase, PLANNED_ROWS, WIDTH, **{k: v for k, v in COMMON.items()})
    models = sim.build_models(TINY, step, device="cpu")
    assert models.cfg.padding_free  # the trainer's default layout: packed
    opts = sim.make_optimizers(models)
    sim.warm_start(models, opts, phase)
    keeper = BudgetKeeper({phase: BUDGET}, row_width=WIDTH)  # as trainer.py builds it
    rows = mixed_short_rows(64, seed=0)
    mini = sim.make_inputs(sim.Step(phase, len(rows), WIDTH, RESPONSE, rows=tuple(rows)), TINY["vocab_size"])
    slices = keeper.slices(phase, len(rows), WIDTH, models.row_tokens(mini))
    assert sum(s.stop - s.start for s in slices) == len(rows)
    seen = []
    for s in slices:
        got = tracked_bytes(models, opts, step, mini.rows(s))
        seen.append((s.stop - s.start, got))
        assert got <= planned, f"{s.stop - s.start} rows: tracked {got} > planned {planned} bytes ({seen})"
    # The bound is not vacuous, and the plan is the worst case: PLANNED_ROWS rows with every token
    # real (the most a packed micro-batch at the cap can hold) run at about the planned bytes.
    full = sim.make_inputs(sim.Step(phase, PLANNED_ROWS, WIDTH, RESPONSE, rows=((PROMPT, RESPONSE),) * PLANNED_ROWS),
                           TINY["vocab_size"])
    assert int(full.attention_mask.sum()) == BUDGET
    worst = tracked_bytes(models, opts, step, full)
    assert worst == pytest.approx(planned, rel=0.15), (worst, planned, seen)


def test_a_micro_batch_of_short_rows_is_capped_at_the_planned_rows():
    keeper = BudgetKeeper({"actor_update": BUDGET}, row_width=WIDTH)
    tokens = [40] * 50                         # 6 rows fit the budget by tokens alone
    slices = keeper.slices("actor_update", 50, WIDTH, tokens)
    assert max(s.stop - s.start for s in slices) == PLANNED_ROWS
    keeper.budgets["actor_update"] //= 2       # an OOM halves the budget: the cap follows it
    assert max(s.stop - s.start for s in keeper.slices("actor_update", 50, WIDTH, tokens)) == PLANNED_ROWS // 2
    # Long rows: the token budget binds first, as before.
    assert [s.stop - s.start for s in keeper.slices("actor_update", 4, WIDTH, [WIDTH] * 4)] == [2, 2]


@pytest.mark.parametrize("phase", ["forward", "actor_update"])
def test_rows_that_share_a_prompt_are_simulated_as_the_trainer_packs_them(phase, trace_cache):
    """Step.groups: GRPO's n answers of one prompt. The simulated batch gives a group's rows their
    first row's prompt, the packed pass (the trainer's own code) computes it once, and the
    simulation then matches the real micro-step on that batch: what `tinyrl doctor` compares on
    CPU (it compared a step of 4 prompts x 8 answers with distinct prompts: 0.31x, a false alarm)."""
    groups = (0,) * 4 + (1,) * 4
    rows = tuple((40, r) for r in (5, 60, 33, 12)) + tuple((30, r) for r in (64, 2, 17, 41))
    step = sim.Step(phase, len(rows), WIDTH, RESPONSE, "lora", 16, dtype="fp32", logprob_chunk=256,
                    rows=rows, groups=groups)
    batch = sim.make_inputs(step, TINY["vocab_size"])
    models = sim.build_models(TINY, step, device="cpu")
    real_groups = models.row_groups(batch)  # what the trainer's packing finds in the batch
    assert [real_groups.index(g) for g in real_groups] == [0] * 4 + [4] * 4
    opts = sim.make_optimizers(models)
    sim.warm_start(models, opts, phase)
    measured = tracked_bytes(models, opts, step, batch)

    def simulated(shared):
        parts = sim.simulate_phase(TINY, phase, len(rows), WIDTH, rows=rows, groups=shared, **COMMON)
        return parts["peak"] - parts["allocator"]

    assert measured == pytest.approx(simulated(groups), rel=0.15)
    assert simulated(groups) < simulated(None)  # distinct prompts: more tokens computed


def test_groups_must_name_rows_of_one_prompt_length():
    rows = ((40, 5), (40, 6), (30, 7))
    sim.Step("forward", 3, WIDTH, RESPONSE, rows=rows, groups=(0, 0, 1)).validate()
    for bad in ((0, 1, 1), (0, 0)):
        with pytest.raises(TinyRLError, match="bad groups"):
            sim.Step("forward", 3, WIDTH, RESPONSE, rows=rows, groups=bad).validate()


# Short prompts, long responses: a shared prompt saves few tokens, and its layout's attention mask
# ([B, 1, Rq, Lk], sdpa's float copy of it in each attention call) costs more than they did.
SHORT_PROMPT, LONG_RESPONSE = 16, 512
SHORT_WIDTH = SHORT_PROMPT + LONG_RESPONSE
SHARING = dict(COMMON, response_len=LONG_RESPONSE)


def own_tensors(batch: Batch) -> Batch:
    return Batch(*(t.clone() for t in (batch.input_ids, batch.attention_mask, batch.position_ids,
                                       batch.response_mask, batch.policy_mask)))


@pytest.mark.parametrize("phase", ["forward", "actor_update"])
def test_a_shared_prompt_pass_is_simulated_with_its_layout(phase, trace_cache):
    """The packed layout (tinyrl.packing.Layout: index tensors and, when prompts are shared, the
    mask) is made by host index work on real tensors, which the simulation's tracker never saw:
    the simulation missed them, 5% of this forward's bytes (what `tinyrl doctor` showed on the
    tool demo: 1.05x). Now they reach the pass as fake copies, counted as the device holds them."""
    rows, groups = ((SHORT_PROMPT, LONG_RESPONSE - 12),) * 8, (0,) * 4 + (1,) * 4
    step = sim.Step(phase, len(rows), SHORT_WIDTH, LONG_RESPONSE, "lora", 16, dtype="fp32", logprob_chunk=256,
                    rows=rows, groups=groups)
    batch = sim.make_inputs(step, TINY["vocab_size"])
    models = sim.build_models(TINY, step, device="cpu")
    opts = sim.make_optimizers(models)
    sim.warm_start(models, opts, phase)
    measured = tracked_bytes(models, opts, step, batch)
    parts = sim.simulate_phase(TINY, phase, len(rows), SHORT_WIDTH, rows=rows, groups=groups, **SHARING)
    simulated = parts["peak"] - parts["allocator"]
    assert measured == pytest.approx(simulated, rel=0.005), f"measured/simulated = {measured / simulated:.4f}"


@pytest.mark.parametrize("phase", ["forward", "actor_update"])
def test_no_micro_batch_of_a_prompt_sharing_run_exceeds_the_plan(phase, trace_cache):
    """GRPO's n rows a prompt (here 4) in the trainer's own micro-batches (BudgetKeeper cutting at
    prompts) of rows with every token real: with short prompts such a micro-batch holds more than
    the same rows with distinct prompts, which was the plan's only layout. The plan of a sharing
    run (simulate_phase's shared_by) bounds every micro-batch; the distinct-prompt plan did not."""
    n, planned_rows = 4, 8
    step = sim.Step(phase, planned_rows, SHORT_WIDTH, LONG_RESPONSE, "lora", 16, dtype="fp32", logprob_chunk=256)
    models = sim.build_models(TINY, step, device="cpu")
    opts = sim.make_optimizers(models)
    sim.warm_start(models, opts, phase)
    rows = ((SHORT_PROMPT, LONG_RESPONSE),) * 24
    mini = sim.make_inputs(sim.Step(phase, len(rows), SHORT_WIDTH, LONG_RESPONSE, rows=rows,
                                    groups=tuple(i // n for i in range(len(rows)))), TINY["vocab_size"])
    keeper = BudgetKeeper({phase: planned_rows * SHORT_WIDTH}, row_width=SHORT_WIDTH)
    groups = models.row_groups(mini)
    assert len(set(groups)) == len(rows) // n  # the trainer's packing finds the shared prompts
    slices = keeper.slices(phase, len(rows), SHORT_WIDTH, models.row_tokens(mini), groups)
    # each micro-batch in tensors of its own: a view would count the whole mini-batch's ids as its own
    seen = [tracked_bytes(models, opts, step, own_tensors(mini.rows(s))) for s in slices]

    def planned(shared_by):
        parts = sim.simulate_phase(TINY, phase, planned_rows, SHORT_WIDTH, shared_by=shared_by, **SHARING)
        return parts["peak"] - parts["allocator"]

    assert max(seen) <= planned(n), (seen, planned(n))
    assert max(seen) > planned(1), (seen, planned(1))  # each prompt distinct: an under-plan here


def test_the_plan_of_a_prompt_sharing_run_prices_its_worse_layout(trace_cache):
    """build_plan passes rollout_n on (simulate_phase's shared_by): with short prompts its forward
    is priced at the shared layout, above what the same rows with distinct prompts hold."""
    from tinyrl.hardware import get_gpu
    from tinyrl.memory.plan import build_plan

    def activations(rollout_n: int) -> int:
        plan = build_plan(TINY, gpu=get_gpu("rtx4090"), prompt_len=SHORT_PROMPT, response_len=LONG_RESPONSE,
                          prompts_per_step=2, rollout_n=rollout_n, critic=False, reference=False, lora_rank=16,
                          logprob_chunk=256, micro_batch=8, engine="hf")
        return plan.phases["forward"].parts["activations"]

    shared = sim.simulate_phase(TINY, "forward", 8, SHORT_WIDTH, response_len=LONG_RESPONSE, lora_rank=16,
                                logprob_chunk=256, critic=False, reference=False, groups=sim.edge_groups(8, 4))
    assert activations(4) == shared["activations"] > activations(1)


def test_the_probe_tries_the_layout_the_plan_prices():
    """The real probes (probe-memory --device cpu / cuda) run each size they try at both layouts
    simulate_phase's shared_by prices: a size passes only when the shared one runs too."""
    from tinyrl.memory.probe import measure_peak, real_try_step

    step = sim.Step("forward", 8, SHORT_WIDTH, LONG_RESPONSE, "lora", 16, dtype="fp32", logprob_chunk=256)
    tries = {n: real_try_step(TINY, step, "cpu", n) for n in (1, 4)}
    peaks = {n: measure_peak(lambda: tries[n](8)) for n in tries}
    assert peaks[4] > peaks[1], peaks


PADDED_WIDTH, PADDED_RESPONSE = 1024, 960


@pytest.mark.parametrize("phase", ["forward", "actor_update", "critic_update"])
def test_a_padded_run_is_simulated_with_its_padded_passes(phase, trace_cache):
    """model.padding_free=false (what README tells a user of a sliding-window model to set) runs
    transformers' padded passes, whose [rows, 1, width, width] attention mask the packed passes do
    not have: the plan traced packed passes whatever the setting, and promised less than a padded
    micro-batch holds (here 1.08x in forward, 1.26x in an update). Now it traces the passes the
    run makes. One row a token short: a batch padded to its longest row, so transformers builds
    the mask (with no pad at all it may skip it, never more bytes)."""
    rows = ((PADDED_WIDTH - PADDED_RESPONSE - 1, PADDED_RESPONSE),) + ((PADDED_WIDTH - PADDED_RESPONSE,
                                                                         PADDED_RESPONSE),)
    step = sim.Step(phase, 2, PADDED_WIDTH, PADDED_RESPONSE, "lora", 16, dtype="fp32", logprob_chunk=256,
                    padding_free=False)
    models = sim.build_models(TINY, step, device="cpu")
    assert not models.cfg.padding_free
    opts = sim.make_optimizers(models)
    sim.warm_start(models, opts, phase)
    measured = tracked_bytes(models, opts, step, sim.make_inputs(replace(step, rows=rows), TINY["vocab_size"]))

    def planned(padding_free: bool) -> int:
        parts = sim.simulate_phase(TINY, phase, 2, PADDED_WIDTH, padding_free=padding_free,
                                   **dict(COMMON, response_len=PADDED_RESPONSE))
        return parts["peak"] - parts["allocator"]

    assert measured == pytest.approx(planned(False), rel=0.005), f"measured/planned = {measured / planned(False):.4f}"
    assert measured > 1.05 * planned(True)  # the packed passes' plan: an under-plan for this run


def test_a_padded_pass_is_priced_at_one_layout():
    """Rows sharing a prompt change a packed pass's layout, never a padded one's (every row
    computes its prompt): a padded step is traced once, not twice."""
    step = sim.Step("forward", 8, SHORT_WIDTH, LONG_RESPONSE)
    assert len(sim.priced_layouts(step, 4)) == 2
    assert sim.priced_layouts(replace(step, padding_free=False), 4) == [replace(step, padding_free=False)]
