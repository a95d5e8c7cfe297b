"""preflight(): what `train` checks before loading a model — the torch build against the card,
free disk for checkpoints and data, and the card's memory plan (which fills the settings left
at 0). A CUDA card is faked by replacing detect_gpu; everything else is real."""

from __future__ import annotations

import json
import sys

import pytest
import torch

import tinyrl  # noqa: F401  (before transformers/peft)
from tinyrl import preflight as pf
from tinyrl.cli import main
from tinyrl.config import load_config
from tinyrl.errors import TinyRLError
from tinyrl.hardware import GPUS
from tinyrl.memory import from_config as mp
from tinyrl.memory import simulate as sim
from tinyrl.model_specs import load_spec


pytestmark = pytest.mark.usefixtures("plan_cache")


def on_card(monkeypatch, name: str, archs: list[str]) -> None:
    """This machine 'has' the card `name` and a torch built for `archs`."""
    monkeypatch.setattr(pf, "detect_gpu", lambda: GPUS[name])
    monkeypatch.setattr(torch.cuda, "get_arch_list", lambda: archs)


def with_vllm(monkeypatch) -> None:
    """This machine 'has' vLLM installed. The plan tests price a run that rolls out with vLLM
    (its weights and KV cache in the plan, its settings filled from it); whether the package is
    here is check_engine_installed's business (test_a_vllm_run_without_vllm_stops_...), and on a
    CUDA machine without vLLM the preflight stopped there, before any plan (the H100 run of
    2026-11-27). preflight only asks find_spec; nothing here imports vLLM."""
    import importlib.machinery
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: importlib.machinery.ModuleSpec(name, None)
                        if name == "vllm" else real(name, *a))


HAVE_DATA = "data.train_path=data/countdown/test.parquet"  # shipped: nothing to generate


def tiny(*sets: str):
    return load_config("countdown-tiny", [f"data.train_path={sys.prefix}/no-such-dir/train.parquet", *sets])


def test_cpu_run_checks_disk_and_says_plans_are_for_cards(tmp_path):
    notes = pf.preflight(tiny(), tmp_path / "run").notes
    assert any(n.startswith("disk:") for n in notes)
    assert any("memory planning applies to CUDA cards" in n and "4096" in n for n in notes)
    assert not (tmp_path / "run").exists()  # nothing written
    # a budget left at 0 is said as the number the trainer takes (it read "critic default tokens")
    ppo = pf.preflight(tiny("critic.micro_batch_tokens=0"), tmp_path / "run").notes
    assert any("(actor 4096, critic 8192 tokens)" in n for n in ppo), ppo


def test_too_little_disk_stops_the_run_with_the_numbers(monkeypatch, tmp_path):
    monkeypatch.setattr(pf, "free_disk_bytes", lambda path: 10 * 2**20)
    with pytest.raises(TinyRLError) as caught:
        pf.preflight(load_config("countdown-4090", ["trainer.device=cpu", HAVE_DATA]), tmp_path / "run")
    message = caught.value.message
    need = 2 * pf.checkpoint_bytes(load_config("countdown-4090"), cuda=False) + pf.RUN_LOGS_BYTES
    from tinyrl.checkpoint import human_bytes

    assert f"needs {human_bytes(need)}" in message and "10.0 MiB is free" in message  # not "0.01 GiB"
    assert "2 checkpoints of 2.8" in message and "64.0 MiB for logs" in message  # 3B, rank-64 adapters x2 + Adam
    assert "--out" in caught.value.hint
    assert not (tmp_path / "run").exists()


def test_checkpoint_estimate_matches_the_tensors_a_checkpoint_holds():
    """The estimate against the real tensors of tinyrl's roles (tiny model, LoRA, fp32): both
    adapters + value head, and the Adam state of both optimizers after a step."""
    cfg = tiny()
    spec = load_spec(cfg.model.name)
    step = sim.Step("actor_update", 1, 64, 32, "lora", cfg.model.lora_rank, tuple(cfg.model.lora_targets),
                    dtype="fp32")
    models = sim.build_models(spec, step, device="cpu")
    opts = sim.make_optimizers(models)
    sim.warm_start(models, opts, "actor_update")
    real = sum(p.numel() * 4 for n, p in models.actor.named_parameters() if "lora_" in n)
    real += sum(p.numel() * 4 for p in models.value_head.parameters())
    real += sum(v.numel() * v.element_size() for o in opts.values() for s in o.state.values()
                for k, v in s.items() if k != "step")
    estimate = (pf.checkpoint_bytes(cfg, cuda=False) - 2**20) / 1.05
    assert estimate == pytest.approx(real, rel=0.01)


