{{- define "dsx.namespace" -}}
{{- default .Release.Namespace .Values.namespace -}}
{{- end -}}

{{- define "dsx.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "dsx.gpuImage" -}}
{{- printf "%s:%s" .Values.gpuImage.repository (default .Chart.AppVersion .Values.gpuImage.tag) -}}
{{- end -}}

{{- /* Names of cluster-wide and shared RBAC objects: scoped to the release. */ -}}
{{- define "dsx.rbacName" -}}
{{- printf "%s-dsx-%s" .root.Release.Name .name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- /* The rank pod profile as DSX_RANK_POD carries it: rankPods, with the chart's pull secrets added. */ -}}
{{- define "dsx.rankPod" -}}
{{- $profile := deepCopy .Values.rankPods -}}
{{- $secrets := concat (.Values.imagePullSecrets | default list) ($profile.imagePullSecrets | default list) | uniq -}}
{{- $_ := set $profile "imagePullSecrets" $secrets -}}
{{- toJson $profile -}}
{{- end -}}

{{- /* Whether dsx-drift may read any Helm release Secret. */ -}}
{{- define "dsx.driftReadsReleases" -}}
{{- if or .Values.drift.allNamespaces .Values.drift.helmNamespaces }}true{{ end -}}
{{- end -}}

{{- define "dsx.labels" -}}
app.kubernetes.io/part-of: dsx
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}
