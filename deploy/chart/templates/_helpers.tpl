{{/* The chart's name. */}}
{{- define "mcm-rs.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The full name of the release's objects (at most 50 characters, so suffixes fit). */}}
{{- define "mcm-rs.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The name of cluster-scoped objects: the full name and the release namespace, so two
releases of the same name in different namespaces do not collide. */}}
{{- define "mcm-rs.clusterName" -}}
{{- printf "%s-%s" (include "mcm-rs.fullname" .) .Release.Namespace | trunc 253 | trimSuffix "-" -}}
{{- end -}}

{{/* The namespace of the machine objects (`--namespace`). */}}
{{- define "mcm-rs.machineNamespace" -}}
{{- default .Release.Namespace .Values.namespace -}}
{{- end -}}

{{/* The namespace of the leader-election Leases. */}}
{{- define "mcm-rs.leaseNamespace" -}}
{{- default (include "mcm-rs.machineNamespace" .) .Values.leaderElection.resourceNamespace -}}
{{- end -}}

{{/* The service account. */}}
{{- define "mcm-rs.serviceAccountName" -}}
{{- default (include "mcm-rs.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{/* Labels of every object. */}}
{{- define "mcm-rs.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "mcm-rs.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: mcm-rs
{{- end -}}

{{/* Labels that select the pods. */}}
{{- define "mcm-rs.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mcm-rs.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* An image of the chart: `<registry>/<name>:<tag>`. Call with (list $ "name"). */}}
{{- define "mcm-rs.image" -}}
{{- $root := index . 0 -}}
{{- $name := index . 1 -}}
{{- $tag := default $root.Chart.AppVersion $root.Values.image.tag -}}
{{- if $root.Values.image.registry -}}
{{- printf "%s/%s:%s" (trimSuffix "/" $root.Values.image.registry) $name $tag -}}
{{- else -}}
{{- printf "%s:%s" $name $tag -}}
{{- end -}}
{{- end -}}

{{/* The provider container's image. */}}
{{- define "mcm-rs.providerImage" -}}
{{- include "mcm-rs.image" (list . (printf "machine-controller-%s" .Values.provider)) -}}
{{- end -}}

{{/* Whether the control cluster is also the target cluster ("true" or ""). */}}
{{- define "mcm-rs.targetIsControl" -}}
{{- if eq .Values.targetKubeconfig.secretName "" -}}true{{- end -}}
{{- end -}}

{{/* Whether a target kubeconfig Secret is mounted ("true" or ""). */}}
{{- define "mcm-rs.targetSecret" -}}
{{- if and .Values.targetKubeconfig.secretName (ne .Values.targetKubeconfig.secretName "none") -}}true{{- end -}}
{{- end -}}

{{/* The `--target-kubeconfig` value. */}}
{{- define "mcm-rs.targetKubeconfig" -}}
{{- if include "mcm-rs.targetIsControl" . -}}
inClusterConfig
{{- else if eq .Values.targetKubeconfig.secretName "none" -}}
none
{{- else -}}
{{- printf "/var/run/secrets/mcm-rs/target/%s" .Values.targetKubeconfig.key -}}
{{- end -}}
{{- end -}}

{{/* The webhook's Service and the Secret of its cert-manager certificate. */}}
{{- define "mcm-rs.webhookServiceName" -}}
{{- printf "%s-webhook" (include "mcm-rs.fullname" .) -}}
{{- end -}}
{{- define "mcm-rs.webhookSecretName" -}}
{{- printf "%s-webhook-tls" (include "mcm-rs.fullname" .) -}}
{{- end -}}

{{/* Flags both binaries share. Call with (list $ port). */}}
{{- define "mcm-rs.commonArgs" -}}
{{- $root := index . 0 -}}
{{- $port := index . 1 -}}
- --control-kubeconfig=inClusterConfig
- --target-kubeconfig={{ include "mcm-rs.targetKubeconfig" $root }}
- --namespace={{ include "mcm-rs.machineNamespace" $root }}
- --port={{ $port }}
- --leader-elect={{ $root.Values.leaderElection.enabled }}
{{- if $root.Values.leaderElection.enabled }}
- --leader-elect-lease-duration={{ $root.Values.leaderElection.leaseDuration }}
- --leader-elect-renew-deadline={{ $root.Values.leaderElection.renewDeadline }}
- --leader-elect-retry-period={{ $root.Values.leaderElection.retryPeriod }}
- --leader-elect-resource-namespace={{ include "mcm-rs.leaseNamespace" $root }}
{{- end }}
- --log-format={{ $root.Values.logFormat }}
- --v={{ $root.Values.verbosity }}
{{- end -}}

{{/* Fails rendering on combinations that cannot work. */}}
{{- define "mcm-rs.validate" -}}
{{- if not (has .Values.provider (list "local" "aws" "gcp" "azure")) -}}
{{- fail (printf "provider must be one of local, aws, gcp, azure (got %q)" .Values.provider) -}}
{{- end -}}
{{- if not (has .Values.containers (list "one" "two")) -}}
{{- fail (printf "containers must be one or two (got %q)" .Values.containers) -}}
{{- end -}}
{{- if and (gt (int .Values.replicas) 1) (not .Values.leaderElection.enabled) -}}
{{- fail "replicas > 1 needs leaderElection.enabled=true" -}}
{{- end -}}
{{- end -}}
