"""A grpcio Downstream that fails the first attempts of each call, for the
retry conformance test.

Serves conformance.relay.Downstream (Work) on 127.0.0.1. The request's tag
is `NAME/FAILURES/PUSHBACK`: the first FAILURES attempts of the call NAME
are answered UNAVAILABLE with the trailing metadata
`grpc-retry-pushback-ms: PUSHBACK` (no header when PUSHBACK is `none`);
later attempts are answered OK. With `--broken` every attempt is answered
UNAVAILABLE (no pushback): a replica whose path is down. The first stdout
line is `listening on ADDR`; then one JSON object per attempt:

  {"event": "attempt", "tag": NAME, "n": 1.., "previous": "..." | null,
   "remaining_us": N | -1, "t_ns": T}

`previous` is the `grpc-previous-rpc-attempts` header as received;
`remaining_us` what grpcio made of the `grpc-timeout` it received (the call's
time_remaining on entry); T is CLOCK_MONOTONIC in nanoseconds.
"""

import argparse
import collections
import json
import sys
import threading
import time
from concurrent import futures

import grpc

sys.path.insert(0, __import__("os").path.dirname(__file__))
import protos  # noqa: E402

_, _, relay_pb2, relay_grpc = protos.load()
IMPLEMENTATION = f"grpcio {grpc.__version__}"
_lock = threading.Lock()
_attempts = collections.Counter()


def emit(**event):
    with _lock:
        print(json.dumps(event), flush=True)


class Flaky(relay_grpc.DownstreamServicer):
    def __init__(self, broken=False):
        self.broken = broken

    def Work(self, request, context):
        entered = time.monotonic_ns()
        left = context.time_remaining()
        remaining_us = -1 if left is None else int(left * 1_000_000)
        name, failures, pushback = request.tag.rsplit("/", 2)
        metadata = dict(context.invocation_metadata())
        with _lock:
            _attempts[name] += 1
            n = _attempts[name]
        emit(
            event="attempt",
            tag=name,
            n=n,
            previous=metadata.get("grpc-previous-rpc-attempts"),
            remaining_us=remaining_us,
            t_ns=entered,
        )
        if self.broken:
            context.abort(grpc.StatusCode.UNAVAILABLE, "this replica is broken")
        if n <= int(failures):
            if pushback != "none":
                context.set_trailing_metadata((("grpc-retry-pushback-ms", pushback),))
            context.abort(grpc.StatusCode.UNAVAILABLE, f"attempt {n} fails on purpose")
        return relay_pb2.WorkReply(remaining_us=remaining_us, implementation=IMPLEMENTATION)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--broken", action="store_true")
    args = parser.parse_args()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    relay_grpc.add_DownstreamServicer_to_server(Flaky(broken=args.broken), server)
    port = server.add_insecure_port(f"127.0.0.1:{args.port}")
    server.start()
    print(f"listening on 127.0.0.1:{port}", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
