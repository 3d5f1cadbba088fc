package console

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/lockpool/lockpool/config"
	"github.com/lockpool/lockpool/internal/pgerr"
	"github.com/lockpool/lockpool/internal/wire"
	"github.com/lockpool/lockpool/pool"
)

// maxMessage bounds a console client's message.
const maxMessage = 1 << 20

// queryTimeout bounds the PostgreSQL queries behind SHOW LOCKS and SHOW
// PINS.
const queryTimeout = 5 * time.Second

// Conn is one admin console connection, whose client package proxy has
// authenticated. It runs on its connection's own goroutine until the
// client leaves or lockpool shuts down; it never takes a server
// connection from a pool.
type Conn struct {
	src      Source
	log      *slog.Logger
	user     string
	remote   string
	r        *bufio.Reader
	out      out // also written by End (shutdown's FATAL)
	buf      []byte
	skipping bool // an extended-protocol message was refused: ignore until Sync
}

// NewConn returns the console of a client that logged in as user to the
// database lockpool: nc is its connection, r the reader its login was
// read through.
func NewConn(src Source, log *slog.Logger, nc net.Conn, r *bufio.Reader, user string) *Conn {
	c := &Conn{src: src, log: log, user: user, remote: nc.RemoteAddr().String(), r: r}
	c.out.conn = nc
	return c
}

// Serve answers the login (AuthenticationOk, parameters, ReadyForQuery)
// and then the client's commands until it leaves or End closes the
// connection. ctx is lockpool's lifetime: the queries of SHOW commands
// end with it.
func (c *Conn) Serve(ctx context.Context) {
	c.log.Info("admin console connected", "user", c.user, "remote", c.remote)
	if err := c.out.write(startup()); err != nil {
		return
	}
	c.run(ctx)
}

// End writes pe (when not nil) as a FATAL and closes the connection;
// nothing is written after it. Shutdown ends every console with 57P01.
func (c *Conn) End(pe *pgerr.Error) { c.out.end(pe) }

// startup is the answer to a console login: AuthenticationOk, the
// parameters a client expects, and ReadyForQuery.
func startup() []byte {
	buf := []byte{'R', 0, 0, 0, 8, 0, 0, 0, 0} // AuthenticationOk
	for _, p := range [][2]string{
		{"server_version", "15.0 (lockpool admin console)"}, {"server_encoding", "UTF8"}, {"client_encoding", "UTF8"},
		{"DateStyle", "ISO, MDY"}, {"TimeZone", "UTC"}, {"integer_datetimes", "on"}, {"standard_conforming_strings", "on"},
		{"application_name", ""}, {"is_superuser", "off"},
	} {
		buf = wire.AppendParameterStatus(buf, p[0], p[1])
	}
	buf = append(buf, 'K', 0, 0, 0, 12)
	buf = binary.BigEndian.AppendUint32(buf, 0)
	buf = binary.BigEndian.AppendUint32(buf, 0)
	return wire.AppendReadyForQuery(buf, 'I')
}

