{{/* Names and labels shared by every object of the chart. */}}

{{- define "coderun.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 50 | trimSuffix "-" -}}
{{- end -}}

{{/* 50 characters at most, so that the Services' names, suffixed (-egress-proxy), stay within 63. */}}
{{- define "coderun.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else if contains (include "coderun.name" .) .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "coderun.name" .) | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "coderun.selectorLabels" -}}
app.kubernetes.io/name: {{ include "coderun.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{/*
The labels every object of the chart carries beside its component's selector labels: the chart's standard ones,
then the platform's own (commonLabels). Never in a selector: selectors cannot change across upgrades.
*/}}
{{- define "coderun.commonLabels" -}}
app.kubernetes.io/part-of: coderun
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- with include "coderun.platformLabels" . }}
{{ . }}
{{- end }}
{{- end -}}

{{/*
The platform's commonLabels alone (pod templates carry these, not the chart's version labels). A key the chart sets
itself, or one under coderun.io/ (the operator's), is refused rather than silently shadowed or duplicated.
*/}}
{{- define "coderun.platformLabels" -}}
{{- $own := list "app.kubernetes.io/name" "app.kubernetes.io/instance" "app.kubernetes.io/component" "app.kubernetes.io/part-of" "app.kubernetes.io/version" "app.kubernetes.io/managed-by" "helm.sh/chart" -}}
{{- range $key, $value := .Values.commonLabels }}
{{- if or (has $key $own) (hasPrefix "coderun.io/" $key) }}
{{- fail (printf "commonLabels: the label %s is the chart's own (its selectors and the operator rely on it); use another key" $key) }}
{{- end }}
{{ $key }}: {{ $value | quote }}
{{- end }}
{{- end -}}

{{- define "coderun.labels" -}}
{{ include "coderun.selectorLabels" . }}
{{ include "coderun.commonLabels" . }}
{{- end -}}

{{/*
coderun.labels with an object's own labels over them (metrics.serviceMonitor.labels, runNamespaces.labels ...),
each key once: a key in both would be a duplicate the API server refuses. Called with (dict "root" $ "labels" ...).
*/}}
{{- define "coderun.labelsWith" -}}
{{- toYaml (merge (deepCopy (.labels | default dict)) (include "coderun.labels" .root | fromYaml)) -}}
{{- end -}}

{{- define "coderun.serviceAccountName" -}}
{{- default (include "coderun.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "coderun.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "coderun.webhookService" -}}
{{- printf "%s-webhook" (include "coderun.fullname" .) -}}
{{- end -}}

{{- define "coderun.webhookSecret" -}}
{{- default (printf "%s-webhook-tls" (include "coderun.fullname" .)) .Values.webhook.existingSecret -}}
{{- end -}}

{{- define "coderun.egressProxy.name" -}}
{{- printf "%s-egress-proxy" (include "coderun.fullname" .) -}}
{{- end -}}

{{- define "coderun.egressProxy.selectorLabels" -}}
app.kubernetes.io/name: {{ include "coderun.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: egress-proxy
{{- end -}}

{{- define "coderun.egressProxy.labels" -}}
{{ include "coderun.egressProxy.selectorLabels" . }}
{{ include "coderun.commonLabels" . }}
{{- end -}}

{{- define "coderun.egressProxy.image" -}}
{{- with .Values.egressProxy.image -}}
{{- if .digest -}}
{{- printf "%s@%s" .repository .digest -}}
{{- else -}}
{{- printf "%s:%s" .repository .tag -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "coderun.egressProxy.keysSecret" -}}
{{- default (printf "%s-keys" (include "coderun.egressProxy.name" .)) .Values.egressProxy.existingSecret -}}
{{- end -}}

{{/* The Secret whose entry `key` the operator and the audit agents share (docs/audit.md). */}}
{{- define "coderun.audit.keySecret" -}}
{{- default (printf "%s-audit-key" (include "coderun.fullname" .)) .Values.audit.existingSecret -}}
{{- end -}}

{{/* The cluster's ranges as CODERUN_*_CIDRS variables: the operator's and the proxy's protected ranges. */}}
{{- define "coderun.clusterRangesEnv" -}}
{{- range $variable, $cidrs := dict "CODERUN_POD_CIDRS" .Values.clusterNetwork.podCIDRs "CODERUN_SERVICE_CIDRS" .Values.clusterNetwork.serviceCIDRs "CODERUN_NODE_CIDRS" .Values.clusterNetwork.nodeCIDRs }}
{{- with $cidrs }}
- name: {{ $variable }}
  value: {{ join "," . | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Every container of the chart: a read-only root, no privilege, no capability. */}}
{{- define "coderun.containerSecurityContext" -}}
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
privileged: false
capabilities:
  drop: [ALL]
{{- end -}}

{{/*
A pod template's labels and annotations: the component's selector labels, then the platform's own (podLabels, winning
over commonLabels; podAnnotations). A label the chart selects by, or one under coderun.io/ (the leader's label routes
the webhook; the sandbox label opens the egress proxy), is refused rather than silently breaking a selector.
Called with (dict "root" $ "selector" "coderun.selectorLabels" "values" .Values "path" "").
*/}}
{{- define "coderun.podMetadata" -}}
{{- $selector := include .selector .root | fromYaml -}}
{{- $platform := include "coderun.platformLabels" .root | fromYaml -}}
labels:
  {{- include .selector .root | nindent 2 }}
  {{- range $key, $value := .values.podLabels }}
  {{- if or (hasKey $selector $key) (hasPrefix "coderun.io/" $key) }}
  {{- fail (printf "%spodLabels: the label %s is the chart's own (its selectors and the operator rely on it); use another key" $.path $key) }}
  {{- end }}
  {{- end }}
  {{- range $key, $value := merge (dict) (.values.podLabels | default dict) $platform }}
  {{ $key }}: {{ $value | quote }}
  {{- end }}
{{- with .values.podAnnotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/*
topologySpreadConstraints as given, each without a labelSelector selecting the component's own pods (the usual
meaning: spread these replicas). Called with (dict "root" $ "selector" "coderun.selectorLabels" "constraints" ...).
*/}}
{{- define "coderun.topologySpreadConstraints" -}}
{{- $selector := include .selector .root | fromYaml -}}
{{- range .constraints }}
{{- $constraint := deepCopy . }}
{{- if not (hasKey $constraint "labelSelector") }}
{{- $_ := set $constraint "labelSelector" (dict "matchLabels" $selector) }}
{{- end }}
- {{- toYaml $constraint | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "coderun.auditAgent.name" -}}
{{- printf "%s-audit-agent" (include "coderun.fullname" .) -}}
{{- end -}}

{{- define "coderun.auditAgent.selectorLabels" -}}
app.kubernetes.io/name: {{ include "coderun.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: audit-agent
{{- end -}}

{{- define "coderun.auditAgent.labels" -}}
{{ include "coderun.auditAgent.selectorLabels" . }}
{{ include "coderun.commonLabels" . }}
{{- end -}}

{{- define "coderun.auditAgent.namespace" -}}
{{- default (printf "%s-audit" .Release.Namespace) .Values.audit.namespace.name -}}
{{- end -}}

{{/* The embedded store runs for the data service, unless the platform gives its own (store.existingSecret). */}}
{{- define "coderun.store.embedded" -}}
{{- if and (include "coderun.data.enabled" .) .Values.store.embedded.enabled (not .Values.store.existingSecret) -}}
true
{{- end -}}
{{- end -}}

{{- define "coderun.store.name" -}}
{{- printf "%s-store" (include "coderun.fullname" .) -}}
{{- end -}}

{{/* The Secret with endpoint, region, access-key-id and secret-access-key that the data service and operator read. */}}
{{- define "coderun.store.secret" -}}
{{- default (include "coderun.store.name" .) .Values.store.existingSecret -}}
{{- end -}}

{{- define "coderun.store.selectorLabels" -}}
app.kubernetes.io/name: {{ include "coderun.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: store
{{- end -}}

{{- define "coderun.store.labels" -}}
{{ include "coderun.store.selectorLabels" . }}
{{ include "coderun.commonLabels" . }}
{{- end -}}

{{- define "coderun.store.image" -}}
{{- with .Values.store.embedded.image -}}
{{- if .digest -}}
{{- printf "%s@%s" .repository .digest -}}
{{- else -}}
{{- printf "%s:%s" .repository .tag -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The data service runs only with a store to talk to; data.enabled without one is a mistake named here. */}}
{{- define "coderun.data.enabled" -}}
{{- if .Values.data.enabled -}}
{{- if not (or .Values.store.embedded.enabled .Values.store.existingSecret) -}}
{{- fail "data.enabled needs a store: set store.embedded.enabled=true or store.existingSecret (or data.enabled=false)" -}}
{{- end -}}
true
{{- end -}}
{{- end -}}

{{- define "coderun.data.name" -}}
{{- printf "%s-data" (include "coderun.fullname" .) -}}
{{- end -}}

{{/* The Secret of the grants' signing keys (one entry per key id), created by the operator at start if absent. */}}
{{- define "coderun.data.keysSecret" -}}
coderun-data-keys
{{- end -}}

{{- define "coderun.data.selectorLabels" -}}
app.kubernetes.io/name: {{ include "coderun.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: data
{{- end -}}

{{- define "coderun.data.labels" -}}
{{ include "coderun.data.selectorLabels" . }}
{{ include "coderun.commonLabels" . }}
{{- end -}}
