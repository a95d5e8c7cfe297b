"""math-verify behind a pipe: one JSON line in ({"a": answer, "t": truth}), one line out ("1"/"0").

Run as a script by tinyrl.tasks.verify (`python -P _verify_worker.py SYS_PATH_JSON`, see
verify.worker_command), which kills it when a call runs past its time limit. SYS_PATH_JSON is
the parent's sys.path: the worker imports math-verify from exactly where the parent found it,
less this script's own directory (tinyrl/tasks/math.py would shadow the stdlib's math). Without
it (a person running the script to see why it fails) its own startup path is used. It imports
nothing of tinyrl, so it starts the same wherever tinyrl was imported from. math-verify's own
timeouts are signal based (not allowed off the main thread); here they are off and the parent
bounds the time instead.
"""

import json
import logging
import os
import sys
from functools import lru_cache


def main() -> None:
    if len(sys.argv) > 1:            # the parent's path: the math-verify it checked for
        here = os.path.realpath(os.path.dirname(__file__))
        sys.path[:] = [p for p in json.loads(sys.argv[1]) if os.path.realpath(p or os.curdir) != here]
    logging.disable(logging.WARNING)  # "Timeout is disabled ..." on every first call: we know
    from math_verify import parse, verify

    @lru_cache(maxsize=4096)
    def parsed(text: str):
        return parse("\\boxed{" + text + "}", parsing_timeout=None)

    sys.stdout.write("ready\n")
    sys.stdout.flush()
    for line in sys.stdin:
        try:
            item = json.loads(line)
            gold, pred = parsed(item["t"]), parsed(item["a"])
            ok = bool(gold) and bool(pred) and verify(gold, pred, timeout_seconds=None)
        except Exception:  # noqa: BLE001 - any failure to parse or compare is "not equivalent"
            ok = False
        sys.stdout.write("1\n" if ok else "0\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
