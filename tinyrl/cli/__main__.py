"""`python -m tinyrl.cli`: the `tinyrl` command."""

from tinyrl.cli import main

main()
