'use strict';
// LISTEN/NOTIFY scenarios with node-postgres, for TestListenDifferential
// (integration/listen_differential_test.go): the Go test runs this script
// directly against PostgreSQL and through lockpool and compares what the
// clients observed, scenario by scenario.
//
// Environment:
//   DATABASE_URL     where the scenarios' clients connect (required)
//   OUTSIDE_URL      PostgreSQL directly, for sessions outside lockpool (required)
//   CHANNEL_PREFIX   prefix of every channel name (required; removed again
//                    from what is recorded, so that runs compare)
//   ABSENCE_WAIT_MS  the bounded wait after a barrier round trip (default 20)
//
// Prints one JSON object: {order: [name...], scenarios: {name: [observation...]},
// quirks: [name...]}. Observations: each statement's command tag or
// "ERROR <SQLSTATE>" (with the SQLSTATEs of its notices), each
// pg_listening_channels() result (sorted), each notification with its
// channel, payload and sender ("self" when its pid is the receiving client's
// own processID, the name of the scenario's client whose processID it is,
// or "?"). A notification is waited for up to 5 s; "no notification" comes
// from a barrier: a round trip (SELECT 1), then ABSENCE_WAIT_MS (see the Go
// test for why that proves absence). Exits non-zero only when the script
// itself cannot run.

const { Client } = require('pg');

const url = process.env.DATABASE_URL;
const outsideUrl = process.env.OUTSIDE_URL;
const basePrefix = process.env.CHANNEL_PREFIX;
if (!url || !outsideUrl || !basePrefix) {
  console.error('DATABASE_URL, OUTSIDE_URL and CHANNEL_PREFIX must be set');
  process.exit(2);
}
const absenceWait = parseInt(process.env.ABSENCE_WAIT_MS || '20', 10);

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function shorten(s, max) {
  if (s.length <= max) return s;
  return s.slice(0, max / 2) + '…(' + Buffer.byteLength(s) + ' bytes)';
}

