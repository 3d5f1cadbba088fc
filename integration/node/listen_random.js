'use strict';
// node-postgres clients for TestListenRandomized
// (integration/listen_random_test.go): they LISTEN, UNLISTEN, NOTIFY and
// pg_notify at random, as the Go clients there do, and print every event as
// a JSON line for the Go test's oracle.
//
// Environment:
//   DATABASE_URL   where the clients connect (required)
//   CLIENT_BASE    the first client's number (the Go test numbers all clients)
//   CLIENTS        how many clients (default 3)
//   SEED           random seed
//   CHANNELS       JSON list of channel names (raw; quoted as identifiers)
//   FINAL_WAIT_MS  the bounded wait after the final barrier (default 50)
//
// Standard input: "stop" ends the random actions (a block open then is
// rolled back); once every client stopped the script prints
// {"ev":"stopped"}. "final" makes each client send its final barrier (a
// round trip, then FINAL_WAIT_MS), close, and the script prints
// {"ev":"done"} and exits.
//
// Events (times are process.hrtime.bigint(), CLOCK_MONOTONIC, in ns):
//   {ev:"conn", c, g, pid, sent, done, driver}
//   {ev:"op", c, g, kind, sql, acts, sent, done, ok, tag, code, sev, err, got, want}
//       (done absent when the connection died meanwhile)
//   {ev:"recv", c, g, ch, id, pid, t, inblock}
//   {ev:"fatal", c, g, t, code, sev, err}
//   {ev:"barrier", c, g, sent}, {ev:"end", c, g, t}

const { Client } = require('pg');
const readline = require('readline');

const url = process.env.DATABASE_URL;
if (!url) {
  console.error('DATABASE_URL is not set');
  process.exit(2);
}
const base = parseInt(process.env.CLIENT_BASE || '0', 10);
const count = parseInt(process.env.CLIENTS || '3', 10);
const channels = JSON.parse(process.env.CHANNELS || '["lr_a","lr_b","lr_c"]');
const finalWait = parseInt(process.env.FINAL_WAIT_MS || '50', 10);
let seed = parseInt(process.env.SEED || '1', 10) >>> 0;

