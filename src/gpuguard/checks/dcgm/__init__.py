"""The checks of DCGM (dcgmi and dcgm-exporter)."""
