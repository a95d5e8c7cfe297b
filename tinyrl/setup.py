"""Everything a run needs before the first step, checked up front so nothing fails at step 400:
the device, the model path (the tiny model is built on first use), the tokenizer, the training
and test prompts tokenized and length-checked, and the reward function.

Training data is generated on first use only at the preset's own data.train_path (a path
tinyrl owns) and only when the task can make it (Countdown, generated maths); a path the user
set must exist. The settings that made a generated file (what the task's generator receives:
task options, template, size, seed) are recorded beside it (`train.settings.json`); a run whose
settings differ from that record, or that finds an older file without one, gets data of its own
in `settings-<digest>/` beside it. A generated file is never replaced: a run using it (now, or
on --resume) keeps reading the same rows.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tinyrl.config import Config, prompt_room, resolve_path
from tinyrl.errors import TinyRLError
from tinyrl.writable import nearest_sibling, place_new

log = logging.getLogger(__name__)


@dataclass
class RunInputs:
    device: torch.device
    model_path: str
    tokenizer: Any
    pad_id: int
    train_prompts: list[list[int]]   # token ids per row
    train_rows: list[dict]           # the dataset rows, handed to the reward function
    test_prompts: list[list[int]]
    test_rows: list[dict]
    reward_fn: Any                   # tinyrl.tasks.rewards.RewardSet: callable (completion, row) -> float
    val_sets: list = field(default_factory=list)  # data.val_files: (name, prompts, rows)
    tools: tuple[str, ...] = ()      # the task's tools (tinyrl.tools.TOOLS names): rollouts are episodes
    train_file: Path | None = None   # the files train_rows and test_rows were read from: a reward's
    test_file: Path | None = None    # error on a row names it (RewardSet.score_batch)


def pick_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise TinyRLError("trainer.device = cuda but torch sees no CUDA GPU",
                          hint="set trainer.device=cpu (slow for real models), or install a CUDA build of torch")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def generated_paths() -> set[str]:
    """The data.train_path values tinyrl owns: the built-in default and the shipped presets'.
    Only these are generated on first use; any other path is the user's and must exist."""
    import tomllib

    from tinyrl.config import DataConfig, list_presets

    paths = {DataConfig().train_path}
    for preset in list_presets().values():
        try:
            paths.add(tomllib.loads(preset.read_text())["data"]["train_path"])
        except (KeyError, OSError, tomllib.TOMLDecodeError):
            continue
    return paths


TEST_SIZE = 1024                 # the held-out tasks generated beside the training file
TEST_NAME = "test.parquet"       # ... under this name
RECORD_SUFFIX = ".settings.json"  # train.parquet -> train.settings.json: the settings that made it
KEYED = "settings-"              # runs/data/P/settings-<digest>/train.parquet: other settings' data


def owned_base(train_path: str) -> str | None:
    """The preset path (generated_paths) that data.train_path is, or is the settings-keyed copy
    of; None for a path of the user's."""
    owned = generated_paths()
    if train_path in owned:
        return train_path
    p = Path(train_path)
    if p.parent.name.startswith(KEYED) and (base := (p.parent.parent / p.name).as_posix()) in owned:
        return base
    return None


def generation_settings(cfg: Config) -> dict:
    """What the task's generator is given for this config (JSON values, so a record compares)."""
    from tinyrl.tasks import get_task, template_of

    task = get_task(cfg.task.name)
    settings = {"task": task.name, "sft": cfg.command == "sft", "train_size": cfg.data.generate_train_size,
                "test_size": TEST_SIZE, "seed": cfg.data.generate_seed, "template": template_of(cfg.task),
                "options": task.generate_options(cfg.task)}
    return json.loads(json.dumps(settings, sort_keys=True))


def record_path(train: Path) -> Path:
    return train.with_name(train.stem + RECORD_SUFFIX)


def recorded_settings(train: Path) -> dict | None:
    """The settings tinyrl recorded when it generated `train`; None without a (readable) record."""
    try:
        record = json.loads(record_path(train).read_text())
    except (OSError, ValueError):
        return None
    return record.get("settings") if isinstance(record, dict) and record.get("made_by") == "tinyrl" else None


