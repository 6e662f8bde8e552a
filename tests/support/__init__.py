"""What the unit tests share: the controller's test runs and clock (`controller`), the warm pool's (`warm`).
Test modules import these, never one another."""
