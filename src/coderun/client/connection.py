"""Where the SDK's API client comes from: in-cluster service account, else a kubeconfig. Never touches the
kubernetes package's global default configuration, so an SDK client can live beside other code."""
from __future__ import annotations

import os
from pathlib import Path

from kubernetes import client, config
from kubernetes.config.config_exception import ConfigException

from .errors import CodeRunError

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def connect(kubeconfig: str | None = None, context: str | None = None) -> tuple[client.ApiClient, str]:
    """(API client, default namespace). In a pod (KUBERNETES_SERVICE_HOST set) without an explicit kubeconfig
    the service account is used and its namespace is the default; otherwise the kubeconfig (KUBECONFIG or
    ~/.kube/config) and its current context's namespace."""
    if kubeconfig is None and context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        configuration = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=configuration)
        except ConfigException as e:
            raise CodeRunError(f"in-cluster configuration failed: {e}") from e
        namespace = SERVICE_ACCOUNT_NAMESPACE.read_text().strip() if SERVICE_ACCOUNT_NAMESPACE.exists() else "default"
        return client.ApiClient(configuration), namespace
    try:
        api_client = config.new_client_from_config(config_file=kubeconfig, context=context)
        contexts, active = config.list_kube_config_contexts(config_file=kubeconfig)
    except (ConfigException, OSError) as e:
        raise CodeRunError(f"no usable Kubernetes configuration ({e}); set KUBECONFIG or pass kubeconfig=, "
                           f"or run inside a pod with a service account") from e
    chosen = next((c for c in contexts if c["name"] == context), active) if context else active
    return api_client, (chosen.get("context") or {}).get("namespace") or "default"
