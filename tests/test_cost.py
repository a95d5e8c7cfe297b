"""estimate-cost: the headline numbers through the real CLI, the roofline against hand-worked
arithmetic, --from-run medians, and bad inputs (exit 2, one message)."""

import json
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tinyrl.cli import main
from tinyrl.config import load_config
from tinyrl.cost import estimate_cost, read_run
from tinyrl.errors import TinyRLError
from tinyrl.roofline import Assumptions, Card, DoesNotFit, ModelShape, Workload, estimate_sft_step, estimate_step


def cli(monkeypatch, capsys, *args):
    """Runs the real entry point (`tinyrl ...`) in-process: (exit code, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", ["tinyrl", *args])
    with pytest.raises(SystemExit) as exited:
        main()
    captured = capsys.readouterr()
    return exited.value.code, captured.out, captured.err


def no_data(tmp_path):
    # The epoch size must come from data.generate_train_size, whatever sits in the repo's runs/.
    return ["--set", f"data.train_path={tmp_path / 'not-generated.parquet'}"]


# --------------------------------------------------------------------------- the headline


def test_verl_4090_run_gives_10240_steps_26_6_hours_58_cny(monkeypatch, capsys, tmp_path):
    code, stdout, _ = cli(monkeypatch, capsys, "estimate-cost", "--preset", "countdown-0.5b-4090",
                          "--gpu", "rtx4090", "--sec-per-step", "9.35", "--price", "2.18",
                          "--currency", "CNY", "--json", *no_data(tmp_path))
    assert code == 0
    est = json.loads(stdout)
    # 327,680 prompts / 32 per step = 10,240 steps; x 9.35 s = 95,744 s = 26.596 h; x 2.18 = 57.98
    assert est["prompts_per_epoch"] == 327_680
    assert est["steps_per_epoch"] == 10_240
    assert est["sec_per_step"] == 9.35 and est["source"] == "given"
    assert est["hours_per_epoch"] == pytest.approx(26.5956, abs=1e-3)
    assert est["price_per_epoch"] == pytest.approx(57.978, abs=1e-2)
    assert est["currency"] == "CNY" and est["epochs"] == 1
    assert est["total_price"] == pytest.approx(est["price_per_epoch"])
    assert est["gpu"]["name"] == "rtx4090"
    # The roofline is computed alongside, for comparison, with the full-fine-tune PPO phases.
    assert set(est["roofline"]["phases"]) == {"rollout", "forward", "actor_update",
                                              "critic_update", "overhead"}
    assert 0 < est["roofline"]["sec_per_step"] < 9.35 * 10


def test_table_names_the_source_and_the_roofline_assumptions(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("COLUMNS", "200")
    code, stdout, _ = cli(monkeypatch, capsys, "estimate-cost", "--preset", "countdown-4090", *no_data(tmp_path))
    assert code == 0
    assert "source: roofline" in stdout
    assert "1,280" in stdout                      # 327,680 / 256 steps
    assert "needs --price" in stdout              # the preset knows no price: hours only
    assert "35% of peak bf16" in stdout and "decode at once" in stdout


def test_unknown_price_is_null_and_a_preset_price_is_labelled_an_example(tmp_path):
    nowhere = [f"data.train_path={tmp_path / 'x.parquet'}"]
    unknown = estimate_cost(load_config("countdown-4090", nowhere), sec_per_step=10.0)
    assert unknown.price_per_epoch is None and unknown.total_price is None
    assert "--price" in unknown.price_source
    example = estimate_cost(load_config("countdown-0.5b-4090", nowhere), sec_per_step=10.0)
    assert example.price_per_hour == 2.18 and "example" in example.price_source
    assert example.currency == "CNY"


def test_prompts_per_epoch_is_the_parquet_row_count_and_steps_round_up(tmp_path):
    path = tmp_path / "train.parquet"
    pq.write_table(pa.table({"target": list(range(100))}), path)
    cfg = load_config("countdown-0.5b-4090", [f"data.train_path={path}"])
    est = estimate_cost(cfg, sec_per_step=36.0, price=1.0, epochs=3)
    assert est.prompts_per_epoch == 100 and "rows of" in est.prompts_source
    assert est.steps_per_epoch == 4                # ceil(100 / 32)
    assert est.hours_per_epoch == pytest.approx(4 * 36 / 3600)
    assert est.total_hours == pytest.approx(3 * 0.04) and est.total_price == pytest.approx(0.12)
    given = estimate_cost(cfg, sec_per_step=36.0, prompts=64)
    assert given.steps_per_epoch == 2


# --------------------------------------------------------------------------- the roofline by hand

CARD = Card(memory_bytes=10e9, bandwidth_bytes_per_s=100e9, flops_per_s=10e12)
SHAPE = ModelShape(matmul_params=1e9, head_params=1e8, weight_bytes=2e9, kv_bytes_per_token=1e5)
PLAIN = Assumptions(train_mfu=0.5, prefill_mfu=0.5, decode_mfu=0.5, bandwidth_efficiency=1.0,
                    vllm_memory_share=0.5, vllm_non_kv_bytes=0, max_num_seqs=256, step_overhead_s=1.0)
PPO = Workload(prompts=8, n=2, prompt_tokens=100, response_tokens=100, lora=False,
               checkpointing=True, critic=True)


def test_roofline_full_ppo_matches_hand_arithmetic():
    r = estimate_step(SHAPE, CARD, PPO, PLAIN)
    # 16 sequences; KV budget 10e9*0.5 - 2e9 = 3e9, one sequence 200 tok * 1e5 B = 2e7 -> 150 fit: all 16 run.
    # prefill: 2 * 1e9 * 16 * 100 = 3.2e12 FLOP / (10e12 * 0.5) = 0.64 s
    # decode step: bytes 2e9 + 16 * (100 + 100/2) * 1e5 = 2.24e9 -> / 100e9 = 0.0224 s
    #              compute 2 * 1e9 * 16 = 3.2e10 / 5e12 = 0.0064 s -> bandwidth-bound
    #              100 * 16 / 16 = 100 steps -> 2.24 s;   rollout = 2.88 s
    # tokens 16 * 200 = 3200; one actor forward 2 * 1e9 * 3200 / 5e12 = 1.28 s; old + ref = 2.56 s
    # critic matmul params 1e9 - 1e8 (lm_head) = 9e8: values 2 * 9e8 * 3200 / 5e12 = 1.152 s
    # actor update, full + checkpointing: 8 * 1e9 * 3200 / 5e12 = 5.12 s
    # critic update: 8 * 9e8 * 3200 / 5e12 = 4.608 s;   overhead 1 s;   total 17.32 s
    assert r.details["decode_concurrency"] == 16 and r.details["decode_bound"] == "bandwidth"
    assert r.details["prefill_s"] == pytest.approx(0.64)
    assert r.details["decode_s"] == pytest.approx(2.24)
    assert r.phases == pytest.approx({"rollout": 2.88, "forward": 2.56 + 1.152,
                                      "actor_update": 5.12, "critic_update": 4.608, "overhead": 1.0})
    assert r.sec_per_step == pytest.approx(17.32)


def test_roofline_grpo_lora_has_no_value_passes_and_cheaper_updates():
    grpo = Workload(prompts=8, n=2, prompt_tokens=100, response_tokens=100, lora=True,
                    checkpointing=True, critic=False, ppo_epochs=2)
    r = estimate_step(SHAPE, CARD, grpo, PLAIN)
    # LoRA: 2 forward + 2 activation grads + 2 recompute = 6 per param-token, two ppo epochs:
    # 2 * 6 * 1e9 * 3200 / 5e12 = 7.68 s
    assert set(r.phases) == {"rollout", "forward", "actor_update", "overhead"}
    assert r.phases["actor_update"] == pytest.approx(7.68)
    assert r.sec_per_step == pytest.approx(2.88 + 2.56 + 7.68 + 1.0)


def test_roofline_sft_step_matches_hand_arithmetic():
    shape = ModelShape(matmul_params=1e9, head_params=1e8, weight_bytes=2e9, kv_bytes_per_token=1e5,
                       attention_width=1e4)
    plain = Assumptions(train_mfu=0.5, sft_step_overhead_s=0.25)
    r = estimate_sft_step(shape, CARD, rows=4, max_tokens=1000, lora=True, checkpointing=True, a=plain)
    # 4 rows x 1000 tokens = 4000 tokens; LoRA + checkpointing 6 FLOPs/param/token:
    #   6 * 1e9 * 4000 = 2.4e13 FLOP / (10e12 * 0.5) = 4.8 s
    # attention: forward 4 * 1e4 * 1000 / 2 = 2e7 FLOP/token, x (1 + 2.5 + 1 recompute) = 9e7;
    #   9e7 * 4000 = 3.6e11 / 5e12 = 0.072 s;   overhead 0.25 s;   total 5.122 s
    assert set(r.phases) == {"actor_update", "overhead"}  # no rollout, no forward, no critic
    assert r.details["attention_s"] == pytest.approx(0.072) and r.details["weights_s"] == pytest.approx(4.8)
    assert r.sec_per_step == pytest.approx(5.122)
    full = estimate_sft_step(shape, CARD, rows=4, max_tokens=1000, lora=False, checkpointing=False, a=plain)
    # full, no checkpointing: 6 FLOPs/param/token = 4.8 s; attention x (1 + 2.5) = 7e7 * 4000 / 5e12 = 0.056 s
    assert full.phases["actor_update"] == pytest.approx(4.8 + 0.056)


def test_an_sft_preset_is_priced_as_sft_steps_over_its_rows(monkeypatch, capsys, tmp_path):
    """An SFT preset was priced as an RL step: retool-sft-4090 came out at 486 h, a rollout, a critic
    and 327,680 "prompts" that are nobody's data set."""
    code, _, err = cli(monkeypatch, capsys, "estimate-cost", "--preset", "retool-sft-4090")
    assert code == 2 and "Traceback" not in err  # its data is downloaded, and not yet: how many rows?
    with pytest.raises(TinyRLError) as exc:
        estimate_cost(load_config("retool-sft-4090"))
    assert "rows per epoch are unknown" in exc.value.message and "--prompts-per-epoch" in exc.value.hint
    assert "tinyrl data retool --sft --from hf:JoeYing/ReTool-SFT" in exc.value.hint
    est = estimate_cost(load_config("retool-sft-4090"), prompts=2000)
    assert set(est.phases) == {"actor_update", "overhead"} and est.unit == "rows"
    assert est.steps_per_epoch == 63 and est.train_batch_size == 32
    cfg = load_config("retool-sft-4090")
    by_hand = estimate_sft_step(ModelShape.from_spec(*_spec_and_params(cfg.model.name)), _card(cfg.cost.gpu), 32,
                                16384, lora=True, checkpointing=True)
    assert est.sec_per_step == pytest.approx(by_hand.sec_per_step)
    code, out, _ = cli(monkeypatch, capsys, "estimate-cost", "--preset", "retool-sft-4090", "--prompts-per-epoch", "2000")
    assert code in (0, None) and "rows / epoch" in out and "rollout" not in out and "critic" not in out


