"""`tinyrl probe-memory` through the real entry point: the 3B and 0.5B headline plans on a 4090
(simulated), the CPU twin of the real probe meeting real allocator failures, the plan file
train reads, and bad input (exit 2, one screen)."""

from __future__ import annotations

import json
import sys

import pytest

import tinyrl  # noqa: F401  (before transformers/peft)
from tinyrl.cli import main
from tinyrl.errors import TinyRLError
from tinyrl.hardware import GiB
from tinyrl.memory.plan import MemoryPlan

CARD_4090 = 24 * GiB


pytestmark = pytest.mark.usefixtures("plan_cache")


def cli(monkeypatch, capsys, *args):
    """(exit code, stdout, stderr) of `tinyrl ARGS`, run in-process; wide, so lines do not wrap."""
    monkeypatch.setattr(sys, "argv", ["tinyrl", *args])
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as exited:
        main()
    captured = capsys.readouterr()
    return exited.value.code or 0, captured.out, captured.err


def probe_json(monkeypatch, capsys, *args, fits: bool = True) -> dict:
    """probe-memory's --json; its exit code is 0 for a plan that fits, 1 for one that does not."""
    code, stdout, stderr = cli(monkeypatch, capsys, "probe-memory", *args, "--json")
    assert code == (0 if fits else 1), stderr
    return json.loads(stdout)


def check_consistent(result: dict) -> None:
    """Every phase's parts and categories add up to its peak; the file holds the same plan."""
    for name, ph in result["phases"].items():
        assert sum(ph["parts"].values()) == ph["peak_bytes"], name
        assert sum(ph["categories"].values()) == ph["peak_bytes"], name
        assert ph["fits"] == (ph["peak_bytes"] <= result["budget_bytes"] and
                              (name == "rollout" or ph["micro_batch"] >= 1)), name
    saved = MemoryPlan.from_json(open(result["plan_file"]).read())
    assert saved.fits == result["fits"]
    assert {k: v.peak for k, v in saved.phases.items()} == \
        {k: v["peak_bytes"] for k, v in result["phases"].items()}


def test_3b_lora_ppo_fits_a_4090_in_every_phase(monkeypatch, capsys):
    r = probe_json(monkeypatch, capsys, "--preset", "countdown-4090", "--gpu", "rtx4090", "--simulate")
    assert r["fits"] is True and r["simulated"] is True and r["gpu"] == "rtx4090"
    assert set(r["phases"]) == {"rollout", "forward", "actor_update", "critic_update"}
    for name, ph in r["phases"].items():
        assert ph["peak_bytes"] <= 0.9 * CARD_4090, name
    for name in ("forward", "actor_update", "critic_update"):
        ph = r["phases"][name]
        assert ph["micro_batch"] >= 1
        assert ph["token_budget"] == ph["micro_batch"] * (256 + 1024)
    assert 0 < r["vllm"]["gpu_memory_utilization"] < 0.9
    assert 1 <= r["vllm"]["max_num_seqs"] <= 256
    assert r["plan_file"] == r["train_reads"]
    check_consistent(r)
    assert "actor.micro_batch_tokens = " + str(r["phases"]["actor_update"]["token_budget"]) in "\n".join(r["settings"])


def test_05b_full_ppo_plan_and_an_18_gib_budget(monkeypatch, capsys):
    """The verl-run settings (0.5B, full actor + critic + reference): the preset caps every phase
    at 18 GiB (trainer.memory_budget_gib; fp32 Adam moments for two full models take 7.4 GiB;
    the verl run peaked at 23.2 GB). With the card's own
    budget the planner takes micro-batches up to the mini-batch instead."""
    capped = probe_json(monkeypatch, capsys, "--preset", "countdown-0.5b-4090", "--gpu", "rtx4090", "--simulate")
    assert capped["fits"] and capped["budget_bytes"] == 18 * GiB
    for name, ph in capped["phases"].items():
        assert ph["peak_bytes"] <= 18 * GiB, name
    assert capped["vllm"]["max_num_seqs"] == 32  # the whole step's sequences at once
    check_consistent(capped)
    whole = probe_json(monkeypatch, capsys, "--preset", "countdown-0.5b-4090", "--gpu", "rtx4090", "--simulate",
                       "--set", "trainer.memory_budget_gib=0")
    assert whole["fits"]
    assert all(ph["peak_bytes"] <= 0.9 * CARD_4090 for ph in whole["phases"].values())
    assert whole["phases"]["actor_update"]["micro_batch"] == 16  # capped by 16 prompts x n=1
    assert whole["phases"]["actor_update"]["micro_batch"] >= capped["phases"]["actor_update"]["micro_batch"]


