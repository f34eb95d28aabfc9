"""Our own grpc_testing.proto must match gRPC's official interop protos on the
wire: every message, field, number, type and method we declare is declared the
same way in Debian's grpc-proto package (/usr/share/grpc-proto)."""

import os
import tempfile

from google.protobuf import descriptor_pb2

from conftest import REPO, require

OFFICIAL_DIR = "/usr/share/grpc-proto"
OURS_DIR = os.path.join(REPO, "crates", "interop", "proto")


def descriptors(include, proto):
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "set.pb")
        rc = protoc.main(["protoc", f"-I{include}", "--include_imports", f"--descriptor_set_out={out}", proto])
        assert rc == 0, f"protoc failed on {proto}"
        files = descriptor_pb2.FileDescriptorSet()
        with open(out, "rb") as f:
            files.ParseFromString(f.read())
    messages, services = {}, {}
    for file in files.file:
        for message in file.message_type:
            messages[f"{file.package}.{message.name}"] = {
                field.name: (field.number, field.type, field.label, field.type_name) for field in message.field
            }
        for service in file.service:
            services[f"{file.package}.{service.name}"] = {
                m.name: (m.input_type, m.output_type, m.client_streaming, m.server_streaming) for m in service.method
            }
    return messages, services


def test_our_grpc_testing_proto_matches_the_official_wire_contract():
    require(os.path.isfile(os.path.join(OFFICIAL_DIR, "grpc", "testing", "test.proto")), "grpc-proto (apt-get install grpc-proto)")
    official_messages, official_services = descriptors(OFFICIAL_DIR, os.path.join(OFFICIAL_DIR, "grpc", "testing", "test.proto"))
    our_messages, our_services = descriptors(OURS_DIR, os.path.join(OURS_DIR, "grpc_testing.proto"))
    for name, fields in our_messages.items():
        assert name in official_messages, f"{name} is not an official message"
        for field, shape in fields.items():
            assert official_messages[name].get(field) == shape, f"{name}.{field}: ours {shape}, official {official_messages[name].get(field)}"
    for name, methods in our_services.items():
        assert name in official_services, f"{name} is not an official service"
        for method, shape in methods.items():
            assert official_services[name].get(method) == shape, f"{name}/{method}: ours {shape}, official {official_services[name].get(method)}"
