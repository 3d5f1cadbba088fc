package proxy

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/lockpool/lockpool/config"
	"github.com/lockpool/lockpool/internal/wire"
	"github.com/lockpool/lockpool/proxy/appstate"
	"github.com/lockpool/lockpool/proxy/local"
	"github.com/lockpool/lockpool/proxy/session"
)

// signalClient: another user is refused, a cancel of a client with nothing
// running is sent, a terminate kills the session (its FATAL is written)
// and, with a timeout, waits for the session's end: false when it did not
// come in time, true when it does.
func TestSignalClient(t *testing.T) {
	srv := &Server{log: slog.New(slog.DiscardHandler), sessions: map[uint32]*session.Session{}, baseCtx: context.Background()}
	client, peer := net.Pipe()
	defer peer.Close()
	read := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(peer)
		read <- string(b)
	}()
	as, err := appstate.NewApp(config.Application{Name: "api"}, appstate.NewMetrics(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	sh := session.NewShared(session.Shared{Log: srv.log, Bufs: wire.NewBufferPool(1024), Base: srv.baseCtx, Host: sessionHost{srv}})
	ss := session.New(sh, client, bufio.NewReader(client), as, "app", "app", nil)
	ss.SetKey(keyPIDOf(0, 7), 9)
	srv.sessions[ss.PID()] = ss
	ctx := context.Background()
	req := func(user string, admin, terminate bool, timeout time.Duration) signalRequest {
		return signalRequest{pid: ss.PID(), user: user, admin: admin, terminate: terminate, timeout: timeout}
	}
	for _, tc := range []struct {
		name string
		r    signalRequest
		want local.SignalResult
	}{
		{"other user, terminate", req("other", false, true, 0), local.SignalDenied},
		{"other user, cancel", req("other", false, false, 0), local.SignalDenied},
		{"same user, cancel", req("app", false, false, 0), local.SignalSent},
		{"admin, cancel", req("root", true, false, 0), local.SignalSent},
		{"no such client", signalRequest{pid: keyPIDOf(0, 8), user: "app", terminate: true}, local.SignalNoClient},
		{"terminate, session does not end within 20 ms", req("app", false, true, 20*time.Millisecond), local.SignalStillRunning},
	} {
		if got := srv.signalClient(ctx, tc.r); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
	if got := <-read; !strings.Contains(got, "57P01") || !strings.Contains(got, "terminating connection due to administrator command") {
		t.Errorf("the client read %q, want the FATAL 57P01", got)
	}
	srv.sessionEnded(ss) // the watch the timed-out call left
	done := make(chan local.SignalResult, 1)
	go func() { done <- srv.signalClient(ctx, req("root", true, true, 10*time.Second)) }()
	waited := func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return srv.ends[ss] != nil
	}
	for !waited() {
		runtime.Gosched()
	}
	srv.unregister(ss)
	srv.sessionEnded(ss)
	if got := <-done; got != local.SignalSent {
		t.Errorf("terminate with a timeout, session ended: %d, want %d", got, local.SignalSent)
	}
	if len(srv.ends) != 0 {
		t.Errorf("%d end watches left", len(srv.ends))
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	srv.sessions[ss.PID()] = ss
	if got := srv.signalClient(cctx, req("app", false, true, 10*time.Second)); got != local.SignalCanceled {
		t.Errorf("terminate with a timeout, caller cancelled: %d, want %d", got, local.SignalCanceled)
	}
}