def test_retool_sft_plans_its_16k_conversations_not_an_rl_step(monkeypatch, capsys):
    """retool-sft-4090 (1.5B LoRA, conversations up to 16,384 tokens) was planned as an RL step at
    256 + 1,024 tokens with vLLM and a critic, and said "`tinyrl train` reads it"."""
    r = probe_json(monkeypatch, capsys, "--preset", "retool-sft-4090", "--gpu", "rtx4090", "--simulate")
    assert r["fits"] and set(r["phases"]) == {"forward", "actor_update"}
    assert r["vllm"]["gpu_memory_utilization"] == 0 and r["vllm"]["max_num_seqs"] == 0
    update = r["phases"]["actor_update"]
    assert update["micro_batch"] >= 1 and update["token_budget"] == update["micro_batch"] * 16384
    assert update["categories"]["gradients"] > 0 and update["categories"]["vLLM KV cache"] == 0
    check_consistent(r)
    code, stdout, _ = cli(monkeypatch, capsys, "probe-memory", "--preset", "retool-sft-4090", "--gpu", "rtx4090",
                          "--simulate")
    assert code == 0 and "settings sft will use" in stdout and "`tinyrl sft --preset retool-sft-4090`" in stdout
    assert "rollout (vLLM)" not in stdout and "critic" not in stdout and "no rollout engine" in stdout


def test_text_report_says_simulated_and_where_the_plan_is(monkeypatch, capsys, tmp_path):
    out_file = tmp_path / "plan.json"
    code, stdout, stderr = cli(monkeypatch, capsys, "probe-memory", "--preset", "countdown-4090",
                               "--gpu", "rtx4090", "--simulate", "--out", str(out_file))
    assert code == 0
    # piped, where no spinner is drawn, the wait is said in a line (it was silent for ~55 s on a first plan)
    assert stderr.startswith("planning Qwen/Qwen2.5-3B on rtx4090 (fake tensors) ...")
    assert "SIMULATED (fake-tensor trace on CPU, no GPU used)" in stdout
    for words in ("base weights", "optimizer state", "log-prob chunk", "vLLM KV cache", "runtime context",
                  "micro-batch", "gpu_memory_utilization", "FITS"):
        assert words in stdout, words
    assert str(out_file) in stdout.replace("\n", "")
    assert MemoryPlan.from_json(out_file.read_text()).fits


