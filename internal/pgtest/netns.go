package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// StartInNetNS creates and starts a fresh cluster, like Start, in a network
// namespace of its own. The server listens on port 5432 of the namespace's
// address, which is its Host, and on its unix socket (reachable from
// anywhere: unix sockets do not belong to network namespaces). Partition
// and Heal cut it off the network and bring it back. Destroy removes the
// namespace.
//
// The namespaces of a test process hang off one "hub" namespace that
// routes between them and the root namespace (10.R.0.0/16, R picked per
// process so concurrent test binaries do not collide): every cluster in a
// namespace reaches every other one at its Host, and the root namespace
// (the test) reaches them all. A cluster in the root namespace listens on
// 127.0.0.1 only, so namespaces cannot reach it, except for standbys made
// by StartStandby of a cluster in a namespace: they also listen on the
// hub's root address (10.R.0.1), so after a failover the old primary can
// follow them.
//
// It needs root and the ip and tc tools; otherwise the error wraps
// ErrUnavailable.
func StartInNetNS(ctx context.Context) (*Cluster, error) {
	return start(ctx, true)
}

// RequireNetNS starts a cluster with StartInNetNS for t and destroys it when
// t ends. Where that is impossible (not root, no PostgreSQL, no ip/tc, or
// -short) it skips t, or fails it when $CI is non-empty (except under
// -short), like Require.
func RequireNetNS(t testing.TB) *Cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("pgtest: -short: tests that need PostgreSQL do not run")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := StartInNetNS(ctx)
	if err != nil {
		if !errors.Is(err, ErrUnavailable) {
			t.Fatal(err)
		}
		if os.Getenv("CI") != "" {
			t.Fatalf("%v (CI is set)", err)
		}
		t.Skip(err)
	}
	t.Cleanup(func() {
		if err := c.Destroy(); err != nil {
			t.Error(err)
		}
	})
	return c
}

