package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockpool/lockpool/internal/pgtest"
)

const (
	benchUser     = "bench"
	benchPassword = "bench-secret"
	benchDB       = "bench"
)

// target is one place pgbench connects to.
type target struct {
	Name string // direct, lockpool, pgbouncer
	Host string
	Port int
	Proc *process // nil for direct
	// AdminURL is lockpool's admin listener (pprof, metrics).
	AdminURL string
}

// process is a pooler we started.
type process struct {
	cmd     *exec.Cmd
	logPath string
	logFile *os.File
	done    chan struct{}
}

func (p *process) pid() int { return p.cmd.Process.Pid }

func (p *process) alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

func (p *process) stop() {
	if p == nil || p.cmd.Process == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	_ = p.logFile.Close()
}

func (p *process) logTail() string {
	b, _ := os.ReadFile(p.logPath)
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}

// env is everything the run uses.
type env struct {
	work      string
	cluster   *pgtest.Cluster
	direct    *target
	lockpool  *target
	pgbouncer *target
	pgbFail   string // why PgBouncer is missing
}

func (e *env) targets() []*target {
	t := []*target{e.direct, e.lockpool}
	if e.pgbouncer != nil {
		t = append(t, e.pgbouncer)
	}
	return t
}

func (e *env) poolers() []*target {
	t := []*target{e.lockpool}
	if e.pgbouncer != nil {
		t = append(t, e.pgbouncer)
	}
	return t
}

func (e *env) close() {
	if e.pgbouncer != nil {
		e.pgbouncer.Proc.stop()
	}
	if e.lockpool != nil {
		e.lockpool.Proc.stop()
	}
	if e.cluster != nil {
		_ = e.cluster.Destroy()
	}
}

func setup(o *options, work string, rep *Report) (*env, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	e := &env{work: work}

	logf("starting PostgreSQL (internal/pgtest)")
	c, err := pgtest.Start(ctx)
	if err != nil {
		return e, err
	}
	e.cluster = c
	// pgtest starts with max_connections = 300; direct runs at 1000 clients
	// need more, so raise it and restart once.
	if err := c.Exec(ctx, "postgres", fmt.Sprintf("ALTER SYSTEM SET max_connections = %d", o.directMax)); err != nil {
		return e, err
	}
	if err := c.Restart(); err != nil {
		return e, err
	}
	if err := c.CreateRole(ctx, benchUser, benchPassword); err != nil {
		return e, err
	}
	if err := c.CreateDatabase(ctx, benchDB, benchUser); err != nil {
		return e, err
	}
	logf("PostgreSQL on port %d (max_connections %d); pgbench -i -s %d", c.Port, o.directMax, o.scale)
	init := exec.CommandContext(ctx, "pgbench", "-i", "-q", "-s", strconv.Itoa(o.scale),
		"-h", c.Host, "-p", strconv.Itoa(c.Port), "-U", benchUser, benchDB)
	init.Env = append(os.Environ(), "PGPASSWORD="+benchPassword)
	if out, err := init.CombinedOutput(); err != nil {
		return e, fmt.Errorf("pgbench -i: %w\n%s", err, out)
	}
	if err := c.Exec(ctx, benchDB, "VACUUM ANALYZE"); err != nil {
		return e, err
	}
	e.direct = &target{Name: "direct", Host: c.Host, Port: c.Port}

	// lockpool
	bin := o.lockpoolBy
	if bin == "" {
		bin = filepath.Join(work, "lockpool")
		logf("building lockpool (go build -o %s ./cmd/lockpool)", bin)
		b := exec.Command("go", "build", "-o", bin, "./cmd/lockpool")
		b.Dir = repoRoot()
		if out, err := b.CombinedOutput(); err != nil {
			return e, fmt.Errorf("go build: %w\n%s", err, out)
		}
	}
	lpPort, err := freePort()
	if err != nil {
		return e, err
	}
	adminPort, err := freePort()
	if err != nil {
		return e, err
	}
	lpConf := fmt.Sprintf(`# written by integration/bench
listen: 127.0.0.1:%d
admin_listen: 127.0.0.1:%d
auth_method: scram-sha-256
server:
  host: 127.0.0.1
  port: %d
  max_connections: %d       # application budget + lease connections + headroom
users:
  - name: %s
    password: %s
applications:
  - name: bench
    user: %s
    database: %s
    pool_mode: transaction
    max_connections: %d       # the same server-connection budget PgBouncer gets (default_pool_size)
    max_pinned: %d
    advisory_locks: pin
    wait_timeout: 120s        # PgBouncer's query_wait_timeout default
leases:
  max_connections: 2
`, lpPort, adminPort, c.Port, o.budget+4, benchUser, benchPassword, benchUser, benchDB, o.budget, o.maxPinned)
	lpConfPath := filepath.Join(work, "lockpool.yaml")
	if err := os.WriteFile(lpConfPath, []byte(lpConf), 0o644); err != nil {
		return e, err
	}
	rep.Settings = Settings{
		DurationSec: o.duration, Threads: 2, Clients: o.clients, Scale: o.scale,
		Budget: o.budget, MaxPinned: o.maxPinned, DirectMaxConn: o.directMax,
		LockpoolConfig: lpConf, Scripts: o.scripts, Modes: o.modes,
	}
	lp, err := startProcess(work, "lockpool", nil, bin, "-config", lpConfPath)
	if err != nil {
		return e, err
	}
	e.lockpool = &target{Name: "lockpool", Host: "127.0.0.1", Port: lpPort, Proc: lp,
		AdminURL: fmt.Sprintf("http://127.0.0.1:%d", adminPort)}
	if err := waitReady(ctx, e.lockpool); err != nil {
		return e, fmt.Errorf("lockpool: %w\n%s", err, lp.logTail())
	}
	logf("lockpool pid %d on port %d (admin %s)", lp.pid(), lpPort, e.lockpool.AdminURL)

	// PgBouncer
	if o.noPgb {
		e.pgbFail = "skipped (-no-pgbouncer)"
		rep.Notes = append(rep.Notes, "PgBouncer: "+e.pgbFail)
		return e, nil
	}
	pgbBin, err := exec.LookPath("pgbouncer")
	if err != nil {
		e.pgbFail = "not installed (scripts/bench.sh installs it with apt-get)"
		rep.Notes = append(rep.Notes, "PgBouncer: "+e.pgbFail)
		logf("PgBouncer %s", e.pgbFail)
		return e, nil
	}
	t, conf, err := startPgBouncer(ctx, o, e, pgbBin)
	rep.Settings.PgBouncerConfig = conf
	if err != nil {
		return e, fmt.Errorf("pgbouncer: %w", err)
	}
	e.pgbouncer = t
	logf("PgBouncer pid %d on port %d", t.Proc.pid(), t.Port)
	return e, nil
}

