"""`python -m optico.cli`."""

from optico.cli import main

main()
