"""Where sandbox pods run: the platform's choice, never a run's. A CodeRunPolicy's spec.scheduling and the chart's
sandboxScheduling values carry the same model; the operator takes the policy's field where it is set, the chart's
where it is not (`effective_scheduling`), and puts the five pod fields on every sandbox pod it builds, cold, warm
or a session's (coderun_operator/builders/scheduling.py).

Affinity is typed to the last field, as core/v1 has it, rather than kept as any object: a misspelt key or a
wrong operator is refused at `kubectl apply` naming the field (an object kept whole would be refused only when a
run's pod is created, as that run's failure), and every list is bounded, so a policy stays small and its CEL rules
cheap. The checks Kubernetes makes on these fields when it admits a pod are made here too (pydantic and CEL), so
a policy the API server accepts never makes pods it refuses.
"""
from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import ConfigDict, Field, StringConstraints, field_validator, model_validator
from pydantic.config import JsonDict, JsonValue

from .base import ApiModel, _cel

# A label key: an optional DNS-subdomain prefix and a name of at most 63 characters (kubernetes.io/hostname).
LABEL_KEY_PATTERN = (r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                     r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
MAX_LABEL_KEY = 317  # 253 of prefix, the slash, 63 of name
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"
# An object name that is a DNS subdomain (a Secret's, a PriorityClass's); empty for "none".
SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
MAX_MAP_ENTRIES = 32
MAX_TOLERATIONS = 32
MAX_TERMS = 8
MAX_EXPRESSIONS = 16
MAX_VALUES = 64
MAX_PULL_SECRETS = 16

LabelValue = Annotated[str, StringConstraints(max_length=63, pattern=LABEL_VALUE_PATTERN)]


def _or_empty(pattern: str) -> str:
    return f"^({pattern[1:-1]})?$"


_LABEL_KEY_ITEMS: dict[str, Any] = {"items": {"type": "string", "maxLength": MAX_LABEL_KEY,
                                              "pattern": LABEL_KEY_PATTERN}}


def _check_label_keys(labels: dict[str, str] | None, what: str) -> dict[str, str] | None:
    """A map's keys: checked here, by the operator's loader (the policy's Accepted condition says so), not by
    CEL: a structural schema cannot bound a map key's length, and a regular expression on an unbounded string
    is over the API server's cost budget for a rule."""
    for key in labels or {}:
        if len(key) > MAX_LABEL_KEY or not re.match(LABEL_KEY_PATTERN, key):
            raise ValueError(f"{key!r} is not a label key; every key of {what} must be one, such as "
                             "kubernetes.io/hostname or sandbox.example.com/pool")
    return labels


class Toleration(ApiModel):
    """A taint the sandbox pods tolerate, as in a pod's spec.tolerations: with the taint's key and value
    (operator Equal) or its key alone (operator Exists)."""
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        _cel("!has(self.value) || self.value == '' || !has(self.operator) || self.operator == 'Equal'",
             "a toleration with operator Exists matches every value of its key: remove value, or use Equal",
             ".value"),
        _cel("(has(self.key) && self.key != '') || (has(self.operator) && self.operator == 'Exists')",
             "a toleration without a key must have operator Exists (it then tolerates every taint): set key, or "
             "operator: Exists", ".key"),
        _cel("!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
             "tolerationSeconds applies to NoExecute taints only: set effect: NoExecute or remove "
             "tolerationSeconds", ".tolerationSeconds"),
    ]})
    key: str | None = Field(None, max_length=MAX_LABEL_KEY, pattern=_or_empty(LABEL_KEY_PATTERN), description=(
        "The taint's key, e.g. sandbox.example.com/dedicated. Unset, with operator Exists: every taint."))
    operator: str | None = Field(None, pattern=r"^(Exists|Equal)$", description=(
        "Equal (the default): the taint's value must equal value. Exists: any value of the key."))
    value: str | None = Field(None, max_length=63, pattern=LABEL_VALUE_PATTERN, description=(
        "The taint's value, with operator Equal."))
    effect: str | None = Field(None, pattern=r"^(NoSchedule|PreferNoSchedule|NoExecute)$", description=(
        "The taint effect tolerated: NoSchedule, PreferNoSchedule or NoExecute. Unset: every effect."))
    toleration_seconds: int | None = Field(None, ge=0, le=7 * 86400, description=(
        "With effect NoExecute: how long a running sandbox stays on a node after the taint appears. Unset: for "
        "as long as it runs."))

    @model_validator(mode="after")
    def _consistent(self) -> "Toleration":
        # The CEL rules above, so a chart value or the SDK says it before the API server does.
        if self.value and self.operator == "Exists":
            raise ValueError("a toleration with operator Exists matches every value of its key: remove value, or "
                             "use Equal")
        if not self.key and self.operator != "Exists":
            raise ValueError("a toleration without a key must have operator Exists (it then tolerates every "
                             "taint): set key, or operator: Exists")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerationSeconds applies to NoExecute taints only: set effect: NoExecute or remove "
                             "tolerationSeconds")
        return self


