"""A grpcio service for the mixed-language chains and the hostile-header table.

Serves conformance.relay.Downstream (Work) and grpc.testing.TestService
(EmptyCall) on 127.0.0.1. The first stdout line is `listening on ADDR`; then
one JSON object per line for each event:

  {"event": "entered",   "tag": ..., "remaining_us": N | -1, "t_ns": T}
  {"event": "cancelled", "tag": ..., "t_ns": T}   # the call ended before the work
  {"event": "completed", "tag": ..., "t_ns": T}

T is CLOCK_MONOTONIC in nanoseconds (time.monotonic_ns), the clock the tests
read too, so times compare across processes on one machine.
"""

import argparse
import json
import sys
import threading
import time
from concurrent import futures

import grpc

sys.path.insert(0, __import__("os").path.dirname(__file__))
import protos  # noqa: E402

testing_pb2, testing_grpc, relay_pb2, relay_grpc = protos.load()
IMPLEMENTATION = f"grpcio {grpc.__version__}"
_lock = threading.Lock()


def emit(**event):
    with _lock:
        print(json.dumps(event), flush=True)


class Downstream(relay_grpc.DownstreamServicer):
    def Work(self, request, context):
        entered = time.monotonic_ns()
        left = context.time_remaining()
        remaining_us = -1 if left is None else int(left * 1_000_000)
        ended = threading.Event()
        state = {"finished": False}

        def on_end():
            now = time.monotonic_ns()
            if not state["finished"]:
                emit(event="cancelled", tag=request.tag, t_ns=now)
            ended.set()

        # The callback goes in before "entered" is told: a test that cancels
        # as soon as it reads "entered" must not find the call unwatched
        # (grpcio runs a callback added after the call ended never, and says
        # so by returning False).
        if not context.add_callback(on_end):
            on_end()
        emit(event="entered", tag=request.tag, remaining_us=remaining_us, t_ns=entered)
        # The work: waits, and stops as soon as the call ends.
        if ended.wait(request.work_ms / 1000):
            return relay_pb2.WorkReply()
        state["finished"] = True
        emit(event="completed", tag=request.tag, t_ns=time.monotonic_ns())
        return relay_pb2.WorkReply(remaining_us=remaining_us, implementation=IMPLEMENTATION)


class TestService(testing_grpc.TestServiceServicer):
    def EmptyCall(self, request, context):
        return testing_pb2.Empty()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    relay_grpc.add_DownstreamServicer_to_server(Downstream(), server)
    testing_grpc.add_TestServiceServicer_to_server(TestService(), server)
    port = server.add_insecure_port(f"127.0.0.1:{args.port}")
    server.start()
    print(f"listening on 127.0.0.1:{port}", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
