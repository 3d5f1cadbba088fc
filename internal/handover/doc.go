// Package handover passes a running lockpool's listening sockets to its
// successor on the same host, so that a restart refuses no connection
// attempt (README, "Restarts without refusing anyone").
//
// # What it owns
//
//   - The handover socket: a Unix socket (SOCK_SEQPACKET) at the path of
//     the handover_socket key, mode 0600, on which a running process
//     offers its listeners ([Serve], [Offer]). It is put in place with a
//     rename, so the path always names a live socket or the previous one;
//     a successor takes the path over the same way, and a process removes
//     the path on [Offer.Close] only while the path is still its own.
//   - The exchange ([Take], [Taken]): the successor sends its pid and the
//     addresses its configuration asks for ([Addrs]); the running process
//     answers with a refusal and its reason, or with duplicates of its
//     listening descriptors (SCM_RIGHTS, client listener first, then the
//     admin listener when there is one); the successor starts accepting on
//     them and confirms ([Taken.Confirm]); the running process then reports
//     the successor ([Offer.HandedTo]).
//
// # Invariants
//
//   - Both processes hold descriptors of the same kernel sockets: a process
//     that closes its copy stops accepting, and connections queued in the
//     accept backlog stay for the other. No listening socket is ever closed
//     or rebound during a handover (unlike SO_REUSEPORT, where closing one
//     of the listeners resets the connections queued on it).
//   - Listeners are handed over only when the successor asks for exactly
//     the addresses the running process was configured with (listen and
//     admin_listen as written); otherwise the answer is a refusal that
//     names both, and the successor binds as it would without a handover.
//   - Only a peer of the same user (or root) is answered, on either side
//     (SO_PEERCRED), besides the socket file's 0600 mode.
//   - Nothing that answers (no file, or a stale file a crashed process
//     left) is [ErrNoOffer]; every other failure (the running process
//     exiting mid-exchange, a malformed answer) is an error, and every wait
//     ends with the caller's context.
//   - O_NONBLOCK is a flag of the shared open socket: nothing here switches
//     a descriptor to blocking mode (no os.File.Fd), since the other
//     process's accept loop relies on it.
package handover
