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
SIGKILL (stops killed at the end of their grace period): each a counter, and the extra matchers
of its series. */}}
{{- define "drainwatch.gates" -}}
- {name: requests-cut, metric: drainwatch_stop_inflight_cut_total, what: "requests the stops cut"}
- {name: streams-cut, metric: drainwatch_stop_streams_cut_total, what: "live streams the stops cut"}
- {name: sessions-cut, metric: drainwatch_stop_sessions_cut_total, what: "sessions the stops cut"}
- {name: refused, metric: drainwatch_stop_refused_total, what: "connects the stopping containers refused"}
- {name: unreachable, metric: drainwatch_stop_unreachable_total, what: "connects to the stopped containers' addresses"}
- {name: no-endpoints, metric: drainwatch_stop_no_endpoints_total, what: "connects to the workload's Service kube-proxy rejected: no ready endpoints"}
- {name: sent-after-close, metric: drainwatch_stop_sent_after_close_total, what: "requests sent to connections the stops had already closed"}
- {name: retry-duplicates, metric: drainwatch_retry_duplicates_total, what: "cut requests a proxy ran twice"}
- {name: sigkills, metric: drainwatch_container_stops_total, matchers: ", outcome=\"killed_at_deadline\"", what: "stops SIGKILLed at the end of their grace period"}
{{- end }}

{{- /* A gate's query: what each series counted within the window, exactly: its last value less
its value at the window's start, or its last value for a series new in the window (a proxy's
appears already counted at its first duplicate); increase() only where the counter reset (an
agent restart), since increase() extrapolates to the window's edges and ignores a new series'
first value. The range keeps the series of containers the agent forgot within the window. 0
when there is no series (a query without a value is an error to Argo Rollouts and halts
Flagger). Fails safe: with Prometheus's storage younger than the window, what a series counted
before it counts too. */}}
{{- define "drainwatch.gateQuery" -}}
{{- $s := printf "%s{job=%q, namespace=%q, workload%s%s%s}" .gate.metric .job .namespace .match .workload (.gate.matchers | default "") }}
{{- $w := .window -}}
sum(
    ((max_over_time({{ $s }}[{{ $w }}]) - {{ $s }} offset {{ $w }}) unless resets({{ $s }}[{{ $w }}]) > 0)
  or
    ((max_over_time({{ $s }}[{{ $w }}]) unless {{ $s }} offset {{ $w }}) unless resets({{ $s }}[{{ $w }}]) > 0)
  or
    (round(increase({{ $s }}[{{ $w }}])) and resets({{ $s }}[{{ $w }}]) > 0)
) or vector(0)
{{- end }}