# the settings' keys as the config names them
SETTING_KEYS = {"task": "task.name", "sft": "command", "train_size": "data.generate_train_size",
                "test_size": "test size", "seed": "data.generate_seed", "template": "task.template"}


def settings_differ(old: dict, new: dict) -> list[str]:
    flat = lambda d: {**{k: v for k, v in d.items() if k != "options"},  # noqa: E731
                      **{f"task.{k}": v for k, v in (d.get("options") or {}).items()}}
    a, b = flat(old), flat(new)
    return [f"{SETTING_KEYS.get(k, k)} {json.dumps(a.get(k))} -> {json.dumps(b.get(k))}"
            for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def _generates(cfg: Config) -> bool:
    from tinyrl.tasks import get_task

    task = get_task(cfg.task.name)
    make = task.generate_sft if cfg.command == "sft" else task.generate
    return make is not None and cfg.data.generate and cfg.data.generate_train_size >= 1


def settle_train_path(cfg: Config, resume_dir: Path | None = None) -> str | None:
    """Point data.train_path (and a data.test_path that is the test file generated beside it) at
    generated data made with this config's settings -> a line to say, or None when nothing moved.
    The preset's own path when it is missing (generated there) or its record matches; else
    `settings-<digest>/` beside it, generated on first use: the file another run made with other
    settings (or an older tinyrl, unrecorded) is left as it is. A --resume keeps its run's own
    file (config.json's data.train_path), which its checkpoint's data order belongs to.
    A user's own path is never touched; with data.generate=false neither (kept_as_it_is_note)."""
    base = owned_base(cfg.data.train_path)
    if base is None or not _generates(cfg):
        return None
    if resume_dir is not None:
        try:
            saved = json.loads((resume_dir / "config.json").read_text())["data"]["train_path"]
        except (OSError, ValueError, KeyError, TypeError):
            saved = None
        if isinstance(saved, str) and owned_base(saved) == base:
            cfg.data.train_path = saved
            return None
    settings = generation_settings(cfg)
    base_path = resolve_path(base)
    found = recorded_settings(base_path) if base_path.exists() else settings
    if found == settings:
        cfg.data.train_path = base
        return None
    before = cfg.data.train_path
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:10]
    keyed = Path(base).parent / f"{KEYED}{digest}"
    old_test = resolve_path(base).parent / TEST_NAME
    cfg.data.train_path = (keyed / Path(base).name).as_posix()
    made = resolve_path(cfg.data.train_path)
    if made.exists() and recorded_settings(made) != settings:
        from tinyrl.tasks import data_hint

        raise TinyRLError(f"data.train_path: {made} is not a file tinyrl generated with this run's settings "
                          "(no matching record beside it); it was not read or replaced",
                          hint=f"move it away, or set data.train_path to a file of your own ({data_hint(cfg)})")
    if resolve_path(cfg.data.test_path) == old_test:  # the held-out tasks generated beside it: these settings' too
        cfg.data.test_path = (keyed / TEST_NAME).as_posix()
    if cfg.data.train_path == before:  # settled already (the CLI said it at the start)
        return None
    why = (f"was generated with other settings ({'; '.join(settings_differ(found, settings))})" if found else
           "has no record of the settings that made it (generated by an older tinyrl)")
    return (f"data: {base} {why}; this run reads {cfg.data.train_path}"
            f"{' (generated now, once)' if not resolve_path(cfg.data.train_path).exists() else ''}, "
            f"made with its own settings; {base} is left as it is for the runs that use it")


def kept_as_it_is_note(cfg: Config) -> str | None:
    """data.generate=false on generated data recorded with other settings: a line saying the run
    trains on it anyway (until 2026-11-28 it did without a word, like the old --set operands)."""
    path = resolve_path(cfg.data.train_path)
    if (cfg.data.generate or owned_base(cfg.data.train_path) is None or not path.exists()
            or (found := recorded_settings(path)) is None):
        return None
    differ = settings_differ(found, generation_settings(cfg))
    if not differ:
        return None
    return (f"data: {cfg.data.train_path} was generated with other settings ({'; '.join(differ)}); "
            "data.generate = false, so this run trains on it as it is (set data.generate=true for data "
            "made with this run's settings)")


