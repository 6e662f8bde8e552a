"""Where the SDK's API client comes from: in-cluster service account, else a kubeconfig. Never touches the
kubernetes package's global default configuration, so an SDK client can live beside other code."""
from __future__ import annotations

import asyncio
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import yaml
from kubernetes import client, config
from kubernetes.config.config_exception import ConfigException

from .errors import CodeRunError

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def connect(kubeconfig: str | None = None, context: str | None = None) -> tuple[client.ApiClient, str]:
    """(API client, default namespace). In a pod (KUBERNETES_SERVICE_HOST set) without an explicit kubeconfig
    the service account is used and its namespace is the default; otherwise the kubeconfig (KUBECONFIG or
    ~/.kube/config) and its current context's namespace."""
    namespace = default_namespace(kubeconfig, context)
    if in_cluster(kubeconfig, context):
        configuration = client.Configuration()
        with _configuration_failures(in_pod=True):
            config.load_incluster_config(client_configuration=configuration)
        return client.ApiClient(configuration), namespace
    with _configuration_failures():
        return config.new_client_from_config(config_file=kubeconfig, context=context), namespace


async def connect_async(kubeconfig: str | None, context: str | None, max_connections: int):
    """The same choice as `connect`, for kubernetes.aio: an aiohttp ApiClient (its session opens at the first
    request) allowing `max_connections` open connections, one per watch in flight."""
    from kubernetes.aio import client as aio_client, config as aio_config  # aiohttp is loaded by the async SDK only

    configuration = aio_client.Configuration()
    with _configuration_failures(aio_config.ConfigException, in_pod=in_cluster(kubeconfig, context)):
        if in_cluster(kubeconfig, context):
            aio_config.load_incluster_config(client_configuration=configuration)
        else:
            loader = await aio_config.load_kube_config(config_file=kubeconfig, context=context,
                                                       client_configuration=configuration, persist_config=False)
            configuration.refresh_api_key_hook = _token_refresher(loader)
    configuration.connection_pool_maxsize = max_connections
    # Proxies come from the kubeconfig (proxy-url), as for the sync client; aiohttp's trust_env would also read
    # ~/.netrc and the proxy variables in a worker thread on every request: two thread hops per call.
    configuration.client_session_kwargs = {"trust_env": False}
    return aio_client.ApiClient(configuration)


def _token_refresher(loader):
    """kubernetes.aio leaves refreshing to its caller (the sync loader does it itself): a token from an exec
    plugin (EKS, GKE's plugin) or an auth provider is loaded again once it expired, before the next request; one
    refresh at a time, however many requests are waiting."""
    from kubernetes.aio.config.kube_config import _is_expired

    lock: asyncio.Lock | None = None

    def expired() -> bool:
        expiry = getattr(loader, "exec_plugin_expiry", None) or getattr(loader, "expiry", None)
        return expiry is not None and _is_expired(expiry)

    async def refresh(configuration) -> None:
        nonlocal lock
        if not expired():
            return
        lock = lock or asyncio.Lock()
        async with lock:
            if expired():
                await loader._load_authentication()  # what the sync loader's own refresh calls
                if getattr(loader, "token", None):
                    configuration.api_key["BearerToken"] = loader.token
    return refresh


def in_cluster(kubeconfig: str | None, context: str | None) -> bool:
    return kubeconfig is None and context is None and bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def default_namespace(kubeconfig: str | None = None, context: str | None = None) -> str:
    """The service account's namespace in a pod, else the kubeconfig context's; CodeRunError without either."""
    if in_cluster(kubeconfig, context):
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() if SERVICE_ACCOUNT_NAMESPACE.exists() else "default"
    with _configuration_failures():
        contexts, active = config.list_kube_config_contexts(config_file=kubeconfig)
    chosen = next((c for c in contexts if c["name"] == context), active) if context else active
    return (chosen.get("context") or {}).get("namespace") or "default"


@contextmanager
def _configuration_failures(*more: type[Exception], in_pod: bool = False) -> Iterator[None]:
    """A configuration that cannot be loaded as the SDK's error; `more`: kubernetes.aio's ConfigException."""
    try:
        yield
    # A file that is not a kubeconfig at all fails inside the loader as YAML, type or key errors.
    except (ConfigException, OSError, yaml.YAMLError, TypeError, KeyError, AttributeError, *more) as e:
        if in_pod:
            raise CodeRunError(f"in-cluster configuration failed: {e}") from e
        raise CodeRunError(f"no usable Kubernetes configuration ({e}); set KUBECONFIG or pass kubeconfig=, "
                           f"or run inside a pod with a service account") from e
