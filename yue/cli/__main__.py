"""`python -m yue.cli`: the `yue` command."""

from yue.cli import main

main()
