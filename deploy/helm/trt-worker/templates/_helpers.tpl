{{/* Names and labels. */}}
{{- define "trt-worker.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* At most 52 characters: a StatefulSet adds "-<ordinal>" and a revision hash to its pods. */}}
{{- define "trt-worker.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "trt-worker.selectorLabels" -}}
app.kubernetes.io/name: {{ include "trt-worker.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "trt-worker.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "trt-worker.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: worker
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "trt-worker.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "trt-worker.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "trt-worker.image" -}}
{{- $flavour := ternary "cuda" "cpu" (.Values.gpu.enabled | default false) }}
{{- $tag := .Values.image.tag | default (printf "%s-%s" .Chart.AppVersion $flavour) }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}

{{/* "true" when pods need stable names: exactly-once (transactional.id) or static membership. */}}
{{- define "trt-worker.stateful" -}}
{{- if or (eq .Values.guarantee "exactly-once") .Values.staticMembership }}true{{ end }}
{{- end }}

{{- define "trt-worker.workloadKind" -}}
{{- if include "trt-worker.stateful" . }}StatefulSet{{ else }}Deployment{{ end }}
{{- end }}

{{/* A section of .Values.config as a dict (empty when absent). */}}
{{- define "trt-worker.section" -}}
{{- $root := index . 0 }}{{ $name := index . 1 }}
{{- toYaml (index ($root.Values.config | default dict) $name | default dict) }}
{{- end }}

{{/* commit.shutdown_timeout_s: the worker's default is 120 s. */}}
{{- define "trt-worker.shutdownTimeout" -}}
{{- $commit := include "trt-worker.section" (list . "commit") | fromYaml }}
{{- if hasKey $commit "shutdown_timeout_s" }}{{ $commit.shutdown_timeout_s | float64 }}{{ else }}120{{ end }}
{{- end }}

{{/* terminationGracePeriodSeconds: above the shutdown timeout, so the worker's own timeout (a
     stack dump and exit 1) fires before the kubelet's SIGKILL. */}}
{{- define "trt-worker.grace" -}}
{{- $timeout := include "trt-worker.shutdownTimeout" . | float64 }}
{{- $grace := .Values.terminationGracePeriodSeconds }}
{{- if kindIs "invalid" $grace }}
{{- add (ceil $timeout | int) 30 }}
{{- else if le ($grace | float64) $timeout }}
{{- fail (printf "terminationGracePeriodSeconds (%v) must be above commit.shutdown_timeout_s (%v): the kubelet would kill the worker before it has drained, committed and exited (leave it unset for shutdown_timeout_s + 30)" $grace $timeout) }}
{{- else }}
{{- $grace | int }}
{{- end }}
{{- end }}

{{- define "trt-worker.task" -}}
{{- $p := include "trt-worker.section" (list . "processing") | fromYaml }}
{{- $p.task | default "moderation" }}
{{- end }}

{{/* The jobs topic the worker consumes: that of processing.task. */}}
{{- define "trt-worker.jobsTopic" -}}
{{- if eq (include "trt-worker.task" .) "generation" }}
{{- $g := include "trt-worker.section" (list . "generation") | fromYaml }}
{{- (($g.topics | default dict).jobs) | default "generation.jobs" }}
{{- else }}
{{- $t := include "trt-worker.section" (list . "topics") | fromYaml }}
{{- $t.jobs | default "moderation.jobs" }}
{{- end }}
{{- end }}

{{- define "trt-worker.groupId" -}}
{{- $k := include "trt-worker.section" (list . "kafka") | fromYaml }}
{{- $k.group_id | default "trt-worker" }}
{{- end }}

{{- define "trt-worker.bootstrapServers" -}}
{{- $k := include "trt-worker.section" (list . "kafka") | fromYaml }}
{{- $k.bootstrap_servers | default "" }}
{{- end }}

{{/* Render-time checks of values the worker cannot see (it validates its own config). */}}
{{- define "trt-worker.validate" -}}
{{- if not (has .Values.guarantee (list "at-least-once" "exactly-once")) }}
{{- fail (printf "guarantee must be at-least-once or exactly-once, not %q" .Values.guarantee) }}
{{- end }}
{{- $kafka := include "trt-worker.section" (list . "kafka") | fromYaml }}
{{- $processing := include "trt-worker.section" (list . "processing") | fromYaml }}
{{- $metrics := include "trt-worker.section" (list . "metrics") | fromYaml }}
{{- $engines := include "trt-worker.section" (list . "engines") | fromYaml }}
{{- if hasKey $processing "guarantee" }}
{{- fail "config.processing.guarantee is set by the chart: use the value `guarantee`" }}
{{- end }}
{{- if hasKey $kafka "static_membership" }}
{{- fail "config.kafka.static_membership is set by the chart: use the value `staticMembership`" }}
{{- end }}
{{- if hasKey $kafka "instance_id" }}
{{- fail "config.kafka.instance_id is set by the chart (the pod name)" }}
{{- end }}
{{- if hasKey $metrics "port" }}
{{- fail "config.metrics.port is set by the chart: use the value `metrics.port`" }}
{{- end }}
{{- if hasKey $engines "cache_dir" }}
{{- fail "config.engines.cache_dir is set by the chart: use the value `engineCache.mountPath`" }}
{{- end }}
{{- if lt (.Values.topic.partitions | int) 1 }}
{{- fail "topic.partitions must be at least 1" }}
{{- end }}
{{- $cache := .Values.engineCache.type }}
{{- if not (has $cache (list "emptyDir" "pvc" "volumeClaimTemplate")) }}
{{- fail (printf "engineCache.type must be emptyDir, pvc or volumeClaimTemplate, not %q" $cache) }}
{{- end }}
{{- if and (eq $cache "pvc") (not .Values.engineCache.existingClaim) }}
{{- fail "engineCache.type pvc needs engineCache.existingClaim" }}
{{- end }}
{{- if and (eq $cache "volumeClaimTemplate") (not (include "trt-worker.stateful" .)) }}
{{- fail "engineCache.type volumeClaimTemplate needs a StatefulSet (guarantee: exactly-once or staticMembership: true); use emptyDir or pvc" }}
{{- end }}
{{- $_ := include "trt-worker.grace" . }}
{{- end }}

{{/* The worker's environment: what the chart owns, then the values' env. */}}
{{- define "trt-worker.env" -}}
- name: KTW_CONFIG_FILE
  value: /etc/trt-worker/config.toml
- name: KTW_KAFKA__INSTANCE_ID
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
{{- if .Values.staticMembership }}
- name: KTW_KAFKA__STATIC_MEMBERSHIP
  value: "true"
{{- end }}
- name: KTW_PROCESSING__GUARANTEE
  value: {{ .Values.guarantee | quote }}
- name: KTW_METRICS__PORT
  value: {{ .Values.metrics.port | quote }}
- name: KTW_CACHE_DIR
  value: {{ .Values.engineCache.mountPath | quote }}
- name: KTW_ENGINES__CACHE_DIR
  value: {{ printf "%s/engines" (.Values.engineCache.mountPath | trimSuffix "/") | quote }}
- name: HOME
  value: /home/worker
{{- with .Values.env }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "trt-worker.resources" -}}
{{- $res := deepCopy (.Values.resources | default dict) }}
{{- if .Values.gpu.enabled }}
{{- $limits := deepCopy (get $res "limits" | default dict) }}
{{- $_ := set $limits .Values.gpu.resourceName 1 }}
{{- $_ := set $res "limits" $limits }}
{{- end }}
{{- toYaml $res }}
{{- end }}

{{- define "trt-worker.volumeMounts" -}}
- name: config
  mountPath: /etc/trt-worker
  readOnly: true
- name: engine-cache
  mountPath: {{ .Values.engineCache.mountPath }}
- name: tmp
  mountPath: /tmp
- name: home
  mountPath: /home/worker
{{- with .Values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The pod template of the Deployment and of the StatefulSet. */}}
{{- define "trt-worker.podTemplate" -}}
metadata:
  labels:
    {{- include "trt-worker.selectorLabels" . | nindent 4 }}
    {{- with .Values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    checksum/config: {{ include (print $.Template.BasePath "/configmap.yaml") . | sha256sum }}
    {{- with .Values.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  serviceAccountName: {{ include "trt-worker.serviceAccountName" . }}
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: {{ include "trt-worker.grace" . }}
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.runtimeClassName }}
  runtimeClassName: {{ . }}
  {{- end }}
  {{- with .Values.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  securityContext:
    {{- toYaml .Values.podSecurityContext | nindent 4 }}
  {{- with .Values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- $tolerations := .Values.tolerations | default list }}
  {{- if .Values.gpu.enabled }}
  {{- $tolerations = concat $tolerations (.Values.gpu.tolerations | default list) }}
  {{- end }}
  {{- with $tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.topologySpreadConstraints }}
  topologySpreadConstraints:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- if .Values.engineCache.prebuild }}
  initContainers:
    # Builds (or finds) the engine the worker will load, on this pod's device, so the worker
    # starts warm; a shared cache (pvc) is built once for all pods.
    - name: engines-build
      image: {{ include "trt-worker.image" . | quote }}
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      args: ["engines", "build", "--config", "/etc/trt-worker/config.toml"]
      env:
        {{- include "trt-worker.env" . | nindent 8 }}
      {{- with .Values.envFrom }}
      envFrom:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        {{- toYaml .Values.securityContext | nindent 8 }}
      resources:
        {{- include "trt-worker.resources" . | nindent 8 }}
      volumeMounts:
        {{- include "trt-worker.volumeMounts" . | nindent 8 }}
  {{- end }}
  containers:
    - name: worker
      image: {{ include "trt-worker.image" . | quote }}
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      args: ["run", "--config", "/etc/trt-worker/config.toml"]
      env:
        {{- include "trt-worker.env" . | nindent 8 }}
      {{- with .Values.envFrom }}
      envFrom:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      ports:
        - name: metrics
          containerPort: {{ .Values.metrics.port }}
          protocol: TCP
      startupProbe:
        {{- toYaml .Values.probes.startup | nindent 8 }}
      livenessProbe:
        {{- toYaml .Values.probes.liveness | nindent 8 }}
      readinessProbe:
        {{- toYaml .Values.probes.readiness | nindent 8 }}
      securityContext:
        {{- toYaml .Values.securityContext | nindent 8 }}
      resources:
        {{- include "trt-worker.resources" . | nindent 8 }}
      volumeMounts:
        {{- include "trt-worker.volumeMounts" . | nindent 8 }}
  volumes:
    - name: config
      configMap:
        name: {{ include "trt-worker.fullname" . }}
    {{- if eq .Values.engineCache.type "emptyDir" }}
    - name: engine-cache
      emptyDir:
        sizeLimit: {{ .Values.engineCache.sizeLimit }}
    {{- else if eq .Values.engineCache.type "pvc" }}
    - name: engine-cache
      persistentVolumeClaim:
        claimName: {{ .Values.engineCache.existingClaim }}
    {{- end }}
    - name: tmp
      emptyDir:
        sizeLimit: {{ .Values.tmp.sizeLimit }}
    - name: home
      emptyDir:
        sizeLimit: 1Gi
    {{- with .Values.extraVolumes }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end }}
