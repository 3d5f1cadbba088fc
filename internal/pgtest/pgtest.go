package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrUnavailable is wrapped by the error Start returns when no PostgreSQL
// server binaries can be found.
var ErrUnavailable = errors.New("pgtest: PostgreSQL server binaries not available")

// Cluster is one running (or stopped) PostgreSQL cluster.
type Cluster struct {
	Host      string // address clients use: "127.0.0.1", or the namespace's address for StartInNetNS
	Port      int
	Dir       string // data directory
	SocketDir string // unix_socket_directories
	BinDir    string // directory holding initdb, pg_ctl, postgres

	// Name is the cluster's cluster_name, and the application_name it uses
	// when it streams as a standby (so it names it in the primary's
	// pg_stat_replication and synchronous_standby_names).
	Name string

	// StartupTime is how long Start (initdb + first start) or StartStandby
	// (pg_basebackup + first start) took.
	StartupTime time.Duration

	base    string              // temp dir holding Dir, SocketDir and the log
	logFile string              // server log (pg_ctl -l)
	cred    *syscall.Credential // non-nil when running server commands as "postgres"

	ns  *netNS // non-nil for a cluster living in a network namespace
	hub *hub   // for a cluster in the root namespace: hub whose address it also listens on

	mu           sync.Mutex
	destroyed    bool
	watch        *watchdog // stops the server and removes base if the test process dies
	conninfo     string    // primary_conninfo while a standby, else ""
	upstream     *Cluster  // the primary while a standby, else nil
	syncNames    []string  // standbys added by StartStandby with Sync
	lastRejoin   string    // how Demote brought the data directory in line: "pg_rewind" or "pg_basebackup"
	rewindOutput string    // of Demote's pg_rewind
	partitioned  bool      // between Partition and Heal
}

var clusterSeq atomic.Int64

// Start creates and starts a fresh cluster. It returns once the server
// accepts connections.
func Start(ctx context.Context) (*Cluster, error) {
	return start(ctx, false)
}

func start(ctx context.Context, inNetNS bool) (*Cluster, error) {
	t0 := time.Now()
	c, err := newCluster(ctx, inNetNS)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*Cluster, error) {
		_ = c.Destroy()
		return nil, err
	}
	if out, err := c.run(ctx, "initdb",
		"-D", c.Dir, "-U", "postgres", "-E", "UTF8", "--locale=C",
		"-A", "trust", "--no-sync", "--no-instructions"); err != nil {
		return fail(fmt.Errorf("pgtest: initdb: %w\n%s", err, out))
	}
	conf := `
# --- pgtest ---
max_connections = 300
shared_buffers = 32MB
fsync = off
synchronous_commit = off
full_page_writes = on       # pg_rewind refuses a source without it
huge_pages = off
password_encryption = 'scram-sha-256'
logging_collector = off
log_line_prefix = '%m [%p] %q%u@%d '
lc_messages = 'C'
# ready to be a primary, or a standby
wal_level = replica
max_wal_senders = 10
wal_log_hints = on          # so pg_rewind works after a crash
hot_standby = on
wal_keep_size = 256MB       # so a standby that paused does not lose WAL
wal_retrieve_retry_interval = 200ms
# listen_addresses, port, unix_socket_directories, cluster_name: per node
include '` + nodeConf + `'
`
	if err := c.writeFile(filepath.Join(c.Dir, "postgresql.conf"), conf, true); err != nil {
		return fail(err)
	}
	if err := c.configure(nil); err != nil {
		return fail(err)
	}
	if err := c.firstStart(ctx); err != nil {
		return fail(err)
	}
	c.StartupTime = time.Since(t0)
	return c, nil
}

// nodeConf is the file, included at the end of postgresql.conf, that holds
// the settings a copy of the data directory (pg_basebackup, pg_rewind)
// must not inherit.
const nodeConf = "pgtest_node.conf"

