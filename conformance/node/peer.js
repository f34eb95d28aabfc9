// A grpc-js service for the mixed-language chains and the hostile-header table.
//
// Serves conformance.relay.Downstream (Work) and grpc.testing.TestService
// (EmptyCall) on 127.0.0.1. The first stdout line is `listening on ADDR`; then
// one JSON object per line for each event, as the grpcio peer prints them:
//   {"event": "entered",   "tag": ..., "remaining_us": N | -1, "t_ns": T}
//   {"event": "cancelled", "tag": ..., "t_ns": T}
//   {"event": "completed", "tag": ..., "t_ns": T}
// T is CLOCK_MONOTONIC in nanoseconds (process.hrtime), the clock the tests
// read with time.monotonic_ns().
'use strict';

const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTO_DIR = path.join(__dirname, '..', '..', 'crates', 'interop', 'proto');
const IMPLEMENTATION = `grpc-js ${require('@grpc/grpc-js/package.json').version}`;

function load(file) {
  const definition = protoLoader.loadSync(path.join(PROTO_DIR, file), {
    keepCase: true,
    longs: String,
    defaults: true,
    includeDirs: [PROTO_DIR],
  });
  return grpc.loadPackageDefinition(definition);
}

function emit(event) {
  process.stdout.write(JSON.stringify(event) + '\n');
}

function now() {
  return process.hrtime.bigint().toString();
}

function remainingUs(call) {
  const deadline = call.getDeadline();
  const at = deadline instanceof Date ? deadline.getTime() : deadline;
  if (at === undefined || at === Infinity || Number.isNaN(at)) {
    return -1;
  }
  return Math.round((at - Date.now()) * 1000);
}

function work(call, callback) {
  const tag = call.request.tag;
  const remaining = remainingUs(call);
  emit({ event: 'entered', tag, remaining_us: remaining, t_ns: now() });
  let finished = false;
  const timer = setTimeout(() => {
    finished = true;
    emit({ event: 'completed', tag, t_ns: now() });
    callback(null, { remaining_us: String(remaining), implementation: IMPLEMENTATION });
  }, call.request.work_ms);
  call.on('cancelled', () => {
    if (!finished) {
      finished = true;
      clearTimeout(timer);
      emit({ event: 'cancelled', tag, t_ns: now() });
    }
  });
}

function main() {
  const portFlag = process.argv.find((a) => a.startsWith('--port='));
  const port = portFlag ? Number(portFlag.split('=')[1]) : 0;
  const relay = load('relay.proto').conformance.relay;
  const testing = load('grpc_testing.proto').grpc.testing;
  const server = new grpc.Server();
  server.addService(relay.Downstream.service, { Work: work });
  server.addService(testing.TestService.service, {
    EmptyCall: (call, callback) => callback(null, {}),
  });
  server.bindAsync(`127.0.0.1:${port}`, grpc.ServerCredentials.createInsecure(), (err, bound) => {
    if (err) {
      process.stderr.write(`bind failed: ${err}\n`);
      process.exit(1);
    }
    process.stdout.write(`listening on 127.0.0.1:${bound}\n`);
  });
}

main();