// Partition cuts a cluster started in a network namespace off the network
// without telling anyone: every packet to or from it is silently dropped
// (no RST, no ICMP), so established connections hang and new ones time out
// rather than being refused. Its unix socket keeps working, and so do the
// Cluster's methods, which use it (except those that have the cluster
// connect elsewhere, such as Demote's pg_rewind).
//
// It puts a "blackhole" queueing discipline on both ends of the
// namespace's veth pair, and the neighbour (ARP) entries on both ends are
// permanent, so the kernel never gives up on the peer with EHOSTUNREACH.
//
// PostgreSQL's own timeouts apply: a standby notices a partitioned primary
// after wal_receiver_timeout (60 s), a primary a partitioned standby after
// wal_sender_timeout (60 s), and a primary's fast shutdown (Stop,
// Switchover, Demote) waits up to wal_sender_timeout for a partitioned
// standby to confirm the last WAL; StopImmediate does not (nor does
// Destroy, which stops clusters of the namespaces' network immediately).
func (c *Cluster) Partition() error {
	if c.ns == nil {
		return fmt.Errorf("pgtest: partition %s: not in a network namespace (use StartInNetNS)", c.Name)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	ctx := context.Background()
	if err := tool(ctx, "tc", "-n", c.ns.hub.name, "qdisc", "replace", "dev", c.ns.hubDev, "root", "blackhole"); err != nil {
		return fmt.Errorf("pgtest: partition %s: %w", c.Name, err)
	}
	c.partitioned = true
	if err := tool(ctx, "tc", "-n", c.ns.name, "qdisc", "replace", "dev", nsDev, "root", "blackhole"); err != nil {
		return fmt.Errorf("pgtest: partition %s: %w", c.Name, err)
	}
	return nil
}

// Heal undoes Partition: packets flow again, and connections that survived
// the partition go on once TCP retransmits.
func (c *Cluster) Heal() error {
	if c.ns == nil {
		return fmt.Errorf("pgtest: heal %s: not in a network namespace (use StartInNetNS)", c.Name)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.partitioned {
		return nil
	}
	ctx := context.Background()
	var errs []error
	for _, a := range [][]string{{c.ns.name, nsDev}, {c.ns.hub.name, c.ns.hubDev}} {
		if err := tool(ctx, "tc", "-n", a[0], "qdisc", "del", "dev", a[1], "root"); err != nil &&
			!strings.Contains(err.Error(), "handle of zero") {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("pgtest: heal %s: %w", c.Name, errors.Join(errs...))
	}
	c.partitioned = false
	return nil
}

// nsDev is the name of the veth end inside a cluster's namespace.
const nsDev = "eth0"

// netNS is a cluster's network namespace: one veth pair to the hub,
// 10.R.x.y+1 on the hub's end, 10.R.x.y+2 (the cluster's Host) on the
// namespace's.
type netNS struct {
	hub     *hub
	name    string // ip netns name
	hubDev  string // veth end in the hub
	addr    string // address in the namespace
	hubAddr string // address of the hub's end (the namespace's default gateway)
	watch   *watchdog
}

func (n *netNS) path() string { return "/run/netns/" + n.name }

// newNetNS makes a namespace connected to the process's hub.
func newNetNS(ctx context.Context) (*netNS, error) {
	h, err := acquireHub(ctx)
	if err != nil {
		return nil, err
	}
	hubMu.Lock()
	idx := h.next
	h.next++
	hubMu.Unlock()
	if idx >= 1<<14 {
		h.release()
		return nil, fmt.Errorf("pgtest: out of network namespace addresses")
	}
	n := &netNS{
		hub:     h,
		name:    fmt.Sprintf("lp%dn%d", h.r, idx),
		hubDev:  fmt.Sprintf("c%d", idx),
		hubAddr: h.addr(idx, 1),
		addr:    h.addr(idx, 2),
	}
	if err := tool(ctx, "ip", "netns", "add", n.name); err != nil {
		h.release()
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	n.watch, err = startWatchdog("/", nil, `if read -r _; then exit 0; fi
ip netns del "$1"`, n.name)
	if err != nil {
		_ = n.destroy()
		return nil, err
	}
	hubMAC, nsMAC := h.mac(idx, 1), h.mac(idx, 2)
	steps := [][]string{
		{"ip", "-n", h.name, "link", "add", n.hubDev, "address", hubMAC, "type", "veth",
			"peer", "name", nsDev, "address", nsMAC, "netns", n.name},
		{"ip", "-n", h.name, "addr", "add", n.hubAddr + "/30", "dev", n.hubDev},
		{"ip", "-n", h.name, "neigh", "replace", n.addr, "lladdr", nsMAC, "dev", n.hubDev, "nud", "permanent"},
		{"ip", "-n", h.name, "link", "set", n.hubDev, "up"},
		{"ip", "-n", n.name, "link", "set", "lo", "up"},
		{"ip", "-n", n.name, "addr", "add", n.addr + "/30", "dev", nsDev},
		{"ip", "-n", n.name, "neigh", "replace", n.hubAddr, "lladdr", hubMAC, "dev", nsDev, "nud", "permanent"},
		{"ip", "-n", n.name, "link", "set", nsDev, "up"},
		{"ip", "-n", n.name, "route", "add", "default", "via", n.hubAddr},
	}
	for _, s := range steps {
		if err := tool(ctx, s[0], s[1:]...); err != nil {
			_ = n.destroy()
			return nil, fmt.Errorf("pgtest: network namespace %s: %w", n.name, err)
		}
	}
	return n, nil
}

// destroy deletes the namespace (the kernel removes it, and its veth pair,
// once the last process in it exits) and releases the hub.
func (n *netNS) destroy() error {
	err := tool(context.Background(), "ip", "netns", "del", n.name)
	n.watch.stop()
	n.hub.release()
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	return nil
}

// hub is a network namespace that routes between the root namespace and
// the namespaces of the clusters of one test process. Its networks are
// 10.r.0.0/16: 10.r.0.0/30 links it to the root namespace (10.r.0.1 root,
// 10.r.0.2 hub); namespace number i gets the i-th /30.
type hub struct {
	r       int    // second octet
	name    string // ip netns name
	rootDev string // veth end in the root namespace
	next    int    // next namespace number
	refs    int
	watch   *watchdog
}

var (
	hubMu  sync.Mutex
	theHub *hub
)

// acquireHub returns the process's hub, creating it if needed, with one
// more reference.
func acquireHub(ctx context.Context) (*hub, error) {
	hubMu.Lock()
	defer hubMu.Unlock()
	if theHub == nil {
		h, err := newHub(ctx)
		if err != nil {
			return nil, err
		}
		theHub = h
	}
	theHub.refs++
	return theHub, nil
}

// acquire adds a reference to h, which must hold one already.
func (h *hub) acquire() *hub {
	hubMu.Lock()
	defer hubMu.Unlock()
	h.refs++
	return h
}

// release drops a reference; the last one deletes the hub.
func (h *hub) release() {
	hubMu.Lock()
	defer hubMu.Unlock()
	h.refs--
	if h.refs > 0 {
		return
	}
	h.destroy()
	if theHub == h {
		theHub = nil
	}
}

func (h *hub) network() string  { return fmt.Sprintf("10.%d.0.0/16", h.r) }
func (h *hub) rootAddr() string { return fmt.Sprintf("10.%d.0.1", h.r) }

// addr returns host (1 hub, 2 namespace) of the idx-th /30.
func (h *hub) addr(idx, host int) string {
	b := idx*4 + host
	return fmt.Sprintf("10.%d.%d.%d", h.r, b>>8, b&255)
}

// mac returns a locally administered MAC address for side (1 hub, 2
// namespace) of the idx-th link.
func (h *hub) mac(idx, side int) string {
	return fmt.Sprintf("02:6c:%02x:%02x:%02x:%02x", h.r, idx>>8, idx&255, side)
}

// newHub picks a 10.r.0.0/16 no route or address of the machine touches,
// claims it with a blackhole route (adding a route that exists fails, so
// two processes cannot claim the same one), builds the hub namespace and
// points the route at it.
func newHub(ctx context.Context) (*hub, error) {
	for _, t := range []string{"ip", "tc", "nsenter"} {
		if _, err := exec.LookPath(t); err != nil {
			return nil, fmt.Errorf("%w: network namespaces need %s: %v", ErrUnavailable, t, err)
		}
	}
	var used bytes.Buffer
	for _, args := range [][]string{{"-4", "route", "show", "table", "all"}, {"-4", "-o", "addr", "show"}} {
		out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
		if err != nil {
			return nil, fmt.Errorf("%w: ip %s: %v\n%s", ErrUnavailable, strings.Join(args, " "), err, out)
		}
		used.Write(out)
	}
	first := 100 + os.Getpid()%150
	var lastErr error
	for i := 0; i < 150; i++ {
		r := 100 + (first-100+i)%150
		if strings.Contains(used.String(), fmt.Sprintf("10.%d.", r)) {
			continue
		}
		h := &hub{r: r, name: fmt.Sprintf("lp%dh", r), rootDev: fmt.Sprintf("lp%dr", r), next: 1}
		if err := tool(ctx, "ip", "route", "add", "blackhole", h.network()); err != nil {
			if strings.Contains(err.Error(), "Operation not permitted") {
				return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
			}
			lastErr = err
			continue // claimed by someone else meanwhile
		}
		if err := tool(ctx, "ip", "netns", "add", h.name); err != nil {
			h.destroy()
			return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
		}
		if err := h.build(ctx); err != nil {
			h.destroy()
			return nil, fmt.Errorf("pgtest: network namespace hub: %w", err)
		}
		return h, nil
	}
	return nil, fmt.Errorf("pgtest: no free 10.x.0.0/16 for network namespaces (last error: %v)", lastErr)
}

func (h *hub) build(ctx context.Context) error {
	var err error
	h.watch, err = startWatchdog("/", nil, `if read -r _; then exit 0; fi
ip route del "$2"
ip netns del "$1"`, h.name, h.network())
	if err != nil {
		return err
	}
	hubEnd := fmt.Sprintf("10.%d.0.2", h.r)
	steps := [][]string{
		{"ip", "link", "add", h.rootDev, "type", "veth", "peer", "name", "uplink", "netns", h.name},
		{"ip", "addr", "add", h.rootAddr() + "/30", "dev", h.rootDev},
		{"ip", "link", "set", h.rootDev, "up"},
		{"ip", "-n", h.name, "link", "set", "lo", "up"},
		{"ip", "-n", h.name, "addr", "add", hubEnd + "/30", "dev", "uplink"},
		{"ip", "-n", h.name, "link", "set", "uplink", "up"},
		{"ip", "netns", "exec", h.name, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"},
		{"ip", "route", "replace", h.network(), "via", hubEnd, "dev", h.rootDev},
	}
	for _, s := range steps {
		if err := tool(ctx, s[0], s[1:]...); err != nil {
			return err
		}
	}
	return nil
}

// destroy removes the route (first, while our address still marks the
// network as taken) and the namespace; the kernel then removes its veth
// pairs.
func (h *hub) destroy() {
	ctx := context.Background()
	_ = tool(ctx, "ip", "route", "del", h.network())
	_ = tool(ctx, "ip", "netns", "del", h.name)
	h.watch.stop()
}

// tool runs a networking command as ourselves (root).
func tool(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}
