package proxy

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockpool/lockpool/advisory"
	"github.com/lockpool/lockpool/auth"
	"github.com/lockpool/lockpool/cluster"
	"github.com/lockpool/lockpool/config"
	"github.com/lockpool/lockpool/hosts"
	"github.com/lockpool/lockpool/internal/bgtask"
	"github.com/lockpool/lockpool/internal/evloop"
	"github.com/lockpool/lockpool/internal/pgerr"
	"github.com/lockpool/lockpool/internal/wire"
	"github.com/lockpool/lockpool/listen"
	"github.com/lockpool/lockpool/pool"
	"github.com/lockpool/lockpool/proxy/appstate"
	"github.com/lockpool/lockpool/proxy/backend"
	"github.com/lockpool/lockpool/proxy/console"
	"github.com/lockpool/lockpool/proxy/session"
	"github.com/lockpool/lockpool/proxy/startupparam"
)

// clientBufSize is the read buffer a session borrows while its client
// sends; an idle session holds none.
const clientBufSize = 8 << 10

// Options are the dependencies of a Server.
type Options struct {
	Config     *config.Config
	Logger     *slog.Logger          // nil: slog.Default()
	Registerer prometheus.Registerer // nil: no metrics are registered
	// Leases answers the lease functions; nil builds lockpool's own store
	// from the config (unless NoLeases).
	Leases   LeaseStore
	NoLeases bool
	// OnReload, when set, is called after each reload that applied a new
	// configuration (Reload: SIGHUP or the admin console's RELOAD), for what
	// the caller built from it, such as the log level.
	OnReload func(*config.Config)
}

// runtimeConfig is the reloadable part of the configuration.
type runtimeConfig struct {
	cfg   *config.Config
	apps  map[string]*appstate.App
	creds map[string]*auth.Credential
}

// Server is a running lockpool proxy.
type Server struct {
	log     *slog.Logger
	pool    *pool.Manager
	leases  LeaseStore
	locks   *advisory.Manager // advisory_locks: hold
	hub     *listen.Hub       // listen: shared
	metrics *appstate.Metrics
	tlsConf *tls.Config
	health  healthProbe
	tasks   *bgtask.Set
	sweep   *bgtask.Task // the leak sweep's failures
	authq   authLookup
	// startupChecks: sets of startup settings PostgreSQL accepted (startupcheck.go).
	startupChecks startupparam.Cache
	loginLog      loginLimiter // rate limit of the failed-login lines (loginlog.go)
	gate          *loginGate   // the login pipeline (logingate.go)
	// started is the config New was given: what the listeners, TLS and the
	// lease store keep using until a restart (see config.RestartNeeded).
	started  *config.Config
	onReload func(*config.Config)

	// shared is what every session uses (package session), made at the
	// end of New.
	shared *session.Shared

	rc atomic.Pointer[runtimeConfig]

	// seen: which client last read each backend's pid (session.SeenPIDs); it
	// has its own lock.
	seen session.SeenPIDs

	mu          sync.Mutex
	ln          net.Listener
	sessions    map[uint32]*session.Session // by lockpool's own backend pid
	logins      loginSet                    // the logins running on the event loops (Shutdown ends them)
	stmts       backend.StmtCatalog         // server statements known across sessions
	bufs        *wire.BufferPool            // client read buffers, lent while data flows
	clientCount atomic.Int64
	passKeys    map[string]pool.SCRAMKeys // SCRAM pass-through material by user
	nextPID     uint32                    // session counter (keyPID)
	draining    bool
	wg          sync.WaitGroup // client connections
	acceptors   sync.WaitGroup // running Serve loops (Handoff waits for them)
	handedOff   atomic.Bool    // Handoff: the listeners live on in a successor (handoff.go)
	stopAccept  chan struct{}  // closed (under mu) when Serve is to stop accepting: Shutdown, Handoff
	done        chan struct{}  // closed when Shutdown finished

	baseCtx context.Context
	cancel  context.CancelFunc
	sweeper sync.WaitGroup

	// loops run the sessions (started by Serve, stopped by Shutdown after
	// the last session ended); nextLoop spreads new sessions over them.
	loops    []*evloop.Loop
	nextLoop atomic.Uint32

	consoles map[*console.Conn]struct{} // admin console connections (consolelogin.go), under mu

	hosts   *hosts.Monitor       // server.hosts (hosts.go); nil with one host and port
	cluster *cluster.Coordinator // budget_scope: cluster (cluster.go); nil without
	// signalKey authenticates the signal requests other instances of the
	// cluster forward to this one (clustersignal.go); nil without a cluster.
	signalKey []byte
	// ends are closed when their session has ended and cleaned up, for
	// pg_terminate_backend's timeout (sessions.go); under mu.
	ends map[*session.Session]chan struct{}
}

