"""From what the sandbox left behind to a status: frame parsing, redaction, validation, status computation."""