def held_out_note(cfg: Config, preset_cfg: Config) -> str | None:
    """A line when validation reads the preset's own test file (shipped, made with the preset's
    task settings) while the generated training data is made with other task options or
    template: the scores are of other tasks than the ones trained on. The held-out file generated
    beside the training data is named (settle_train_path first)."""
    if (owned_base(cfg.data.train_path) is None or not _generates(cfg) or not cfg.trainer.test_every
            or cfg.data.test_path != preset_cfg.data.test_path or cfg.task.name != preset_cfg.task.name):
        return None
    task_part = lambda c: {k: v for k, v in generation_settings(c).items()  # noqa: E731
                           if k in ("template", "options")}
    differ = settings_differ(task_part(preset_cfg), task_part(cfg))
    if not differ:
        return None
    beside = (Path(cfg.data.train_path).parent / TEST_NAME).as_posix()
    return (f"validation reads data.test_path = {cfg.data.test_path}, the preset's tasks, while this run's "
            f"training data is made with {'; '.join(differ)}: to validate on held-out tasks made like them, "
            f"--set data.test_path={beside}")


def check_train_path(cfg: Config) -> Path:
    """data.train_path resolved; a missing file is an error unless tinyrl generates it. The hint
    makes the file the preset's command reads (an SFT preset's: prompts with responses)."""
    from tinyrl.tasks import data_hint

    path = resolve_path(cfg.data.train_path)
    if path.is_dir():
        raise TinyRLError(f"data.train_path = {cfg.data.train_path} is a directory, not a parquet file",
                          hint=f"point it at the file, e.g. {path / 'train.parquet'}")
    if path.exists() or owned_base(cfg.data.train_path) is not None:
        return path
    near = nearest_sibling(path, lambda p: p.suffix == ".parquet" and not p.name.startswith("."))  # glob's *.parquet
    raise TinyRLError(
        f"data.train_path = {cfg.data.train_path}: file not found ({path.absolute()}); nothing was "
        "generated or written",
        hint=(f"did you mean {near}? " if near else "")
        + "check the path (relative paths start at the working directory), make data with "
        f"{data_hint(cfg)}, or leave data.train_path unset to use the preset's own "
        "(generated on first use)")


