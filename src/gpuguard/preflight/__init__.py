"""The preflight gate: the admission webhook that adds gpuguard's check to GPU pods, its
TLS certificate, and the command the added init container runs (docs/preflight.md)."""
