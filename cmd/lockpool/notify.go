package main

import (
	"net"
	"os"
)

// sdNotify sends state (READY=1, STOPPING=1) to the service manager when
// lockpool runs as a systemd Type=notify service ($NOTIFY_SOCKET set; an
// address starting with @ is in the abstract namespace), so that
// `systemctl start` returns once lockpool accepts (deploy/systemd). It
// does nothing without NOTIFY_SOCKET.
func sdNotify(state string) error {
	path := os.Getenv("NOTIFY_SOCKET")
	if path == "" {
		return nil
	}
	if path[0] == '@' {
		path = "\x00" + path[1:]
	}
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.Write([]byte(state))
	return err
}