def check_data_rows(cfg: Config) -> None:
    """Every row the run scores, in the files there now (training, test, data.val_files; an SFT
    run's test file when it samples), as the task's reward reads its ground truth
    (tinyrl.tasks.check_rows). Called before the memory plan, model.init_from's merge and the
    model load: another task's file was found after them. A file tinyrl generates is the task's own.
    With data.chat_template = false every prompt is text or one message (check_one_message; an SFT
    file's single-turn prompts too: _check_sft_prompts)."""
    from tinyrl.data.io import check_one_message, load_prompts
    from tinyrl.eval import parse_data_args
    from tinyrl.tasks import data_hint, get_task, table_hint
    from tinyrl.tasks.rewards import check_reward_rows

    make = f"make a file of the {cfg.task.name} task's prompts with {data_hint(cfg)}"

    def check(name: str, max_rows: int | None) -> list | None:
        path = resolve_path(name)
        if not path.is_file():
            return None
        convert = table_hint(get_task(cfg.task.name), path, sft=cfg.command == "sft")
        rows = load_prompts(path, max_rows=max_rows, make=make, convert=convert).to_dict("records")
        if not cfg.data.chat_template:
            check_one_message(rows, path)
        check_reward_rows(cfg, rows, path)
        return rows

    rl = cfg.command != "sft"
    # the training file's size too: said here, not after the model and vLLM have loaded
    if rl and (train := check(cfg.data.train_path, None)) is not None:
        check_one_batch(len(train), "prompts", cfg.trainer.train_batch_size)
    if not rl and (n_rows := _parquet_rows(resolve_path(cfg.data.train_path))) is not None:
        check_one_batch(n_rows, "rows", cfg.trainer.train_batch_size)  # SFT: one row, one sample
    if not rl and not cfg.data.chat_template:
        for name in [cfg.data.train_path] + ([cfg.data.test_path] if cfg.trainer.test_every else []):
            _check_sft_prompts(resolve_path(name), cfg)
    if cfg.trainer.test_every and (rl or cfg.sft.val_generate):
        held_out = [cfg.data.test_path] + ([str(p) for _, p in parse_data_args(cfg.data.val_files)] if rl else [])
        for name in held_out:
            try:
                check(name, cfg.data.max_test_prompts)
            except TinyRLError as exc:
                own = "; or judge by a function of yours, which reads rows its own way: --set reward.fn=file.py:func"
                if rl:  # the preset's shipped test file under another task (--set task.name=mine): its fix is the path
                    setting = "data.test_path" if name == cfg.data.test_path else "data.val_files"
                    raise TinyRLError(exc.message, hint=f"this is a file validation scores ({setting}): give held-out "
                                      f"prompts of the {cfg.task.name} task there (--set {setting}=...), or train "
                                      f"without validation: --set trainer.test_every=0; {exc.hint}{own}") from exc
                # an SFT user's own conversations: the way out is the switch, not another file format
                raise TinyRLError(
                    f"sft.val_generate = true samples data.test_path's prompts and scores them with "
                    f"the {cfg.task.name} task, but {exc.message}",
                    hint="--set sft.val_generate=false to validate on the loss alone (val/loss), or set "
                         f"data.test_path to a file of the {cfg.task.name} task's prompts with their "
                         f"responses{own}") from exc


def _check_sft_prompts(path: Path, cfg: Config) -> None:
    """An SFT file's single-turn prompts (sft.prompt_key), as check_one_message. A file that is
    absent, unreadable or of another layout is left to the SFT loader, which says why."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tinyrl.data.io import check_one_message
    from tinyrl.sft.data import detect_format

    try:
        names = pq.ParquetFile(path).schema_arrow.names if path.is_file() else None
        if names is None or detect_format(names, cfg.sft) != "single":
            return
        prompts = pq.read_table(path, columns=[cfg.sft.prompt_key]).column(0).to_pylist()
    except (pa.ArrowException, OSError, ValueError, TinyRLError):
        return
    check_one_message([{"prompt": p} for p in prompts], path)


def _parquet_rows(path: Path) -> int | None:
    """A parquet file's row count from its footer, or None (absent or unreadable: the SFT
    loader says why, with the row)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path).metadata.num_rows if path.is_file() else None
    except (pa.ArrowException, OSError, ValueError):
        return None


def check_one_batch(n_rows: int, rows_are: str, batch: int) -> None:
    if n_rows < batch:
        raise TinyRLError(f"the training data has {n_rows} {rows_are}, fewer than one batch "
                          f"(trainer.train_batch_size = {batch})", hint="lower trainer.train_batch_size or use more data")