_SET_OPERATORS = ("In", "NotIn")
_PRESENCE_OPERATORS = ("Exists", "DoesNotExist")


def _requirement_rules(with_numbers: bool) -> JsonDict:
    rules: list[JsonValue] = [_cel("!(self.operator in ['In', 'NotIn']) || (has(self.values) && size(self.values) > 0)",
                  "operator In and NotIn need at least one value", ".values"),
             _cel("!(self.operator in ['Exists', 'DoesNotExist']) || !has(self.values) || size(self.values) == 0",
                  "operator Exists and DoesNotExist take no values: remove values", ".values")]
    if with_numbers:
        rules.append(_cel("!(self.operator in ['Gt', 'Lt']) || (has(self.values) && size(self.values) == 1 && "
                          "self.values[0].matches('^-?[0-9]+$'))",
                          "operator Gt and Lt take exactly one value, an integer", ".values"))
    return {"x-kubernetes-validations": rules}


def _check_requirement(operator: str, values: list[str] | None) -> None:
    if operator in _SET_OPERATORS and not values:
        raise ValueError(f"operator {operator} needs at least one value")
    if operator in _PRESENCE_OPERATORS and values:
        raise ValueError(f"operator {operator} takes no values: remove values")
    if operator in ("Gt", "Lt") and (len(values or ()) != 1 or not re.match(r"^-?[0-9]+$", (values or [""])[0])):
        raise ValueError(f"operator {operator} takes exactly one value, an integer")


class NodeSelectorRequirement(ApiModel):
    """One condition on a node's labels (or, in matchFields, its metadata.name)."""
    model_config = ConfigDict(json_schema_extra=_requirement_rules(with_numbers=True))
    key: str = Field(min_length=1, max_length=MAX_LABEL_KEY, pattern=LABEL_KEY_PATTERN, description=(
        "The label key, e.g. topology.kubernetes.io/zone."))
    operator: str = Field(pattern=r"^(In|NotIn|Exists|DoesNotExist|Gt|Lt)$", description=(
        "In, NotIn, Exists, DoesNotExist, Gt or Lt."))
    values: list[str] | None = Field(None, max_length=MAX_VALUES, description=(
        "The values for In and NotIn; one integer for Gt and Lt; none for Exists and DoesNotExist."),
        json_schema_extra={"items": {"type": "string", "maxLength": 63}})

    @model_validator(mode="after")
    def _consistent(self) -> "NodeSelectorRequirement":
        _check_requirement(self.operator, self.values)
        return self


class NodeSelectorTerm(ApiModel):
    """Conditions that must all hold for a node to match."""
    match_expressions: list[NodeSelectorRequirement] | None = Field(None, max_length=MAX_EXPRESSIONS, description=(
        "Conditions on the node's labels."))
    match_fields: list[NodeSelectorRequirement] | None = Field(None, max_length=MAX_EXPRESSIONS, description=(
        "Conditions on the node's fields (metadata.name)."))


class NodeSelector(ApiModel):
    """Terms of which at least one must hold."""
    node_selector_terms: list[NodeSelectorTerm] = Field(min_length=1, max_length=MAX_TERMS, description=(
        "A node matches when any of these terms holds."))


