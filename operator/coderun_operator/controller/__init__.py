"""Reconciliation: the pure core's decisions carried out through k8s.py. Handlers call only `Controller`."""
from .core import Controller, to_wire

__all__ = ["Controller", "to_wire"]