def _spec_and_params(name):
    from tinyrl.model_specs import load_spec, param_count

    spec = load_spec(name, build=False)
    return spec, param_count(spec)


def _card(name):
    from tinyrl.hardware import get_gpu

    gpu = get_gpu(name)
    return Card(gpu.memory_bytes, gpu.bandwidth_bytes_per_s, gpu.bf16_tflops * 1e12)


def test_roofline_adds_the_tool_calls_of_a_task_with_tools():
    from dataclasses import replace

    tools = replace(PPO, tool_calls=3, tool_workers=4)
    r, plain = estimate_step(SHAPE, CARD, tools, PLAIN), estimate_step(SHAPE, CARD, PPO, PLAIN)
    # 16 episodes x 3 calls x 0.5 s / 4 at once = 6 s on top of the rollout, nothing else changes
    assert r.details["tools_s"] == pytest.approx(16 * 3 * PLAIN.tool_call_s / 4) == pytest.approx(6.0)
    assert r.phases["rollout"] == pytest.approx(plain.phases["rollout"] + 6.0)
    assert {k: v for k, v in r.phases.items() if k != "rollout"} == \
        {k: v for k, v in plain.phases.items() if k != "rollout"}
    from tinyrl.cost import roofline_for
    from tinyrl.hardware import get_gpu

    gpu = get_gpu("rtx4090")
    cfg = load_config("retool-4090", ["rollout.tool_workers=16", "rollout.max_tool_calls=2"])
    assert roofline_for(cfg, gpu).details["tools_s"] == pytest.approx(32 * 8 * 2 * 0.5 / 16)
    assert roofline_for(load_config("math-grpo-4090"), gpu).details["tools_s"] == 0.0


