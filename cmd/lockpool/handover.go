package main

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"time"

	"github.com/lockpool/lockpool/config"
	"github.com/lockpool/lockpool/internal/handover"
)

// takeTimeout bounds asking a running lockpool for its listeners: one
// that does not answer by then (stopped, hung) is treated as absent, and
// binding then fails while it holds the addresses.
const takeTimeout = 5 * time.Second

// listeners are the client and admin listeners (admin nil when
// admin_listen is ""), taken over from the lockpool running on
// handover_socket or bound here.
type listeners struct {
	client, admin net.Listener
	taken         *handover.Taken // nil: bound here
	// offer: serve handover_socket once listening. False when a running
	// lockpool with other listeners answers on it: it keeps the socket.
	offer bool
}

func handoverAddrs(cfg *config.Config) handover.Addrs {
	return handover.Addrs{Listen: cfg.Listen, AdminListen: cfg.AdminListen}
}

// openListeners takes the listeners over from the lockpool answering on
// handover_socket, if any answers and agrees, and binds them otherwise
// (as without a handover). It logs why, and logs and returns false when
// binding fails.
func openListeners(ctx context.Context, cfg *config.Config, log *slog.Logger) (listeners, bool) {
	l := listeners{offer: cfg.HandoverSocket != ""}
	if cfg.HandoverSocket != "" {
		ctx, cancel := context.WithTimeout(ctx, takeTimeout)
		t, err := handover.Take(ctx, cfg.HandoverSocket, handoverAddrs(cfg))
		cancel()
		var refused *handover.RefusedError
		switch {
		case err == nil:
			log.Info("handover: took the listening sockets from the running lockpool", "from_pid", t.PID, "path", cfg.HandoverSocket)
			return listeners{client: t.Client, admin: t.Admin, taken: t, offer: true}, true
		case errors.Is(err, handover.ErrNoOffer):
			log.Info("handover: no running lockpool answers on the handover socket; binding the listeners", "path", cfg.HandoverSocket, "detail", err)
		case errors.As(err, &refused):
			log.Error("handover refused by the running lockpool; binding the listeners as without a handover, and leaving it the handover socket",
				"path", cfg.HandoverSocket, "running_pid", refused.PID, "reason", refused.Reason)
			l.offer = false
		default:
			log.Warn("handover failed; binding the listeners", "path", cfg.HandoverSocket, "err", err)
		}
	}
	var err error
	if l.client, err = net.Listen("tcp", cfg.Listen); err != nil {
		log.Error("cannot listen", "addr", cfg.Listen, "err", err)
		return l, false
	}
	if cfg.AdminListen != "" {
		if l.admin, err = net.Listen("tcp", cfg.AdminListen); err != nil {
			log.Error("cannot listen (admin)", "addr", cfg.AdminListen, "err", err)
			_ = l.client.Close()
			return l, false
		}
	}
	return l, true
}

// offerListeners serves handover_socket with l (nil when it is off, or a
// running lockpool with other listeners keeps it). A successor's listeners
// being taken over, it must succeed: the caller then confirms.
func offerListeners(cfg *config.Config, l listeners, log *slog.Logger) (*handover.Offer, error) {
	if !l.offer {
		return nil, nil
	}
	return handover.Serve(cfg.HandoverSocket, handoverAddrs(cfg), l.client, l.admin, log)
}

// confirmTakeover tells the process the listeners came from that this one
// accepts on them (it may have exited since: that is logged, not fatal).
func confirmTakeover(ctx context.Context, l listeners, log *slog.Logger) {
	if l.taken == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, takeTimeout)
	defer cancel()
	if err := l.taken.Confirm(ctx); err != nil {
		log.Warn("handover: could not confirm to the previous lockpool (did it exit?); this process accepts anyway", "from_pid", l.taken.PID, "err", err)
	}
}