class Scene {
  constructor(prefix) {
    this.prefix = prefix;
    this.obs = [];
    this.clients = [];
  }
  note(s) { this.obs.push(s); }
  ch(n) { return this.prefix + n; }
  q(n) { return '"' + (this.prefix + n).replace(/"/g, '""') + '"'; }
  show(s) { return shorten(String(s).split(this.prefix).join(''), 160); }
  async client(name) { return this.connect(name, url); }
  async outsider(name) { return this.connect(name, outsideUrl); }
  async connect(name, u) {
    const c = new SceneClient(this, name, new Client({ connectionString: u }));
    await c.pg.connect();
    this.clients.push(c);
    return c;
  }
  async closeAll() {
    for (const c of this.clients) {
      if (!c.closed) {
        c.closed = true;
        await c.pg.end().catch(() => {});
      }
    }
  }
}

class SceneClient {
  constructor(scene, name, pg) {
    this.s = scene;
    this.name = name;
    this.pg = pg;
    this.queue = [];
    this.waiters = [];
    this.notices = [];
    this.closed = false;
    this.lastError = null;
    pg.on('notification', (n) => {
      this.queue.push(n);
      const w = this.waiters;
      this.waiters = [];
      w.forEach((f) => f());
    });
    pg.on('notice', (n) => this.notices.push(n.severity + ' ' + n.code));
    pg.on('error', (e) => { this.lastError = e; });
  }

  takeNotices() {
    if (this.notices.length === 0) return '';
    const s = ' +' + this.notices.join(' +');
    this.notices = [];
    return s;
  }

  outcome(e) {
    if (e && e.code) return (e.severity && e.severity !== 'ERROR' ? e.severity : 'ERROR') + ' ' + e.code;
    return 'CONNECTION ERROR';
  }

  // run sends q (a string: simple protocol; an object: as node-postgres
  // sends it) and records its tag(s) or rows, or its error.
  async run(label, q, mode, rowsWanted) {
    let res;
    try {
      const r = await this.pg.query(q);
      const rs = Array.isArray(r) ? r : [r];
      res = rs.map((x) => {
        let p = x.command + (x.command === 'SELECT' || x.command === 'INSERT' ? ' ' + x.rowCount : '');
        if (rowsWanted || rs.length > 1) {
          if (x.rows.length > 0 || rowsWanted) {
            const rows = x.rows.map((row) => Object.values(row).map((v) => this.s.show(v === null ? 'NULL' : v)).join('|')).sort();
            p += ' ' + JSON.stringify(rows);
          }
        }
        return p;
      }).join('; ');
    } catch (e) {
      res = this.outcome(e);
    }
    this.s.note(this.name + ': ' + this.s.show(label) + ' [' + mode + '] → ' + res + this.takeNotices());
  }

  simple(sql) { return this.run(sql, sql, 'simple', false); }
  extended(sql, values) { return this.run(sql, { text: sql, values: values || [], queryMode: 'extended' }, 'extended', false); }
  prepared(name, sql, values) { return this.run(sql, { name, text: sql, values: values || [] }, 'prepared', false); }
  multi(sql) { return this.run(sql, sql, 'one query', true); }
  channels(mode) {
    const sql = 'SELECT pg_listening_channels() AS c';
    if (mode === 'extended') return this.run(sql, { text: sql, queryMode: 'extended' }, 'extended', true);
    return this.run(sql, sql, 'simple', true);
  }

  from(pid) {
    if (pid === this.pg.processID) return 'self';
    for (const o of this.s.clients) {
      if (o !== this && o.pg.processID === pid) return o.name;
    }
    return '?';
  }

  showNotification(n) {
    return 'notification ' + this.s.show(n.channel) + ' ' + JSON.stringify(shorten(n.payload, 40)) + ' from ' + this.from(n.processId);
  }

  // next resolves with the next notification, or null after ms.
  next(ms) {
    if (this.queue.length > 0) return Promise.resolve(this.queue.shift());
    return new Promise((resolve) => {
      let done = false;
      const timer = setTimeout(() => { if (!done) { done = true; resolve(null); } }, ms);
      this.waiters.push(() => {
        if (!done) {
          done = true;
          clearTimeout(timer);
          resolve(this.queue.shift());
        }
      });
    });
  }

  async expect(n) {
    for (let i = 0; i < n; i++) {
      const got = await this.next(5000);
      if (!got) {
        this.s.note(this.name + ': no notification within 5 s (' + i + ' of ' + n + ' expected)');
        return;
      }
      this.s.note(this.name + ': ' + this.showNotification(got));
    }
  }

  async expectNone() {
    try { await this.pg.query('SELECT 1'); } catch (e) { /* a failed block: still a round trip */ }
    await sleep(absenceWait);
    if (this.queue.length === 0) {
      this.s.note(this.name + (this.lastError ? ': connection error' : ': no notification'));
    } else {
      while (this.queue.length > 0) this.s.note(this.name + ': ' + this.showNotification(this.queue.shift()));
      this.s.note(this.name + ': no more');
    }
    this.takeNotices();
  }

  // waitIdle waits for a notification while sending nothing, send running
  // meanwhile.
  async waitIdle(send) {
    const waiting = this.next(5000);
    await send();
    const got = await waiting;
    this.s.note(this.name + ': waiting idle: ' + (got ? this.showNotification(got) : 'no notification within 5 s'));
  }

  async close() {
    this.closed = true;
    await this.pg.end();
    this.s.note(this.name + ': closed');
  }
}

// The scenarios: the pgx ones of the Go test, in node-postgres's terms.
const scenarios = [
  ['listen_then_notify_from_others', async (s) => {
    const l = await s.client('L'), o = await s.client('O'), x = await s.outsider('X');
    await l.simple('LISTEN ' + s.ch('a'));
    await l.simple('LISTEN ' + s.ch('a'));
    await l.extended('LISTEN ' + s.ch('b'));
    await l.channels('simple');
    await o.simple('NOTIFY ' + s.ch('a') + ", 'from O'");
    await x.simple('NOTIFY ' + s.ch('a') + ", 'from X outside'");
    await o.extended('SELECT pg_notify($1, $2)', [s.ch('b'), 'from O via pg_notify']);
    await o.simple('NOTIFY ' + s.ch('c') + ", 'not listened'");
    await l.expect(3);
    await l.expectNone();
  }],
  ['notify_in_committed_and_rolled_back_transactions', async (s) => {
    const l = await s.client('L'), o = await s.client('O');
    await l.simple('LISTEN ' + s.ch('a'));
    await o.simple('BEGIN');
    await o.simple('NOTIFY ' + s.ch('a') + ", 'c1'");
    await o.extended("SELECT pg_notify($1, 'c2')", [s.ch('a')]);
    await l.expectNone();
    await o.simple('COMMIT');
    await l.expect(2);
    await o.simple('BEGIN');
    await o.simple('NOTIFY ' + s.ch('a') + ", 'rolled back'");
    await o.simple('ROLLBACK');
    await l.expectNone();
    await o.simple('BEGIN');
    await o.simple('NOTIFY ' + s.ch('a') + ", 'failed block'");
    await o.simple('SELECT 1/0');
    await o.simple('COMMIT');
    await l.expectNone();
    await o.extended('NOTIFY ' + s.ch('a') + ", 'after'");
    await l.expect(1);
    await l.expectNone();
  }],
  ['listen_inside_committed_and_rolled_back_blocks', async (s) => {
    const l = await s.client('L'), o = await s.client('O');
    await l.simple('BEGIN');
    await l.simple('LISTEN ' + s.ch('a'));
    await l.channels('simple');
    await l.simple('COMMIT');
    await l.channels('extended');
    await o.simple('NOTIFY ' + s.ch('a') + ", 'after commit'");
    await l.expect(1);
    await l.simple('BEGIN');
    await l.extended('LISTEN ' + s.ch('b'));
    await l.channels('extended');
    await l.simple('ROLLBACK');
    await l.channels('simple');
    await o.simple('NOTIFY ' + s.ch('b') + ", 'b after rollback'");
    await l.expectNone();
    await l.simple('BEGIN');
    await l.simple('LISTEN ' + s.ch('c'));
    await l.simple('SELECT 1/0');
    await l.simple('LISTEN ' + s.ch('d'));
    await l.simple('COMMIT');
    await l.channels('simple');
    await o.simple('NOTIFY ' + s.ch('c') + ", 'c after failed block'");
    await l.expectNone();
  }],
  ['listen_in_block_first_listen', async (s) => {
    const l = await s.client('L'), o = await s.client('O');
    await l.simple('BEGIN');
    await l.simple('LISTEN ' + s.ch('a'));
    await o.simple('NOTIFY ' + s.ch('a') + ", 'committed before the LISTEN block commits'");
    await l.expectNone();
    await l.simple('COMMIT');
    await l.expectNone();
    await o.simple('NOTIFY ' + s.ch('a') + ", 'after'");
    await l.expect(1);
    await l.expectNone();
  }],
  ['unlisten_and_unlisten_all', async (s) => {
    const l = await s.client('L'), o = await s.client('O');
    for (const n of ['a', 'b', 'c']) await l.simple('LISTEN ' + s.ch(n));
    await l.simple('UNLISTEN ' + s.ch('a'));
    await l.channels('simple');
    await o.simple('NOTIFY ' + s.ch('a') + ", 'a'");
    await o.simple('NOTIFY ' + s.ch('b') + ", 'b'");
    await l.expect(1);
    await l.expectNone();
    await l.extended('UNLISTEN *');
    await l.channels('extended');
    await o.simple('NOTIFY ' + s.ch('c') + ", 'c after UNLISTEN *'");
    await l.expectNone();
  }],
  ['discard_all', async (s) => {
    const l = await s.client('L'), o = await s.client('O');
    await l.simple('LISTEN ' + s.ch('a'));
    await l.simple('DISCARD ALL');
    await l.channels('simple');
    await o.simple('NOTIFY ' + s.ch('a') + ", 'after DISCARD ALL'");
    await l.expectNone();
    await l.simple('LISTEN ' + s.ch('a'));
    await o.simple('NOTIFY ' + s.ch('a') + ", 'listening again'");
    await l.expect(1);
  }],
  ['self_notification', async (s) => {
    const l = await s.client('L');
    await l.simple('LISTEN ' + s.ch('a'));
    await l.simple('NOTIFY ' + s.ch('a') + ", 'notify simple'");
    await l.expect(1);
    await l.extended('NOTIFY ' + s.ch('a') + ", 'notify extended'");
    await l.expect(1);
    await l.prepared('lsn_self_notify', 'NOTIFY ' + s.ch('a') + ", 'notify prepared'");
    await l.expect(1);
    await l.simple("SELECT pg_notify('" + s.ch('a') + "', 'pg_notify simple')");
    await l.expect(1);
    await l.extended('SELECT pg_notify($1, $2)', [s.ch('a'), 'pg_notify extended']);
    await l.expect(1);
    await l.prepared('lsn_self_pg_notify', 'SELECT pg_notify($1, $2)', [s.ch('a'), 'pg_notify prepared']);
    await l.expect(1);
    await l.simple('BEGIN');
    await l.simple('NOTIFY ' + s.ch('a') + ", 'in a block'");
    await l.expectNone();
    await l.simple('COMMIT');
    await l.expect(1);
    await l.expectNone();
  }],
  ['delivery_while_idle', async (s) => {
    const l = await s.client('L'), o = await s.client('O'), x = await s.outsider('X');
    await l.simple('LISTEN ' + s.ch('a'));
    await l.waitIdle(() => o.simple('NOTIFY ' + s.ch('a') + ", 'to an idle client'"));
    await l.waitIdle(() => x.extended("SELECT pg_notify($1, 'from outside to an idle client')", [s.ch('a')]));
    await l.expectNone();
  }],
  ['held_while_in_a_block', async (s) => {
    const l = await s.client('L'), o = await s.client('O');
    await l.simple('LISTEN ' + s.ch('a'));
    await l.simple('BEGIN');
    await l.simple('SELECT 1');
    await o.simple('NOTIFY ' + s.ch('a') + ", 'h1'");
    await l.expectNone();
    await l.extended('SELECT 2');
    await l.expectNone();
    await l.simple('COMMIT');
    await l.expect(1);
    await l.simple('BEGIN');
    await l.simple('SELECT 1/0');
    await o.simple('NOTIFY ' + s.ch('a') + ", 'h2 while failed'");
    await l.expectNone();
    await l.simple('ROLLBACK');
    await l.expect(1);
    await l.expectNone();
  }],
  ['order_across_three_senders', async (s) => {
    const l = await s.client('L'), a = await s.client('A'), b = await s.client('B'), c = await s.client('C');
    await l.simple('LISTEN ' + s.ch('a'));
    await l.extended('LISTEN ' + s.ch('b'));
    for (let round = 1; round <= 2; round++) {
      await a.simple('BEGIN');
      await a.simple('NOTIFY ' + s.ch('a') + ", 'A1." + round + "'");
      await b.simple('BEGIN');
      await b.extended('SELECT pg_notify($1, $2)', [s.ch('a'), 'B1.' + round]);
      await a.simple('NOTIFY ' + s.ch('b') + ", 'A2." + round + "'");
      await c.simple('NOTIFY ' + s.ch('a') + ", 'C0." + round + "'");
      await b.extended('NOTIFY ' + s.ch('b') + ", 'B2." + round + "'");
      await b.simple('COMMIT');
      await a.simple('NOTIFY ' + s.ch('a') + ", 'A3." + round + "'");
      await c.simple('BEGIN');
      await c.simple('NOTIFY ' + s.ch('b') + ", 'C1." + round + "'");
      await a.simple('COMMIT');
      await c.simple('NOTIFY ' + s.ch('b') + ", 'C2." + round + "'");
      await c.simple('COMMIT');
      await b.multi('NOTIFY ' + s.ch('a') + ", 'B3." + round + "'; NOTIFY " + s.ch('b') + ", 'B4." + round + "'");
    }
    await l.expect(20);
    await l.expectNone();
  }],
  ['payload_7999_bytes', async (s) => {
    const l = await s.client('L'), o = await s.client('O');
    await l.simple('LISTEN ' + s.ch('a'));
    const big = '0123456789abcdef'.repeat(500).slice(0, 7999);
    await o.simple('NOTIFY ' + s.ch('a') + ", '" + big + "'");
    await o.extended('SELECT pg_notify($1, $2)', [s.ch('a'), 'x' + big.slice(1)]);
    await o.extended('SELECT pg_notify($1, $2)', [s.ch('a'), big + 'y']);
    await o.extended('SELECT pg_notify($1, $2)', [s.ch('a'), "quote ' backslash \\ newline \n unicode é 😀"]);
    await l.expect(3);
    await l.expectNone();
  }],
  ['listen_inside_multi_statement_queries', async (s) => {
    const l = await s.client('L'), o = await s.client('O');
    await l.multi('LISTEN ' + s.ch('a') + '; SELECT 1');
    await l.multi('BEGIN; LISTEN ' + s.ch('b') + '; COMMIT');
    await l.multi('LISTEN ' + s.ch('c') + '; SELECT 1/0');
    await l.multi('LISTEN ' + s.ch('d') + '; SELECT pg_listening_channels()');
    await l.channels('simple');
    await l.multi('UNLISTEN ' + s.ch('a') + '; SELECT 1/0');
    await l.channels('simple');
    for (const n of ['a', 'b', 'c', 'd']) await o.simple('NOTIFY ' + s.ch(n) + ", '" + n + "'");
    await l.expect(3);
    await l.expectNone();
  }],
  ['extended_protocol_listen', async (s) => {
    const l = await s.client('L'), o = await s.client('O');
    await l.extended('LISTEN ' + s.ch('a'));
    await l.prepared('lsn_listen_b', 'LISTEN ' + s.ch('b'));
    await l.channels('extended');
    await o.extended('NOTIFY ' + s.ch('a') + ", 'a'");
    await o.prepared('lsn_notify_b', 'NOTIFY ' + s.ch('b') + ", 'b'");
    await l.expect(2);
    await l.extended('UNLISTEN ' + s.ch('a'));
    await l.channels('extended');
    await o.extended('NOTIFY ' + s.ch('a') + ", 'a after UNLISTEN'");
    await o.prepared('lsn_notify_b', 'NOTIFY ' + s.ch('b') + ", 'b'");
    await l.expect(1);
    await l.expectNone();
  }],
  ['quoted_and_mixed_case_channels', async (s) => {
    const l = await s.client('L'), o = await s.client('O');
    await l.simple('LISTEN ' + s.q('MiXed'));
    await l.simple('LISTEN ' + s.ch('MiXed'));
    await l.extended('LISTEN ' + s.q('we"ird'));
    await l.simple('LISTEN ' + s.q('with space'));
    await l.channels('simple');
    await o.simple('NOTIFY ' + s.q('MiXed') + ", 'q1 quoted'");
    await o.simple('NOTIFY ' + s.ch('MIXED') + ", 'q2 folded'");
    await o.extended("SELECT pg_notify($1, 'q3 exact case')", [s.ch('MiXed')]);
    await o.extended("SELECT pg_notify($1, 'q4 no such channel')", [s.ch('MIXED')]);
    await o.extended("SELECT pg_notify($1, 'q5')", [s.ch('we"ird')]);
    await o.simple('NOTIFY ' + s.q('with space') + ", 'q6'");
    await l.expect(5);
    await l.expectNone();
    await l.simple('UNLISTEN ' + s.q('MiXed'));
    await l.channels('simple');
    await o.extended("SELECT pg_notify($1, 'q7')", [s.ch('MiXed')]);
    await o.extended("SELECT pg_notify($1, 'q8')", [s.ch('mixed')]);
    await l.expect(1);
    await l.expectNone();
  }],
  ['listeners_sharing_a_channel', async (s) => {
    const l1 = await s.client('L1'), l2 = await s.client('L2'), o = await s.client('O');
    await l1.simple('LISTEN ' + s.ch('a'));
    await l2.simple('LISTEN ' + s.ch('a'));
    await o.simple('NOTIFY ' + s.ch('a') + ", 'both'");
    await l1.expect(1);
    await l2.expect(1);
    await l1.close();
    await o.simple('NOTIFY ' + s.ch('a') + ", 'L2 only'");
    await l2.expect(1);
    await l2.expectNone();
  }],
  ['held_quirk_listen_in_block', async (s) => {
    const l = await s.client('L'), o = await s.client('O');
    await l.simple('LISTEN ' + s.ch('z'));
    await l.simple('BEGIN');
    await l.simple('LISTEN ' + s.ch('a'));
    await o.simple('NOTIFY ' + s.ch('a') + ", 'committed before the LISTEN block commits'");
    await l.simple('COMMIT');
    await l.expectNone();
  }],
  ['held_quirk_unlisten_in_block', async (s) => {
    const l = await s.client('L'), o = await s.client('O');
    await l.simple('LISTEN ' + s.ch('a'));
    await l.simple('BEGIN');
    await l.simple('UNLISTEN ' + s.ch('a'));
    await o.simple('NOTIFY ' + s.ch('a') + ", 'committed while L listened, before its COMMIT'");
    await l.simple('COMMIT');
    await l.expectNone();
  }],
];

const quirks = ['held_quirk_listen_in_block', 'held_quirk_unlisten_in_block'];

async function main() {
  const results = {};
  await Promise.all(scenarios.map(async ([name, fn], i) => {
    const s = new Scene(basePrefix + String(i).padStart(2, '0') + '_');
    try {
      await fn(s);
    } catch (e) {
      s.note('SCRIPT ERROR: ' + (e && e.stack || e));
    } finally {
      await s.closeAll();
    }
    results[name] = s.obs;
  }));
  console.log(JSON.stringify({ order: scenarios.map(([n]) => n), scenarios: results, quirks }));
}

main().catch((e) => {
  console.error(e && e.stack || e);
  process.exit(1);
});
