"""Mechanics every other package builds on: processes, git, locks, stages, atomic files.

Nothing in here imports another servegate subpackage.
"""
