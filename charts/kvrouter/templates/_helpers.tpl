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
{{- $ev := default dict $disc.kv_events -}}
{{- if and (eq (default "per-pod" $ev.mode) "central") (not $ev.bind) -}}
{{- $_ := set $ev "bind" "tcp://*:5557" -}}
{{- end -}}
{{- /* Several replicas share their in-flight requests (peersync): they find each other
       through the headless Service, unless config.replicas.peers says otherwise. */ -}}
{{- if and (gt (int .Values.replicas) 1) (ne (default "per-pod" $ev.mode) "central") -}}
{{- $rep := default dict $cfg.replicas -}}
{{- if not $rep.peers -}}
{{- $_ := set $rep "peers" (list (printf "%s-headless.%s.svc.cluster.local:7946" (include "kvrouter.fullname" .) .Release.Namespace)) -}}
{{- end -}}
{{- $_ := set $cfg "replicas" $rep -}}
{{- end -}}
{{- $tls := include "kvrouter.tlsConfig" . | fromYaml -}}
{{- if $tls -}}
{{- $listen := default dict $cfg.listen -}}
{{- $_ := set $listen "tls" $tls -}}
{{- $_ := set $cfg "listen" $listen -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* KV events mode ("per-pod" or "central") and, in central mode, the bound port. */}}
{{- define "kvrouter.kvMode" -}}
{{- $ev := default dict (default dict .Values.config.discovery).kv_events -}}
{{- default "per-pod" $ev.mode -}}
{{- end -}}

{{- define "kvrouter.kvBindPort" -}}
{{- $ev := default dict (default dict .Values.config.discovery).kv_events -}}
{{- $bind := default "tcp://*:5557" $ev.bind -}}
{{- last (splitList ":" $bind) -}}
{{- end -}}

{{/* The Service vLLM pods connect their KV-event publishers to in central mode. */}}
{{- define "kvrouter.kvEventsService" -}}
{{- printf "%s-kv-events" (include "kvrouter.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* listen.tls from .Values.tls: nothing for the self-signed default. */}}
{{- define "kvrouter.tlsConfig" -}}
{{- $t := .Values.tls -}}
{{- if eq $t.mode "disabled" -}}
mode: disabled
{{- else if $t.secretName -}}
cert_file: /etc/kvrouter-tls/tls.crt
key_file: /etc/kvrouter-tls/tls.key
{{- if $t.requireClientCerts }}
client_ca_file: /etc/kvrouter-tls/ca.crt
{{- end }}
{{- else if $t.requireClientCerts -}}
{{- fail "tls.requireClientCerts needs tls.secretName (its ca.crt is the client CA)" -}}
{{- end -}}
{{- end -}}
