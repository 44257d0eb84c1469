"""``python -m engrain``: the ``engrain`` command line."""

from ._cli import main

main()