def ensure_train_data(cfg: Config, resume_dir: Path | None = None) -> Path:
    """The training file; the preset's own Countdown file is generated on first use, into a
    fresh temporary directory, then linked into place without replacing any existing file,
    with the record of its settings (settle_train_path picks the path those settings own).
    An SFT preset's (command = "sft"): prompts with reference responses instead.
    `resume_dir`: the run --resume continues (its own data file)."""
    sft = cfg.command == "sft"
    note = settle_train_path(cfg, resume_dir)
    if note:
        log.info("%s", note)
    path = check_train_path(cfg)
    if path.exists():
        return path
    import shutil
    import tempfile

    from tinyrl.tasks import data_hint, get_task, template_of

    task = get_task(cfg.task.name)
    make = task.generate_sft if sft else task.generate
    if make is None or not cfg.data.generate or cfg.data.generate_train_size < 1:
        raise TinyRLError(f"data.train_path = {cfg.data.train_path} does not exist and the {task.name} "
                          f"task does not generate it{' for SFT' if sft else ''}",
                          hint=f"make it with {data_hint(cfg)}")
    # INFO, not WARNING: this is the normal first run (the CLI shows this logger's INFO lines)
    log.info("generating %d %s tasks into %s (first use, once)", cfg.data.generate_train_size, task.name, path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fresh = Path(tempfile.mkdtemp(prefix=".tinyrl-generate-", dir=path.parent))
    try:
        train, test = make(fresh, cfg.data.generate_train_size, TEST_SIZE, seed=cfg.data.generate_seed,
                           template=template_of(cfg.task), **task.generate_options(cfg.task))
        # its held-out tasks (an SFT file's with their responses), if that name is free
        test_placed = place_new(test, path.parent / TEST_NAME)
        record = fresh / record_path(path).name
        record.write_text(json.dumps({"made_by": "tinyrl", "file": path.name,
                                      "test_file": TEST_NAME if test_placed else None,
                                      "settings": generation_settings(cfg)}, indent=1) + "\n")
        # the record before the file: whoever sees the file sees its record. One without its file
        # is an interrupted generation's, tinyrl's own: replaced.
        if record_path(path).is_file() and not path.exists():
            record_path(path).unlink(missing_ok=True)
        placed = place_new(record, record_path(path)) and place_new(train, path)
    finally:
        shutil.rmtree(fresh, ignore_errors=True)
    if not placed:
        raise TinyRLError(f"{path} (or its record) appeared while this run generated it; it was kept",
                          hint="run the same command again: it reads that file if its settings are this run's")
    return path


def load_tokenizer(model_path: str, chat_template: str = ""):
    """The model's tokenizer, left-padding; `chat_template` (model.custom_chat_template: Jinja
    text, or a file holding it) replaces the tokenizer's own."""
    from transformers import AutoTokenizer

    from tinyrl.model_specs import hub_load_options

    options, offline = hub_load_options(model_path)
    try:
        tok = AutoTokenizer.from_pretrained(model_path, **options)
    except OSError as exc:
        why = f"not in the Hugging Face cache, and {offline}" if offline else str(exc)
        raise TinyRLError(f"could not load the tokenizer of {model_path!r}: {why}",
                          hint="check model.name; on a machine without internet use a local directory, or a "
                               "model in the Hugging Face cache") from exc
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    if chat_template:
        tok.chat_template = read_chat_template(chat_template)
    return tok


def read_chat_template(setting: str) -> str:
    """model.custom_chat_template: a path to an existing file is read; anything else is the
    template itself (Jinja always holds '{'; a path never needs one). A relative path is looked
    up as data paths are (config.resolve_path): the working directory, then the repository, so
    the presets' shipped templates (presets/chat_templates/) are found from anywhere."""
    if "{" not in setting and len(setting) < 4096:  # resolved only then: template text is no file name
        path = resolve_path(setting)
        if not path.is_file():
            raise TinyRLError(f"model.custom_chat_template = {setting}: no such file, and not a Jinja template",
                              hint="give the template text ({% for m in messages %}...) or a path to a file holding it")
        return path.read_text()
    return setting


def tokenize_rows(path: Path, tokenizer, max_len: int, max_rows: int | None = None,
                  chat: bool = False, tools: tuple[str, ...] = (), room: int | None = None,
                  ) -> tuple[list[list[int]], list[dict]]:
    """`tools`: the task's tools, whose schemas the chat template lists in each prompt. `room`:
    the largest max_len the model takes (config.prompt_room), so a too-long prompt's hint never
    asks for a length the config check then refuses."""
    from tinyrl.data.io import chat_text, load_prompts, prompt_messages, prompt_text

    frame = load_prompts(path, max_rows=max_rows)
    rows = frame.to_dict("records")
    schemas = tool_schemas(tools)
    texts = []
    for i, row in enumerate(rows):
        try:  # data.chat_template: the messages through the tokenizer's template (tinyrl.data.io)
            texts.append(chat_text(row, tokenizer, schemas) if chat else prompt_text(row))
        except TinyRLError as exc:  # say where: a 327,680-row file has one bad row
            raise TinyRLError(f"{path} row {i} (counting from 0): {exc.message}", hint=exc.hint) from exc
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    # Through a chat template an empty message is never an empty prompt (the template's role words
    # remain): a row of empty messages trained and validated on nothing but those.
    empty = [i for i, x in enumerate(ids)
             if not x or (chat and not "".join(m["content"] for m in prompt_messages(rows[i])).strip())]
    if empty:  # a model cannot continue nothing (all of them empty used to crash step 1 in the embedding)
        raise TinyRLError(
            f"{len(empty)} of {len(ids)} prompts in {path} are empty (first at row {empty[0]}, counting from 0)",
            hint="check the file's prompt column (`prompt`: text, or [{'role': 'user', 'content': ...}] with "
            "non-empty content), or drop those rows")
    too_long = [(i, len(x)) for i, x in enumerate(ids) if len(x) > max_len]
    if too_long:
        worst = max(n for _, n in too_long)
        raise TinyRLError(
            f"{len(too_long)} of {len(ids)} prompts in {path} are longer than data.max_prompt_length = "
            f"{max_len} tokens (the longest has {worst}; first at row {too_long[0][0]})",
            hint=_too_long_hint(worst, room))
    return ids, rows


def _too_long_hint(worst: int, room: int | None) -> str:
    if room is not None and worst > room:
        return (f"drop or shorten those rows: beside rollout.max_response_length this model takes prompts of "
                f"at most {room} tokens (data.max_prompt_length={room})")
    return (f"set data.max_prompt_length={worst} (and keep prompt + response within the model's limit), "
            "or drop those rows")


def tool_schemas(names: tuple[str, ...]) -> list[dict]:
    """The OpenAI function schemas of tools named in tinyrl.tools.TOOLS, in order."""
    if not names:
        return []
    from tinyrl.tools import TOOLS

    return [TOOLS[name].schema for name in names]


def prepare_inputs(cfg: Config, run_dir: Path | None = None, resume: bool = False) -> RunInputs:
    """`run_dir`: where model.init_from's starting model is written (tinyrl.init_from); with
    `resume`, the run whose own generated data file is read again."""
    from tinyrl.init_from import model_path_of
    from tinyrl.tasks import offered_tools
    from tinyrl.tasks.rewards import build_rewards

    device = pick_device(cfg.trainer.device)
    reward_fn = build_rewards(cfg, run_dir)  # prints: RUN_DIR/reward_prints.log; user functions get reward.timeout_s (tinyrl.rewards.limits)
    train_path = ensure_train_data(cfg, run_dir if resume and run_dir is not None else None)
    model_path = model_path_of(cfg, run_dir)
    tok = load_tokenizer(model_path, cfg.model.custom_chat_template)
    tools = offered_tools(cfg.task)  # the task's and task.extra_tools', registered in tinyrl.tools.TOOLS
    chat = dict(chat=cfg.data.chat_template, tools=tools, room=prompt_room(cfg))
    train_prompts, train_rows = tokenize_rows(train_path, tok, cfg.data.max_prompt_length, **chat)
    test_prompts, test_rows, test_path = [], [], None
    if cfg.trainer.test_every:
        test_path = resolve_path(cfg.data.test_path)
        test_prompts, test_rows = tokenize_rows(test_path, tok, cfg.data.max_prompt_length,
                                                max_rows=cfg.data.max_test_prompts, **chat)
    val_sets = []
    if cfg.trainer.test_every:
        from tinyrl.eval import parse_data_args

        for name, path in parse_data_args(cfg.data.val_files):
            prompts, rows = tokenize_rows(resolve_path(str(path)), tok, cfg.data.max_prompt_length,
                                          max_rows=cfg.data.max_test_prompts, **chat)
            val_sets.append((name, prompts, rows))
    return RunInputs(device, model_path, tok, tok.pad_token_id, train_prompts, train_rows,
                     test_prompts, test_rows, reward_fn, val_sets, tools, train_path, test_path)
