"""The cross-node (gang) check: the gang's pods meet with torch.distributed, run a short
all-reduce series, and name the member the others waited on (docs/gang-check.md)."""
