'use strict';
// One graphile-worker process of the worker fleet in
// integration/workers_graphile_test.go.
//
// Environment:
//   DATABASE_URL   where to connect: PostgreSQL directly, or lockpool (required)
//   MODE           "migrate": install graphile-worker's schema and exit;
//                  "work" (the default): run a worker until stdin closes
//   WORKER_ID      this process's number, recorded with each run (work)
//   CONCURRENCY    jobs at once (default 5)
//   POLL_INTERVAL  ms between polls for jobs when idle (default 20000: the
//                  test wants notifications, not polls, to start the jobs)
//   MAX_POOL       the pg pool's size (default CONCURRENCY + 1: the LISTEN
//                  client and one per job)
//
// Prints, one per line on stdout:
//   ready                      run() has returned
//   notified <channel> <count> a notification reached the LISTEN client; count
//                              is its payload's count (add_job: 1, the
//                              test's probes: 0)
//   run <job id> <seq> <µs>    task "job" started: its id, payload.seq, and
//                              the µs since payload.insertedAtUs (Unix µs)
// Task "job" also inserts a row into graphile_runs through the pool.

const { run, runMigrations, Logger } = require('graphile-worker');
const { EventEmitter } = require('events');
const { performance } = require('perf_hooks');

const connectionString = process.env.DATABASE_URL;
if (!connectionString) {
  console.error('DATABASE_URL must be set');
  process.exit(2);
}

// Warnings and errors go to stderr; graphile-worker's info lines (one per
// job) would only slow the fleet down.
const logger = new Logger((scope) => (level, message) => {
  if (level === 'error' || level === 'warning') {
    process.stderr.write(`graphile-worker ${level}: ${message}\n`);
  }
});

function nowUs() {
  return Math.round((performance.timeOrigin + performance.now()) * 1000);
}

async function main() {
  if (process.env.MODE === 'migrate') {
    await runMigrations({ connectionString, logger });
    return;
  }
  const proc = Number(process.env.WORKER_ID || 0);
  const concurrency = Number(process.env.CONCURRENCY || 5);
  const events = new EventEmitter();
  events.on('pool:listen:notification', ({ message }) => {
    let count = '-';
    try {
      count = String(JSON.parse(message.payload).count);
    } catch (e) {
      // not JSON: counted as '-'
    }
    process.stdout.write(`notified ${message.channel} ${count}\n`);
  });
  const runner = await run({
    connectionString,
    concurrency,
    maxPoolSize: Number(process.env.MAX_POOL || concurrency + 1),
    pollInterval: Number(process.env.POLL_INTERVAL || 20000),
    noHandleSignals: true,
    logger,
    events,
    taskList: {
      job: async (payload, helpers) => {
        const latency = nowUs() - Number(payload.insertedAtUs);
        process.stdout.write(`run ${helpers.job.id} ${payload.seq} ${latency}\n`);
        await helpers.query('INSERT INTO graphile_runs (job_id, seq, proc) VALUES ($1, $2, $3)', [
          helpers.job.id,
          payload.seq,
          proc,
        ]);
      },
    },
  });
  process.stdout.write('ready\n');
  process.stdin.on('end', () => {
    runner.stop().catch((e) => {
      console.error(e);
      process.exitCode = 1;
    });
  });
  process.stdin.resume();
  await runner.promise;
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
