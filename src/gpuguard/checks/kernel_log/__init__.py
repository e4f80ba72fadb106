"""The checks of the kernel log."""
