"""gVisor's trace point schema (pkg/sentry/seccheck/points/*.proto, Apache-2.0, copied verbatim from the gVisor
commit e2e/cluster/versions.sh pins) and the Python classes protoc compiled from it (`make audit-protos`)."""
