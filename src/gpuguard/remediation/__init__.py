"""The pure remediation policy: observed state and time in, decisions out."""