def test_a_torch_build_without_the_cards_arch_fails_early(monkeypatch, tmp_path):
    on_card(monkeypatch, "rtx5090", ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"])
    touched = []
    monkeypatch.setattr(pf, "free_disk_bytes", lambda path: touched.append(path) or 10**15)
    with pytest.raises(TinyRLError) as caught:
        pf.preflight(tiny("trainer.device=cuda"), tmp_path / "run")
    assert "sm_120" in caught.value.message and "rtx5090" in caught.value.message
    assert touched == []  # the card is checked before anything else


def test_a_plan_that_does_not_fit_stops_the_run_naming_the_phase(monkeypatch, tmp_path):
    """Qwen2.5-7B LoRA on a 4090 without NF4: two bf16 copies (trainer and vLLM) in the rollout."""
    on_card(monkeypatch, "rtx4090", ["sm_80", "sm_86", "sm_89", "sm_90"])
    with_vllm(monkeypatch)  # the preset's engine is auto: vLLM on a card
    monkeypatch.setattr(pf, "free_disk_bytes", lambda path: 10**15)
    cfg = load_config("countdown-4090", ["model.name=Qwen/Qwen2.5-7B"])
    with pytest.raises(TinyRLError) as caught:
        pf.preflight(cfg, tmp_path / "run")
    message = " ".join(caught.value.message.split())
    assert "does not fit" in message and "rollout needs" in message and "GiB over the budget" in message
    assert "model.quantize=nf4" in message
    assert cfg.actor.micro_batch_tokens == 0  # nothing applied from a plan that does not fit


def test_a_cached_measured_plan_that_does_not_fit_says_it_was_measured_and_how_to_measure_again(monkeypatch,
                                                                                                  tmp_path):
    """probe-memory's real passes run under whatever other processes hold on the card: a plan
    measured beside a notebook does not fit, is cached (on an idle card that verdict is the truth
    and saves minutes of loading), and train refused on it after the notebook ended, telling only
    to change settings. The refusal now says the plan was measured, when, and how to measure again."""
    import copy
    import time

    from tinyrl.memory.plan import PhasePlan

    on_card(monkeypatch, "rtx4090", ["sm_89"])
    with_vllm(monkeypatch)
    cfg = tiny("trainer.device=cuda", "rollout.engine=vllm", "rollout.max_response_length=40")  # a plan of its own
    planned = mp.plan_for_config(cfg, GPUS["rtx4090"])
    measured = copy.deepcopy(planned)  # as cuda_probe returns it when not even one sequence ran
    update = measured.phases["actor_update"]
    measured.phases["actor_update"] = PhasePlan(update.peak, update.parts, 0, 0, fits=False)
    measured.fits, measured.simulated = False, False
    path = mp.save_plan(measured, mp.plan_path(cfg, GPUS["rtx4090"]))
    with pytest.raises(TinyRLError) as caught:
        pf.preflight(cfg, tmp_path / "run")
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(path.stat().st_mtime))
    said = " ".join(caught.value.message.split())
    assert f"(MEASURED by `tinyrl probe-memory` on this card at {when}: memory that other processes held" in said, said
    # the measured phase kept the simulated bytes, under the budget: it read "0.00 GiB over the budget"
    assert "actor_update did not fit the budget of 21.59 GiB when run on the card, though simulated at " in said
    assert " GiB (not even one sequence per micro-batch fits)" in said and "0.00 GiB over" not in said, said
    assert "try: lower rollout.max_response_length (now 40), e.g. 20;" in said  # it said "e.g. 64", a rise
    hint = " ".join(caught.value.hint.split())
    assert hint.startswith("if the card has more memory free now than then") and \
        f"`tinyrl probe-memory --preset countdown-tiny` with this run's --set options (it replaces {path}); or " \
        "change the settings above" in hint, hint
    from tinyrl.memory.render import render_plan  # probe-memory's own report of that plan says it too

    report = " ".join(" ".join(str(part) for part in render_plan(cfg, measured, path, None, 1.0)
                               if hasattr(part, "plain")).split())
    assert "or free the memory other processes hold on the card, which counted against this measurement" in report
    # a simulated plan that does not fit depends on nothing but its cache key: said as before
    planned.phases["actor_update"], planned.fits = PhasePlan(update.peak, update.parts, 0, 0, fits=False), False
    mp.save_plan(planned, path)
    with pytest.raises(TinyRLError) as caught:
        pf.preflight(cfg, tmp_path / "run")
    assert "MEASURED" not in caught.value.message and caught.value.hint.startswith("change the settings above")


