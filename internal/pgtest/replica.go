package pgtest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// StandbyOptions configure StartStandby.
type StandbyOptions struct {
	// Sync adds the standby to the primary's synchronous_standby_names
	// ("ANY 1 (...)", so a commit waits for one of the primary's
	// synchronous standbys), sets synchronous_commit = on on the primary
	// and reloads it. StartStandby then returns once the primary reports
	// the standby as synchronous.
	Sync bool

	// NetNS puts the standby in a network namespace of its own, like
	// StartInNetNS; its primary must be reachable from there (see
	// StartInNetNS).
	NetNS bool
}

// StartStandby makes a new cluster from c with pg_basebackup -R (a
// streaming standby of c), on its own free port, own temp dir, own
// watchdog, and starts it; returns once it accepts connections and
// pg_is_in_recovery() is true and it streams from c (pg_stat_wal_receiver
// status 'streaming').
//
// Roles, databases and configuration files come from c; the standby's
// listen address, port, socket directory, pg_hba.conf and cluster_name are
// its own, and synchronous_standby_names copied from c is dropped.
func (c *Cluster) StartStandby(ctx context.Context, opts StandbyOptions) (*Cluster, error) {
	t0 := time.Now()
	s, err := newCluster(ctx, opts.NetNS)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*Cluster, error) {
		_ = s.Destroy()
		return nil, fmt.Errorf("pgtest: standby of %s: %w", c.Name, err)
	}
	if s.ns == nil {
		// A standby in the root namespace of a primary reachable through
		// the hub also listens on the hub's root address, so that clusters
		// in namespaces can reach it after a failover.
		if h := c.hubOf(); h != nil {
			s.hub = h.acquire()
		}
	}
	host, err := c.reachFrom(s)
	if err != nil {
		return fail(err)
	}
	if err := s.basebackup(ctx, c, host); err != nil {
		return fail(err)
	}
	if err := s.configure(c); err != nil {
		return fail(err)
	}
	if err := s.firstStart(ctx); err != nil {
		return fail(err)
	}
	if opts.Sync {
		if err := c.addSyncStandby(ctx, s.Name); err != nil {
			return fail(err)
		}
	}
	if err := s.waitStreaming(ctx); err != nil {
		return fail(err)
	}
	if opts.Sync {
		err := poll(ctx, "the standby to be synchronous", func(ctx context.Context) (bool, error) {
			var n int
			err := c.adminQueryRow(ctx, `SELECT count(*) FROM pg_stat_replication
				WHERE application_name = $1 AND sync_state IN ('sync', 'quorum')`, []any{s.Name}, &n)
			return n == 1, err
		})
		if err != nil {
			return fail(err)
		}
	}
	s.StartupTime = time.Since(t0)
	return s, nil
}

// Promote runs pg_ctl promote -w and returns once pg_is_in_recovery() is
// false. The new primary has no synchronous standbys.
func (c *Cluster) Promote(ctx context.Context) error {
	if out, err := c.run(ctx, "pg_ctl", "promote", "-D", c.Dir, "-w", "-t", "60"); err != nil {
		return fmt.Errorf("pgtest: pg_ctl promote %s: %w\n%s", c.Name, err, out)
	}
	err := poll(ctx, "promotion", func(ctx context.Context) (bool, error) {
		in, err := c.InRecovery(ctx)
		return err == nil && !in, err
	})
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.upstream = nil
	c.mu.Unlock()
	return nil
}

// StopImmediate stops the server with pg_ctl stop -m immediate (a crash);
// the data dir stays.
func (c *Cluster) StopImmediate() error {
	out, err := c.run(context.Background(), "pg_ctl", "stop", "-D", c.Dir, "-m", "immediate", "-w", "-t", "60")
	if err != nil {
		return fmt.Errorf("pgtest: pg_ctl stop -m immediate %s: %w\n%s", c.Name, err, out)
	}
	return nil
}

