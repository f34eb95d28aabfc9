"""One retry budget for a chain, with foreign peers on either side of our hop.

A grpcio client whose service config retries UNAVAILABLE three times calls our
relay; the relay calls a grpcio server that fails every attempt, through a
resilience layer with the same policy. With the chain budget (the default) the
relay, having spent its three attempts, answers `grpc-retry-pushback-ms: -1`,
and grpcio — which honours gRPC's pushback (A6) — does not retry: the failing
server sees 3 attempts per call, not 3 × 3. With `--per_hop_retries` the
relay says nothing and grpcio retries it: 9.
"""

import json
import os
import sys
import uuid

import grpc
import pytest

from conftest import CONFORMANCE, Process, bin_path, report

POLICY = {
    "maxAttempts": 3,
    "initialBackoff": "0.01s",
    "maxBackoff": "0.05s",
    "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE"],
}


def config(service):
    return json.dumps({"methodConfig": [{"name": [{"service": service}], "retryPolicy": POLICY}]})


@pytest.fixture(scope="module")
def failing():
    server = Process("grpcio failing server", [sys.executable, os.path.join(CONFORMANCE, "python", "flaky.py")])
    yield server
    server.stop()


def relay(failing, *extra):
    argv = [bin_path("interop-relay"), "--port", "0", "--downstream", failing.addr]
    argv += ["--service_config", config("conformance.relay.Downstream"), *extra]
    return Process("relay with retries " + " ".join(extra), argv)


@pytest.fixture(scope="module")
def chain_budget_relay(failing):
    process = relay(failing)
    yield process
    process.stop()


@pytest.fixture(scope="module")
def per_hop_relay(failing):
    process = relay(failing, "--per_hop_retries")
    yield process
    process.stop()


def call_through(relay_process, protos, name):
    """One call from a retrying grpcio client; the downstream fails it always."""
    _, _, relay_pb2, relay_grpc = protos
    options = [("grpc.enable_retries", 1), ("grpc.service_config", config("conformance.relay.Relay"))]
    with grpc.insecure_channel(relay_process.addr, options=options) as channel:
        grpc.channel_ready_future(channel).result(timeout=10)
        stub = relay_grpc.RelayStub(channel)
        with pytest.raises(grpc.RpcError) as failed:
            stub.Forward(relay_pb2.ForwardRequest(tag=f"{name}/1000/none"), timeout=5.0)
    error = failed.value
    return error.code(), dict(error.trailing_metadata() or ())


def test_a_foreign_caller_does_not_retry_what_our_hop_spent(chain_budget_relay, failing, protos):
    name = f"budget-{uuid.uuid4().hex[:8]}"
    code, trailers = call_through(chain_budget_relay, protos, name)
    seen = failing.events_until_quiet("attempt", name)
    report(figure="chain budget, grpcio → ours → grpcio", attempts_at_failing_server=len(seen), trailers=trailers)
    assert code == grpc.StatusCode.UNAVAILABLE
    assert trailers.get("grpc-retry-pushback-ms") == "-1", f"our hop says its retries are spent: {trailers}"
    assert len(seen) == 3, f"grpcio honours the pushback: the failing server sees maxAttempts, not its square: {len(seen)}"
    assert [a["previous"] for a in seen] == [None, "1", "2"], "the three are our hop's retries of one call"


def test_without_the_budget_the_foreign_caller_retries_our_retries(per_hop_relay, failing, protos):
    # The control: the same grpcio client does retry our hop when it is not
    # told the retries were spent, so the test above can fail.
    name = f"per-hop-{uuid.uuid4().hex[:8]}"
    code, trailers = call_through(per_hop_relay, protos, name)
    seen = failing.events_until_quiet("attempt", name)
    report(figure="per-hop retries, grpcio → ours → grpcio", attempts_at_failing_server=len(seen))
    assert code == grpc.StatusCode.UNAVAILABLE
    assert "grpc-retry-pushback-ms" not in trailers, trailers
    assert len(seen) == 9, f"3 grpcio attempts × 3 of ours: {len(seen)}"
