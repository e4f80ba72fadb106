"""gpuguard controller: feeds the fleet to the remediation policy and applies its decisions."""