def test_a_plan_that_does_not_fit_names_the_phase_and_what_to_change(monkeypatch, capsys, tmp_path):
    """Qwen2.5-7B LoRA on a 4090 without NF4: vLLM's copy of the bf16 weights beside the
    trainer's leaves no room in the rollout phase. It exited 0 (scripts could not tell), and its
    first advice, halving the response length, cannot close a gap the weights alone open."""
    code, stdout, _ = cli(monkeypatch, capsys, "probe-memory", "--preset", "countdown-4090", "--gpu", "rtx4090",
                          "--simulate", "--set", "model.name=Qwen/Qwen2.5-7B")
    assert code == 1  # a verdict, not bad input (2): train is what refuses to start
    text = " ".join(stdout.split())
    assert "DOES NOT FIT" in text
    assert "rollout needs" in text and "GiB over the budget" in text
    # 14.19 (trainer's base) + 1.20 + 2.41 (adapters, Adam) + 14.19 (vLLM's copy) + 0.75 (context)
    # + 0.06 (cuBLAS workspaces)
    assert "rollout holds 32.79 GiB before any token" in text and "shorter sequences cannot make it fit" in text
    assert "- try: model.quantize=nf4" in text and "a smaller model.name (now Qwen/Qwen2.5-7B)" in text
    assert "not enough alone (they shrink only what grows with tokens): lower rollout.max_response_length" in text
    assert text.index("model.quantize=nf4") < text.index("rollout.max_response_length")
    # train refuses this plan: no list of settings it "will use", and the way on said
    assert "settings train will use" not in text and "train will not start on this plan" in text
    assert "train sets:" not in text and "reads it" not in text
    assert "with the same --set options stops on this plan" in text
    # the log-prob chunk tip only where a chunk in effect exceeds 512 tokens: a 0.5B's 256-token
    # responses hold min(1024, 256) per row, so "logprob_chunk=512" saved nothing (it was offered)
    #
    # `--budget 12GiB` that does not fit replaced the plan train read with its own: train and
    # estimate-cost then said DOES NOT FIT of the preset. Its plan is not cached (--out still
    # writes it); one that fits still is (test_a_budget_above_the_card_...).
    from tinyrl.config import load_config
    from tinyrl.hardware import GPUS
    from tinyrl.memory import from_config as mp

    for preset, offered in (("countdown-0.5b-4090", False), ("countdown-4090", True)):
        cfg = load_config(preset, planning=True)
        train_reads = mp.plan_path(cfg, GPUS["rtx4090"])
        mp.save_plan(mp.plan_for_config(cfg, GPUS["rtx4090"], simulate=False), train_reads)  # a plan that fits
        before = train_reads.read_bytes()
        assert mp.read_plan(train_reads).fits
        asked = tmp_path / f"{preset}-12gib.json"
        code, stdout, _ = cli(monkeypatch, capsys, "probe-memory", "--preset", preset, "--gpu", "rtx4090",
                              "--simulate", "--budget", "12GiB", "--out", str(asked))
        said = " ".join(stdout.split())
        assert code == 1 and "DOES NOT FIT" in said and ("model.logprob_chunk=512" in said) == offered, preset
        assert train_reads.read_bytes() == before, preset
        assert f"so it was NOT written to {train_reads}" in said and "the plan there is left as it was" in said
        assert f"plan written to {asked}" in said and not mp.read_plan(asked).fits
        if preset == "countdown-0.5b-4090":  # fp32 Adam moments of two full models (+ cuBLAS workspaces): over 12 GiB
            assert "actor_update holds 12.36 GiB before any token" in said and "- try: model.finetune=lora" in said
    code, stdout, _ = cli(monkeypatch, capsys, "probe-memory", "--preset", "countdown-4090", "--gpu", "rtx4090",
                          "--simulate", "--budget", "12GiB", "--json")
    result = json.loads(stdout)
    assert code == 1 and result["fits"] is False and result["written_for_train"] is False
    assert result["plan_file"] is None and result["train_reads"] == str(train_reads)
    assert train_reads.read_bytes() == before