class PreferredSchedulingTerm(ApiModel):
    """A term the scheduler favours by its weight."""
    weight: int = Field(ge=1, le=100, description="1 to 100: how much a node matching the term is favoured.")
    preference: NodeSelectorTerm = Field(description="The term.")


class NodeAffinity(ApiModel):
    """Which nodes the sandbox pods may (required) or should (preferred) run on."""
    required_during_scheduling_ignored_during_execution: NodeSelector | None = Field(None, description=(
        "Nodes outside these terms never take a sandbox pod."))
    preferred_during_scheduling_ignored_during_execution: list[PreferredSchedulingTerm] | None = Field(
        None, max_length=MAX_EXPRESSIONS, description="Nodes the scheduler favours, by weight.")


class LabelSelectorRequirement(ApiModel):
    """One condition on a pod's (or a namespace's) labels."""
    model_config = ConfigDict(json_schema_extra=_requirement_rules(with_numbers=False))
    key: str = Field(min_length=1, max_length=MAX_LABEL_KEY, pattern=LABEL_KEY_PATTERN, description="The label key.")
    operator: str = Field(pattern=r"^(In|NotIn|Exists|DoesNotExist)$", description=(
        "In, NotIn, Exists or DoesNotExist."))
    values: list[str] | None = Field(None, max_length=MAX_VALUES, description=(
        "The values for In and NotIn; none for Exists and DoesNotExist."),
        json_schema_extra={"items": {"type": "string", "maxLength": 63, "pattern": LABEL_VALUE_PATTERN}})

    @model_validator(mode="after")
    def _consistent(self) -> "LabelSelectorRequirement":
        _check_requirement(self.operator, self.values)
        return self


class LabelSelector(ApiModel):
    """Labels that must all match: exact pairs and conditions."""
    match_labels: dict[str, LabelValue] | None = Field(
        None, max_length=MAX_MAP_ENTRIES, description="Labels that must have exactly these values.")
    match_expressions: list[LabelSelectorRequirement] | None = Field(None, max_length=MAX_EXPRESSIONS, description=(
        "Conditions that must all hold."))

    @field_validator("match_labels")
    @classmethod
    def _keys(cls, labels: dict[str, str] | None) -> dict[str, str] | None:
        return _check_label_keys(labels, "matchLabels")


class PodAffinityTerm(ApiModel):
    """Pods (by labels, in namespaces) whose topology domain a sandbox pod must share, or avoid."""
    label_selector: LabelSelector | None = Field(None, description="The pods, by their labels.")
    namespaces: list[str] | None = Field(None, max_length=MAX_EXPRESSIONS, description=(
        "The namespaces those pods are in; unset with no namespaceSelector: the sandbox's own."),
        json_schema_extra={"items": {"type": "string", "maxLength": 63}})
    namespace_selector: LabelSelector | None = Field(None, description="The namespaces, by their labels.")
    topology_key: str = Field(min_length=1, max_length=MAX_LABEL_KEY, pattern=LABEL_KEY_PATTERN, description=(
        "The node label whose value is the domain shared or avoided, e.g. kubernetes.io/hostname."))
    match_label_keys: list[str] | None = Field(None, max_length=MAX_EXPRESSIONS, description=(
        "Label keys whose values, taken from the sandbox pod, are added to labelSelector as In."),
        json_schema_extra=_LABEL_KEY_ITEMS)
    mismatch_label_keys: list[str] | None = Field(None, max_length=MAX_EXPRESSIONS, description=(
        "Label keys whose values, taken from the sandbox pod, are added to labelSelector as NotIn."),
        json_schema_extra=_LABEL_KEY_ITEMS)


class WeightedPodAffinityTerm(ApiModel):
    """A pod affinity term the scheduler favours by its weight."""
    weight: int = Field(ge=1, le=100, description="1 to 100: how much a node meeting the term is favoured.")
    pod_affinity_term: PodAffinityTerm = Field(description="The term.")


