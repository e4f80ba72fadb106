"""Deep checks: the GPU and its links under real load, not only what they report.

A GPU can answer every query and still compute wrong results or run at half speed, and a
network adapter can be up at a fraction of its rate. These checks run work and measure:
matrix products (correctness across GPUs and against a CPU reference, throughput), memory
bandwidth and a pattern test, host-link, peer and all-reduce bandwidth, and a loopback
bandwidth test per network adapter. The work runs on a :class:`~.backend.Backend`
(PyTorch on GPU machines, NumPy-simulated devices in tests); every judgement is made by
backend-independent code (``judge``, ``figures``), so the tests exercise the real decisions.
"""
