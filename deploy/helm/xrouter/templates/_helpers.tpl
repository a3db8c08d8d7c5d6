{{- define "xrouter.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "xrouter.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "xrouter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "xrouter.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "xrouter.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{ include "xrouter.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* The admin key's Secret: an existing one, or the one this chart creates. */}}
{{- define "xrouter.adminSecret" -}}
{{- if .Values.adminKey.existingSecret -}}
{{- .Values.adminKey.existingSecret -}}
{{- else -}}
{{- include "xrouter.fullname" . -}}
{{- end -}}
{{- end -}}

{{/* The gateway config as mounted: the values' config with the port fixed. */}}
{{- define "xrouter.config" -}}
{{- $server := merge (dict "port" 8000 "host" "0.0.0.0" "workers" .Values.workers) (.Values.config.server | default dict) -}}
{{- $_ := set $server "port" 8000 -}}
{{- $_ := set $server "host" "0.0.0.0" -}}
{{- $config := merge (dict "server" $server) (omit .Values.config "server") -}}
{{- toYaml $config -}}
{{- end -}}
