{{/* Chart name, cut to 63 characters (the DNS label limit of Kubernetes names). */}}
{{- define "wattprint.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Release-qualified name; the release name alone when it already contains the chart name. */}}
{{- define "wattprint.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "wattprint.selectorLabels" -}}
app.kubernetes.io/name: {{ include "wattprint.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "wattprint.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "wattprint.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: exporter
app.kubernetes.io/part-of: wattprint
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Labels of the objects a Prometheus Operator selects (ServiceMonitor, PrometheusRule). */}}
{{- define "wattprint.operatorLabels" -}}
{{- with .Values.kubePrometheusStack.release -}}
release: {{ . | quote }}
{{- end -}}
{{- end -}}

{{- define "wattprint.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "wattprint.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* global.imageRegistry (a mirror) replaces the registry part of image.repository. */}}
{{- define "wattprint.image" -}}
{{- $repository := .Values.image.repository -}}
{{- with (.Values.global).imageRegistry -}}
{{- $path := $repository -}}
{{- $first := regexFind "^[^/]+" $repository -}}
{{- if or (contains "." $first) (contains ":" $first) (eq $first "localhost") -}}
{{- $path = regexReplaceAll "^[^/]+/" $repository "" -}}
{{- end -}}
{{- $repository = printf "%s/%s" (trimSuffix "/" .) $path -}}
{{- end -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" $repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* True (non-empty) when the chart must create the carbon credentials Secret. */}}
{{- define "wattprint.createCarbonSecret" -}}
{{- $c := .Values.carbon.credentials -}}
{{- if and (not $c.existingSecret) (or $c.token $c.wattTimeUsername $c.wattTimePassword) -}}
true
{{- end -}}
{{- end -}}

{{- define "wattprint.carbonSecretName" -}}
{{- default (printf "%s-carbon" (include "wattprint.fullname" .)) .Values.carbon.credentials.existingSecret -}}
{{- end -}}

{{/* True (non-empty) when the chart must create the BMC credentials Secret. */}}
{{- define "wattprint.createRedfishSecret" -}}
{{- $c := .Values.exporter.platform.redfish.credentials -}}
{{- if and (not $c.existingSecret) (or $c.username $c.password) -}}
true
{{- end -}}
{{- end -}}

{{/* The BMC credentials Secret's name, where there is one (empty otherwise). */}}
{{- define "wattprint.redfishSecretName" -}}
{{- $c := .Values.exporter.platform.redfish.credentials -}}
{{- if $c.existingSecret -}}
{{- $c.existingSecret -}}
{{- else if include "wattprint.createRedfishSecret" . -}}
{{- printf "%s-redfish" (include "wattprint.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "wattprint.runAsRoot" -}}
{{- if or .Values.security.runAsRoot .Values.security.readProcessEnvironment .Values.exporter.platform.ipmi.hostDevice -}}
true
{{- end -}}
{{- end -}}

{{/* The pod's affinity: the user's, or by default one that requires a GPU node. */}}
{{- define "wattprint.affinity" -}}
{{- if .Values.affinity -}}
{{- toYaml .Values.affinity -}}
{{- else if and .Values.gpuNodesOnly (not .Values.nodeSelector) -}}
nodeAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    nodeSelectorTerms:
      - matchExpressions:
          - key: nvidia.com/gpu.present
            operator: In
            values: ["true"]
      - matchExpressions:
          - key: feature.node.kubernetes.io/pci-10de.present
            operator: In
            values: ["true"]
      - matchExpressions:
          - key: feature.node.kubernetes.io/amd-gpu
            operator: In
            values: ["true"]
      - matchExpressions:
          - key: amd.com/gpu.device-id
            operator: Exists
      - matchExpressions:
          - key: feature.node.kubernetes.io/pci-1002.present
            operator: In
            values: ["true"]
{{- end -}}
{{- end -}}
