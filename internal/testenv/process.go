package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Process is a program started by [StartProcess] or [StartLogged], with a
// goroutine waiting for it to exit.
type Process struct {
	Cmd     *exec.Cmd
	LogPath string // the file its output goes to ([StartLogged]), or ""

	done chan struct{}
	err  error // how it exited; set before done is closed
}

// StartProcess starts cmd as it is set up (output, credentials).
func StartProcess(cmd *exec.Cmd) (*Process, error) { return startCmd(cmd, nil) }

// StartLogged starts bin with args in dir, its output in dir/name.log, as
// the user of cred (nil: this process's), killed when this process dies.
func StartLogged(dir, name string, cred *syscall.Credential, bin string, args ...string) (*Process, error) {
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
	p, err := startCmd(cmd, lf)
	if err != nil {
		return nil, err
	}
	p.LogPath = logPath
	return p, nil
}

// startCmd starts cmd and a goroutine that waits for it, then closes lf (if
// not nil: the file its output goes to).
func startCmd(cmd *exec.Cmd, lf *os.File) (*Process, error) {
	if err := cmd.Start(); err != nil {
		if lf != nil {
			lf.Close()
		}
		return nil, fmt.Errorf("start %s: %w", filepath.Base(cmd.Path), err)
	}
	p := &Process{Cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		if lf != nil {
			_ = lf.Close()
		}
		close(p.done)
	}()
	return p, nil
}

// PID is the process id.
func (p *Process) PID() int { return p.Cmd.Process.Pid }

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Err is how the process exited (nil: status 0); only valid once Done is
// closed.
func (p *Process) Err() error { return p.err }

// Alive reports whether the process has not exited yet.
func (p *Process) Alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Signal sends sig to the process.
func (p *Process) Signal(sig os.Signal) error { return p.Cmd.Process.Signal(sig) }

// Kill kills the process, if it still runs, and waits until it is gone.
func (p *Process) Kill() {
	if p.Alive() {
		_ = p.Cmd.Process.Kill()
	}
	<-p.done
}

// ErrStopTimeout is what Stop returns when the process did not exit within
// its timeout after SIGTERM and was killed.
var ErrStopTimeout = errors.New("did not exit within the timeout after SIGTERM (killed)")

// Stop sends SIGTERM and waits up to timeout for the process to exit, then
// kills it. It returns how the process exited: nil for status 0, the exit
// error, or [ErrStopTimeout].
func (p *Process) Stop(timeout time.Duration) error {
	if !p.Alive() {
		return fmt.Errorf("had already exited: %v", p.err)
	}
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return p.err
	case <-time.After(timeout):
		p.Kill()
		return ErrStopTimeout
	}
}

// LogTail is the last n bytes of the log file ("" if there is none).
func (p *Process) LogTail(n int) string {
	if p.LogPath == "" {
		return ""
	}
	b, _ := os.ReadFile(p.LogPath)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// WaitReady waits up to 30 s until a client can log in with dsn and run
// SELECT 1, and fails early if p (which may be nil) exits.
func WaitReady(ctx context.Context, p *Process, dsn string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var done <-chan struct{}
	if p != nil {
		done = p.Done()
	}
	retry := time.NewTicker(200 * time.Millisecond)
	defer retry.Stop()
	var last error
	for {
		c, err := pgx.Connect(ctx, dsn)
		if err == nil {
			var one int
			err = c.QueryRow(ctx, "SELECT 1", pgx.QueryExecModeSimpleProtocol).Scan(&one)
			c.Close(context.Background())
			if err == nil {
				return nil
			}
		}
		last = err
		select {
		case <-done:
			return fmt.Errorf("process exited: %v", p.Err())
		case <-ctx.Done():
			return fmt.Errorf("not ready after 30s: %v", last)
		case <-retry.C:
		}
	}
}

// ModuleRoot is the directory of lockpool's go.mod, looked for from the
// working directory upwards ("" if not found).
func ModuleRoot() string {
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	for d := dir; ; d = filepath.Dir(d) {
		if b, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil && strings.Contains(string(b), "module github.com/lockpool/lockpool\n") {
			return d
		}
		if filepath.Dir(d) == d {
			return ""
		}
	}
}

// BuildLockpool builds cmd/lockpool into the file out.
func BuildLockpool(ctx context.Context, out string) error {
	root := ModuleRoot()
	if root == "" {
		return errors.New("building lockpool: no lockpool go.mod above the working directory")
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "./cmd/lockpool")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build -o %s ./cmd/lockpool: %w\n%s", out, err, b)
	}
	return nil
}

