"""The checks of the network."""
