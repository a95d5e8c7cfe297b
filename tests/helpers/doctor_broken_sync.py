"""Child process for the doctor's broken-sync test (vLLM allows one engine per process).

argv: OUT_JSON, then extra `tinyrl doctor` arguments. Breaks the vLLM engine's weight/adapter
sync on purpose (VLLMEngine.sync_weights becomes a no-op: the push never reaches the engine),
then runs the real `tinyrl doctor` command with the vLLM engine; its exit code is the doctor's.
"""

from __future__ import annotations

import sys


def main() -> None:
    out, extra = sys.argv[1], sys.argv[2:]
    from tinyrl.rollout.vllm_engine import VLLMEngine

    VLLMEngine.sync_weights = lambda self, model: None  # the bug under test
    from tinyrl.cli import main as cli_main

    sys.argv = ["tinyrl", "doctor", "--preset", "countdown-tiny", "--set", "rollout.engine=vllm",
                "--json", "--out", out, *extra]
    cli_main()


if __name__ == "__main__":
    main()
