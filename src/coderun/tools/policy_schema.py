"""run_code's schema as the namespace's policy shapes it: the languages it offers (an enum) and the default and
maximum of the timeout, memory and CPU, so a model asks for what the policy will accept.
Pure: the caller reads the policy (client.runtimes()) and falls back to the static schema when it cannot."""
from __future__ import annotations

import copy
from typing import Any

from ..api.text import one_line
from ..client.runtimes import RuntimeInfo

DEFAULT_LANGUAGE = "python"


# run_code's limit properties and the policy's names for them.
LIMITS = {"timeout": "timeoutSeconds", "memory": "memory", "cpu": "cpu"}
_STATIC_DEFAULT = " Default from the policy"  # how RunRequest's limit descriptions end


def policy_input_schema(base: dict[str, Any], runtimes: list[RuntimeInfo]) -> dict[str, Any]:
    """`base` (input_schema(RunRequest)) with the policy's languages, and its default and maximum of each limit."""
    schema = copy.deepcopy(base)
    if not runtimes:
        return schema
    properties = schema["properties"]
    languages = [r.language for r in runtimes]
    properties["language"]["enum"] = languages
    properties["language"]["default"] = DEFAULT_LANGUAGE if DEFAULT_LANGUAGE in languages else languages[0]
    policy = runtimes[0]  # defaults and maximums are the policy's, the same for every language
    for name, key in LIMITS.items():
        prop, default, maximum = properties[name], policy.default_limits.get(key), policy.maximum_limits.get(key)
        if isinstance(maximum, int):  # never above the static schema's maximum, the API server's own bound
            maximum = prop["maximum"] = min(maximum, prop.get("maximum", maximum))
        if default is not None:
            prop["default"] = default
        what = prop["description"].split(_STATIC_DEFAULT)[0].rstrip(".")
        prop["description"] = f"{what}: default {default}, at most {maximum} (policy {policy.policy})."
    return schema


def policy_description(base: str, runtimes: list[RuntimeInfo]) -> str:
    """The tool's description plus one sentence on what this policy offers."""
    if not runtimes:
        return base + " The namespace's policy offers no language: runs will be refused."
    policy = runtimes[0]
    network = "egress to " + ", ".join(policy.egress) if policy.egress else "no network"
    return one_line(f"{base} Policy {policy.policy}: languages {', '.join(r.language for r in runtimes)}; "
                    f"{network}.")


def fallback_description(base: str, why: str) -> str:
    """The static schema's description when the policy could not be read: say so, and that limits may differ."""
    return one_line(f"{base} (The namespace's policy could not be read: {why}. The limits shown are coderun's "
                    f"built-in ones; the policy may differ.)")
