{{/* Common names and labels. */}}
{{- define "spotgpu.fullname" -}}
{{- printf "%s" .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "spotgpu.labels" -}}
app.kubernetes.io/name: spotgpu
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: spotgpu
{{- end -}}

{{- define "spotgpu.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* "true" when the return guard is on: the agent runs and agent.config.guard.enabled is not false. */}}
{{- define "spotgpu.guardEnabled" -}}
{{- if and .Values.agent.enabled (or (not (hasKey .Values.agent.config.guard "enabled")) .Values.agent.config.guard.enabled) -}}
true
{{- end -}}
{{- end -}}

{{/* "true" in NRI mode (agent.runtime.mode: nri); fails on anything but wrapper or nri. */}}
{{- define "spotgpu.nriMode" -}}
{{- $mode := .Values.agent.runtime.mode | default "wrapper" -}}
{{- if not (or (eq $mode "wrapper") (eq $mode "nri")) -}}
{{- fail (printf "agent.runtime.mode: %q must be wrapper or nri" $mode) -}}
{{- end -}}
{{- if eq $mode "nri" -}}
true
{{- end -}}
{{- end -}}

{{/*
agent.config.guard.handoverTimeout in whole seconds (60 or "60s"; default 60, as GuardConfig's).
The holder's terminationGracePeriodSeconds is derived from it, so anything else is refused.
*/}}
{{- define "spotgpu.handoverSeconds" -}}
{{- $value := "60" -}}
{{- if hasKey .Values.agent.config.guard "handoverTimeout" -}}
{{- $value = toString .Values.agent.config.guard.handoverTimeout -}}
{{- end -}}
{{- if not (regexMatch "^[1-9][0-9]*s?$" $value) -}}
{{- fail (printf "agent.config.guard.handoverTimeout: %q must be whole seconds (60 or \"60s\"): the guard holder's terminationGracePeriodSeconds is derived from it" $value) -}}
{{- end -}}
{{- trimSuffix "s" $value -}}
{{- end -}}

{{/*
The node configuration file (/etc/spotgpu/config.yaml) of the agent, the runtime installer and the
guard holder. The guard's sockets must lie in agent.hostPaths.spotgpu: that directory is what
agent and holder mount, and runc (on the host) connects to the listener there.
*/}}
{{- define "spotgpu.nodeConfig" -}}
{{- $dir := printf "%s/" .Values.agent.hostPaths.spotgpu -}}
{{- $listener := .Values.agent.config.guard.listenerPath | default "/run/spotgpu/guard.sock" -}}
{{- $holder := .Values.agent.config.guard.holderPath | default "/run/spotgpu/fd-holder.sock" -}}
{{- if not (hasPrefix $dir $listener) -}}
{{- fail (printf "agent.config.guard.listenerPath %q must lie in agent.hostPaths.spotgpu (%s), which agent, guard holder and runc share" $listener .Values.agent.hostPaths.spotgpu) -}}
{{- end -}}
{{- if not (hasPrefix $dir $holder) -}}
{{- fail (printf "agent.config.guard.holderPath %q must lie in agent.hostPaths.spotgpu (%s), which agent and guard holder share" $holder .Values.agent.hostPaths.spotgpu) -}}
{{- end -}}
runtime:
  {{- toYaml .Values.agent.runtime.config | nindent 2 }}
  agentSocket: {{ .Values.agent.hostPaths.spotgpu }}/agent.sock
  devicePluginDir: {{ .Values.agent.hostPaths.devicePlugins }}
  podResourcesSocket: {{ .Values.agent.hostPaths.podResources }}/kubelet.sock
  guardEnabled: {{ if include "spotgpu.guardEnabled" . }}true{{ else }}false{{ end }}
  guardListenerPath: {{ $listener }}
nri:
  enabled: {{ if include "spotgpu.nriMode" . }}true{{ else }}false{{ end }}
  socketPath: {{ .Values.agent.hostPaths.nri }}/nri.sock
agent:
  {{- toYaml .Values.agent.config | nindent 2 }}
  devicePluginDir: {{ .Values.agent.hostPaths.devicePlugins }}
  podResourcesSocket: {{ .Values.agent.hostPaths.podResources }}/kubelet.sock
  containerdSocket: {{ .Values.agent.hostPaths.containerd }}/containerd.sock
  runtimeSocket: {{ .Values.agent.hostPaths.spotgpu }}/agent.sock
  shadowNamespace: {{ .Release.Namespace }}
{{- end -}}

{{/*
Environment of the containers that run agent.config.guard.runtimeBinary (spotgpu-host-runtime):
the node's runtime whose version decides whether the guard can work.
*/}}
{{- define "spotgpu.hostRuntimeEnv" -}}
- name: SPOTGPU_HOST_RUNTIME
  value: {{ .Values.agent.runtime.config.lowerRuntime | default "runc" | quote }}
- name: SPOTGPU_HOST_RUNTIME_REPORT
  value: parent
{{- end -}}

{{/* The admission policies' namespaceSelector: every namespace but admission.excludedNamespaces. */}}
{{- define "spotgpu.admissionNamespaces" -}}
{{- with .Values.admission.excludedNamespaces -}}
namespaceSelector:
  matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: NotIn
      values: {{ toJson . }}
{{- end }}
{{- end }}

{{/* The spot resources as a CEL list: admission.spotResource and its shared twin. */}}
{{- define "spotgpu.spotResourcesCel" -}}
{{- printf "['%s', '%s-shared']" .Values.admission.spotResource .Values.admission.spotResource -}}
{{- end -}}

