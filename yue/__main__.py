"""`python -m yue`: the `yue` command."""

from yue.cli import main

main()