// Demote turns c (a primary, running or stopped) into a streaming standby
// of newPrimary: stops c with -m fast if it runs, runs pg_rewind against
// newPrimary when needed (after a crash), writes standby.signal and
// primary_conninfo pointing at newPrimary, starts it, and returns once it
// streams from newPrimary. Falls back to a fresh pg_basebackup when
// pg_rewind fails.
//
// pg_rewind always runs; it finds by itself whether c's WAL went past the
// point where newPrimary's timeline forked off ("no rewind required"
// otherwise), and first completes crash recovery if c was not shut down
// cleanly. c's synchronous_standby_names is dropped.
func (c *Cluster) Demote(ctx context.Context, newPrimary *Cluster) error {
	if c == newPrimary {
		return fmt.Errorf("pgtest: demote %s: it cannot follow itself", c.Name)
	}
	host, err := newPrimary.reachFrom(c)
	if err != nil {
		return fmt.Errorf("pgtest: demote %s: %w", c.Name, err)
	}
	running, err := c.isRunning(ctx)
	if err != nil {
		return err
	}
	if running {
		if out, err := c.run(ctx, "pg_ctl", "stop", "-D", c.Dir, "-m", "fast", "-w", "-t", "60"); err != nil {
			return fmt.Errorf("pgtest: demote %s: pg_ctl stop: %w\n%s", c.Name, err, out)
		}
	}
	// pg_rewind reads newPrimary's timeline from its pg_control, which a
	// promotion updates only with the checkpoint that follows it.
	if err := newPrimary.adminExec(ctx, "CHECKPOINT"); err != nil {
		return fmt.Errorf("pgtest: demote %s: %w", c.Name, err)
	}
	src := fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres sslmode=disable connect_timeout=10",
		host, newPrimary.Port)
	out, rewindErr := c.run(ctx, "pg_rewind", "--target-pgdata="+c.Dir, "--source-server="+src, "--no-sync")
	how := "pg_rewind"
	if rewindErr == nil && strings.Contains(string(out), "no rewind required") {
		how = "none"
	}
	if rewindErr != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("pgtest: demote %s: pg_rewind: %w\n%s", c.Name, rewindErr, out)
		}
		// Into a new directory, so that c keeps its data if newPrimary
		// cannot be reached either.
		how = "pg_basebackup"
		fresh := c.Dir + ".new"
		if err := os.RemoveAll(fresh); err != nil {
			return fmt.Errorf("pgtest: demote %s: %w", c.Name, err)
		}
		if err := c.basebackupTo(ctx, fresh, newPrimary, host); err != nil {
			_ = os.RemoveAll(fresh)
			return fmt.Errorf("pgtest: demote %s: pg_rewind failed (%v: %s), then %w",
				c.Name, rewindErr, strings.TrimSpace(string(out)), err)
		}
		if err := os.RemoveAll(c.Dir); err != nil {
			return fmt.Errorf("pgtest: demote %s: %w", c.Name, err)
		}
		if err := os.Rename(fresh, c.Dir); err != nil {
			return fmt.Errorf("pgtest: demote %s: %w", c.Name, err)
		}
	}
	if err := c.configure(newPrimary); err != nil {
		return fmt.Errorf("pgtest: demote %s: %w", c.Name, err)
	}
	if err := c.pgCtlStart(ctx); err != nil {
		return fmt.Errorf("pgtest: demote %s: %w", c.Name, err)
	}
	c.mu.Lock()
	c.lastRejoin, c.rewindOutput = how, string(out)
	c.mu.Unlock()
	return c.waitStreaming(ctx)
}