def test_roofline_caps_concurrency_by_what_the_kv_cache_holds():
    small = Card(memory_bytes=4.32e9, bandwidth_bytes_per_s=100e9, flops_per_s=10e12)
    r = estimate_step(SHAPE, small, PPO, PLAIN)
    # KV budget 4.32e9 * 0.5 - 2e9 = 1.6e8 / 2e7 per sequence = 8 at once
    # step bytes 2e9 + 8 * 150 * 1e5 = 2.12e9 -> 0.0212 s; 100 * 16 / 8 = 200 steps -> 4.24 s
    assert r.details["decode_concurrency"] == 8
    assert r.details["decode_s"] == pytest.approx(4.24)
    capped = estimate_step(SHAPE, CARD, Workload(**{**PPO.__dict__, "max_num_seqs": 4}), PLAIN)
    assert capped.details["decode_concurrency"] == 4
    with pytest.raises(DoesNotFit, match="one 200-token sequence"):
        estimate_step(SHAPE, Card(4e9, 100e9, 10e12), PPO, PLAIN)   # 2e9 share = the weights


def test_model_shape_from_a_small_spec():
    spec = {"hidden_size": 8, "num_attention_heads": 2, "num_key_value_heads": 1, "num_hidden_layers": 3,
            "vocab_size": 10, "tie_word_embeddings": True}
    tied = ModelShape.from_spec(spec, params=1000)
    # head_dim 8/2 = 4; KV bytes/token 2 * 3 layers * 1 kv head * 4 * 2 bytes = 48; lm_head 10 * 8 = 80
    assert tied.kv_bytes_per_token == 48 and tied.head_params == 80
    assert tied.attention_width == 3 * 2 * 4  # layers x query heads x head_dim
    assert tied.matmul_params == 1000 and tied.weight_bytes == 2000
    untied = ModelShape.from_spec({**spec, "tie_word_embeddings": False}, params=1080, weight_bytes_per_param=0.5)
    assert untied.matmul_params == 1000 and untied.weight_bytes == 500   # the input embedding is only looked up


