'use strict';
// node-postgres lease scenario through two lockpool instances
// (integration/lease_clients_test.go, issue 4 acceptance point 7).
//
// Environment:
//   DATABASE_URL   lockpool instance A (required)
//   DATABASE_URL2  lockpool instance B (required)
//   LEASE_NAME     the lease name to use (required)
//
// Exits non-zero on the first wrong result, printing it.

const { Client } = require('pg');

const urlA = process.env.DATABASE_URL;
const urlB = process.env.DATABASE_URL2;
const name = process.env.LEASE_NAME;
if (!urlA || !urlB || !name) {
  console.error('DATABASE_URL, DATABASE_URL2 and LEASE_NAME must be set');
  process.exit(2);
}

function check(cond, what, got) {
  if (!cond) {
    throw new Error(what + ': got ' + JSON.stringify(got, (k, v) => (typeof v === 'bigint' ? v.toString() : v)));
  }
}

// int8Token checks a lease_acquire result: column type int8 (OID 20), value a
// decimal string (node-postgres's default for int8). Returns it as a BigInt.
function int8Token(res, col, what) {
  check(res.fields.length === 1 && res.fields[0].name === col, what + ': one column ' + col, res.fields);
  check(res.fields[0].dataTypeID === 20, what + ': dataTypeID 20 (int8)', res.fields[0]);
  check(res.rows.length === 1, what + ': one row', res.rows);
  const v = res.rows[0][col];
  check(typeof v === 'string' && /^[1-9][0-9]*$/.test(v), what + ': a decimal string', v);
  return BigInt(v);
}

async function main() {
  const a = new Client({ connectionString: urlA });
  const b = new Client({ connectionString: urlB });
  a.on('error', (e) => { console.error('client a error event: ' + e); process.exit(1); });
  b.on('error', (e) => { console.error('client b error event: ' + e); process.exit(1); });
  await a.connect();
  await b.connect();
  const out = {};
  try {
    // Simple protocol (no parameters).
    const lit = name.replace(/'/g, "''");
    const tok = int8Token(await a.query("SELECT lease_acquire('" + lit + "', 30) AS tok"), 'tok', 'simple acquire');
    out.token = tok.toString();

    // Extended protocol, text parameters: re-acquire keeps the token.
    let t2 = int8Token(await a.query('SELECT lease_acquire($1, $2) AS tok', [name, 30]), 'tok', 'extended acquire');
    check(t2 === tok, 're-acquire keeps the token', [t2, tok]);
    // Named prepared statement, twice.
    for (let i = 0; i < 2; i++) {
      t2 = int8Token(await a.query({ name: 'lp_lease_acq', text: 'SELECT lockpool.lease_acquire($1, $2, $3)', values: [name, 30, 0] }), 'lease_acquire', 'named acquire');
      check(t2 === tok, 'named re-acquire keeps the token', [t2, tok]);
    }
    // Binary results.
    const bin = await a.query({ text: 'SELECT lease_acquire($1, $2) AS tok', values: [name, '30.5'], binary: true });
    check(bin.fields[0].dataTypeID === 20 && bin.fields[0].format === 'binary', 'binary acquire: int8 binary column', bin.fields);
    // node-postgres reads binary values through a UTF-8 string, so a byte
    // >= 0x80 comes out mangled: compare with what PostgreSQL itself sends
    // for the same int8 in binary, which node decodes the same way.
    const ref = await a.query({ text: 'SELECT $1::int8 AS tok', values: [tok.toString()], binary: true });
    check(String(bin.rows[0].tok) === String(ref.rows[0].tok), 'binary acquire value (as PostgreSQL sends ' + tok + ')', [bin.rows[0], ref.rows[0]]);

    let r = await a.query('SELECT lease_renew($1)', [name]);
    check(r.fields[0].dataTypeID === 16 && r.rows[0].lease_renew === true, 'lease_renew = true', r.rows);

    // Fencing in a transaction.
    await a.query('BEGIN');
    r = await a.query('SELECT lease_fence($1, $2) AS f', [name, tok.toString()]);
    check(String(r.rows[0].f) === tok.toString(), 'lease_fence returns the token', r.rows);
    await a.query('COMMIT');

    // Another instance sees it held.
    r = await b.query('SELECT lease_acquire($1, $2, $3) AS tok', [name, 30, 0]);
    check(r.fields[0].dataTypeID === 20 && r.rows[0].tok === null, 'acquire by another holder = NULL', r.rows);

    // lease_list.
    r = await a.query('SELECT * FROM lease_list()');
    const cols = r.fields.map((f) => f.name + ':' + f.dataTypeID).join(',');
    check(cols === 'name:25,holder:25,token:20,taken_at:1184,expires_at:1184,mine:16', 'lease_list columns', cols);
    const row = r.rows.find((x) => x.name === name);
    check(row && row.token === tok.toString() && row.mine === true && typeof row.holder === 'string' &&
      row.expires_at instanceof Date && row.expires_at > row.taken_at, 'lease_list row', row);
    r = await b.query('SELECT * FROM lease_list()');
    const other = r.rows.find((x) => x.name === name);
    check(other && other.mine === false && other.holder === row.holder, 'lease_list from the other instance', other);

    // Release; the other instance takes it with a larger token.
    r = await a.query('SELECT lease_release($1)', [name]);
    check(r.rows[0].lease_release === true, 'lease_release = true', r.rows);
    const t3 = int8Token(await b.query('SELECT lease_acquire($1, $2, $3) AS tok', [name, 30, 5]), 'tok', 'takeover');
    check(t3 > tok, 'takeover token larger', [t3, tok]);
    out.takeover = t3.toString();

    // The old token is stale: LP001.
    await a.query('BEGIN');
    let code = null;
    try {
      await a.query('SELECT lease_fence($1, $2)', [name, tok.toString()]);
    } catch (e) {
      code = e.code;
    }
    await a.query('ROLLBACK');
    check(code === 'LP001', 'stale lease_fence raises LP001', code);
    r = await a.query('SELECT lease_renew($1)', [name]);
    check(r.rows[0].lease_renew === false, 'stale lease_renew = false', r.rows);
    r = await a.query('SELECT lease_release($1)', [name]);
    check(r.rows[0].lease_release === false, 'stale lease_release = false', r.rows);
  } finally {
    await a.end();
    await b.end();
  }
  console.log('ok ' + JSON.stringify(out));
}

main().catch((e) => {
  console.error(e && e.stack || String(e));
  process.exit(1);
});
