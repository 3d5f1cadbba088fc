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
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrUnavailable is wrapped by the error Start returns when no PostgreSQL
// server binaries can be found.
var ErrUnavailable = errors.New("pgtest: PostgreSQL server binaries not available")

// Cluster is one running (or stopped) PostgreSQL cluster.
type Cluster struct {
	Host      string // always "127.0.0.1"
	Port      int
	Dir       string // data directory
	SocketDir string // unix_socket_directories
	BinDir    string // directory holding initdb, pg_ctl, postgres

	// StartupTime is how long Start took (initdb + first start).
	StartupTime time.Duration

	base    string              // temp dir holding Dir, SocketDir and the log
	logFile string              // server log (pg_ctl -l)
	cred    *syscall.Credential // non-nil when running server commands as "postgres"

	mu        sync.Mutex
	destroyed bool
	watchW    *os.File  // write end of the watchdog's stdin
	watchCmd  *exec.Cmd // watchdog process
}

// Start creates and starts a fresh cluster. It returns once the server
// accepts connections.
func Start(ctx context.Context) (*Cluster, error) {
	t0 := time.Now()
	bin, err := findBinDir()
	if err != nil {
		return nil, err
	}
	c := &Cluster{Host: "127.0.0.1", BinDir: bin}

	if os.Geteuid() == 0 {
		cred, err := postgresCredential()
		if err != nil {
			return nil, err
		}
		c.cred = cred
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

	if err := c.startWatchdog(); err != nil {
		return fail(err)
	}

	if out, err := c.run(ctx, "initdb",
		"-D", c.Dir, "-U", "postgres", "-E", "UTF8", "--locale=C",
		"-A", "trust", "--no-sync", "--no-instructions"); err != nil {
		return fail(fmt.Errorf("pgtest: initdb: %w\n%s", err, out))
	}

	hba := "# written by pgtest\n" +
		"local all all                trust\n" +
		"host  all postgres 127.0.0.1/32 trust\n" +
		"host  all all      127.0.0.1/32 scram-sha-256\n"
	if err := c.writeFile(filepath.Join(c.Dir, "pg_hba.conf"), hba, false); err != nil {
		return fail(err)
	}
	conf := fmt.Sprintf(`
# --- pgtest ---
listen_addresses = '127.0.0.1'
unix_socket_directories = '%s'
max_connections = 300
shared_buffers = 32MB
fsync = off
synchronous_commit = off
full_page_writes = off
huge_pages = off
password_encryption = 'scram-sha-256'
logging_collector = off
log_line_prefix = '%%m [%%p] %%q%%u@%%d '
lc_messages = 'C'
`, c.SocketDir)
	if err := c.writeFile(filepath.Join(c.Dir, "postgresql.conf"), conf, true); err != nil {
		return fail(err)
	}

	// A port can be grabbed by someone else between picking and binding it;
	// retry a few times with a new one. The last "port =" line wins.
	for attempt := 0; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return fail(err)
		}
		c.Port = port
		if err := c.writeFile(filepath.Join(c.Dir, "postgresql.conf"), fmt.Sprintf("port = %d\n", port), true); err != nil {
			return fail(err)
		}
		err = c.pgCtlStart(ctx)
		if err == nil {
			break
		}
		if attempt < 2 && strings.Contains(c.Log(), "could not bind") {
			continue
		}
		return fail(err)
	}
	c.StartupTime = time.Since(t0)
	return c, nil
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
	if c.Dir != "" && c.running() {
		if out, err := c.run(context.Background(), "pg_ctl", "stop", "-D", c.Dir, "-m", "fast", "-w", "-t", "60"); err != nil {
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
	c.stopWatchdog()
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
func (c *Cluster) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(c.BinDir, name), args...)
	cmd.Dir = c.base // the caller's cwd may be unreadable for postgres
	cmd.Env = append(os.Environ(), "LC_ALL=C", "LANG=C")
	if c.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
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

// startWatchdog starts a helper in its own process group that reads its
// stdin. Destroy writes a line to it; if instead the pipe hits EOF (the test
// process died without Destroy) it stops the server and removes the files.
func (c *Cluster) startWatchdog() error {
	r, w, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	script := `if read -r _; then exit 0; fi
"$1/pg_ctl" stop -D "$2" -m immediate -w -t 30 >/dev/null 2>&1
rm -rf "$3"`
	cmd := exec.Command("/bin/sh", "-c", script, "pgtest-watchdog", c.BinDir, c.Dir, c.base)
	cmd.Dir = c.base
	cmd.Stdin = r
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: c.cred}
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return fmt.Errorf("pgtest: start watchdog: %w", err)
	}
	r.Close()
	c.watchW, c.watchCmd = w, cmd
	return nil
}

func (c *Cluster) stopWatchdog() {
	if c.watchW == nil {
		return
	}
	_, _ = c.watchW.WriteString("done\n")
	_ = c.watchW.Close()
	_ = c.watchCmd.Wait()
	c.watchW, c.watchCmd = nil, nil
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
