{{/* Names, labels and small shared fragments of the gpuslice chart. */}}

{{- define "gpuslice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Base name of every object: the release name, unless it already contains the chart name. */}}
{{- define "gpuslice.fullname" -}}
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

{{- define "gpuslice.scheduler" -}}
{{- printf "%s-scheduler" (include "gpuslice.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpuslice.nodeDaemon" -}}
{{- printf "%s-node-daemon" (include "gpuslice.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpuslice.webhookSecret" -}}
{{- printf "%s-webhook-tls" (include "gpuslice.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpuslice.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "gpuslice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.global.labels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of one component; call with (dict "ctx" $ "component" "scheduler"). */}}
{{- define "gpuslice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpuslice.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* An image reference; call with (dict "image" .Values.x.image "default" "tag-if-empty"). */}}
{{- define "gpuslice.image" -}}
{{- $tag := .image.tag | default .default -}}
{{- if .image.registry -}}
{{- printf "%s/%s:%s" .image.registry .image.repository $tag -}}
{{- else -}}
{{- printf "%s:%s" .image.repository $tag -}}
{{- end -}}
{{- end }}

{{/* kube-scheduler's tag: the value, else the cluster's version as vMAJOR.MINOR.PATCH
     (build metadata such as "+k3s1" or "-eks-…" removed, since only upstream tags exist). */}}
{{- define "gpuslice.kubeSchedulerTag" -}}
{{- if .Values.scheduler.kubeScheduler.image.tag -}}
{{- .Values.scheduler.kubeScheduler.image.tag -}}
{{- else -}}
{{- $v := semver .Capabilities.KubeVersion.Version -}}
{{- printf "v%d.%d.%d" $v.Major $v.Minor $v.Patch -}}
{{- end -}}
{{- end }}

{{/* Every extended resource name the scheduler manages, in HAMi's order. */}}
{{- define "gpuslice.resourceNames" -}}
{{- list .Values.resourceName .Values.resourceMem .Values.resourceMemPercentage .Values.resourceCores .Values.resourcePriority | toJson -}}
{{- end }}
