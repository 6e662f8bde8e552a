"""Reconciliation: the pure core's decisions carried out through k8s.py. Handlers call only `Controller`.

`reconcile` (one reconcile per run: admit -> start -> collect -> finish) over `store`; `writer` (the one status
writer); `children` (the run's objects in the API); `identity` (who created a run); `warm/` (the warm pool).
"""
from .reconcile import Controller

__all__ = ["Controller"]
