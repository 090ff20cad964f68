{{/* The labels of every object. */}}
{{- define "pagewise.labels" -}}
app.kubernetes.io/name: pagewise
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* The agent's pods. */}}
{{- define "pagewise.selector" -}}
app.kubernetes.io/name: pagewise
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: agent
{{- end -}}