# --------------------------------------------------------------------------- --from-run


def write_run(path, times, steps=None, config=None, extra=None):
    path.mkdir(parents=True, exist_ok=True)
    steps = steps or list(range(1, len(times) + 1))
    lines = [json.dumps({"step": s, "timing/step": t, "timing/rollout": t / 2, **(extra or {})})
             for s, t in zip(steps, times)]
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    if config is not None:
        (path / "config.json").write_text(json.dumps(config))
    return path


def test_from_run_takes_the_median_of_steady_steps_and_the_run_config(monkeypatch, capsys, tmp_path):
    # step 1 (30 s) is warm-up; steady [10, 12, 11, 50, 13] -> median 12 (with warm-up it would be 12.5)
    config = {"preset": "my-run", "trainer": {"train_batch_size": 64, "total_epochs": 2},
              "data": {"train_path": str(tmp_path / "none.parquet"), "generate_train_size": 6400},
              "model": {"name": "some/unknown-model"}, "future_section": {"x": 1}}
    run = write_run(tmp_path / "run", [30, 10, 12, 11, 50, 13], config=config)
    code, stdout, _ = cli(monkeypatch, capsys, "estimate-cost", "--from-run", str(run), "--price", "3", "--json")
    assert code == 0
    est = json.loads(stdout)
    assert est["source"] == "run" and est["sec_per_step"] == 12
    assert est["phases"] == {"rollout": 6}
    assert est["steps_per_epoch"] == 100                      # 6400 / 64, from config.json
    assert est["hours_per_epoch"] == pytest.approx(100 * 12 / 3600)
    assert est["total_price"] == pytest.approx(2 * 3 * 100 * 12 / 3600)
    assert est["roofline"] is None and any("no roofline" in a for a in est["assumptions"])
    assert any("warm-up left out: step(s) 1 " in a for a in est["assumptions"])


def test_a_resume_past_the_runs_end_is_told_by_its_process_step(tmp_path):
    """README's `--resume --max-steps 60` after a finished 40-step run: no step number goes back,
    so its first step (a fresh process's warm-up) was counted as steady. The trainer's
    run/process_step says where each process started."""
    run = write_run(tmp_path / "run", [100, 10, 10, 100, 20, 20])
    lines = [dict(json.loads(x), **{"run/process_step": p})
             for x, p in zip((run / "metrics.jsonl").read_text().splitlines(), [1, 2, 3, 1, 2, 3])]
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    timing = read_run(run)
    assert timing.warmup_steps == [1, 4] and timing.sec_per_step == 15     # median of 10 10 20 20


def test_a_resume_makes_its_first_step_warm_up_again(tmp_path):
    # steps 1 2 3 | resumed at 3: 3 4 5; warm-up = the first 1 and the second 3.
    run = write_run(tmp_path / "run", [100, 10, 10, 100, 20, 20], steps=[1, 2, 3, 3, 4, 5])
    timing = read_run(run)
    assert timing.warmup_steps == [1, 3] and timing.steady_steps == 4
    assert timing.sec_per_step == 15                         # median of 10 10 20 20


# --------------------------------------------------------------------------- bad inputs: exit 2


@pytest.mark.parametrize("args, words", [
    (["--from-run", "{tmp}/missing"], "does not exist"),
    (["--preset", "countdown-4090", "--gpu", "rtx9999"], "unknown GPU"),
    (["--preset", "countdown-4090", "--price", "-1"], "must be zero"),
    (["--preset", "countdown-4090", "--sec-per-step", "0"], "positive"),
    (["--from-run", "{tmp}/empty"], "has 0 timed step(s)"),
    (["--from-run", "{tmp}/short"], "at least 2 are needed"),
    (["--from-run", "{tmp}/short", "--sec-per-step", "3"], "give one of them"),
    (["--from-run", "{tmp}/noconfig"], "no config to estimate"),
    ([], "give --preset NAME"),
])
def test_bad_input_exits_2_with_a_message(monkeypatch, capsys, tmp_path, args, words):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "metrics.jsonl").write_text("")
    write_run(tmp_path / "short", [30, 10])
    write_run(tmp_path / "noconfig", [30, 10, 10])
    code, stdout, stderr = cli(monkeypatch, capsys, "estimate-cost",
                               *[a.replace("{tmp}", str(tmp_path)) for a in args])
    assert code == 2 and stdout == ""
    assert words in " ".join(stderr.replace("│", " ").split())   # the panel wraps long lines