// New builds a Server from a validated config. It does not listen yet.
func New(opts Options) (*Server, error) {
	if opts.Config == nil {
		return nil, errors.New("proxy: no config")
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.Default()
	}
	s := &Server{
		log:        logger,
		leases:     opts.Leases,
		sessions:   make(map[uint32]*session.Session),
		bufs:       wire.NewBufferPool(clientBufSize),
		done:       make(chan struct{}),
		stopAccept: make(chan struct{}),
		started:    opts.Config,
		onReload:   opts.OnReload,
	}
	var pid [4]byte
	_, _ = rand.Read(pid[:])
	s.nextPID = binary.BigEndian.Uint32(pid[:]) // the session counter: keyPID makes the pids
	s.metrics = appstate.NewMetrics(opts.Registerer)
	s.gate = newLoginGate(defaultLoginWidth(), opts.Registerer)
	s.tasks = bgtask.NewSet(opts.Registerer, bgtask.LeakSweep, bgtask.Cluster, bgtask.Listen, bgtask.LeaseRenewal, bgtask.LeaseListen)
	s.sweep = s.tasks.Task(bgtask.LeakSweep)
	rc, err := s.buildRuntime(opts.Config)
	if err != nil {
		return nil, err
	}
	if err := s.loadTLS(opts.Config); err != nil {
		return nil, err
	}
	s.rc.Store(rc)
	if s.hosts, err = newHostMonitor(opts.Config, s.scramKeys, logger, opts.Registerer, s.onHostChange); err != nil {
		return nil, fmt.Errorf("proxy: hosts: %w", err)
	}
	pm, err := pool.New(pool.Options{
		Server:     opts.Config.Server,
		Apps:       s.poolApps(opts.Config),
		Logger:     logger,
		Registerer: opts.Registerer,
		Hosts:      s.hosts,
	})
	if err != nil {
		s.hosts.Close()
		return nil, fmt.Errorf("proxy: pool: %w", err)
	}
	s.pool = pm
	if s.hosts != nil {
		s.hosts.Start()
	} else if opts.Registerer != nil {
		srv := opts.Config.Server
		hosts.RegisterUnchecked(opts.Registerer, config.HostAddr{Host: srv.Host, Port: srv.Port}.String(),
			func() float64 { return float64(pm.InstanceStats().Open) })
	}
	if s.leases == nil && !opts.NoLeases {
		ls, err := newLeaseStore(opts.Config, s.Config, s.hosts, s.scramKeys, s.tasks, logger, opts.Registerer)
		if err != nil {
			pm.Close()
			s.hosts.Close()
			return nil, fmt.Errorf("proxy: leases: %w", err)
		}
		s.leases = ls
	}
	if s.locks, err = newLockManager(opts.Config, s.Config, s.hosts, s.scramKeys, logger); err != nil {
		pm.Close()
		s.hosts.Close()
		return nil, fmt.Errorf("proxy: locks: %w", err)
	}
	s.hub = listen.New(listen.Config{ConnConfig: ownConnConfig(opts.Config, s.Config, s.hosts, s.scramKeys), Logger: logger, Registerer: opts.Registerer,
		Task: s.tasks.Task(bgtask.Listen)})
	if err := s.startCluster(opts.Config, logger, opts.Registerer); err != nil {
		s.hub.Close()
		pm.Close()
		s.hosts.Close()
		return nil, fmt.Errorf("proxy: cluster: %w", err)
	}
	s.baseCtx, s.cancel = context.WithCancel(context.Background())
	s.shared = session.NewShared(session.Shared{Log: logger, Pool: s.pool, Stmts: &s.stmts, Leases: s.leases, Locks: s.locks,
		Hub: s.hub, Seen: &s.seen, Bufs: s.bufs, Base: s.baseCtx, Host: sessionHost{s}})
	return s, nil
}

func (s *Server) loadTLS(cfg *config.Config) error {
	if cfg.TLS == nil {
		s.tlsConf = nil
		return nil
	}
	cert, err := tls.LoadX509KeyPair(cfg.TLS.CertFile, cfg.TLS.KeyFile)
	if err != nil {
		return fmt.Errorf("proxy: tls: %w", err)
	}
	s.tlsConf = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	return nil
}

