package proxy

import (
	"os/exec"
	"strings"
	"testing"
)

// packageLayers are lockpool's packages under proxy from the top down: a
// package may import only packages after it in this list.
var packageLayers = []string{
	"proxy",
	"proxy/console",
	"proxy/session",
	"proxy/appstate",
	"proxy/local",
	"proxy/backend",
	"proxy/startupparam",
	"proxy/txcmd",
}

// TestPackageLayers checks that imports under proxy only go down the
// layers, as go list reports them.
func TestPackageLayers(t *testing.T) {
	const module = "github.com/lockpool/lockpool/"
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, "./...").Output()
	if err != nil {
		t.Skipf("go list: %v", err)
	}
	rank := map[string]int{}
	for i, p := range packageLayers {
		rank[module+p] = i
	}
	seen := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		from, ok := rank[f[0]]
		if !ok {
			if strings.HasPrefix(f[0], module+"proxy") {
				t.Errorf("package %s is not in packageLayers", f[0])
			}
			continue
		}
		seen++
		for _, imp := range f[1:] {
			if to, ok := rank[imp]; ok && to <= from {
				t.Errorf("%s imports %s, which is not below it", f[0], imp)
			}
		}
	}
	if seen != len(packageLayers) {
		t.Errorf("go list showed %d of the %d packages of packageLayers", seen, len(packageLayers))
	}
}
