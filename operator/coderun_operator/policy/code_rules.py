"""A policy's static code rules: denied Python imports and calls (checked on the parse tree, so comments and
strings never trigger them and aliases do not hide them) and denied patterns for any language (RE2, per line).

These give a caller a clear, early "no" with the rule and the line; they are not the security boundary (a
determined program can reach a module in ways no static check sees), the sandbox is."""
from __future__ import annotations

import ast
from typing import Iterator

import re2

from coderun.api.coderunpolicy import CodeRules
from coderun.api.reasons import Reason
from coderun.api.policy import Denial
from .redact import compile_pattern

IMPORT_FUNCTIONS = {"__import__", "importlib.import_module"}


def check_code(language: str, code: str, rules: CodeRules | None, policy_name: str,
               compiled_denied: tuple[re2._Regexp, ...] | None = None) -> Denial | None:
    """`compiled_denied`: the loaded policy's denied patterns, compiled (policy/patterns.py); without them (a
    policy built in code) each pattern is compiled here, within the same budget, and not kept."""
    if rules is None:
        return None
    if language == "python" and (rules.denied_python_imports or rules.denied_python_calls):
        denial = _check_python(code, rules, policy_name)
        if denial:
            return denial
    for index, rule in enumerate(rules.denied_patterns or ()):
        if rule.language != language:
            continue
        pattern = compiled_denied[index] if compiled_denied else compile_pattern(rule.pattern)
        for number, line in enumerate(code.split("\n"), start=1):
            if pattern.search(line):
                why = f" ({rule.message})" if rule.message else ""
                return _denied(f"codeRules.deniedPatterns[{index}]", number,
                               f"matches the denied pattern {rule.pattern!r}{why}", policy_name)
    return None


def _denied(rule: str, line: int | None, what: str, policy_name: str) -> Denial:
    where = f"line {line}: " if line else ""
    return Denial(Reason.POLICY_DENIED, rule,
                  f"{where}the code {what}, which policy {policy_name!r} denies ({rule}); change the code or "
                  "ask for a policy that allows it")


def _check_python(code: str, rules: CodeRules, policy_name: str) -> Denial | None:
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None  # it will not run either: the sandbox reports the SyntaxError with its line
    except (RecursionError, MemoryError, ValueError) as e:
        return Denial(Reason.POLICY_DENIED, "codeRules",
                      f"the code could not be checked against the code rules of policy {policy_name!r} "
                      f"({type(e).__name__}: nested too deeply or not parseable); simplify it")
    denied_imports = tuple(rules.denied_python_imports or ())
    denied_calls = set(rules.denied_python_calls or ())
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        for module, line in _imports(node):
            if _under(module, denied_imports):
                return _denied("codeRules.deniedPythonImports", line, f"imports {module!r}", policy_name)
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    aliases[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    aliases[top] = top
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func, aliases)
        if name in IMPORT_FUNCTIONS and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) and _under(node.args[0].value, denied_imports):
            return _denied("codeRules.deniedPythonImports", node.lineno, f"imports {node.args[0].value!r}",
                           policy_name)
        if name in denied_calls:
            return _denied("codeRules.deniedPythonCalls", node.lineno, f"calls {name}", policy_name)
    return None


def _imports(node: ast.AST) -> Iterator[tuple[str, int]]:
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name, node.lineno
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
        yield node.module, node.lineno
        for alias in node.names:
            yield f"{node.module}.{alias.name}", node.lineno


def _under(module: str, denied: tuple[str, ...]) -> bool:
    return any(module == d or module.startswith(d + ".") for d in denied)


def _dotted(func: ast.AST, aliases: dict[str, str]) -> str | None:
    """The dotted name a call goes to, through import aliases: `o.system` after `import os as o` is os.system."""
    parts = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if not isinstance(func, ast.Name):
        return None
    parts.append(aliases.get(func.id, func.id))
    return ".".join(reversed(parts))
