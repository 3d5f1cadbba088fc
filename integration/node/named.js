'use strict';
// node-postgres named queries ({name, text, values}) through lockpool.
//
// Environment:
//   DATABASE_URL  connection string (required)
//   CONCURRENCY   concurrent clients (default 20)
//   QUERIES       queries per client (default 200)
//   STATEMENTS    distinct statement names (default 10)
//
// Each client holds its own pg.Client (so its prepared-statement names live
// for the whole run, the case transaction poolers break) and runs named
// queries, some inside explicit transactions, checking every result. Exits
// non-zero on the first error or wrong result, printing it.

const { Client } = require('pg');

const url = process.env.DATABASE_URL;
if (!url) {
  console.error('DATABASE_URL is not set');
  process.exit(2);
}
const concurrency = parseInt(process.env.CONCURRENCY || '20', 10);
const queries = parseInt(process.env.QUERIES || '200', 10);
const statements = parseInt(process.env.STATEMENTS || '10', 10);

function named(k, x) {
  return {
    name: 'lp_node_q' + k,
    text: 'SELECT $1::int + ' + k + ' AS v, $2::text AS tag',
    values: [x, 'w' + k],
  };
}

async function worker(id) {
  const c = new Client({ connectionString: url });
  c.on('error', (e) => {
    console.error('client ' + id + ' error event: ' + (e && e.stack || e));
    process.exit(1);
  });
  await c.connect();
  try {
    for (let i = 0; i < queries; i++) {
      const k = (id + i) % statements;
      const x = id * 100000 + i;
      const inTx = i % 7 === 3;
      if (inTx) await c.query('BEGIN');
      const r = await c.query(named(k, x));
      if (r.rows.length !== 1 || Number(r.rows[0].v) !== x + k || r.rows[0].tag !== 'w' + k) {
        throw new Error('client ' + id + ' query ' + i + ': wrong result ' + JSON.stringify(r.rows) + ', want v=' + (x + k));
      }
      if (inTx) {
        // A second named statement in the same transaction.
        const r2 = await c.query(named((k + 1) % statements, x));
        if (Number(r2.rows[0].v) !== x + ((k + 1) % statements)) {
          throw new Error('client ' + id + ' query ' + i + ' (in tx): wrong result ' + JSON.stringify(r2.rows));
        }
        await c.query('COMMIT');
      }
    }
  } finally {
    await c.end();
  }
  return queries;
}

async function main() {
  const started = Date.now();
  const results = await Promise.all(Array.from({ length: concurrency }, (_, i) => worker(i)));
  const total = results.reduce((a, b) => a + b, 0);
  console.log('ok: ' + total + ' named queries by ' + concurrency + ' clients in ' + (Date.now() - started) + ' ms');
}

main().catch((e) => {
  console.error('FAIL: ' + (e && e.stack || e));
  process.exit(1);
});
