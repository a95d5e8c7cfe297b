"""Token ids of tool turns, written by the chat template incrementally, and the check of a
whole episode against a full re-render of its conversation.

Incremental (verl's way, verl 0.9.1 verl/workers/rollout/schemas.py `add_tool_response_messages`:
render a fixed base conversation with and without the new messages and keep the difference):
here the base ends with an assistant message, so the difference starts right after that
message's stop token and holds what the template writes after it ("\n" in Qwen2.5's), the tool
message(s) and the next assistant turn's generation prompt. The model's own tokens are never
re-tokenized on the way (a re-tokenization of sampled text can differ from what was sampled).

The check (verl's `tokenization_sanity_check_mode`, same file, `finalize`): re-render the
whole conversation (prompt messages, each assistant turn's text, the tool messages) and compare
with prompt_ids + response_ids, then, where the tokens differ, the text: the same text in other
tokens is the policy's own sampled split (harmless), other text is a tool turn or template text
written wrongly (Episode.rerender; metrics episode/tokenization_mismatch and
episode/text_mismatch). Never fatal: the trained tokens are the sampled ones either way.

Knows nothing of engines, tools' execution or the trainer.
"""

from __future__ import annotations

from tinyrl.errors import TinyRLError

# A fixed conversation: the tool turn's ids must not depend on the episode's own text.
_BASE = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
         {"role": "assistant", "content": "A"}]


class ToolChat:
    """The chat template of one run, with the tools' schemas (OpenAI function format)."""

    def __init__(self, tokenizer, schemas: list[dict], stop_ids: list[int]):
        if not getattr(tokenizer, "chat_template", None):
            raise TinyRLError("episodes with tools need a chat template, and this tokenizer has none",
                              hint="set model.custom_chat_template (a hermes-style template, as Qwen2.5's)")
        self.tokenizer = tokenizer
        self.schemas = schemas
        self.stop_ids = set(stop_ids)
        base = self.render(_BASE)
        # after the base's assistant stop token: the template's own text follows it
        ends = [i for i, t in enumerate(base) if t in self.stop_ids]
        if not ends:  # the model's turn ends with a token the template never writes there
            names = ", ".join(repr(tokenizer.decode([t])) for t in sorted(self.stop_ids))
            raise TinyRLError(f"the chat template does not end an assistant message with a token the model stops "
                              f"on ({names}), so a tool turn cannot follow the model's turn as the template writes it",
                              hint="use a template whose assistant messages end with the model's EOS (Qwen2.5-Instruct: "
                              "<|im_end|>), e.g. via model.custom_chat_template")
        self._cut = ends[-1] + 1
        self._base = base
        self.tool_turn_ids(["x"])  # a template that cannot write tool turns incrementally fails here, at setup

    def text(self, messages: list[dict], generation_prompt: bool = False) -> str:
        return self.tokenizer.apply_chat_template(messages, tools=self.schemas or None, tokenize=False,
                                                  add_generation_prompt=generation_prompt)

    def render(self, messages: list[dict], generation_prompt: bool = False) -> list[int]:
        """Token ids as the run's prompts get them: template text, then the tokenizer without
        added special tokens (tinyrl.setup.tokenize_rows does the same)."""
        return self.tokenizer(self.text(messages, generation_prompt), add_special_tokens=False)["input_ids"]

    def tool_turn_ids(self, contents: list[str]) -> list[int]:
        """The inserted span after an assistant turn that made calls: template text after the
        assistant's stop token, the tool messages (one per call, in order), the next
        assistant's generation prompt. -> token ids"""
        full = self.render(_BASE + [{"role": "tool", "content": c} for c in contents], generation_prompt=True)
        if full[:self._cut] != self._base[:self._cut]:
            raise TinyRLError("the chat template renders the conversation before a tool message differently "
                              "once the tool message is added; tool turns cannot be written incrementally",
                              hint="use a template whose rendering of earlier messages does not depend on later ones "
                              "(Qwen2.5's hermes template does not)")
        return full[self._cut:]

    def conversation(self, prompt_messages: list[dict], turns: list[tuple[str, str]]) -> list[dict]:
        """prompt messages + (role, text) turns -> the chat messages of the whole episode."""
        return list(prompt_messages) + [{"role": role, "content": text} for role, text in turns]

    def rerender(self, prompt_messages: list[dict], turns: list[tuple[str, str]], ids: list[int],
                 finished: bool) -> str:
        """How `ids` (prompt + episode) compare with the full re-render of the conversation up to
        where the episode ends (after the last assistant's stop token when it stopped by itself,
        else at the end of its cut text): "same", "tokens" (the same text in other tokens) or
        "text" (tinyrl.rollout.base.RERENDER_OUTCOMES says what each means)."""
        full = self.render(self.conversation(prompt_messages, turns))
        if full[:len(ids)] == ids and (not finished or ids[-1] in self.stop_ids):
            return "same"
        # Text, not tokens: a sampled split the tokenizer would not make has other ids and often
        # another length, but the same characters. (An episode cut inside a character decodes to
        # U+FFFD here and in its assistant message alike, so it compares as text too.)
        said = self.tokenizer.decode(ids, skip_special_tokens=False)
        written = self.tokenizer.decode(full, skip_special_tokens=False)
        return "tokens" if written.startswith(said) else "text"
