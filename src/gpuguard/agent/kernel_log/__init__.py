"""The kernel log in the agent: ``followers`` read it as it grows (``/dev/kmsg``,
``journalctl -k -f``, a file), ``state`` turns its events into findings (time to live,
boot id, memory across restarts), ``monitor`` runs the follower and feeds the node state.
Scanning and parsing the lines is ``gpuguard.checks.kernel_log.check``'s."""
