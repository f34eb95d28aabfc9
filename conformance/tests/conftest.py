"""Processes for the mixed-language tests: our relay and interop server (Rust),
the grpcio and grpc-js peers. Every peer must be present: a missing one fails
the test with the command that installs it, never skips it.

Environment (set by scripts/conformance):
  INTEROP_BIN_DIR     directory holding interop-relay and interop-server
  CONFORMANCE_REPORT  file to append measured figures to (JSON lines)
"""

import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
CONFORMANCE = os.path.dirname(HERE)
REPO = os.path.dirname(CONFORMANCE)
sys.path.insert(0, os.path.join(CONFORMANCE, "python"))

INSTALL_HINT = "run scripts/conformance, which installs every peer"


def require(condition, what):
    if not condition:
        pytest.fail(f"{what} is missing: {INSTALL_HINT}", pytrace=False)


def bin_path(name):
    bin_dir = os.environ.get("INTEROP_BIN_DIR", os.path.join(REPO, "target", "debug"))
    path = os.path.join(bin_dir, name)
    require(os.access(path, os.X_OK), f"{path} (cargo build -p interop)")
    return path


class Process:
    """A child process whose first stdout line is `listening on ADDR` and whose
    later lines are JSON events."""

    def __init__(self, name, argv):
        self.name = name
        self.events = queue.Queue()
        self.backlog = []
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            cwd=REPO,
        )
        first = queue.Queue()
        threading.Thread(target=self._read, args=(first,), daemon=True).start()
        try:
            line = first.get(timeout=30)
        except queue.Empty:
            self.stop()
            pytest.fail(f"{name} did not start listening within 30 s", pytrace=False)
        if not line.startswith("listening on "):
            self.stop()
            pytest.fail(f"{name} did not start: {line!r}", pytrace=False)
        self.addr = line.split("listening on ", 1)[1].strip()

    def _read(self, first):
        for i, line in enumerate(self.proc.stdout):
            if i == 0:
                first.put(line)
                continue
            try:
                event = json.loads(line)
            except ValueError:
                continue
            # grpc-js prints its clock as a string (a BigInt).
            if "t_ns" in event:
                event["t_ns"] = int(event["t_ns"])
            self.events.put(event)
        first.put("exited")

    def wait_event(self, kind, tag, timeout=10.0):
        """The first event of `kind` for `tag`, keeping the others."""
        for i, event in enumerate(self.backlog):
            if event.get("event") == kind and event.get("tag") == tag:
                return self.backlog.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                seen = [e.get("event") for e in self.backlog if e.get("tag") == tag]
                pytest.fail(
                    f"{self.name}: no {kind!r} event for {tag} within {timeout} s (its events: {seen})",
                    pytrace=False,
                )
            try:
                event = self.events.get(timeout=left)
            except queue.Empty:
                continue
            if event.get("event") == kind and event.get("tag") == tag:
                return event
            self.backlog.append(event)

    def events_until_quiet(self, kind, tag, quiet=0.5, timeout=10.0):
        """Every event of `kind` for `tag` until none came for `quiet` s."""
        found = [e for e in self.backlog if e.get("event") == kind and e.get("tag") == tag]
        self.backlog = [e for e in self.backlog if e not in found]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                event = self.events.get(timeout=quiet)
            except queue.Empty:
                return found
            if event.get("event") == kind and event.get("tag") == tag:
                found.append(event)
            else:
                self.backlog.append(event)
        pytest.fail(f"{self.name}: {kind!r} events for {tag} did not stop within {timeout} s", pytrace=False)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


@pytest.fixture(scope="session")
def grpcio_peer():
    try:
        import grpc  # noqa: F401
        import grpc_tools  # noqa: F401
    except ImportError:
        require(False, "grpcio / grpcio-tools (pip install -r conformance/requirements.txt)")
    peer = Process("grpcio peer", [sys.executable, os.path.join(CONFORMANCE, "python", "peer.py")])
    yield peer
    peer.stop()


@pytest.fixture(scope="session")
def grpcjs_peer():
    node = shutil.which("node")
    require(node is not None, "node")
    require(
        os.path.isdir(os.path.join(CONFORMANCE, "node_modules", "@grpc", "grpc-js")),
        "@grpc/grpc-js (npm ci in conformance/)",
    )
    peer = Process("grpc-js peer", [node, os.path.join(CONFORMANCE, "node", "peer.js")])
    yield peer
    peer.stop()


def _relay(peer):
    return Process(f"relay to {peer.name}", [bin_path("interop-relay"), "--port", "0", "--downstream", peer.addr])


@pytest.fixture(scope="session")
def relay_to_grpcio(grpcio_peer):
    relay = _relay(grpcio_peer)
    yield relay
    relay.stop()


@pytest.fixture(scope="session")
def relay_to_grpcjs(grpcjs_peer):
    relay = _relay(grpcjs_peer)
    yield relay
    relay.stop()


@pytest.fixture(params=["grpcio", "grpc-js"])
def chain(request):
    """(relay, downstream peer) for each foreign downstream."""
    if request.param == "grpcio":
        return request.getfixturevalue("relay_to_grpcio"), request.getfixturevalue("grpcio_peer")
    return request.getfixturevalue("relay_to_grpcjs"), request.getfixturevalue("grpcjs_peer")


@pytest.fixture(scope="session")
def interop_server():
    server = Process("interop-server", [bin_path("interop-server"), "--port", "0"])
    yield server
    server.stop()


@pytest.fixture(scope="session")
def protos():
    import protos as loader

    return loader.load()


def report(**figure):
    """Appends one measured figure to $CONFORMANCE_REPORT."""
    path = os.environ.get("CONFORMANCE_REPORT")
    line = json.dumps(figure)
    print(line)
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(line + "\n")
