package proxy

import (
	"testing"
	"time"
)

func TestLoginLimiter(t *testing.T) {
	var l loginLimiter
	t0 := time.Unix(1000, 0)
	for i := range loginLogBurst {
		if ok, sup := l.allow(t0.Add(time.Duration(i) * time.Millisecond)); !ok || sup != 0 {
			t.Fatalf("line %d: allow = %v, %d; want true, 0", i, ok, sup)
		}
	}
	for i := range 5 {
		if ok, _ := l.allow(t0.Add(time.Second)); ok {
			t.Fatalf("line %d over the burst was allowed", loginLogBurst+i)
		}
	}
	if ok, sup := l.allow(t0.Add(loginLogWindow)); !ok || sup != 5 {
		t.Fatalf("first line of the next window: allow = %v, %d; want true, 5", ok, sup)
	}
	if ok, sup := l.allow(t0.Add(loginLogWindow + time.Millisecond)); !ok || sup != 0 {
		t.Fatalf("second line of the next window: allow = %v, %d; want true, 0", ok, sup)
	}
}

func TestPinLogInterval(t *testing.T) {
	for _, tc := range []struct{ over, want time.Duration }{
		{0, 5 * time.Second},
		{100 * time.Millisecond, 50 * time.Millisecond},
		{300 * time.Millisecond, 75 * time.Millisecond},
		{time.Minute, 5 * time.Second},
	} {
		if got := pinLogInterval(tc.over); got != tc.want {
			t.Errorf("pinLogInterval(%v) = %v, want %v", tc.over, got, tc.want)
		}
	}
}
