package deploy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"

	"github.com/lockpool/lockpool/config"
	"github.com/lockpool/lockpool/internal/testenv"
)

// manifests are the decoded Kubernetes objects of deploy/kubernetes.
type manifests struct {
	deployments []*appsv1.Deployment
	services    []*corev1.Service
	configMaps  []*corev1.ConfigMap
	secrets     []*corev1.Secret
	pdbs        []*policyv1.PodDisruptionBudget
}

// decodeStrict decodes one YAML document into the k8s.io/api type its kind
// names; unknown fields, unknown kinds and wrong apiVersions are errors.
func decodeStrict(doc []byte, m *manifests) error {
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := yaml.Unmarshal(doc, &head); err != nil {
		return err
	}
	into := func(want string, obj any) error {
		if head.APIVersion != want {
			return fmt.Errorf("%s: apiVersion %q, want %q", head.Kind, head.APIVersion, want)
		}
		return yaml.UnmarshalStrict(doc, obj)
	}
	switch head.Kind {
	case "Deployment":
		return decodeAs(into, &m.deployments, "apps/v1")
	case "Service":
		return decodeAs(into, &m.services, "v1")
	case "ConfigMap":
		return decodeAs(into, &m.configMaps, "v1")
	case "Secret":
		return decodeAs(into, &m.secrets, "v1")
	case "PodDisruptionBudget":
		return decodeAs(into, &m.pdbs, "policy/v1")
	}
	return fmt.Errorf("unexpected kind %q", head.Kind)
}

// decodeAs appends a new object to list and decodes the document into it
// with into, which requires apiVersion.
func decodeAs[T any](into func(apiVersion string, obj any) error, list *[]*T, apiVersion string) error {
	o := new(T)
	*list = append(*list, o)
	return into(apiVersion, o)
}

// splitDocs splits a multi-document YAML file at its "---" lines.
func splitDocs(data []byte) [][]byte {
	var docs [][]byte
	for _, d := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(data), -1) {
		if strings.TrimSpace(regexp.MustCompile(`(?m)^\s*#.*$`).ReplaceAllString(d, "")) != "" {
			docs = append(docs, []byte(d))
		}
	}
	return docs
}

func loadManifests(t *testing.T) *manifests {
	t.Helper()
	files, err := filepath.Glob("kubernetes/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	m := &manifests{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range splitDocs(data) {
			if err := decodeStrict(doc, m); err != nil {
				t.Fatalf("%s (document %d): %v", f, i+1, err)
			}
		}
	}
	return m
}

