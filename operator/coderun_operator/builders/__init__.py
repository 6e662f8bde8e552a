"""Pure builders: a CodeRun and its policy decision in, Kubernetes object dicts out. No API calls here."""
from .names import (ANNOTATION_NONCE_SHA256, ANNOTATION_POOL_KEY, LABEL_MANAGED_BY, LABEL_POOL, LABEL_POOL_LANGUAGE,
                    LABEL_RUN, LABEL_RUN_UID, LABEL_SANDBOX, child_name, run_labels)
from .objects import (
    INPUT_MOUNT,
    RUNNER_COMMAND,
    TMP_MOUNT,
    build_artifacts_configmap,
    build_audit_record_configmap,
    build_input_configmap,
    build_namespace_network_policy,
    build_network_log_configmap,
    build_network_policy,
    build_pod,
    build_pool_network_policy,
    build_pool_pod,
    claim_patch,
    code_hash,
    owner_reference,
    warm_input,
)

__all__ = [
    "ANNOTATION_NONCE_SHA256", "ANNOTATION_POOL_KEY", "INPUT_MOUNT", "LABEL_MANAGED_BY", "LABEL_POOL",
    "LABEL_POOL_LANGUAGE", "LABEL_RUN", "LABEL_RUN_UID", "LABEL_SANDBOX", "RUNNER_COMMAND", "TMP_MOUNT",
    "build_artifacts_configmap", "build_audit_record_configmap", "build_input_configmap", "build_namespace_network_policy",
    "build_network_log_configmap", "build_network_policy",
    "build_pod", "build_pool_network_policy", "build_pool_pod", "child_name", "claim_patch", "code_hash", "owner_reference", "run_labels",
    "warm_input",
]
