// Package txcmd classifies a statement by its leading words as far as the
// proxy must know what it does to the transaction block before any server
// sees it: BEGIN or START TRANSACTION opens one, COMMIT or END commits it,
// ROLLBACK or ABORT ends it (Of). NextWord and WordIs are the scanner it
// reads with, for callers that recognise other transaction-control
// statements (SAVEPOINT, RELEASE, ROLLBACK TO).
//
// Invariants:
//
//   - Only leading words are read: blanks, -- and nested /* */ comments and
//     opening parentheses are skipped, a word is a run of ASCII letters and
//     underscores compared without regard to case, and nothing after the
//     words a class needs is looked at. A statement whose leading comment
//     is unterminated has no word and no class.
//   - Blanks and comments put in front of a statement never change its
//     class, and no input makes the scanner panic (FuzzTxCommand).
//   - Nothing is allocated or kept: words alias the input.
//
// A statement that only looks like a transaction command (COMMIT
// PREPARED, ROLLBACK TO SAVEPOINT, ROLLBACK PREPARED) is None: it does
// not open or end the client's transaction block.
package txcmd