func (s *Server) poolApps(cfg *config.Config) []pool.AppConfig {
	apps := make([]pool.AppConfig, 0, len(cfg.Applications))
	for _, a := range cfg.Applications {
		pw := ""
		if u, ok := cfg.UserByName(a.User); ok {
			pw = u.Password
		}
		ac := pool.AppConfig{
			Name:           a.Name,
			User:           a.User,
			Password:       pw,
			MaxConnections: a.MaxConnections,
			MaxPinned:      a.MaxPinned,
			WaitTimeout:    a.WaitTimeout,
			Target:         hosts.Target{Kind: a.Target, MaxLag: a.MaxLag},
		}
		_, listed := cfg.UserByName(a.User)
		if strings.HasPrefix(pw, "SCRAM-SHA-256$") || !listed {
			// Only a verifier is configured: log in to the server with the
			// proof material of a client that logged in with SCRAM.
			user := a.User
			ac.Password = ""
			ac.SCRAM = func() (pool.SCRAMKeys, bool) { return s.scramKeys(user) }
		}
		apps = append(apps, ac)
	}
	return apps
}

// scramKeys returns the SCRAM pass-through keys learned for user.
func (s *Server) scramKeys(user string) (pool.SCRAMKeys, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k, ok := s.passKeys[user]
	return k, ok
}

// learnSCRAM records a client's ClientKey after a SCRAM login against a
// configured verifier.
func (s *Server) learnSCRAM(user string, cred *auth.Credential, clientKey []byte) {
	if len(clientKey) == 0 {
		return
	}
	if _, plain := cred.Plaintext(); plain {
		return
	}
	s.mu.Lock()
	prev, known := s.passKeys[user]
	s.mu.Unlock()
	if known && subtle.ConstantTimeCompare(prev.ClientKey, clientKey) == 1 {
		return // learned from an earlier login: nothing to copy
	}
	_, _, _, serverKey, ok := cred.SCRAMSecret()
	if !ok {
		return
	}
	s.mu.Lock()
	if s.passKeys == nil {
		s.passKeys = make(map[string]pool.SCRAMKeys)
	}
	s.passKeys[user] = pool.SCRAMKeys{ClientKey: append([]byte(nil), clientKey...), ServerKey: serverKey}
	s.mu.Unlock()
}

func (s *Server) buildRuntime(cfg *config.Config) (*runtimeConfig, error) {
	rc := &runtimeConfig{cfg: cfg, apps: make(map[string]*appstate.App), creds: make(map[string]*auth.Credential)}
	old := s.rc.Load()
	for _, u := range cfg.Users {
		if old != nil {
			if prev, ok := old.cfg.UserByName(u.Name); ok && prev.Password == u.Password {
				rc.creds[u.Name] = old.creds[u.Name]
				continue
			}
		}
		c, err := auth.NewCredential(u.Name, u.Password)
		if err != nil {
			return nil, fmt.Errorf("proxy: user %q: %w", u.Name, err)
		}
		rc.creds[u.Name] = c
	}
	for _, a := range cfg.Applications {
		var prev *appstate.App
		if old != nil {
			prev = old.apps[a.Name] // logged-in clients and counters stay across a reload
		}
		as, err := appstate.NewApp(a, s.metrics, prev)
		if err != nil {
			return nil, err
		}
		rc.apps[a.Name] = as
	}
	return rc, nil
}

// Reload applies a new configuration: every key the key table does not
// mark restart (budgets, policies, users, timeouts, …). Connected clients
// stay connected. It returns the keys whose value differs from the one
// lockpool started with and that a reload cannot apply fully (listen
// addresses, TLS files, what the lease store was built with; see
// config.RestartNeeded), and logs them.
func (s *Server) Reload(cfg *config.Config) ([]string, error) {
	rc, err := s.buildRuntime(cfg)
	if err != nil {
		return nil, err
	}
	restart := config.RestartNeeded(s.started, cfg)
	prev := s.rc.Swap(rc)
	s.pool.Reconfigure(cfg.Server, s.poolApps(cfg))
	if !reflect.DeepEqual(prev.cfg.AuthQuery, cfg.AuthQuery) {
		s.authq.reset() // the next lookup logs in, and looks up, as configured now
	}
	if s.onReload != nil {
		s.onReload(cfg)
	}
	if len(restart) > 0 {
		s.log.Warn("configuration reloaded; changed keys take full effect only after a restart",
			"applications", len(cfg.Applications), "users", len(cfg.Users), "restart_needed", strings.Join(restart, ","))
	} else {
		s.log.Info("configuration reloaded", "applications", len(cfg.Applications), "users", len(cfg.Users))
	}
	return restart, nil
}

