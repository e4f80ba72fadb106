"""The only package that talks to the Kubernetes API (through lightkube)."""
