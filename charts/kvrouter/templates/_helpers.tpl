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
{{- /* Behind an override-host gateway kvrouter lists fallbacks for its retries. */ -}}
{{- $fallbacks := include "kvrouter.maxFallbacks" . -}}
{{- if eq (include "kvrouter.upstream" .) "override-host" -}}
{{- $limits := default dict $cfg.limits -}}
{{- $_ := set $limits "max_fallbacks" (int $fallbacks) -}}
{{- $_ := set $cfg "limits" $limits -}}
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

{{/* How the chart's gateways (envoy.enabled, istio.enabled) reach the pod kvrouter
     picks: "override-host", "original-dst", or "" without a gateway of the chart's.
     kvrouter lists one set of fallbacks for every gateway, so both must agree. */}}
{{- define "kvrouter.upstream" -}}
{{- $ups := list -}}
{{- if .Values.envoy.enabled -}}{{- $ups = append $ups (default "override-host" .Values.envoy.upstream) -}}{{- end -}}
{{- if .Values.istio.enabled -}}{{- $ups = append $ups (default "original-dst" .Values.istio.upstream) -}}{{- end -}}
{{- range $ups -}}
{{- if not (has . (list "override-host" "original-dst")) -}}
{{- fail (printf "upstream %q: want override-host or original-dst" .) -}}
{{- end -}}
{{- end -}}
{{- $ups = uniq $ups -}}
{{- if gt (len $ups) 1 -}}
{{- fail "envoy.upstream and istio.upstream differ: kvrouter lists one set of fallbacks (limits.max_fallbacks) for every gateway" -}}
{{- end -}}
{{- if $ups -}}{{- first $ups -}}{{- end -}}
{{- end -}}

{{/* limits.max_fallbacks as kvrouter gets it: config's, else 2 behind an override-host
     gateway (a dead pod plus one more failure), else kvrouter's default 0. */}}
{{- define "kvrouter.maxFallbacks" -}}
{{- $l := default dict .Values.config.limits -}}
{{- $up := include "kvrouter.upstream" . -}}
{{- if hasKey $l "max_fallbacks" -}}
{{- $n := int $l.max_fallbacks -}}
{{- if and (eq $up "original-dst") (gt $n 0) -}}
{{- fail (printf "config.limits.max_fallbacks %d with upstream original-dst: an ORIGINAL_DST cluster takes one ip:port, so the list would fail every request; keep it 0 or use override-host" $n) -}}
{{- end -}}
{{- $n -}}
{{- else if eq $up "override-host" -}}2
{{- else -}}0
{{- end -}}
{{- end -}}

{{/* The gateway's retries on the vLLM route: one per fallback kvrouter lists, at least
     one (past the list, override_host picks by its fallback policy). */}}
{{- define "kvrouter.retries" -}}
{{- max 1 (int (include "kvrouter.maxFallbacks" .)) -}}
{{- end -}}

{{/* kvrouter's limits.max_body_bytes (default 16 MiB): the body Envoy keeps for
     retries (per_request_buffer_limit_bytes). */}}
{{- define "kvrouter.maxBodyBytes" -}}
{{- (default dict .Values.config.limits).max_body_bytes | default 16777216 | int64 -}}
{{- end -}}

{{/* The headless Service over the vLLM pods that an override-host cluster resolves. */}}
{{- define "kvrouter.poolName" -}}
{{- printf "%s-pool" (include "kvrouter.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The port kvrouter names the pods by: the pool's target port, else discovery's. */}}
{{- define "kvrouter.poolPort" -}}
{{- if .Values.inferencePool.enabled -}}
{{- .Values.inferencePool.targetPort -}}
{{- else -}}
{{- (default dict (default dict .Values.config.discovery).kubernetes).port | default .Values.vllm.port -}}
{{- end -}}
{{- end -}}

{{/* The vLLM pods' labels: poolSelector, else the InferencePool's, discovery's or the
     chart's own vLLM pods'. */}}
{{- define "kvrouter.poolSelector" -}}
{{- $k := default dict (default dict .Values.config.discovery).kubernetes -}}
{{- if .Values.poolSelector -}}
{{- toYaml .Values.poolSelector -}}
{{- else if .Values.inferencePool.enabled -}}
{{- toYaml .Values.inferencePool.selector -}}
{{- else if $k.selector -}}
{{- toYaml $k.selector -}}
{{- else if .Values.vllm.enabled -}}
app: {{ .Values.vllm.name }}
{{- else -}}
{{- fail "upstream override-host needs the vLLM pods' labels (override_host only picks hosts its cluster knows, so the chart renders a headless Service over them): set poolSelector, or use upstream original-dst" -}}
{{- end -}}
{{- end -}}
