"""One retry budget for a chain, with foreign peers on either side of our hop.

A grpcio client whose service config retries UNAVAILABLE three times calls our
relay; the relay calls a grpcio server that fails every attempt, through a
resilience layer with the same policy. With the chain budget (the default) the
relay, having spent its three attempts, answers `grpc-retry-pushback-ms: -1`,
and grpcio — which honours gRPC's pushback (A6) — does not retry: the failing
server sees 3 attempts per call, not 3 × 3. With `--per_hop_retries` the
relay says nothing and grpcio retries it: 9.
"""

import collections
import json
import os
import queue
import subprocess
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


# grpc-go's own retries (A6, GRPC_GO_RETRY=on in grpc-go 1.33) through our
# relay, with three replicas of the downstream behind it: the relay balances
# over them (`Balanced`), and its retries go to another replica than the one
# that failed. Whole outage: the downstream sees the relay's three attempts
# per root call, grpc-go honouring the pushback; one broken replica of three:
# no root call is lost.

GO_ROOT_CALLS = 20


def replica(i, broken):
    name = f"grpcio replica {i}" + (" (broken)" if broken else "")
    argv = [sys.executable, os.path.join(CONFORMANCE, "python", "flaky.py")]
    return Process(name, argv + (["--broken"] if broken else []))


def replicated_relay(replicas, *extra):
    argv = [bin_path("interop-relay"), "--port", "0"]
    for r in replicas:
        argv += ["--downstream", r.addr]
    argv += ["--service_config", config("conformance.relay.Downstream"), *extra]
    return Process("relay over replicas " + " ".join(extra), argv)


def go_retry_root(relay_process, tag):
    # Built by scripts/conformance from conformance/go against Debian's grpc-go.
    out = subprocess.run(
        [bin_path("go-retry-root"), "-addr", relay_process.addr, "-calls", str(GO_ROOT_CALLS), "-tag", tag],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "GRPC_GO_RETRY": "on"},
    )
    assert out.returncode == 0, f"go-retry-root failed:\n{out.stdout}{out.stderr}"
    return json.loads(out.stdout.strip().splitlines()[-1])


def attempts(replicas, prefix, quiet=0.5):
    """Per replica, the downstream attempts of the calls tagged `prefix-N`,
    until none came for `quiet` s."""
    seen = []
    for r in replicas:
        found = [e for e in r.backlog if e.get("event") == "attempt" and e.get("tag", "").startswith(prefix)]
        r.backlog = [e for e in r.backlog if e not in found]
        while True:
            try:
                event = r.events.get(timeout=quiet)
            except queue.Empty:
                break
            if event.get("event") == "attempt" and event.get("tag", "").startswith(prefix):
                found.append(event)
            else:
                r.backlog.append(event)
        seen.append(found)
    return seen


@pytest.fixture
def three_replicas(request):
    broken = request.param
    started = [replica(i, i < broken) for i in range(3)]
    yield started
    for r in started:
        r.stop()


@pytest.mark.parametrize("three_replicas", [3], indirect=True)
def test_grpc_go_retrying_through_our_relay_over_a_whole_outage_sends_max_attempts(three_replicas):
    relay_process = replicated_relay(three_replicas)
    try:
        tag = f"go-outage-{uuid.uuid4().hex[:8]}"
        result = go_retry_root(relay_process, tag)
    finally:
        relay_process.stop()
    seen = attempts(three_replicas, tag + "-")
    per_call = collections.Counter(e["tag"] for found in seen for e in found)
    total = sum(per_call.values())
    report(
        figure="grpc-go retries → ours → 3 replicas, all down",
        client=result["client"],
        root_calls=result["calls"],
        attempts_at_downstream_per_root=total / result["calls"],
        first_call=per_call[f"{tag}-0"],
        per_replica=[len(found) for found in seen],
    )
    assert result["ok"] == 0 and result["codes"] == {"Unavailable": GO_ROOT_CALLS}, result
    assert per_call[f"{tag}-0"] == 3, f"the first call too: maxAttempts, not its square: {per_call}"
    assert total == 3 * GO_ROOT_CALLS, f"3.00 attempts per root call: {total} for {GO_ROOT_CALLS}"


@pytest.mark.parametrize("three_replicas", [3], indirect=True)
def test_without_the_budget_grpc_go_retries_our_retries_over_replicas(three_replicas):
    # The control: told nothing, grpc-go retries the relay's spent retries.
    relay_process = replicated_relay(three_replicas, "--per_hop_retries")
    try:
        tag = f"go-per-hop-{uuid.uuid4().hex[:8]}"
        result = go_retry_root(relay_process, tag)
    finally:
        relay_process.stop()
    seen = attempts(three_replicas, tag + "-")
    total = sum(len(found) for found in seen)
    report(figure="grpc-go retries → per-hop retries → 3 replicas, all down", attempts_at_downstream_per_root=total / result["calls"])
    assert total == 9 * GO_ROOT_CALLS, f"3 grpc-go attempts × 3 of ours: {total} for {GO_ROOT_CALLS}"


@pytest.mark.parametrize("three_replicas", [1], indirect=True)
def test_grpc_go_retrying_through_our_relay_loses_no_call_behind_one_broken_replica(three_replicas):
    relay_process = replicated_relay(three_replicas)
    try:
        tag = f"go-one-broken-{uuid.uuid4().hex[:8]}"
        result = go_retry_root(relay_process, tag)
    finally:
        relay_process.stop()
    seen = attempts(three_replicas, tag + "-")
    total = sum(len(found) for found in seen)
    report(
        figure="grpc-go retries → ours → 3 replicas, one broken",
        client=result["client"],
        root_calls=result["calls"],
        root_ok=result["ok"],
        attempts_at_downstream_per_root=total / result["calls"],
        per_replica=[len(found) for found in seen],
    )
    assert result["ok"] == GO_ROOT_CALLS, f"no call lost behind one broken replica: {result}"
    assert total <= 2 * GO_ROOT_CALLS, f"a retry goes to a healthy replica at once: {total}"
