"""What every API model shares: the wire's camelCase and the CEL rule's shape. Apart from models.py so that the
models of one part (scheduling.py) can be used by both kinds' modules without an import cycle."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel
from pydantic.config import JsonDict


def _cel(rule: str, message: str, field_path: str | None = None) -> JsonDict:
    validation: JsonDict = {"rule": rule, "message": message}
    if field_path:
        validation["fieldPath"] = field_path
    return validation


class ApiModel(BaseModel):
    """camelCase on the wire, snake_case in Python; unknown fields are an error, not silently dropped."""
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")