// Switchover moves the primary role from c to standby s cleanly: stops c -m
// fast, waits until s replayed c's shutdown checkpoint (all of c's WAL),
// promotes s, then Demote(c, s). No transaction committed on c is lost.
//
// s must be streaming from c when Switchover is called.
func (c *Cluster) Switchover(ctx context.Context, s *Cluster) error {
	var n int
	err := c.adminQueryRow(ctx, `SELECT count(*) FROM pg_stat_replication
		WHERE application_name = $1 AND state = 'streaming'`, []any{s.Name}, &n)
	if err != nil {
		return fmt.Errorf("pgtest: switchover %s -> %s: %w", c.Name, s.Name, err)
	}
	if n != 1 {
		return fmt.Errorf("pgtest: switchover %s -> %s: %s does not stream from %s", c.Name, s.Name, s.Name, c.Name)
	}
	if out, err := c.run(ctx, "pg_ctl", "stop", "-D", c.Dir, "-m", "fast", "-w", "-t", "60"); err != nil {
		return fmt.Errorf("pgtest: switchover %s -> %s: pg_ctl stop: %w\n%s", c.Name, s.Name, err, out)
	}
	cd, err := c.controlData(ctx)
	if err != nil {
		return err
	}
	if st := cd["Database cluster state"]; st != "shut down" {
		return fmt.Errorf("pgtest: switchover %s -> %s: after pg_ctl stop the cluster state is %q", c.Name, s.Name, st)
	}
	ckpt := cd["Latest checkpoint location"]
	// pg_last_wal_replay_lsn() is the end of the last record replayed: past
	// the checkpoint record's start once that record was replayed.
	err = poll(ctx, "the standby to replay the shutdown checkpoint "+ckpt, func(ctx context.Context) (bool, error) {
		var ok bool
		err := s.adminQueryRow(ctx, "SELECT coalesce(pg_last_wal_replay_lsn() > $1::pg_lsn, false)", []any{ckpt}, &ok)
		return ok, err
	})
	if err != nil {
		return fmt.Errorf("pgtest: switchover %s -> %s: %w", c.Name, s.Name, err)
	}
	if err := s.Promote(ctx); err != nil {
		return fmt.Errorf("pgtest: switchover %s -> %s: %w", c.Name, s.Name, err)
	}
	return c.Demote(ctx, s)
}

// InRecovery reports pg_is_in_recovery().
func (c *Cluster) InRecovery(ctx context.Context) (bool, error) {
	var in bool
	err := c.adminQueryRow(ctx, "SELECT pg_is_in_recovery()", nil, &in)
	return in, err
}

// PauseReplay calls pg_wal_replay_pause() on a standby and returns once
// replay is paused. The standby keeps receiving WAL.
func (c *Cluster) PauseReplay(ctx context.Context) error {
	if err := c.adminExec(ctx, "SELECT pg_wal_replay_pause()"); err != nil {
		return err
	}
	return c.waitPauseState(ctx, "paused")
}

// ResumeReplay calls pg_wal_replay_resume() on a standby.
func (c *Cluster) ResumeReplay(ctx context.Context) error {
	if err := c.adminExec(ctx, "SELECT pg_wal_replay_resume()"); err != nil {
		return err
	}
	return c.waitPauseState(ctx, "not paused")
}

func (c *Cluster) waitPauseState(ctx context.Context, want string) error {
	return poll(ctx, "replay to be "+want, func(ctx context.Context) (bool, error) {
		var st string
		err := c.adminQueryRow(ctx, "SELECT pg_get_wal_replay_pause_state()", nil, &st)
		return st == want, err
	})
}

// WaitReplayed waits until standby s has replayed everything c (the
// primary) has written so far (pg_current_wal_lsn() on c <=
// pg_last_wal_replay_lsn() on s).
//
// With synchronous_commit = off a commit's WAL may not be written yet, so on
// a primary WaitReplayed first commits a transaction that writes a logical
// message with synchronous_commit = local, which flushes all WAL before it.
// If c is itself a standby, its replay position is the target.
func (c *Cluster) WaitReplayed(ctx context.Context, s *Cluster) error {
	lsn, err := c.flushedLSN(ctx)
	if err != nil {
		return err
	}
	err = poll(ctx, fmt.Sprintf("%s to replay %s", s.Name, lsn), func(ctx context.Context) (bool, error) {
		var ok bool
		err := s.adminQueryRow(ctx, "SELECT coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false)", []any{lsn}, &ok)
		return ok, err
	})
	if err != nil {
		return fmt.Errorf("pgtest: wait replayed: %w", err)
	}
	return nil
}

