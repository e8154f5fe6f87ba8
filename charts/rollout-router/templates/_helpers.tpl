{{/* Chart name, at most 63 characters. */}}
{{- define "rollout-router.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* "<release>-<chart>" (or the release name when it already holds the chart name), at most 52 characters so suffixes fit. */}}
{{- define "rollout-router.fullname" -}}
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

{{- define "rollout-router.operatorName" -}}
{{- printf "%s-operator" (include "rollout-router.fullname" .) }}
{{- end }}

{{/* The Secret holding the operator's admin token key (key "key"): the user's, or the chart's. */}}
{{- define "rollout-router.adminTokenKeySecret" -}}
{{- default (printf "%s-token-key" (include "rollout-router.operatorName" .)) .Values.adminTokenKey.existingSecret }}
{{- end }}

{{- define "rollout-router.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "rollout-router.labels" -}}
helm.sh/chart: {{ include "rollout-router.chart" . }}
app.kubernetes.io/name: {{ include "rollout-router.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: rollout-router
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The operator's selector labels. Router pods carry component=router, so the two never overlap. */}}
{{- define "rollout-router.operatorSelectorLabels" -}}
app.kubernetes.io/name: {{ include "rollout-router.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "rollout-router.annotations" -}}
{{- with .Values.commonAnnotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{- define "rollout-router.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "rollout-router.operatorName" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The operator's image. */}}
{{- define "rollout-router.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The router pods' image (the operator's --router-image). */}}
{{- define "rollout-router.routerImage" -}}
{{- printf "%s:%s" .Values.routerImage.repository (default .Chart.AppVersion .Values.routerImage.tag) }}
{{- end }}

{{/* The operator's permissions on RolloutRouters and their children (a Role's or ClusterRole's rules),
the same as docs/examples/operator.yaml (tests/test_chart.py keeps them equal; docs/operator.md says why
each verb is there). Server-side apply creates and patches children, delete removes the ones no longer
rendered, rolloutrouters/finalizers lets children carry blockOwnerDeletion, and the operator holds pod
read access because a Role can only grant what its creator holds; replicasets: list, so the status poller
counts only pods of its own Deployment. */}}
{{- define "rollout-router.operatorRules" -}}
- apiGroups: [rolloutrouter.dev]
  resources: [rolloutrouters]
  verbs: [list, watch, patch]
- apiGroups: [rolloutrouter.dev]
  resources: [rolloutrouters/status]
  verbs: [patch]
- apiGroups: [rolloutrouter.dev]
  resources: [rolloutrouters/finalizers]
  verbs: [update]
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
- apiGroups: [apps]
  resources: [replicasets]
  verbs: [list]
- apiGroups: [""]
  resources: [configmaps, services, serviceaccounts]
  verbs: [create, patch, delete]
- apiGroups: [""]
  resources: [secrets]
  verbs: [create, patch, delete]
- apiGroups: [apps]
  resources: [deployments]
  verbs: [create, patch, delete]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [create, patch, delete]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [create, patch, delete]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [create, patch, delete]
- apiGroups: [monitoring.coreos.com]
  resources: [servicemonitors]
  verbs: [create, patch, delete]
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- end }}

{{/* The namespaces the operator watches: operator.watchNamespaces, else the release namespace; none with
operator.watchAllNamespaces (then it watches every namespace). */}}
{{- define "rollout-router.watchNamespaces" -}}
{{- if .Values.operator.watchAllNamespaces }}
{{- if .Values.operator.watchNamespaces }}
{{- fail "operator.watchAllNamespaces and operator.watchNamespaces exclude each other: set one" }}
{{- end }}
{{- list | toJson }}
{{- else }}
{{- default (list .Release.Namespace) .Values.operator.watchNamespaces | uniq | toJson }}
{{- end }}
{{- end }}