def test_on_a_card_the_plan_fills_only_what_was_left_at_0(monkeypatch, tmp_path):
    on_card(monkeypatch, "rtx4090", ["sm_80", "sm_86", "sm_89", "sm_90"])
    with_vllm(monkeypatch)
    cfg = tiny("trainer.device=cuda", "rollout.engine=vllm", "actor.micro_batch_tokens=0",
               "critic.micro_batch_tokens=1000", "rollout.vllm.gpu_memory_utilization=0.3")
    notes = pf.preflight(cfg, tmp_path / "run").notes
    plan = mp.read_plan(mp.plan_path(cfg, GPUS["rtx4090"]))
    assert plan is not None and plan.fits
    assert any("SIMULATED now" in n for n in notes)
    assert cfg.actor.micro_batch_tokens == plan.phases["actor_update"].token_budget > 0
    assert cfg.critic.micro_batch_tokens == 1000
    assert cfg.rollout.vllm.gpu_memory_utilization == 0.3
    assert cfg.rollout.vllm.max_num_seqs == plan.vllm_max_num_seqs > 0
    again = tiny("trainer.device=cuda", "rollout.engine=vllm", "actor.micro_batch_tokens=0")
    checked = pf.preflight(again, tmp_path / "run")
    assert any(n.startswith("memory plan from") for n in checked.notes)
    # the run keeps the plan it trains with (report and dashboard hold the measured peaks against
    # it), written by the command once the run has started: preflight writes nothing
    assert not (tmp_path / "run").exists()
    from tinyrl.memory.versus import run_plan_record

    kept = run_plan_record(checked.run_plan)["phases"]["actor_update"]
    parts = plan.phases["actor_update"].parts
    assert kept["micro_batch"] == plan.phases["actor_update"].micro_batch
    assert kept["planned_allocated_bytes"] == (plan.phases["actor_update"].peak - parts["cuda_context"]
                                               - parts["vllm_asleep"] - parts["allocator"])