def test_a_run_that_stopped_before_step_1_is_said_to_have_no_steps_yet(monkeypatch, capsys, tmp_path):
    """--from-run on a run directory with config.json and run.json but no metrics.jsonl (or no timed
    step in it) said `metrics.jsonl not found ... pass the run's own directory`: it is that directory.
    A folder that is not a run's still gets that hint."""
    bare = tmp_path / "bare"
    bare.mkdir()
    for name, metrics in (("nometrics", None), ("nosteps", '{"step": 0, "val/score": 0.1}\n')):
        run = tmp_path / name
        run.mkdir()
        (run / "config.json").write_text(json.dumps({"preset": "countdown-tiny", "trainer": {"max_steps": 5}}))
        (run / "run.json").write_text(json.dumps({"run_id": "abc"}))
        if metrics is not None:
            (run / "metrics.jsonl").write_text(metrics)
        code, stdout, stderr = cli(monkeypatch, capsys, "estimate-cost", "--from-run", str(run))
        said = " ".join(stderr.replace("│", " ").split())
        assert code == 2 and stdout == "" and "has no finished step yet" in said, said
        assert "let it train 3+ steps" in said and "--sec-per-step" in said and "--preset NAME" in said
        assert "pass the run's own directory" not in said and "not found" not in said
    code, _, stderr = cli(monkeypatch, capsys, "estimate-cost", "--from-run", str(bare))
    said = " ".join(stderr.replace("│", " ").split())
    assert code == 2 and "not found" in said and "pass the run's own directory" in said


def test_library_raises_the_one_error_type():
    with pytest.raises(TinyRLError, match="--epochs"):
        estimate_cost(load_config("countdown-4090"), sec_per_step=1.0, epochs=0)


def test_a_cpu_run_is_priced_as_the_cpu_and_another_cards_run_is_said(monkeypatch, capsys, tmp_path):
    """--from-run of the CPU demo said "on rtx4090" and compared its CPU seconds with a 4090's
    roofline; an H100 run priced as the preset's 4090 passed without a word."""
    from tinyrl.config import load_config

    config = load_config("countdown-0.5b-4090").to_dict()  # cost.gpu rtx4090, with an example price per hour
    assert config["cost"]["price_per_hour"] > 0
    cpu = write_run(tmp_path / "cpu", [30, 10, 12, 11], config=config,
                    extra={"memory/kind": "ram", "memory/total_bytes": 24 * 2**30})
    code, stdout, _ = cli(monkeypatch, capsys, "estimate-cost", "--from-run", str(cpu), "--json")
    est = json.loads(stdout)
    assert code == 0 and est["gpu"]["name"] == "the CPU the run used" and est["sec_per_step"] == 11
    assert est["roofline"] is None and est["price_per_hour"] is None  # the preset's price is a card's
    assert any("ran on the CPU" in a for a in est["assumptions"])
    h100 = write_run(tmp_path / "h100", [30, 10, 12, 11], config=config,
                     extra={"memory/kind": "vram", "memory/total_bytes": 85_031_714_816})
    for gpu, warned in ((None, True), ("rtx4090", True), ("h100", False)):
        code, stdout, _ = cli(monkeypatch, capsys, "estimate-cost", "--from-run", str(h100), "--json",
                              *(["--gpu", gpu] if gpu else []))
        est = json.loads(stdout)
        assert code == 0 and est["roofline"] is not None and est["gpu"]["name"] == (gpu or "rtx4090")
        assert any(a.startswith("WARNING: ") and "79.2 GiB, not a rtx4090" in a for a in est["assumptions"]) == warned


