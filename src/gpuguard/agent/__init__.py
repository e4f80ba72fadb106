"""gpuguard agent: runs the checks on one node and publishes its health on the Node."""
