{{/*
Shared names, labels and decisions of the orchard-env chart.
*/}}

{{/* Name prefix of every object: `<release>-operator` unless fullnameOverride is set. */}}
{{- define "orchard-env.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-operator" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels that select the operator pods. The operator also uses them (ORCHARD_OPERATOR_POD_SELECTOR)
in the per-namespace baseline NetworkPolicy that admits traffic to sandbox agents only from these pods. */}}
{{- define "orchard-env.selectorLabels" -}}
app.kubernetes.io/name: orchard-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The selector labels as a `key=value,key=value` selector string. */}}
{{- define "orchard-env.selectorString" -}}
{{- printf "app.kubernetes.io/name=orchard-operator,app.kubernetes.io/instance=%s" .Release.Name -}}
{{- end -}}

{{/* Labels of every object of the release. */}}
{{- define "orchard-env.labels" -}}
{{ include "orchard-env.selectorLabels" . }}
app.kubernetes.io/part-of: orchard-env
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* Name of the operator's ServiceAccount. */}}
{{- define "orchard-env.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "orchard-env.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* An image reference from {repository, tag, digest}; the tag defaults to the chart's appVersion. */}}
{{- define "orchard-env.image" -}}
{{- $image := index . 0 -}}
{{- $chart := index . 1 -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $image.repository $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $image.repository (default $chart.AppVersion $image.tag) -}}
{{- end -}}
{{- end -}}

{{/* "true" when leader election is on: `auto` means on exactly when replicas > 1. Two replicas without a
Lease would both write (duplicate pods, racing status), so that combination is refused. */}}
{{- define "orchard-env.leaderElection" -}}
{{- $setting := toString .Values.leaderElection.enabled -}}
{{- $enabled := "" -}}
{{- if eq $setting "auto" -}}
{{- $enabled = ternary "true" "false" (gt (int .Values.replicas) 1) -}}
{{- else if or (eq $setting "true") (eq $setting "false") -}}
{{- $enabled = $setting -}}
{{- else -}}
{{- fail (printf "leaderElection.enabled must be auto, true or false (got %q)" $setting) -}}
{{- end -}}
{{- if and (eq $enabled "false") (gt (int .Values.replicas) 1) -}}
{{- fail "replicas > 1 needs leader election: set leaderElection.enabled to auto or true" -}}
{{- end -}}
{{- $enabled -}}
{{- end -}}

{{/*
RBAC rules on namespaced resources: exactly what the Sandbox and RolloutGroup controllers and the gateway
call. Granted cluster-wide (ClusterRole) or, with watchNamespace, by a Role in that namespace.
config/rbac/role.yaml holds the same rules (e2e/tests/no_cluster/manifests_rbac.rs compares them); no wildcards.
*/}}
{{- define "orchard-env.namespacedRules" -}}
# Sandboxes: watched, created by RolloutGroups and the gateway, deleted at their deadline; heartbeats are
# merge patches of an annotation.
- apiGroups: ["orchard.dev"]
  resources: ["sandboxes"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Status writes are JSON patches (never a PUT, never a read of the subresource).
- apiGroups: ["orchard.dev"]
  resources: ["sandboxes/status"]
  verbs: ["patch"]
# RolloutGroups: watched, created and deleted through the gateway; never patched.
- apiGroups: ["orchard.dev"]
  resources: ["rolloutgroups"]
  verbs: ["get", "list", "watch", "create", "delete"]
- apiGroups: ["orchard.dev"]
  resources: ["rolloutgroups/status"]
  verbs: ["patch"]
# RolloutQueues: watched for their limits; only their status is written.
- apiGroups: ["orchard.dev"]
  resources: ["rolloutqueues"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["orchard.dev"]
  resources: ["rolloutqueues/status"]
  verbs: ["patch"]
# SandboxPools: watched for their size and template; only their status is written.
- apiGroups: ["orchard.dev"]
  resources: ["sandboxpools"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["orchard.dev"]
  resources: ["sandboxpools/status"]
  verbs: ["patch"]
# SandboxSnapshots: watched, created through the gateway; their finalizer is added and removed with JSON
# patches; deleted through the gateway and when ttlSecondsAfterUnused runs out.
- apiGroups: ["orchard.dev"]
  resources: ["sandboxsnapshots"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["orchard.dev"]
  resources: ["sandboxsnapshots/status"]
  verbs: ["patch"]
# ResourceQuotas: read when a snapshot starts committing or becomes Ready, for its namespace's size quota
# (orchard.dev/snapshot-bytes); never watched or written.
- apiGroups: [""]
  resources: ["resourcequotas"]
  verbs: ["list"]
# Sandbox pods: created (POST), watched, deleted on failure or expiry; a pool member is patched
# once, when a Sandbox claims it (owner reference and labels).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Events on transitions: the kube Recorder creates events and patches them to aggregate repeats.
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
# The per-namespace baseline policy and per-sandbox egress policies.
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
{{- end -}}

{{/* Cluster-scoped rules: the gateway authenticates bearer tokens and authorizes each call; the API server's endpoints and the nodes' pod ranges are watched (cluster_ranges). */}}
{{- define "orchard-env.clusterRules" -}}
- apiGroups: ["authentication.k8s.io"]
  resources: ["tokenreviews"]
  verbs: ["create"]
- apiGroups: ["authorization.k8s.io"]
  resources: ["subjectaccessreviews"]
  verbs: ["create"]
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  resourceNames: ["kubernetes"]
  verbs: ["get", "list", "watch"]
{{- if .Values.sandboxEgress.discoverPodCidrs }}
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["list", "watch"]
{{- end }}
{{- end -}}

{{/* The release namespace: the leader-election Lease, read and renewed with PUT (never patched), and the agent-token key Secret, read at start and created by the first replica that finds none. `create` cannot be limited by resourceNames. */}}
{{- define "orchard-env.leaseRules" -}}
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  verbs: ["get", "create", "update"]
- apiGroups: [""]
  resources: ["secrets"]
  resourceNames: ["orchard-agent-token-key"]
  verbs: ["get"]
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create"]
{{- end -}}

{{- define "orchard-env.snapshotRules" -}}
# Committer pods of SandboxSnapshots: created (POST), watched, deleted once they reported.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "delete"]
{{- end -}}

{{/* Labels that select the egress proxy's pods (never the operator's: only operator pods reach agents). */}}
{{- define "orchard-env.egressSelectorLabels" -}}
app.kubernetes.io/name: orchard-egress
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels of the egress proxy's objects. */}}
{{- define "orchard-env.egressLabels" -}}
{{ include "orchard-env.egressSelectorLabels" . }}
app.kubernetes.io/component: egress-proxy
app.kubernetes.io/part-of: orchard-env
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* Cluster-scoped RBAC of the egress proxy (a ClusterRole in both install modes): the ranges it never
connects to, read as the operator reads them: the API server's endpoints (EndpointSlice
default/kubernetes only, watched), the nodes' pod ranges (with sandboxEgress.discoverPodCidrs) and the
service ranges (ServiceCIDR objects, listed every minute). */}}
{{- define "orchard-env.egressClusterRules" -}}
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  resourceNames: ["kubernetes"]
  verbs: ["get", "list", "watch"]
{{- if .Values.sandboxEgress.discoverPodCidrs }}
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["list", "watch"]
{{- end }}
- apiGroups: ["networking.k8s.io"]
  resources: ["servicecidrs"]
  verbs: ["list"]
{{- end -}}

{{/* RBAC of the egress proxy on namespaced resources, where it serves Sandboxes (the ClusterRole when
every namespace is watched, a Role in the one namespace with watchNamespace): Sandboxes watched (their
rules and pod IPs), status.egress written with JSON patches, denials recorded as events. */}}
{{- define "orchard-env.egressNamespacedRules" -}}
- apiGroups: ["orchard.dev"]
  resources: ["sandboxes"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["orchard.dev"]
  resources: ["sandboxes/status"]
  verbs: ["patch"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end -}}
