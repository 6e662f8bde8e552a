"""What runs inside the sandbox: `runner.py`, a single stdlib-only file copied as-is into every sandbox image.
The operator imports its protocol constants from it, so both sides of the frame are spelt in one place."""
