"""The protobuf field tables of the Kubernetes messages kubesim reads and writes.

Derived from the public `generated.proto` files of `k8s.io/api` (core/v1, apps/v1,
batch/v1, policy/v1, events/v1, autoscaling/v1, authentication/v1) and
`k8s.io/apimachinery` (meta/v1, runtime, api/resource, util/intstr): one line per
message, `number name type` per field, separated by `;`. The type grammar:

- `string` (the default when no type is written), `bytes`, `bool`, `int32`, `int64`;
- the messages with a JSON form of their own: `Time`, `MicroTime` (RFC 3339 strings),
  `Quantity` (a string), `IntOrString` (an int or a string), `FieldsV1` (raw JSON);
- any other name is a message from this table;
- `[]T` a repeated field, `map` a `map<string,string>`, `map:T` a `map<string,T>`;
- `*T` a Go pointer: a zero value on the wire is kept (`replicas: 0`), where a zero
  of a plain field is dropped the way Go's `omitempty` drops it from JSON;
- a name starting with `~` is embedded inline: its fields appear in the parent's JSON.

Only the messages kubectl sends (create namespace/configmap/secret/serviceaccount/
job/cronjob/deployment/pdb/token, drain's Eviction, DeleteOptions) and the ones a
protobuf client reads back from kubesim are here; anything else is answered in JSON.
"""

from __future__ import annotations