class PodAffinity(ApiModel):
    """Pods the sandbox pods must (required) or should (preferred) run beside, or away from (podAntiAffinity)."""
    required_during_scheduling_ignored_during_execution: list[PodAffinityTerm] | None = Field(
        None, max_length=MAX_TERMS, description="Terms that must all hold.")
    preferred_during_scheduling_ignored_during_execution: list[WeightedPodAffinityTerm] | None = Field(
        None, max_length=MAX_EXPRESSIONS, description="Terms the scheduler favours, by weight.")


class Affinity(ApiModel):
    """A pod's spec.affinity, as Kubernetes has it (core/v1 Affinity)."""
    node_affinity: NodeAffinity | None = Field(None, description="Which nodes, by their labels.")
    pod_affinity: PodAffinity | None = Field(None, description="Beside which pods.")
    pod_anti_affinity: PodAffinity | None = Field(None, description="Away from which pods.")


SCHEDULING_FIELDS = ("node_selector", "tolerations", "affinity", "priority_class_name", "image_pull_secrets")


class Scheduling(ApiModel):
    """Where the sandbox pods run and what they pull with: the five pod fields the platform chooses (a run cannot
    set them). Each field set here replaces the chart's default for that field (sandboxScheduling values), whole;
    a field left unset takes the default; an empty one ([], {}, "") sets none. Nothing here can change a sandbox's
    hardening: the pod's runtime class, security contexts, token and host namespaces stay the operator's."""
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        _cel("!has(self.priorityClassName) || !self.priorityClassName.startsWith('system-')",
             "priorityClassName names a system PriorityClass, for the cluster's own components: name one of your "
             "own, or leave it empty", ".priorityClassName")]})
    node_selector: dict[str, LabelValue] | None = Field(None, max_length=MAX_MAP_ENTRIES, description=(
        "Node labels a node must have to take a sandbox pod, e.g. {sandbox.example.com/pool: sandboxes}."))
    tolerations: list[Toleration] | None = Field(None, max_length=MAX_TOLERATIONS, description=(
        "Taints the sandbox pods tolerate, e.g. the NoSchedule taint that keeps other pods off dedicated "
        "sandbox nodes."))
    affinity: Affinity | None = Field(None, description=(
        "Node affinity, pod affinity and anti-affinity of the sandbox pods (a pod's spec.affinity)."))
    priority_class_name: str | None = Field(None, max_length=253, pattern=_or_empty(SUBDOMAIN_PATTERN),
                                            description=(
        "The PriorityClass of the sandbox pods (it decides who is preempted when nodes are full); empty: the "
        "cluster's default. Never a system- class: a sandbox is not critical to the cluster."))
    image_pull_secrets: list[str] | None = Field(None, max_length=MAX_PULL_SECRETS, description=(
        "Names of Secrets in the run's namespace to pull the runtimes' images with, e.g. [registry-mirror]. "
        "The kubelet uses them; the program never sees them."),
        json_schema_extra={"items": {"type": "string", "minLength": 1, "maxLength": 253,
                                     "pattern": SUBDOMAIN_PATTERN}})

    @field_validator("node_selector")
    @classmethod
    def _node_selector_keys(cls, labels: dict[str, str] | None) -> dict[str, str] | None:
        return _check_label_keys(labels, "nodeSelector")

    @field_validator("priority_class_name")
    @classmethod
    def _not_system(cls, name: str | None) -> str | None:
        if name and name.startswith("system-"):
            raise ValueError(f"{name} is a system PriorityClass, for the cluster's own components: name one of "
                             "your own, or leave it empty")
        return name

    @field_validator("image_pull_secrets")
    @classmethod
    def _secret_names(cls, names: list[str] | None) -> list[str] | None:
        for name in names or ():
            if not (0 < len(name) <= 253 and re.match(SUBDOMAIN_PATTERN, name)):
                raise ValueError(f"{name!r} is not a Secret name (lowercase letters, digits, '-' and '.')")
        return names


def effective_scheduling(policy: Scheduling | None, defaults: Scheduling) -> Scheduling:
    """The policy's fields where it sets them, the chart's defaults elsewhere: per field, never merged within one
    (a policy's tolerations replace the chart's; an empty list sets none)."""
    if policy is None:
        return defaults
    return defaults.model_copy(update={name: getattr(policy, name) for name in SCHEDULING_FIELDS
                                       if getattr(policy, name) is not None})
