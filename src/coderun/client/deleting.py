"""Delete a run; one already gone is not an error unless the caller says so."""
from __future__ import annotations

from .errors import CodeRunError
from .steps import Delete, Plan


def delete_plan(name: str, *, missing_ok: bool) -> Plan[bool]:
    """True when deleted, False when it was already gone (RunNotFound instead unless `missing_ok`)."""
    try:
        yield Delete(name)
    except CodeRunError as e:
        if e.status == 404 and missing_ok:
            return False
        raise
    return True
