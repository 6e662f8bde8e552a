"""coderun: run agent-written code in gVisor sandboxes on Kubernetes (the SDK, the CLI, the MCP server)."""

# The one version: the package's metadata reads it (pyproject.toml), `coderun --version` and the MCP server print it,
# and charts/coderun/Chart.yaml states the same (tests/unit/test_packaging.py). A literal, with no imports: the
# egress proxy's image imports this package on the standard library alone.
__version__ = "0.1.0"
