"""The names gpuguard writes on Kubernetes objects (the chart's RBAC and admission
policies refer to the same strings)."""

from __future__ import annotations

GROUP = "gpuguard.io"

# On a Node.
TAINT_KEY = "gpuguard.io/unhealthy"
TAINT_EFFECT = "NoSchedule"
EXCLUDE_LABEL = "gpuguard.io/exclude"
REPORT_ANNOTATION = "gpuguard.io/report"  # the agent's node report (contract.report)
MEMORY_ANNOTATION = "gpuguard.io/kernel-findings"  # the agent's kernel memory
VERIFY_REQUEST_ANNOTATION = "gpuguard.io/verify-requested"  # the controller's request id
# A request for the node's RMA evidence (any id; a person's or the controller's), and the
# agent's answer: JSON {"request": id, "location": where the archive is}.
EVIDENCE_REQUEST_ANNOTATION = "gpuguard.io/collect-evidence"
EVIDENCE_ANNOTATION = "gpuguard.io/evidence"
CORDONED_BY_US_ANNOTATION = "gpuguard.io/cordoned"
# A person's mark that the node's position (cable, optic, port) was repaired; taken off by
# the controller once read (docs/remediation.md, "Where a fault lives").
POSITION_FIXED_ANNOTATION = "gpuguard.io/position-fixed"
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"  # Karpenter's; honoured, never written
NODEPOOL_LABEL = "karpenter.sh/nodepool"  # Karpenter's: the NodePool that launched the node
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"

# On a Pod: the GPUs it was given, when known.
GPU_IDS_ANNOTATION = "gpuguard.io/gpu-ids"
# On a Pod: the controller's judgement that the infrastructure ended it (or will have,
# should it fail: written while it runs on a node gpuguard found at fault). A Job's
# podFailurePolicy ignores pods with it True (examples/jobs/).
INFRASTRUCTURE_FAILURE_CONDITION = "gpuguard.io/InfrastructureFailure"

# The breaker's ConfigMap, in the controller's namespace.
BREAKER_CONFIGMAP = "gpuguard-controller-state"
BREAKER_RESET_ANNOTATION = "gpuguard.io/reset-breaker"

# Reporting controllers of Events (events.k8s.io ``reportingController``).
AGENT_CONTROLLER = "gpuguard.io/agent"
CONTROLLER_CONTROLLER = "gpuguard.io/controller"
