"""Fleet simulator: the remediation policy core driven in simulated time (docs/simulator.md)."""
