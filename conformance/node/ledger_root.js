// A grpc-js root over our relay: CALLS calls of conformance.relay.Relay/Forward,
// one at a time, each with a deadline TIMEOUT_MS ahead, to a downstream that
// works 5 s. Prints one JSON line: how many failed DEADLINE_EXCEEDED and how
// many of those carried the ledger (a `grpc-status-details-bin` holding the
// ledger's DebugInfo, and ` [ledger] ` in the message), the relay's budget as
// each ledger gave it, and one message whole.
// Usage: node ledger_root.js HOST:PORT CALLS TIMEOUT_MS
'use strict';

const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTO_DIR = path.join(__dirname, '..', '..', 'crates', 'interop', 'proto');
const DETAIL = 'tonic-deadline ledger/1';
const definition = protoLoader.loadSync(path.join(PROTO_DIR, 'relay.proto'), {
  keepCase: true,
  longs: String,
  defaults: true,
});
const relay = grpc.loadPackageDefinition(definition).conformance.relay;
const [addr, calls, timeoutMs] = process.argv.slice(2);
const client = new relay.Relay(addr, grpc.credentials.createInsecure());

function forward(request, deadlineMs) {
  return new Promise((resolve) => {
    client.Forward(request, { deadline: Date.now() + deadlineMs }, (err, reply) =>
      resolve({ err, reply }),
    );
  });
}

async function main() {
  const warm = await forward({ tag: 'warm-up' }, 5000);
  if (warm.err) {
    throw new Error(`warm-up failed: ${warm.err.code} ${warm.err.details}`);
  }
  const result = {
    client: `grpc-js ${require('@grpc/grpc-js/package.json').version}`,
    calls: 0,
    deadline_exceeded: 0,
    carried: 0,
    budgets_ms: [],
    codes: {},
    example: null,
  };
  for (let i = 0; i < Number(calls); i++) {
    const { err } = await forward({ work_ms: 5000, tag: `ledger-root-${i}` }, Number(timeoutMs));
    result.calls += 1;
    const code = err ? grpc.status[err.code] : 'OK';
    result.codes[code] = (result.codes[code] || 0) + 1;
    if (!err || err.code !== grpc.status.DEADLINE_EXCEEDED) {
      continue;
    }
    result.deadline_exceeded += 1;
    const details = err.metadata.get('grpc-status-details-bin');
    const inDetails = details.some((d) => Buffer.from(d).includes(DETAIL));
    const budget = /\[ledger\] ([\d.]+) ms budget/.exec(err.details);
    if (inDetails && budget) {
      result.carried += 1;
      result.budgets_ms.push(Number(budget[1]));
      result.example = result.example || err.details;
    }
  }
  client.close();
  process.stdout.write(JSON.stringify(result) + '\n');
}

main().catch((e) => {
  process.stderr.write(`${e.stack}\n`);
  process.exit(1);
});
