"""Sweeps: declared grids of runs, a resumable SQLite results store, local and Ray executors."""
