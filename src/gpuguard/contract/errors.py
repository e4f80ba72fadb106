"""The one error a malformed wire object raises."""

from __future__ import annotations


class ContractError(ValueError):
    """A Kubernetes object (or one of its annotations) gpuguard cannot read.

    ``obj`` names the object (``Node/gpu-1``, ``NodeRemediation/gpu-1-1733040000``) and
    ``field`` the part that is wrong (``metadata.annotations[gpuguard.io/report].layers``).
    """

    def __init__(self, obj: str, field: str, detail: str) -> None:
        super().__init__(f"{obj}: {field}: {detail}")
        self.obj = obj
        self.field = field
        self.detail = detail
