"""What a GPU found wanting under real work calls for.

A fail-slow GPU still computes correctly: the job may run on to its next checkpoint, then
the node is drained and replaced (the job resumes from that checkpoint on healthy nodes).
Wrong answers cannot wait: a replica whose parameters, or whose gradients of the job's
probe batch, disagree with the other replicas' is repaired at once.
"""

from __future__ import annotations

from gpuguard.checks.rules import Rule, table
from gpuguard.model import Action, Severity

IN_JOB_FAIL_SLOW = "IN_JOB_FAIL_SLOW"
IN_JOB_LINK_SLOW = "IN_JOB_LINK_SLOW"
IN_JOB_REPLICA_MISMATCH = "IN_JOB_REPLICA_MISMATCH"
IN_JOB_COMPUTE_MISMATCH = "IN_JOB_COMPUTE_MISMATCH"
IN_JOB_VERDICT_INVALID = "IN_JOB_VERDICT_INVALID"
LOAD_CLOCK_BELOW_SIBLINGS = "LOAD_CLOCK_BELOW_SIBLINGS"

RULES: dict[str, Rule] = table(
    Rule(
        IN_JOB_FAIL_SLOW,
        Severity.WARNING,
        Action.REPLACE,
        "the job's slowest rank paces every synchronous step; its answers are right, so the"
        " drain waits for the job's next checkpoint",
        deferred=True,
    ),
    Rule(
        IN_JOB_REPLICA_MISMATCH,
        Severity.CRITICAL,
        Action.REPLACE,
        "identical replicas hold different parameters: this GPU's results are wrong now",
    ),
    Rule(
        IN_JOB_COMPUTE_MISMATCH,
        Severity.CRITICAL,
        Action.REPLACE,
        "identical replicas computing the same probe batch got different gradients: this"
        " GPU computes wrong values now, and the all-reduce spreads them to every replica",
    ),
    Rule(
        IN_JOB_LINK_SLOW,
        Severity.WARNING,
        Action.NONE,
        "the rank computes at its peers' pace but communicates slower: a link or a peer,"
        " not this GPU (the network checks judge the link)",
    ),
    Rule(
        IN_JOB_VERDICT_INVALID,
        Severity.INFO,
        Action.NONE,
        "a file in the verdict directory that is not a verdict about this node: reported,"
        " never acted on",
    ),
    Rule(
        LOAD_CLOCK_BELOW_SIBLINGS,
        Severity.WARNING,
        Action.RESET_GPU,
        "a GPU that clocks below identical GPUs at the same load is slow under load; its"
        " answers are right, so the reset waits until its work ends, and the verify gate's"
        " deep suite decides whether it returns",
        deferred=True,
    ),
)
