package proxy

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/lockpool/lockpool/config"
)

// reloadBase is the configuration TestReloadAgreesWithTable starts from.
// users[0] is referenced by no application, so it may be renamed.
func reloadBase() map[string]any {
	return map[string]any{
		"server":       map[string]any{"host": "127.0.0.1", "port": 1, "max_connections": 10, "connect_timeout": "1s"},
		"users":        []any{map[string]any{"name": "spare", "password": "pw2"}, map[string]any{"name": "app", "password": "pw"}},
		"applications": []any{map[string]any{"name": "api", "user": "app"}},
		"instance_id":  "base",
	}
}

// reloadChanges gives, for every value key, a change to reloadBase: the
// key's new value, and other keys the change needs (a section's required
// keys). A key missing here fails the test.
var reloadChanges = map[string][][2]any{
	"listen":                       {{"listen", "127.0.0.1:7432"}},
	"admin_listen":                 {{"admin_listen", "127.0.0.1:9931"}},
	"auth_method":                  {{"auth_method", "md5"}},
	"instance_id":                  {{"instance_id", "other"}},
	"leak_check_interval":          {{"leak_check_interval", "3s"}},
	"shutdown_timeout":             {{"shutdown_timeout", "3s"}},
	"handover_socket":              {{"handover_socket", "/tmp/lockpool-test.sock"}},
	"client_login_timeout":         {{"client_login_timeout", "3s"}},
	"idle_transaction_timeout":     {{"idle_transaction_timeout", "3s"}},
	"max_message_size":             {{"max_message_size", "2MB"}},
	"max_client_connections":       {{"max_client_connections", 7}},
	"event_loops":                  {{"event_loops", 3}},
	"io_uring":                     {{"io_uring", false}},
	"admin_token":                  {{"admin_token", "tok"}},
	"log_format":                   {{"log_format", "json"}},
	"log_level":                    {{"log_level", "debug"}},
	"log_pins_over":                {{"log_pins_over", "3s"}},
	"admin_users":                  {{"admin_users", "app"}},
	"tls.cert_file":                {{"tls.cert_file", "c.pem"}, {"tls.key_file", "k.pem"}},
	"tls.key_file":                 {{"tls.key_file", "k.pem"}, {"tls.cert_file", "c.pem"}},
	"tls.required":                 {{"tls.required", true}, {"tls.cert_file", "c.pem"}, {"tls.key_file", "k.pem"}},
	"server.host":                  {{"server.host", "/tmp"}},
	"server.port":                  {{"server.port", 2}},
	"server.max_connections":       {{"server.max_connections", 11}},
	"server.idle_timeout":          {{"server.idle_timeout", "3s"}},
	"server.max_lifetime":          {{"server.max_lifetime", "3s"}},
	"server.connect_timeout":       {{"server.connect_timeout", "2s"}},
	"server.dial_concurrency":      {{"server.dial_concurrency", 2}},
	"server.tls":                   {{"server.tls", "disable"}},
	"server.ca_file":               {{"server.ca_file", "/ca.pem"}, {"server.tls", "require"}},
	"server.hosts":                 {{"server.host", nil}, {"server.port", nil}, {"server.hosts", []any{"127.0.0.1:1", "127.0.0.1:2"}}},
	"server.health_check_interval": {{"server.health_check_interval", "2s"}},
	"server.tcp_user_timeout":      {{"server.tcp_user_timeout", "5s"}},
	"users[].name":                 {{"users[].name", "spare2"}},
	"users[].password":             {{"users[].password", "pw3"}},

	"applications[].name":                    {{"applications[].name", "api2"}},
	"applications[].user":                    {{"applications[].user", "spare"}},
	"applications[].database":                {{"applications[].database", "db"}},
	"applications[].pool_mode":               {{"applications[].pool_mode", "session"}},
	"applications[].max_connections":         {{"applications[].max_connections", 5}},
	"applications[].max_pinned":              {{"applications[].max_pinned", 2}},
	"applications[].advisory_locks":          {{"applications[].advisory_locks", "pin"}},
	"applications[].session_state":           {{"applications[].session_state", "reject"}},
	"applications[].listen":                  {{"applications[].listen", "pin"}},
	"applications[].wait_timeout":            {{"applications[].wait_timeout", "3s"}},
	"applications[].max_prepared_statements": {{"applications[].max_prepared_statements", 7}},
	"applications[].budget_scope":            {{"applications[].budget_scope", "cluster"}, {"cluster.name", "c"}},
	"applications[].min_share":               {{"applications[].min_share", 2}},
	"applications[].max_clients":             {{"applications[].max_clients", 9}},
	"applications[].target":                  {{"applications[].target", "any"}},
	"applications[].max_lag":                 {{"applications[].max_lag", "3s"}},

	"auth_query.user":      {{"auth_query.user", "aq"}},
	"auth_query.password":  {{"auth_query.password", "aqpw"}, {"auth_query.user", "aq"}},
	"auth_query.database":  {{"auth_query.database", "auth"}, {"auth_query.user", "aq"}},
	"auth_query.query":     {{"auth_query.query", "SELECT 1, 2"}, {"auth_query.user", "aq"}},
	"auth_query.cache_ttl": {{"auth_query.cache_ttl", "3s"}, {"auth_query.user", "aq"}},

	"leases.schema":          {{"leases.schema", "other"}},
	"leases.max_connections": {{"leases.max_connections", 3}},
	"cluster.name":           {{"cluster.name", "c"}},
	"cluster.database":       {{"cluster.database", "db"}, {"cluster.name", "c"}},
	"cluster.ttl":            {{"cluster.ttl", "9s"}, {"cluster.name", "c"}},
	"cluster.heartbeat":      {{"cluster.heartbeat", "1s"}, {"cluster.name", "c"}},
	"cluster.advertise":      {{"cluster.advertise", "127.0.0.1:1"}, {"cluster.name", "c"}},

	"notifications.max_pending": {{"notifications.max_pending", "2MB"}},
	"locks.max_connections":     {{"locks.max_connections", 3}},
	"locks.max_waiters":         {{"locks.max_waiters", 3}},
}