def test_cpu_twin_finds_a_micro_batch_with_real_allocator_evidence(monkeypatch, capsys):
    """countdown-tiny's actor update, real passes in a child that may grow by 64 MiB: the
    largest micro-batch runs again, and twice it fails in torch's CPU allocator.

    Margin (torch 2.13, 4 searches under 64 MiB, 2 under 52 MiB): the search ends on 7 or 8 (6
    under 52 MiB) of the 16 sequences searched. The size it ends on sits right at the ceiling,
    and in 1 of the 4 it then failed on every rerun (8 ran once with the address space 4 MiB above
    the baseline, then failed six times at +5 MiB: failed tries leave heap behind). The probe now
    measures that size again and steps down until one reruns (search_with_proof), so `reruns`
    holds every time; 2B failed in every search."""
    from tinyrl.memory import from_config as mp

    r = probe_json(monkeypatch, capsys, "--preset", "countdown-tiny", "--device", "cpu", "--memory-limit", "64MiB")
    assert r["device"] == "cpu" and r["simulated"] is False
    assert 1 <= r["max_micro_batch"] < r["searched_up_to"]  # the ceiling, not the batch, decided
    assert r["token_budget"] == r["max_micro_batch"] * (256 + 48)
    assert r["reruns"] is True
    assert "DefaultCPUAllocator: can't allocate memory" in r["double_error"]
    # The text report of the same result (the probe itself ran above; a second one takes a minute)
    measured = []
    monkeypatch.setattr(mp, "cpu_probe", lambda cfg, limit: measured.append(limit) or r)
    code, stdout, _ = cli(monkeypatch, capsys, "probe-memory", "--preset", "countdown-tiny", "--device", "cpu",
                          "--memory-limit", "64MiB")
    assert code == 0 and measured == [64 * 2**20]
    assert "CPU twin of the GPU probe" in stdout and "RAM, not VRAM" in stdout
    assert "failed in the allocator" in stdout


def test_the_cpu_twin_tries_the_layouts_of_a_prompt_sharing_run(monkeypatch):
    """cpu_probe hands the child the rows that share each prompt (rollout.n), so its try_step runs
    both layouts the plan prices (test_memory_packed_plan: the try itself)."""
    from tinyrl.config import load_config
    from tinyrl.memory import from_config as mp
    from tinyrl.memory import probe

    handed = []

    def child(fn, limit, *args, prepare=None, **kwargs):
        handed.append((prepare, args[-1]))
        return {"max_micro_batch": 3, "reruns": True, "stepped_down": False, "double_error": None,
                "seconds": 0.0, "rlimit_as_bytes": limit}

    monkeypatch.setattr(probe, "run_under_memory_limit", child)
    for preset in ("countdown-tiny", "math-tiny"):  # PPO, one answer a prompt; GRPO, 4
        mp.cpu_probe(load_config(preset), 64 * 2**20)
    assert handed == [(mp._cpu_twin_prepare, 1), (mp._cpu_twin_prepare, 4)]


@pytest.mark.parametrize("args, words", [
    (["--preset", "countdown-4090", "--gpu", "rtx4909", "--simulate"], "unknown GPU"),
    (["--preset", "countdown-tiny", "--device", "cpu", "--memory-limit", "3 potatoes"], "cannot read the size"),
    (["--preset", "countdown-tiny", "--device", "cpu"], "needs --memory-limit"),
    (["--preset", "countdown-tiny", "--memory-limit", "1GiB"], "--device cpu"),
    (["--preset", "countdown-4090", "--gpu", "auto"], "--gpu rtx4090 --simulate"),
    (["--preset", "countdown-4090", "--device", "cuda"], "--gpu rtx4090 --simulate"),
    (["--preset", "countdown-4090", "--device", "cpu", "--memory-limit", "3GiB"], "--simulate"),
    # the CPU twin writes no plan: --out exited 0 and wrote nothing
    (["--preset", "countdown-tiny", "--device", "cpu", "--memory-limit", "64MiB", "--out", "twin-plan.json"],
     "the CPU twin (--device cpu) makes none"),
])
def test_bad_input_is_one_screen_and_exit_2(monkeypatch, capsys, args, words):
    # Bad input on a machine without a card: on a CUDA machine `--gpu auto` and `--device cuda`
    # are good input, so the card is hidden here.
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, stdout, stderr = cli(monkeypatch, capsys, "probe-memory", *args)
    assert code == 2
    assert words in " ".join(stderr.split())
    assert "Traceback" not in stderr and stdout == ""
    # a bad --memory-limit came after "real passes under a 3 potatoes ceiling ...": said alone now
    assert words != "cannot read the size" or "real passes under" not in stderr


