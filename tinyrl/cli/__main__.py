"""`python -m tinyrl.cli`: the `tinyrl` command, with the same import path.

`python -m` puts the working directory first on sys.path; the `tinyrl` console script does not.
Left there, `reward.fn=my_reward:score` beside my_reward.py imported under `python -m` (the
tests' and the doctor's way to start a command) and was refused under `tinyrl`, so one of the
two was never the command a user runs. Dropped unless tinyrl itself is found only through it
(a source checkout run without installing).
"""

import os
import sys

import tinyrl

here = os.path.realpath(os.getcwd())
if sys.path and os.path.realpath(sys.path[0] or os.curdir) == here \
        and os.path.dirname(os.path.dirname(os.path.realpath(tinyrl.__file__))) != here:
    del sys.path[0]

from tinyrl.cli import main  # noqa: E402  (after the path is the console script's)

main()
