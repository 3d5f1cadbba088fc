package proxy

import (
	"testing"
	"time"
)

// A forwarded signal request reads back as it was written, and a MAC
// depends on the key, the challenge and every byte of the request.
func TestSignalRequestWire(t *testing.T) {
	for _, r := range []signalRequest{
		{pid: keyPIDOf(7, 42), terminate: true, timeout: 1500 * time.Millisecond, user: "app", admin: false},
		{pid: keyPIDOf(255, 1), user: "admin user", admin: true},
		{pid: keyPIDOf(1, 0), terminate: true, user: ""},
	} {
		b := appendSignalRequest(nil, r)
		got, err := parseSignalRequest(b)
		if err != nil || got != r {
			t.Errorf("round trip of %+v: %+v, %v", r, got, err)
		}
		if _, err := parseSignalRequest(append(b, 'x')); err == nil {
			t.Errorf("%+v with a trailing byte parsed", r)
		}
		if _, err := parseSignalRequest(b[:len(b)-1]); err == nil {
			t.Errorf("%+v without its user's NUL parsed", r)
		}
	}
	if _, err := parseSignalRequest(appendSignalRequest(nil, signalRequest{pid: 1, timeout: 48 * time.Hour})); err == nil {
		t.Error("a timeout of 48 h parsed")
	}
	key, challenge := newSignalKey(), newSignalKey()
	body := appendSignalRequest(nil, signalRequest{pid: keyPIDOf(2, 9), terminate: true, user: "app"})
	mac := signalMAC(key, challenge, body)
	other := append([]byte(nil), body...)
	other[len(other)-2] ^= 1
	for name, m := range map[string][]byte{
		"other key":       signalMAC(newSignalKey(), challenge, body),
		"other challenge": signalMAC(key, newSignalKey(), body),
		"other request":   signalMAC(key, challenge, other),
	} {
		if string(m) == string(mac) {
			t.Errorf("the MAC with %s is the same", name)
		}
	}
}
