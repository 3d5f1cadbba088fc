package session

// replyKind says which server message completes the reply to one client
// message (or that lockpool answers it itself).
type replyKind uint8

const (
	replyQuery          replyKind = iota + 1 // Query or FunctionCall: everything up to ReadyForQuery
	replySync                                // Sync: ReadyForQuery
	replyParse                               // ParseComplete
	replyBind                                // BindComplete
	replyClose                               // CloseComplete
	replyDescribeStmt                        // ParameterDescription, then RowDescription or NoData
	replyDescribePortal                      // RowDescription or NoData
	replyExecute                             // CommandComplete, EmptyQueryResponse or PortalSuspended
	replyLocal                               // lockpool's own reply, written when it reaches the front
)

// boundary reports whether the reply ends with ReadyForQuery.
func (k replyKind) boundary() bool { return k == replyQuery || k == replySync }

// replyOp says what lockpool does with the message that completes a reply.
type replyOp uint8

const (
	opPass    replyOp = iota // relay it
	opSwallow                // lockpool's own message: drop its reply
	opCheck                  // lockpool's own Describe: compare the result with what the client was told
)

// reply is one entry of the queue of replies a client is owed.
type reply struct {
	kind  replyKind
	op    replyOp
	local []byte // replyLocal: the bytes to write (never modified after push)
	added string // server statement this message prepares (forgotten when it fails)
	stmt  *stmt  // client statement this Parse registers (forgotten when it fails)
	srv   string // server statement a Bind or Describe uses (retired when PostgreSQL reports it stale)
	lazy  *stmt  // client statement answered lazily: forgotten when this message itself fails
	desc  *stmt  // client statement a Describe is about (what it returns is recorded)
	// copyDone: the client ended this statement's COPY (CopyDone or
	// CopyFail) before lockpool relayed the server's CopyInResponse.
	copyDone bool
	undo     func()    // replyLocal: reverts the message's effect when it is skipped after an error
	tags     *tagFixes // command tags of statements lockpool rewrote (defaults.go); nil: none
}

// replyQueue holds, in the client's order, every reply the client is owed:
// the server's and lockpool's own alike. The session's coroutine owns it.
// Replies lockpool makes itself wait in the queue until every reply before
// them was written, so the client sees one ordered stream.
type replyQueue struct {
	items  []reply
	head   int
	server int // entries the server answers (not replyLocal)
}

func (q *replyQueue) push(r reply) {
	if q.items == nil {
		q.items = make([]reply, 0, 4) // once per session: an idle client keeps its size small
	}
	q.items = append(q.items, r)
	if r.kind != replyLocal {
		q.server++
	}
}

// back returns the last entry, or nil.
func (q *replyQueue) back() *reply {
	if q.head == len(q.items) {
		return nil
	}
	return &q.items[len(q.items)-1]
}

// len is the number of entries.
func (q *replyQueue) len() int { return len(q.items) - q.head }

// front returns the first entry, or nil.
func (q *replyQueue) front() *reply {
	if q.head == len(q.items) {
		return nil
	}
	return &q.items[q.head]
}

// pop removes the first entry and returns it.
func (q *replyQueue) pop() reply {
	r := q.items[q.head]
	q.drop()
	return r
}

// drop removes the first entry without returning it; it reports whether
// the entry was the server's (not replyLocal).
func (q *replyQueue) drop() (server bool) {
	r := &q.items[q.head]
	server = r.kind != replyLocal
	*r = reply{}
	q.head++
	if server {
		q.server--
	}
	if q.head == len(q.items) {
		q.head = 0
		if cap(q.items) > 64 {
			q.items = nil
		} else {
			q.items = q.items[:0]
		}
	}
	return server
}

// kinds lists the queued kinds (for error messages).
func (q *replyQueue) kinds() []replyKind {
	var k []replyKind
	for i := q.head; i < len(q.items); i++ {
		k = append(k, q.items[i].kind)
	}
	return k
}
