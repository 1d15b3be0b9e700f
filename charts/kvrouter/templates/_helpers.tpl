{{- define "kvrouter.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kvrouter.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "kvrouter.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kvrouter.serviceAccount" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kvrouter.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The kvrouter configuration, with the release's namespace and pool filled in. */}}
{{- define "kvrouter.config" -}}
{{- $cfg := deepCopy .Values.config -}}
{{- $disc := default dict $cfg.discovery -}}
{{- if $disc.kubernetes -}}
{{- $k := $disc.kubernetes -}}
{{- if not $k.namespace -}}{{- $_ := set $k "namespace" .Release.Namespace -}}{{- end -}}
{{- if .Values.inferencePool.enabled -}}
{{- $_ := unset $k "service" -}}
{{- $_ := unset $k "selector" -}}
{{- $_ := unset $k "port" -}}
{{- $_ := set $k "inference_pool" .Values.inferencePool.name -}}
{{- end -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}
