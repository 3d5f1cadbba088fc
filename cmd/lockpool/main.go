// Command lockpool runs the lockpool PostgreSQL proxy: flags, config,
// logging, signals (SIGTERM drains, SIGHUP reloads), and nothing else.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/lockpool/lockpool/config"
	"github.com/lockpool/lockpool/proxy"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// flags are lockpool's command-line flags.
type flags struct {
	config  string
	check   bool
	debug   bool
	version bool
}

// newFlagSet declares every flag; -help prints them all.
func newFlagSet(f *flags) *flag.FlagSet {
	fs := flag.NewFlagSet("lockpool", flag.ContinueOnError)
	fs.StringVar(&f.config, "config", "config.yaml", "path of the YAML config")
	fs.BoolVar(&f.check, "check", false, "validate the config, print every problem with its file and line, and exit (0: valid)")
	fs.BoolVar(&f.debug, "debug", false, "log at debug level, whatever log_level says")
	fs.BoolVar(&f.version, "version", false, "print the version, VCS revision and Go version, and exit")
	fs.Usage = func() {} // run prints the usage itself: to stdout for -help, a hint to stderr for a mistake
	return fs
}

func usage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintf(w, "Usage: lockpool [flags]\n\n"+
		"lockpool is a PostgreSQL transaction-pooling proxy. It reads its configuration from -config\n"+
		"(see README.md); SIGTERM drains and exits, SIGHUP reloads the configuration.\n\nFlags:\n")
	fs.SetOutput(w)
	fs.PrintDefaults()
}

// run is lockpool's main: exit status 0 (done), 1 (config or startup
// failure) or 2 (bad command line).
func run(args []string, stdout, stderr io.Writer) int {
	var f flags
	fs := newFlagSet(&f)
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			usage(stdout, fs)
			return 0
		}
		fmt.Fprintln(stderr, "Run lockpool -help for the list of flags.")
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "lockpool: unexpected argument %q: lockpool takes flags only (run lockpool -help)\n", fs.Arg(0))
		return 2
	}
	bi := readBuildInfo()
	if f.version {
		fmt.Fprintln(stdout, bi.String())
		return 0
	}
	cfg, err := config.Load(f.config)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if f.check {
		fmt.Fprintf(stderr, "%s: ok\n", f.config)
		return 0
	}
	level := new(slog.LevelVar)
	setLevel := func(cfg *config.Config) {
		l, err := proxy.ParseLevel(cfg.LogLevel)
		if err != nil || f.debug {
			l = slog.LevelDebug
		}
		level.Set(l)
	}
	setLevel(cfg)
	log := proxy.NewLogger(stderr, cfg.LogFormat, level)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), bi.collector())
	// OnReload: the console's RELOAD sets the level as SIGHUP does.
	srv, err := proxy.New(proxy.Options{Config: cfg, Logger: log, Registerer: reg, OnReload: setLevel})
	if err != nil {
		log.Error("cannot start", "err", err)
		return 1
	}
	// Listeners: taken over from a running lockpool (handover_socket) or
	// bound here (handover.go).
	lns, ok := openListeners(context.Background(), cfg, log)
	if !ok {
		return 1
	}
	offer, err := offerListeners(cfg, lns, log)
	if err != nil {
		log.Error("cannot serve the handover socket", "path", cfg.HandoverSocket, "err", err)
		if lns.taken != nil {
			lns.taken.Abandon()
		}
		return 1
	}
	if offer != nil {
		defer offer.Close()
	}
	ln := lns.client
	var admin *http.Server
	adminAddr := ""
	if aln := lns.admin; aln != nil {
		adminAddr = aln.Addr().String()
		admin = &http.Server{Handler: srv.AdminHandler(reg), ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = admin.Serve(aln) }()
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(sigs)
	log.Info("lockpool listening", "addr", ln.Addr().String(), "admin", adminAddr, "version", bi.Version, "revision", bi.Revision)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	confirmTakeover(context.Background(), lns, log)
	if err := sdNotify("READY=1"); err != nil {
		log.Warn("could not tell systemd that lockpool is ready", "err", err)
	}

	for {
		select {
		case err := <-served:
			if err != nil {
				log.Error("serve failed", "err", err)
				return 1
			}
			// SHUTDOWN on the admin console: wait until it is done.
			_ = srv.Shutdown(context.Background())
			log.Info("stopped")
			return 0
		case sig := <-sigs:
			if sig == syscall.SIGHUP {
				ncfg, err := config.Load(f.config)
				if err != nil {
					log.Error("reload failed; keeping the old config", "err", err)
					continue
				}
				if _, err := srv.Reload(ncfg); err != nil {
					log.Error("reload failed; keeping the old config", "err", err)
				}
				continue
			}
			stop, successor := srv.Shutdown, 0
			if offer != nil {
				_ = offer.Close()
				if successor = offer.HandedTo(); successor != 0 {
					stop = srv.Handoff // the successor accepts on the same sockets
				}
			}
			log.Info("shutting down", "signal", sig.String(), "timeout", srv.Config().ShutdownTimeout, "successor_pid", successor)
			_ = sdNotify("STOPPING=1")
			ctx, cancel := context.WithTimeout(context.Background(), srv.Config().ShutdownTimeout)
			if successor != 0 && admin != nil {
				go func() { _ = admin.Shutdown(ctx) }() // stop accepting admin requests now too
			}
			_ = stop(ctx)
			cancel()
			if admin != nil {
				_ = admin.Close()
			}
			if err := <-served; err != nil && !errors.Is(err, net.ErrClosed) {
				log.Error("serve failed", "err", err)
			}
			log.Info("stopped")
			return 0
		}
	}
}
