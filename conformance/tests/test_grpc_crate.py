"""The official Rust gRPC crate's client (grpc 0.9) under grpc-deadline-grpc's
interceptor, against servers we did not write: grpc-go's and gRPC's Ruby
interop servers (the deadline and cancel cases), and a grpcio server that
reports the deadline it was given."""

import json
import os
import socket
import subprocess
import time

import pytest

from conftest import CONFORMANCE, REPO, Process, bin_path, report, require


def run_client(port, *args):
    out = subprocess.run(
        [bin_path("interop-grpc-client"), "--server_port", str(port), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return out


def port_of(addr):
    return int(addr.rsplit(":", 1)[1])


@pytest.fixture(scope="session")
def go_interop_server():
    # Built by scripts/conformance from conformance/go against Debian's grpc-go.
    bin_dir = os.environ.get("INTEROP_BIN_DIR", os.path.join(REPO, "target", "debug"))
    path = os.path.join(bin_dir, "go-interop-server")
    require(
        os.access(path, os.X_OK),
        f"{path} (scripts/conformance builds it from conformance/go with Debian's golang-go "
        "and golang-google-grpc-dev)",
    )
    server = Process("grpc-go interop server", [path])
    yield server
    server.stop()


@pytest.fixture(scope="session")
def ruby_interop_server():
    listed = subprocess.run(["dpkg", "-L", "ruby-grpc"], capture_output=True, text=True)
    server_rb = next((l for l in listed.stdout.splitlines() if l.endswith("/src/ruby/pb/test/server.rb")), None)
    require(server_rb is not None, "gRPC's Ruby interop server (apt-get install ruby-grpc)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        ["ruby", os.path.join(CONFORMANCE, "ruby", "interop_server.rb"), server_rb, f"--port={port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                pytest.fail("gRPC's Ruby interop server did not start listening within 30 s", pytrace=False)
            time.sleep(0.1)
    yield port
    proc.terminate()
    proc.wait(timeout=10)


def test_grpc_crate_cases_against_grpc_go(go_interop_server):
    out = run_client(port_of(go_interop_server.addr))
    assert out.returncode == 0, f"interop-grpc-client failed:\n{out.stdout}{out.stderr}"
    assert "PASS timeout_on_sleeping_server" in out.stdout
    assert "PASS cancel_after_begin" in out.stdout
    # grpc-go was sent the 1 ms deadline, and its handler ended with it.
    entered = go_interop_server.wait_event("entered", "FullDuplexCall")
    assert 0 < entered["remaining_us"] <= 1000, f"grpc-go must be told what is left of 1 ms: {entered}"
    ended = go_interop_server.wait_event("ended", "FullDuplexCall", timeout=5)
    # The cancel: the client answers CANCELLED at once. grpc 0.9 resets a
    # call's stream only after the server's response headers, so grpc-go is
    # not told: the interceptor says so. It holds the call's request stream
    # rather than let the crate end it normally, so grpc-go's call ends when
    # the client's connection closes (the client exits): cancelled, never
    # an empty upload read as complete.
    cancel_end = go_interop_server.wait_event("ended", "StreamingInputCall", timeout=5)
    assert cancel_end["why"] == "cancelled", f"an abandoned upload must never finish: {cancel_end}"
    assert "1 cancels not carried to the server" in out.stdout, out.stdout
    report(
        peer="grpc-go interop server",
        client="grpc crate 0.9 + grpc-deadline-grpc",
        timeout_on_sleeping_server_remaining_us=entered["remaining_us"],
        timeout_on_sleeping_server_server_end=ended["why"],
        cancel_after_begin_server_end=cancel_end["why"],
    )


def test_grpc_crate_cancel_after_begin_never_ends_the_upload_normally_on_the_wire(go_interop_server):
    """cancel_after_begin through the capture proxy: the request stream of
    the cancelled StreamingInputCall never leaves with END_STREAM (grpc 0.9's
    transport would end it so, and grpc-go would answer an empty upload OK)."""
    capture = subprocess.Popen(
        [bin_path("deadline-lab"), "capture", "--upstream", go_interop_server.addr, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        listening = json.loads(capture.stdout.readline())
        out = run_client(port_of(listening["listen"]), "--test_case=cancel_after_begin")
        assert out.returncode == 0, f"interop-grpc-client failed:\n{out.stdout}{out.stderr}"
        assert "PASS cancel_after_begin" in out.stdout
        ended = go_interop_server.wait_event("ended", "StreamingInputCall", timeout=5)
    finally:
        capture.terminate()
        rest, _ = capture.communicate(timeout=10)
    records = [json.loads(line) for line in rest.splitlines() if line.startswith("{")]
    uploads = {
        r["stream"]
        for r in records
        if r["type"] == "HEADERS"
        and r["direction"] == "c→s"
        and r["headers"].get(":path") == "/grpc.testing.TestService/StreamingInputCall"
    }
    assert len(uploads) == 1, f"one StreamingInputCall on the wire: {records}"
    sent = [r for r in records if r["stream"] in uploads and r["direction"] == "c→s"]
    ends = [r for r in sent if "END_STREAM" in r["flags"]]
    assert not ends, f"no END_STREAM on the abandoned upload: {sent}"
    assert ended["why"] == "cancelled", f"grpc-go must never read the upload as complete: {ended}"
    report(
        peer="grpc-go interop server",
        client="grpc crate 0.9 + grpc-deadline-grpc",
        cancel_after_begin_client_frames=[r["type"] for r in sent],
        cancel_after_begin_server_end=ended["why"],
    )


def test_grpc_crate_cases_against_grpc_ruby(ruby_interop_server):
    out = run_client(ruby_interop_server)
    assert out.returncode == 0, f"interop-grpc-client failed:\n{out.stdout}{out.stderr}"
    assert "PASS timeout_on_sleeping_server" in out.stdout
    assert "PASS cancel_after_begin" in out.stdout


def test_grpc_crate_call_gives_grpcio_its_budget(grpcio_peer):
    tag = "grpc-crate-budget"
    out = run_client(port_of(grpcio_peer.addr), "--test_case=downstream_budget", "--budget_ms", "500", "--tag", tag)
    assert out.returncode == 0, f"interop-grpc-client failed:\n{out.stdout}{out.stderr}"
    entered = grpcio_peer.wait_event("entered", tag)
    remaining = entered["remaining_us"]
    assert 300_000 < remaining <= 500_000, f"grpcio must read what is left of 500 ms: {remaining} µs"
    report(peer="grpcio", client="grpc crate 0.9 + grpc-deadline-grpc", budget_ms=500, remaining_us_on_entry=remaining)
