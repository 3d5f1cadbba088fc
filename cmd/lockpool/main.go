// Command lockpool runs the lockpool PostgreSQL proxy: flags, config,
// signals (SIGTERM drains, SIGHUP reloads), and nothing else.
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
	os.Exit(run(os.Args[1:], os.Stderr))
}

func run(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("lockpool", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "config.yaml", "path of the YAML config")
	check := fs.Bool("check", false, "validate the config and exit")
	debug := fs.Bool("debug", false, "log at debug level")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cfg, err := config.Load(*path)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if *check {
		fmt.Fprintf(stderr, "%s: ok\n", *path)
		return 0
	}
	level := slog.LevelInfo
	if *debug {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	srv, err := proxy.New(proxy.Options{Config: cfg, Logger: log, Registerer: reg})
	if err != nil {
		log.Error("cannot start", "err", err)
		return 1
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		log.Error("cannot listen", "addr", cfg.Listen, "err", err)
		return 1
	}
	var admin *http.Server
	if cfg.AdminListen != "" {
		aln, err := net.Listen("tcp", cfg.AdminListen)
		if err != nil {
			log.Error("cannot listen (admin)", "addr", cfg.AdminListen, "err", err)
			return 1
		}
		admin = &http.Server{Handler: srv.AdminHandler(reg), ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = admin.Serve(aln) }()
	}
	log.Info("lockpool listening", "addr", ln.Addr().String(), "admin", cfg.AdminListen)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
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
				ncfg, err := config.Load(*path)
				if err != nil {
					log.Error("reload failed; keeping the old config", "err", err)
					continue
				}
				if err := srv.Reload(ncfg); err != nil {
					log.Error("reload failed; keeping the old config", "err", err)
				}
				continue
			}
			log.Info("shutting down", "signal", sig.String(), "timeout", srv.Config().ShutdownTimeout)
			ctx, cancel := context.WithTimeout(context.Background(), srv.Config().ShutdownTimeout)
			_ = srv.Shutdown(ctx)
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
