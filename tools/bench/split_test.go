package main

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"
)

// pcapOf writes a microsecond pcap (Ethernet) of TCP segments.
func pcapOf(segs []pcapSeg) []byte {
	var b bytes.Buffer
	h := make([]byte, 24)
	binary.LittleEndian.PutUint32(h[0:], 0xa1b2c3d4)
	binary.LittleEndian.PutUint16(h[4:], 2)
	binary.LittleEndian.PutUint16(h[6:], 4)
	binary.LittleEndian.PutUint32(h[16:], 65535)
	binary.LittleEndian.PutUint32(h[20:], 1)
	b.Write(h)
	for _, s := range segs {
		frame := make([]byte, 14+20+20)
		binary.BigEndian.PutUint16(frame[12:], 0x0800)
		ip := frame[14:]
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:], uint16(20+20+len(s.payload)))
		ip[9] = 6
		tcp := ip[20:]
		binary.BigEndian.PutUint16(tcp[0:], s.src)
		binary.BigEndian.PutUint16(tcp[2:], s.dst)
		tcp[12] = 5 << 4
		frame = append(frame, s.payload...)
		ph := make([]byte, 16)
		binary.LittleEndian.PutUint32(ph[0:], uint32(1000+s.at/time.Second))
		binary.LittleEndian.PutUint32(ph[4:], uint32(s.at%time.Second/time.Microsecond))
		binary.LittleEndian.PutUint32(ph[8:], uint32(len(frame)))
		binary.LittleEndian.PutUint32(ph[12:], uint32(len(frame)))
		b.Write(ph)
		b.Write(frame)
	}
	return b.Bytes()
}

type pcapSeg struct {
	at       time.Duration
	src, dst uint16
	payload  []byte
}

func queryMsg(text string) []byte {
	b := []byte{'Q', 0, 0, 0, 0}
	b = append(b, text...)
	b = append(b, 0)
	binary.BigEndian.PutUint32(b[1:], uint32(len(b)-1))
	return b
}

func TestSplitCapture(t *testing.T) {
	const pooler, server = 6432, 5432
	reply := []byte("T...D...C...Z\x00\x00\x00\x05I")
	us := func(n int) time.Duration { return time.Duration(n) * time.Microsecond }
	tests := []struct {
		name string
		segs []pcapSeg
		want []splitTxn
	}{
		{"one transaction", []pcapSeg{
			{us(0), 50001, pooler, queryMsg("SELECT 1 WHERE 7 = 7;")},
			{us(100), 40001, server, queryMsg("SELECT 1 WHERE 7 = 7;")},
			{us(400), server, 40001, reply},
			{us(450), pooler, 50001, reply},
		}, []splitTxn{{total: 450, in: 100, server: 300, out: 50}}},
		{"two clients interleaved, texts tell them apart", []pcapSeg{
			{us(0), 50001, pooler, queryMsg("SELECT 1;")},
			{us(10), 50002, pooler, queryMsg("SELECT 2;")},
			{us(30), 40002, server, queryMsg("SELECT 2;")},
			{us(50), 40001, server, queryMsg("SELECT 1;")},
			{us(200), server, 40002, reply},
			{us(260), server, 40001, reply},
			{us(300), pooler, 50002, reply},
			{us(310), pooler, 50001, reply},
		}, []splitTxn{{total: 310, in: 50, server: 210, out: 50}, {total: 290, in: 20, server: 170, out: 100}}},
		{"a query never sent on is left out", []pcapSeg{
			{us(0), 50001, pooler, queryMsg("SELECT 3;")},
			{us(90), pooler, 50001, reply},
		}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := splitCapture(bytes.NewReader(pcapOf(tt.segs)), pooler, server)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Fatalf("transaction %d = %+v, want %+v", i, got[i], tt.want[i])
				}
			}
		})
	}
}

func TestSplitResultFill(t *testing.T) {
	// 1,000 transactions: total i, in i/10, server i/2, out the rest.
	txns := make([]splitTxn, 1000)
	for i := range txns {
		x := float64(999 - i) // any order
		txns[i] = splitTxn{total: x, in: x / 10, server: x / 2, out: x - x/10 - x/2}
	}
	r := &SplitResult{}
	r.fill(txns)
	if r.Matched != 1000 || r.Error != "" {
		t.Fatalf("matched %d, error %q", r.Matched, r.Error)
	}
	if r.Total != (Pcts{P50: 499.5, P99: 989}) || r.Server != (Pcts{P50: 249.75, P99: 494.5}) {
		t.Fatalf("total %+v, server %+v", r.Total, r.Server)
	}
	// The tail is totals 990..998: mean 994.
	if r.TailIn != 99.4 || r.TailServer != 497 {
		t.Fatalf("tail in %v, server %v; want 99.4, 497", r.TailIn, r.TailServer)
	}
	empty := &SplitResult{}
	empty.fill(nil)
	if empty.Error == "" {
		t.Fatal("no error for a capture with no transaction followed")
	}
}
