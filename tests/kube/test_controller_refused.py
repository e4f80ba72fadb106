"""A controller whose ServiceAccount may not watch something (an older chart's RBAC) backs
off and says so once, instead of retrying and warning every two seconds."""

from __future__ import annotations

import logging
import threading
import time
import uuid

import yaml

from gpuguard.controller.watches import Watched, start
from gpuguard.kube.jobs import JOBS, slim_job
from gpuguard.kube.rest import load_api
from tests.support.controllers import new_controller


def test_a_refused_watch_backs_off_and_warns_once(api, namespace, control_plane, tmp_path, caplog):
    account = f"no-rights-{uuid.uuid4().hex[:6]}"
    api.create(
        f"/api/v1/namespaces/{namespace}/serviceaccounts",
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account}},
    )
    kubeconfig = tmp_path / "no-rights.kubeconfig"
    token = control_plane.service_account_token(namespace, account)
    kubeconfig.write_text(yaml.safe_dump(control_plane.kubeconfig_for_token(token)))
    calls = []
    with load_api(kubeconfig) as refused_api:
        original = refused_api.list

        def counted(*args, **kwargs):
            calls.append(time.monotonic())
            return original(*args, **kwargs)

        refused_api.list = counted  # type: ignore[method-assign]
        # Short pauses: a streak of refusals inside the test.
        controller = new_controller(refused_api, namespace, retry_s=0.05)
        stop = threading.Event()
        with caplog.at_level(logging.WARNING, logger="gpuguard.controller"):
            jobs = Watched("jobs", JOBS.path(), controller.workloads.take_jobs, slim_job)
            (follower,) = start(refused_api, [jobs], stop, controller.metrics, 0.05)
            time.sleep(2.0)  # the window the tries are counted in: a rate needs a span of time
            stop.set()
            follower.join(5)

    assert not follower.is_alive()
    refusals = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 1, [r.getMessage() for r in caplog.records]
    assert "403" in refusals[0].getMessage() or "forbidden" in refusals[0].getMessage().lower()
    # 0.1, 0.2, 0.4, 0.8 s ...: a handful of tries in 2 s, not one every 0.05 s.
    assert 2 <= len(calls) <= 6, calls
