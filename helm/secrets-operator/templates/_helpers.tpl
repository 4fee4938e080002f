{{/*
Chart name.
*/}}
{{- define "secrets-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: the prefix of every resource name and the Lease prefix.
*/}}
{{- define "secrets-operator.fullname" -}}
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

{{/*
`<fullname>-<suffix>`, truncated to a valid name. Call with (list . "suffix").
*/}}
{{- define "secrets-operator.suffixed" -}}
{{- $root := index . 0 }}
{{- printf "%s-%s" (include "secrets-operator.fullname" $root) (index . 1) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Name of the StatefulSet. At most 52 characters, so that the pod label
`controller-revision-hash` (name + hash) stays within 63.
*/}}
{{- define "secrets-operator.managerName" -}}
{{- printf "%s-controller-manager" (include "secrets-operator.fullname" .) | trunc 52 | trimSuffix "-" }}
{{- end }}

{{/*
Name of the metrics Service.
*/}}
{{- define "secrets-operator.metricsServiceName" -}}
{{- include "secrets-operator.suffixed" (list . "controller-manager-metrics-service") }}
{{- end }}

{{- define "secrets-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels of every object.
*/}}
{{- define "secrets-operator.labels" -}}
helm.sh/chart: {{ include "secrets-operator.chart" . }}
{{ include "secrets-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kms-operator
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Labels that select the operator pods.
*/}}
{{- define "secrets-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "secrets-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Labels of the operator pods and of what selects them (the metrics Service).
*/}}
{{- define "secrets-operator.podSelectorLabels" -}}
{{ include "secrets-operator.selectorLabels" . }}
control-plane: controller-manager
{{- end }}

{{/*
The operator's ServiceAccount.
*/}}
{{- define "secrets-operator.serviceAccountName" -}}
{{- $sa := .Values.controllerManager.serviceAccount }}
{{- if $sa.create }}
{{- default (include "secrets-operator.managerName" .) $sa.name }}
{{- else }}
{{- required "controllerManager.serviceAccount.name is required when controllerManager.serviceAccount.create is false" $sa.name }}
{{- end }}
{{- end }}

{{/*
Replica count: `controllerManager.replicas` when set, else `replicaCount`.
*/}}
{{- define "secrets-operator.replicas" -}}
{{- $replicas := .Values.replicaCount }}
{{- if not (kindIs "invalid" .Values.controllerManager.replicas) }}
{{- $replicas = .Values.controllerManager.replicas }}
{{- end }}
{{- int $replicas }}
{{- end }}

{{/*
The namespace list as JSON: `scopedNamespaces` (list or comma string), else the
deprecated `scopedNamespace`. Empty entries are dropped, duplicates removed.
*/}}
{{- define "secrets-operator.namespaceList" -}}
{{- $items := list }}
{{- $raw := .Values.scopedNamespaces }}
{{- if kindIs "string" $raw }}
{{- $raw = splitList "," $raw }}
{{- end }}
{{- range $raw }}
{{- $ns := trim (toString .) }}
{{- if $ns }}
{{- $items = append $items $ns }}
{{- end }}
{{- end }}
{{- if and (not $items) (trim .Values.scopedNamespace) }}
{{- $items = list (trim .Values.scopedNamespace) }}
{{- end }}
{{- $items | uniq | toJson }}
{{- end }}

{{/*
"true" when the operator runs namespace-scoped: a namespace list and
scopedRBAC.
*/}}
{{- define "secrets-operator.scoped" -}}
{{- if and .Values.scopedRBAC (include "secrets-operator.namespaceList" . | fromJsonArray) }}true{{ end }}
{{- end }}

{{/*
The namespaces the operator watches, as a list; empty when cluster-wide.
Use: include "secrets-operator.watchedNamespaces" . | fromJsonArray
*/}}
{{- define "secrets-operator.watchedNamespaces" -}}
{{- if include "secrets-operator.scoped" . }}
{{- include "secrets-operator.namespaceList" . }}
{{- else }}
{{- list | toJson }}
{{- end }}
{{- end }}

{{/*
The operator image.
*/}}
{{- define "secrets-operator.image" -}}
{{- $image := .Values.controllerManager.manager.image }}
{{- $ref := printf "%s:%s" $image.repository (default .Chart.AppVersion (toString $image.tag)) }}
{{- if $image.digest }}
{{- $ref = printf "%s@%s" $ref $image.digest }}
{{- end }}
{{- $ref }}
{{- end }}

{{/*
Secret holding the cache encryption key.
*/}}
{{- define "secrets-operator.cacheKeySecretName" -}}
{{- default (include "secrets-operator.suffixed" (list . "cache-key")) .Values.cache.encryption.existingSecret }}
{{- end }}

