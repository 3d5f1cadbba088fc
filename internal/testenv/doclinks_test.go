package testenv

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// mdLink matches an inline Markdown link or image target: ](target).
var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// docFiles returns README.md, CHANGELOG.md and every docs/*.md of the module.
func docFiles(t *testing.T) []string {
	t.Helper()
	root := ModuleRoot()
	files := []string{filepath.Join(root, "README.md"), filepath.Join(root, "CHANGELOG.md")}
	more, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	return append(files, more...)
}

// headingAnchors returns the anchors GitHub gives the headings of a
// Markdown file (lower case, punctuation dropped, spaces as hyphens,
// repeats numbered -1, -2, …), outside fenced code blocks.
func headingAnchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	anchors := map[string]bool{}
	seen := map[string]int{}
	fenced := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
			continue
		}
		if fenced || !strings.HasPrefix(line, "#") {
			continue
		}
		text := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(text) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			anchors[a+"-"+strconv.Itoa(n)] = true
		} else {
			anchors[a] = true
		}
		seen[a]++
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return anchors
}

// TestDocsRelativeLinksResolve checks that every relative link in README.md,
// CHANGELOG.md and docs/*.md names a file or directory of the module, and
// that a #fragment into a Markdown file names one of its headings.
func TestDocsRelativeLinksResolve(t *testing.T) {
	for _, doc := range docFiles(t) {
		data, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(ModuleRoot(), doc)
		fenced := false
		for i, line := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(line, "```") {
				fenced = !fenced
				continue
			}
			if fenced {
				continue
			}
			for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				path, frag, _ := strings.Cut(target, "#")
				file := doc
				if path != "" {
					file = filepath.Join(filepath.Dir(doc), filepath.FromSlash(path))
					if _, err := os.Stat(file); err != nil {
						t.Errorf("%s:%d: link %q: no such file", rel, i+1, target)
						continue
					}
				}
				if frag != "" && strings.HasSuffix(file, ".md") && !headingAnchors(t, file)[frag] {
					t.Errorf("%s:%d: link %q: no heading with anchor #%s", rel, i+1, target, frag)
				}
			}
		}
	}
}