// built is the lockpool binary LockpoolBinary built for this process.
var built struct {
	once sync.Once
	path string
	err  error
}

// LockpoolBinary is the lockpool binary, built once per test process into
// a temporary directory.
func LockpoolBinary(t testing.TB) string {
	t.Helper()
	built.once.Do(func() {
		dir, err := os.MkdirTemp("", "lockpool-bin-")
		if err != nil {
			built.err = err
			return
		}
		built.path = filepath.Join(dir, "lockpool")
		built.err = BuildLockpool(context.Background(), built.path)
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.path
}

// RemoveLockpoolBinary deletes what [LockpoolBinary] built, if anything.
// TestMain calls it once the tests ran.
func RemoveLockpoolBinary() {
	if built.path != "" {
		_ = os.RemoveAll(filepath.Dir(built.path))
	}
}

// LockpoolProcess is the lockpool binary running as a process for a test.
type LockpoolProcess struct {
	*Process
	Port       int        // the client port
	ConfigPath string     // the configuration file (rewrite it and SIGHUP to reload)
	Log        *LogBuffer // its stdout and stderr
}

// DSN is a libpq-style connection string for user and db through it.
func (p *LockpoolProcess) DSN(user, db string) string { return DSN(p.Port, user, db) }

// StartLockpoolProcess runs [LockpoolBinary] with -config (the text config
// returns for a free client port) and args, and waits until it logs that it
// listens. A port another process took in between is retried twice. The
// process is killed when t ends, and its log shown if t failed.
func StartLockpoolProcess(t *testing.T, config func(port int) string, args ...string) *LockpoolProcess {
	t.Helper()
	bin := LockpoolBinary(t)
	p := &LockpoolProcess{ConfigPath: filepath.Join(t.TempDir(), "lockpool.yaml")}
	for attempt := 0; ; attempt++ {
		p.Port = FreePort(t)
		if err := os.WriteFile(p.ConfigPath, []byte(config(p.Port)), 0o600); err != nil {
			t.Fatal(err)
		}
		p.launch(t, bin, args...)
		if p.listening() {
			break
		}
		p.Kill()
		if attempt < 2 && strings.Contains(p.Log.String(), "address already in use") {
			continue
		}
		t.Fatalf("lockpool did not start listening (exit: %v):\n%s", p.Err(), p.Log.String())
	}
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("lockpool process log:\n%s", p.Log.String())
		}
	})
	return p
}

// launch starts bin with p's configuration file and args, its output in a
// fresh p.Log.
func (p *LockpoolProcess) launch(t *testing.T, bin string, args ...string) {
	t.Helper()
	p.Log = &LogBuffer{Echo: os.Getenv("LOCKPOOL_TEST_LOG") != ""}
	cmd := exec.Command(bin, append([]string{"-config", p.ConfigPath}, args...)...)
	cmd.Stdout = p.Log
	cmd.Stderr = p.Log
	proc, err := StartProcess(cmd)
	if err != nil {
		t.Fatal(err)
	}
	p.Process = proc
}

// listening waits up to 20 s for p to log that it listens; false when it
// exited first or the time passed.
func (p *LockpoolProcess) listening() bool {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return p.Log.WaitFor(ctx, "lockpool listening", p.Done())
}