func TestDecodeStrictRejects(t *testing.T) {
	for _, tc := range []struct{ name, doc, want string }{
		{"unknown field", "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {selectr: {a: b}}\n", "unknown field"},
		{"unknown nested field", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  template:\n    spec:\n      containers: [{name: c, image: i, readinesProbe: {}}]\n", "unknown field"},
		{"wrong type", "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: x}\nspec: {minAvailable: [1]}\n", "unmarshal"},
		{"wrong apiVersion", "apiVersion: policy/v1beta1\nkind: PodDisruptionBudget\nmetadata: {name: x}\n", "apiVersion"},
		{"unknown kind", "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n", "unexpected kind"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := decodeStrict([]byte(tc.doc), &manifests{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("decodeStrict = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestKubernetesManifests(t *testing.T) {
	m := loadManifests(t)
	if len(m.deployments) != 1 || len(m.services) != 1 || len(m.configMaps) != 1 || len(m.pdbs) != 1 || len(m.secrets) != 1 {
		t.Fatalf("want one Deployment, Service, ConfigMap, PodDisruptionBudget and example Secret; got %d, %d, %d, %d, %d",
			len(m.deployments), len(m.services), len(m.configMaps), len(m.pdbs), len(m.secrets))
	}
	dep, svc, cm, pdb, sec := m.deployments[0], m.services[0], m.configMaps[0], m.pdbs[0], m.secrets[0]
	pod := dep.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]

	// The config in the ConfigMap loads, with the Secret's variables.
	env := map[string]string{}
	for k, v := range sec.StringData {
		env[k] = v
	}
	if len(c.EnvFrom) != 1 || c.EnvFrom[0].SecretRef == nil || c.EnvFrom[0].SecretRef.Name != sec.Name {
		t.Errorf("the container does not take its environment from the Secret %q", sec.Name)
	}
	cfg, err := config.Parse([]byte(cm.Data["config.yaml"]), "configmap config.yaml", envLookup(env))
	if err != nil {
		t.Fatalf("the ConfigMap's config.yaml does not load: %v", err)
	}
	if cfg.AdminToken == "" {
		t.Error("the admin listener is reachable from the cluster without admin_token")
	}

	// Ports: the container's named ports are lockpool's listeners, and the
	// Service and the probes use them.
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	for name, addr := range map[string]string{"postgres": cfg.Listen, "admin": cfg.AdminListen} {
		_, port, _ := net.SplitHostPort(addr)
		if strconv.Itoa(int(ports[name])) != port {
			t.Errorf("container port %q is %d, but the config listens on %s", name, ports[name], addr)
		}
	}
	for _, sp := range svc.Spec.Ports {
		if _, ok := ports[sp.TargetPort.StrVal]; !ok {
			t.Errorf("Service port %q targets %q, which the container does not name", sp.Name, sp.TargetPort.String())
		}
	}
	for name, probe := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		want := map[string]string{"readiness": "/health/ready", "liveness": "/up"}[name]
		if probe == nil || probe.HTTPGet == nil || probe.HTTPGet.Path != want || probe.HTTPGet.Port.StrVal != "admin" {
			t.Errorf("%s probe: %+v, want GET %s on port admin", name, probe, want)
		}
	}

	// Selectors match the pods.
	labels := dep.Spec.Template.Labels
	for what, sel := range map[string]map[string]string{"Deployment": dep.Spec.Selector.MatchLabels, "Service": svc.Spec.Selector, "PodDisruptionBudget": pdb.Spec.Selector.MatchLabels} {
		if len(sel) == 0 {
			t.Errorf("%s selects nothing", what)
		}
		for k, v := range sel {
			if labels[k] != v {
				t.Errorf("%s selects %s=%s, which the pods do not have", what, k, v)
			}
		}
	}
	if pdb.Spec.MaxUnavailable == nil && pdb.Spec.MinAvailable == nil {
		t.Error("the PodDisruptionBudget limits nothing")
	}

	// Graceful termination: preStop sleep + shutdown_timeout fit in the grace period.
	grace := time.Duration(*pod.TerminationGracePeriodSeconds) * time.Second
	var preStop time.Duration
	if c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Sleep != nil {
		preStop = time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second
	}
	if preStop+cfg.ShutdownTimeout >= grace || grace > preStop+cfg.ShutdownTimeout+30*time.Second {
		t.Errorf("terminationGracePeriodSeconds %s does not match preStop %s + shutdown_timeout %s (plus a margin under 30 s)", grace, preStop, cfg.ShutdownTimeout)
	}

	// Hardening: non-root, no privilege escalation, read-only root.
	sc := c.SecurityContext
	if pod.SecurityContext == nil || pod.SecurityContext.RunAsNonRoot == nil || !*pod.SecurityContext.RunAsNonRoot ||
		sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Error("the pod is not hardened (runAsNonRoot, allowPrivilegeEscalation false, readOnlyRootFilesystem)")
	}
}

// envLookup looks variables up in env.
func envLookup(env map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := env[k]; return v, ok }
}

// dockerfileEnv returns the variables the Dockerfile's ENV lines set.
func dockerfileEnv(t *testing.T) map[string]string {
	t.Helper()
	data, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	joined := strings.ReplaceAll(string(data), "\\\n", " ")
	sc := bufio.NewScanner(strings.NewReader(joined))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "ENV ")
		if !ok {
			continue
		}
		for _, kv := range strings.Fields(rest) {
			k, v, _ := strings.Cut(kv, "=")
			env[k] = v
		}
	}
	if len(env) == 0 {
		t.Fatal("the Dockerfile sets no ENV")
	}
	return env
}

func TestDockerImageConfig(t *testing.T) {
	data, err := os.ReadFile("docker/config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dockerfile, _ := os.ReadFile("../Dockerfile")
	for _, want := range []string{"COPY deploy/docker/config.yaml /etc/lockpool/config.yaml", "USER 65532:65532", "FROM gcr.io/distroless/static-debian12:nonroot"} {
		if !bytes.Contains(dockerfile, []byte(want)) {
			t.Errorf("the Dockerfile has no %q", want)
		}
	}
	for _, tc := range []struct {
		name string
		set  map[string]string
		want string // "" = loads
	}{
		{"defaults plus the required variables", map[string]string{"PGHOST": "db", "APP_PASSWORD": "pw"}, ""},
		{"no PGHOST", map[string]string{"APP_PASSWORD": "pw"}, "PGHOST"},
		{"no APP_PASSWORD", map[string]string{"PGHOST": "db"}, "APP_PASSWORD"},
		{"admin on every interface without a token", map[string]string{"PGHOST": "db", "APP_PASSWORD": "pw", "LOCKPOOL_ADMIN_LISTEN": "0.0.0.0:9930"}, "admin_token is required"},
		{"admin on every interface with a token", map[string]string{"PGHOST": "db", "APP_PASSWORD": "pw", "LOCKPOOL_ADMIN_LISTEN": "0.0.0.0:9930", "LOCKPOOL_ADMIN_TOKEN": "t"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := dockerfileEnv(t)
			for k, v := range tc.set {
				env[k] = v
			}
			cfg, err := config.Parse(data, "docker/config.yaml", envLookup(env))
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("does not load: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one naming %q", err, tc.want)
			case tc.want == "" && tc.set["LOCKPOOL_ADMIN_LISTEN"] == "" && cfg.AdminListen != "127.0.0.1:9930":
				t.Fatalf("the image's default admin_listen is %q, want loopback", cfg.AdminListen)
			case tc.want == "" && (cfg.Listen != "0.0.0.0:6432" || cfg.LogFormat != "json" || cfg.Server.Host != "db"):
				t.Fatalf("config: listen %q, log_format %q, server.host %q", cfg.Listen, cfg.LogFormat, cfg.Server.Host)
			}
		})
	}
}