// newCluster makes the directories and the watchdog of a cluster (and its
// network namespace), without a data directory.
func newCluster(ctx context.Context, inNetNS bool) (*Cluster, error) {
	bin, err := findBinDir()
	if err != nil {
		return nil, err
	}
	c := &Cluster{
		Host:   "127.0.0.1",
		BinDir: bin,
		Name:   fmt.Sprintf("pgtest%d_%d", os.Getpid(), clusterSeq.Add(1)),
	}
	if os.Geteuid() == 0 {
		cred, err := postgresCredential()
		if err != nil {
			return nil, err
		}
		c.cred = cred
	} else if inNetNS {
		return nil, fmt.Errorf("%w: network namespaces need root", ErrUnavailable)
	}

	parent := os.TempDir()
	if c.cred != nil && !searchableByOthers(parent) {
		parent = "/tmp"
	}
	base, err := os.MkdirTemp(parent, "pgtest-")
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	c.base = base
	c.Dir = filepath.Join(base, "data")
	c.SocketDir = filepath.Join(base, "sock")
	c.logFile = filepath.Join(base, "postgres.log")
	fail := func(err error) (*Cluster, error) {
		_ = c.Destroy()
		return nil, err
	}
	if err := os.Mkdir(c.SocketDir, 0o700); err != nil {
		return fail(fmt.Errorf("pgtest: %w", err))
	}
	if c.cred != nil {
		for _, p := range []string{base, c.SocketDir} {
			if err := os.Chown(p, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
				return fail(fmt.Errorf("pgtest: %w", err))
			}
		}
		if err := os.Chmod(base, 0o755); err != nil {
			return fail(fmt.Errorf("pgtest: %w", err))
		}
	}

	script := `if read -r _; then exit 0; fi
"$1/pg_ctl" stop -D "$2" -m immediate -w -t 30 >/dev/null 2>&1
rm -rf "$3"`
	c.watch, err = startWatchdog(c.base, c.cred, script, c.BinDir, c.Dir, c.base)
	if err != nil {
		return fail(err)
	}
	if inNetNS {
		if c.ns, err = newNetNS(ctx); err != nil {
			return fail(err)
		}
		c.Host = c.ns.addr
	}
	return c, nil
}

// firstStart picks a port (a free one on 127.0.0.1; 5432 in a namespace of
// its own), writes the node's configuration and starts the server.
func (c *Cluster) firstStart(ctx context.Context) error {
	// A port can be grabbed by someone else between picking and binding it;
	// retry a few times with a new one.
	for attempt := 0; ; attempt++ {
		if c.ns != nil {
			c.Port = 5432
		} else {
			port, err := freePort()
			if err != nil {
				return err
			}
			c.Port = port
		}
		if err := c.writeNodeConf(); err != nil {
			return err
		}
		err := c.pgCtlStart(ctx)
		if err == nil {
			return nil
		}
		if c.ns == nil && attempt < 2 && strings.Contains(c.Log(), "could not bind") {
			continue
		}
		return err
	}
}

// Stop stops the server (pg_ctl stop -m fast). The data directory is kept,
// so StartAgain can bring it back.
func (c *Cluster) Stop() error {
	out, err := c.run(context.Background(), "pg_ctl", "stop", "-D", c.Dir, "-m", "fast", "-w", "-t", "60")
	if err != nil {
		return fmt.Errorf("pgtest: pg_ctl stop: %w\n%s", err, out)
	}
	return nil
}

// StartAgain starts a stopped cluster on the same directory and port.
func (c *Cluster) StartAgain() error {
	return c.pgCtlStart(context.Background())
}

// Restart stops and starts the server.
func (c *Cluster) Restart() error {
	if err := c.Stop(); err != nil {
		return err
	}
	return c.StartAgain()
}

// Destroy stops the server if it runs and removes all its directories.
// It is safe to call more than once.
func (c *Cluster) Destroy() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.destroyed {
		return nil
	}
	c.destroyed = true
	var errs []error
	mode := "fast"
	if c.partitioned {
		// A walsender would wait up to wal_sender_timeout for standbys it
		// cannot reach.
		mode = "immediate"
	}
	if c.Dir != "" && c.running() {
		if out, err := c.run(context.Background(), "pg_ctl", "stop", "-D", c.Dir, "-m", mode, "-w", "-t", "60"); err != nil {
			errs = append(errs, fmt.Errorf("pgtest: pg_ctl stop: %w\n%s", err, out))
			// Last resort so the directory can go away.
			_, _ = c.run(context.Background(), "pg_ctl", "stop", "-D", c.Dir, "-m", "immediate", "-w", "-t", "30")
		}
	}
	if c.base != "" {
		if err := os.RemoveAll(c.base); err != nil {
			errs = append(errs, fmt.Errorf("pgtest: %w", err))
		}
	}
	c.watch.stop()
	if c.ns != nil {
		if err := c.ns.destroy(); err != nil {
			errs = append(errs, err)
		}
	}
	if c.hub != nil {
		c.hub.release()
		c.hub = nil
	}
	return errors.Join(errs...)
}

