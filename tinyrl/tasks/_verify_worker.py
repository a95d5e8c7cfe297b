"""math-verify behind a pipe: one JSON line in ({"a": answer, "t": truth}), one line out ("1"/"0").

Run as a plain script (`python _verify_worker.py`) by tinyrl.tasks.verify, which kills it when a
call runs past its time limit. It imports nothing of tinyrl, so it starts the same wherever
tinyrl was imported from. math-verify's own timeouts are signal based (not allowed off the main
thread); here they are off and the parent bounds the time instead.
"""

import json
import logging
import sys
from functools import lru_cache


def main() -> None:
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