// systemdUnitLines are the lines each unit file in systemd/ must have
// (TestSystemdUnit, TestSystemdSlotUnit).
var systemdUnitLines = map[string][]string{
	"lockpool.service": {
		"ExecStart=/usr/local/bin/lockpool -config /etc/lockpool/config.yaml",
		"ExecReload=/usr/local/bin/lockpool -check -config /etc/lockpool/config.yaml",
		"ExecReload=/bin/kill -HUP $MAINPID",
		"KillSignal=SIGTERM",
		"User=lockpool",
		"NoNewPrivileges=yes",
	},
	"lockpool@.service": {
		"Type=notify",
		"ExecStart=/usr/local/bin/lockpool -config /etc/lockpool/config.yaml",
		"ExecReload=/bin/kill -HUP $MAINPID",
		"KillSignal=SIGTERM",
		"User=lockpool",
		"RuntimeDirectory=lockpool",
		"RuntimeDirectoryMode=0700",
		"RuntimeDirectoryPreserve=yes",
		"#   handover_socket: /run/lockpool/handover.sock",
		"#   systemctl enable --now lockpool@b && systemctl disable --now lockpool@a",
	},
}

// checkSystemdUnit requires the unit file to have each of its
// systemdUnitLines and a TimeoutStopSec that leaves the default
// shutdown_timeout (30s) time to drain.
func checkSystemdUnit(t *testing.T, file string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("systemd", file))
	if err != nil {
		t.Fatal(err)
	}
	unit := string(data)
	for _, want := range systemdUnitLines[file] {
		if !strings.Contains(unit, "\n"+want+"\n") {
			t.Errorf("%s has no line %q", file, want)
		}
	}
	m := regexp.MustCompile(`(?m)^TimeoutStopSec=(\d+)$`).FindStringSubmatch(unit)
	if m == nil {
		t.Fatal("no TimeoutStopSec")
	}
	if n, _ := strconv.Atoi(m[1]); time.Duration(n)*time.Second <= 30*time.Second {
		t.Errorf("TimeoutStopSec=%s does not leave the default shutdown_timeout (30s) time to drain", m[1])
	}
}

func TestSystemdUnit(t *testing.T) {
	checkSystemdUnit(t, "lockpool.service")
}

// TestSystemdSlotUnit checks the two-slot unit for restarts that refuse no
// one: the same command as lockpool.service, Type=notify (systemctl start
// returns once the new slot accepts), a runtime directory for the handover
// socket that survives the other slot's stop, and the drain's margin.
func TestSystemdSlotUnit(t *testing.T) {
	checkSystemdUnit(t, "lockpool@.service")
}

// dashboard is the part of a Grafana dashboard the test reads.
type dashboard struct {
	Title  string  `json:"title"`
	Panels []panel `json:"panels"`
}

type panel struct {
	Type    string `json:"type"`
	Title   string `json:"title"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // inside collapsed rows
}

var metricName = regexp.MustCompile(`\blockpool_[a-z_]+`)

// documentedMetricNames is the set of metrics docs/metrics.md documents.
func documentedMetricNames(t *testing.T) map[string]bool {
	t.Helper()
	documented, err := testenv.DocumentedMetrics()
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for _, m := range documented {
		known[m.Name] = true
	}
	return known
}

func TestGrafanaDashboard(t *testing.T) {
	data, err := os.ReadFile("grafana/lockpool.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatal(err)
	}
	known := documentedMetricNames(t)
	used := map[string]bool{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, tg := range p.Targets {
				names := metricName.FindAllString(tg.Expr, -1)
				if len(names) == 0 {
					t.Errorf("panel %q: query %q names no lockpool metric", p.Title, tg.Expr)
				}
				for _, n := range names {
					base := n
					for _, suf := range []string{"_bucket", "_count", "_sum"} {
						if b, ok := strings.CutSuffix(n, suf); ok && known[b] {
							base = b
						}
					}
					if !known[base] {
						t.Errorf("panel %q: %s is not a documented metric", p.Title, n)
					}
					used[base] = true
				}
			}
		}
	}
	walk(d.Panels)
	var missing []string
	for name := range known {
		if !used[name] {
			missing = append(missing, name)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("no panel shows %v", missing)
	}
}

// TestAlertRulesNameDocumentedMetrics: every metric alerts.yml queries is
// documented (promtool checks the syntax and fires each alert in CI).
func TestAlertRulesNameDocumentedMetrics(t *testing.T) {
	data, err := os.ReadFile("prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `json:"alert"`
				Expr  string `json:"expr"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(data, &rules); err != nil {
		t.Fatal(err)
	}
	known := documentedMetricNames(t)
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			n++
			for _, name := range metricName.FindAllString(r.Expr, -1) {
				if b, ok := strings.CutSuffix(name, "_bucket"); ok {
					name = b
				}
				if !known[name] {
					t.Errorf("alert %s: %s is not a documented metric", r.Alert, name)
				}
			}
		}
	}
	if n < 7 {
		t.Errorf("%d alerts, want at least 7", n)
	}
}
