"""What a run's program touched, from gVisor's runtime monitoring (docs/audit.md): the remote sink's framing
(wire), the trace session the nodes run (trace_config), and the pure per-run summary (summary, processes, paths,
sockaddr). Needs the `audit` extra (protobuf); nothing else in coderun imports it. README.md says where it ships."""
