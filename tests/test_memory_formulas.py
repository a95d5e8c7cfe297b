import json

import pytest
import torch

import tinyrl  # noqa: F401  (before transformers/peft)
from tinyrl.errors import TinyRLError
from tinyrl.memory import formulas as fm
from tinyrl.model_specs import load_spec, param_count, shipped_names

# Published sizes of the Hugging Face checkpoints (the numbers their model cards round).
PARAMS = {"qwen2.5-0.5b": 494_032_768, "qwen2.5-1.5b": 1_543_714_304,
          "qwen2.5-3b": 3_085_938_688, "qwen2.5-7b": 7_615_616_512}


def test_shipped_configs_have_the_real_shapes():
    shapes = {n: load_spec(n) for n in shipped_names()}
    assert set(shapes) == set(PARAMS)
    got = {n: (s["hidden_size"], s["num_hidden_layers"], s["num_attention_heads"],
               s["num_key_value_heads"], s["intermediate_size"], s["vocab_size"],
               s["tie_word_embeddings"]) for n, s in shapes.items()}
    assert got == {"qwen2.5-0.5b": (896, 24, 14, 2, 4864, 151936, True),
                   "qwen2.5-1.5b": (1536, 28, 12, 2, 8960, 151936, True),
                   "qwen2.5-3b": (2048, 36, 16, 2, 11008, 151936, True),
                   "qwen2.5-7b": (3584, 28, 28, 4, 18944, 152064, False)}


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_param_count_matches_the_published_size_and_a_built_model(name):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    spec = load_spec(name)
    assert param_count(spec) == PARAMS[name]
    with torch.device("meta"):
        model = Qwen2ForCausalLM(Qwen2Config(**spec))
    assert sum(p.numel() for p in model.parameters()) == PARAMS[name]


def test_load_spec_accepts_hf_ids_instruct_and_local_dirs(tmp_path):
    assert load_spec("Qwen/Qwen2.5-3B") == load_spec("Qwen/Qwen2.5-3B-Instruct")
    cfg = {"hidden_size": 64, "num_hidden_layers": 1}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert load_spec(str(tmp_path)) == cfg


def test_unknown_model_says_what_is_shipped(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # no 20 s of retries: tests have no network
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(TinyRLError) as err:
        load_spec("meta-llama/Llama-3-8B")
    assert "HF_HUB_OFFLINE is set" in err.value.message and "qwen2.5-3b" in err.value.hint


def test_tiny_model_spec_is_not_built_on_a_lookup(tmp_path, monkeypatch):
    monkeypatch.setenv("TINYRL_CACHE", str(tmp_path))
    with pytest.raises(TinyRLError, match="not been built"):
        load_spec("tinyrl/tiny-qwen2", build=False)


def test_kv_cache_per_token():
    assert fm.kv_bytes_per_token(load_spec("qwen2.5-0.5b")) == 12 * 1024
    assert fm.kv_bytes_per_token(load_spec("qwen2.5-3b")) == 36 * 1024
    assert fm.kv_bytes_per_token(load_spec("qwen2.5-7b"), "fp32") == 112 * 1024


def test_weights_in_bf16_and_nf4():
    spec = load_spec("qwen2.5-3b")
    assert fm.weight_bytes(spec) == 2 * PARAMS["qwen2.5-3b"]
    nf4 = fm.weight_bytes(spec, quantize="nf4")
    # Linears at ~0.516 byte/param; the 311M-param embedding stays bf16.
    linear = 36 * sum(i * o for i, o in fm.linear_shapes(spec).values())
    assert nf4 == pytest.approx(linear * 0.516 + (PARAMS["qwen2.5-3b"] - linear) * 2, rel=0.01)
    assert 0.5 < fm.nf4_bytes_per_param() < fm.nf4_bytes_per_param(double_quant=False) == 0.5625
    with pytest.raises(TinyRLError):
        fm.weight_bytes(spec, quantize="int3")


def test_lora_count_matches_peft():
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    spec = load_spec("qwen2.5-0.5b")
    with torch.device("meta"):
        model = Qwen2ForCausalLM(Qwen2Config(**spec))
        model = get_peft_model(model, LoraConfig(r=16, target_modules=["q_proj", "v_proj", "down_proj"]))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert fm.lora_param_count(spec, 16, ["q_proj", "v_proj", "down_proj"]) == trainable
    with pytest.raises(TinyRLError):
        fm.lora_param_count(spec, 16, ["qkv"])


def test_optimizer_and_reservation_rules():
    assert fm.adam_state_bytes(1000) == 8000
    assert fm.master_weight_bytes(1000) + fm.grad_bytes(1000) == 8000
    assert fm.vllm_reservation_bytes(0.5, 24 * fm.GiB) == 12 * fm.GiB
    assert 0.5 * fm.GiB <= fm.CUDA_CONTEXT_BYTES <= fm.GiB
    # DESIGN.md: one 1,280-token sample of fp32 Qwen logits is ~0.78 GB.
    assert fm.full_logits_bytes(1280, 151936) == pytest.approx(0.78e9, rel=0.01)


def test_hf_decode_transients_worked_by_hand():
    # Qwen2.5-3B: 16 query heads on 2 kv heads of 128, vocabulary 151,936; 256 rows, 1,174 keys.
    spec = load_spec("Qwen/Qwen2.5-3B")
    # repeat_kv: K and V x 256 rows x 16 heads x 1,174 keys x 128 x 2 bytes
    assert fm.kv_expansion_bytes(spec, 256, 1174) == 2 * 256 * 16 * 1174 * 128 * 2 == 2_462_056_448
    # sampling: bf16 logits 2 + fp32 scores 4 + (top_p: sorted 4 + int64 indices 8 + softmax 4
    # + cumsum 4 = 26) or (log-probs, probs, draws, probs / draws: 4 x 4 = 22) bytes a logit
    assert fm.sampling_bytes(256, 151_936) == 256 * 151_936 * 26 == 1_011_286_016
    assert fm.sampling_bytes(256, 151_936, top_p=False) == 256 * 151_936 * 22 == 855_703_552
    # a decode step: the previous logits (bf16) + the copy where it happens, else the sampling
    assert fm.hf_decode_transient_bytes(spec, 256, 1174, expands_kv=True) == 2 * 256 * 151_936 + 2_462_056_448
    assert fm.hf_decode_transient_bytes(spec, 256, 1174, expands_kv=False) == 1_011_286_016
    # merge fixes: 36 layers x 77,070,336 adapted elements / 32 x (8 + 2) bytes + one layer's
    # transients (gate/up/down 2,048 x 11,008 x (3 x 2 + 1))
    per_layer = 2 * 2048 * 2048 + 2 * 2048 * 256 + 3 * 2048 * 11008
    assert per_layer == 77_070_336
    assert fm.merge_fix_bytes(spec) == 36 * per_layer // 32 * 10 + 2048 * 11008 * 7 == 1_024_851_968
