"""gpuguard: layered GPU node health checks for Kubernetes GPU clusters."""

__version__ = "0.1.0"
