{{/* Names and labels shared by every template. */}}

{{- define "gpuguard.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpuguard.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "gpuguard.serviceAccountName" -}}
{{- default (include "gpuguard.fullname" .) .Values.serviceAccount.name }}
{{- end }}

{{/* The user name the API server gives the agent's ServiceAccount tokens. */}}
{{- define "gpuguard.serviceAccountUser" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "gpuguard.serviceAccountName" .) }}
{{- end }}

{{- define "gpuguard.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpuguard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "gpuguard.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "gpuguard.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: agent
{{- end }}

{{/* The agent's metrics port: probes, the container port and the Service all use it. */}}
{{- define "gpuguard.metricsPort" -}}
{{- $port := int .Values.config.metrics_port }}
{{- if not $port }}
{{- fail "config.metrics_port must not be 0: the liveness and readiness probes and the metrics Service use it" }}
{{- end }}
{{- $port }}
{{- end }}

{{/*
The Node condition types the agent owns: every type of every condition profile
(OWNED_TYPES in src/gpuguard/agent/conditions.py; the chart test checks they agree).
Rendered as a CEL list literal.
*/}}
{{- define "gpuguard.ownedConditionTypes" -}}
['GpuguardGPUHealthy', 'GpuguardNetworkHealthy', 'GpuguardKernelHealthy', 'AcceleratedHardwareReady', 'NetworkingReady', 'KernelReady']
{{- end }}

{{/*
CEL: the kubelet-reported fields of a Node's status are unchanged (CEL cannot iterate an
object's fields, so they are named one by one). For the agent's and the controller's
status writes.
*/}}
{{- define "gpuguard.kubeletStatusUnchanged" -}}
object.?status.?capacity == oldObject.?status.?capacity &&
object.?status.?allocatable == oldObject.?status.?allocatable &&
object.?status.?addresses == oldObject.?status.?addresses &&
object.?status.?daemonEndpoints == oldObject.?status.?daemonEndpoints &&
object.?status.?nodeInfo == oldObject.?status.?nodeInfo &&
object.?status.?phase == oldObject.?status.?phase &&
object.?status.?images == oldObject.?status.?images &&
object.?status.?volumesInUse == oldObject.?status.?volumesInUse &&
object.?status.?volumesAttached == oldObject.?status.?volumesAttached &&
object.?status.?config == oldObject.?status.?config
{{- end }}

{{/*
The controller's names and labels. Its pods get their own app.kubernetes.io/name
("<name>-controller"), not only another component label: the agent's DaemonSet and
headless Service select on name+instance, and a selector that also matched the controller's
pods would put them behind the agents' metrics Service. Changing the agent's selector
instead would make its (immutable) DaemonSet selector differ on upgrade.
*/}}
{{- define "gpuguard.controller.fullname" -}}
{{- printf "%s-controller" (include "gpuguard.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpuguard.controller.serviceAccountName" -}}
{{- default (include "gpuguard.controller.fullname" .) .Values.controller.serviceAccount.name }}
{{- end }}

{{- define "gpuguard.controller.selectorLabels" -}}
app.kubernetes.io/name: {{ printf "%s-controller" (include "gpuguard.name" .) | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "gpuguard.controller.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "gpuguard.controller.selectorLabels" . }}
app.kubernetes.io/part-of: {{ include "gpuguard.name" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: controller
{{- end }}

{{/* The controller's metrics port: flag, container port, probes and Service. */}}
{{- define "gpuguard.controller.metricsPort" -}}
{{- $port := int .Values.controller.metricsPort }}
{{- if not $port }}
{{- fail "controller.metricsPort must not be 0: the liveness and readiness probes and the metrics Service use it" }}
{{- end }}
{{- $port }}
{{- end }}

{{/*
The NodeRemediation status fields the controller owns: every property of status in
crds/noderemediations.yaml except result, the agent's (the chart test checks they agree).
*/}}
{{- define "gpuguard.remediationControllerStatusFields" -}}
[phase, rung, attempt, attempts, phaseSince, lastActionAt, gpus, cordonedByUs, exhausted, closedAt, resolution, machine, replacement, signature, positionFault, positionFixedAt, slowConfirmed, lastMessage, steps, request]
{{- end }}

{{/*
The agent's nodeSelector as a label selector ("k=v,k2=v2", keys sorted): the nodes the
controller counts in GPU-node availability are the nodes the agent runs on.
*/}}
{{- define "gpuguard.gpuNodeSelector" -}}
{{- $terms := list }}
{{- range $key, $value := .Values.nodeSelector }}
{{- $terms = append $terms (printf "%s=%s" $key $value) }}
{{- end }}
{{- join "," $terms }}
{{- end }}

{{/*
The API server override (apiServer) as env entries. In-cluster config reads
KUBERNETES_SERVICE_HOST/PORT; a container's own env wins over the kubelet's Service variables.
*/}}
{{- define "gpuguard.apiServerEnv" -}}
{{- with .Values.apiServer }}
{{- if or .host .port }}
{{- if not (and .host .port) }}
{{- fail "apiServer.host and apiServer.port are set together" }}
{{- end }}
- name: KUBERNETES_SERVICE_HOST
  value: {{ .host | quote }}
- name: KUBERNETES_SERVICE_PORT
  value: {{ .port | toString | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* hostNetwork and the DNS policy that keeps cluster DNS with it, for a pod spec. */}}
{{- define "gpuguard.hostNetwork" -}}
{{- if . }}
hostNetwork: true
dnsPolicy: ClusterFirstWithHostNet
{{- end }}
{{- end }}

{{/* The image every pod of the chart runs; image.repository has no default on purpose. */}}
{{- define "gpuguard.image" -}}
{{- $repository := required "image.repository is not set: build the image (make image), push it to a registry your nodes pull from, and install with --set image.repository=REGISTRY/gpuguard (README, Install on a cluster)" .Values.image.repository }}
{{- printf "%s:%s" $repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/* An alert's runbook: its own runbookUrl, else its section of docs/runbooks.md. */}}
{{- define "gpuguard.runbookUrl" -}}
{{- if .alert.runbookUrl }}
{{- .alert.runbookUrl }}
{{- else }}
{{- printf "%s#%s" (.root.Values.prometheusRule.runbookBaseUrl | default "docs/runbooks.md") (lower .name) }}
{{- end }}
{{- end }}

{{/* The preflight webhook's Secret and MutatingWebhookConfiguration (templates/preflight-webhook.yaml). */}}
{{- define "gpuguard.preflight.secret" -}}
{{- printf "%s-webhook-tls" (include "gpuguard.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpuguard.preflight.config" -}}
{{- printf "%s-preflight" (include "gpuguard.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
A pod wants GPUs: nvidia.com/gpu in a container's or init container's limits or requests,
or any resource claim (DRA). Mirrors src/gpuguard/preflight/mutate.py.
*/}}
{{- define "gpuguard.preflight.wantsGpus" -}}
{{- $asks := "has(c.resources.limits) && 'nvidia.com/gpu' in c.resources.limits || has(c.resources.requests) && 'nvidia.com/gpu' in c.resources.requests" -}}
object.spec.containers.exists(c, {{ $asks }}) || has(object.spec.initContainers) && object.spec.initContainers.exists(c, {{ $asks }}) || has(object.spec.resourceClaims) && size(object.spec.resourceClaims) > 0
{{- end }}