// flushedLSN returns c's WAL position after making sure all WAL inserted so
// far is written (on a standby: its replay position).
func (c *Cluster) flushedLSN(ctx context.Context) (string, error) {
	conn, err := c.adminConnect(ctx)
	if err != nil {
		return "", err
	}
	defer conn.Close(context.Background())
	var in bool
	if err := conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&in); err != nil {
		return "", fmt.Errorf("pgtest: %s: %w", c.Name, err)
	}
	if !in {
		// The commit flushes only if the transaction wrote WAL of its own:
		// a transactional logical message (ignored by physical standbys).
		_, err := conn.Exec(ctx, "BEGIN; SET LOCAL synchronous_commit = local; "+
			"SELECT pg_logical_emit_message(true, 'pgtest', 'flush'); COMMIT")
		if err != nil {
			return "", fmt.Errorf("pgtest: %s: flush WAL: %w", c.Name, err)
		}
	}
	var lsn string
	err = conn.QueryRow(ctx, `SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()
		ELSE pg_current_wal_lsn() END::text`).Scan(&lsn)
	if err != nil {
		return "", fmt.Errorf("pgtest: %s: WAL position: %w", c.Name, err)
	}
	return lsn, nil
}

// StopWALReceiver makes standby c stop receiving WAL (so it misses the
// primary's next commits) until StartWALReceiver: it sets primary_conninfo
// to ” (ALTER SYSTEM, pg_reload_conf()) and waits until
// pg_stat_wal_receiver is empty.
func (c *Cluster) StopWALReceiver(ctx context.Context) error {
	if in, err := c.InRecovery(ctx); err != nil {
		return err
	} else if !in {
		return fmt.Errorf("pgtest: stop WAL receiver: %s is not a standby", c.Name)
	}
	if err := c.adminExec(ctx, "ALTER SYSTEM SET primary_conninfo = ''", "SELECT pg_reload_conf()"); err != nil {
		return err
	}
	return poll(ctx, "the WAL receiver to stop", func(ctx context.Context) (bool, error) {
		var n int
		err := c.adminQueryRow(ctx, "SELECT count(*) FROM pg_stat_wal_receiver", nil, &n)
		return n == 0, err
	})
}

// StartWALReceiver undoes StopWALReceiver: it restores primary_conninfo and
// waits until c streams from its primary again.
func (c *Cluster) StartWALReceiver(ctx context.Context) error {
	c.mu.Lock()
	ci := c.conninfo
	c.mu.Unlock()
	if ci == "" {
		return fmt.Errorf("pgtest: %s is not a standby made by pgtest", c.Name)
	}
	if err := c.adminExec(ctx, "ALTER SYSTEM SET primary_conninfo = "+quoteLiteral(ci), "SELECT pg_reload_conf()"); err != nil {
		return err
	}
	return c.waitStreaming(ctx)
}

// ---- internals ----

// basebackup copies primary into c.Dir (which must not exist) with
// pg_basebackup -R, connecting to host.
func (c *Cluster) basebackup(ctx context.Context, primary *Cluster, host string) error {
	return c.basebackupTo(ctx, c.Dir, primary, host)
}

func (c *Cluster) basebackupTo(ctx context.Context, dir string, primary *Cluster, host string) error {
	dsn := fmt.Sprintf("host=%s port=%d user=postgres sslmode=disable connect_timeout=10", host, primary.Port)
	out, err := c.run(ctx, "pg_basebackup", "-D", dir, "-d", dsn,
		"-X", "stream", "-c", "fast", "-R", "--no-sync")
	if err != nil {
		return fmt.Errorf("pg_basebackup from %s: %w\n%s", primary.Name, err, out)
	}
	return nil
}

