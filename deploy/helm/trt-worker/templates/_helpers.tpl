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

{{/* <repository>@<digest> when image.digest is set (the tag is then ignored), else
     <repository>:<tag>. */}}
{{- define "trt-worker.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- $flavour := ternary "cuda" "cpu" (.Values.gpu.enabled | default false) }}
{{- $tag := .Values.image.tag | default (printf "%s-%s" .Chart.AppVersion $flavour) }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
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

{{/* The paths (a.b[0].c) of the keys under (list path node) that name a secret, one a line.
     The worker's own rule for librdkafka settings (worker/config/kafka.py is_secret_key), with
     "token" only at the end of a key: the text engines' token_buckets and overlap_tokens are
     not secrets. */}}
{{- define "trt-worker.secretPaths" -}}
{{- $path := index . 0 }}{{ $node := index . 1 }}
{{- if kindIs "map" $node }}
{{- range $k, $v := $node }}
{{- $p := ternary $k (printf "%s.%s" $path $k) (eq $path "") }}
{{- if regexMatch "(?i)(password|passphrase|secret|key\\.pem|token$)" $k }}
{{- printf "%s\n" $p }}
{{- end }}
{{- include "trt-worker.secretPaths" (list $p $v) }}
{{- end }}
{{- else if kindIs "slice" $node }}
{{- range $i, $v := $node }}
{{- include "trt-worker.secretPaths" (list (printf "%s[%d]" $path $i) $v) }}
{{- end }}
{{- end }}
{{- end }}

{{/* The TLS files as the worker container sees them (tls.enabled). */}}
{{- define "trt-worker.tlsFiles" -}}
{{- $dir := .Values.tls.mountPath | trimSuffix "/" }}
{{- if .Values.tls.caKey }}
ca: {{ printf "%s/ca.crt" $dir }}
{{- end }}
{{- if .Values.tls.certKey }}
cert: {{ printf "%s/client.crt" $dir }}
key: {{ printf "%s/client.key" $dir }}
{{- end }}
{{- end }}

{{/* The worker's config file: `config`, with the TLS files' paths when tls.enabled. */}}
{{- define "trt-worker.config" -}}
{{- $config := deepCopy (.Values.config | default dict) }}
{{- if .Values.tls.enabled }}
{{- $files := include "trt-worker.tlsFiles" . | fromYaml }}
{{- $kafka := get $config "kafka" | default dict }}
{{- if $files.ca }}
{{- $_ := set $kafka "ssl_ca_location" $files.ca }}
{{- end }}
{{- if $files.cert }}
{{- $extra := get $kafka "extra" | default dict }}
{{- $_ := set $extra "ssl.certificate.location" $files.cert }}
{{- $_ := set $extra "ssl.key.location" $files.key }}
{{- $_ := set $kafka "extra" $extra }}
{{- end }}
{{- $_ := set $config "kafka" $kafka }}
{{- end }}
{{- toToml $config }}
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
{{- $secrets := include "trt-worker.secretPaths" (list "config" (.Values.config | default dict)) | trim }}
{{- if $secrets }}
{{- fail (printf "%s: secrets may not go in `config`, which is rendered into a ConfigMap; take them from a Secret with existingSecret (or env valueFrom.secretKeyRef)" ($secrets | replace "\n" ", ")) }}
{{- end }}
{{- $es := .Values.existingSecret }}
{{- $esKeys := or $es.saslUsernameKey $es.saslPasswordKey (not (empty $es.extra)) }}
{{- if and $es.name (not $esKeys) }}
{{- fail "existingSecret.name is set, but no key of it is used: set saslPasswordKey, saslUsernameKey or extra" }}
{{- end }}
{{- if and $esKeys (not $es.name) }}
{{- fail "existingSecret's keys are set, but not existingSecret.name (the Secret to take them from)" }}
{{- end }}
{{- if .Values.tls.enabled }}
{{- if not .Values.tls.secretName }}
{{- fail "tls.enabled needs tls.secretName (the Secret with the CA and the client certificate and key)" }}
{{- end }}
{{- if and (not .Values.tls.caKey) (not .Values.tls.certKey) }}
{{- fail "tls.enabled with neither tls.caKey nor tls.certKey: nothing to mount" }}
{{- end }}
{{- if and .Values.tls.certKey (not .Values.tls.keyKey) }}
{{- fail "tls.certKey needs tls.keyKey (the client certificate's private key)" }}
{{- end }}
{{- if not (has ($kafka.security_protocol | default "PLAINTEXT") (list "SSL" "SASL_SSL")) }}
{{- fail (printf "tls.enabled needs config.kafka.security_protocol SSL or SASL_SSL, not %s: the certificates would not be used" ($kafka.security_protocol | default "PLAINTEXT")) }}
{{- end }}
{{- $extra := $kafka.extra | default dict }}
{{- if and .Values.tls.caKey (hasKey $kafka "ssl_ca_location") }}
{{- fail "config.kafka.ssl_ca_location is set by the chart with tls.enabled (the mounted tls.caKey)" }}
{{- end }}
{{- if .Values.tls.certKey }}
{{- range $k := list "ssl.certificate.location" "ssl.key.location" }}
{{- if hasKey $extra $k }}
{{- fail (printf "config.kafka.extra.%s is set by the chart with tls.enabled (the mounted tls.certKey / tls.keyKey)" $k) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- if and (not .Values.engineCache.prebuild) (eq $cache "emptyDir") (ne (toString $engines.use_cache) "false") }}
{{- fail "engineCache.prebuild is false with an emptyDir cache: nothing would build the engines, and the worker mounts the cache read-only; keep prebuild, use a pvc built beforehand, or set config.engines.use_cache=false" }}
{{- end }}
{{- if eq (include "trt-worker.task" .) "generation" }}
{{- $gen := include "trt-worker.section" (list . "generation") | fromYaml }}
{{- $blob := $gen.blob | default dict }}
{{- if eq ($blob.kind | default "local") "local" }}
{{- $dir := $blob.local_dir | default "" | toString }}
{{- $cacheDir := .Values.engineCache.mountPath | trimSuffix "/" }}
{{- if or (not $dir) (eq $dir $cacheDir) (hasPrefix (printf "%s/" $cacheDir) $dir) }}
{{- fail (printf "generation.blob.kind local needs config.generation.blob.local_dir on a writable volume (extraVolumes / extraVolumeMounts), not in the engine cache (%s), which the worker mounts read-only; or use generation.blob.kind s3" $cacheDir) }}
{{- end }}
{{- end }}
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
{{- if .Values.metrics.bindPodIP }}
- name: KTW_METRICS__HOST
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
{{- end }}
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

{{/* The worker's credentials, from existingSecret: references, never values. librdkafka's
     setting names are lower case; the worker reads environment names case-blind. */}}
{{- define "trt-worker.secretEnv" -}}
{{- $es := .Values.existingSecret }}
{{- if $es.name }}
{{- if $es.saslUsernameKey }}
- name: KTW_KAFKA__SASL_USERNAME
  valueFrom:
    secretKeyRef: {name: {{ $es.name | quote }}, key: {{ $es.saslUsernameKey | quote }}}
{{- end }}
{{- if $es.saslPasswordKey }}
- name: KTW_KAFKA__SASL_PASSWORD
  valueFrom:
    secretKeyRef: {name: {{ $es.name | quote }}, key: {{ $es.saslPasswordKey | quote }}}
{{- end }}
{{- range $setting, $key := $es.extra }}
- name: {{ printf "KTW_KAFKA__EXTRA__%s" (upper $setting) | quote }}
  valueFrom:
    secretKeyRef: {name: {{ $es.name | quote }}, key: {{ $key | quote }}}
{{- end }}
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

{{/* (dict "root" $ "builder" bool): the engine cache is writable for the builder only; the
     worker loads code from it (shared libraries it dlopens), so a compromised worker must not
     be able to change what it, or another pod sharing the cache, loads next. The TLS files go
     to the worker only (the build does not talk to Kafka). */}}
{{- define "trt-worker.volumeMounts" -}}
{{- $root := .root -}}
- name: config
  mountPath: /etc/trt-worker
  readOnly: true
- name: engine-cache
  mountPath: {{ $root.Values.engineCache.mountPath }}
  readOnly: {{ not .builder }}
{{- if and $root.Values.tls.enabled (not .builder) }}
- name: kafka-tls
  mountPath: {{ $root.Values.tls.mountPath }}
  readOnly: true
{{- end }}
- name: tmp
  mountPath: /tmp
- name: home
  mountPath: /home/worker
{{- with $root.Values.extraVolumeMounts }}
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
        {{- include "trt-worker.volumeMounts" (dict "root" . "builder" true) | nindent 8 }}
  {{- end }}
  containers:
    - name: worker
      image: {{ include "trt-worker.image" . | quote }}
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      args: ["run", "--config", "/etc/trt-worker/config.toml"]
      env:
        {{- include "trt-worker.env" . | nindent 8 }}
        {{- with include "trt-worker.secretEnv" . | trim }}
        {{- . | nindent 8 }}
        {{- end }}
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
        {{- include "trt-worker.volumeMounts" (dict "root" . "builder" false) | nindent 8 }}
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
    {{- if .Values.tls.enabled }}
    - name: kafka-tls
      secret:
        secretName: {{ .Values.tls.secretName }}
        # 0440: the key readable by the pod's group (fsGroup) only, never written.
        defaultMode: 288
        items:
          {{- with .Values.tls.caKey }}
          - {key: {{ . | quote }}, path: ca.crt}
          {{- end }}
          {{- with .Values.tls.certKey }}
          - {key: {{ . | quote }}, path: client.crt}
          - {key: {{ $.Values.tls.keyKey | quote }}, path: client.key}
          {{- end }}
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