func startPgBouncer(ctx context.Context, o *options, e *env, bin string) (*target, string, error) {
	dir := filepath.Join(e.work, "pgbouncer")
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, "", err
	}
	port, err := freePort()
	if err != nil {
		return nil, "", err
	}
	// As a new user would: the role's SCRAM secret from pg_authid in
	// userlist.txt (what the PgBouncer docs suggest for auth_type
	// scram-sha-256; PgBouncer then logs in to the server with the client's
	// SCRAM keys).
	conn, err := pgx.Connect(ctx, e.cluster.SuperuserDSN("postgres"))
	if err != nil {
		return nil, "", err
	}
	var secret string
	err = conn.QueryRow(ctx, "SELECT rolpassword FROM pg_authid WHERE rolname = $1", benchUser).Scan(&secret)
	conn.Close(ctx)
	if err != nil {
		return nil, "", err
	}
	userlist := fmt.Sprintf("%q %q\n", benchUser, secret)
	conf := fmt.Sprintf(`;; written by integration/bench
[databases]
%s = host=127.0.0.1 port=%d dbname=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = scram-sha-256
auth_file = %s
pool_mode = transaction
default_pool_size = %d
max_client_conn = 20000
ignore_startup_parameters = extra_float_digits
logfile =
pidfile =
`, benchDB, e.cluster.Port, benchDB, port, filepath.Join(dir, "userlist.txt"), o.budget)
	if err := os.WriteFile(filepath.Join(dir, "userlist.txt"), []byte(userlist), 0o600); err != nil {
		return nil, "", err
	}
	confPath := filepath.Join(dir, "pgbouncer.ini")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		return nil, "", err
	}
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		// PgBouncer refuses to run as root.
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, conf, fmt.Errorf("running as root needs a postgres user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		for _, p := range []string{dir, confPath, filepath.Join(dir, "userlist.txt")} {
			if err := os.Chown(p, uid, gid); err != nil {
				return nil, conf, err
			}
		}
	}
	p, err := startProcess(dir, "pgbouncer", cred, bin, confPath)
	if err != nil {
		return nil, conf, err
	}
	t := &target{Name: "pgbouncer", Host: "127.0.0.1", Port: port, Proc: p}
	if err := waitReady(ctx, t); err != nil {
		p.stop()
		return nil, conf, fmt.Errorf("%w\n%s", err, p.logTail())
	}
	return t, conf, nil
}

func startProcess(dir, name string, cred *syscall.Credential, bin string, args ...string) (*process, error) {
	logPath := filepath.Join(dir, name+".log")
	lf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	if cred != nil {
		_ = lf.Chown(int(cred.Uid), int(cred.Gid))
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout = lf
	cmd.Stderr = lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{cmd: cmd, logPath: logPath, logFile: lf, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// waitReady waits until a client can log in and run SELECT 1.
func waitReady(ctx context.Context, t *target) error {
	deadline := time.Now().Add(30 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		if t.Proc != nil && !t.Proc.alive() {
			return errors.New("process exited")
		}
		c, err := pgx.Connect(ctx, t.dsn())
		if err == nil {
			var one int
			err = c.QueryRow(ctx, "SELECT 1", pgx.QueryExecModeSimpleProtocol).Scan(&one)
			c.Close(ctx)
			if err == nil {
				return nil
			}
		}
		last = err
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("not ready after 30s: %v", last)
}

func (t *target) dsn() string {
	return fmt.Sprintf("host=%s port=%d user=%s password=%s dbname=%s sslmode=disable",
		t.Host, t.Port, benchUser, benchPassword, benchDB)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// repoRoot finds the module root (the directory holding go.mod) from the
// working directory upwards.
func repoRoot() string {
	dir, _ := os.Getwd()
	for d := dir; ; d = filepath.Dir(d) {
		if b, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil && strings.Contains(string(b), "module github.com/lockpool/lockpool") {
			return d
		}
		if filepath.Dir(d) == d {
			return dir
		}
	}
}

// cpuTicks returns utime+stime of pid in clock ticks (USER_HZ, 100 on Linux).
func cpuTicks(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("bad /proc stat")
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); utime is field 14, stime field 15.
	if len(f) < 13 {
		return 0, errors.New("short /proc stat")
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return u + st, nil
}

const clkTck = 100

// rssKB returns VmRSS of pid in kB.
func rssKB(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			f := strings.Fields(l)
			if len(f) >= 2 {
				n, _ := strconv.ParseInt(f[1], 10, 64)
				return n
			}
		}
	}
	return -1
}
