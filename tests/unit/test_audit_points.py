"""gVisor's trace point classes: the committed ones are what protoc makes of the committed .proto files, and the
remote sink's message types each have their class."""
from pathlib import Path

from coderun.audit import wire
from coderun.audit.points import common_pb2, compile as points_compile

POINTS = Path(points_compile.__file__).parent


def test_the_committed_classes_are_what_protoc_compiles_from_the_committed_schema():
    for file_name, source in points_compile.compile_schemas().items():
        assert (POINTS / file_name).read_text() == source, f"run `make audit-protos`: {file_name} differs"


def test_the_schema_is_gvisors_own_with_its_license_and_names():
    for name in points_compile.SCHEMAS:
        text = (POINTS / f"{name}.proto").read_text()
        assert text.startswith("// Copyright 2022 The gVisor Authors.")
        assert "Licensed under the Apache License, Version 2.0" in text
    # The descriptors keep gVisor's file names, so they match the schema runsc was built with.
    assert common_pb2.DESCRIPTOR.name == "pkg/sentry/seccheck/points/common.proto"


def test_every_message_type_but_unknown_has_its_class():
    named = {value for name, value in common_pb2.MessageType.items() if name != "MESSAGE_UNKNOWN"}
    assert named == set(wire.CLASSES)