def test_a_run_priced_under_another_preset_a_bare_currency_and_the_phase_sum_say_what_they_are(monkeypatch, capsys,
                                                                                              tmp_path):
    """A new user's walk: `--from-run RUN --preset countdown-4090` priced a tiny CPU run's seconds as
    Qwen2.5-3B's steps without a word (then, until 2026-11-28, with exit 0 and a WARNING last below
    the tables: 1.5 h, 0.58 USD an epoch); `--currency EUR` without --price showed the preset's 2.18
    CNY as 2.18 EUR; the phase table's "total" (a sum of per-phase medians) differed from the
    seconds per step above it with nothing saying why."""
    config = load_config("countdown-tiny").to_dict()
    run = tmp_path / "run"
    write_run(run, [30, 10, 12, 11], config=config)
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(
        {"step": s, "timing/step": t, "timing/rollout": r, "timing/update": t - r, "memory/kind": "ram"})
        for s, t, r in ((1, 30, 15), (2, 10, 2), (3, 12, 9), (4, 13, 5))) + "\n")  # median step 12; phases 5 + 8
    code, stdout, stderr = cli(monkeypatch, capsys, "estimate-cost", "--from-run", str(run), "--preset",
                               "countdown-4090", "--price", "0.4", "--json")
    said = " ".join(stderr.replace("│", " ").split())
    assert code == 2 and stdout == "" and "Traceback" not in stderr
    assert "trained tinyrl/tiny-qwen2, not the preset's Qwen/Qwen2.5-3B" in said, said
    assert "leave out --preset" in said and "--sec-per-step" in said
    # the same model, but the run was on the CPU and the preset runs on a card
    cpu_run = write_run(tmp_path / "cpu-05b", [30, 10, 12, 11], config=load_config("countdown-0.5b-4090").to_dict(),
                        extra={"memory/kind": "ram"})
    with pytest.raises(TinyRLError, match="ran on the CPU, and the preset runs on a card"):
        estimate_cost(load_config("countdown-0.5b-4090"), run_dir=cpu_run)
    # the preset's own model on another batch: priced, the WARNING said under the figures, above the tables
    other_batch = write_run(tmp_path / "batch", [30, 10, 12, 11], config=load_config("countdown-tiny", [
        "trainer.train_batch_size=8", "actor.ppo_mini_batch_size=8"]).to_dict(), extra={"memory/kind": "ram"})
    monkeypatch.setenv("COLUMNS", "300")
    code, stdout, _ = cli(monkeypatch, capsys, "estimate-cost", "--from-run", str(other_batch), "--preset",
                          "countdown-tiny", *no_data(tmp_path))
    assert code == 0 and "WARNING: " in stdout and "on batches of 8, the preset countdown-tiny on 32" in stdout
    assert stdout.index("WARNING: ") < stdout.index("seconds per step, by phase") < stdout.index("assumptions:")
    assert stdout.count("WARNING: ") == 1
    monkeypatch.setenv("COLUMNS", "100")  # the line is one line, not the narrow phase table's wrapped caption
    code, stdout, _ = cli(monkeypatch, capsys, "estimate-cost", "--from-run", str(run))
    text = " ".join(stdout.split())
    assert code == 0 and "sum of the phases │ 13.00" in text
    assert "run: the median of each phase over the steady steps; the median step, 12.00 s, prices the epoch\n" \
        in stdout, stdout
    code, _, stderr = cli(monkeypatch, capsys, "estimate-cost", "--preset", "countdown-0.5b-4090", "--currency", "EUR")
    said = " ".join(stderr.replace("│", " ").split())
    assert code == 2 and "--currency EUR without --price would show the preset's example" in said, said
    code, stdout, _ = cli(monkeypatch, capsys, "estimate-cost", "--preset", "countdown-0.5b-4090", "--currency", "EUR",
                          "--price", "2", "--json")
    assert code == 0 and json.loads(stdout)["currency"] == "EUR" and json.loads(stdout)["price_per_hour"] == 2


def test_the_roofline_decodes_with_the_memory_plans_vllm_settings_once_there_is_one(monkeypatch, tmp_path):
    """With rollout.vllm left at 0 (auto), `train` takes the share and max_num_seqs from the memory
    plan (retool-4090: 0.71 and 95 on a 4090) while the roofline guessed 50% and 59 sequences.
    Once probe-memory has planned the config on the card (its plan file), the roofline reads it."""
    from tinyrl.hardware import get_gpu
    from tinyrl.hardware import GiB
    from tinyrl.memory.from_config import plan_for_config, plan_path, read_plan, save_plan

    monkeypatch.setenv("TINYRL_CACHE", str(tmp_path / "cache"))
    cfg = load_config("countdown-4090", [f"data.train_path={tmp_path / 'x.parquet'}"])
    guessed = estimate_cost(cfg, gpu_name="rtx4090")
    assert any("50% of the card (a guess: `tinyrl probe-memory --preset countdown-4090`" in a
               for a in guessed.assumptions)
    gpu = get_gpu("rtx4090")
    plan = plan_for_config(cfg, gpu, simulate=False)  # the rough plan: the same fields, in a second
    path = save_plan(plan, plan_path(cfg, gpu))
    read = estimate_cost(cfg, gpu_name="rtx4090")
    share, seqs = plan.vllm_gpu_memory_utilization, plan.vllm_max_num_seqs
    assert (share, seqs) != (0.5, 0) and read.hours_per_epoch != guessed.hours_per_epoch
    assert any(f"vLLM gets {share:.0%} of the card, " in a and f"max_num_seqs {seqs}" in a for a in read.assumptions)
    assert any(str(path) in a and "as `train` sets them" in a for a in read.assumptions), read.assumptions
    assert cfg.rollout.vllm.gpu_memory_utilization == 0  # the user's config is left as given
    # a plan that does not fit (the last one probed: `probe-memory --budget 12GiB` of countdown-4090):
    # train refuses it, so its vLLM share prices no run; it priced 818 s a step instead of 334
    save_plan(plan_for_config(cfg, gpu, simulate=False, budget_bytes=8 * GiB), path)
    assert not read_plan(path).fits
    unfit = estimate_cost(cfg, gpu_name="rtx4090")
    assert unfit.hours_per_epoch == guessed.hours_per_epoch
    assert any("DOES NOT FIT, and `train` will not start on it" in a for a in unfit.assumptions), unfit.assumptions


