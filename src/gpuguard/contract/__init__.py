"""The wire between gpuguard's agent, controller, chart and simulator.

Every name written on a Kubernetes object (labels, taints, annotations, condition types)
and every document kept in one (the node report, the kernel memory, the verify request
and answer, the NodeRemediation, the breaker state) is defined here once, as a typed
model. Reading one from the cluster gives a valid model or a ``ContractError`` naming the
object and the field. This package imports only ``gpuguard.model`` and the model
libraries: the agent, the controller and the simulator all depend on it, never on each
other.

The Node annotations (report, memory) are msgspec Structs: the controller decodes one for
every Node event of a fleet of thousands. The cluster objects written rarely
(NodeRemediation, breaker) are pydantic models, whose JSON schema the CRD is generated from.
"""