// configure writes what belongs to this node rather than to the data it
// holds: pgtest_node.conf and pg_hba.conf, and, in postgresql.auto.conf,
// primary_conninfo (primary non-nil: c becomes its standby, with
// standby.signal) without synchronous_standby_names. The server must be
// stopped.
func (c *Cluster) configure(primary *Cluster) error {
	if err := c.writeNodeConf(); err != nil {
		return err
	}
	if err := c.writeFile(filepath.Join(c.Dir, "pg_hba.conf"), c.hba(), false); err != nil {
		return err
	}
	ci := ""
	if primary != nil {
		host, err := primary.reachFrom(c)
		if err != nil {
			return err
		}
		ci = fmt.Sprintf("host=%s port=%d user=postgres application_name=%s sslmode=disable connect_timeout=5",
			host, primary.Port, c.Name)
	}
	auto := filepath.Join(c.Dir, "postgresql.auto.conf")
	b, err := os.ReadFile(auto)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("pgtest: %w", err)
	}
	var kept strings.Builder
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for sc.Scan() {
		line := sc.Text()
		key, _, _ := strings.Cut(strings.TrimSpace(line), "=")
		switch strings.ToLower(strings.TrimSpace(key)) {
		case "primary_conninfo", "primary_slot_name", "synchronous_standby_names":
			continue
		}
		kept.WriteString(line + "\n")
	}
	if ci != "" {
		kept.WriteString("primary_conninfo = " + quoteLiteral(ci) + "\n")
	}
	if err := c.writeFile(auto, kept.String(), false); err != nil {
		return err
	}
	for _, f := range []string{"standby.signal", "recovery.signal"} {
		if err := os.Remove(filepath.Join(c.Dir, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("pgtest: %w", err)
		}
	}
	if primary != nil {
		if err := c.writeFile(filepath.Join(c.Dir, "standby.signal"), "", false); err != nil {
			return err
		}
	}
	c.mu.Lock()
	c.conninfo, c.upstream, c.syncNames = ci, primary, nil
	c.mu.Unlock()
	return nil
}

func (c *Cluster) writeNodeConf() error {
	listen := c.Host
	if c.hub != nil {
		listen += "," + c.hub.rootAddr()
	}
	conf := fmt.Sprintf(`# written by pgtest for this node; pg_basebackup and pg_rewind copies are rewritten
cluster_name = '%s'
listen_addresses = '%s'
unix_socket_directories = '%s'
port = %d
`, c.Name, listen, c.SocketDir, c.Port)
	return c.writeFile(filepath.Join(c.Dir, nodeConf), conf, false)
}

// hba is the node's pg_hba.conf: trust for postgres (also for
// replication) and SCRAM for everyone else, over the unix socket and from
// 127.0.0.1 (and the hub's network when the node is reachable through it).
func (c *Cluster) hba() string {
	nets := []string{"127.0.0.1/32"}
	if h := c.hubOf(); h != nil {
		nets = append(nets, h.network())
	}
	var b strings.Builder
	b.WriteString("# written by pgtest\n" +
		"local all         all                trust\n" +
		"local replication postgres           trust\n")
	for _, n := range nets {
		fmt.Fprintf(&b, "host  all         postgres %-14s trust\n", n)
		fmt.Fprintf(&b, "host  replication postgres %-14s trust\n", n)
		fmt.Fprintf(&b, "host  all         all      %-14s scram-sha-256\n", n)
	}
	return b.String()
}

// addSyncStandby adds name to c's synchronous_standby_names.
func (c *Cluster) addSyncStandby(ctx context.Context, name string) error {
	c.mu.Lock()
	names := append(append([]string(nil), c.syncNames...), name)
	c.mu.Unlock()
	quoted := make([]string, len(names))
	for i, n := range names {
		quoted[i] = pgx.Identifier{n}.Sanitize()
	}
	ssn := "ANY 1 (" + strings.Join(quoted, ", ") + ")"
	err := c.adminExec(ctx, "ALTER SYSTEM SET synchronous_standby_names = "+quoteLiteral(ssn),
		"ALTER SYSTEM SET synchronous_commit = 'on'", "SELECT pg_reload_conf()")
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.syncNames = names
	c.mu.Unlock()
	return nil
}

// waitStreaming waits until c is in recovery and its WAL receiver streams
// from its upstream's address.
func (c *Cluster) waitStreaming(ctx context.Context) error {
	c.mu.Lock()
	up := c.upstream
	c.mu.Unlock()
	if up == nil {
		return fmt.Errorf("pgtest: %s is not a standby made by pgtest", c.Name)
	}
	host, err := up.reachFrom(c)
	if err != nil {
		return err
	}
	err = poll(ctx, fmt.Sprintf("%s to stream from %s (%s:%d)", c.Name, up.Name, host, up.Port), func(ctx context.Context) (bool, error) {
		var ok bool
		err := c.adminQueryRow(ctx, `SELECT pg_is_in_recovery() AND coalesce((SELECT status = 'streaming'
			AND sender_host = $1 AND sender_port = $2 FROM pg_stat_wal_receiver), false)`,
			[]any{host, up.Port}, &ok)
		return ok, err
	})
	if err != nil {
		return fmt.Errorf("pgtest: %w\n--- server log of %s ---\n%s", err, c.Name, tail(c.Log(), 2000))
	}
	return nil
}

