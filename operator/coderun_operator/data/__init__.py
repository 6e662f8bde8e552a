"""The data service (`python -m coderun_operator.data`): the one thing that talks S3 for sandboxes and callers,
behind grants the operator signs (grant.py); the operator itself imports the grants and the store's small calls
(store.py) and never streams bulk bytes. See README.md here and docs/data.md."""