{{/*
Where the pod mounts the cache and the key.
*/}}
{{- define "secrets-operator.cacheDir" -}}/var/cache/kms-operator{{- end }}
{{- define "secrets-operator.cacheKeyDir" -}}/etc/kms-operator/cache-key{{- end }}
{{- define "secrets-operator.metricsCertDir" -}}/etc/kms-operator/metrics-cert{{- end }}

{{/*
Name of the global configuration ConfigMap (fixed: the operator reads it).
*/}}
{{- define "secrets-operator.globalConfigName" -}}kms-config{{- end }}

{{/*
Namespace of the global configuration ConfigMap (globalConfig.namespace).
*/}}
{{- define "secrets-operator.globalConfigNamespace" -}}
{{- required "globalConfig.namespace must not be empty" (trim .Values.globalConfig.namespace) }}
{{- end }}

{{/*
Namespace of the global CA Secret.
*/}}
{{- define "secrets-operator.caNamespace" -}}
{{- default .Release.Namespace .Values.tls.caRef.secretNamespace }}
{{- end }}

{{/*
Rules the operator needs in every namespace it watches (a ClusterRole when
cluster-wide, a Role per namespace when scoped).
*/}}
{{- define "secrets-operator.managerRules" -}}
- apiGroups: ["secrets.hanzo.ai"]
  resources: ["kmssecrets", "kmspushsecrets", "kmsdynamicsecrets"]
  verbs: ["get", "list", "watch", "patch", "update"]
- apiGroups: ["secrets.hanzo.ai"]
  resources: ["kmssecrets/status", "kmspushsecrets/status", "kmsdynamicsecrets/status"]
  verbs: ["get", "patch", "update"]
- apiGroups: ["secrets.hanzo.ai"]
  resources: ["kmssecrets/finalizers", "kmspushsecrets/finalizers", "kmsdynamicsecrets/finalizers"]
  verbs: ["update"]
- apiGroups: [""]
  resources: ["secrets", "configmaps"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["get"]
- apiGroups: [""]
  resources: ["serviceaccounts/token"]
  verbs: ["create"]
- apiGroups: ["apps"]
  resources: ["deployments", "statefulsets", "daemonsets"]
  verbs: ["get", "list", "watch", "patch"]
{{- if .Values.autoReload.argoRollouts }}
- apiGroups: ["argoproj.io"]
  resources: ["rollouts"]
  verbs: ["get", "list", "watch", "patch"]
{{- end }}
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end }}

{{/*
The ServiceAccount as a binding subject.
*/}}
{{- define "secrets-operator.subject" -}}
- kind: ServiceAccount
  name: {{ include "secrets-operator.serviceAccountName" . }}
  namespace: {{ .Release.Namespace }}
{{- end }}

{{/*
Selector of the operator's metrics in PromQL.
*/}}
{{- define "secrets-operator.promSelector" -}}
job="{{ include "secrets-operator.metricsServiceName" . }}", namespace="{{ .Release.Namespace }}"
{{- end }}

{{/*
`runbook_url` of an alert, when a runbook base URL is set. Call with
(list . "AlertName").
*/}}
{{- define "secrets-operator.runbook" -}}
{{- $root := index . 0 }}
{{- with $root.Values.telemetry.prometheusRule.runbookBaseURL }}
runbook_url: {{ printf "%s#%s" . (lower (index $ 1)) | quote }}
{{- end }}
{{- end }}

{{/*
The pod fields the operator's pods and the helm test Pod share, at column 0:
image pull secrets (names or objects), the pod security context (on
OpenShift without the IDs, which the SCC assigns), node selector and
tolerations.
*/}}
{{- define "secrets-operator.podCommon" -}}
{{- $cm := .Values.controllerManager }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{- range . }}
{{- if kindIs "string" . }}
  - name: {{ . }}
{{- else }}
  - {{- toYaml . | nindent 4 }}
{{- end }}
{{- end }}
{{- end }}
{{- $podSecurity := $cm.podSecurityContext }}
{{- if and .Values.openshift $podSecurity }}
{{- $podSecurity = omit $podSecurity "runAsUser" "runAsGroup" "fsGroup" }}
{{- end }}
{{- with $podSecurity }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $cm.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $cm.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
The containers' security context, at column 0 (on OpenShift without the
IDs, which the SCC assigns).
*/}}
{{- define "secrets-operator.containerSecurityContext" -}}
{{- $c := .Values.controllerManager.manager.containerSecurityContext }}
{{- if and .Values.openshift $c }}
{{- $c = omit $c "runAsUser" "runAsGroup" }}
{{- end }}
{{- with $c }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
