"""Reading a component's metrics in tests through the registry, as a scrape would."""

from __future__ import annotations

from prometheus_client import CollectorRegistry


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    """The sample's value; 0 when the registry has none yet (a labelled counter not yet
    incremented for these labels)."""
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value