// run reads the client's messages until it leaves: simple queries are
// answered; the extended protocol gets an error (until Sync).
func (c *Conn) run(ctx context.Context) {
	for {
		typ, n, err := wire.ReadHeader(c.r)
		if err != nil {
			if errors.Is(err, wire.ErrProtocol) {
				c.out.end(&pgerr.Error{Code: "08P01", Message: "lockpool: " + err.Error()})
			}
			return
		}
		if n > maxMessage {
			c.out.end(&pgerr.Error{Code: "08P01", Message: fmt.Sprintf("lockpool: admin console message of %d bytes is too large", n)})
			return
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(c.r, body); err != nil {
			return
		}
		switch typ {
		case 'X':
			c.out.end(nil)
			return
		case 'Q':
			q, err := wire.ParseQuery(body)
			if err != nil {
				c.out.end(&pgerr.Error{Code: "08P01", Message: "lockpool: " + err.Error()})
				return
			}
			c.skipping = false
			c.query(ctx, string(q.SQL))
		case 'S':
			c.skipping = false
			c.buf = wire.AppendReadyForQuery(c.buf, 'I')
		case 'H':
		case 'P', 'B', 'D', 'E', 'C', 'F', 'd', 'c', 'f':
			if !c.skipping {
				c.buf = (&pgerr.Error{Code: "0A000",
					Message: "lockpool: the admin console speaks the simple query protocol only",
					Hint:    "Send commands as simple queries (psql does; pgx: QueryExecModeSimpleProtocol; JDBC: preferQueryMode=simple)."}).AppendTo(c.buf, 'E')
				c.skipping = true
			}
		default:
			c.out.end(&pgerr.Error{Code: "08P01", Message: fmt.Sprintf("lockpool: invalid frontend message type %d", typ)})
			return
		}
		if err := c.out.write(c.buf); err != nil {
			return
		}
		c.buf = c.buf[:0]
	}
}

// query answers one simple Query: its commands (separated by semicolons)
// in order, stopping at the first error, then ReadyForQuery.
func (c *Conn) query(ctx context.Context, sql string) {
	var cmds []string
	for _, part := range strings.Split(sql, ";") {
		if part = strings.TrimSpace(part); part != "" {
			cmds = append(cmds, part)
		}
	}
	if len(cmds) == 0 {
		c.buf = append(c.buf, 'I', 0, 0, 0, 4) // EmptyQueryResponse
	}
	var after func()
	for _, cmd := range cmds {
		var err *pgerr.Error
		after, err = c.exec(ctx, cmd)
		if err != nil {
			c.buf = err.AppendTo(c.buf, 'E')
			break
		}
	}
	c.buf = wire.AppendReadyForQuery(c.buf, 'I')
	if after != nil {
		// SHUTDOWN: the client gets its answer first.
		_ = c.out.write(c.buf)
		c.buf = c.buf[:0]
		after()
	}
}

// knownCommands is the list unknown commands are answered with.
func (c *Conn) knownCommands() string {
	return viewNames(c.src) + ", RELOAD, PAUSE [application], RESUME [application], KILL_CLIENT <id>, SHUTDOWN"
}

// exec runs one command and appends its result. after, when not nil, runs
// once the answer was written.
func (c *Conn) exec(ctx context.Context, cmd string) (after func(), _ *pgerr.Error) {
	words := strings.Fields(cmd)
	verb := strings.ToUpper(words[0])
	args := words[1:]
	usage := func(form string) *pgerr.Error {
		return &pgerr.Error{Code: "42601", Message: fmt.Sprintf("lockpool: %s takes %s", verb, form), Hint: "Known commands: " + c.knownCommands() + "."}
	}
	src := c.src
	switch verb {
	case "SHOW":
		if len(args) != 1 {
			return nil, usage("one name: " + viewNames(src))
		}
		name := strings.ToUpper(args[0])
		for _, v := range views(src) {
			if v.name != name {
				continue
			}
			ctx, cancel := context.WithTimeout(ctx, queryTimeout)
			rows, err := v.rows(ctx)
			cancel()
			if err != nil {
				var pe *pgerr.Error
				if errors.As(err, &pe) {
					return nil, pe
				}
				return nil, &pgerr.Error{Code: "XX000", Message: "lockpool: SHOW " + name + ": " + err.Error()}
			}
			var n int
			c.buf, n = appendRows(c.buf, rows)
			c.buf = wire.AppendCommandComplete(c.buf, "SHOW "+strconv.Itoa(n))
			return nil, nil
		}
		return nil, &pgerr.Error{Code: "42601", Message: fmt.Sprintf("lockpool: unknown admin console command \"SHOW %s\"", args[0]),
			Hint: "Known commands: " + c.knownCommands() + "."}
	case "RELOAD":
		if len(args) != 0 {
			return nil, usage("no argument")
		}
		if err := c.reload(); err != nil {
			return nil, err
		}
	case "PAUSE", "RESUME":
		if len(args) > 1 {
			return nil, usage("at most one application name")
		}
		app := ""
		if len(args) == 1 {
			app = unquoteName(args[0])
		}
		f := src.Pool().Pause
		if verb == "RESUME" {
			f = src.Pool().Resume
		}
		if err := f(app); err != nil {
			if errors.Is(err, pool.ErrUnknownApp) {
				return nil, &pgerr.Error{Code: "42704", Message: fmt.Sprintf("lockpool: no application %q is configured", app), Hint: "SHOW APPLICATIONS lists them."}
			}
			return nil, &pgerr.Error{Code: "XX000", Message: "lockpool: " + err.Error()}
		}
		c.log.Info("admin console: "+strings.ToLower(verb), "application", app, "user", c.user, "remote", c.remote)
	case "KILL_CLIENT":
		if len(args) != 1 {
			return nil, usage("a client id (SHOW CLIENTS lists them)")
		}
		id, err := strconv.ParseUint(args[0], 10, 32)
		if err != nil {
			return nil, usage("a client id (SHOW CLIENTS lists them)")
		}
		remote, ok := src.KillClient(uint32(id), &pgerr.Error{Code: "57P01", Message: "lockpool: terminating connection due to administrator command",
			Detail: "An operator closed this connection with KILL_CLIENT on lockpool's admin console."})
		if !ok {
			return nil, &pgerr.Error{Code: "42704", Message: fmt.Sprintf("lockpool: no client with id %d", id), Hint: "SHOW CLIENTS lists them."}
		}
		c.log.Info("admin console: client killed", "client", remote, "id", id, "user", c.user, "remote", c.remote)
	case "SET":
		// Drivers set parameters at connect (JDBC: extra_float_digits,
		// application_name); the console has none and ignores them.
	case "SHUTDOWN":
		if len(args) != 0 {
			return nil, usage("no argument")
		}
		c.log.Info("admin console: shutting down", "user", c.user, "remote", c.remote)
		after = func() {
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), src.Config().ShutdownTimeout)
				defer cancel()
				_ = src.Shutdown(ctx)
			}()
		}
	default:
		return nil, &pgerr.Error{Code: "42601", Message: fmt.Sprintf("lockpool: unknown admin console command %q", truncateCommand(cmd)),
			Hint: "Known commands: " + c.knownCommands() + "."}
	}
	c.buf = wire.AppendCommandComplete(c.buf, verb)
	return after, nil
}

