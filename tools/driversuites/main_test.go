package main

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseDSN(t *testing.T) {
	for _, tc := range []struct {
		dsn  string
		want target
	}{
		{"postgres://u:p%40w@db.example:6502/appdb?sslmode=disable", target{"db.example", "6502", "u", "p@w", "appdb"}},
		{"postgresql://u@127.0.0.1/", target{"127.0.0.1", "5432", "u", "", "u"}},
		{"host=127.0.0.1 port=5502 user=drv password='a b\\'c' dbname=pqgo sslmode=disable", target{"127.0.0.1", "5502", "drv", "a b'c", "pqgo"}},
		{"user = drv  password=", target{"127.0.0.1", "5432", "drv", "", "drv"}},
	} {
		got, err := parseDSN(tc.dsn)
		if err != nil || got != tc.want {
			t.Errorf("parseDSN(%q) = %+v, %v; want %+v", tc.dsn, got, err, tc.want)
		}
	}
	for _, bad := range []string{"host=x", "user='drv", "user"} {
		if _, err := parseDSN(bad); err == nil {
			t.Errorf("parseDSN(%q) succeeded", bad)
		}
	}
	tg := target{"::1", "6502", "u", "p w", "db"}
	if got, want := tg.url(), "postgres://u:p%20w@[::1]:6502/db?sslmode=disable"; got != want {
		t.Errorf("url() = %q, want %q", got, want)
	}
}

func TestParseTestJSON(t *testing.T) {
	const out = `{"Action":"start","Package":"example.com/m"}
{"Action":"run","Package":"example.com/m","Test":"TestA"}
{"Action":"run","Package":"example.com/m","Test":"TestA/sub"}
{"Action":"fail","Package":"example.com/m","Test":"TestA/sub"}
{"Action":"fail","Package":"example.com/m","Test":"TestA"}
{"Action":"run","Package":"example.com/m","Test":"TestB"}
{"Action":"skip","Package":"example.com/m","Test":"TestB"}
{"Action":"run","Package":"example.com/m","Test":"TestC"}
{"Action":"output","Package":"example.com/m","Test":"TestC","Output":"panic: boom\n"}
{"Action":"fail","Package":"example.com/m"}
{"Action":"run","Package":"example.com/m/sub/pkg","Test":"TestD"}
{"Action":"pass","Package":"example.com/m/sub/pkg","Test":"TestD"}
{"Action":"pass","Package":"example.com/m/sub/pkg"}
not json: a build error line
{"Action":"fail","Package":"example.com/m/broken"}
{"Action":"skip","Package":"example.com/m/notests"}
`
	got, err := parseTestJSON(strings.NewReader(out), "example.com/m")
	if err != nil {
		t.Fatal(err)
	}
	want := []result{
		{"TestA", "FAIL"}, {"TestB", "SKIP"}, {"TestC", "FAIL"},
		{"broken/(package)", "FAIL"}, {"sub/pkg/TestD", "PASS"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v\nwant %v", got, want)
	}
}

func TestReport(t *testing.T) {
	var b strings.Builder
	report(&b, "node", []result{{"a-tests.js", "PASS"}, {"b-tests.js", "FAIL"}, {"c-tests.js", "SKIP"}, {"d-tests.js", "PASS"}})
	want := "PASS a-tests.js\nFAIL b-tests.js\nSKIP c-tests.js\nPASS d-tests.js\nTOTAL node pass=2 fail=1 skip=1\n"
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
}