// Serve accepts clients on ln until Shutdown (or Handoff). It returns nil
// after Shutdown.
//
// A TCP listener is taken by the event loops (evloop.Listen): each loop
// accepts on its own thread and the login runs on a coroutine of that loop
// (serveLogin), through the login pipeline (logingate.go), and the session
// on the same coroutine after it. Any other listener is served by an accept
// goroutine, a goroutine per login (handleConn), and the session then on a
// loop.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.draining {
		s.mu.Unlock()
		return errors.New("proxy: shut down")
	}
	s.ln = ln
	s.acceptors.Add(1)
	defer s.acceptors.Done()
	if s.loops == nil {
		if err := s.startLoops(); err != nil {
			s.mu.Unlock()
			return err
		}
	}
	loops := s.loops
	s.mu.Unlock()
	s.startBackground()
	lis, err := evloop.Listen(ln, loops, s.accepted, func(err error, backoff time.Duration) {
		s.log.Warn("accept failed; retrying", "err", err, "backoff", backoff)
	})
	if err == nil {
		<-s.stopAccept
		lis.Close()
		return nil
	}
	s.log.Debug("accepting on a goroutine: the event loops cannot take the listener", "err", err)
	var backoff time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			draining := s.draining || s.handedOff.Load()
			s.mu.Unlock()
			if draining {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || isTemporaryAccept(err) {
				// Out of file descriptors and the like: log, back off, retry.
				if backoff == 0 {
					backoff = 5 * time.Millisecond
				} else if backoff < time.Second {
					backoff *= 2
				}
				s.log.Warn("accept failed; retrying", "err", err, "backoff", backoff)
				time.Sleep(backoff)
				continue
			}
			return fmt.Errorf("proxy: accept: %w", err)
		}
		backoff = 0
		// Counted under mu with the draining check: Shutdown sets draining
		// under mu before it waits, so no Add can race its Wait.
		s.mu.Lock()
		if s.draining {
			s.mu.Unlock()
			_ = c.Close()
			return nil
		}
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			s.handleConn(c)
		}()
	}
}

// accepted takes a connection loop l accepted (on l's goroutine): it
// counts it in s.wg and puts it through the login pipeline, which starts
// its login on l (p.run) now or when a place frees.
func (s *Server) accepted(l *evloop.Loop, c *evloop.Conn) {
	now := time.Now()
	s.mu.Lock()
	if s.draining {
		s.mu.Unlock()
		_ = c.Close()
		return
	}
	s.wg.Add(1)
	s.mu.Unlock()
	login := func(co *evloop.Co) { s.serveLogin(co, c, now) }
	if s.gate.tryStart() {
		l.Go(login) // on l's goroutine: start now
		return
	}
	cfg := s.rc.Load().cfg
	p := &pendingLogin{conn: c, at: now, refused: s.wg.Done}
	if cfg.ClientLoginTimeout > 0 {
		p.deadline = now.Add(cfg.ClientLoginTimeout)
	}
	// A connection that waited starts from whichever goroutine ended a
	// login: Post (on l's own goroutine it only queues, no system call).
	p.run = func() { l.Post(func() { l.Go(login) }) }
	if s.gate.arrive(p, maxLoginsWaiting(cfg.MaxClientConnections)) {
		l.Go(login) // a place freed meanwhile
	}
}

// stopAcceptingLocked makes Serve stop accepting (s.mu held).
func (s *Server) stopAcceptingLocked() {
	select {
	case <-s.stopAccept:
	default:
		close(s.stopAccept)
	}
	if s.ln != nil {
		_ = s.ln.Close()
	}
}

// defaultLoops is event_loops' default for a machine with cpus CPUs: one
// loop per four CPUs, at least one. One loop serves every client of a small
// host (measured on 2 CPUs: one loop 0.93 × PgBouncer's CPU per
// transaction, two loops 1.46 ×, four 1.60 ×; README, Performance): sessions
// on different loops hand server connections and wake-ups across threads.
func defaultLoops(cpus int) int { return max(1, cpus/4) }

