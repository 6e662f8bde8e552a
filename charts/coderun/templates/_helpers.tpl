{{/* Names and labels shared by every object of the chart. */}}

{{- define "coderun.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "coderun.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "coderun.labels" -}}
{{ include "coderun.selectorLabels" . }}
app.kubernetes.io/part-of: coderun
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
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
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: egress-proxy
{{- end -}}

{{- define "coderun.egressProxy.labels" -}}
{{ include "coderun.egressProxy.selectorLabels" . }}
app.kubernetes.io/part-of: coderun
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
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