def test_a_budget_above_the_card_is_refused_and_no_plan_is_left_for_train(monkeypatch, capsys):
    """`--budget 30GiB` on a 24 GB card planned every phase under 30 GiB, printed FITS beside
    negative margins, and cached the plan, whose micro-batches `train` then took onto the card."""
    from tinyrl.config import load_config
    from tinyrl.hardware import GPUS
    from tinyrl.memory import from_config as mp

    train_reads = mp.plan_path(load_config("countdown-4090"), GPUS["rtx4090"])
    before = train_reads.read_bytes() if train_reads.exists() else None
    code, stdout, stderr = cli(monkeypatch, capsys, "probe-memory", "--preset", "countdown-4090", "--gpu", "rtx4090",
                               "--simulate", "--budget", "30GiB")
    said = " ".join(stderr.split())
    assert code == 2 and stdout == "" and "Traceback" not in stderr
    assert "30.00 GiB" in said and "rtx4090's 23.99 GiB" in said and "--budget 21.59GiB" in said  # as the plan prints it
    assert (train_reads.read_bytes() if train_reads.exists() else None) == before
    code, _, _ = cli(monkeypatch, capsys, "probe-memory", "--preset", "countdown-4090", "--gpu", "rtx4090",
                     "--simulate", "--budget", "23.98GiB")  # up to the whole card is the user's choice
    assert code == 0 and mp.read_plan(train_reads).budget_bytes == int(23.98 * GiB)
    code, _, _ = cli(monkeypatch, capsys, "probe-memory", "--preset", "countdown-4090", "--gpu", "rtx4090",
                     "--simulate", "--budget", "23.99GiB")  # the size the plan prints (23.988 GiB): the whole card
    assert code == 0 and mp.read_plan(train_reads).budget_bytes == GPUS["rtx4090"].memory_bytes
    with pytest.raises(TinyRLError, match="more than the rtx4090's"):  # train's preflight plans the same way
        mp.plan_for_config(load_config("countdown-4090", ["trainer.memory_budget_gib=25"]), GPUS["rtx4090"])


def fake_card(monkeypatch, fake_try_step) -> list[float]:
    """A CUDA card faked for cuda_probe's bookkeeping (no GPU here): torch.cuda's calls answered,
    probe.real_try_step replaced by fake_try_step(spec, step, device, shared_by), a measured peak of 3 GiB
    (after running the step). -> the memory fractions the probe set, in order."""
    import torch

    from tinyrl.hardware import GPUS
    from tinyrl.memory import probe

    class Props:
        total_memory = GPUS["rtx4090"].memory_bytes

    fractions: list[float] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: Props)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", fractions.append)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: 0)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(probe, "real_try_step", fake_try_step)
    monkeypatch.setattr(probe, "measure_peak", lambda fn, device: (fn(), 3 * GiB)[1])
    return fractions


def test_cuda_probe_puts_measured_micro_batches_into_the_plan(monkeypatch):
    """The real CUDA probe's bookkeeping, with the card faked (no GPU here): each training phase
    searched up to its cap under the budget's ceiling, measured peaks in the plan, and a phase
    where not one sequence runs kept as not fitting."""
    import torch

    from tinyrl.config import load_config
    from tinyrl.hardware import GPUS
    from tinyrl.memory import from_config as mp

    limits = {"forward": 40, "actor_update": 5, "critic_update": 0}
    shared_by = []

    def fake_try_step(spec, step, device, rows_per_prompt):
        assert device == "cuda" and step.dtype == "bf16"
        shared_by.append(rows_per_prompt)

        def try_step(b):
            if b > limits[step.phase]:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return try_step

    fractions = fake_card(monkeypatch, fake_try_step)
    cfg = load_config("countdown-tiny", ["rollout.engine=vllm"])
    planned = mp.plan_for_config(cfg, GPUS["rtx4090"])
    plan = mp.cuda_probe(cfg, GPUS["rtx4090"], planned)
    assert not plan.simulated and not plan.fits
    ref, actor, critic = (plan.phases[n] for n in ("forward", "actor_update", "critic_update"))
    assert (ref.micro_batch, actor.micro_batch, critic.micro_batch) == (32, 5, 0)  # ref capped at 32 prompts
    assert actor.token_budget == 5 * 304 and actor.fits
    assert actor.parts["trainer_measured"] == 3 * GiB and actor.peak == sum(actor.parts.values())
    assert actor.parts["cublas_workspaces"] == planned.phases["actor_update"].parts["cublas_workspaces"] > 0
    assert not critic.fits and critic.peak == planned.phases["critic_update"].peak
    assert plan.phases["rollout"] == planned.phases["rollout"]
    beside = planned.phases["actor_update"].parts["cuda_context"] + planned.phases["actor_update"].parts["vllm_asleep"]
    assert fractions[0] == pytest.approx((planned.budget_bytes - beside) / torch.cuda.get_device_properties(0).total_memory)
    assert fractions[-1] == 1.0
    # each phase tries the layouts the plan prices: a prompt's rows (rollout.n) share it
    grpo = load_config("countdown-tiny", ["rollout.engine=vllm", "rollout.n=4"])
    mp.cuda_probe(grpo, GPUS["rtx4090"], mp.plan_for_config(grpo, GPUS["rtx4090"]))
    assert shared_by == [1, 1, 1, 4, 4, 4]


