package backend

// Relay wraps the reader of one of lockpool's own exchanges on a session's
// server connection: messages that are not the exchange's (a notification
// the client listens for) go to the session, the rest to the reader. nil
// passes everything to the reader.
type Relay func(read func(typ byte, body []byte)) func(typ byte, body []byte)

// wrap returns read as r would have it.
func (r Relay) wrap(read func(typ byte, body []byte)) func(typ byte, body []byte) {
	if r == nil {
		return read
	}
	return r(read)
}