MESSAGES: dict[str, str] = {
    # -- k8s.io/apimachinery meta/v1 --------------------------------------------------------
    "ObjectMeta": "1 name; 2 generateName; 3 namespace; 4 selfLink; 5 uid; 6 resourceVersion;"
    " 7 generation int64; 8 creationTimestamp Time; 9 deletionTimestamp Time;"
    " 10 deletionGracePeriodSeconds *int64; 11 labels map; 12 annotations map;"
    " 13 ownerReferences []OwnerReference; 14 finalizers []string;"
    " 17 managedFields []ManagedFieldsEntry",
    "OwnerReference": "1 kind; 3 name; 4 uid; 5 apiVersion; 6 controller *bool;"
    " 7 blockOwnerDeletion *bool",
    "ManagedFieldsEntry": "1 manager; 2 operation; 3 apiVersion; 4 time Time; 6 fieldsType;"
    " 7 fieldsV1 FieldsV1; 8 subresource",
    "ListMeta": "1 selfLink; 2 resourceVersion; 3 continue; 4 remainingItemCount *int64",
    "Status": "1 metadata ListMeta; 2 status; 3 message; 4 reason; 5 details StatusDetails;"
    " 6 code int32",
    "StatusDetails": "1 name; 2 group; 3 kind; 6 uid; 4 causes []StatusCause;"
    " 5 retryAfterSeconds int32",
    "StatusCause": "1 reason; 2 message; 3 field",
    "DeleteOptions": "1 gracePeriodSeconds *int64; 2 preconditions Preconditions;"
    " 3 orphanDependents *bool; 4 propagationPolicy *string; 5 dryRun []string;"
    " 6 ignoreStoreReadErrorWithClusterBreakingPotential *bool",
    "Preconditions": "1 uid *string; 2 resourceVersion *string",
    "LabelSelector": "1 matchLabels map; 2 matchExpressions []LabelSelectorRequirement",
    "LabelSelectorRequirement": "1 key; 2 operator; 3 values []string",
    "Condition": "1 type; 2 status; 3 observedGeneration int64; 4 lastTransitionTime Time;"
    " 5 reason; 6 message",
    # -- core/v1 ---------------------------------------------------------------------------
    "Namespace": "1 metadata ObjectMeta; 2 spec NamespaceSpec; 3 status NamespaceStatus",
    "NamespaceSpec": "1 finalizers []string",
    "NamespaceStatus": "1 phase; 2 conditions []NamespaceCondition",
    "NamespaceCondition": "1 type; 2 status; 4 lastTransitionTime Time; 5 reason; 6 message",
    "ConfigMap": "1 metadata ObjectMeta; 2 data map; 3 binaryData map:bytes; 4 immutable *bool",
    "Secret": "1 metadata ObjectMeta; 2 data map:bytes; 3 type; 4 stringData map;"
    " 5 immutable *bool",
    "ServiceAccount": "1 metadata ObjectMeta; 2 secrets []ObjectReference;"
    " 3 imagePullSecrets []LocalObjectReference; 4 automountServiceAccountToken *bool",
    "ObjectReference": "1 kind; 2 namespace; 3 name; 4 uid; 5 apiVersion; 6 resourceVersion;"
    " 7 fieldPath",
    "LocalObjectReference": "1 name",
    "Pod": "1 metadata ObjectMeta; 2 spec PodSpec; 3 status PodStatus",
    "PodTemplateSpec": "1 metadata ObjectMeta; 2 spec PodSpec",
    "PodSpec": "1 volumes []Volume; 2 containers []Container; 3 restartPolicy;"
    " 4 terminationGracePeriodSeconds *int64; 5 activeDeadlineSeconds *int64; 6 dnsPolicy;"
    " 7 nodeSelector map; 8 serviceAccountName; 9 serviceAccount; 10 nodeName;"
    " 11 hostNetwork bool; 12 hostPID bool; 13 hostIPC bool;"
    " 14 securityContext PodSecurityContext; 15 imagePullSecrets []LocalObjectReference;"
    " 16 hostname; 17 subdomain; 18 affinity Affinity; 19 schedulerName;"
    " 20 initContainers []Container; 21 automountServiceAccountToken *bool;"
    " 22 tolerations []Toleration; 23 hostAliases []HostAlias; 24 priorityClassName;"
    " 25 priority *int32; 26 dnsConfig PodDNSConfig; 27 shareProcessNamespace *bool;"
    " 28 readinessGates []PodReadinessGate; 29 runtimeClassName *string;"
    " 30 enableServiceLinks *bool; 31 preemptionPolicy *string; 32 overhead map:Quantity;"
    " 33 topologySpreadConstraints []TopologySpreadConstraint; 35 setHostnameAsFQDN *bool;"
    " 36 os PodOS; 37 hostUsers *bool; 38 schedulingGates []PodSchedulingGate",
    "Volume": "1 name; 2 ~volumeSource VolumeSource",
    "VolumeSource": "1 hostPath HostPathVolumeSource; 2 emptyDir EmptyDirVolumeSource;"
    " 7 secret SecretVolumeSource; 10 persistentVolumeClaim PersistentVolumeClaimVolumeSource;"
    " 19 configMap ConfigMapVolumeSource",
    "HostPathVolumeSource": "1 path; 2 type *string",
    "EmptyDirVolumeSource": "1 medium; 2 sizeLimit Quantity",
    "SecretVolumeSource": "1 secretName; 2 items []KeyToPath; 3 defaultMode *int32;"
    " 4 optional *bool",
    "ConfigMapVolumeSource": "1 ~localObjectReference LocalObjectReference; 2 items []KeyToPath;"
    " 3 defaultMode *int32; 4 optional *bool",
    "KeyToPath": "1 key; 2 path; 3 mode *int32",
    "PersistentVolumeClaimVolumeSource": "1 claimName; 2 readOnly bool",
    "Container": "1 name; 2 image; 3 command []string; 4 args []string; 5 workingDir;"
    " 6 ports []ContainerPort; 7 env []EnvVar; 8 resources ResourceRequirements;"
    " 9 volumeMounts []VolumeMount; 10 livenessProbe Probe; 11 readinessProbe Probe;"
    " 13 terminationMessagePath; 14 imagePullPolicy; 15 securityContext SecurityContext;"
    " 16 stdin bool; 17 stdinOnce bool; 18 tty bool; 19 envFrom []EnvFromSource;"
    " 20 terminationMessagePolicy; 22 startupProbe Probe; 24 restartPolicy *string",
    "ContainerPort": "1 name; 2 hostPort int32; 3 containerPort int32; 4 protocol; 5 hostIP",
    "EnvVar": "1 name; 2 value; 3 valueFrom EnvVarSource",
    "EnvVarSource": "1 fieldRef ObjectFieldSelector; 2 resourceFieldRef ResourceFieldSelector;"
    " 3 configMapKeyRef ConfigMapKeySelector; 4 secretKeyRef SecretKeySelector",
    "ObjectFieldSelector": "1 apiVersion; 2 fieldPath",
    "ResourceFieldSelector": "1 containerName; 2 resource; 3 divisor Quantity",
    "ConfigMapKeySelector": "1 ~localObjectReference LocalObjectReference; 2 key; 3 optional *bool",
    "SecretKeySelector": "1 ~localObjectReference LocalObjectReference; 2 key; 3 optional *bool",
    "EnvFromSource": "1 prefix; 2 configMapRef ConfigMapEnvSource; 3 secretRef SecretEnvSource",
    "ConfigMapEnvSource": "1 ~localObjectReference LocalObjectReference; 2 optional *bool",
    "SecretEnvSource": "1 ~localObjectReference LocalObjectReference; 2 optional *bool",
    "ResourceRequirements": "1 limits map:Quantity; 2 requests map:Quantity;"
    " 3 claims []ResourceClaim",
    "ResourceClaim": "1 name; 2 request",
    "VolumeMount": "1 name; 2 readOnly bool; 3 mountPath; 4 subPath;"
    " 5 mountPropagation *string; 6 subPathExpr; 7 recursiveReadOnly *string",
    "Probe": "1 ~handler ProbeHandler; 2 initialDelaySeconds int32; 3 timeoutSeconds int32;"
    " 4 periodSeconds int32; 5 successThreshold int32; 6 failureThreshold int32;"
    " 7 terminationGracePeriodSeconds *int64",
    "ProbeHandler": "1 exec ExecAction; 2 httpGet HTTPGetAction; 3 tcpSocket TCPSocketAction;"
    " 4 grpc GRPCAction",
    "ExecAction": "1 command []string",
    "HTTPGetAction": "1 path; 2 port IntOrString; 3 host; 4 scheme; 5 httpHeaders []HTTPHeader",
    "HTTPHeader": "1 name; 2 value",
    "TCPSocketAction": "1 port IntOrString; 2 host",
    "GRPCAction": "1 port int32; 2 service *string",
    "SecurityContext": "1 capabilities Capabilities; 2 privileged *bool; 4 runAsUser *int64;"
    " 5 runAsNonRoot *bool; 6 readOnlyRootFilesystem *bool; 7 allowPrivilegeEscalation *bool;"
    " 8 runAsGroup *int64; 9 procMount *string; 11 seccompProfile SeccompProfile",
    "Capabilities": "1 add []string; 2 drop []string",
    "SeccompProfile": "1 type; 2 localhostProfile *string",
    "PodSecurityContext": "2 runAsUser *int64; 3 runAsNonRoot *bool;"
    " 4 supplementalGroups []int64; 5 fsGroup *int64; 6 runAsGroup *int64;"
    " 7 sysctls []Sysctl; 9 fsGroupChangePolicy *string; 10 seccompProfile SeccompProfile",
    "Sysctl": "1 name; 2 value",
    "Toleration": "1 key; 2 operator; 3 value; 4 effect; 5 tolerationSeconds *int64",
    "Affinity": "1 nodeAffinity NodeAffinity; 2 podAffinity PodAffinity;"
    " 3 podAntiAffinity PodAffinity",
    "NodeAffinity": "1 requiredDuringSchedulingIgnoredDuringExecution NodeSelector;"
    " 2 preferredDuringSchedulingIgnoredDuringExecution []PreferredSchedulingTerm",
    "NodeSelector": "1 nodeSelectorTerms []NodeSelectorTerm",
    "NodeSelectorTerm": "1 matchExpressions []NodeSelectorRequirement;"
    " 2 matchFields []NodeSelectorRequirement",
    "NodeSelectorRequirement": "1 key; 2 operator; 3 values []string",
    "PreferredSchedulingTerm": "1 weight int32; 2 preference NodeSelectorTerm",
    # PodAffinity and PodAntiAffinity share their wire shape.
    "PodAffinity": "1 requiredDuringSchedulingIgnoredDuringExecution []PodAffinityTerm;"
    " 2 preferredDuringSchedulingIgnoredDuringExecution []WeightedPodAffinityTerm",
    "PodAffinityTerm": "1 labelSelector LabelSelector; 2 namespaces []string; 3 topologyKey;"
    " 4 namespaceSelector LabelSelector; 5 matchLabelKeys []string;"
    " 6 mismatchLabelKeys []string",
    "WeightedPodAffinityTerm": "1 weight int32; 2 podAffinityTerm PodAffinityTerm",
    "TopologySpreadConstraint": "1 maxSkew int32; 2 topologyKey; 3 whenUnsatisfiable;"
    " 4 labelSelector LabelSelector; 5 minDomains *int32; 6 nodeAffinityPolicy *string;"
    " 7 nodeTaintsPolicy *string; 8 matchLabelKeys []string",
    "HostAlias": "1 ip; 2 hostnames []string",
    "PodDNSConfig": "1 nameservers []string; 2 searches []string; 3 options []PodDNSConfigOption",
    "PodDNSConfigOption": "1 name; 2 value *string",
    "PodOS": "1 name",
    "PodReadinessGate": "1 conditionType",
    "PodSchedulingGate": "1 name",
    "PodStatus": "1 phase; 2 conditions []PodCondition; 3 message; 4 reason; 5 hostIP;"
    " 6 podIP; 7 startTime Time; 8 containerStatuses []ContainerStatus; 9 qosClass;"
    " 10 initContainerStatuses []ContainerStatus; 11 nominatedNodeName; 12 podIPs []PodIP;"
    " 16 hostIPs []PodIP; 17 observedGeneration int64",
    "PodIP": "1 ip",
    "PodCondition": "1 type; 2 status; 3 lastProbeTime Time; 4 lastTransitionTime Time;"
    " 5 reason; 6 message; 7 observedGeneration int64",
    "ContainerStatus": "1 name; 2 state ContainerState; 3 lastState ContainerState;"
    " 4 ready bool; 5 restartCount int32; 6 image; 7 imageID; 8 containerID; 9 started *bool",
    "ContainerState": "1 waiting ContainerStateWaiting; 2 running ContainerStateRunning;"
    " 3 terminated ContainerStateTerminated",
    "ContainerStateWaiting": "1 reason; 2 message",
    "ContainerStateRunning": "1 startedAt Time",
    "ContainerStateTerminated": "1 exitCode int32; 2 signal int32; 3 reason; 4 message;"
    " 5 startedAt Time; 6 finishedAt Time; 7 containerID",
    "Event": "1 metadata ObjectMeta; 2 involvedObject ObjectReference; 3 reason; 4 message;"
    " 5 source EventSource; 6 firstTimestamp Time; 7 lastTimestamp Time; 8 count int32;"
    " 9 type; 10 eventTime MicroTime; 11 series EventSeries; 12 action;"
    " 13 related ObjectReference; 14 reportingComponent; 15 reportingInstance",
    "EventSource": "1 component; 2 host",
    # core/v1 and events.k8s.io/v1 EventSeries share their wire shape.
    "EventSeries": "1 count int32; 2 lastObservedTime MicroTime",
    # -- events.k8s.io/v1 -------------------------------------------------------------------
    "events.Event": "1 metadata ObjectMeta; 2 eventTime MicroTime; 3 series EventSeries;"
    " 4 reportingController; 5 reportingInstance; 6 action; 7 reason;"
    " 8 regarding ObjectReference; 9 related ObjectReference; 10 note; 11 type;"
    " 12 deprecatedSource EventSource; 13 deprecatedFirstTimestamp Time;"
    " 14 deprecatedLastTimestamp Time; 15 deprecatedCount int32",
    # -- apps/v1 ----------------------------------------------------------------------------
    "Deployment": "1 metadata ObjectMeta; 2 spec DeploymentSpec; 3 status DeploymentStatus",
    "DeploymentSpec": "1 replicas *int32; 2 selector LabelSelector; 3 template PodTemplateSpec;"
    " 4 strategy DeploymentStrategy; 5 minReadySeconds int32; 6 revisionHistoryLimit *int32;"
    " 7 paused bool; 9 progressDeadlineSeconds *int32",
    "DeploymentStrategy": "1 type; 2 rollingUpdate RollingUpdateDeployment",
    "RollingUpdateDeployment": "1 maxUnavailable IntOrString; 2 maxSurge IntOrString",
    "DeploymentStatus": "1 observedGeneration int64; 2 replicas int32; 3 updatedReplicas int32;"
    " 4 availableReplicas int32; 5 unavailableReplicas int32;"
    " 6 conditions []DeploymentCondition; 7 readyReplicas int32; 8 collisionCount *int32;"
    " 9 terminatingReplicas *int32",
    "DeploymentCondition": "1 type; 2 status; 4 reason; 5 message; 6 lastUpdateTime Time;"
    " 7 lastTransitionTime Time",
    # -- batch/v1 ---------------------------------------------------------------------------
    "Job": "1 metadata ObjectMeta; 2 spec JobSpec; 3 status JobStatus",
    "JobSpec": "1 parallelism *int32; 2 completions *int32; 3 activeDeadlineSeconds *int64;"
    " 4 selector LabelSelector; 5 manualSelector *bool; 6 template PodTemplateSpec;"
    " 7 backoffLimit *int32; 8 ttlSecondsAfterFinished *int32; 9 completionMode *string;"
    " 10 suspend *bool; 12 backoffLimitPerIndex *int32; 13 maxFailedIndexes *int32;"
    " 14 podReplacementPolicy *string; 15 managedBy *string",
    "JobStatus": "1 conditions []JobCondition; 2 startTime Time; 3 completionTime Time;"
    " 4 active int32; 5 succeeded int32; 6 failed int32; 7 completedIndexes;"
    " 8 uncountedTerminatedPods UncountedTerminatedPods; 9 ready *int32;"
    " 10 failedIndexes *string; 11 terminating *int32",
    "JobCondition": "1 type; 2 status; 3 lastProbeTime Time; 4 lastTransitionTime Time;"
    " 5 reason; 6 message",
    "UncountedTerminatedPods": "1 succeeded []string; 2 failed []string",
    "CronJob": "1 metadata ObjectMeta; 2 spec CronJobSpec; 3 status CronJobStatus",
    "CronJobSpec": "1 schedule; 8 timeZone *string; 2 startingDeadlineSeconds *int64;"
    " 3 concurrencyPolicy; 4 suspend *bool; 5 jobTemplate JobTemplateSpec;"
    " 6 successfulJobsHistoryLimit *int32; 7 failedJobsHistoryLimit *int32",
    "CronJobStatus": "1 active []ObjectReference; 4 lastScheduleTime Time;"
    " 5 lastSuccessfulTime Time",
    "JobTemplateSpec": "1 metadata ObjectMeta; 2 spec JobSpec",
    # -- policy/v1 --------------------------------------------------------------------------
    "Eviction": "1 metadata ObjectMeta; 2 deleteOptions DeleteOptions",
    "PodDisruptionBudget": "1 metadata ObjectMeta; 2 spec PodDisruptionBudgetSpec;"
    " 3 status PodDisruptionBudgetStatus",
    "PodDisruptionBudgetSpec": "1 minAvailable IntOrString; 2 selector LabelSelector;"
    " 3 maxUnavailable IntOrString; 4 unhealthyPodEvictionPolicy *string",
    "PodDisruptionBudgetStatus": "1 observedGeneration int64; 2 disruptedPods map:Time;"
    " 3 disruptionsAllowed int32; 4 currentHealthy int32; 5 desiredHealthy int32;"
    " 6 expectedPods int32; 7 conditions []Condition",
    # -- autoscaling/v1 and authentication/v1 --------------------------------------------------
    "Scale": "1 metadata ObjectMeta; 2 spec ScaleSpec; 3 status ScaleStatus",
    "ScaleSpec": "1 replicas int32",
    "ScaleStatus": "1 replicas int32; 2 selector",
    "TokenRequest": "1 metadata ObjectMeta; 2 spec TokenRequestSpec; 3 status TokenRequestStatus",
    "TokenRequestSpec": "1 audiences []string; 4 expirationSeconds *int64;"
    " 3 boundObjectRef BoundObjectReference",
    "BoundObjectReference": "1 kind; 2 apiVersion; 3 name; 4 uid",
    "TokenRequestStatus": "1 token; 2 expirationTimestamp Time",
}

