"""``python -m trainsim.cli``: the same as the ``trainsim`` script."""

from trainsim.cli import main

main()