// startLoops starts the event loops (event_loops; 0: defaultLoops). Each
// loop's thread blocks in epoll_wait holding its P; evloop raises
// GOMAXPROCS to one P more than the running loops for everything else
// (logins, offloaded waits, timers, the admin server).
func (s *Server) startLoops() error {
	n := s.rc.Load().cfg.EventLoops
	if n <= 0 {
		n = defaultLoops(runtime.NumCPU())
	}
	useRing := s.rc.Load().cfg.IOURing
	for i := 0; i < n; i++ {
		l, err := evloop.New(evloop.Options{NoRing: !useRing})
		if err != nil {
			for _, started := range s.loops {
				started.Stop()
			}
			s.loops = nil
			return fmt.Errorf("proxy: event loop: %w", err)
		}
		go l.Run()
		s.loops = append(s.loops, l)
	}
	if useRing && !s.loops[0].UsesRing() {
		s.log.Info("io_uring is not available: event loops send one write per system call")
	}
	return nil
}

// pickLoop returns the loop for a new session (round robin), or nil before
// the loops start (a test that logs a connection in without Serve).
func (s *Server) pickLoop() *evloop.Loop {
	if len(s.loops) == 0 {
		return nil
	}
	return s.loops[int(s.nextLoop.Add(1))%len(s.loops)]
}

// register assigns the session its backend key and records it.
func (s *Server) register(ss *session.Session) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.draining {
		if !s.handedOff.Load() {
			return false
		}
		ss.DrainAfterTx() // accepted before Handoff closed the listener (handoff.go)
	}
	var pid uint32
	for {
		s.nextPID++
		pid = s.keyPID(s.nextPID) // ≥ 2^22, with the cluster instance's number (clustercancel.go)
		if _, taken := s.sessions[pid]; !taken {
			break
		}
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	ss.SetKey(pid, binary.BigEndian.Uint32(b[:]))
	s.sessions[pid] = ss
	return true
}

func (s *Server) unregister(ss *session.Session) {
	s.mu.Lock()
	if s.sessions[ss.PID()] == ss {
		delete(s.sessions, ss.PID())
	}
	s.mu.Unlock()
	s.seen.Forget(ss.PID())
}

// cancelSession handles a CancelRequest with lockpool's key.
func (s *Server) cancelSession(pid, secret uint32) {
	if s.forwardCancel(pid, secret) {
		return
	}
	s.mu.Lock()
	ss := s.sessions[pid]
	s.mu.Unlock()
	if ss == nil || ss.Secret() != secret {
		return
	}
	ss.CancelRunning(s.baseCtx)
}

// Shutdown stops accepting, lets running transactions finish until ctx ends,
// then sends 57P01 to every remaining client and closes everything.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	if s.draining {
		s.mu.Unlock()
		<-s.done
		return nil
	}
	s.draining = true
	s.stopAcceptingLocked()
	list := make([]*session.Session, 0, len(s.sessions))
	for _, ss := range s.sessions {
		list = append(list, ss)
	}
	handedOff := s.handedOff.Load()
	s.mu.Unlock()
	for _, ss := range list {
		ss.Drain()
	}
	s.gate.close(pgerr.Shutdown()) // connections waiting to log in: 57P01 now
	if !handedOff {
		s.logins.end(pgerr.Shutdown()) // after a Handoff they log in and run a statement first
	}
	s.endConsoles()
	finished := make(chan struct{})
	go func() {
		s.wg.Wait()
		close(finished)
	}()
	select {
	case <-finished:
	case <-ctx.Done():
		s.mu.Lock()
		list = list[:0]
		for _, ss := range s.sessions {
			list = append(list, ss)
		}
		s.mu.Unlock()
		for _, ss := range list {
			ss.Kill(pgerr.Shutdown())
		}
		s.logins.end(pgerr.Shutdown())
		<-finished
	}
	s.cancel()
	s.sweeper.Wait()
	s.authq.close()
	if s.leases != nil {
		s.leases.Close()
	}
	s.locks.Close()
	s.hub.Close()
	s.pool.Close()
	s.stopCluster()
	s.hosts.Close()
	// Serve takes its listener off the loops (evloop.Listener.Close runs
	// on each of them) before they stop.
	s.acceptors.Wait()
	s.mu.Lock()
	loops := s.loops
	s.mu.Unlock()
	for _, l := range loops {
		l.Stop()
	}
	close(s.done)
	return nil
}

// Pool exposes the connection manager (tests and the admin server).
func (s *Server) Pool() *pool.Manager { return s.pool }

// Config returns the configuration in force.
func (s *Server) Config() *config.Config { return s.rc.Load().cfg }