# (apiVersion, kind) of every top-level object with a table above (its list type
# `<Kind>List` is `1 metadata ListMeta; 2 items []<Kind>`).
KINDS: dict[tuple[str, str], str] = {
    ("v1", "Namespace"): "Namespace",
    ("v1", "ConfigMap"): "ConfigMap",
    ("v1", "Secret"): "Secret",
    ("v1", "ServiceAccount"): "ServiceAccount",
    ("v1", "Pod"): "Pod",
    ("v1", "Event"): "Event",
    ("events.k8s.io/v1", "Event"): "events.Event",
    ("apps/v1", "Deployment"): "Deployment",
    ("batch/v1", "Job"): "Job",
    ("batch/v1", "CronJob"): "CronJob",
    ("policy/v1", "Eviction"): "Eviction",
    ("policy/v1beta1", "Eviction"): "Eviction",
    ("policy/v1", "PodDisruptionBudget"): "PodDisruptionBudget",
    ("autoscaling/v1", "Scale"): "Scale",
    ("authentication.k8s.io/v1", "TokenRequest"): "TokenRequest",
}

# Kinds every API group version serves (the envelope names the client's group version).
ANY_VERSION_KINDS: dict[str, str] = {"Status": "Status", "DeleteOptions": "DeleteOptions"}