def test_cuda_probe_measures_the_size_it_found_again_and_steps_down_when_it_does_not_rerun(monkeypatch):
    """Seen on the H100 (2026-11-27, countdown-4090's 3B update under 21.59 GiB): the search's
    answer ran once, then ran out of memory when run again to measure its peak (fragments left
    by the failed tries), and the OOM killed `probe-memory --device cuda`. Scripted here, not a
    real allocator: each phase's edge size runs once, after that only sizes 2 below it."""
    import torch

    from tinyrl.config import load_config
    from tinyrl.hardware import GPUS
    from tinyrl.memory import from_config as mp

    edges, ran = {"forward": 40, "actor_update": 5, "critic_update": 1}, {}

    def fake_try_step(spec, step, device, rows_per_prompt):
        edge, seen = edges[step.phase], ran.setdefault(step.phase, set())

        def try_step(b):
            if b > edge or (b > edge - 2 and edge in seen):
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.16 GiB")
            seen.add(b)
        return try_step

    fake_card(monkeypatch, fake_try_step)
    cfg = load_config("countdown-tiny", ["rollout.engine=vllm"])
    planned = mp.plan_for_config(cfg, GPUS["rtx4090"])
    plan = mp.cuda_probe(cfg, GPUS["rtx4090"], planned)
    ref, actor, critic = (plan.phases[n] for n in ("forward", "actor_update", "critic_update"))
    assert (ref.micro_batch, actor.micro_batch, critic.micro_batch) == (32, 3, 0)  # 32: the cap, below the edge
    assert actor.fits and actor.token_budget == 3 * 304 and not critic.fits and not plan.fits
    notes = [n for n in plan.notes if n.startswith("real probe, ")]
    assert notes == ["real probe, actor_update: 5 sequences ran once, then ran out of memory; 3 ran again",
                     "real probe, critic_update: 1 ran once, then no size down to 1 ran again"]


def test_an_hf_rollout_names_its_kv_cache_and_is_told_to_keep_vllm_first(monkeypatch, capsys):
    """retool-4090 with rollout.engine=hf: the HF engine holds every episode's cache; the row
    said "vLLM KV cache", on a plan without vLLM. Only the rollout is over (that cache of all 256
    episodes); the advice led with settings that cannot close 26 GiB and offered the log-prob
    chunk, which no rollout holds, but not the engine README says to keep. (One test: each plan
    of retool-4090 costs ~30 s of tracing.)"""
    r = probe_json(monkeypatch, capsys, "--preset", "retool-4090", "--gpu", "rtx4090", "--simulate",
                   "--set", "rollout.engine=hf", fits=False)
    assert r["fits"] is False
    rollout = r["phases"]["rollout"]["categories"]
    assert rollout["HF engine KV cache"] > 30 * 2**30 and rollout["vLLM KV cache"] == 0
    check_consistent(r)
    code, stdout, _ = cli(monkeypatch, capsys, "probe-memory", "--preset", "retool-4090", "--gpu", "rtx4090",
                          "--simulate", "--set", "rollout.engine=hf")
    assert code == 1 and "HF engine KV cache" in stdout and "vLLM" not in stdout.split("DOES NOT FIT")[0]
    said = " ".join(stdout.split())
    assert "- try: rollout.engine=vllm (" in said
    assert "model.logprob_chunk=512" not in said