def test_an_rl_preset_that_starts_from_an_sft_run_is_priced_before_that_run_exists(monkeypatch, capsys, tmp_path):
    """countdown-demo's model.init_from = runs/countdown-demo-sft: a price (or a plan: probe-memory
    loads the config the same way, ~30 s of tracing not repeated here) needs only its base's
    shapes, so it is given before the SFT run is made; `train` still refuses."""
    monkeypatch.chdir(tmp_path)  # no runs/ here
    code, stdout, err = cli(monkeypatch, capsys, "estimate-cost", "--preset", "countdown-demo", "--json",
                            *no_data(tmp_path))
    assert code == 0, err
    assert json.loads(stdout)["roofline"]["sec_per_step"] > 0
    with pytest.raises(TinyRLError, match="is not a run directory"):
        load_config("countdown-demo")


def test_a_preset_file_is_repeated_by_its_path_in_the_probe_memory_command(monkeypatch, capsys, tmp_path):
    """The roofline's guess pointed at `tinyrl probe-memory --preset mine` for a file mine.toml: an
    unknown preset. It names the file as given."""
    import re
    import shutil

    from tinyrl.config import PRESETS_DIR

    monkeypatch.setenv("COLUMNS", "300")
    mine = tmp_path / "mine.toml"
    shutil.copy(PRESETS_DIR / "countdown-4090.toml", mine)
    code, stdout, _ = cli(monkeypatch, capsys, "estimate-cost", "--preset", str(mine), *no_data(tmp_path))
    assert code == 0
    said = re.search(r"a guess: `tinyrl probe-memory --preset (\S+)`", " ".join(stdout.split()))
    assert said and said.group(1) == str(mine), stdout
    assert load_config(said.group(1), planning=True).preset == "mine"


def test_an_epoch_priced_before_a_download_does_not_say_it_is_generated(tmp_path, monkeypatch):
    """math-grpo-4090 (data.generate = false: DAPO-Math-17k is downloaded or converted) was priced
    from "data.generate_train_size (data/math/dapo-math-17k.parquet not generated yet)": tinyrl
    never generates that file."""
    from tinyrl.cost import prompts_per_epoch

    monkeypatch.chdir(tmp_path)  # no data/ here
    n, source = prompts_per_epoch(load_config("math-grpo-4090", check=False))
    assert n == 17917 and "not there yet: made with `tinyrl data`, or downloaded" in source
    assert "generated" not in source
    n, source = prompts_per_epoch(load_config("countdown-tiny", ["data.train_path=gen/train.parquet"], check=False))
    assert source.endswith("not generated yet)")  # a task that generates its data on first use


def test_a_short_epoch_is_said_in_minutes_and_the_probe_hint_names_the_card_priced(tmp_path, monkeypatch):
    """A CPU demo's 2-minute epoch read "hours / epoch 0.0"; `--gpu h100` on a 4090 preset was
    told to run probe-memory without --gpu, which plans the preset's 4090."""
    from tinyrl.cost import hours_text

    assert hours_text(256 * 0.51 / 3600) == "0.036 (2.2 min)" and hours_text(118.73) == "118.7"
    assert hours_text(0.1) == "0.1"
    monkeypatch.setenv("TINYRL_CACHE", str(tmp_path / "cache"))  # no plan made yet: the roofline guesses
    cfg = load_config("countdown-4090", [f"data.train_path={tmp_path / 'x.parquet'}"])
    other = estimate_cost(cfg, gpu_name="h100").assumptions
    assert any("`tinyrl probe-memory --preset countdown-4090 --gpu h100`" in a for a in other), other
    own = estimate_cost(cfg, gpu_name="rtx4090").assumptions
    assert any("`tinyrl probe-memory --preset countdown-4090` plans" in a for a in own), own


