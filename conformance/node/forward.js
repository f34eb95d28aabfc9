// Calls conformance.relay.Relay/Forward with a deadline and prints the reply
// as JSON: it shows the `grpc-timeout` grpc-js wrote.
// Usage: node forward.js HOST:PORT DEADLINE_MS
'use strict';

const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTO_DIR = path.join(__dirname, '..', '..', 'crates', 'interop', 'proto');
const definition = protoLoader.loadSync(path.join(PROTO_DIR, 'relay.proto'), {
  keepCase: true,
  longs: String,
  defaults: true,
});
const relay = grpc.loadPackageDefinition(definition).conformance.relay;
const [addr, deadlineMs] = process.argv.slice(2);
const client = new relay.Relay(addr, grpc.credentials.createInsecure());
client.Forward(
  { tag: 'grpc-js' },
  { deadline: Date.now() + Number(deadlineMs) },
  (err, reply) => {
    if (err) {
      process.stderr.write(`${err.code} ${err.details}\n`);
      process.exit(1);
    }
    process.stdout.write(JSON.stringify(reply) + '\n');
    client.close();
  },
);
