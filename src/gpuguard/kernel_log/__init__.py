"""The kernel log, one component (as node-problem-detector's kernel monitor).

Reading: ``followers`` follow it as it grows (``/dev/kmsg`` blocking reads, ``journalctl -k
-f``, or a file woken by ``inotify``), in bounded blocks of lines (``lines``).
Parsing: ``messages`` turns a line into a kernel event (Xid, SXid, EFA, link, PCIe, machine
check), ``topology`` names the GPU behind a PCIe port.
Incidents: ``incidents`` keys and counts the events, ``findings`` says what an incident
means, ``tally`` holds them bounded.
The check and the agent side: ``check`` scans a whole log once, ``state`` keeps incidents
across blocks (time to live, boot id, memory on the Node), ``monitor`` runs the follower
and hands the verdict to the node state.
"""
