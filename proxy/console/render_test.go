package console

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lockpool/lockpool/internal/wire"
)

// TestConsoleRender: a view's rows become a RowDescription named and typed
// by the row type and DataRows in PostgreSQL's text format.
func TestConsoleRender(t *testing.T) {
	type row struct {
		Name    string     `json:"name"`
		N       int64      `json:"n"`
		PID     *uint32    `json:"pid"`
		Rate    float64    `json:"rate"`
		On      bool       `json:"on"`
		At      time.Time  `json:"at"`
		Maybe   *time.Time `json:"maybe"`
		Keys    []string   `json:"keys"`
		Skipped string     `json:"-"`
	}
	pid := uint32(42)
	at := time.Date(2026, 12, 1, 21, 40, 54, 123456000, time.FixedZone("x", 3600))
	buf, n := appendRows(nil, []row{
		{Name: "a", N: -3, PID: &pid, Rate: 1.5, On: true, At: at, Keys: []string{"0:1:1", "0:2:1"}, Skipped: "x"},
		{},
	})
	if n != 2 {
		t.Fatalf("rows = %d, want 2", n)
	}
	next := func(want byte) []byte {
		t.Helper()
		if len(buf) < 5 || buf[0] != want {
			t.Fatalf("next message %q, want %q", buf[:min(len(buf), 1)], want)
		}
		l := int(binary.BigEndian.Uint32(buf[1:5]))
		body := buf[5 : 1+l]
		buf = buf[1+l:]
		return body
	}
	var rd pgproto3.RowDescription
	if err := rd.Decode(next('T')); err != nil {
		t.Fatal(err)
	}
	wantCols := []struct {
		name string
		oid  uint32
	}{{"name", wire.OIDText}, {"n", wire.OIDInt8}, {"pid", wire.OIDInt8}, {"rate", wire.OIDFloat8}, {"on", wire.OIDBool}, {"at", wire.OIDTimestamptz}, {"maybe", wire.OIDTimestamptz}, {"keys", wire.OIDText}}
	if len(rd.Fields) != len(wantCols) {
		t.Fatalf("%d columns, want %d", len(rd.Fields), len(wantCols))
	}
	for i, w := range wantCols {
		if f := rd.Fields[i]; string(f.Name) != w.name || f.DataTypeOID != w.oid {
			t.Errorf("column %d = %s/%d, want %s/%d", i, f.Name, f.DataTypeOID, w.name, w.oid)
		}
	}
	wantRows := [][]any{
		{"a", "-3", "42", "1.5", "t", "2026-12-01 20:40:54.123456+00", nil, "0:1:1, 0:2:1"},
		{"", "0", nil, "0", "f", nil, nil, ""},
	}
	for _, want := range wantRows {
		var dr pgproto3.DataRow
		if err := dr.Decode(next('D')); err != nil {
			t.Fatal(err)
		}
		for i, w := range want {
			v := dr.Values[i]
			switch {
			case w == nil && v != nil:
				t.Errorf("column %s = %q, want NULL", wantCols[i].name, v)
			case w != nil && (v == nil || string(v) != w):
				t.Errorf("column %s = %q, want %q", wantCols[i].name, v, w)
			}
		}
	}
	if len(buf) != 0 {
		t.Fatalf("%d bytes after the rows", len(buf))
	}
}
