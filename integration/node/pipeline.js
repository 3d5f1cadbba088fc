'use strict';
// node-postgres queries issued at once, without awaiting in between, mixing
// lockpool's lease functions with ordinary queries, named and unnamed
// (integration/lease_pipeline_test.go). With PIPELINE=1 the client runs in
// pipeline mode (every query is written before the first reply arrives,
// each with its own Sync); otherwise node-postgres queues them and sends
// the next after the previous ReadyForQuery.
//
// Environment:
//   DATABASE_URL  lockpool (required)
//   LEASE_PREFIX  prefix of the lease names (required)
//   PIPELINE      "1" for pipeline mode
//
// Prints one JSON object: {"results": [{label, ok, fields, rows} or
// {label, ok: false, code, message}, ...]} in the order the queries were
// issued. The Go test asserts the values. Exits non-zero only when the
// script itself cannot run.

const { Client } = require('pg');

const url = process.env.DATABASE_URL;
const prefix = process.env.LEASE_PREFIX;
if (!url || !prefix) {
  console.error('DATABASE_URL and LEASE_PREFIX must be set');
  process.exit(2);
}
const pipeline = process.env.PIPELINE === '1';

// The lease names: n1..n5.
const n = (i) => prefix + '-n' + i;
const lit = (s) => "'" + s.replace(/'/g, "''") + "'";

const acqText = 'SELECT lease_acquire($1, $2) AS tok';

// The queries, in the order they are issued. Each label names what the Go
// test expects.
const queries = [
  ['acquire-n1-named', { name: 'lp_pipe_acq', text: acqText, values: [n(1), 30] }],
  ['int-41', { text: 'SELECT $1::int + 0 AS i', values: [41] }],
  ['acquire-n2-unnamed', { text: 'SELECT lease_acquire($1, $2, $3) AS tok', values: [n(2), 30, 0] }],
  ['text-abcx-named', { name: 'lp_pipe_text', text: "SELECT $1::text || 'x' AS s", values: ['abc'] }],
  ['acquire-n3-named-again', { name: 'lp_pipe_acq', text: acqText, values: [n(3), 30] }],
  ['renew-n1', { text: 'SELECT lease_renew($1) AS ok', values: [n(1)] }],
  ['release-n2', { name: 'lp_pipe_rel', text: 'SELECT lease_release($1) AS ok', values: [n(2)] }],
  ['list-simple', { text: 'SELECT * FROM lease_list()' }],
  ['int-7-named', { name: 'lp_pipe_int', text: 'SELECT $1::int + 0 AS i', values: [7] }],
  ['acquire-n4-simple', { text: 'SELECT lease_acquire(' + lit(n(4)) + ', 30) AS tok' }],
  ['text-plain-simple', { text: "SELECT 'plain'::text AS s" }],
  ['div-zero', { text: 'SELECT 1 / $1::int AS boom', values: [0] }],
  ['acquire-n5-named-after-error', { name: 'lp_pipe_acq', text: acqText, values: [n(5), 30] }],
  ['renew-n2-released', { text: 'SELECT lease_renew($1) AS ok', values: [n(2)] }],
  ['list-extended', { text: 'SELECT * FROM lease_list()', queryMode: 'extended' }],
  ['text-endx-named', { name: 'lp_pipe_text', text: "SELECT $1::text || 'x' AS s", values: ['end'] }],
];

function describe(label, res) {
  return {
    label,
    ok: true,
    fields: res.fields.map((f) => ({ name: f.name, dataTypeID: f.dataTypeID })),
    rows: res.rows,
  };
}

async function main() {
  const c = new Client({ connectionString: url, pipeline });
  c.on('error', (e) => { console.error('client error event: ' + e); process.exit(1); });
  await c.connect();
  let results;
  try {
    // All issued in one tick: no await between them.
    const promises = queries.map(([label, q]) =>
      c.query(q).then((res) => describe(label, res), (e) => ({ label, ok: false, code: e.code || null, message: String(e.message) })));
    results = await Promise.all(promises);
  } finally {
    await c.end();
  }
  console.log(JSON.stringify({ pipeline, results }));
}

main().catch((e) => {
  console.error(e && e.stack || String(e));
  process.exit(1);
});