// adminConnect connects as postgres over the unix socket, which works
// while the cluster is partitioned.
func (c *Cluster) adminConnect(ctx context.Context) (*pgx.Conn, error) {
	conn, err := pgx.Connect(ctx, fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres sslmode=disable",
		quoteDSN(c.SocketDir), c.Port))
	if err != nil {
		return nil, fmt.Errorf("pgtest: connect to %s: %w", c.Name, err)
	}
	return conn, nil
}

// adminExec runs statements, one at a time (ALTER SYSTEM refuses to run
// in the implicit transaction of a multi-statement query), on the unix
// socket.
func (c *Cluster) adminExec(ctx context.Context, stmts ...string) error {
	conn, err := c.adminConnect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	for _, sql := range stmts {
		if _, err := conn.Exec(ctx, sql); err != nil {
			return fmt.Errorf("pgtest: %s: %q: %w", c.Name, sql, err)
		}
	}
	return nil
}

// adminQueryRow runs a one-row query on the unix socket.
func (c *Cluster) adminQueryRow(ctx context.Context, sql string, args []any, dest ...any) error {
	conn, err := c.adminConnect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if err := conn.QueryRow(ctx, sql, args...).Scan(dest...); err != nil {
		return fmt.Errorf("pgtest: %s: %q: %w", c.Name, sql, err)
	}
	return nil
}

// poll calls cond until it reports true with a nil error; meanwhile errors
// count as "not yet". It gives up when ctx ends.
func poll(ctx context.Context, what string, cond func(context.Context) (bool, error)) error {
	delay := 5 * time.Millisecond
	for {
		ok, err := cond(ctx)
		if ok && err == nil {
			return nil
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			if err != nil {
				return fmt.Errorf("pgtest: waiting for %s: %w (last error: %v)", what, ctx.Err(), err)
			}
			return fmt.Errorf("pgtest: waiting for %s: %w", what, ctx.Err())
		case <-t.C:
		}
		if delay < 100*time.Millisecond {
			delay *= 2
		}
	}
}

// isRunning asks pg_ctl status whether a server runs on c.Dir.
func (c *Cluster) isRunning(ctx context.Context) (bool, error) {
	out, err := c.run(ctx, "pg_ctl", "status", "-D", c.Dir)
	if err == nil {
		return true, nil
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == 3 {
		return false, nil
	}
	return false, fmt.Errorf("pgtest: pg_ctl status %s: %w\n%s", c.Name, err, out)
}

// controlData returns pg_controldata's fields.
func (c *Cluster) controlData(ctx context.Context) (map[string]string, error) {
	out, err := c.run(ctx, "pg_controldata", "-D", c.Dir)
	if err != nil {
		return nil, fmt.Errorf("pgtest: pg_controldata %s: %w\n%s", c.Name, err, out)
	}
	m := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			m[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	return m, nil
}

// reachFrom returns the host at which client reaches c: c.Host, except
// that a cluster in a namespace reaches one in the root namespace at the
// hub's root address, if it listens there.
func (c *Cluster) reachFrom(client *Cluster) (string, error) {
	if c.ns != nil || client.ns == nil {
		return c.Host, nil
	}
	if c.hub != nil && c.hub == client.ns.hub {
		return c.hub.rootAddr(), nil
	}
	return "", fmt.Errorf("%s, in the root network namespace, is not reachable from %s, in a namespace of its own "+
		"(only standbys of clusters in namespaces also listen where namespaces reach them)", c.Name, client.Name)
}

// hubOf returns the hub c is reachable through, or nil.
func (c *Cluster) hubOf() *hub {
	if c.ns != nil {
		return c.ns.hub
	}
	return c.hub
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}
