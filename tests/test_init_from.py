"""model.init_from's notices: what a run says about the model it started from."""

from __future__ import annotations

import json

from tinyrl.init_from import MARKER, describe


def test_a_resumed_run_says_it_resumes_at_its_own_step_and_names_its_base(tmp_path):
    """On --resume it said "starting from runs/sft at step 1", which read as if the RL run went
    back to step 1 of the SFT run; it goes on from its own latest checkpoint."""
    model = tmp_path / "init_model"
    model.mkdir()
    (model / MARKER).write_text(json.dumps({"run_dir": "runs/sft", "step": 1}))
    assert describe(model) == f"model.init_from: starting from runs/sft at step 1 ({model})"
    resumed = describe(model, resume=True)
    assert "starting from" not in resumed
    assert f"the base of this run is runs/sft at step 1 ({model})" in resumed
    assert "resumes from its own latest checkpoint" in resumed