// PostmasterPID returns the postmaster's process id from postmaster.pid.
func (c *Cluster) PostmasterPID() (int, error) {
	b, err := os.ReadFile(filepath.Join(c.Dir, "postmaster.pid"))
	if err != nil {
		return 0, fmt.Errorf("pgtest: %w", err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		return 0, fmt.Errorf("pgtest: bad postmaster.pid: %w", err)
	}
	return pid, nil
}

// SuperuserDSN is a keyword/value DSN for the superuser "postgres" over TCP
// (trust auth).
func (c *Cluster) SuperuserDSN(db string) string {
	return fmt.Sprintf("host=%s port=%d user=postgres dbname=%s sslmode=disable",
		c.Host, c.Port, quoteDSN(db))
}

// DSN is a keyword/value DSN for user over TCP (SCRAM unless user is
// "postgres").
func (c *Cluster) DSN(user, password, db string) string {
	return fmt.Sprintf("host=%s port=%d user=%s password=%s dbname=%s sslmode=disable",
		c.Host, c.Port, quoteDSN(user), quoteDSN(password), quoteDSN(db))
}

// Exec runs sql in database db as the superuser on a new connection. Without
// args the simple protocol is used, so sql may hold several statements.
func (c *Cluster) Exec(ctx context.Context, db, sql string, args ...any) error {
	conn, err := pgx.Connect(ctx, c.SuperuserDSN(db))
	if err != nil {
		return fmt.Errorf("pgtest: connect: %w", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		return fmt.Errorf("pgtest: exec %q: %w", sql, err)
	}
	return nil
}

// CreateRole creates a LOGIN role with a SCRAM-SHA-256 password.
func (c *Cluster) CreateRole(ctx context.Context, name, password string) error {
	sql := "SET password_encryption = 'scram-sha-256'; CREATE ROLE " +
		pgx.Identifier{name}.Sanitize() + " LOGIN PASSWORD " + quoteLiteral(password)
	return c.Exec(ctx, "postgres", sql)
}

// CreateDatabase creates database name owned by owner ("" = postgres).
func (c *Cluster) CreateDatabase(ctx context.Context, name, owner string) error {
	sql := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize()
	if owner != "" {
		sql += " OWNER " + pgx.Identifier{owner}.Sanitize()
	}
	return c.Exec(ctx, "postgres", sql)
}

// Log returns the server log so far (for failure messages).
func (c *Cluster) Log() string {
	b, err := os.ReadFile(c.logFile)
	if err != nil {
		return fmt.Sprintf("(pgtest: cannot read server log: %v)", err)
	}
	return string(b)
}

// ---- internals ----

func (c *Cluster) pgCtlStart(ctx context.Context) error {
	out, err := c.run(ctx, "pg_ctl", "start", "-D", c.Dir, "-l", c.logFile, "-w", "-t", "60")
	if err != nil {
		return fmt.Errorf("pgtest: pg_ctl start: %w\n%s\n--- server log ---\n%s", err, out, c.Log())
	}
	return nil
}

func (c *Cluster) running() bool {
	_, err := os.Stat(filepath.Join(c.Dir, "postmaster.pid"))
	return err == nil
}

// command builds a command for a server binary, run as "postgres" when we
// are root.
//
// For a cluster in a network namespace the command runs inside it (nsenter
// enters the namespace as root, then becomes "postgres"), so a server it
// starts listens there and pg_basebackup or pg_rewind connect from there.
func (c *Cluster) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	var cmd *exec.Cmd
	if c.ns != nil {
		pre := []string{"--net=" + c.ns.path(),
			"-S", strconv.Itoa(int(c.cred.Uid)), "-G", strconv.Itoa(int(c.cred.Gid)),
			"--", filepath.Join(c.BinDir, name)}
		cmd = exec.CommandContext(ctx, "nsenter", append(pre, args...)...)
	} else {
		cmd = exec.CommandContext(ctx, filepath.Join(c.BinDir, name), args...)
		if c.cred != nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
		}
	}
	cmd.Dir = c.base // the caller's cwd may be unreadable for postgres
	cmd.Env = append(os.Environ(), "LC_ALL=C", "LANG=C")
	if c.cred != nil {
		cmd.Env = append(cmd.Env, "HOME="+c.base, "USER=postgres", "LOGNAME=postgres")
	}
	return cmd
}