def test_a_roofline_only_estimate_says_how_far_the_roofline_was_from_the_real_run(monkeypatch, capsys, tmp_path):
    """`estimate-cost --preset countdown-4090 --price 0.4` printed 333.81 s/step, 118.7 h, 47.48 USD with
    "an upper bound" as its only caveat, while README said the roofline was optimistic by about 2x
    against the one real run: said only with --sec-per-step/--from-run. The ratio is computed from
    that run's seconds and the roofline of its preset (one source, README quotes it)."""
    import re
    from pathlib import Path

    from tinyrl.cost import MEASURED_RUN, roofline_for, roofline_vs_measured
    from tinyrl.hardware import get_gpu

    monkeypatch.setenv("TINYRL_CACHE", str(tmp_path / "cache"))  # no memory plan: the roofline as it stands
    check = roofline_vs_measured()
    by_hand = roofline_for(load_config(MEASURED_RUN["preset"], planning=True), get_gpu(MEASURED_RUN["gpu"]))
    assert check["roofline_sec_per_step"] == by_hand.sec_per_step
    assert check["ratio"] == pytest.approx(MEASURED_RUN["sec_per_step"] / by_hand.sec_per_step) == pytest.approx(2.01, abs=0.005)
    # README's sentence is these numbers
    readme = " ".join((Path(__file__).parents[1] / "README.md").read_text().split())
    said = re.search(r"Against the real verl run \(([\d.]+) s/step for (\S+)\) the roofline says ([\d.]+) s: "
                     r"it is optimistic by about (\d+)x", readme)
    assert said, "README's sentence on the roofline against the real run"
    assert (float(said.group(1)), said.group(2)) == (MEASURED_RUN["sec_per_step"], MEASURED_RUN["preset"])
    assert said.group(3) == f"{check['roofline_sec_per_step']:.2f}" and int(said.group(4)) == round(check["ratio"])

    monkeypatch.setenv("COLUMNS", "400")
    code, stdout, _ = cli(monkeypatch, capsys, "estimate-cost", "--preset", "countdown-4090", "--price", "0.4",
                          *no_data(tmp_path), "--json")
    est = json.loads(stdout)
    assert code == 0 and est["source"] == "roofline" and est["roofline_vs_measured"] == check
    code, stdout, _ = cli(monkeypatch, capsys, "estimate-cost", "--preset", "countdown-4090", "--price", "0.4",
                          *no_data(tmp_path))
    text = " ".join(stdout.split())
    total = est["total_hours"] * check["ratio"]
    assert (f"roofline vs a real run │ a real verl run (countdown-0.5b-4090 on rtx4090) took 9.35 s a step, "
            f"{check['ratio']:.2f}x the roofline's {check['roofline_sec_per_step']:.2f}; at that ratio the total is "
            f"{total:,.1f} h, {est['total_price'] * check['ratio']:,.2f} USD") in text, text
    assert text.index("roofline vs a real run") < text.index("seconds per step, by phase")  # beside the figures
    # a measured or given step needs no such line (the ratio to its roofline is said); nor has SFT a real run
    given = estimate_cost(load_config("countdown-4090", no_data(tmp_path)[1:]), sec_per_step=300.0)
    assert given.roofline_vs_measured is None and any("given seconds/step are" in a for a in given.assumptions)
    sft = estimate_cost(load_config("retool-sft-4090"), prompts=2000)
    assert sft.roofline_vs_measured is None
    assert any("SFT step's roofline has not been set against a real run" in a for a in sft.assumptions)


def test_a_short_total_an_empty_currency_and_another_cards_price_say_what_they_are(monkeypatch, capsys, tmp_path):
    """A user's walk: `--prompts-per-epoch 1000` printed "total ... 0.083 (5.0 min) h"; `--currency ''`
    with --price kept the preset's CNY; `--gpu h100` without --price took the preset's 4090 example
    price (2.18 CNY/h) as the H100's without a word."""
    monkeypatch.setenv("COLUMNS", "300")
    code, stdout, _ = cli(monkeypatch, capsys, "estimate-cost", "--preset", "countdown-0.5b-4090", "--sec-per-step",
                          "9.35", "--prompts-per-epoch", "1000", "--price", "2")
    text = " ".join(stdout.split())
    # 1000 / 32 -> 32 steps x 9.35 s = 299.2 s = 0.083 h
    assert code == 0 and "total, 1 epoch(s) │ 0.083 h (5.0 min), 0.17 CNY" in text and "min) h" not in text, text
    code, stdout, stderr = cli(monkeypatch, capsys, "estimate-cost", "--preset", "countdown-0.5b-4090", "--price", "2",
                               "--currency", "")
    assert code == 2 and stdout == "" and "--currency is empty" in " ".join(stderr.replace("│", " ").split())
    nowhere = [f"data.train_path={tmp_path / 'x.parquet'}"]
    h100 = estimate_cost(load_config("countdown-0.5b-4090", nowhere), gpu_name="h100", sec_per_step=5.0)
    assert h100.price_per_hour is None and h100.price_per_epoch is None
    assert "example, 2.18 CNY/h, is for its rtx4090, not the h100; give --price" in h100.price_source
    own = estimate_cost(load_config("countdown-0.5b-4090", nowhere), gpu_name="RTX 4090", sec_per_step=5.0)
    assert own.price_per_hour == 2.18 and "example" in own.price_source  # the preset's card, however spelt
    mine = estimate_cost(load_config("countdown-0.5b-4090", nowhere), gpu_name="h100", sec_per_step=5.0, price=3.0)
    assert mine.price_per_hour == 3.0
    code, stdout, _ = cli(monkeypatch, capsys, "estimate-cost", "--preset", "countdown-0.5b-4090", "--gpu", "h100",
                          "--sec-per-step", "5", *no_data(tmp_path))
    assert code == 0 and "unknown — the preset's example, 2.18 CNY/h, is for its rtx4090, not the h100" in stdout
