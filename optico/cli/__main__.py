"""`python -m optico.cli`."""

from optico.cli import app

app()
