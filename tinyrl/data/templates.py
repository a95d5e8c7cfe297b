"""Countdown prompt templates, exactly as TinyZero writes them (see shared/ALGORITHMS.md).

`base` is fed raw (no chat template) and ends with "<think>" and no newline; `qwen-instruct`
is Qwen's chat format written out (note the space before "Using", as in TinyZero).
Numbers print as a Python list: [19, 36, 55, 7].
"""

from __future__ import annotations

from tinyrl.errors import TinyRLError

_TASK = (
    "Using the numbers {numbers}, create an equation that equals {target}. You can use basic "
    "arithmetic operations (+, -, *, /) and each number can only be used once. Show your work in "
    "<think> </think> tags. And return the final answer in <answer> </answer> tags, for example "
    "<answer> (1 + 2) / 3 </answer>."
)

TEMPLATES = {
    "base": (
        "A conversation between User and Assistant. The user asks a question, and the Assistant "
        "solves it. The assistant first thinks about the reasoning process in the mind and then "
        "provides the user with the answer.\nUser: " + _TASK + "\nAssistant: Let me solve this "
        "step by step.\n<think>"
    ),
    "qwen-instruct": (
        "<|im_start|>system\nYou are a helpful assistant. You first thinks about the reasoning "
        "process in the mind and then provides the user with the answer.<|im_end|>\n"
        "<|im_start|>user\n " + _TASK + "<|im_end|>\n<|im_start|>assistant\nLet me solve this "
        "step by step.\n<think>"
    ),
}


def countdown_prompt(numbers: list[int], target: int, template: str = "base") -> str:
    if template not in TEMPLATES:
        raise TinyRLError(
            f"unknown prompt template {template!r}",
            hint=f"set task.template to one of: {', '.join(TEMPLATES)}",
        )
    # int(): numpy ints from parquet would print as np.int64(15) inside the list.
    return TEMPLATES[template].format(numbers=[int(n) for n in numbers], target=int(target))


def countdown_response(solution: str, target: int) -> str:
    """A reference completion in the answer format every template's prompt asks for (it ends in
    "<think>"): the solution checked in the thinking, then the answer tags. `tinyrl data
    countdown --sft` writes these; the Countdown reward scores them 1.0 (strict mode too: the
    answer is alone on the last line)."""
    return f" {solution} = {int(target)} </think>\n<answer> {solution} </answer>"