// reload reads the configuration file again and applies it, as SIGHUP does.
func (c *Conn) reload() *pgerr.Error {
	src := c.src
	path := src.Config().Path
	if path == "" {
		return &pgerr.Error{Code: "55000", Message: "lockpool: the configuration was not read from a file; there is nothing to reload"}
	}
	cfg, err := config.Load(path)
	if err == nil {
		_, err = src.Reload(cfg)
	}
	if err != nil {
		c.log.Error("reload failed; keeping the old config", "err", err, "user", c.user)
		return &pgerr.Error{Code: "F0000", Message: "lockpool: reload failed; keeping the old configuration: " + err.Error()}
	}
	return nil
}

// unquoteName strips one pair of double or single quotes around a name.
func unquoteName(s string) string {
	if len(s) >= 2 && (s[0] == '"' || s[0] == '\'') && s[len(s)-1] == s[0] {
		return s[1 : len(s)-1]
	}
	return s
}

// truncateCommand shortens a command for an error message.
func truncateCommand(s string) string {
	if len(s) > 60 {
		return s[:60] + "…"
	}
	return s
}

// versionString is SHOW VERSION's answer: lockpool's module version (or
// "(devel)"), its VCS revision when built from a checkout, and the Go
// version.
func versionString() string {
	v, rev, goVersion := "(devel)", "", ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" {
			v = bi.Main.Version
		}
		goVersion = bi.GoVersion
		for _, st := range bi.Settings {
			if st.Key == "vcs.revision" && len(st.Value) >= 12 {
				rev = st.Value[:12]
			}
		}
	}
	out := "lockpool " + v
	if rev != "" {
		out += " (" + rev + ")"
	}
	if goVersion != "" {
		out += " " + goVersion
	}
	return out
}
