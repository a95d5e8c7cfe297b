"""--resume: compare the config with the run's saved config.json before anything is loaded, and
pick the checkpoint to continue from.

A checkpoint only means something with the settings that made it: the model and adapter shapes,
the data and its order, the algorithm and its optimizer. Those may not change on resume (an
error naming each key). The keys below change how long the run goes, what it logs and saves,
how it validates, how the same maths is split into micro-batches, or how many tool calls run
at once: they may change, and each change is listed. The learning rates are NOT among them:
the scheduler's saved state carries the base rate and would silently override a new one.
"""

from __future__ import annotations

import json
from pathlib import Path

from tinyrl import checkpoint as ckpt
from tinyrl.config import Config
from tinyrl.errors import TinyRLError
from tinyrl.rundir import RUN_FILE, check_has_run

# Exact keys, or "section." for every key of a section.
CHANGEABLE = (
    "preset", "description",
    "trainer.max_steps", "trainer.total_epochs", "trainer.test_every", "trainer.save_every",
    "trainer.keep_last", "trainer.log_samples", "trainer.tensorboard", "trainer.wandb",
    "trainer.out_dir", "trainer.memory_budget_gib", "trainer.device",
    "data.test_path", "data.max_test_prompts",
    "actor.micro_batch_tokens", "actor.forward_micro_batch_tokens", "critic.micro_batch_tokens",
    "model.gradient_checkpointing", "model.logprob_chunk", "model.padding_free",
    "rollout.engine", "rollout.vllm.", "reward.timeout_s", "cost.",
    "data.val_files", "trainer.val_n", "task.verify_timeout_s", "sft.val_generate",
    "trainer.val_before_train",
    # calls run at once: a machine's knob (its cores); a seeded rollout gives the same episodes
    # whatever order the calls return in (tests/test_turns_engines.py)
    "rollout.tool_workers",
)


def flatten(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


# Keys an older config.json may lack that its default cannot stand for: `command` came after SFT
# runs existed, and such a run's file cannot say it was one. Absent, the current value is taken.
UNRECORDED_BEFORE = ("command",)


def changeable(key: str) -> bool:
    return any(key == c or (c.endswith(".") and key.startswith(c)) for c in CHANGEABLE)


def compare(saved: dict, current: dict) -> tuple[list[str], list[str]]:
    """(forbidden changes, allowed changes) as 'key: old -> new' lines. A key the saved config
    lacks (written by an older tinyrl) counts as its default, except UNRECORDED_BEFORE's."""
    from tinyrl.config import _migrate  # keys that moved to [task] (issue 13) are not changes

    old, new = flatten(_migrate(saved)), flatten(current)
    defaults = flatten(Config().to_dict())
    forbidden, allowed = [], []
    for key in sorted(set(old) | set(new)):
        if key not in new:
            forbidden.append(f"{key}: in the saved config, unknown to this tinyrl version")
            continue
        before = old.get(key, new[key] if key in UNRECORDED_BEFORE else defaults.get(key))
        if before == new[key]:
            continue
        line = f"{key}: {json.dumps(before)} -> {json.dumps(new[key])}"
        (allowed if changeable(key) else forbidden).append(line)
    return forbidden, allowed


def _kept_command(run_dir: Path) -> str | None:
    """The command run.json keeps, said as the way to resume: a `--resume` given with --preset
    (the kept --set options are read only without it) met every --set of the start as a change."""
    try:
        kept = json.loads((run_dir / RUN_FILE).read_text()).get("resume")
    except (OSError, ValueError, AttributeError):
        return None
    if not kept:
        return None
    return (f"`tinyrl {kept.split()[1]} --out {run_dir} --resume`, with --max-steps if you like, and without "
            "--preset: it reads the --preset and --set options the run keeps in run.json")


def check_resume(run_dir: Path, cfg: Config) -> list[str]:
    """Raise when the run's settings changed in a way its checkpoint cannot follow; return
    notices listing the allowed changes."""
    check_has_run(run_dir)
    path = run_dir / "config.json"
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise TinyRLError(f"--resume: cannot read {path}: {exc}",
                          hint="restore config.json from a copy, or start a new run in another --out") from exc
    forbidden, allowed = compare(saved, cfg.to_dict())
    if forbidden:
        raise TinyRLError(
            f"--resume: {len(forbidden)} setting(s) differ from the run's config.json and cannot change "
            "on resume (the checkpoint was made with the old values):\n"
            + "\n".join(f"  - {line}" for line in forbidden),
            hint=f"resume with the run's own settings ({_kept_command(run_dir) or 'its config.json'}), or start a "
                 f"new run with another --out; these may change on resume: {', '.join(c.rstrip('.') for c in CHANGEABLE)}")
    return [f"--resume: changed since the run began: {'; '.join(allowed)}"] if allowed else []


def load_for_resume(ckpt_dir: Path, notice) -> dict | None:
    """The newest readable checkpoint's state (None: there is none, start at step 0). Damaged
    newer ones are renamed aside and leftovers of kills removed, each said via `notice`."""
    for path in ckpt.clean_leftovers(ckpt_dir):
        notice(f"removed {path.name}, an incomplete checkpoint directory left by a kill")
    loaded = ckpt.load_latest_good(ckpt_dir)
    if loaded is None:
        return None
    for path, why in loaded.damaged:
        aside = ckpt.set_aside(path)
        notice(f"checkpoint {path.name} is damaged ({why}); renamed it to {aside.name} and resumed "
               f"from the previous one, {loaded.path.name}")
    return loaded.state
