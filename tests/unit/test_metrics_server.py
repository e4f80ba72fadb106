"""The shared metrics and probe endpoint (metrics_server.py): it waits for connections
without polling, and still stops at once when shut down."""

from __future__ import annotations

import threading
import urllib.request

from gpuguard.agent.metrics import AgentMetrics
from gpuguard.metrics_server import serve


def test_the_endpoint_answers_and_stops_at_once_when_shut_down():
    metrics = AgentMetrics()
    server = serve(metrics, 0, host="127.0.0.1")
    url = f"http://127.0.0.1:{server.server_address[1]}"
    with urllib.request.urlopen(f"{url}/healthz", timeout=5) as answer:
        assert answer.status == 200
    metrics.ready.set()
    with urllib.request.urlopen(f"{url}/readyz", timeout=5) as answer:
        assert answer.read() == b"ok\n"
    done = threading.Event()
    threading.Thread(target=lambda: (server.shutdown(), done.set()), daemon=True).start()
    assert done.wait(2.0), "shutdown waited for a poll"
    server.server_close()


def test_an_endpoint_on_every_address_is_woken_on_loopback():
    server = serve(AgentMetrics(), 0)  # 0.0.0.0, as the agent and the controller serve it
    done = threading.Event()
    threading.Thread(target=lambda: (server.shutdown(), done.set()), daemon=True).start()
    assert done.wait(2.0), "shutdown waited for a poll"
    server.server_close()