const now = () => Number(process.hrtime.bigint());
const emit = (e) => process.stdout.write(JSON.stringify(e) + '\n');
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const qi = (ch) => '"' + ch.replace(/"/g, '""') + '"';

// mulberry32
function rng(s) {
  let a = s >>> 0;
  return () => {
    a = (a + 0x6D2B79F5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

let stopping = false;

function apply(set, acts) {
  for (const a of acts || []) {
    if (a.k === 'listen') set.add(a.ch);
    else if (a.k === 'unlisten') set.delete(a.ch);
    else if (a.k === 'unlisten_all') set.clear();
  }
}

// Roles, as in the Go test: a steady client LISTENs to its home channel as
// soon as it is connected and never UNLISTENs it (nor UNLISTEN *, nor
// DISCARD ALL); a quiet one never LISTENs; the others do anything.
const roleOf = (id) => (id % 4 === 1 ? 'steady' : id % 4 === 3 ? 'quiet' : 'random');
const homeOf = (id) => channels[id % channels.length];

class RClient {
  constructor(id, r) {
    this.id = id;
    this.role = roleOf(id);
    this.home = homeOf(id);
    this.r = r;
    this.gen = 0;
    this.seq = 0;
    this.pg = null;
  }

  int(n) { return Math.floor(this.r() * n); }
  pick(xs) { return xs[this.int(xs.length)]; }
  channel() { return this.pick(channels); }
  nextID() { this.seq++; return 'n' + this.id + '.' + this.gen + '.' + this.seq; }

  async connect() {
    const gen = this.gen;
    const pg = new Client({ connectionString: url });
    this.committed = new Set();
    this.pending = [];
    this.inTx = false;
    this.ending = false;
    this.failed = false;
    this.rfq = 'I';
    this.dead = false;
    this.closing = false;
    this.lastFatal = null;
    pg.on('notification', (n) => {
      emit({ ev: 'recv', c: this.id, g: gen, ch: n.channel, id: n.payload, pid: n.processId, t: now(),
        inblock: (this.rfq === 'T' || this.rfq === 'E') && !this.ending });
    });
    pg.on('error', (e) => this.die(gen, e));
    pg.on('end', () => this.die(gen, new Error('connection ended')));
    const sent = now();
    try {
      await pg.connect();
    } catch (e) {
      emit({ ev: 'op', c: this.id, g: gen, kind: 'stmt', sql: '(connect)', sent, done: now(), ok: false, code: e.code || '', sev: 'ERROR', err: String(e.message) });
      this.gen++;
      return false;
    }
    pg.connection.on('readyForQuery', (m) => { this.rfq = m.status; });
    pg.connection.on('errorMessage', (m) => {
      if (m.severity === 'FATAL' || m.severity === 'PANIC') this.lastFatal = m;
    });
    this.pg = pg;
    emit({ ev: 'conn', c: this.id, g: gen, pid: pg.processID, sent, done: now(), driver: 'node-postgres ' + this.role });
    return true;
  }

  die(gen, e) {
    if (gen !== this.gen || this.dead || this.closing) return;
    this.dead = true;
    const f = this.lastFatal || e || {};
    emit({ ev: 'fatal', c: this.id, g: gen, t: now(), code: f.code || '', sev: f.severity || '', err: String(f.message || e) });
    this.gen++;
    const pg = this.pg;
    this.pg = null;
    if (pg) pg.end().catch(() => {});
  }

  // run sends q and logs it; false when the connection died.
  async run(kind, sql, acts, q) {
    const gen = this.gen;
    const e = { ev: 'op', c: this.id, g: gen, kind, sql, acts, sent: now() };
    if (kind === 'commit' || kind === 'rollback') this.ending = true;
    let res, err;
    if (kind === 'channels') e.want = [...this.committed].sort();
    try {
      res = await this.pg.query(q);
    } catch (x) {
      err = x;
    }
    if (gen !== this.gen || this.dead || (err && (!err.code || err.severity === 'FATAL' || err.severity === 'PANIC'))) {
      emit(e);
      this.die(gen, err);
      return false;
    }
    e.done = now();
    e.ok = !err;
    if (err) {
      e.code = err.code;
      e.sev = err.severity;
      e.err = String(err.message);
    } else {
      const rs = Array.isArray(res) ? res : [res];
      e.tag = rs.map((x) => x.command).join(';');
      if (kind === 'channels') e.got = rs[0].rows.map((row) => Object.values(row)[0]).sort();
    }
    emit(e);
    if (kind === 'begin') {
      this.inTx = !err;
      this.ending = false;
      this.failed = false;
      this.pending = [];
      this.steps = 0;
    } else if (kind === 'commit') {
      if (!err && e.tag === 'COMMIT' && !this.failed) apply(this.committed, this.pending);
      this.inTx = false;
      this.ending = false;
      this.pending = [];
    } else if (kind === 'rollback') {
      this.inTx = false;
      this.ending = false;
      this.pending = [];
    } else if (this.inTx && err) {
      this.failed = true;
    } else if (this.inTx) {
      this.pending.push(...(acts || []));
    } else if (!err) {
      apply(this.committed, acts);
    }
    return true;
  }

  simple(kind, sql, acts) { return this.run(kind, sql, acts, sql); }
  extended(kind, sql, acts, values) { return this.run(kind, sql, acts, { text: sql, values: values || [], queryMode: 'extended' }); }
  either(kind, sql, acts) { return this.int(2) === 0 ? this.simple(kind, sql, acts) : this.extended(kind, sql, acts); }

  notify() {
    const ch = this.channel(), id = this.nextID();
    const acts = [{ k: 'notify', ch, id }];
    switch (this.int(3)) {
      case 0: return this.simple('stmt', 'NOTIFY ' + qi(ch) + ", '" + id + "'", acts);
      case 1: return this.extended('stmt', 'NOTIFY ' + qi(ch) + ", '" + id + "'", acts);
      default: return this.extended('stmt', 'SELECT pg_notify($1, $2)', acts, [ch, id]);
    }
  }

  listen() {
    if (this.role === 'quiet') return this.notify();
    const ch = this.channel();
    return this.either('stmt', 'LISTEN ' + qi(ch), [{ k: 'listen', ch }]);
  }

  unlisten() {
    let ch = this.channel();
    while (this.role === 'steady' && ch === this.home) ch = this.channel();
    return this.either('stmt', 'UNLISTEN ' + qi(ch), [{ k: 'unlisten', ch }]);
  }

  unlistenAll(discard) {
    if (this.role === 'steady') return this.notify();
    if (discard && !this.inTx) return this.simple('stmt', 'DISCARD ALL', [{ k: 'unlisten_all' }]);
    return this.either('stmt', 'UNLISTEN *', [{ k: 'unlisten_all' }]);
  }

  async step() {
    if (this.role === 'steady' && !this.committed.has(this.home)) {
      return this.either('stmt', 'LISTEN ' + qi(this.home), [{ k: 'listen', ch: this.home }]);
    }
    const n = this.int(100);
    if (n < 14) return this.listen();
    if (n < 21) return this.unlisten();
    if (n < 23) return this.unlistenAll(false);
    if (n < 24) return this.unlistenAll(true);
    if (n < 44) return this.notify();
    if (n < 50) {
      const x = this.channel(), y = this.channel();
      switch (this.role === 'quiet' ? 1 : this.int(4)) {
        case 0: return this.simple('stmt', 'LISTEN ' + qi(x) + '; SELECT 1', [{ k: 'listen', ch: x }]);
        case 1: {
          const i1 = this.nextID(), i2 = this.nextID();
          return this.simple('stmt', 'NOTIFY ' + qi(x) + ", '" + i1 + "'; NOTIFY " + qi(y) + ", '" + i2 + "'",
            [{ k: 'notify', ch: x, id: i1 }, { k: 'notify', ch: y, id: i2 }]);
        }
        case 2: {
          const id = this.nextID();
          return this.simple('stmt', 'LISTEN ' + qi(x) + '; NOTIFY ' + qi(y) + ", '" + id + "'; SELECT 1/0",
            [{ k: 'listen', ch: x }, { k: 'notify', ch: y, id }]);
        }
        default:
          return this.simple('stmt', 'UNLISTEN ' + qi(x) + '; LISTEN ' + qi(x), [{ k: 'unlisten', ch: x }, { k: 'listen', ch: x }]);
      }
    }
    if (n < 64) return this.either('begin', 'BEGIN', null);
    if (n < 70) return this.either('channels', 'SELECT pg_listening_channels()', null);
    await sleep(5 + this.int(45));
    return true;
  }

  async blockStep() {
    this.steps++;
    if (this.steps > 1 + this.int(5)) {
      const n = this.int(100);
      if (n < 62) return this.either('commit', 'COMMIT', null);
      if (n < 90) return this.either('rollback', 'ROLLBACK', null);
      if (this.failed) return this.simple('commit', 'COMMIT', null);
      if (await this.simple('stmt', 'SELECT 1/0', null)) return this.simple('commit', 'COMMIT', null);
      return false;
    }
    if (this.failed) return this.simple('stmt', 'SELECT 1', null);
    const n = this.int(100);
    if (n < 25) return this.listen();
    if (n < 37) return this.unlisten();
    if (n < 41) return this.unlistenAll(false);
    if (n < 75) return this.notify();
    if (n < 83) return this.either('channels', 'SELECT pg_listening_channels()', null);
    await sleep(5 + this.int(30));
    return true;
  }

  async loop() {
    while (!stopping) {
      if (!this.pg) {
        if (!(await this.connect())) await sleep(100);
        continue;
      }
      if (this.inTx) await this.blockStep();
      else await this.step();
    }
    if (this.pg && this.inTx) await this.simple('rollback', 'ROLLBACK', null);
  }

  async final() {
    if (!this.pg) return;
    const gen = this.gen;
    emit({ ev: 'barrier', c: this.id, g: gen, sent: now() });
    try {
      await this.pg.query('SELECT 1');
    } catch (e) {
      this.die(gen, e);
      return;
    }
    await sleep(finalWait);
    if (this.dead || gen !== this.gen) return;
    emit({ ev: 'end', c: this.id, g: gen, t: now() });
    this.closing = true;
    await this.pg.end().catch(() => {});
  }
}

async function main() {
  const clients = [];
  for (let i = 0; i < count; i++) clients.push(new RClient(base + i, rng(seed + i)));
  const loops = clients.map((c) => c.loop().catch((e) => {
    emit({ ev: 'log', msg: 'client ' + c.id + ' loop failed: ' + (e && e.stack || e) });
  }));
  const rl = readline.createInterface({ input: process.stdin });
  let finalStarted = false;
  rl.on('line', async (line) => {
    const cmd = line.trim();
    if (cmd === 'stop') {
      stopping = true;
      await Promise.all(loops);
      emit({ ev: 'stopped' });
    } else if (cmd === 'final' && !finalStarted) {
      finalStarted = true;
      await Promise.all(clients.map((c) => c.final()));
      emit({ ev: 'done' });
      process.exit(0);
    }
  });
}

main().catch((e) => {
  console.error(e && e.stack || e);
  process.exit(1);
});
