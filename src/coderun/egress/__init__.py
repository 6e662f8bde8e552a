"""Egress by name: what the operator and the egress proxy share (docs/egress.md).

Standard library only, and nothing of coderun outside this package: the proxy image runs these modules with
Debian's python3 and no pip (an import contract in .importlinter holds it). The operator imports the rules and
the credential (it mints a run's token); the proxy runs the helpers squid starts.
"""
