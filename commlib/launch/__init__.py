"""Launching jobs: ``commlibrun`` (launcher), the per-rank wrapper
(_rankwrap), MPI discovery, host and rank-count checks, job cleanup,
``--check-build`` and ``--restarts``.

Standard library only, and nothing is imported here: the launcher must work
without numpy or the compiled core. ``python -m commlib.launch`` is
``commlibrun``.
"""