def test_a_preset_file_is_repeated_by_its_path_in_the_command_that_reads_the_plan(monkeypatch, capsys, tmp_path):
    """`--preset path/to/mine.toml` was echoed as `tinyrl train --preset mine`: copied, an unknown
    preset. The line names the file as given; that argument loads the same preset."""
    import re
    import shutil

    from tinyrl.config import PRESETS_DIR, load_config

    mine = tmp_path / "mine.toml"
    shutil.copy(PRESETS_DIR / "countdown-4090.toml", mine)
    code, stdout, stderr = cli(monkeypatch, capsys, "probe-memory", "--preset", str(mine), "--gpu", "rtx4090",
                               "--simulate")
    assert code == 0, stderr
    said = re.search(r"`tinyrl train --preset (\S+)` with the same --set options", " ".join(stdout.split()))
    assert said and said.group(1) == str(mine), stdout
    assert load_config(said.group(1), planning=True).preset == "mine"  # the stem still names the run


def test_an_rl_preset_that_starts_from_an_sft_run_is_planned_before_that_run_exists(monkeypatch, capsys, tmp_path):
    """countdown-demo's model.init_from = runs/countdown-demo-sft: a plan needs only the base's
    shapes (load_config(planning=True)), so probe-memory plans it before the SFT run exists;
    `presets show` and `train` still say to run that first."""
    monkeypatch.chdir(tmp_path)  # no runs/ here
    # --simulate: on a machine with a card the default is the real probe, which loads the base
    plan = probe_json(monkeypatch, capsys, "--preset", "countdown-demo", "--gpu", "rtx4090", "--simulate")
    assert plan["fits"] and plan["phases"], plan
    code, _, err = cli(monkeypatch, capsys, "presets", "show", "countdown-demo")
    assert code == 2 and "run that first" in " ".join(err.split())


def test_a_full_fine_tune_shows_its_trained_weights_not_adapters(monkeypatch):
    """countdown-0.5b-4090 (full actor + critic + reference) showed "adapters 1.84 GiB": there are
    none; that row is the trained actor's and critic's weights, and "base weights" the frozen
    reference's. A LoRA preset keeps both names. (Rough plans: the categories, not a trace.)"""
    from rich.console import Console

    from tinyrl.config import load_config
    from tinyrl.hardware import GPUS
    from tinyrl.memory import from_config as mp
    from tinyrl.memory import render

    full = load_config("countdown-0.5b-4090", planning=True)
    plan = mp.plan_for_config(full, GPUS["rtx4090"], simulate=False)
    cats = mp.categories(full, plan)
    for name, c in cats.items():
        assert "adapters" not in c and "base weights" not in c and sum(c.values()) == plan.phases[name].peak, name
    update = plan.phases["actor_update"].parts
    assert cats["actor_update"]["trained weights"] == update["adapters"] > 0
    assert cats["actor_update"]["reference weights"] == update["base_weights"] > 0
    console = Console(width=200, record=True)
    for part in render.render_plan(full, plan, mp.plan_path(full, GPUS["rtx4090"]), None, 1.0):
        console.print(part)
    shown = console.export_text()
    assert "trained weights" in shown and "reference weights" in shown and "adapters" not in shown
    lora = load_config("countdown-4090", planning=True)
    lora_cats = mp.categories(lora, mp.plan_for_config(lora, GPUS["rtx4090"], simulate=False))["actor_update"]
    assert lora_cats["adapters"] > 0 and lora_cats["base weights"] > 0 and "trained weights" not in lora_cats
