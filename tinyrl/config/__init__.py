"""Run configuration: dataclasses loaded from presets/*.toml plus `key.sub=value` overrides.

What it knows: the names, types and defaults of every setting, and which combinations make no
sense (`problems_of()` lists all of them at once, each with what to set). What it does not know:
models' real limits beyond their shipped config (see tinyrl.model_specs) or the card (memory plan).
"""

from __future__ import annotations

# The package's modules, in the order they build on each other: schema (the dataclasses) <- files
# (where presets and data live) <- overrides (values onto a Config) <- notes, checks <- load. Every
# name a caller uses is here, so `from tinyrl.config import X` does not depend on that order.

from tinyrl.config.schema import (ModelConfig, DataConfig, VLLMConfig, RolloutConfig, AlgorithmConfig,
    DEFAULT_MICRO_TOKENS, LearnerConfig, ActorConfig, CriticConfig, TaskConfig, RewardConfig, TrainerConfig,
    SFTConfig, CostConfig, Config, resolve_rollout_is, get_setting, roles_of, has_critic)
from tinyrl.config.files import (REPO_ROOT, PRESETS_DIR, DATA_DIR, list_presets, presets_starting_from,
    read_preset, resolve_path, shipped_path)
from tinyrl.config.overrides import (MOVED, _migrate, set_key, TypedSets, apply_overrides, repeated_sets,
    layered)
from tinyrl.config.notes import IN_REWARD_KL, TOOL_SETTINGS, role_rate_notes, unread_setting_notes
from tinyrl.config.checks import (ADV_ESTIMATORS, LOSS_AGG_MODES, CHOICES, ESTIMATOR_NAMES_ELSEWHERE,
    FINETUNE_NAMES_ELSEWHERE, REFUSED_CHOICES, problems_of, _settings_of_type, AT_LEAST_ONE, ANY_INTEGER,
    SEED_LIMIT, MAX_CALL_S, MAX_TOOL_WORKERS, OWN_RULE, prompt_room)
from tinyrl.config.load import check_command, config_from_dict, load_config