func (c *Cluster) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := c.command(ctx, name, args...)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	return out.Bytes(), err
}

// writeFile writes (or appends to) a file in the data directory, keeping
// its ownership.
func (c *Cluster) writeFile(path, content string, appendTo bool) error {
	flag := os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	if appendTo {
		flag = os.O_WRONLY | os.O_CREATE | os.O_APPEND
	}
	f, err := os.OpenFile(path, flag, 0o600)
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	if _, err := f.WriteString(content); err != nil {
		f.Close()
		return fmt.Errorf("pgtest: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	if c.cred != nil {
		if err := os.Chown(path, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			return fmt.Errorf("pgtest: %w", err)
		}
	}
	return nil
}

// watchdog is a helper shell in its own process group that reads its stdin.
// stop writes a line to it and it exits; if instead the pipe hits EOF (the
// test process died) it runs its clean-up script.
type watchdog struct {
	w   *os.File  // write end of the watchdog's stdin
	cmd *exec.Cmd // watchdog process
}

// startWatchdog starts a watchdog running script (which must begin with
// `if read -r _; then exit 0; fi`) with args as $1... in dir, as cred (nil:
// as ourselves).
func startWatchdog(dir string, cred *syscall.Credential, script string, args ...string) (*watchdog, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	cmd := exec.Command("/bin/sh", append([]string{"-c", script, "pgtest-watchdog"}, args...)...)
	cmd.Dir = dir
	cmd.Stdin = r
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: cred}
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return nil, fmt.Errorf("pgtest: start watchdog: %w", err)
	}
	r.Close()
	return &watchdog{w: w, cmd: cmd}, nil
}

// stop tells the watchdog to exit without cleaning up. A nil watchdog is
// fine.
func (wd *watchdog) stop() {
	if wd == nil || wd.w == nil {
		return
	}
	_, _ = wd.w.WriteString("done\n")
	_ = wd.w.Close()
	_ = wd.cmd.Wait()
	wd.w, wd.cmd = nil, nil
}

func findBinDir() (string, error) {
	ok := func(dir string) bool {
		for _, b := range []string{"initdb", "pg_ctl", "postgres"} {
			if fi, err := os.Stat(filepath.Join(dir, b)); err != nil || fi.IsDir() {
				return false
			}
		}
		return true
	}
	if d := os.Getenv("PGTEST_BINDIR"); d != "" {
		if ok(d) {
			return d, nil
		}
		return "", fmt.Errorf("%w: PGTEST_BINDIR=%s lacks initdb/pg_ctl/postgres", ErrUnavailable, d)
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		if d := strings.TrimSpace(string(out)); ok(d) {
			return d, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return versionOf(dirs[i]) > versionOf(dirs[j]) })
	for _, d := range dirs {
		if ok(d) {
			return d, nil
		}
	}
	if d, err := exec.LookPath("pg_ctl"); err == nil && ok(filepath.Dir(d)) {
		return filepath.Dir(d), nil
	}
	return "", fmt.Errorf("%w: no initdb/pg_ctl/postgres via $PGTEST_BINDIR, pg_config --bindir, /usr/lib/postgresql/*/bin or $PATH (install postgresql-15)", ErrUnavailable)
}

func versionOf(binDir string) float64 {
	v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(binDir)), 64)
	return v
}

func postgresCredential() (*syscall.Credential, error) {
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("%w: running as root but there is no \"postgres\" system user to run the server as: %v", ErrUnavailable, err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("pgtest: bad uid/gid for postgres: %s/%s", u.Uid, u.Gid)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, nil
}

// searchableByOthers reports whether every directory from / to dir has the
// "other" execute bit, so the postgres user can reach a subdirectory.
func searchableByOthers(dir string) bool {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return false
	}
	for {
		fi, err := os.Stat(dir)
		if err != nil || fi.Mode().Perm()&0o001 == 0 {
			return false
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return true
		}
		dir = parent
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgtest: free port: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	return port, nil
}

// quoteDSN quotes a keyword/value DSN value when needed.
func quoteDSN(v string) string {
	if v != "" && !strings.ContainsAny(v, " \t\n\r\\'=") {
		return v
	}
	r := strings.NewReplacer(`\`, `\\`, `'`, `\'`)
	return "'" + r.Replace(v) + "'"
}

// quoteLiteral makes a SQL string literal (standard_conforming_strings on).
func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}
