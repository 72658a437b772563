"""Bounds of the pool's SQL columns, declared outside `optico.pool` so that the command line and the
API can check what they are given without importing SQLAlchemy and the store (a second of start-up
for every `optico` command)."""

# The largest value of the pool's INTEGER columns (ids, trial indexes, event seqs): 32-bit on
# PostgreSQL. A larger number names no row, and the driver refuses to bind it, so every id the API
# or the CLI takes is checked against this first.
SQL_INT_MAX = 2**31 - 1
