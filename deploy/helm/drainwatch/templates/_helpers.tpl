{{- define "drainwatch.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "drainwatch.fullname" -}}
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

{{- define "drainwatch.selectorLabels" -}}
app.kubernetes.io/name: {{ include "drainwatch.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "drainwatch.labels" -}}
{{ include "drainwatch.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{- define "drainwatch.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "drainwatch.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- /* A label map as k=v,k=v (NOTES.txt). */}}
{{- define "drainwatch.inlineLabels" -}}
{{- $out := list }}
{{- range $k, $v := . }}{{ $out = append $out (printf "%s=%v" $k $v) }}{{ end }}
{{- join "," $out }}
{{- end }}

{{- /* The rollout gates: one per kind of loss a stop can cost (agent/src/model/loss.rs), and
SIGKILL (stops killed at the end of their grace period). `counter`: a per-container stop
counter the agent creates at 0 when it finds the container; `proxy`: counted per proxy, a series
that appears already counted at its first duplicate; `killed`: stops by outcome. */}}
{{- define "drainwatch.gates" -}}
- {name: requests-cut, metric: drainwatch_stop_inflight_cut_total, form: counter, what: "requests the stops cut"}
- {name: streams-cut, metric: drainwatch_stop_streams_cut_total, form: counter, what: "live streams the stops cut"}
- {name: sessions-cut, metric: drainwatch_stop_sessions_cut_total, form: counter, what: "sessions the stops cut"}
- {name: refused, metric: drainwatch_stop_refused_total, form: counter, what: "connects the stopping containers refused"}
- {name: unreachable, metric: drainwatch_stop_unreachable_total, form: counter, what: "connects to the stopped containers' addresses"}
- {name: retry-duplicates, metric: drainwatch_retry_duplicates_total, form: proxy, what: "cut requests a proxy ran twice"}
- {name: sigkills, metric: drainwatch_container_stops_total, form: killed, what: "stops SIGKILLed at the end of their grace period"}
{{- end }}

{{- /* A gate's query: the count within the window, rounded (increase() extrapolates to the
window's edges; the counts are whole), 0 when there is no series (a query without a value is an
error to Argo Rollouts and halts Flagger). A proxy's series new in the window adds its first
value, which increase() ignores (it has no sample before it); the range also keeps the series
of containers the agent forgot within the window. Fails safe: with Prometheus's storage younger
than the window, a proxy's duplicates from before it count too. */}}
{{- define "drainwatch.gateQuery" -}}
{{- $sel := printf "job=%q, namespace=%q, workload%s%s" .job .namespace .match .workload }}
{{- $m := .gate.metric }}
{{- if eq .gate.form "counter" -}}
round(sum(increase({{ $m }}{ {{- $sel -}} }[{{ .window }}]))) or vector(0)
{{- else if eq .gate.form "killed" -}}
round(sum(increase({{ $m }}{ {{- $sel -}} , outcome="killed_at_deadline"}[{{ .window }}]))) or vector(0)
{{- else -}}
round(
    (sum(increase({{ $m }}{ {{- $sel -}} }[{{ .window }}])) or vector(0))
  +
    (sum(min_over_time({{ $m }}{ {{- $sel -}} }[{{ .window }}]) unless {{ $m }}{ {{- $sel -}} } offset {{ .window }}) or vector(0))
)
{{- end }}
{{- end }}
