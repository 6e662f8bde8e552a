"""What the tests share, so test modules import these, never one another: the runner's harness (`runner`), the
audit agent's sandbox (`audit`), the egress proxy's rules (`egress`), the controller's test runs and clock
(`controller`), the warm pool's (`warm`)."""
