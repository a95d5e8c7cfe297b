"""tinyrl_export.json: one writer and one reader (init_from, eval, export-verl and report read it)."""

from __future__ import annotations

import json

from tinyrl.export_info import MARKER, ExportInfo, read_export


def test_what_an_export_writes_is_what_its_readers_get(tmp_path):
    info = ExportInfo("runs/sft", 40, "Qwen/Qwen2.5-0.5B", {"name": "arith", "operands": [3, 4]})
    info.write(tmp_path)
    assert json.loads((tmp_path / MARKER).read_text()) == {"run_dir": "runs/sft", "step": 40,
                                                          "base": "Qwen/Qwen2.5-0.5B",
                                                          "task": {"name": "arith", "operands": [3, 4]}}
    assert read_export(tmp_path) == info


def test_an_older_export_has_no_base_or_task_and_other_directories_no_record(tmp_path):
    (tmp_path / MARKER).write_text(json.dumps({"run_dir": "runs/sft", "step": 1}))
    assert read_export(tmp_path) == ExportInfo("runs/sft", 1, None, None)
    for text in ("{not json", "[1, 2]", '{"step": 1}', '{"run_dir": "r", "step": "1"}'):
        (tmp_path / MARKER).write_text(text)
        assert read_export(tmp_path) is None, text
    assert read_export(tmp_path / "nowhere") is None
