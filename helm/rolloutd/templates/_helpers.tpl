{{/* Names, labels and the pieces every pod shares. */}}

{{- define "rolloutd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "rolloutd.fullname" -}}
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

{{/* Labels of an object of one component: include "rolloutd.labels" (list $ "sandbox") */}}
{{- define "rolloutd.labels" -}}
{{- $root := index . 0 }}
{{- $component := index . 1 }}
helm.sh/chart: {{ printf "%s-%s" $root.Chart.Name $root.Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ $root.Release.Service }}
app.kubernetes.io/version: {{ $root.Chart.AppVersion | quote }}
{{ include "rolloutd.selectorLabels" (list $root $component) }}
{{- end }}

{{- define "rolloutd.selectorLabels" -}}
{{- $root := index . 0 }}
{{- $component := index . 1 }}
app.kubernetes.io/name: {{ include "rolloutd.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ $component }}
{{- end }}

{{- define "rolloutd.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "rolloutd.engineImage" -}}
{{- printf "%s:%s" .Values.engineImage.repository (default .Chart.AppVersion .Values.engineImage.tag) }}
{{- end }}

{{/* The Secret holding the admin, REST, codec and codec-server values. */}}
{{- define "rolloutd.secretName" -}}
{{- default (printf "%s-secrets" (include "rolloutd.fullname" .)) .Values.secrets.existingSecret }}
{{- end }}

{{- define "rolloutd.gatewayHeadless" -}}
{{- printf "%s-gateway-hosts" (include "rolloutd.fullname" .) }}
{{- end }}

{{- define "rolloutd.temporalAddress" -}}
{{- if .Values.temporal.dev.enabled }}
{{- printf "%s-temporal-dev:%d" (include "rolloutd.fullname" .) (int .Values.temporal.dev.port) }}
{{- else }}
{{- required "temporal.address is required (host:port of the Temporal frontend)" .Values.temporal.address }}
{{- end }}
{{- end }}

{{- define "rolloutd.storeUrl" -}}
{{- if .Values.store.url }}
{{- .Values.store.url }}
{{- else if .Values.store.persistence.enabled }}
{{- .Values.store.persistence.mountPath }}
{{- else }}
{{- fail "store.url is empty and store.persistence.enabled is false: every fleet needs one shared blob store (an s3:// or gs:// URL, or a shared volume)" }}
{{- end }}
{{- end }}

{{- define "rolloutd.storeClaim" -}}
{{- default (printf "%s-store" (include "rolloutd.fullname" .)) .Values.store.persistence.existingClaim }}
{{- end }}

{{- define "rolloutd.usesStoreVolume" -}}
{{- if and (not .Values.store.url) .Values.store.persistence.enabled }}true{{ end }}
{{- end }}

{{/*
Which autoscaler the chart renders: "keda", "hpa" or "off". "auto" asks the cluster for KEDA's
API (helm template without --api-versions keda.sh/v1alpha1 sees none, so renders HPAs).
*/}}
{{- define "rolloutd.autoscalingMode" -}}
{{- $mode := .Values.autoscaling.mode }}
{{- if eq $mode "auto" }}
{{- if .Capabilities.APIVersions.Has "keda.sh/v1alpha1" }}keda{{ else }}hpa{{ end }}
{{- else if has $mode (list "keda" "hpa" "off") }}
{{- $mode }}
{{- else }}
{{- fail (printf "autoscaling.mode must be auto, keda, hpa or off, not %q" $mode) }}
{{- end }}
{{- end }}

{{/* Pod annotations: Prometheus scrape hints and checksums that roll pods on config changes. */}}
{{- define "rolloutd.podAnnotations" -}}
{{- $root := index . 0 }}
{{- $port := index . 1 }}
checksum/config: {{ include (print $root.Template.BasePath "/configmap.yaml") $root | sha256sum }}
{{- if $root.Values.metrics.podAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ $port | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- end }}

{{/*
Environment of every rolloutd container: the ConfigMap's plain settings come through envFrom;
here the per-pod and secret ones. Secrets only ever as secretKeyRef. The TLS files are mounted
outside /etc: bubblewrap binds the host's /etc into every sandbox.
*/}}
{{- define "rolloutd.env" -}}
- name: POD_NAME
  valueFrom: {fieldRef: {fieldPath: metadata.name}}
- name: ROLLOUTD_HOST_ID
  value: $(POD_NAME)
{{- if .Values.secrets.codec.enabled }}
- name: ROLLOUTD_CODEC_KEYS
  valueFrom: {secretKeyRef: {name: {{ include "rolloutd.secretName" . }}, key: {{ .Values.secrets.codecKeysKey }}}}
{{- end }}
{{- if and .Values.temporal.apiKey.existingSecret (not .Values.temporal.dev.enabled) }}
- name: ROLLOUTD_TEMPORAL_API_KEY
  valueFrom: {secretKeyRef: {name: {{ .Values.temporal.apiKey.existingSecret }}, key: {{ .Values.temporal.apiKey.key }}}}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The admin token: only the gateway (it checks it) and the REST facade (it forwards it). */}}
{{- define "rolloutd.adminTokenEnv" -}}
- name: ROLLOUTD_ADMIN_TOKEN
  valueFrom: {secretKeyRef: {name: {{ include "rolloutd.secretName" . }}, key: {{ .Values.secrets.adminTokenKey }}}}
{{- end }}

{{- define "rolloutd.envFrom" -}}
- configMapRef: {name: {{ include "rolloutd.fullname" . }}-config}
{{- with .Values.store.credentials.existingSecret }}
- secretRef: {name: {{ . }}}
{{- end }}
{{- end }}

{{- define "rolloutd.volumeMounts" -}}
{{- if and .Values.temporal.tls.existingSecret (not .Values.temporal.dev.enabled) }}
- name: temporal-tls
  mountPath: /var/lib/rolloutd/secrets/temporal-tls
  readOnly: true
{{- end }}
{{- if include "rolloutd.usesStoreVolume" . }}
- name: store
  mountPath: {{ .Values.store.persistence.mountPath }}
{{- end }}
{{- end }}

{{- define "rolloutd.volumes" -}}
{{- if and .Values.temporal.tls.existingSecret (not .Values.temporal.dev.enabled) }}
- name: temporal-tls
  secret:
    secretName: {{ .Values.temporal.tls.existingSecret }}
    defaultMode: 0400
{{- end }}
{{- if include "rolloutd.usesStoreVolume" . }}
- name: store
  persistentVolumeClaim:
    claimName: {{ include "rolloutd.storeClaim" . }}
{{- end }}
{{- end }}

{{/* Probes of a worker: its grpc.health.v1 service (rolloutd.workers.health). */}}
{{- define "rolloutd.workerProbes" -}}
{{- $root := index . 0 }}
{{- $fleet := index . 1 }}
startupProbe:
  grpc: {port: {{ $root.Values.healthPort }}, service: rolloutd-{{ $fleet }}}
  periodSeconds: 5
  failureThreshold: 60
readinessProbe:
  grpc: {port: {{ $root.Values.healthPort }}, service: rolloutd-{{ $fleet }}}
  periodSeconds: 10
livenessProbe:
  grpc: {port: {{ $root.Values.healthPort }}}
  periodSeconds: 20
  failureThreshold: 6
{{- end }}

{{- define "rolloutd.gracePeriod" -}}
{{- $root := index . 0 }}
{{- $fleet := index . 1 }}
{{- $v := (index $root.Values $fleet).terminationGracePeriodSeconds }}
{{- if kindIs "invalid" $v }}{{ $root.Values.terminationGracePeriodSeconds }}
{{- else if eq (toString $v) "" }}{{ $root.Values.terminationGracePeriodSeconds }}
{{- else }}{{ $v }}{{ end }}
{{- end }}

{{/* nodeSelector, tolerations, affinity and imagePullSecrets of a component's pods. */}}
{{- define "rolloutd.scheduling" -}}
{{- $root := index . 0 }}
{{- $spec := index . 1 }}
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $spec.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $spec.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $spec.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- /* no rolloutd process calls the Kubernetes API: no pod gets a service account token
(a sandbox escape must not find one) */}}
automountServiceAccountToken: false
{{- end }}

{{- /*
The least privilege every container but the sandbox's runs with: no capability, no privilege
escalation (no_new_privs), the container runtime's default seccomp profile.
*/ -}}
{{- define "rolloutd.restricted" -}}
securityContext:
  allowPrivilegeEscalation: false
  capabilities: {drop: [ALL]}
  seccompProfile: {type: RuntimeDefault}
{{- end }}
