"""Generated Python stubs for the crate's own protos (crates/interop/proto).

The stubs are generated with grpcio-tools into python/_gen (git-ignored) the
first time they are needed, and again whenever a proto is newer.
"""

import importlib
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_DIR = os.path.normpath(os.path.join(HERE, "..", "..", "crates", "interop", "proto"))
GEN_DIR = os.path.join(HERE, "_gen")
PROTOS = ["grpc_testing.proto", "relay.proto"]


def _stale():
    for proto in PROTOS:
        src = os.path.join(PROTO_DIR, proto)
        out = os.path.join(GEN_DIR, proto.replace(".proto", "_pb2_grpc.py"))
        if not os.path.exists(out) or os.path.getmtime(out) < os.path.getmtime(src):
            return True
    return False


def _generate():
    from grpc_tools import protoc  # from grpcio-tools

    os.makedirs(GEN_DIR, exist_ok=True)
    args = ["protoc", f"-I{PROTO_DIR}", f"--python_out={GEN_DIR}", f"--grpc_python_out={GEN_DIR}"]
    if protoc.main(args + [os.path.join(PROTO_DIR, p) for p in PROTOS]) != 0:
        raise RuntimeError(f"grpc_tools.protoc failed on {PROTOS} in {PROTO_DIR}")


def load():
    """Returns (testing_pb2, testing_grpc, relay_pb2, relay_grpc)."""
    if _stale():
        _generate()
    if GEN_DIR not in sys.path:
        sys.path.insert(0, GEN_DIR)
    return tuple(
        importlib.import_module(name)
        for name in ["grpc_testing_pb2", "grpc_testing_pb2_grpc", "relay_pb2", "relay_pb2_grpc"]
    )
