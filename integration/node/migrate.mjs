// node-pg-migrate runners at once through lockpool: each runs `up` over the
// same migrations directory, serialised by node-pg-migrate's session
// advisory lock (advisoryLockMode "wait": a blocking pg_advisory_lock).
//
// Environment:
//   DATABASE_URL      connection string (required)
//   MIGRATIONS_DIR    directory of SQL migrations (required)
//   MIGRATIONS_TABLE  node-pg-migrate's history table (required)
//   CONCURRENCY       runners at once (default 6)
//
// Prints one JSON line: how many migrations each runner applied. Exits
// non-zero on the first error.

import { runner } from 'node-pg-migrate';

const url = process.env.DATABASE_URL;
const dir = process.env.MIGRATIONS_DIR;
const table = process.env.MIGRATIONS_TABLE;
if (!url || !dir || !table) {
  console.error('DATABASE_URL, MIGRATIONS_DIR and MIGRATIONS_TABLE must be set');
  process.exit(2);
}
const n = Number(process.env.CONCURRENCY || 6);
const quiet = { debug() {}, info() {}, warn(m) { console.error(m); }, error(m) { console.error(m); } };

const runs = [];
for (let i = 0; i < n; i++) {
  runs.push(runner({
    databaseUrl: url,
    dir,
    migrationsTable: table,
    direction: 'up',
    count: Infinity,
    advisoryLockMode: 'wait',
    logger: quiet,
  }));
}
try {
  const applied = await Promise.all(runs);
  console.log(JSON.stringify({ applied: applied.map((a) => a.length) }));
} catch (err) {
  console.error(err && err.stack ? err.stack : String(err));
  process.exit(1);
}