def test_a_start_on_a_card_refused_at_an_input_check_leaves_no_run_directory(monkeypatch, tmp_path, capsys,
                                                                              countdown_train):
    """On a card, preflight wrote RUN_DIR/memory_plan.json before the trainer's input checks, so a
    start refused there (prompts longer than data.max_prompt_length) left the directory with the
    plan and the lock in it. The plan is written once the run has started."""
    on_card(monkeypatch, "rtx4090", ["sm_89"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the trainer's device: refused before any use
    run = tmp_path / "runs" / "first"
    sets = ["trainer.device=cuda", "rollout.engine=hf", f"data.train_path={countdown_train(64)}"]

    def train(*more: str) -> int:
        args = [a for s in (*sets, *more) for a in ("--set", s)]
        monkeypatch.setattr(sys, "argv", ["tinyrl", "train", "--preset", "countdown-tiny", "--out", str(run),
                                          "--no-dashboard", "--max-steps", "1", *args])
        with pytest.raises(SystemExit) as exited:
            main()
        return exited.value.code

    code = train("data.max_prompt_length=8")
    err = " ".join(capsys.readouterr().err.replace("│", " ").split())  # the error panel's borders out
    assert code == 2 and "longer than data.max_prompt_length = 8 tokens" in err, err
    assert "checking the card, the disk and the memory plan" in err  # it got past the plan
    assert not (tmp_path / "runs").exists()
    # the same start with prompts that fit: the run keeps the plan it trains with (report and the
    # dashboard hold its measured peaks against it). The trainer's own device is the CPU here.
    import tinyrl.setup

    monkeypatch.setattr(tinyrl.setup, "pick_device", lambda name: torch.device("cpu"))
    assert train() in (0, None), capsys.readouterr().err[-3000:]
    from tinyrl.memory.versus import read_run_plan

    kept = read_run_plan(run)
    planned = mp.read_plan(mp.plan_path(load_config("countdown-tiny", sets), GPUS["rtx4090"]))
    assert kept is not None and kept["gpu"] == "rtx4090", kept
    assert kept["phases"]["actor_update"]["micro_batch"] == planned.phases["actor_update"].micro_batch


def test_apply_plan_sets_zeros_keeps_the_rest_and_warns_when_above_the_plan():
    cfg = tiny("rollout.engine=vllm", "actor.micro_batch_tokens=0", "critic.micro_batch_tokens=10000000")
    plan = mp.plan_for_config(cfg, GPUS["rtx4090"])
    lines = mp.apply_plan(cfg, plan)
    assert cfg.actor.micro_batch_tokens == plan.phases["actor_update"].token_budget
    assert cfg.critic.micro_batch_tokens == 10_000_000
    assert cfg.rollout.vllm.gpu_memory_utilization == plan.vllm_gpu_memory_utilization
    assert any(line.startswith("critic.micro_batch_tokens = 10000000") and "kept" in line for line in lines)
    assert any(line.startswith("actor.micro_batch_tokens = ") and "from the memory plan" in line for line in lines)
    hf = tiny("actor.micro_batch_tokens=0")  # the transformers engine has no vLLM settings
    mp.apply_plan(hf, mp.plan_for_config(hf, GPUS["rtx4090"]))
    assert hf.rollout.vllm.gpu_memory_utilization == 0 and hf.rollout.vllm.max_num_seqs == 0


def test_train_reads_the_plan_probe_memory_wrote(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(sys, "argv", ["tinyrl", "probe-memory", "--preset", "countdown-tiny", "--gpu", "rtx4090",
                                      "--simulate", "--json", "--set", "rollout.engine=vllm",
                                      "--set", "actor.micro_batch_tokens=0", "--budget", "2GiB"])
    with pytest.raises(SystemExit) as exited:
        main()
    assert exited.value.code in (0, None)
    written = json.loads(capsys.readouterr().out)
    on_card(monkeypatch, "rtx4090", ["sm_89"])
    with_vllm(monkeypatch)
    cfg = tiny("trainer.device=cuda", "rollout.engine=vllm", "actor.micro_batch_tokens=0")
    notes = pf.preflight(cfg, tmp_path / "run").notes
    assert f"memory plan from {written['train_reads']}" in notes
    assert mp.read_plan(mp.plan_path(cfg, GPUS["rtx4090"])).budget_bytes == 2 * 2**30
    assert cfg.actor.micro_batch_tokens == written["phases"]["actor_update"]["token_budget"]
    assert cfg.rollout.vllm.gpu_memory_utilization == written["vllm"]["gpu_memory_utilization"]


def test_an_sft_preset_on_a_card_takes_its_micro_batches_from_the_sft_plan(monkeypatch, tmp_path):
    """`tinyrl sft` ran without a plan ("it models RL's phases"), and probe-memory of an SFT preset
    planned an RL step: vLLM, a critic, rollout lengths instead of sft.max_length. The SFT plan
    has the actor's phases only, priced at whole rows of sft.max_length, and fills what was 0."""
    on_card(monkeypatch, "rtx4090", ["sm_80", "sm_86", "sm_89", "sm_90"])
    cfg = load_config("countdown-tiny-sft", ["trainer.device=cuda", "actor.micro_batch_tokens=0"])
    notes = pf.preflight(cfg, tmp_path / "run").notes
    plan = mp.read_plan(mp.plan_path(cfg, GPUS["rtx4090"]))
    assert list(plan.phases) == ["forward", "actor_update"] and plan.fits
    assert plan.vllm_gpu_memory_utilization == 0 and plan.vllm_max_num_seqs == 0
    assert all("vllm" not in part for ph in plan.phases.values() for part in ph.parts)
    update = plan.phases["actor_update"]
    assert update.micro_batch == cfg.trainer.train_batch_size  # the tiny model: the whole batch fits a 4090
    assert cfg.actor.micro_batch_tokens == update.token_budget == update.micro_batch * cfg.sft.max_length
    assert cfg.actor.forward_micro_batch_tokens == plan.phases["forward"].token_budget
    assert any("SIMULATED now" in n for n in notes) and any(n.startswith("SFT: the actor alone") for n in plan.notes)
    rl = load_config("countdown-tiny", ["trainer.device=cuda"])  # the same model as an RL step: other phases
    assert "rollout" in mp.plan_for_config(rl, GPUS["rtx4090"]).phases


def test_a_vllm_run_without_vllm_stops_before_any_model_loads(monkeypatch, tmp_path):
    """`--set rollout.engine=vllm` without the package: said by preflight (before init_from's merge
    and the model load, which took a minute on the demo and left RUN_DIR/init_model behind)."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(TinyRLError, match="needs vLLM") as err:
        pf.preflight(tiny("rollout.engine=vllm"), tmp_path / "run")
    assert "rollout.engine = 'hf'" in err.value.hint
    assert not (tmp_path / "run").exists()
    pf.preflight(tiny("rollout.engine=hf"), tmp_path / "run")  # the hf engine needs nothing more
    pf.preflight(tiny("rollout.engine=auto"), tmp_path / "run")  # auto on a CPU is hf


@pytest.mark.parametrize("preset, engine, cuda, vllm", [
    ("countdown-tiny", "vllm", False, True), ("countdown-tiny", "auto", True, True),
    ("countdown-tiny", "auto", False, False), ("countdown-tiny", "hf", True, False),
    ("countdown-tiny-sft", "vllm", True, False), ("countdown-tiny-sft", "auto", True, False)])
def test_only_an_rl_run_rolls_out_with_vllm_and_auto_means_it_on_a_card(preset, engine, cuda, vllm):
    """One rule for preflight's install check and the doctor's vLLM row: `train` with vllm, or
    auto on a card. An SFT step rolls nothing out, whatever rollout.engine says (the doctor
    failed an SFT preset's vLLM row on an H100 without vLLM)."""
    from tinyrl.rollout.factory import rolls_out_with_vllm

    assert rolls_out_with_vllm(load_config(preset, [f"rollout.engine={engine}"]), cuda) is vllm
