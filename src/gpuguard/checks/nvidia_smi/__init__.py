"""The checks of nvidia-smi."""
