"""The kernel log in the agent: ``followers`` read it as it grows (``/dev/kmsg``,
``journalctl -k -f``, a file) in bounded blocks of lines (``lines`` cuts an over-long
line), ``state`` turns its events into counted incidents and findings (time to live, boot
id, memory across restarts), ``monitor`` runs the follower and feeds the node state.
Scanning and parsing the lines is ``gpuguard.checks.kernel_log``'s."""
