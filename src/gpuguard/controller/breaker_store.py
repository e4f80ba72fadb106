"""The fleet circuit breaker's state, kept in a ConfigMap so it survives a new leader.

An operator closes an open breaker by annotating the ConfigMap:
``kubectl -n gpuguard annotate configmap gpuguard-controller-state gpuguard.io/reset-breaker=now``.
"""

from __future__ import annotations

import logging

from gpuguard.contract.breaker import DATA_KEY, Breaker, decode_breaker, encode_breaker
from gpuguard.contract.errors import ContractError
from gpuguard.contract.keys import BREAKER_CONFIGMAP, BREAKER_RESET_ANNOTATION
from gpuguard.kube.rest import Json, KubeApi, KubeNotFound, Resource
from gpuguard.remediation.model import BreakerState

log = logging.getLogger("gpuguard.controller")

CONFIGMAPS = Resource("/api/v1", "configmaps", namespaced=True)
RESET_POLL_S = 5.0


class BreakerStore:
    def __init__(self, api: KubeApi, namespace: str) -> None:
        self.api = api
        self.path = CONFIGMAPS.path(BREAKER_CONFIGMAP, namespace=namespace)
        self.configmap = f"{namespace}/{BREAKER_CONFIGMAP}"
        self.collection = CONFIGMAPS.path(namespace=namespace)
        self.state = BreakerState()
        self._saved: BreakerState | None = None
        self._reset_pending = False
        self._reset_checked_at = float("-inf")

    def load(self) -> None:
        try:
            data = (self.api.get(self.path).get("data") or {}).get(DATA_KEY)
        except KubeNotFound:
            data = None
        self.state = self._decode(data) if data else BreakerState()
        self._saved = self.state

    def reset_requested(self, now: float) -> bool:
        """True once per operator reset (the annotation is removed when the reset is saved).

        Read at most every ``RESET_POLL_S``: a reconcile runs on every Node change."""
        if now - self._reset_checked_at < RESET_POLL_S:
            return self._reset_pending
        self._reset_checked_at = now
        try:
            annotations = self.api.get(self.path)["metadata"].get("annotations") or {}
        except KubeNotFound:
            return False
        self._reset_pending = BREAKER_RESET_ANNOTATION in annotations
        return self._reset_pending

    def save(self, state: BreakerState) -> None:
        self.state = state
        if state == self._saved and not self._reset_pending:
            return
        body: Json = {"data": {DATA_KEY: encode_breaker(_wire(state))}}
        if self._reset_pending:
            body["metadata"] = {"annotations": {BREAKER_RESET_ANNOTATION: None}}
        try:
            self.api.patch(self.path, body)
        except KubeNotFound:
            self.api.create(
                self.collection,
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": BREAKER_CONFIGMAP},
                    **body,
                },
            )
        self._saved, self._reset_pending = state, False

    def _decode(self, text: str) -> BreakerState:
        """The saved state; a closed breaker when it cannot be read (the next save
        overwrites it)."""
        try:
            saved = decode_breaker(text, configmap=self.configmap)
        except ContractError as exc:
            log.warning("breaker state unreadable, starting closed: %s", exc)
            return BreakerState()
        return BreakerState(
            open=saved.open, opened_at=saved.opened_at, reason=saved.reason, reset_at=saved.reset_at
        )


def _wire(state: BreakerState) -> Breaker:
    return Breaker(
        open=state.open, opened_at=state.opened_at, reason=state.reason, reset_at=state.reset_at
    )