// setPath writes v at path ("a", "section.key", "list[].key": the list's
// first item) in the YAML tree m; a nil v removes a section's key.
func setPath(m map[string]any, path string, v any) {
	sec, key, nested := strings.Cut(path, ".")
	if !nested {
		m[path] = v
		return
	}
	if v == nil {
		delete(m[sec].(map[string]any), key)
		return
	}
	if list, ok := strings.CutSuffix(sec, "[]"); ok {
		m[list].([]any)[0].(map[string]any)[key] = v
		return
	}
	if m[sec] == nil {
		m[sec] = map[string]any{}
	}
	m[sec].(map[string]any)[key] = v
}

func parseTree(t *testing.T, m map[string]any) *config.Config {
	t.Helper()
	data, err := yaml.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse(data, "reload.yaml", nil)
	if err != nil {
		t.Fatalf("%v\n%s", err, data)
	}
	return cfg
}

// TestReloadAgreesWithTable changes one key at a time and reloads: the
// key is either applied (the reload names no key needing a restart, and
// SHOW CONFIG shows it changeable, with the new value) or reported as
// needing a restart (the reload names it, or its section, and SHOW CONFIG
// shows it not changeable, with the value lockpool started with), as the
// key table marks it. The reference page's column comes from the same
// mark (config.TestReferenceMarksRestartKeys).
func TestReloadAgreesWithTable(t *testing.T) {
	restartSection := map[string]bool{}
	for _, k := range config.Keys() {
		if k.Section && k.Restart {
			restartSection[k.Path] = true
		}
	}
	for _, k := range config.Keys() {
		if k.Section {
			continue
		}
		t.Run(k.Path, func(t *testing.T) {
			change, ok := reloadChanges[k.Path]
			if !ok {
				t.Fatalf("reloadChanges has no change for %s: add one", k.Path)
			}
			started := parseTree(t, reloadBase())
			srv, err := New(Options{Config: started, Logger: slog.New(slog.DiscardHandler), NoLeases: true})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_ = srv.Shutdown(ctx)
			})
			tree := reloadBase()
			for _, kv := range change {
				setPath(tree, kv[0].(string), kv[1])
			}
			cur := parseTree(t, tree)
			reported, err := srv.Reload(cur)
			if err != nil {
				t.Fatal(err)
			}
			name := k.Path
			if sec, _, ok := strings.Cut(k.Path, "."); ok && restartSection[sec] {
				name = sec
			}
			if got := slices.Contains(reported, name); got != k.Restart {
				t.Errorf("reload reported %q; the key table marks %s restart=%v", reported, k.Path, k.Restart)
			}
			if !k.Restart && len(reported) > 0 {
				t.Errorf("reload reported %q for a change of %s, which a reload applies", reported, k.Path)
			}
			if strings.Contains(k.Path, "[]") {
				return // SHOW CONFIG does not list users and applications
			}
			var row *config.Setting
			for _, r := range showConfig(t, srv) {
				if r.Key == k.Path {
					row = &r
				}
			}
			if row == nil {
				t.Fatalf("SHOW CONFIG does not list %s", k.Path)
			}
			if row.Reload == slices.Contains(reported, name) {
				t.Errorf("SHOW CONFIG shows %s changeable=%v, but the reload reported %q", k.Path, row.Reload, reported)
			}
			inForce := cur
			if k.Restart {
				inForce = started
			}
			for _, s := range inForce.Settings() {
				if s.Key == k.Path && s.Value != row.Value {
					t.Errorf("SHOW CONFIG shows %s = %q, want the value in force, %q", k.Path, row.Value, s.Value)
				}
			}
		})
	}
}

// showConfig returns SHOW CONFIG's rows, as the admin HTTP listener
// serves them (/debug/config).
func showConfig(t *testing.T, srv *Server) []config.Setting {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, "/debug/config", nil)
	if tok := srv.Config().AdminToken; tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	rec := httptest.NewRecorder()
	srv.AdminHandler(nil).ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Fatalf("/debug/config: %d %s", rec.Code, rec.Body)
	}
	var rows []config.Setting
	if err := json.Unmarshal(rec.Body.Bytes(), &rows); err != nil {
		t.Fatalf("/debug/config: %v", err)
	}
	return rows
}

// TestReloadCallsOnReload: the console's RELOAD and SIGHUP both go through
// Reload, which hands the new configuration to Options.OnReload (the log
// level is set there).
func TestReloadCallsOnReload(t *testing.T) {
	started := parseTree(t, reloadBase())
	var got *config.Config
	srv, err := New(Options{Config: started, Logger: slog.New(slog.DiscardHandler), NoLeases: true,
		OnReload: func(c *config.Config) { got = c }})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv.Shutdown(context.Background()) }()
	tree := reloadBase()
	tree["log_level"] = "debug"
	cur := parseTree(t, tree)
	if _, err := srv.Reload(cur); err != nil {
		t.Fatal(err)
	}
	if got != cur {
		t.Fatalf("OnReload got %p, want the reloaded config %p", got, cur)
	}
}
